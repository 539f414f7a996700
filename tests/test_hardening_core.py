"""Hostile input to rollout and odeint (issues 21 and 22): each bad input gets a clear error
before garbage, a hang or a cryptic message."""
import math
import warnings

import pytest
import torch

import torchgeo_int as tgi
from torchgeo_int.solvers import fixed_point, newton

DT = torch.float64


def _H(q, p):
    return 0.5 * (p * p).sum(-1) + 0.5 * (q * q).sum(-1)


def _state(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, dtype=DT, generator=g), torch.randn(n, 2, dtype=DT, generator=g)


# -- issue 21, item 3 ----------------------------------------------------------------------------
@pytest.mark.parametrize("tol", [float("nan"), -1.0, "1e-3", True])
def test_rollout_reversible_refuses_bad_reconstruction_tol(tol):
    q0, p0 = _state()
    with pytest.raises(ValueError, match="reconstruction_tol"):
        tgi.rollout(_H, q0.requires_grad_(), p0, h=0.1, steps=10, method="verlet", grad="reversible",
                    reconstruction_tol=tol)


# -- issue 21, item 13 / issue 22, item 5 --------------------------------------------------------
def test_rollout_grad_mode_misspelled_option_names_the_accepted_ones():
    q0, p0 = _state()
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['segmnt'\].*accepted: segment, params"):
        tgi.rollout(_H, q0, p0, h=0.1, steps=10, grad="checkpoint", segmnt=3)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['segment'\] for grad='backprop'"):
        tgi.rollout(_H, q0, p0, h=0.1, steps=10, segment=3)


def test_rollout_progress_bar(capsys):
    q0, p0 = _state()
    q, p = tgi.rollout(_H, q0, p0, h=0.1, steps=20, method="verlet", progress=True)
    assert q.shape == (21, 4, 2)
    err = capsys.readouterr().err
    assert "rollout verlet" in err and "20/20" in err
    qr, _ = tgi.rollout(_H, q0, p0, h=0.1, steps=20, method="verlet")
    assert torch.equal(q, qr)


def test_odeint_geometric_progress_bar(capsys):
    y = tgi.odeint(lambda t, y: -y, torch.ones(3, dtype=DT), torch.linspace(0, 1, 5, dtype=DT),
                   method="implicit_midpoint", options=dict(step_size=0.05, progress=True))
    assert y.shape == (5, 3)
    err = capsys.readouterr().err
    assert "odeint implicit_midpoint" in err and "20/20" in err
    # with reversible variable steps too (the option was dropped there: no bar, no error)
    y = tgi.odeint(lambda t, y: (y[1], -y[0]), (torch.ones(2, 1, dtype=DT), torch.zeros(2, 1, dtype=DT)),
                   torch.linspace(0, 1, 5, dtype=DT), method="verlet",
                   options=dict(adaptive="reversible", step_size=0.05, separable=True, progress=True))
    assert "adaptive verlet" in capsys.readouterr().err


# -- issue 22, item 4 ----------------------------------------------------------------------------
@pytest.mark.parametrize("grad", ["backprop", "checkpoint", "reversible"])
def test_save_every_not_dividing_steps_returns_the_final_state(grad):
    q0, p0 = _state()
    q0 = q0.requires_grad_()
    q, p = tgi.rollout(_H, q0, p0, h=0.1, steps=10, method="verlet", save_every=3, grad=grad)
    qa, pa = tgi.rollout(_H, q0, p0, h=0.1, steps=10, method="verlet")
    assert q.shape == (5, 4, 2)                  # steps 0, 3, 6, 9 and the final step 10
    assert torch.allclose(q[:4], qa[::3], atol=1e-14) and torch.allclose(q[-1], qa[-1], atol=1e-14)
    assert torch.allclose(p[-1], pa[-1], atol=1e-14)
    g = torch.autograd.grad(q[-1].sum(), q0)[0]
    ga = torch.autograd.grad(qa[-1].sum(), q0)[0]
    assert torch.allclose(g, ga, atol=1e-10)


