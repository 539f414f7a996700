"""rollout(..., compile=True) and torchgeo_int._compile: compiled and eager rollouts agree.

CPU compiles take seconds each, so few configurations are compiled here: Verlet one step per
call (what rollout(compile=True) does today), yoshida4 in blocks, implicit midpoint with a
compiled vector field, and one system that cannot be compiled (eager fallback).
"""
import math
import warnings

import pytest
import torch

import torchgeo_int as tgi
from problems import kepler, kepler_initial
from torchgeo_int import _compile
from torchgeo_int._compile import CompiledStep, compiled_rollout, compiled_step, default_block
from torchgeo_int.rollout import run_loop


def _batch(e=0.6, n=3):
    q0, p0 = kepler_initial(e)
    # slightly different orbits per sample, so a mix-up of samples would show
    scale = torch.linspace(0.9, 1.1, n)[:, None]
    return q0 * scale, p0 / scale.sqrt()


def _loop(step, system, q0, p0, steps, save_every=1, h=0.01):
    with torch.no_grad():
        return run_loop(step, q0, p0, system=system, h=h, steps=steps, t0=0.0,
                        save_every=save_every, check_every=16)


def test_compiled_verlet_rollout_matches_eager():
    system = kepler(separable=True, analytic=True)
    q0, p0 = _batch()
    with torch.no_grad():
        qe, pe = tgi.rollout(system, q0, p0, h=0.01, steps=300, method="verlet")
        qc, pc = tgi.rollout(system, q0, p0, h=0.01, steps=300, method="verlet", compile=True)
        # a second rollout with another h and t0 reuses the graph (h, t are not baked in)
        qe2, pe2 = tgi.rollout(system, q0, p0, h=0.02, steps=50, method="verlet", t0=1.0)
        qc2, pc2 = tgi.rollout(system, q0, p0, h=0.02, steps=50, method="verlet", t0=1.0,
                               compile=True)
    assert qc.shape == qe.shape and qc.dtype == torch.float64
    assert (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12
    assert (qc2 - qe2).abs().max() < 1e-12 and (pc2 - pe2).abs().max() < 1e-12


def test_compiled_blocks_match_eager_with_tail_and_save_every():
    """yoshida4 in lookahead blocks of 3 steps: 3·13 + 2 steps (an eager tail), every state and
    every fourth one saved; the block's states are handed out one call at a time."""
    system = kepler(separable=True, analytic=True)
    m = tgi.METHODS["yoshida4"]
    q0, p0 = _batch()
    steps = 41
    step = compiled_step(m, system, steps=steps, block=3)
    assert isinstance(step, CompiledStep) and step.mode == "blocks"
    qe, pe = _loop(m.step, system, q0, p0, steps)
    qc, pc = _loop(step, system, q0, p0, steps)
    assert (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12
    # every fourth state: final-state blocks, another graph than the stacked one (round-off)
    q4, p4 = _loop(compiled_step(m, system, steps=steps, block=3), system, q0, p0, steps, 4)
    assert (q4[:-1] - qc[::4]).abs().max() < 1e-12 and (p4[:-1] - pc[::4]).abs().max() < 1e-12
    assert (q4[-1] - qc[-1]).abs().max() < 1e-12 and (p4[-1] - pc[-1]).abs().max() < 1e-12
    # A caller that does not pass back the state it got drops the block and recomputes.
    q1, p1, cache = step(system, q0, p0, 0.0, 0.01, None)
    q2, p2, _ = step(system, q1.clone(), p1.clone(), 0.01, 0.01, cache)
    q2e, p2e = m(system, *m(system, q0, p0, 0.0, 0.01), 0.01, 0.01)
    assert (q2 - q2e).abs().max() < 1e-14 and (p2 - p2e).abs().max() < 1e-14


def test_compiled_rollout_macro_steps_match_eager():
    """save_every = 8, K = 4: run_loop steps Φ_h⁴ with step 4h and forms only the saved states;
    steps = 8·6 + 5 (the last 5 run after them, to the final state: the last frame)."""
    system = kepler(separable=True, analytic=True)
    m = tgi.METHODS["verlet"]
    q0, p0 = _batch()
    with torch.no_grad():
        qc, pc = compiled_rollout(m, system, q0, p0, h=0.01, steps=53, save_every=8, block=4)
        qe, pe = tgi.rollout(system, q0, p0, h=0.01, steps=53, method="verlet", save_every=8)
    assert qc.shape == qe.shape == (8, 3, 2)
    assert (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12
    # a blow-up is reported in steps, not in macro steps
    blowup = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: -(q ** 4).sum(-1),
                                      kinetic_grad=lambda p: p, potential_grad=lambda q: -4 * q ** 3)
    with pytest.raises(FloatingPointError, match=r"between step 0 and step 64\b"):
        with torch.no_grad():
            compiled_rollout(m, blowup, torch.tensor([[2.0]]), torch.tensor([[0.0]]), h=0.5,
                             steps=200, save_every=4, check_every=64, block=4)


def test_batch_inner_layout():
    """batch_inner: same shape and values, dim 0 as the stride-1 axis; small batches and wide
    states left as they are."""
    n = _compile.LAYOUT_MIN_BATCH
    x = torch.randn(n, 5, 3, dtype=torch.float64)
    y = _compile.batch_inner(x)
    assert y.shape == x.shape and torch.equal(y, x) and y.stride() == (1, 3 * n, n)
    for small in (torch.randn(n - 1, 2), torch.randn(n, _compile.LAYOUT_MAX_EVENT + 1),
                  torch.randn(n), None):
        assert _compile.batch_inner(small) is small
    assert _compile._row_major([y, None, (y,)])[0].is_contiguous()


def _stride_spy(monkeypatch):
    """Batches from 2 up take the batch-innermost layout; the list of the strides of q that
    every compiled block call receives."""
    monkeypatch.setattr(_compile, "LAYOUT_MIN_BATCH", 2)
    monkeypatch.setattr(_compile, "LOOP_MAX_NUMEL", 0)     # the blocks, not the compiled loop
    seen, traced = [], _compile._traced

    def spy(call, q, *args):
        seen.append(q.stride())
        return traced(call, q, *args)

    monkeypatch.setattr(_compile, "_traced", spy)
    return seen


def _viewing_system():
    """A separable system whose force calls .view() on q (it needs a contiguous q)."""
    def force(q):
        flat = q.view(-1)
        return (flat / (flat * flat + 1.0)).view(q.shape)

    return tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1),
                                    lambda q: 0.5 * torch.log1p(q * q).sum(-1),
                                    kinetic_grad=lambda p: p, potential_grad=force)


