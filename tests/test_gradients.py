"""rollout(grad=...), odeint(options=dict(grad=...)) and the nn layers/losses: checkpointed
and reversible gradients equal backprop's, and the lean modes do bound the graph's memory."""
import pathlib
import sys

import pytest
import torch
from torch import nn

import torchgeo_int as tgi

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from experiments.bench.memory import SavedTensorMeter  # noqa: E402


class MLPPotential(nn.Module):
    def __init__(self, n=2, width=16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n, width), nn.Tanh(), nn.Linear(width, 1))

    def forward(self, q):
        return self.net(q).squeeze(-1) + 0.5 * (q * q).sum(-1)


def separable_hnn():
    return tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), MLPPotential())


class MLPHamiltonian(tgi.Hamiltonian):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

    def hamiltonian(self, q, p):
        z = torch.cat([q, p], -1)
        return 0.1 * self.net(z).squeeze(-1) + 0.5 * (z * z).sum(-1)


def loss_and_grads(system, method, steps, grad, save_every=1, **opts):
    q0 = (0.5 * torch.randn(8, 2, generator=torch.Generator().manual_seed(1))).requires_grad_()
    p0 = (0.5 * torch.randn(8, 2, generator=torch.Generator().manual_seed(2))).requires_grad_()
    q, p = tgi.rollout(system, q0, p0, h=0.05, steps=steps, method=method, save_every=save_every,
                       grad=grad, **opts)
    target = torch.sin(torch.arange(q.numel(), dtype=q.dtype)).reshape(q.shape)
    loss = ((q - target) ** 2).mean() + (p ** 2).mean()
    params = [w for w in system.parameters()]
    grads = torch.autograd.grad(loss, [q0, p0, *params], allow_unused=True)  # V's constant is unused
    return loss, [torch.zeros_like(w) if g is None else g for w, g in zip([q0, p0, *params], grads)]


def assert_close(ga, gb, rtol):
    for a, b in zip(ga, gb):
        assert (a - b).abs().max() <= rtol * (b.abs().max() + 1e-30), float((a - b).abs().max())


@pytest.mark.parametrize("save_every,segment", [(1, None), (7, None), (1, 33), (5, 12), (30, 12),
                                                (200, None)])
def test_checkpoint_equals_backprop_separable(save_every, segment):
    system = separable_hnn()
    la, ga = loss_and_grads(system, "verlet", 200, "backprop", save_every)
    lb, gb = loss_and_grads(system, "verlet", 200, "checkpoint", save_every, segment=segment)
    assert torch.allclose(la, lb, rtol=0, atol=1e-14)
    assert_close(gb, ga, 1e-10)


def test_checkpoint_equals_backprop_implicit():
    system = MLPHamiltonian()
    la, ga = loss_and_grads(system, "implicit_midpoint", 20, "backprop")
    lb, gb = loss_and_grads(system, "implicit_midpoint", 20, "checkpoint", segment=6)
    assert torch.allclose(la, lb, atol=1e-13)
    assert_close(gb, ga, 1e-10)


@pytest.mark.parametrize("method", ["verlet", "yoshida4"])
@pytest.mark.parametrize("save_every", [1, 10])
def test_reversible_equals_backprop(method, save_every):
    """Documented tolerance: 1e-8 relative in float64 over 200 steps of a regular orbit."""
    system = separable_hnn()
    la, ga = loss_and_grads(system, method, 200, "backprop", save_every)
    lb, gb = loss_and_grads(system, method, 200, "reversible", save_every)
    assert torch.allclose(la, lb, atol=1e-14)
    assert_close(gb, ga, 1e-8)


@pytest.mark.parametrize("method,steps", [("implicit_midpoint", 200), ("verlet", 200),
                                          ("implicit_midpoint_yoshida4", 60)])
def test_reversible_equals_backprop_implicit(method, steps):
    """Implicit symmetric methods on a non-separable H (verlet there is the generalized
    leapfrog): x_k is reconstructed by the −h solve.  Documented tolerance: 1e-8 relative in
    float64 (measured ~1e-15 at 200 steps, ~5e-14 at 1000)."""
    torch.manual_seed(0)
    system = MLPHamiltonian()
    la, ga = loss_and_grads(system, method, steps, "backprop")
    lb, gb = loss_and_grads(system, method, steps, "reversible")
    assert torch.allclose(la, lb, atol=1e-14)
    assert all(g.abs().max() > 0 for g in ga[:3])
    assert_close(gb, ga, 1e-8)