def test_save_every_not_dividing_steps_compiled_and_no_grad():
    q0, p0 = _state()
    with torch.no_grad():
        q, _ = tgi.rollout(_H, q0, p0, h=0.1, steps=10, method="verlet", save_every=4)
        qa, _ = tgi.rollout(_H, q0, p0, h=0.1, steps=10, method="verlet")
    assert q.shape == (4, 4, 2)
    assert torch.allclose(q[-1], qa[-1], atol=1e-14)


# -- issue 21, item 5 and 9: torchdiffeq's methods ------------------------------------------------
@pytest.mark.parametrize("method", ["dopri5", "euler", "rk4"])
def test_delegated_odeint_checks_t(method):
    f = lambda t, y: -y                                          # noqa: E731
    y0 = torch.ones(2, dtype=DT)
    for t, match in ((torch.tensor([0.0, 1.0, float("inf")], dtype=DT), "NaN or inf"),
                     (torch.tensor([0.0, float("nan")], dtype=DT), "NaN or inf"),
                     (torch.tensor([0.0, 1.0, 0.5], dtype=DT), "strictly")):
        with pytest.raises(ValueError, match=match):
            tgi.odeint(f, y0, t, method=method)


@pytest.mark.parametrize("method", ["dopri5", "euler"])
def test_delegated_odeint_checks_y0_and_the_first_func_output(method):
    t = torch.tensor([0.0, 1.0], dtype=DT)
    with pytest.raises(ValueError, match="y0 contains NaN or inf"):
        tgi.odeint(lambda t, y: -y, torch.tensor([float("nan"), 1.0], dtype=DT), t, method=method)
    with pytest.raises(ValueError, match=r"func returned shape \(1,\), expected \(2,\)"):
        tgi.odeint(lambda t, y: -y[:1], torch.ones(2, dtype=DT), t, method=method)
    with pytest.raises(ValueError, match=r"func returned shape \(\), expected \(2,\)"):
        tgi.odeint(lambda t, y: -y.sum(), torch.ones(2, dtype=DT), t, method=method)
    with pytest.raises(ValueError, match="func returned NaN or inf"):
        tgi.odeint(lambda t, y: y * float("nan"), torch.ones(2, dtype=DT), t, method=method)


@pytest.mark.parametrize("method", ["dopri5", "rk4"])
def test_delegated_odeint_checks_dtype_tolerances_and_step_size(method):
    """torchdiffeq runs with rtol < 0, and fails on an integer y0 ("nextafter_cpu" not
    implemented) or a zero step ("unsupported range"): refused first, naming the argument; a
    complex y0, which torchdiffeq supports, still runs."""
    f = lambda t, y: -y                                          # noqa: E731
    t = torch.tensor([0.0, 1.0], dtype=DT)
    y0 = torch.ones(2, dtype=DT)
    with pytest.raises(TypeError, match="y0 must be a floating-point .* got dtype torch.int64"):
        tgi.odeint(f, torch.ones(2, dtype=torch.int64), t, method=method)
    for kw, match in ((dict(rtol=-1e-6), "rtol must be finite and >= 0"),
                      (dict(atol=float("nan")), "atol must be finite and >= 0"),
                      (dict(options=dict(step_size=0.0)), r"options\['step_size'\] must be a finite number > 0"),
                      (dict(options=dict(step_size=-0.1)), r"options\['step_size'\] must be a finite number > 0")):
        with pytest.raises(ValueError, match=match):
            tgi.odeint(f, y0, t, method=method, **kw)
    z = tgi.odeint(f, torch.ones(2, dtype=torch.complex128), t, method=method,
                   **(dict(options=dict(step_size=0.01)) if method == "rk4" else {}))
    assert torch.allclose(z[-1].real, torch.full((2,), math.exp(-1.0), dtype=DT), atol=1e-6)