def test_macro_blocks_run_batch_innermost_and_return_row_major(monkeypatch):
    """A macro block gets the state batch-innermost (inductor vectorises over the trajectories),
    the blocks of one stretch hand it on in that layout (one conversion in and one out per
    stretch, not per block) and the rollout still returns contiguous states equal to the eager
    ones."""
    seen = _stride_spy(monkeypatch)
    copies, real_inner = [], _compile.batch_inner
    monkeypatch.setattr(_compile, "batch_inner",
                        lambda x: copies.append(x.is_contiguous()) or real_inner(x))
    system = kepler(separable=True, analytic=True)
    q0, p0 = _batch(n=5)
    with torch.no_grad():
        qc, pc = compiled_rollout(tgi.METHODS["yoshida4"], system, q0, p0, h=0.01, steps=48,
                                  save_every=12, block=4)
        qe, pe = tgi.rollout(system, q0, p0, h=0.01, steps=48, method="yoshida4", save_every=12)
    assert len(seen) == 12 and all(s == (1, 5) for s in seen)
    # 4 stretches of 12 steps (saves) of 3 blocks each: q, p and force converted at the first
    # block of each stretch only
    assert len(copies) == 3 * 12 and sum(copies) == 3 * 4
    assert qc.is_contiguous() and pc.is_contiguous()
    assert (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12


def test_macro_blocks_fall_back_to_row_major_for_a_system_that_needs_it(monkeypatch):
    """A force written with .view() cannot take the batch-innermost layout: the block is compiled
    on the row-major one instead, without a warning, and still equals eager."""
    monkeypatch.setattr(_compile, "LAYOUT_MIN_BATCH", 2)
    monkeypatch.setattr(_compile, "LOOP_MAX_NUMEL", 0)
    system = _viewing_system()
    q0, p0 = _batch(n=4)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        qc, pc = compiled_rollout(tgi.METHODS["verlet"], system, q0, p0, h=0.05, steps=16,
                                  save_every=8, block=4)
        qe, pe = tgi.rollout(system, q0, p0, h=0.05, steps=16, method="verlet", save_every=8)
    assert _compile._kernels(tgi.METHODS["verlet"], system).inner is False
    assert (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12


def _graphs():
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def test_compiled_implicit_midpoint_fuses_its_iterations_and_says_so():
    """Fixed-point implicit midpoint under compile=True: the iterations between two checks run
    as one compiled call (traced through X_H by autograd), compiled once for the whole rollout
    (t and the state are its arguments, not baked in); the states equal eager's to round-off."""
    system = kepler(separable=False, analytic=False)   # X_H by autograd, traced
    q0, p0 = _batch()
    with torch.no_grad():
        qe, pe = tgi.rollout(system, q0, p0, h=0.02, steps=40, method="implicit_midpoint")
        n = _graphs()
        with pytest.warns(UserWarning, match="implicit_midpoint.*iterations between two convergence checks"):
            qc, pc = tgi.rollout(system, q0, p0, h=0.02, steps=40, method="implicit_midpoint",
                                 compile=True)
        assert 0 < _graphs() - n <= 2        # one graph (and at most one recompile for t)
    assert (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12
    step = compiled_step(tgi.METHODS["implicit_midpoint"], system)
    assert step.mode == "fused"


def test_compiled_implicit_midpoint_gradients_and_errors():
    """Under grad mode the fused forward iterations carry no graph; the one application that
    does and the implicit adjoint run eagerly: the gradients equal eager's.  A step without a
    solution still raises ConvergenceError naming its step."""
    system = kepler(separable=False, analytic=False)
    q0, p0 = _batch()
    x = q0.clone().requires_grad_()
    q, _ = tgi.rollout(system, x, p0, h=0.02, steps=10, method="implicit_midpoint", compile=True)
    g, = torch.autograd.grad(q[-1].square().sum(), x)
    xe = q0.clone().requires_grad_()
    qe, _ = tgi.rollout(system, xe, p0, h=0.02, steps=10, method="implicit_midpoint")
    ge, = torch.autograd.grad(qe[-1].square().sum(), xe)
    assert (g - ge).abs().max() < 1e-10
    with torch.no_grad(), pytest.raises(tgi.ConvergenceError, match="step"):
        tgi.rollout(system, q0 * 0.05, p0, h=2.0, steps=5, method="implicit_midpoint", compile=True)


def test_compiled_implicit_midpoint_blocks_of_fixed_iterations(monkeypatch):
    """Without a graph, once the checked steps have measured the iterations m a solve needs,
    blocks of K steps run every solve with exactly m iterations as one compiled call and one
    check: the states agree with eager's to the solver's tolerance.  A block whose m is too small
    is dropped and its steps rerun checked (m rises back); a block that goes non-finite falls
    back to the checked step, which raises ConvergenceError; under a graph no block runs."""
    system = kepler(separable=False, analytic=True)
    q0, p0 = _batch()
    method, h, tol = tgi.METHODS["implicit_midpoint"], 0.02, tgi.default_tol(torch.float64)
    k = _compile._kernels(method, system)
    runs, spies, block = [], {}, _compile._Kernels.implicit_block

    def spy(self, K, m):       # each block call: (K, m, its worst residual)
        if (K, m) not in spies:
            fn = block(self, K, m)

            def call(*args):
                out = fn(*args)
                runs.append((K, m, float(out[-1])))
                return out
            spies[(K, m)] = call
        return spies[(K, m)]
    monkeypatch.setattr(_compile._Kernels, "implicit_block", spy)
    warnings.filterwarnings("ignore", "compile=True: 'implicit_midpoint' is implicit")
    with torch.no_grad():
        qe, pe = tgi.rollout(system, q0, p0, h=h, steps=41, method="implicit_midpoint")
        qc, pc = compiled_rollout(method, system, q0, p0, h=h, steps=41, block=2)
    m = k.fixed_m
    assert m >= 8 and m % 4 == 0 and k.fixed_failed is None
    assert len(runs) == 20 and all(K == 2 and mm == m and r <= tol for K, mm, r in runs)
    assert (qc - qe).abs().max() < 1e-11 and (pc - pe).abs().max() < 1e-11
    # rollout's own plan: K = IMPLICIT_BUDGET // m from FIXED_MIN_STEPS steps on, none below
    K, n = _compile.IMPLICIT_BUDGET // m, len(runs)
    with torch.no_grad():
        q1, p1 = tgi.rollout(system, q0, p0, h=h, steps=_compile.FIXED_MIN_STEPS - 1,
                             method="implicit_midpoint", compile=True)
        assert len(runs) == n
        qc, pc = tgi.rollout(system, q0, p0, h=h, steps=_compile.FIXED_MIN_STEPS,
                             method="implicit_midpoint", compile=True)
        qe, pe = tgi.rollout(system, q0, p0, h=h, steps=_compile.FIXED_MIN_STEPS,
                             method="implicit_midpoint")
    assert len(runs) - n >= (_compile.FIXED_MIN_STEPS - 1) // K - 1
    assert all(r[:2] == (K, m) for r in runs[n:])
    assert (qc - qe).abs().max() < 1e-10 and (pc - pe).abs().max() < 1e-10
    # a block with too few iterations: dropped, its steps checked, m back
    step = compiled_step(method, system, steps=41, block=2)
    with torch.no_grad():
        q1, p1, c1 = step.step(system, q0, p0, 0.0, h, None)      # checked: the warm start
        k.fixed_m = 4
        q2, p2, _ = step.step(system, q1, p1, h, h, c1)
        assert runs[-1][:2] == (2, 4) and runs[-1][2] > tol and k.fixed_m == m
        assert (q2 - qe[2]).abs().max() < 1e-12 and (p2 - pe[2]).abs().max() < 1e-12
        step._checked = 0                       # a block from a state with no midpoint step
        with pytest.raises(tgi.ConvergenceError, match="did not converge"):
            step.step(system, torch.zeros_like(q1), p1, 2 * h, h, c1)
        assert runs[-1][:2] == (2, m) and not runs[-1][2] <= tol          # dropped
    # a graph (q0 requires grad): checked steps only, eager's gradient
    n, x, xe = len(runs), q0.clone().requires_grad_(), q0.clone().requires_grad_()
    g, = torch.autograd.grad(compiled_rollout(method, system, x, p0, h=h, steps=8,
                                              block=2)[0][-1].square().sum(), x)
    ge, = torch.autograd.grad(tgi.rollout(system, xe, p0, h=h, steps=8,
                                          method="implicit_midpoint")[0][-1].square().sum(), xe)
    assert len(runs) == n and (g - ge).abs().max() < 1e-10


def test_compiled_implicit_blocks_time_dependent_first_order_and_empty():
    """A block of fixed iterations on a system that depends on t runs step j at t + j h: its
    function (uncompiled here: the traced code itself) gives the checked steps' states; a
    first-order state (odeint's implicit midpoint on y' = f(t, y), t a tensor) and an empty
    batch take no blocks and compile nothing that fails (warnings are errors)."""
    def grad(q, p, t):     # of H = |p|²/2 + (1 + sin t / 10)|q|²/2 + (q·p)²/10, non-separable
        qp = (q * p).sum(-1, keepdim=True)
        return (1.0 + 0.1 * math.sin(t)) * q + 0.2 * qp * p, p + 0.2 * qp * q

    forced = tgi.Hamiltonian(lambda q, p, t: 0.5 * (p * p).sum(-1) + 0.05 * (10.0 + math.sin(t))
                             * (q * q).sum(-1) + 0.1 * (q * p).sum(-1) ** 2, grad=grad)
    q0, p0 = _batch()
    method, h, t0 = tgi.METHODS["implicit_midpoint"], 0.05, 0.3
    block = _compile._kernels(method, forced).implicit_block(3, 16).fn
    with torch.no_grad():
        qs, ps, _, _, _, r = block(q0, p0, None, t0, h)
        q, p, cache = q0, p0, None
        for j in range(3):
            q, p, cache = method.step(forced, q, p, t0 + j * h, h, cache)
            assert (qs[j] - q).abs().max() < 1e-12 and (ps[j] - p).abs().max() < 1e-12
    assert r <= tgi.default_tol(torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", "compile=True: 'implicit_midpoint' is implicit")
        t = torch.linspace(0.0, 3.0, 4, dtype=torch.float64)
        x0 = torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        f = lambda t, x: -x + 0.1 * torch.sin(t) * x ** 2  # noqa: E731
        opts = dict(step_size=0.01)
        ye = tgi.odeint(f, x0, t, method="implicit_midpoint", options=opts)
        yc = tgi.odeint(f, x0, t, method="implicit_midpoint", options=dict(opts, compile=True))
        assert (yc - ye).abs().max() < 1e-11
        with torch.no_grad():
            empty = tgi.rollout(forced, q0[:0], p0[:0], h=0.05, steps=300,
                                method="implicit_midpoint", compile=True)
        assert empty[0].shape == (301, 0, 2)


def test_compiled_newton_midpoint_compiles_the_vector_field(monkeypatch):
    """A Newton-solved implicit step keeps the compiled-vector-field path (for states of at
    least FIELDS_MIN elements; smaller ones run the eager step, nothing compiled)."""
    system = kepler(separable=False, analytic=False)
    q0, p0 = _batch()
    m = tgi.METHODS["implicit_midpoint"].with_options(solver="newton")
    with torch.no_grad():
        qe, pe = tgi.rollout(system, q0, p0, h=0.02, steps=40, method=m)
        n = _graphs()
        with pytest.warns(UserWarning, match="implicit.*vector field is compiled"):
            qs, ps = tgi.rollout(system, q0, p0, h=0.02, steps=5, method=m, compile=True)
        assert _graphs() == n and torch.equal(qs, qe[:6])
        monkeypatch.setattr(_compile, "FIELDS_MIN", 1)  # now compile the field for 3 samples
        with pytest.warns(UserWarning, match="implicit"):
            qc, pc = tgi.rollout(system, q0, p0, h=0.02, steps=40, method=m, compile=True)
        assert _graphs() > n
    assert (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12


def test_uncompilable_system_falls_back_to_eager_with_a_warning():
    # Python floats out of the tensor inside the force: dynamo cannot trace it into one graph.
    def grad_V(q):
        return torch.tensor(q.tolist(), dtype=q.dtype)

    system = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: 0.5 * (q * q).sum(-1),
                                      kinetic_grad=lambda p: p, potential_grad=grad_V)
    q0, p0 = torch.tensor([[1.0]]), torch.tensor([[0.0]])
    step = compiled_step(tgi.METHODS["verlet"], system)
    with pytest.warns(UserWarning, match="could not compile the step of 'verlet'.*eagerly"):
        qc, pc = _loop(step, system, q0, p0, 20, h=0.1)
    assert step.mode == "eager"
    qe, pe = _loop(tgi.METHODS["verlet"].step, system, q0, p0, 20, h=0.1)
    assert torch.equal(qc, qe) and torch.equal(pc, pe)
    # the fallback is remembered: no second attempt, no second warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _loop(compiled_step(tgi.METHODS["verlet"], system), system, q0, p0, 5, h=0.1)


def test_block_sizes_and_bad_arguments():
    sep, nonsep = kepler(separable=True, analytic=True), kepler(separable=False)
    assert default_block(tgi.METHODS["verlet"], sep) == 16
    assert default_block(tgi.METHODS["yoshida4"], sep) == 5      # 3 drifts per step
    assert default_block(tgi.METHODS["kahan_li8"], sep) == 1     # 17 drifts: one step a block
    assert default_block(tgi.METHODS["verlet"], nonsep) == 1     # implicit there
    m = tgi.METHODS["verlet"]
    with pytest.raises(ValueError, match="block must be an int"):
        compiled_step(m, sep, steps=10, block=0)
    with pytest.raises(ValueError, match="step count"):
        compiled_step(m, sep, block=4)
    step = compiled_step(m, sep)
    q0, p0 = kepler_initial(0.5)
    with pytest.raises(ValueError, match="another system"):
        step(kepler(separable=True), q0, p0, 0.0, 0.1, None)


def test_odeint_compile_matches_eager_and_compiles_once():
    """odeint(..., options=dict(compile=True)): func gets t as a tensor inside the graphs (no
    recompilation per step time), the groups of unequal intervals agree with eager to 1e-12,
    and a second call with the same func and layout reuses the compiled graphs."""
    def f(t, y):   # Kepler, (q, p) in one tensor; t unused, as in most autonomous fields
        q, p = y[..., :2], y[..., 2:]
        return torch.cat([p, -q / q.norm(dim=-1, keepdim=True) ** 3], -1)

    q0, p0 = _batch()
    y0 = torch.cat([q0, p0], -1)
    t = torch.tensor([0.0, 0.3, 0.6, 1.0, 1.5])       # two runs of equal intervals, then others
    opts = dict(step_size=0.01, separable=True)
    with torch.no_grad():
        ye = tgi.odeint(f, y0, t, method="yoshida4", options=opts)
        with warnings.catch_warnings():
            warnings.simplefilter("error")               # no fallback to eager
            yc = tgi.odeint(f, y0, t, method="yoshida4", options=dict(opts, compile=True))
            n = _graphs()
            yc2 = tgi.odeint(f, 1.01 * y0, t, method="yoshida4", options=dict(opts, compile=True))
    assert _graphs() == n                                 # compiled once
    assert yc.shape == ye.shape and (yc - ye).abs().max() < 1e-12
    ye2 = tgi.odeint(f, 1.01 * y0, t, method="yoshida4", options=opts)
    assert (yc2 - ye2).abs().max() < 1e-12
    with pytest.raises(ValueError, match="compile"):
        tgi.odeint(f, y0, t, method="verlet", options=dict(opts, compile="yes"))


def test_compiled_stepper_is_a_stepper_whose_steps_are_the_eager_ones():
    """compile=True wraps the one stepper protocol: CompiledStep is a Stepper; its steps(n)
    (final-state blocks of K' = 4 here, then the last n mod 4 steps eagerly) equals the eager
    stepper's steps(n), and its FSAL cache is the force at the final state."""
    from torchgeo_int.integrators.base import Stepper

    system = kepler(separable=True, analytic=True)
    m = tgi.METHODS["verlet"]
    eager = m.bind(system)
    step = compiled_step(m, system, steps=64, save_every=8, block=4)
    assert isinstance(eager, Stepper) and isinstance(step, Stepper) and step.macro == 4
    q0, p0 = _batch()
    with torch.no_grad():
        qe, pe, fe = eager.steps(q0, p0, 0.0, 0.01, 10)
        qc, pc, fc = step.steps(q0, p0, 0.0, 0.01, 10)
    assert (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12
    assert (fc - fe).abs().max() < 1e-12


_INTO = pytest.mark.parametrize("into", [False, True], ids=["stacked", "into-rows"])


def _into(monkeypatch, into):
    """Every-state blocks that write their states into the rows inside the graph (``into``, the
    path of large states and of batch-innermost ones of few elements) or return them for one
    stack copy."""
    monkeypatch.setattr(_compile, "into_rows", lambda q, inner: into)


@pytest.mark.parametrize("m", [1, 2, 3, 8, 9])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_row_major_state_interleaves_batch_innermost_states(monkeypatch, m, dtype):
    """row_major_state: a batch-innermost (B, m) state comes out row-major with the same values,
    eagerly and compiled (stored into a row, as the every-state blocks do); states of at most
    INTERLEAVE_MAX elements by the torch.where chain (traced: counted), others by contiguous()."""
    torch.manual_seed(m)
    x = torch.randn(m, 300, dtype=dtype).t()                  # (300, m), batch-innermost
    where, real = [], torch.where
    monkeypatch.setattr(torch, "where", lambda *a: where.append(1) or real(*a))
    y = _compile.row_major_state(x)
    assert y.is_contiguous() and torch.equal(y, x)
    assert len(where) == (m - 1 if m <= _compile.INTERLEAVE_MAX else 0)
    monkeypatch.setattr(torch, "where", real)

    def store(x, row):
        row.copy_(_compile.row_major_state(x * 2.0))
        return x

    row = torch.empty(300, m, dtype=dtype)
    torch.compile(store, dynamic=False)(x, row)
    assert torch.equal(row, x * 2.0)


def test_small_batch_innermost_states_go_into_the_rows(monkeypatch):
    """By default (no patched rule) a batch-innermost state of few elements a trajectory below
    INTO_MIN_NUMEL (Kepler, B = 300: 600 elements) runs the into-rows blocks, a wide one
    (9 elements) the stacked blocks; both equal eager through a public rollout."""
    monkeypatch.setattr(_compile, "LOOP_MAX_NUMEL", 0)
    assert 300 * 9 < _compile.INTO_MIN_NUMEL and 2 <= _compile.INTERLEAVE_MAX < 9
    torch.manual_seed(3)
    for n, into in ((2, True), (9, False)):
        system = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1),
                                          lambda q: 0.5 * (q * q).sum(-1) + 0.1 * (q ** 4).sum(-1))
        q0, p0 = torch.randn(300, n, dtype=torch.float64), torch.randn(300, n, dtype=torch.float64)
        with torch.no_grad():
            qe, pe = tgi.rollout(system, q0, p0, h=0.01, steps=40)
            qc, pc = tgi.rollout(system, q0, p0, h=0.01, steps=40, compile=True)
        assert (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12
        keys = [key for key in _compile._kernels(tgi.METHODS["verlet"], system)._blocks
                if len(key) == 4 and key[1]]
        assert keys and all(key[-1] is into for key in keys), (n, keys)


@_INTO
def test_every_state_saved_in_whole_blocks(monkeypatch, into):
    """save_every = 1: run_loop hands the compiled stepper a stretch up to the next check and its
    rows; blocks of K = 3 write their states there (inside the graph, or stacked in one copy),
    the steps a stretch does not fill with blocks (16 = 3·5 + 1, and the last ones of the
    rollout) run eagerly.
    No per-step call of ``step``; the same states as eager to round-off, under no_grad and under
    grad mode with nothing requiring grad (no graph: the outputs do not require grad).  (The
    blocks: this small state would otherwise run as compiled loops.)"""
    _into(monkeypatch, into)
    monkeypatch.setattr(_compile, "LOOP_MAX_NUMEL", 0)
    system = kepler(separable=True, analytic=True)
    m = tgi.METHODS["verlet"]
    q0, p0 = _batch()
    steps = 37
    qe, pe = _loop(m.step, system, q0, p0, steps)
    stepper = compiled_step(m, system, steps=steps, block=3)
    calls = {"step": 0, "saves": 0}
    step0, saves0 = stepper.step, stepper.saves
    monkeypatch.setattr(stepper, "step", lambda *a, **k: (calls.__setitem__("step", calls["step"] + 1), step0(*a, **k))[1])
    monkeypatch.setattr(stepper, "saves", lambda *a, **k: (calls.__setitem__("saves", calls["saves"] + 1), saves0(*a, **k))[1])
    qc, pc = _loop(stepper, system, q0, p0, steps)
    assert calls == {"step": 0, "saves": 3}        # stretches 16, 16, 5 (check_every = 16)
    assert (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12
    with torch.enable_grad():
        qg, pg = run_loop(compiled_step(m, system, steps=steps, block=3), q0, p0, system=system,
                          h=0.01, steps=steps, t0=0.0, save_every=1, check_every=16)
    assert not qg.requires_grad and torch.equal(qg, qc) and torch.equal(pg, pc)
    assert any(key[-1] is into for key in _compile._kernels(m, system)._blocks if len(key) == 4)


def test_every_state_blocks_write_float32_states_into_their_rows(monkeypatch):
    """The into-rows path in float32 (the rows are graph inputs of the state's dtype): the
    states equal eager's to float32 round-off, through a public rollout."""
    _into(monkeypatch, True)
    monkeypatch.setattr(_compile, "LOOP_MAX_NUMEL", 0)
    system = kepler(separable=True, analytic=True)
    q0, p0 = (x.float() for x in _batch(n=64))
    with torch.no_grad():
        qe, pe = tgi.rollout(system, q0, p0, h=0.01, steps=40)
        qc, pc = tgi.rollout(system, q0, p0, h=0.01, steps=40, compile=True)
    assert qc.dtype == torch.float32
    assert (qc - qe).abs().max() < 1e-5 and (pc - pe).abs().max() < 1e-5
    keys = _compile._kernels(tgi.METHODS["verlet"], system)._blocks
    assert any(len(key) == 4 and key[-1] for key in keys)


@_INTO
def test_every_state_blocks_run_batch_innermost_and_write_row_major(monkeypatch, into):
    """Every state saved, a batch that takes the batch-innermost layout: each block receives the
    state batch-innermost (the first converted, the next ones handed on from the last block, no
    row-major round trip), its states land row-major in the rows, equal to eager; a caller that
    steps one state at a time gets the same states from the lookahead blocks; a force written
    with .view() falls back to the row-major layout and still equals eager."""
    _into(monkeypatch, into)
    seen = _stride_spy(monkeypatch)
    system = kepler(separable=True, analytic=True)
    m = tgi.METHODS["verlet"]
    q0, p0 = _batch(n=5)
    steps = 37
    qe, pe = _loop(m.step, system, q0, p0, steps)
    qc, pc = _loop(compiled_step(m, system, steps=steps, block=4), system, q0, p0, steps)
    assert len(seen) == 9 and all(s == (1, 5) for s in seen)      # 37 = 16 + 16 + 5: 4 + 4 + 1
    assert qc.is_contiguous() and pc.is_contiguous()
    assert (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12

    stepper, cache, q, p = compiled_step(m, system, steps=steps, block=4), None, q0, p0
    with torch.no_grad():
        for j in range(steps):
            q, p, cache = stepper.step(system, q, p, 0.01 * j, 0.01, cache)
            assert q.is_contiguous() and (q - qe[j + 1]).abs().max() < 1e-12
            assert p.is_contiguous() and (p - pe[j + 1]).abs().max() < 1e-12

    viewing = _viewing_system()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        qv, pv = _loop(compiled_step(m, viewing, steps=20, block=4), viewing, q0, p0, 20, h=0.05)
    qw, pw = _loop(m.step, viewing, q0, p0, 20, h=0.05)
    assert _compile._kernels(m, viewing).inner is False
    assert (qv - qw).abs().max() < 1e-12 and (pv - pw).abs().max() < 1e-12


@_INTO
def test_every_state_blocks_leave_row_major_and_fall_back_mid_run(monkeypatch, into):
    """A block that fails after batch-innermost blocks ran: the retry gets row-major q, p and
    force (not the previous block's layout), the states equal eager's, and what ``saves`` hands
    back (the state and FSAL force) is row-major.  A method without FSAL (its force None)
    takes the same path."""
    _into(monkeypatch, into)
    monkeypatch.setattr(_compile, "LAYOUT_MIN_BATCH", 2)
    seen, traced = [], _compile._traced

    def flaky(call, q, *args):
        seen.append(q.is_contiguous())
        if len(seen) == 2:
            raise RuntimeError("a recompile that fails on this layout")
        return traced(call, q, *args)

    monkeypatch.setattr(_compile, "_traced", flaky)
    system = kepler(separable=True, analytic=True)
    m = tgi.METHODS["verlet"]
    q0, p0 = _batch(n=5)
    qe, pe = _loop(m.step, system, q0, p0, 16)
    stepper = compiled_step(m, system, steps=16, block=4)
    qs, ps = torch.empty(16, 5, 2, dtype=q0.dtype), torch.empty(16, 5, 2, dtype=q0.dtype)
    with torch.no_grad():
        q, p, force = stepper.saves(q0, p0, 0.0, 0.01, 16, rows=(qs, ps))
    assert seen[:2] == [False, False] and all(seen[2:])
    assert _compile._kernels(m, system).inner is False and not _compile._kernels(m, system).failed
    assert (qs - qe[1:]).abs().max() < 1e-12 and (ps - pe[1:]).abs().max() < 1e-12
    assert q.is_contiguous() and p.is_contiguous() and force.is_contiguous()

    adjoint = tgi.METHODS["symplectic_euler_adjoint"]     # drift first: no FSAL force
    qa, pa = _loop(adjoint.step, system, q0, p0, 16)
    qc, pc = _loop(compiled_step(adjoint, system, steps=16, block=4), system, q0, p0, 16)
    assert (qc - qa).abs().max() < 1e-12 and (pc - pa).abs().max() < 1e-12


def test_final_state_blocks_fall_back_mid_stretch(monkeypatch):
    """``steps(n)`` hands the state on batch-innermost between its blocks.  A block that fails
    after one ran: the row-major retry gets contiguous q, p and force; a block that cannot be
    compiled at all falls back to eager steps from the batch-innermost state.  Either way the
    final state equals eager's and what ``steps`` returns (state and FSAL force) is row-major."""
    monkeypatch.setattr(_compile, "LAYOUT_MIN_BATCH", 2)
    m = tgi.METHODS["verlet"]
    q0, p0 = _batch(n=5)
    traced = _compile._traced
    for always in (False, True):
        seen = []

        def flaky(call, q, *args, seen=seen, always=always):
            seen.append(q.is_contiguous())
            if len(seen) == 2 or (always and len(seen) > 2):
                raise RuntimeError("a recompile that fails on this layout")
            return traced(call, q, *args)

        monkeypatch.setattr(_compile, "_traced", flaky)
        system = kepler(separable=True, analytic=True)      # a new system: its own kernels
        qe, pe = _loop(m.step, system, q0, p0, 16)
        stepper = compiled_step(m, system, steps=16, save_every=16, block=4)
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            q, p, force = stepper.steps(q0, p0, 0.0, 0.01, 16)
        kernels = _compile._kernels(m, system)
        assert seen[:2] == [False, False] and kernels.inner is False
        if always:       # the row-major retry failed too: eager from then on, with a warning
            assert seen[2:] == [True] and kernels.failed
            assert any("could not compile" in str(w.message) for w in caught)
        else:
            assert all(seen[2:]) and len(seen) == 5 and not kernels.failed
        assert (q - qe[-1]).abs().max() < 1e-12 and (p - pe[-1]).abs().max() < 1e-12
        assert q.is_contiguous() and p.is_contiguous() and force.is_contiguous()


def test_inductor_options_by_device(monkeypatch):
    """The C++ wrapper on small CPU graphs only (CPP_WRAPPER, CPP_WRAPPER_MAX_NUMEL), and a
    compiled function keeps one torch.compile per device type."""
    small, large = _compile.CPP_WRAPPER_MAX_NUMEL, _compile.CPP_WRAPPER_MAX_NUMEL + 1
    assert _compile._inductor_options("cpu", small).get("cpp_wrapper") is True
    assert "cpp_wrapper" not in _compile._inductor_options("cpu", large)
    assert "cpp_wrapper" not in _compile._inductor_options("cuda", small)
    # the realize threshold on the CPU only, whichever name this torch gives it: on a GPU it
    # split a Kepler step into 2.2 Triton kernels (README, "On a GPU")
    realize = [k for k in _compile._inductor_options("cpu", large) if k.startswith("realize")]
    assert len(realize) == 1 and _compile._inductor_options("cpu", large)[realize[0]] == _compile.REALIZE_OPCOUNT
    import torch._inductor.config as config
    monkeypatch.delattr(config, "realize_cpu_opcount_threshold", raising=False)   # torch < 2.13
    assert "realize_opcount_threshold" in _compile._inductor_options("cpu", large)
    assert not any(k.startswith("realize") for k in _compile._inductor_options("cuda", small))
    monkeypatch.setattr(_compile, "CPP_WRAPPER", False)
    assert "cpp_wrapper" not in _compile._inductor_options("cpu", small)
    assert _compile._device_type((None, [torch.zeros(1)], 1.0)) == "cpu"
    assert _compile._device_type((torch.zeros(1, device="meta"),)) == "meta"


def test_every_state_saved_keeps_the_graph_of_a_captured_tensor():
    """A force that reads a tensor requiring grad: the compiled stepper's ``saves`` declines
    (it would write a graph into the buffers), run_loop steps as before, the gradient flows."""
    k = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    system = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: 0.5 * k * (q * q).sum(-1),
                                      kinetic_grad=lambda p: p, potential_grad=lambda q: k * q)
    q0, p0 = _batch()
    m = tgi.METHODS["verlet"]
    stepper = compiled_step(m, system, steps=12, block=4)
    q, p = run_loop(stepper, q0, p0, system=system, h=0.1, steps=12, t0=0.0, save_every=1,
                    check_every=16)
    qe, pe = run_loop(m.step, q0, p0, system=system, h=0.1, steps=12, t0=0.0, save_every=1,
                      check_every=16)
    assert q.requires_grad and (q - qe).abs().max() < 1e-12
    g, = torch.autograd.grad(q[-1].sum(), k)
    ge, = torch.autograd.grad(qe[-1].sum(), k)
    assert torch.isfinite(g) and abs(g - ge) < 1e-10


def _loop_calls(monkeypatch, keep_all=False):
    """(steps per block, blocks) of every compiled-loop call (``_Kernels.loop``), in order; with
    ``keep_all`` (K, blocks, keeps every state)."""
    calls, real = [], _compile._Kernels.loop

    def spy(self, m, keep=False):
        fn = real(self, m, keep)
        call = (m, None, keep) if keep_all else (m, None)
        return lambda n, *args: calls.append(call[:1] + (int(n),) + call[2:]) or fn(n, *args)
    monkeypatch.setattr(_compile._Kernels, "loop", spy)
    return calls


def test_final_state_stretches_run_as_one_compiled_loop(monkeypatch):
    """A small state's stretch between saves is one compiled loop over its K'-step blocks, across
    the checks (save_every = 24, K' = 4, check_every = 16: six blocks a call); the last stretch
    (5 steps, under two blocks) steps as before; states equal eager's; also under grad mode
    with nothing requiring grad, and not when the system has a parameter that does."""
    calls = _loop_calls(monkeypatch)
    system = kepler(separable=True, analytic=True)
    m = tgi.METHODS["verlet"]
    q0, p0 = _batch()
    qe, pe = _loop(m.step, system, q0, p0, 53, save_every=24)
    qc, pc = _loop(compiled_step(m, system, steps=53, save_every=24, block=4), system, q0, p0, 53,
                   save_every=24)
    assert calls == [(4, 6), (4, 6)]
    assert qc.shape == (4, 3, 2) and (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12
    q, p = run_loop(compiled_step(m, system, steps=53, save_every=24, block=4), q0, p0,
                    system=system, h=0.01, steps=53, t0=0.0, save_every=24, check_every=16)
    assert len(calls) == 4 and not q.requires_grad and (q - qe).abs().max() < 1e-12

    k = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)   # read by the force: a graph
    trained = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1),
                                       lambda q: 0.5 * k * (q * q).sum(-1),
                                       kinetic_grad=lambda p: p, potential_grad=lambda q: k * q)
    q, p = run_loop(compiled_step(m, trained, steps=53, save_every=24, block=4), q0, p0,
                    system=trained, h=0.01, steps=53, t0=0.0, save_every=24, check_every=16)
    assert len(calls) == 4 and q.requires_grad


def test_compiled_loop_blowup_is_named_as_eager_names_it(monkeypatch):
    """A stretch whose loop ends non-finite runs again checked from its start: the error names
    the steps that eager's checks name (check_every = 16 inside a stretch of 200)."""
    calls = _loop_calls(monkeypatch)
    blowup = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: -(q ** 4).sum(-1),
                                      kinetic_grad=lambda p: p, potential_grad=lambda q: -4 * q ** 3)
    m, q0, p0 = tgi.METHODS["verlet"], torch.tensor([[0.3]]), torch.tensor([[0.0]])
    messages = []
    for step in (m.step, compiled_step(m, blowup, steps=200, save_every=200, block=4)):
        with pytest.raises(FloatingPointError) as info, torch.no_grad():
            run_loop(step, q0, p0, system=blowup, h=0.1, steps=200, t0=0.0, save_every=200,
                     check_every=16)
        messages.append(str(info.value))
    assert calls == [(4, 50)] and messages[0] == messages[1]
    assert "between step 32 and step 48" in messages[0]


def test_compiled_loop_declines_and_falls_back(monkeypatch):
    """No loop for a time-dependent system taking t as a float (in the loop t is a tensor), a
    state over LOOP_MAX_NUMEL, an empty one or one off the CPU; a loop that fails to compile is recorded and the blocks run,
    without a warning.  Results equal eager's each time."""
    calls = _loop_calls(monkeypatch)
    m = tgi.METHODS["verlet"]
    q0, p0 = _batch()
    driven = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1),
                                      lambda q, t: 0.5 * (1.0 + 0.1 * t) * (q * q).sum(-1),
                                      kinetic_grad=lambda p: p,
                                      potential_grad=lambda q, t: (1.0 + 0.1 * t) * q)
    for system, limit in ((driven, _compile.LOOP_MAX_NUMEL), (kepler(True, True), 5)):
        monkeypatch.setattr(_compile, "LOOP_MAX_NUMEL", limit)
        qe, pe = _loop(m.step, system, q0, p0, 32, save_every=32)
        qc, pc = _loop(compiled_step(m, system, steps=32, save_every=32, block=4), system, q0, p0,
                       32, save_every=32)
        assert calls == [] and (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12
    monkeypatch.undo()

    def broken(self, m, keep_all=False):
        raise RuntimeError("no while_loop here")
    monkeypatch.setattr(_compile._Kernels, "loop", broken)
    system = kepler(separable=True, analytic=True)
    qe, pe = _loop(m.step, system, q0, p0, 32, save_every=32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        qc, pc = _loop(compiled_step(m, system, steps=32, save_every=32, block=4), system, q0, p0,
                       32, save_every=32)
    k = _compile._kernels(m, system)
    assert "no while_loop here" in k.loop_failed and not k.failed
    assert (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12
    monkeypatch.undo()
    meta = q0.to("meta")       # off the CPU: declined before anything runs
    stepper = compiled_step(m, kepler(True, True), steps=32, save_every=32, block=4)
    assert stepper.long_steps(meta, meta, 0.0, 0.01, 32) is None
    empty = torch.zeros(0, 2, dtype=torch.float64)      # an empty batch: no loop, no error
    for save in (1, 16):
        with torch.no_grad():
            qz, pz = tgi.rollout(kepler(True, True), empty, empty, h=0.01, steps=40,
                                 save_every=save, compile=True)
        assert qz.shape == (-(-40 // save) + 1, 0, 2) and pz.shape == qz.shape


def test_every_state_runs_as_compiled_loops_within_their_rows(monkeypatch):
    """Every state saved, small state: compiled loops of K-step blocks, each carrying at most
    LOOP_ROWS elements of states (here 2 blocks of 4 steps, 3 × 2 elements: 24 ≤ 48 ≤ 48), across
    the checks, the last 53 mod 4 steps eagerly; rows equal eager's.  A blow-up in saving mode
    is named as eager names it."""
    monkeypatch.setattr(_compile, "LOOP_ROWS", 48)
    calls = _loop_calls(monkeypatch, keep_all=True)
    system = kepler(separable=True, analytic=True)
    m = tgi.METHODS["verlet"]
    q0, p0 = _batch()
    qe, pe = _loop(m.step, system, q0, p0, 53)
    qc, pc = _loop(compiled_step(m, system, steps=53, block=4), system, q0, p0, 53)
    assert calls == [(4, 2, True)] * 6 + [(4, 1, True)]
    assert (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12
    with torch.enable_grad():      # grad mode, nothing requiring grad: the same loops, no graph
        qg, pg = run_loop(compiled_step(m, system, steps=53, block=4), q0, p0, system=system,
                          h=0.01, steps=53, t0=0.0, save_every=1, check_every=16)
    assert len(calls) == 14 and not qg.requires_grad and torch.equal(qg, qc)
    blowup = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: -(q ** 4).sum(-1),
                                      kinetic_grad=lambda p: p, potential_grad=lambda q: -4 * q ** 3)
    messages = []
    for step in (m.step, compiled_step(m, blowup, steps=200, block=4)):
        with pytest.raises(FloatingPointError) as info, torch.no_grad():
            run_loop(step, torch.tensor([[0.3]]), torch.tensor([[0.0]]), system=blowup, h=0.1,
                     steps=200, t0=0.0, save_every=1, check_every=16)
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "between step 32 and step 48" in messages[0]


def test_compiled_loops_keep_a_progress_bar_moving(monkeypatch):
    """With a progress bar, a loop covers at most max(check_every, steps / 100) steps, so the
    bar moves during a long compiled run; the updates add up to the steps, the states as without
    a bar."""
    calls = _loop_calls(monkeypatch)
    system = kepler(separable=True, analytic=True)
    m = tgi.METHODS["verlet"]
    q0, p0 = _batch()

    class Bar:
        seen = []

        def update(self, n):
            self.seen.append(n)
    with torch.no_grad():
        qb, pb = run_loop(compiled_step(m, system, steps=96, save_every=96, block=4), q0, p0,
                          system=system, h=0.01, steps=96, t0=0.0, save_every=96, check_every=16,
                          progress=Bar())
    qe, pe = _loop(m.step, system, q0, p0, 96, save_every=96)
    assert Bar.seen == [16] * 6 and calls == [(4, 4)] * 6
    assert (qb - qe).abs().max() < 1e-12 and (pb - pe).abs().max() < 1e-12


def test_compiled_loops_in_float32(monkeypatch):
    """float32 states through the loops (every state: 2 blocks of 16, then 8 steps eagerly;
    final state: 4 blocks of 10) agree with eager float32 to its round-off."""
    calls = _loop_calls(monkeypatch, keep_all=True)
    system = kepler(separable=True, analytic=True)
    q0, p0 = (x.float() for x in _batch())
    with torch.no_grad():
        for save in (1, 40):
            qe, pe = tgi.rollout(system, q0, p0, h=0.01, steps=40, save_every=save)
            qc, pc = tgi.rollout(system, q0, p0, h=0.01, steps=40, save_every=save, compile=True)
            assert qc.dtype == torch.float32 and qc.shape == qe.shape
            assert (qc - qe).abs().max() < 1e-5 and (pc - pe).abs().max() < 1e-5
    assert calls == [(16, 2, True), (10, 4, False)]


def test_energy_defined_systems_and_hnns_run_compiled_loops(monkeypatch):
    """Forces by torch.autograd.grad do not trace inside a while_loop; traced without autograd,
    systems.grad_of takes them by torch.func.grad, so an energy-defined Kepler and a
    SeparableHNN run their stretches as loops, and their states equal eager's."""
    calls = _loop_calls(monkeypatch)
    torch.manual_seed(0)
    hnn = tgi.nn.SeparableHNN(2, width=16)
    q0, p0 = _batch()
    for system in (kepler(separable=True, analytic=False), hnn):
        with torch.no_grad():
            qe, pe = tgi.rollout(system, q0, p0, h=0.01, steps=40, save_every=40)
            qc, pc = tgi.rollout(system, q0, p0, h=0.01, steps=40, save_every=40, compile=True)
        k = _compile._kernels(tgi.METHODS["verlet"], system)
        assert not k.loop_failed and not k.failed
        assert (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12
    assert len(calls) == 2


def _autograd_traced(monkeypatch):
    """A list that gets an entry whenever grad_of's torch.autograd.grad branch runs while dynamo
    traces."""
    from torchgeo_int import systems as systems_module

    plain, traced = systems_module._autograd_grad, []

    def recorded(*args, **kwargs):
        if torch.compiler.is_compiling():
            traced.append(1)       # (a side effect dynamo replays after tracing)
        return plain(*args, **kwargs)

    monkeypatch.setattr(systems_module, "_autograd_grad", recorded)
    return traced


def test_compiled_graphs_without_autograd_trace_forces_by_func_grad(monkeypatch):
    """torch < 2.13's dynamo refuses requires_grad_ (the H200's torch 2.11: compile=True on an
    energy-defined Kepler fell back to eager, 13–35x the compiled closed form, and implicit
    midpoint's fused iterations on a non-separable H ran eagerly): traced without autograd,
    grad_of takes the gradient by torch.func.grad, so torch.autograd.grad never enters such a
    graph — the blocks of an energy-defined system, and the fused iterations of implicit
    midpoint on Hamiltonian(H); the states equal eager's."""
    traced = _autograd_traced(monkeypatch)
    q0, p0 = _batch(n=1200)   # blocks (2400 > LOOP_MAX_NUMEL: not the loops)
    for method, system in (("verlet", kepler(separable=True, analytic=False)),
                           ("implicit_midpoint", kepler(separable=False, analytic=False))):
        with torch.no_grad():
            qe, pe = tgi.rollout(system, q0, p0, h=0.01, steps=32, method=method)
            with warnings.catch_warnings():
                warnings.filterwarnings("error", message="compile=True: could not")
                qc, pc = tgi.rollout(system, q0, p0, h=0.01, steps=32, method=method, compile=True)
        k = _compile._kernels(tgi.METHODS[method], system)
        assert not k.failed and not k.fuse_failed and not traced, method
        assert (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12
        if method == "implicit_midpoint":
            assert k.iterations > 0     # the fused (compiled) iterations ran


@pytest.mark.parametrize("method", ["verlet", "implicit_midpoint"])
def test_compiled_mlp_forces_equal_eager(method):
    """A force or velocity that ends in a matrix product (an MLP's gradient): inductor (torch
    2.13, CPU) turned add(x, mm(u, v), alpha=a) into addmm and dropped a, so compiled
    SeparableHNN rollouts drifted away from eager's from the second step (0.4 after two steps;
    implicit midpoint's fixed point did not converge), and so did a loss through compiled steps
    and its gradients; the graphs now compile without inductor's pattern rewrites
    (_compile.PATTERN_MATCHER).  B = 300: blocks (verlet) and fused iterations (implicit
    midpoint); the loops (B = 1): test_energy_defined_systems_and_hnns_run_compiled_loops."""
    assert _compile._inductor_options("cpu", 300).get("pattern_matcher") is False
    assert _compile._inductor_options("cuda", 300).get("pattern_matcher") is False
    torch.manual_seed(0)
    hnn = tgi.nn.SeparableHNN(2, width=16)
    q0, p0 = torch.randn(300, 2), torch.randn(300, 2)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qe, pe = tgi.rollout(hnn, q0, p0, h=0.01, steps=20, save_every=20, method=method)
        qc, pc = tgi.rollout(hnn, q0, p0, h=0.01, steps=20, save_every=20, method=method, compile=True)
    assert (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12
    if method == "verlet":   # with a graph: compiled single steps, as training would run them
        def loss_and_grads(compile):
            hnn.zero_grad()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                q, p = tgi.rollout(hnn, q0[:50], p0[:50], h=0.01, steps=10, compile=compile)
            loss = (q ** 2).mean() + (p ** 2).mean()
            loss.backward()
            return loss.detach(), torch.cat([w.grad.flatten() for w in hnn.parameters()])
        (le, ge), (lc, gc) = loss_and_grads(False), loss_and_grads(True)
        assert abs(float(le - lc)) < 1e-12 and (ge - gc).abs().max() < 1e-12
    assert (qc - qe).abs().max() < 1e-12 and (pc - pe).abs().max() < 1e-12


def test_compiled_implicit_steps_follow_replaced_solve_options():
    """The kernels of an (integrator, system) pair froze the integrator's SolveOptions when first
    built: after ``m.options = m.options.replace(...)`` (the documented way) compiled rollouts
    kept the old tolerance and max_iter (no ConvergenceError where eager raises one)."""
    system = kepler(separable=True, analytic=True)
    q0, p0 = kepler_initial(0.6)
    q0, p0 = q0[None], p0[None]
    m = tgi.METHODS["implicit_midpoint"].with_options()
    kw = dict(h=0.02, steps=20, method=m)
    with torch.no_grad():
        tgi.rollout(system, q0, p0, compile=True, **kw)
        m.options = m.options.replace(tol=1e-3)
        qe, _ = tgi.rollout(system, q0, p0, **kw)
        qc, _ = tgi.rollout(system, q0, p0, compile=True, **kw)
        assert (qc - qe).abs().max() < 1e-12
        m.options = m.options.replace(tol=None, max_iter=2)
        with pytest.raises(tgi.ConvergenceError, match="after 2 iterations"):
            tgi.rollout(system, q0, p0, compile=True, **kw)


def test_a_compiled_lie_rollout_without_a_graph_runs_without_a_failed_block():
    """The fixed-iteration blocks carry flat tensor caches only; a Lie method's warm start
    ((h, (z, previous z…))) made them fail with an internal AttributeError and a warning. Now
    the Lie method runs compiled step by step, no warning, and agrees with eager."""
    from torchgeo_int.manifolds import SO3, FreeRigidBody
    torch.manual_seed(0)
    s = FreeRigidBody(torch.tensor([1.0, 2.0, 3.5], dtype=torch.float64))
    g0 = SO3.random(2, dtype=torch.float64)
    mu0 = torch.randn(2, 3, dtype=torch.float64)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        g, mu = tgi.rollout(s, g0, mu0, h=0.05, steps=256, method="lie_midpoint_cayley", compile=True)
        ge, mue = tgi.rollout(s, g0, mu0, h=0.05, steps=256, method="lie_midpoint_cayley")
    torch.testing.assert_close(g, ge, rtol=0, atol=1e-10)
    torch.testing.assert_close(mu, mue, rtol=0, atol=1e-10)


def test_training_step_compiles_with_autograd_forces():
    """compile=True under grad mode, forces by autograd of a network with parameters that
    require grad (a feature SeparableHNN: Verlet; a non-separable feature HNN: symplectic
    Euler, implicit in one half): the steps compile (no warning, no eager fallback: the force
    is torch.func.grad inside the graph, which the outer autograd differentiates through) and
    the loss and every parameter's gradient equal eager's."""
    torch.manual_seed(0)
    dist = tgi.nn.PairDistances(2, 2)
    q0, p0 = torch.randn(16, 4, dtype=torch.float64), torch.randn(16, 4, dtype=torch.float64)
    cases = [(tgi.nn.SeparableHNN(4, width=8, potential_features=lambda q: dist(q)), "verlet"),  # (no input_vjp)
             (tgi.nn.HNN(4, width=8, features=lambda x: torch.cat([dist(x[..., :4]), x[..., 4:]], -1)),
              "symplectic_euler")]
    for model, method in cases:
        model = model.double()

        def loss_and_grads(compile):
            q, p = tgi.rollout(model, q0, p0, h=0.1, steps=4, method=method, compile=compile)
            loss = q.square().mean() + p.square().mean()
            return (loss.detach(),) + torch.autograd.grad(loss, list(model.parameters()))

        eager = loss_and_grads(False)
        with warnings.catch_warnings():
            # "could not compile …; running it eagerly" fails (dynamo's own warnings do not)
            warnings.filterwarnings("error", "compile=True: could not")
            compiled = loss_and_grads(True)
        assert not _compile._kernels(tgi.METHODS[method], model).failed
        for a, b in zip(eager, compiled):
            assert (a - b).abs().max() <= 1e-12 * (1 + a.abs().max())


def test_autograd_forces_under_saved_tensor_hooks_run_eagerly_and_leave_hooks_usable():
    """Under saved-tensor hooks (grad="checkpoint", save_on_cpu, a user's saved_tensors_hooks)
    torch.func.grad refuses to run, and dynamo failing on it would leave the hooks disabled for
    the whole process: the compiled step says why and runs eagerly (eager's gradients), and
    hooks work afterwards.  Closed-form forces compile under hooks as before."""
    torch.manual_seed(0)
    q0, p0 = torch.randn(8, 2, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
    hooks = lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)  # noqa: E731
    for kw in ({}, {"grad": "checkpoint"}):
        pair = tgi.nn.PairDistances(2, 1)        # (as a lambda, no input_vjp: autograd's forces)
        for features, fails in ((lambda q: pair(q), True), (pair, False), (None, False)):
            model = tgi.nn.SeparableHNN(2, width=8, potential_features=features).double()
            qe, _ = tgi.rollout(model, q0, p0, h=0.1, steps=3, **kw)
            ge = torch.autograd.grad(qe.square().sum(), list(model.parameters()))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with hooks():
                    q, _ = tgi.rollout(model, q0, p0, h=0.1, steps=3, compile=True, **kw)
            said = [w for w in caught if "could not compile" in str(w.message)]
            assert len(said) == fails and all("saved-tensor hooks" in str(w.message) for w in said)
            g = torch.autograd.grad(q.square().sum(), list(model.parameters()))
            assert all((a - b).abs().max() < 1e-12 for a, b in zip(g, ge))
            with hooks():       # not left disabled
                pass


def test_newton_through_a_compiled_field_under_grad_mode_runs_eagerly(monkeypatch):
    """Newton's Jacobian through a compiled vector field (forces by autograd): backward="unroll"
    differentiates it twice, which compiled graphs do not support, so under grad mode the field
    stays autograd's and the step runs eagerly, with eager's loss and gradients; under
    saved-tensor hooks with grad mode off (Newton turns it on for its Jacobian) the hooks stay
    usable; the flag that lets explicit steps trace torch.func.grad is down after every call."""
    from torchgeo_int import systems

    monkeypatch.setattr(_compile, "FIELDS_MIN", 1)     # the compiled field at a small state
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.tensor([1.0, 0.3], dtype=torch.float64))

    class H(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = w

        def forward(self, q, p):
            return (0.5 * (p * p).sum(-1) * (1 + 0.1 * (q * q).sum(-1))
                    + self.w[0] * 0.5 * (q * q).sum(-1) + self.w[1] * (q ** 4).sum(-1))

    q0, p0 = torch.randn(8, 2, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
    for backward in ("unroll", "implicit"):
        system = tgi.Hamiltonian(H())
        method = tgi.METHODS["implicit_midpoint"].with_options(solver="newton", backward=backward)

        def run(compile):
            q, p = tgi.rollout(system, q0, p0, h=0.1, steps=3, method=method, compile=compile)
            loss = q.square().mean() + p.square().mean()
            return (loss.detach(),) + torch.autograd.grad(loss, [w])

        eager = run(False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = run(True)
        assert all((a - b).abs().max() < 1e-12 for a, b in zip(eager, compiled))
        assert not systems.TRACE_FUNC_GRAD
    system = tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1) * (1 + 0.1 * (q * q).sum(-1)) + (q ** 4).sum(-1))
    method = tgi.METHODS["implicit_midpoint"].with_options(solver="newton")
    hooks = lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)  # noqa: E731
    with torch.no_grad():
        qe, _ = tgi.rollout(system, q0, p0, h=0.1, steps=3, method=method)
        with hooks(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q, _ = tgi.rollout(system, q0, p0, h=0.1, steps=3, method=method, compile=True)
    assert (q - qe).abs().max() < 1e-12
    with hooks():        # not left disabled
        pass


def test_another_threads_flag_does_not_reach_newton_through_a_compiled_field(monkeypatch):
    """systems.TRACE_FUNC_GRAD is one flag for the process: while thread A runs a compiled
    explicit step under grad mode (flag up, under _compile._TRACE_LOCK), thread B's Newton
    through a compiled field must not trace with it up (backward="unroll" then failed with
    "does not support double backward").  B waits for the lock: the flag is down when its
    compiled call runs, and its gradient is eager's."""
    import threading

    from torchgeo_int import systems

    monkeypatch.setattr(_compile, "FIELDS_MIN", 1)
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.tensor([1.0, 0.3], dtype=torch.float64))
    H = lambda q, p: (0.5 * (p * p).sum(-1) * (1 + 0.1 * (q * q).sum(-1))  # noqa: E731
                      + w[0] * 0.5 * (q * q).sum(-1) + w[1] * (q ** 4).sum(-1))
    q0, p0 = torch.randn(8, 2, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
    method = tgi.METHODS["implicit_midpoint"].with_options(solver="newton", backward="unroll")

    def newton(compile):
        q, p = tgi.rollout(tgi.Hamiltonian(H), q0, p0, h=0.1, steps=3, method=method, compile=compile)
        return torch.autograd.grad(q.square().mean() + p.square().mean(), [w])[0]

    eager = newton(False)
    seen, b_in, held = [], threading.Event(), threading.Event()
    real = _compile.CompiledStep._guarded

    def spy(self, run, eager, hooked=False):    # the flag as B's compiled call starts
        seen.append(systems.TRACE_FUNC_GRAD)
        b_in.set()
        return real(self, run, eager, hooked)
    monkeypatch.setattr(_compile.CompiledStep, "_guarded", spy)

    def a():                                    # a step of A in progress: lock held, flag up
        with _compile._TRACE_LOCK:
            systems.TRACE_FUNC_GRAD = True
            held.set()
            b_in.wait(1)                        # (B cannot come in while the lock is held)
            systems.TRACE_FUNC_GRAD = False
    got = {}

    def b():
        held.wait(10)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got["g"] = newton(True)
    A, B = threading.Thread(target=a), threading.Thread(target=b)
    A.start(), B.start()
    A.join(60), B.join(60)
    assert seen and not any(seen) and (got["g"] - eager).abs().max() < 1e-12