def test_reversible_implicit_float32():
    """float32: the −h solves stop at the default float32 tolerance (1.3e-6); over 100 steps
    the gradient stays within 1e-3 relative of float32 backprop's, without a warning."""
    torch.manual_seed(0)
    system = MLPHamiltonian().float()
    q0 = (0.5 * torch.randn(8, 2, generator=torch.Generator().manual_seed(1))).float().requires_grad_()
    p0 = (0.5 * torch.randn(8, 2, generator=torch.Generator().manual_seed(2))).float()
    grads = {}
    for grad in ("backprop", "reversible"):
        q, p = tgi.rollout(system, q0, p0, h=0.05, steps=100, method="implicit_midpoint", grad=grad)
        params = list(system.parameters())[:-1]   # the output bias does not enter X_H
        grads[grad] = torch.autograd.grad((q[-1] ** 2).sum() + (p[-1] ** 2).sum(), [q0, *params])
    assert_close(grads["reversible"], grads["backprop"], 1e-3)


def test_gradcheck_tiny_cases():
    system = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1),
                                      lambda q: (1 - torch.cos(q)).sum(-1) + 0.1 * (q ** 4).sum(-1))
    q0 = torch.tensor([[0.3, -0.4]], requires_grad=True)
    p0 = torch.tensor([[0.2, 0.1]], requires_grad=True)
    for grad, opts in [("checkpoint", dict(segment=3)), ("reversible", {})]:
        f = lambda q, p: tgi.rollout(system, q, p, h=0.1, steps=10, method="verlet", grad=grad, **opts)
        assert torch.autograd.gradcheck(f, (q0, p0))
    nonseparable = MLPHamiltonian().double()
    f = lambda q, p: tgi.rollout(nonseparable, q, p, h=0.1, steps=6, method="implicit_midpoint",  # noqa: E731
                                 grad="reversible")
    assert torch.autograd.gradcheck(f, (q0.double(), p0.double()))


def test_reversible_refuses_what_it_cannot_do():
    q0, p0 = torch.zeros(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match="not symmetric"):
        tgi.rollout(separable_hnn(), q0, p0, h=0.1, steps=3, method="symplectic_euler", grad="reversible")
    with pytest.raises(ValueError, match="not symmetric"):
        tgi.rollout(MLPHamiltonian(), q0, p0, h=0.1, steps=3, method="symplectic_euler", grad="reversible")
    sode = tgi.SecondOrderSystem(lambda t, q, v: -q - 0.1 * v)
    with pytest.raises(ValueError, match="not cotangent-lift"):   # symmetric, but not of (q, p)
        tgi.rollout(sode, q0, p0, h=0.1, steps=3, method="sode_midpoint", grad="reversible")
    k = torch.tensor(2.0, requires_grad=True)   # captured in a closure, not a module parameter
    system = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: k * (q * q).sum(-1))
    with pytest.raises(ValueError, match="params"):
        tgi.rollout(system, q0, p0, h=0.1, steps=3, method="verlet", grad="reversible")
    with pytest.raises(ValueError, match="params"):
        tgi.rollout(system, q0, p0, h=0.1, steps=3, method="verlet", grad="checkpoint")
    q, p = tgi.rollout(system, q0, p0, h=0.1, steps=3, method="verlet", grad="reversible", params=[k])
    (gk,) = torch.autograd.grad(q.sum(), k)
    qb, _ = tgi.rollout(system, q0, p0, h=0.1, steps=3, method="verlet")
    (gb,) = torch.autograd.grad(qb.sum(), k)
    assert torch.allclose(gk, gb, atol=1e-12)
    with pytest.raises(ValueError, match="grad must be"):
        tgi.rollout(system, q0, p0, h=0.1, steps=3, grad="adjoint")
    with pytest.raises(ValueError, match="unknown option"):
        tgi.rollout(system, q0, p0, h=0.1, steps=3, segment=4)


def test_reversible_warns_when_reconstruction_is_off():
    system = separable_hnn()
    q0 = torch.randn(4, 2, requires_grad=True)
    p0 = torch.randn(4, 2)
    q, p = tgi.rollout(system, q0, p0, h=0.05, steps=50, grad="reversible", reconstruction_tol=0.0)
    with pytest.warns(RuntimeWarning, match="reconstruction"):
        q[-1].sum().backward()


# -- odeint(options=dict(grad=...)) --------------------------------------------------------------
class SeparableField(nn.Module):
    """An HNN-style func(t, y) for odeint: dq = p, dp = −∇V_θ(q), ∇ by autograd (as torchdiffeq
    users write it, issue #154)."""

    def __init__(self):
        super().__init__()
        self.V = MLPPotential()

    def forward(self, t, y):
        q, p = y[..., :2], y[..., 2:]
        with torch.enable_grad():
            q = q if q.requires_grad else q.detach().requires_grad_()
            dV = torch.autograd.grad(self.V(q).sum(), q, create_graph=torch.is_grad_enabled())[0]
        return torch.cat([p, -dV], -1)