def test_delegated_odeint_tuple_state_and_t_gradient_still_work():
    t = torch.tensor([0.0, 0.5, 1.0], dtype=DT, requires_grad=True)
    y0 = (torch.ones(2, dtype=DT, requires_grad=True), torch.ones(3, dtype=DT))
    ys = tgi.odeint(lambda t, y: (-y[0], y[1] * 0), y0, t, method="dopri5")
    ys[0][-1].sum().backward()
    assert t.grad is not None and torch.isfinite(t.grad).all()


# -- issue 21, item 8 ----------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["implicit_midpoint", "verlet", "yoshida4"])
def test_empty_batch_on_implicit_paths(method):
    z = torch.zeros(0, 2, dtype=DT)
    q, p = tgi.rollout(_H, z, z, h=0.1, steps=3, method=method)     # _H is not separable: implicit
    assert q.shape == (4, 0, 2) and p.shape == (4, 0, 2)
    x = tgi.rollout(tgi.ODESystem(lambda t, x: -x), torch.zeros(0, 3, dtype=DT), h=0.1, steps=3,
                    method="implicit_euler")
    assert x.shape == (4, 0, 3)


def test_solvers_on_an_empty_batch():
    z = torch.zeros(0, 3, dtype=DT)
    assert fixed_point(lambda z: 0.5 * z, z).shape == (0, 3)
    assert newton(lambda z: z - 1.0, z).shape == (0, 3)


# -- issue 21, item 11 ---------------------------------------------------------------------------
@pytest.mark.parametrize("grad_on", [True, False])
def test_rollout_that_cannot_fit_is_refused_before_stepping(grad_on):
    q0, p0 = _state(n=1000)
    calls = []

    def H(q, p):
        calls.append(1)
        return _H(q, p)

    with torch.set_grad_enabled(grad_on):
        with pytest.raises(MemoryError) as err:
            tgi.rollout(H, q0.requires_grad_(grad_on), p0, h=0.1, steps=10 ** 11, method="verlet")
    msg = str(err.value)
    assert "save_every" in msg and "GiB" in msg
    if grad_on:
        assert "grad='checkpoint'" in msg
    assert not calls                                       # refused before the first step


# -- issue 21, item 14 ---------------------------------------------------------------------------
def test_compile_over_budget_falls_back_to_eager_with_a_warning(monkeypatch):
    from torchgeo_int import _compile
    monkeypatch.setattr(_compile, "COMPILE_BUDGET_S", 0.0)
    system = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: 0.5 * (q * q).sum(-1))
    q0, p0 = _state()
    with torch.no_grad():
        with pytest.warns(RuntimeWarning, match="compile budget"):
            q, p = tgi.rollout(system, q0, p0, h=0.01, steps=4, method="verlet", save_every=2,
                               compile=True)
        qe, pe = tgi.rollout(system, q0, p0, h=0.01, steps=4, method="verlet", save_every=2)
    assert torch.allclose(q, qe, atol=1e-13) and torch.allclose(p, pe, atol=1e-13)
    # the abandoned compile goes on in its worker thread: let it finish (a small graph here), so
    # it neither competes with later tests nor is torn down inside C++ at interpreter exit
    import threading
    for worker in threading.enumerate():
        if worker.name == "torchgeo_int-compile":
            worker.join(120)


def test_compile_of_a_pointwise_force_does_not_blow_up(monkeypatch):
    """The cause of item 14: a quadratic potential's force is pointwise, so an unrolled block of
    16 Verlet steps was one chain that inductor inlined into every reader (code generation
    growing ≈ 3.5× per step: it never finished).  With the stored intermediates of
    ``_compile.REALIZE_OPCOUNT`` it compiles in seconds — no fallback within a budget of 60 s —
    and equals the eager rollout."""
    from torchgeo_int import _compile
    monkeypatch.setattr(_compile, "COMPILE_BUDGET_S", 60.0)
    system = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: 0.5 * (q * q).sum(-1))
    q0, p0 = _state()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        q, p = tgi.rollout(system, q0, p0, h=0.01, steps=32, method="verlet", save_every=16,
                           compile=True)
        qe, pe = tgi.rollout(system, q0, p0, h=0.01, steps=32, method="verlet", save_every=16)
    # a fallback to eager (over budget, or any compile failure) says "compile=True: ..."
    assert not [w for w in caught if "compile=True" in str(w.message)], [str(w.message) for w in caught]
    assert q.shape == qe.shape == (3,) + q0.shape
    assert torch.allclose(q, qe, atol=1e-12) and torch.allclose(p, pe, atol=1e-12)


