"""Implicit steps hand their state to the solver as ``args`` (solvers' note on args): in a
rollout under grad, no autograd call inside a step walks the rollout's history for nothing.

Such a call differentiates w.r.t. fresh leaves (a Newton Jacobian, an adjoint iteration's
vector–Jacobian product) an output whose graph also reaches the initial state: autograd then
visits the whole graph behind it, so step k costs O(k) and the rollout O(steps²) (400 implicit
midpoint steps with Newton: 14.9 s instead of 1.16 s, experiments/solver_history.py).  Counted
here by wrapping ``torch.autograd.grad``; below, the solvers' own ``args`` contract."""
import pytest
import torch

import torchgeo_int as tgi
from torchgeo_int.manifolds import HeavyTop, SphereODEIntegrator
from torchgeo_int.manifolds.integrators import LIE_METHODS
from torchgeo_int.rollout import run_loop
from torchgeo_int.solvers import fixed_point, newton

F64 = torch.float64
STEPS = 10


def _reaches(tensors, leaf):
    """Whether the graph behind any of ``tensors`` reaches the leaf tensor ``leaf``."""
    stack = [t.grad_fn for t in tensors if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen = set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if getattr(fn, "variable", None) is leaf:
            return True
        stack.extend(f for f, _ in fn.next_functions)
    return False


@pytest.fixture
def wasted_walks(monkeypatch):
    """Counts autograd.grad calls whose outputs reach ``leaf`` while none of their inputs do."""
    state = {"leaf": None, "walks": 0, "calls": 0}
    grad = torch.autograd.grad

    def counting(outputs, inputs, *args, **kwargs):
        if state["leaf"] is not None:
            outs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
            ins = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
            state["calls"] += 1
            if (_reaches(outs, state["leaf"])
                    and not any(x is state["leaf"] or _reaches([x], state["leaf"]) for x in ins)):
                state["walks"] += 1
        return grad(outputs, inputs, *args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", counting)
    return state


def warped(x, v):
    return x + v + 0.3 * torch.tanh(x) * v ** 2 + 0.1 * v ** 3


W = torch.tensor([[0.3, 0.1], [-0.2, 0.4]], dtype=F64)


class NonSeparable(tgi.Hamiltonian):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(W.clone())

    def hamiltonian(self, q, p):
        return (0.5 * (p * p).sum(-1) + 0.5 * (q * q).sum(-1)
                + 0.1 * torch.tanh(q @ self.w).sum(-1) * (p * p).sum(-1))


def _ode():
    return tgi.ODESystem(lambda t, x: x @ W - x ** 3)


def _sode():
    return tgi.SecondOrderSystem(lambda t, q, v: -q - 0.1 * torch.tanh(v @ W))


def _lagrangian():
    return tgi.MechanicalLagrangian(lambda q: 0.5 * (q * q).sum(-1) + 0.1 * (q ** 4).sum(-1))


CASES = {
    "implicit_midpoint": (NonSeparable, lambda: "implicit_midpoint"),
    "midpoint_newton": (NonSeparable, lambda: tgi.CotangentLiftIntegrator(tgi.AlphaMap(0.5),
                                                                          solver="newton")),
    "generic_map": (NonSeparable, lambda: tgi.CotangentLiftIntegrator(tgi.RetractionMap(warped, 0.5))),
    "theta": (_ode, lambda: tgi.theta(0.5)),
    "first_order_generic": (_ode, lambda: tgi.FirstOrderIntegrator(tgi.RetractionMap(warped, 0.5))),
    "sode_midpoint": (_sode, lambda: "sode_midpoint"),
    "newmark": (_sode, lambda: "newmark_average_acceleration"),
    "sode_generic_eq10": (_sode, lambda: tgi.integrators.sode.SODEIntegrator(
        tgi.TangentLift(tgi.RetractionMap(warped, 0.5)), equation=10)),
    "variational": (_lagrangian, lambda: "variational_midpoint"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_no_solver_call_walks_the_rollout_history(name, wasted_walks):
    make_system, make_method = CASES[name]
    system, method = make_system(), make_method()
    g = torch.Generator().manual_seed(0)
    q0 = (0.5 * torch.randn(3, 2, dtype=F64, generator=g)).requires_grad_()
    p0 = None if getattr(system, "first_order", False) else 0.3 * torch.randn(3, 2, dtype=F64, generator=g)
    wasted_walks["leaf"] = q0
    out = tgi.rollout(system, q0, p0, h=0.05, steps=STEPS, method=method)
    q = out[0] if isinstance(out, tuple) else out
    q[-1].pow(2).sum().backward()
    assert wasted_walks["calls"] > STEPS          # the solvers did call autograd
    assert wasted_walks["walks"] == 0, wasted_walks
    assert q0.grad is not None and torch.isfinite(q0.grad).all()


@pytest.mark.parametrize("method", ["lie_midpoint_cayley", "lie_midpoint_exp"])
def test_lie_group_solves_do_not_walk_the_history(method, wasted_walks):
    system = HeavyTop(torch.tensor([1.0, 1.3, 0.6], dtype=F64), mass=1.0, gravity=2.0,
                      com=(0.1, -0.2, 0.5))
    g0 = system.group.random(2, generator=torch.Generator().manual_seed(1)).to(F64)
    mu0 = torch.tensor([[0.4, -1.1, 0.7], [0.3, 0.2, -0.5]], dtype=F64, requires_grad=True)
    wasted_walks["leaf"] = mu0
    _, mus = run_loop(LIE_METHODS[method].step, g0, mu0, system=system, h=0.05, steps=STEPS,
                      t0=0.0, save_every=1, check_every=64)
    mus[-1].pow(2).sum().backward()
    assert wasted_walks["walks"] == 0, wasted_walks
    assert torch.isfinite(mu0.grad).all()


def test_sphere_solves_do_not_walk_the_history(wasted_walks):
    omega = torch.tensor([0.3, -0.5, 0.8], dtype=F64)
    system = tgi.ODESystem(lambda t, x: torch.linalg.cross(omega.expand_as(x), x, dim=-1) + 0.1 * x ** 2)
    x0 = torch.nn.functional.normalize(torch.randn(4, 3, dtype=F64,
                                                   generator=torch.Generator().manual_seed(2)), dim=-1)
    x0.requires_grad_()
    wasted_walks["leaf"] = x0
    xs = tgi.rollout(system, x0, None, h=0.05, steps=STEPS, method=SphereODEIntegrator())
    xs = xs[0] if isinstance(xs, tuple) else xs
    xs[-1].sum().backward()
    assert wasted_walks["walks"] == 0, wasted_walks
    assert torch.isfinite(x0.grad).all()


# ---------------------------------------------------------------- args: the state fn is built from

def _tanh_data(batch, n):
    g = torch.Generator().manual_seed(3)
    W = torch.randn(n, n, generator=g, dtype=F64)
    W = (0.5 * W / torch.linalg.matrix_norm(W, 2)).requires_grad_()
    return W, torch.randn(batch, n, generator=g, dtype=F64).requires_grad_()


def _history(depth, x):
    """x behind ``depth`` ops: the kind of history a rollout's state carries."""
    for _ in range(depth):
        x = x * 1.0 + 0.0
    return x


@pytest.mark.parametrize("solver", ["fixed_point", "newton"])
@pytest.mark.parametrize("backward", ["implicit", "unroll"])
def test_args_equal_a_closure_and_only_the_graph_application_sees_their_history(solver, backward):
    """fn(z, *args) gives the closure's values and gradients; with backward='implicit' only the
    one application that carries gradients gets args with their history (the iterations, the
    Jacobians and the adjoint get them detached), so no solver call walks a rollout's graph."""
    W, x = _tanh_data(7, 5)
    seen = []

    def fn(z, xa):
        seen.append(_reaches([xa], x))
        return torch.tanh(z @ W.T + xa)

    def solve(f, args=()):
        z0 = torch.zeros(*x.shape, dtype=F64)
        if solver == "newton":
            return newton(lambda z, *a: z - f(z, *a), z0, args=args, backward=backward)
        return fixed_point(f, z0, args=args, backward=backward)

    xh = _history(5, x)
    z = solve(fn, (xh,))
    gW, gx = torch.autograd.grad((z * z).sum(), (W, x), retain_graph=True)  # xh is reused
    z_ref = solve(lambda z: torch.tanh(z @ W.T + xh))
    rW, rx = torch.autograd.grad((z_ref * z_ref).sum(), (W, x))
    assert torch.equal(z, z_ref)
    torch.testing.assert_close(gW, rW, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(gx, rx, rtol=1e-12, atol=1e-14)
    if backward == "implicit":
        assert sum(seen) == 1 and len(seen) > 3, seen
    else:
        assert all(seen), seen


def test_args_gradcheck_and_non_tensors():
    W, x = _tanh_data(3, 2)
    c = torch.randn(3, 2, dtype=F64, generator=torch.Generator().manual_seed(5)).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x: fixed_point(lambda z, x, k: torch.tanh(k * z @ W.T + x),
                              torch.zeros(3, 2, dtype=F64), args=(x, 1.0)), (x,))
    assert torch.autograd.gradcheck(
        lambda c: newton(lambda z, c: z ** 3 + z - c, torch.zeros(3, 2, dtype=F64), args=(c,)), (c,))
    with pytest.raises(TypeError, match="args must be a tuple"):
        fixed_point(lambda z, a: z * a, torch.zeros(3, 2, dtype=F64), args=[0.5])