class SeparableEnergy(nn.Module):
    """H_θ(q, p) = ½|p|² + V_θ(q) for options['hamiltonian']."""

    def __init__(self):
        super().__init__()
        self.V = MLPPotential()

    def forward(self, q, p):
        return 0.5 * (p * p).sum(-1) + self.V(q)


# Several output times with different spacings: several groups of intervals (runs of equal steps).
T_OUT = torch.tensor([0.0, 0.4, 0.8, 1.3, 2.5, 3.0, 3.1])


def odeint_loss_and_grads(case, grad, method="verlet", **opts):
    gen = torch.Generator().manual_seed(3)
    y0 = (0.5 * torch.randn(6, 4, generator=gen)).requires_grad_()
    options = dict(step_size=0.05, **opts)
    if grad is not None:
        options["grad"] = grad
    if case == "func":
        module = SeparableField()
        ys = tgi.odeint(module, y0, T_OUT, method=method, options=dict(separable=True, **options))
    elif case == "func_nonseparable":   # implicit steps (not declared separable)
        module = SeparableField()
        ys = tgi.odeint(module, y0, T_OUT, method=method, options=options)
    elif case == "hamiltonian":
        module = SeparableEnergy()
        q, p = tgi.odeint(None, (y0[:, :2], y0[:, 2:]), T_OUT, method=method,
                          options=dict(hamiltonian=module, separable=True, **options))
        ys = torch.cat([q, p], -1)
    elif case == "first_order":        # eq. (1) on the flat state
        module = SeparableField()
        ys = tgi.odeint(module, y0, T_OUT, method=method, options=options)
    target = torch.cos(torch.arange(ys.numel(), dtype=ys.dtype)).reshape(ys.shape)
    loss = ((ys - target) ** 2).mean()
    params = [y0, *module.parameters()]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return loss, [torch.zeros_like(w) if g is None else g for w, g in zip(params, grads)]


@pytest.mark.parametrize("case,method,grad,rtol", [
    ("func", "verlet", "checkpoint", 1e-10),
    ("func", "yoshida4", "reversible", 1e-8),
    ("func", "verlet", "reversible", 1e-8),
    ("hamiltonian", "verlet", "checkpoint", 1e-10),
    ("hamiltonian", "yoshida4", "reversible", 1e-8),
    ("func_nonseparable", "verlet", "checkpoint", 1e-10),
    ("func_nonseparable", "verlet", "reversible", 1e-8),          # generalized leapfrog
    ("func_nonseparable", "implicit_midpoint_yoshida4", "reversible", 1e-8),
    ("first_order", "implicit_midpoint", "checkpoint", 1e-10),
])
def test_odeint_grad_modes_equal_backprop(case, method, grad, rtol):
    """The module's parameters are found (func / options['hamiltonian'] registered in the
    system); T_OUT makes five groups of intervals, each its own lean autograd node."""
    torch.manual_seed(0)
    la, ga = odeint_loss_and_grads(case, None, method)
    torch.manual_seed(0)
    lb, gb = odeint_loss_and_grads(case, grad, method)
    # implicit steps: each group's solves restart their warm start (odeint docstring), and
    # stop within the solver tolerance of different guesses
    implicit = case == "func_nonseparable"
    assert abs(float((la - lb).detach())) <= (1e-11 if implicit else 1e-13)
    assert all(g.abs().max() > 0 for g in ga[:3])   # y0 and the first layer do get gradients
    assert_close(gb, ga, rtol)


def test_odeint_checkpoint_segment_and_bound_method():
    """A user segment length, and func given as a bound method of a module."""
    torch.manual_seed(0)
    module = SeparableField()
    y0 = (0.5 * torch.randn(3, 4)).requires_grad_()
    out = {}
    for grad, extra in [("backprop", {}), ("checkpoint", dict(segment=5))]:
        ys = tgi.odeint(module.forward, y0, T_OUT, method="verlet",
                        options=dict(step_size=0.05, separable=True, grad=grad, **extra))
        out[grad] = torch.autograd.grad((ys ** 2).sum(), [y0, *list(module.parameters())[:2]])
    assert_close(out["checkpoint"], out["backprop"], 1e-10)