def test_partitioned_odeint_checks_func_after_its_first_calls():
    """odeint's partitioned path checks each half of func's output once and then calls func
    directly; an output that changes shape later still raises the checked call's error."""
    calls = []

    def f(t, y):
        q, p = y
        calls.append(1)
        dp = -q if len(calls) < 20 else -q[:1]
        return p, dp
    q0, p0 = torch.ones(3, 2, dtype=DT), torch.zeros(3, 2, dtype=DT)
    t = torch.tensor([0.0, 1.0], dtype=DT)
    with pytest.raises(ValueError, match=r"func returned shape \(1, 2\), expected \(3, 2\)"):
        tgi.odeint(f, (q0, p0), t, method="verlet", options=dict(separable=True, step_size=0.1))


@pytest.mark.parametrize("flat", [False, True, "namedtuple"])
def test_partitioned_odeint_calls_func_directly_and_matches_a_hand_loop(monkeypatch, flat):
    """After separable=True's check (one checked call per half), a separable odeint calls func without the checking
    frames (PartitionedState.direct), for y0 = (q0, p0) (func returning a tuple or a
    namedtuple) and a flat y0; func runs once per half-step, the result is a hand loop's, and
    func still gets a fresh 0-d t of y's dtype at every call."""
    from collections import namedtuple
    Pair = namedtuple("Pair", "dq dp")
    from torchgeo_int._odeint import state as st
    checked, framed = [], []
    orig, orig_field = st.PartitionedState._field, st.PartitionedState.field
    monkeypatch.setattr(st.PartitionedState, "_field",
                        lambda self, *a: checked.append(1) or orig(self, *a))
    monkeypatch.setattr(st.PartitionedState, "field",
                        lambda self, *a: framed.append(1) or orig_field(self, *a))
    seen = []

    def f(t, y):
        seen.append(t)
        q, p = (y[..., :2], y[..., 2:]) if flat is True else y
        out = (p, -q ** 3)
        return torch.cat(out, -1) if flat is True else Pair(*out) if flat else out
    q0 = torch.tensor([[1.0, 0.5], [0.2, -0.3]], dtype=DT)
    p0 = torch.tensor([[0.0, 0.1], [0.3, 0.0]], dtype=DT)
    h, n = 0.1, 30
    y0 = torch.cat([q0, p0], -1) if flat is True else (q0, p0)
    ys = tgi.odeint(f, y0, torch.tensor([0.0, n * h], dtype=DT), method="verlet",
                    options=dict(separable=True, step_size=h))
    # separable=True's check (seven calls: three of func whole and the first of each half
    # checked, the second of each half direct), then func directly
    assert len(checked) == 5 and len(seen) == 2 * n + 1 + 7
    assert len(framed) == 5
    assert all(t.dim() == 0 and t.dtype == DT for t in seen) and len({id(t) for t in seen}) == len(seen)
    q, p = q0, p0
    for _ in range(n):
        p = p + 0.5 * h * -q ** 3
        q = q + h * p
        p = p + 0.5 * h * -q ** 3
    got = (ys[-1, :, :2], ys[-1, :, 2:]) if flat is True else (ys[0][-1], ys[1][-1])
    torch.testing.assert_close(got[0], q, rtol=0, atol=1e-15)
    torch.testing.assert_close(got[1], p, rtol=0, atol=1e-15)