def test_odeint_gradcheck_lean_modes():
    class Pendulum(nn.Module):
        def __init__(self):
            super().__init__()
            self.k = nn.Parameter(torch.tensor([0.8]))

        def forward(self, t, y):
            q, p = y[..., :1], y[..., 1:]
            return torch.cat([p, -self.k * torch.sin(q) - 0.1 * q ** 3], -1)

    f = Pendulum()
    y0 = torch.tensor([[0.4, -0.3]], requires_grad=True)
    t = torch.tensor([0.0, 0.3, 0.5, 0.9])
    for opts in [dict(grad="checkpoint", segment=2), dict(grad="reversible")]:
        fn = lambda y0, k: tgi.odeint(f, y0, t, method="verlet",   # noqa: E731
                                      options=dict(step_size=0.1, separable=True, **opts))
        assert torch.autograd.gradcheck(fn, (y0, f.k))


def test_odeint_grad_closure_needs_params():
    k = torch.tensor(1.3, requires_grad=True)     # captured by a closure, not in a module
    f = lambda t, y: torch.cat([y[..., 1:], -k * y[..., :1]], -1)   # noqa: E731
    y0 = torch.tensor([[0.5, 0.1]], requires_grad=True)
    t = torch.tensor([0.0, 0.5, 1.0])
    for grad in ("checkpoint", "reversible"):
        opts = dict(step_size=0.1, separable=True, grad=grad)
        with pytest.raises(ValueError, match=r"options\['params'\]"):
            tgi.odeint(f, y0, t, method="verlet", options=opts)
        y = tgi.odeint(f, y0, t, method="verlet", options=dict(opts, params=[k]))
        yb = tgi.odeint(f, y0, t, method="verlet", options=dict(step_size=0.1, separable=True))
        g = torch.autograd.grad(y.sum(), (y0, k))
        gb = torch.autograd.grad(yb.sum(), (y0, k))
        assert_close(g, gb, 1e-12)


def test_lean_modes_refuse_a_closure_tensor_that_enters_after_the_first_step():
    # the probe step at t[0] does not see w (it switches on at t > 0.5): the backward passes
    # check every recomputed segment / step, else w silently got no gradient
    w = torch.tensor(2.0, requires_grad=True)
    f = lambda t, y: (y[1], -y[0] * (w if t > 0.5 else 1.0))     # noqa: E731
    q0, p0 = torch.tensor([0.3], requires_grad=True), torch.tensor([0.0])
    t = torch.tensor([0.0, 1.0])
    for grad in ("checkpoint", "reversible"):
        out = tgi.odeint(f, (q0, p0), t, method="verlet", options=dict(step_size=0.1, separable=True, grad=grad))
        with pytest.raises(ValueError, match=r"options\['params'\]"):
            out[0][-1].sum().backward()
        out = tgi.odeint(f, (q0, p0), t, method="verlet",
                         options=dict(step_size=0.1, separable=True, grad=grad, params=[w]))
        ref = tgi.odeint(f, (q0, p0), t, method="verlet", options=dict(step_size=0.1, separable=True))
        assert_close(torch.autograd.grad(out[0][-1].sum(), (q0, w)),
                     torch.autograd.grad(ref[0][-1].sum(), (q0, w)), 1e-12)


def test_odeint_grad_bad_values_and_combinations():
    f = SeparableField()
    y0, t = torch.ones(1, 4), torch.tensor([0.0, 0.5])
    sep = dict(step_size=0.1, separable=True)
    with pytest.raises(ValueError, match="grad'] must be one of"):
        tgi.odeint(f, y0, t, method="verlet", options=dict(sep, grad="adjoint"))
    with pytest.raises(ValueError, match="not symmetric"):
        tgi.odeint(f, y0, t, method="symplectic_euler", options=dict(sep, grad="reversible"))
    with pytest.raises(ValueError, match="not symmetric"):
        tgi.odeint(f, y0, t, method="symplectic_euler", options=dict(step_size=0.1, grad="reversible"))
    with pytest.raises(ValueError, match="first-order"):
        tgi.odeint(f, y0, t, method="implicit_euler", options=dict(step_size=0.1, grad="reversible"))
    with pytest.raises(ValueError, match="do not apply"):
        tgi.odeint(f, y0, t, method="verlet", options=dict(sep, grad="reversible", segment=4))
    with pytest.raises(ValueError, match="do not apply"):
        tgi.odeint(f, y0, t, method="verlet", options=dict(sep, grad="checkpoint",
                                                           reconstruction_tol=1e-3))
    with pytest.raises(ValueError, match="do not apply"):
        tgi.odeint(f, y0, t, method="verlet", options=dict(sep, params=[]))
    with pytest.raises(ValueError, match="segment"):
        tgi.odeint(f, y0, t, method="verlet", options=dict(sep, grad="checkpoint", segment=0))
    with pytest.raises(TypeError, match="params"):
        tgi.odeint(f, y0, t, method="verlet", options=dict(sep, grad="checkpoint",
                                                           params=torch.ones(2)))
    # torchdiffeq's methods: no lean modes of ours; 'backprop' is their own behaviour.
    with pytest.raises(ValueError, match="odeint_adjoint"):
        tgi.odeint(f, y0, t, method="rk4", options=dict(step_size=0.1, grad="checkpoint"))
    with pytest.raises(ValueError, match="odeint_adjoint"):
        tgi.odeint(f, y0, t, options=dict(grad="reversible"))
    ya = tgi.odeint(f, y0, t, method="rk4", options=dict(step_size=0.1, grad="backprop"))
    import torchdiffeq
    yb = torchdiffeq.odeint(f, y0, t, method="rk4", options=dict(step_size=0.1))
    assert torch.equal(ya, yb)
    with pytest.raises(ValueError, match="odeint_adjoint takes no"):
        tgi.odeint_adjoint(f, y0, t, method="rk4", options=dict(step_size=0.1, grad="checkpoint"))


# -- the rollout layer and the rollout loss ------------------------------------------------------
def test_symplectic_rollout_layer_grad_modes():
    torch.manual_seed(0)
    H = tgi.nn.SeparableHNN(2, width=16)
    q0, p0 = torch.randn(4, 2).requires_grad_(), torch.randn(4, 2)
    grads = {}
    for grad, opts, sl in [("backprop", {}, None), ("checkpoint", dict(segment=8), None),
                           ("reversible", {}, None)]:
        layer = tgi.nn.SymplecticRollout(H, "yoshida4", h=0.05, steps=40, save_every=4,
                                         grad=grad, **opts)
        q, p = layer(q0, p0)
        assert q.shape == (11, 4, 2)
        grads[grad] = torch.autograd.grad((q ** 2).sum() + p.sum(), [q0, *layer.parameters()],
                                          allow_unused=True)
        grads[grad] = [torch.zeros(1) if g is None else g for g in grads[grad]]
    assert_close(grads["checkpoint"], grads["backprop"], 1e-10)
    assert_close(grads["reversible"], grads["backprop"], 1e-8)


def test_rollout_loss_grad_modes_on_hnn_200_steps():
    """The issue's check: an HNN loss over 200 steps — checkpoint equals backprop to 1e-10,
    reversible to the documented 1e-8 (relative, float64, a regular orbit)."""
    torch.manual_seed(0)
    model = tgi.nn.SeparableHNN(2, width=32)
    dt, k = 0.05, 200
    phase = torch.rand(6, 1, 2) * 6.0
    tt = dt * torch.arange(k + 1, dtype=torch.float64)[None, :, None]
    q, p = torch.cos(tt + phase), -torch.sin(tt + phase)     # harmonic-oscillator data (N, 201, 2)
    grads = {}
    for grad in ("backprop", "checkpoint", "reversible"):
        loss = tgi.nn.rollout_loss(model, q, p, dt=dt, method="verlet", grad=grad)
        g = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
        grads[grad] = (loss, [torch.zeros(1) if x is None else x for x in g])
    assert all(torch.equal(grads[m][0], grads["backprop"][0]) for m in ("checkpoint", "reversible"))
    assert_close(grads["checkpoint"][1], grads["backprop"][1], 1e-10)
    assert_close(grads["reversible"][1], grads["backprop"][1], 1e-8)


# -- memory ----------------------------------------------------------------------------------------
def test_lean_modes_bound_the_graph_memory():
    """Peak bytes of autograd's saved tensors for a loss on the final state of 256 steps (only the
    final state saved): checkpoint keeps ~√steps steps' graph, reversible ~one step's; the same
    through odeint over one interval.  (A segment rounded up to save_every would be the whole
    rollout, i.e. backprop's memory.)"""
    torch.manual_seed(0)
    system = separable_hnn()
    q0, p0 = torch.randn(64, 2), torch.randn(64, 2)
    t = torch.tensor([0.0, 256 * 0.01])
    energy = SeparableEnergy()
    peaks = {}
    for name in ("backprop", "checkpoint", "reversible", "odeint_checkpoint", "odeint_reversible"):
        with SavedTensorMeter() as meter:
            if name.startswith("odeint"):
                q, p = tgi.odeint(None, (q0, p0), t, method="verlet", options=dict(
                    step_size=0.01, hamiltonian=energy, separable=True, grad=name[7:]))
            else:
                q, p = tgi.rollout(system, q0, p0, h=0.01, steps=256, grad=name, save_every=256)
            ((q[-1] ** 2).sum() + (p[-1] ** 2).sum()).backward()
        peaks[name] = meter.peak
        assert meter.current == 0          # everything released after backward
    per_step = peaks["backprop"] / 256
    assert peaks["checkpoint"] < 2 * 16 * per_step           # one segment of √256 = 16 steps
    assert peaks["odeint_checkpoint"] < 2 * 16 * per_step
    assert peaks["reversible"] < 3 * per_step
    assert peaks["odeint_reversible"] < 3 * per_step