def test_a_model_on_another_device_or_dtype_than_the_data_is_named_before_a_step():
    # Found on the GPU: a model moved to cuda with the batches left on the CPU failed inside
    # F.linear ("Expected all tensors to be on the same device"); the meta device stands in here.
    torch.manual_seed(0)
    q, p = torch.randn(4, 1, dtype=torch.float64), torch.randn(4, 1, dtype=torch.float64)
    on_meta = tgi.nn.SeparableHNN(1, width=8).double().to("meta")
    with pytest.raises(ValueError, match=r"parameters are on meta but q0 is on cpu.*\.to\("):
        tgi.rollout(on_meta, q, p, h=0.1, steps=3)
    w = torch.randn(4, 3, 1, dtype=torch.float64)    # windows (N, k + 1, n)
    for loss in (lambda m: tgi.nn.rollout_loss(m, w, w, dt=0.1),
                 lambda m: tgi.nn.residual_loss(m, w, w, dt=0.1),
                 lambda m: tgi.nn.derivative_loss(m, w, w, w, w)):
        with pytest.raises(ValueError, match="parameters are on meta but q is on cpu"):
            loss(on_meta)
        with pytest.raises(TypeError, match="parameters are torch.float32 but q is torch.float64"):
            loss(tgi.nn.SeparableHNN(1, width=8).float())
    with pytest.raises(ValueError, match="parameters are on meta"):
        tgi.adaptive_rollout(on_meta, q, p, eps=0.1, steps=3, control=lambda q: 1.0 + 0 * q[..., 0])
    single = tgi.nn.SeparableHNN(1, width=8).float()  # float32 parameters, float64 data
    with pytest.raises(TypeError, match=r"parameters are torch.float32 but q0 is torch.float64"):
        tgi.rollout(single, q, p, h=0.1, steps=3)
    with pytest.raises(TypeError, match=r"parameters are torch.float32"):
        tgi.rollout(tgi.nn.MLPVectorField(1, width=8).float(), q, p, h=0.1, steps=3, method="implicit_midpoint")
    # matching placement runs; closed-form systems (no parameters) are not looked at
    qs, _ = tgi.rollout(single.double(), q, p, h=0.1, steps=3)
    assert qs.shape == (4, 4, 1) and torch.isfinite(qs).all()


# -- review fixes (2026-12-05) ----------------------------------------------------------------------
def test_a_defaulted_extra_argument_is_a_constant_not_the_time():
    def H(q, p, omega=2.0):            # omega was taken as t: the oscillator ran at ω = t
        return 0.5 * (p * p).sum(-1) + 0.5 * omega ** 2 * (q * q).sum(-1)
    S = tgi.Hamiltonian(H)
    assert not S.time_dependent
    assert tgi.Hamiltonian(lambda q, p, t=0.0: (p * p).sum(-1) + t).time_dependent   # named t
    assert tgi.Hamiltonian(lambda q, p, t: (p * p).sum(-1) + t).time_dependent
    q, _ = tgi.rollout(S, torch.ones(1, 1), torch.zeros(1, 1), h=1e-2, steps=100, method="yoshida4")
    assert abs(float(q[-1]) - math.cos(2.0)) < 1e-6   # ω = t would give cos(½) here


def test_energies_with_keepdim_are_refused():
    # (B, 1) energies give the same forces but T + V broadcasts to (B, B)
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: q.norm(dim=-1, keepdim=True))
    with pytest.raises(ValueError, match="without keepdim"):
        tgi.rollout(H, torch.ones(4, 2), torch.ones(4, 2), h=0.1, steps=2)


def test_unrolled_newton_keeps_no_graph_where_nothing_requires_grad():
    m = tgi.METHODS["implicit_midpoint"].with_options(solver="newton", backward="unroll")
    H = tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1) + (1 - q.cos()).sum(-1))
    q, _ = tgi.rollout(H, torch.ones(2, 1), torch.zeros(2, 1), h=0.1, steps=8, method=m)
    assert not q.requires_grad          # its start was made a leaf: every rollout built a graph
    c = torch.tensor([0.3, 0.2])
    assert not newton(lambda z: z - 0.5 * torch.cos(z) - c, torch.zeros(2), backward="unroll").requires_grad
    grads = []
    for grad in ("backprop", "checkpoint", "reversible"):    # the lean modes took the start for a closure
        q0 = torch.ones(2, 1, requires_grad=True)
        q, _ = tgi.rollout(H, q0, torch.zeros(2, 1), h=0.1, steps=8, method=m, grad=grad)
        q.sum().backward()
        grads.append(q0.grad)
    assert torch.allclose(grads[1], grads[0], atol=1e-12) and torch.allclose(grads[2], grads[0], atol=1e-10)