def test_memory_bench_runs_at_toy_size():
    """experiments.bench.memory's cell (in-process here) and table, at a toy size."""
    from experiments.bench import memory
    rows = [memory.one_step(m, 3, 4, "cpu", "float64") for m in memory.MODES]
    assert all(r["graph_mib"] > 0 and not r["oom"] for r in rows)
    rows[0] = dict(rows[0], oom=True, cap_gib=1.0)
    text = memory.table(rows, memory.reconstruction_error([10], "float64"), [3], 4, "cpu", 1.0)
    assert "OOM (> 1 GiB)" in text and "| float64 | 10 |" in text
    rows = [memory.one_step(m, 3, 4, "cpu", "float64") for m in memory.IMPLICIT_MODES]
    recon = memory.reconstruction_error([10], "float32", "implicit_midpoint")
    assert all(r["graph_mib"] > 0 for r in rows) and recon[0]["max_abs_error"] < 1e-4
    text = memory.table(rows, recon, [3], 4, "cpu", 1.0, memory.IMPLICIT_MODES, "implicit midpoint")
    assert "| implicit_reversible |" in text and "| float32 | 10 |" in text


# -- no graph where nothing requires grad ------------------------------------------------------
def test_leaves_after_are_zeros_and_keep_the_jvp_exact():
    """The double-vjp's dummy cotangent ordered after the state's history (so autograd skips
    that history): zero whatever the history holds, and maps.jvp's values and gradients are
    those of forward-mode AD."""
    from torchgeo_int._autograd import leaves_after

    x = torch.tensor([1.0, float("inf"), float("nan")], requires_grad=True)
    (u,) = leaves_after((torch.ones(2, 3),), (x * 2,))
    assert torch.equal(u.detach(), torch.zeros(2, 3)) and u.requires_grad and not u.is_leaf
    (u,) = leaves_after((torch.ones(3),), (torch.ones(2),))   # no history: a plain leaf
    assert u.is_leaf and u.requires_grad
    R = tgi.RetractionMap(lambda x, v: x + v + 0.3 * torch.tanh(x) * v ** 2 + 0.1 * v ** 3, 0.5)
    g = torch.Generator().manual_seed(4)
    x0 = torch.randn(4, 2, generator=g, requires_grad=True)
    xh, v = torch.sin(x0) * 1.5, torch.randn(4, 2, generator=g)
    dx, dv = xh * 0.3, torch.randn(4, 2, generator=g)
    ours = R.jvp(xh, v, dx, dv)
    ref = torch.func.jvp(R._forward, (xh, v), (dx, dv))[1]
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    ga = torch.autograd.grad(sum(o.sum() for o in ours), x0, retain_graph=True)[0]
    gb = torch.autograd.grad(sum(o.sum() for o in ref), x0)[0]
    torch.testing.assert_close(ga, gb, rtol=1e-12, atol=1e-12)


def test_reaches_other_leaves():
    from torchgeo_int._autograd import reaches_other_leaves

    x = torch.randn(3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    assert not reaches_other_leaves((x.sin() * x).sum(), (x,))
    assert reaches_other_leaves((w * x).sum(), (x,))
    assert reaches_other_leaves(((2 * w) * x).sum(), (x,))        # through a non-leaf
    assert reaches_other_leaves((w * x).sum(), ())
    assert not reaches_other_leaves(torch.ones(3).sum(), (x,))      # no graph at all


def kepler_energy(q, p):
    return 0.5 * (p * p).sum(-1) - 1.0 / q.norm(dim=-1)


@pytest.mark.parametrize("method", ["verlet", "implicit_midpoint"])
def test_fixed_hamiltonian_under_grad_mode_builds_no_graph(method):
    """A rollout of a fixed H without torch.no_grad(): nothing requires grad, so no step keeps a
    graph (it used to: O(steps) memory, 3.9 GiB for 2000 steps of 4096 orbits) and the outputs
    do not claim to require grad; the numbers are those of the no_grad run."""
    H = tgi.Hamiltonian(kepler_energy)
    q0 = torch.tensor([[1.0, 0.0], [0.8, 0.1]], dtype=torch.float64)
    p0 = torch.tensor([[0.0, 1.1], [0.1, 1.2]], dtype=torch.float64)
    with SavedTensorMeter() as meter:
        q, p = tgi.rollout(H, q0, p0, h=0.01, steps=200, method=method)
    assert not q.requires_grad and not p.requires_grad
    assert meter.current == 0                       # nothing left held by autograd
    with torch.no_grad():
        qn, pn = tgi.rollout(H, q0, p0, h=0.01, steps=200, method=method)
    assert torch.equal(q, qn) and torch.equal(p, pn)


def test_captured_tensor_still_gets_its_gradient():
    """A closure over a tensor that requires grad (not a registered parameter) keeps the graph:
    d q_N / d k matches a central difference."""
    k = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)
    H = tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1) + 0.5 * k * (q * q).sum(-1))
    q0 = torch.tensor([[1.0, 0.2]], dtype=torch.float64)
    p0 = torch.tensor([[0.0, 0.5]], dtype=torch.float64)
    for method in ("verlet", "implicit_midpoint"):
        q, _ = tgi.rollout(H, q0, p0, h=0.05, steps=40, method=method)
        assert q.requires_grad
        (g,) = torch.autograd.grad(q[-1].sum(), k)
        eps = 1e-6
        with torch.no_grad():
            k += eps
            up = tgi.rollout(H, q0, p0, h=0.05, steps=40, method=method)[0][-1].sum()
            k -= 2 * eps
            down = tgi.rollout(H, q0, p0, h=0.05, steps=40, method=method)[0][-1].sum()
            k += eps
        assert abs(float(g) - float(up - down) / (2 * eps)) < 1e-6 * max(1.0, abs(float(g)))


def test_tangent_lift_jvp_builds_no_graph_for_a_fixed_map():
    R = tgi.RetractionMap(lambda x, v: x + v + 0.1 * v ** 3, alpha=0.5)
    x, v, dx, dv = (torch.randn(4, 2, dtype=torch.float64) for _ in range(4))
    out = R.jvp(x, v, dx, dv)
    assert not any(o.requires_grad for o in out)
    dx.requires_grad_()
    assert all(o.requires_grad for o in R.jvp(x, v, dx, dv))


def test_lagrangian_second_derivatives_keep_a_graph_only_for_what_requires_grad():
    from torchgeo_int.lagrangian import Lagrangian

    def make(m):
        return Lagrangian(lambda q, v: (0.5 * (m + q * q) * v * v - 0.5 * q * q).sum(-1))

    q, v = torch.randn(5, 1, dtype=torch.float64), torch.randn(5, 1, dtype=torch.float64)
    fixed = make(1.0)
    assert not fixed.sode().acceleration(q, v).requires_grad
    assert not fixed.velocity_hessian(q, v).requires_grad
    m = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    acc = make(m).sode().acceleration(q, v)        # q̈ = (−q v² − q)/(m + q²)
    (g,) = torch.autograd.grad(acc.sum(), m)
    assert torch.allclose(g, ((q * v ** 2 + q) / (1 + q * q) ** 2).sum(), atol=1e-12)


# -- review 2026-12-05 ------------------------------------------------------------------------------
class _Quartic(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.k = torch.nn.Parameter(torch.tensor(1.3, dtype=torch.float64))


def _quartic(k):
    return tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1),
                                    lambda q: k * (q ** 4).sum(-1) / 4 + 0.5 * (q * q).sum(-1))


@pytest.mark.parametrize("mode", ["checkpoint", "reversible"])
def test_lean_modes_refuse_grad_of_grad(mode):
    """Their backward ran without a graph, so a second derivative (create_graph=True, a
    gradient penalty) came out as zero, silently."""
    net = _Quartic()
    q0 = torch.tensor([[0.5, -0.2]], dtype=torch.float64, requires_grad=True)
    p0 = torch.tensor([[0.1, 0.3]], dtype=torch.float64)
    q, p = tgi.rollout(_quartic(net.k), q0, p0, h=0.1, steps=8, grad=mode, params=[net.k])
    with pytest.raises(RuntimeError, match=f"grad='{mode}' provides first-order gradients only.*grad='backprop'"):
        torch.autograd.grad((q[-1] ** 2).sum(), q0, create_graph=True)