def test_a_tensor_mass_follows_the_states_dtype():
    H = tgi.SeparableHamiltonian(None, lambda q: (q * q).sum(-1), mass=torch.tensor([2.0, 3.0], dtype=torch.float64))
    x = torch.ones(4, 2, dtype=torch.float32)
    for method in ("verlet", "implicit_midpoint"):
        q, p = tgi.rollout(H, x, x, h=0.1, steps=3, method=method)
        assert q.dtype == p.dtype == torch.float32


def test_rollout_scalars_flags_and_systems_are_checked():
    H = tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1) + 0.5 * (q * q).sum(-1))
    x = torch.ones(2, 1)
    for bad, err in ((dict(h=True), TypeError), (dict(h="0.1"), TypeError),
                     (dict(h=torch.tensor(0.1, requires_grad=True)), ValueError),
                     (dict(t0=float("nan")), ValueError), (dict(compile="no"), ValueError)):
        with pytest.raises(err):
            tgi.rollout(H, x, x, steps=2, **{"h": 0.1, **bad})
    q, _ = tgi.rollout(H, x, x, h=torch.tensor(0.1), steps=2, t0=torch.tensor(1.0))   # 0-d tensors
    with pytest.raises(ValueError, match="'verlet' is a Hamiltonian method"):
        tgi.rollout(H, x, h=0.1, steps=2)                       # p0 forgotten
    with pytest.raises(ValueError, match="first-order system"):
        tgi.rollout(tgi.ODESystem(lambda t, y: -y), x, x, h=0.1, steps=2)


def test_unshuffled_distributed_batches_are_fits():
    from torchgeo_int.distributed import ShardedSampler
    from torchgeo_int.nn.training import TensorBatches
    x = torch.arange(20.0)[:, None]
    fit_batches = TensorBatches(x, batch_size=8, shuffle=False)
    sampler = ShardedSampler(20, batch_size=8, shuffle=False, num_replicas=1, rank=0)
    for e in range(3):
        sampler.set_epoch(e)
        ours = [b[0][:, 0].long().tolist() for b in fit_batches.epoch(e)]
        assert list(sampler.local_batches()) == ours


def test_sharded_rollout_relative_error_skips_samples_at_zero_energy():
    from torchgeo_int.distributed import sharded_rollout
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: (1 - q.cos()).sum(-1))
    q0 = torch.tensor([[0.0], [0.5]])            # the first at rest at the bottom: H(x₀) = 0
    res = sharded_rollout(H, q0, torch.zeros(2, 1), h=0.1, steps=10, save_every=3, return_trajectories=True)
    assert math.isfinite(res["energy_rel_error_max"]) and res["energy_rel_error_max"] > 0
    assert res["q"].shape[0] == 5                 # frames 0, 3, 6, 9 and the final step


def test_odeint_refuses_a_hamiltonian_or_lagrangian_as_func():
    """A Hamiltonian H(q, p) (or a Lagrangian L(q, v)) passed as func was called as func(t, y)
    and failed inside the user's energy ("unsupported operand type(s) for ** or pow(): 'tuple'
    and 'int'"); refused naming the mix-up and the ways to step it."""
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: (1 - q.cos()).sum(-1))
    L = tgi.Lagrangian.mechanical(lambda q: (1 - q.cos()).sum(-1))
    y0 = (torch.ones(2, 1, dtype=DT), torch.zeros(2, 1, dtype=DT))
    t = torch.linspace(0.0, 1.0, 3, dtype=DT)
    for method in ("verlet", "dopri5", None):
        with pytest.raises(TypeError, match=r"func is a Hamiltonian .*options=dict\(hamiltonian=H\)"):
            tgi.odeint(H, y0, t, method=method)
        with pytest.raises(TypeError, match=r"func is a Lagrangian .*tgi.rollout"):
            tgi.odeint(L, y0, t, method=method)
    with pytest.raises(TypeError, match="func is a Hamiltonian"):
        tgi.odeint_adjoint(H, y0, t)
    ys = tgi.odeint(None, y0, t, method="verlet", options=dict(hamiltonian=H))   # the way named
    assert ys[0].shape == (3, 2, 1)
    f = tgi.nn.MLPVectorField(1, width=8)                 # a System whose forward is func(t, y)
    assert tgi.odeint(f, torch.ones(2, 2, dtype=DT), t, method="rk4").shape == (3, 2, 2)