@pytest.mark.parametrize("mode", ["checkpoint", "reversible"])
def test_lean_mode_params_repeated_derived_or_empty(mode):
    """A repeated params entry got its gradient twice; a derived tensor (k = raw.exp()) was
    refused with the advice to pass it as params; an empty batch crashed reversible's backward;
    a non-tensor params entry got the same misleading advice."""
    raw = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    q0 = torch.tensor([[0.5, -0.2]], dtype=torch.float64)
    p0 = torch.tensor([[0.1, 0.3]], dtype=torch.float64)

    def grad_of(mode, params):
        k = raw.exp()
        kw = {} if mode == "backprop" else dict(grad=mode, params=params(k))
        q, _ = tgi.rollout(_quartic(k), q0, p0, h=0.1, steps=8, **kw)
        return torch.autograd.grad((q[-1] ** 2).sum(), raw)[0]

    ref = grad_of("backprop", None)
    for params in (lambda k: [k], lambda k: [k, k]):
        assert torch.allclose(grad_of(mode, params), ref, rtol=1e-10, atol=0)
    with pytest.raises(ValueError, match="a tensor and a tensor it is computed from"):
        grad_of(mode, lambda k: [raw, k])
    with pytest.raises(TypeError, match="params must be tensors"):
        tgi.rollout(_quartic(1.0), q0, p0, h=0.1, steps=2, grad=mode, params=[1.0])
    with pytest.raises(TypeError, match="params must be a list of tensors"):
        tgi.rollout(_quartic(1.0), q0, p0, h=0.1, steps=2, grad=mode, params=raw)
    net = _Quartic()
    e = torch.zeros(0, 2, dtype=torch.float64, requires_grad=True)
    q, p = tgi.rollout(_quartic(net.k), e, torch.zeros(0, 2, dtype=torch.float64), h=0.1, steps=5,
                       grad=mode, params=[net.k])
    ((q ** 2).sum() + net.k).backward()
    assert e.grad.shape == (0, 2) and float(net.k.grad) == 1.0


@pytest.mark.parametrize("mode", ["checkpoint", "reversible"])
def test_lean_modes_name_the_step_of_a_first_step_convergence_error(mode):
    m = tgi.METHODS["implicit_midpoint"].with_options(max_iter=3)
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1),
                                 lambda q: 2 * (q * q).sum(-1) + 0.1 * (q ** 4).sum(-1))
    q0 = torch.tensor([[0.5, -0.2]], dtype=torch.float64, requires_grad=True)
    with pytest.raises(tgi.ConvergenceError, match="integrator step 0"):
        tgi.rollout(H, q0, torch.zeros_like(q0), h=0.2, steps=4, method=m, grad=mode)


def test_derivatives_taken_by_autograd_are_partial_when_one_input_is_computed_from_another():
    """∂/∂q at a state whose p (or v, or the map's v) was computed from q, with grad on: the same
    values as at detached copies, and differentiable back to q.  Differentiating with respect to
    q itself added the path through p: off by 0.52 (vector field), 0.20 (Euler–Lagrange, whose L
    is not quadratic in v: for a quadratic one the error cancels), 0.36 (map jvp), 7.7e-4
    (modified H) here."""
    torch.manual_seed(0)
    H = tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1) * (1 + 0.1 * (q * q).sum(-1)) - 1 / q.norm(dim=-1))
    L = tgi.Lagrangian(lambda q, v: 0.5 * (v * v).sum(-1) * (1 + 0.1 * (q * q).sum(-1)) + 0.05 * (v * v).sum(-1) ** 2 + 1 / q.norm(dim=-1))
    R = tgi.RetractionMap(lambda x, v: x + v + 0.1 * v ** 3 + 0.05 * x * v, alpha=0.5)
    M = tgi.nn.ModifiedHamiltonian(H, "verlet", 0.1)
    q0 = torch.tensor([[0.4, 0.1], [0.9, -0.2]]) + 0.3
    p0 = torch.tensor([[0.1, 1.5], [0.3, 0.8]])
    sode = L.sode()
    d = torch.randn(2, 2), torch.randn(2, 2)
    cases = {"vector_field": lambda q, p: H.vector_field(q, p),
             "Euler–Lagrange acceleration": lambda q, v: (sode.acceleration(q, v),),
             "map jvp": lambda x, v: R.jvp(x, v, *d),
             "modified H": lambda q, p: (M(q, p),)}
    for name, f in cases.items():
        q = q0.clone().requires_grad_()
        p = p0 + 0.3 * q                                     # computed from q
        got, want = f(q, p), f(q.detach(), p.detach())
        for a, b in zip(got, want):
            assert torch.allclose(a, b, rtol=1e-12, atol=1e-12), name
        assert any(a.requires_grad for a in got), name      # still differentiable back to q