def test_variable_steps_check_h_as_fixed_steps_do():
    """rollout(..., step_control=σ) read h by float(h): a string ran, an h requiring grad lost
    its gradient silently, an h of two elements failed with torch's "only one element tensors
    can be converted"; now the fixed-step path's check, naming h."""
    q0 = torch.tensor([[1.0, 0.0], [0.5, 0.0]], dtype=DT)
    p0 = torch.tensor([[0.0, 1.2], [0.0, 1.6]], dtype=DT)
    sigma = tgi.power_law_control(1.5)
    for h, err, match in (("0.05", TypeError, "must be a real number, got str"),
                          (torch.tensor(0.05, dtype=DT, requires_grad=True), ValueError, "requires grad"),
                          (torch.tensor([0.05, 0.05], dtype=DT), TypeError, r"0-d real tensor.*shape \(2,\)"),
                          (0.0, ValueError, "finite nonzero"), (float("inf"), ValueError, "finite nonzero")):
        with pytest.raises(err, match=r"h \(with step_control.*" + match):
            tgi.rollout(_H, q0, p0, h=h, steps=3, step_control=sigma)
    a = tgi.rollout(_H, q0, p0, h=torch.tensor(0.05, dtype=DT), steps=3, step_control=sigma)
    b = tgi.rollout(_H, q0, p0, h=0.05, steps=3, step_control=sigma)
    assert torch.equal(a.q, b.q) and torch.equal(a.t, b.t)    # a 0-d tensor h still runs


def test_swapped_arguments_nan_fields_time_dependent_points_and_rollout_mse_dt():
    """Four mix-ups a newcomer meets, each named: an integrator passed where the system goes
    (was AttributeError: 'Tensor' object has no attribute 'separable'); a field that is NaN at
    the states of an implicit step (the message blamed h only); derivative matching of a
    time-dependent model (read at t = 0 silently); rollout_mse(dt=0) (named h)."""
    q0 = torch.tensor([[1.0, 0.0]], dtype=DT)
    p0 = torch.tensor([[0.0, 1.0]], dtype=DT)
    with pytest.raises(TypeError, match=r"system is an integrator \('verlet'\).*method="):
        tgi.rollout(tgi.METHODS["verlet"], q0, p0, h=0.1, steps=2)
    nan_H = tgi.Hamiltonian(lambda q, p: (q * q).sum(-1) * float("nan") + (p * p).sum(-1))
    for solver in ("fixed_point", "newton"):
        method = tgi.METHODS["implicit_midpoint"].with_options(solver=solver)
        with pytest.raises(tgi.ConvergenceError, match="non-finite.*no step size helps: fix the field"):
            tgi.rollout(nan_H, q0, p0, h=0.1, steps=2, method=method)
    timed = tgi.Hamiltonian(lambda q, p, t: 0.5 * (p * p).sum(-1) + t * (q * q).sum(-1),
                            time_dependent=True)
    with pytest.raises(NotImplementedError, match="points without their times.*autonomous"):
        tgi.nn.derivative_loss(timed, q0, p0, p0, -q0)
    q, p = torch.zeros(2, 3, 1, dtype=DT), torch.ones(2, 3, 1, dtype=DT)
    with pytest.raises(ValueError, match="dt"):
        tgi.nn.rollout_mse(tgi.nn.SeparableHNN(1).double(), q, p, dt=0.0)
