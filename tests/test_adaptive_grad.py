"""Variable steps through ``rollout(..., step_control=...)`` (the one implementation of
adaptive_rollout), its output contract and refusals, and the gradient modes with variable steps:
backprop against finite differences, checkpoint and reversible against backprop."""
import math

import pytest
import torch
from torch import nn

import torchgeo_int as tgi

from problems import kepler, kepler_initial  # tests/problems.py


def batch(*es):
    qs, ps = zip(*[kepler_initial(e) for e in es])
    return torch.stack(qs), torch.stack(ps)


def kepler_k(k):
    """H = |p|²/2 − k/|q| (closed-form gradients), k a tensor (captured, or a module parameter)."""
    return tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: -k / q.norm(dim=-1),
                                    kinetic_grad=lambda p: p,
                                    potential_grad=lambda q: k * q / q.norm(dim=-1, keepdim=True) ** 3)


def kepler_module():
    """The same H with k an nn.Parameter of the system module (what the lean modes differentiate)."""
    holder = nn.Module()
    holder.k = nn.Parameter(torch.tensor(1.1))
    H = kepler_k(holder.k)
    H.holder = holder               # registers k among H.parameters()
    return H, holder.k


# -- rollout(step_control=...) ----------------------------------------------------------------------
@pytest.mark.parametrize("method", ["verlet", "yoshida4"])
def test_rollout_step_control_is_adaptive_rollout_bit_for_bit(method):
    H = kepler(analytic=True)
    q0, p0 = batch(0.5, 0.9)
    ctl = tgi.power_law_control(1.5)
    with torch.no_grad():
        a = tgi.adaptive_rollout(H, q0, p0, eps=0.05, steps=120, method=method, control=ctl,
                                 save_every=7)
        b = tgi.rollout(H, q0, p0, h=0.05, steps=120, method=method, step_control=ctl, save_every=7)
    for x in ("q", "p", "t", "rho"):
        assert torch.equal(getattr(a, x), getattr(b, x)), x
    assert b.steps == 120
    # until= (with steps=None) and a plain callable σ pass through as well
    sigma = lambda q: q.norm(dim=-1) ** 1.5   # noqa: E731
    with torch.no_grad():
        a = tgi.adaptive_rollout(H, q0, p0, eps=0.05, until=3.0, method=method, control=sigma)
        b = tgi.rollout(H, q0, p0, h=0.05, steps=None, until=3.0, method=method, step_control=sigma)
    assert torch.equal(a.q, b.q) and torch.equal(a.t, b.t)
    assert (b.t[-1] >= 3.0).all()


def test_rollout_step_control_output_contract():
    H = kepler(analytic=True)
    q0, p0 = batch(0.3, 0.9)
    with torch.no_grad():
        fixed = tgi.rollout(H, q0, p0, h=0.05, steps=50, save_every=8)
        tr = tgi.rollout(H, q0, p0, h=0.05, steps=50, save_every=8, step_control=tgi.power_law_control())
    q, p = tr                                             # unpacks like a fixed-step rollout
    assert q.shape == fixed[0].shape == (8, 2, 2) and p.shape == fixed[1].shape
    assert tr.t.shape == (8, 2) and tr.rho.shape == (8, 2)
    assert not torch.allclose(tr.t[-1, 0], tr.t[-1, 1])  # each sample in its own time
    with pytest.raises(ValueError, match="save_every=1"):
        tr.at(torch.tensor([0.1]))                        # thinned nodes: no dense output
    with torch.no_grad():
        tr = tgi.rollout(H, q0, p0, h=0.05, steps=50, step_control=tgi.power_law_control())
        qc, pc = tr.at(torch.tensor([0.0, 0.1, 0.3]))     # common times: dense output
    assert qc.shape == (3, 2, 2)
    assert torch.allclose(qc[0], q0, atol=1e-14)


def test_rollout_step_control_refusals():
    H = kepler(analytic=True)
    q0, p0 = kepler_initial(0.9)
    ctl = tgi.power_law_control()
    with pytest.raises(ValueError, match="not symmetric"):
        tgi.rollout(H, q0, p0, h=0.05, steps=5, method="symplectic_euler", step_control=ctl)
    with pytest.raises(ValueError, match="compile=True"):
        tgi.rollout(H, q0, p0, h=0.05, steps=5, step_control=ctl, compile=True)
    with pytest.raises(ValueError, match="first-order"):
        tgi.rollout(tgi.ODESystem(lambda t, x: -x), q0, h=0.05, steps=5, method="euler",
                    step_control=ctl)
    with pytest.raises(ValueError, match="fictive step"):
        tgi.rollout(H, q0, p0, h=0.0, steps=5, step_control=ctl)
    with pytest.raises(ValueError, match="unknown option"):
        tgi.rollout(H, q0, p0, h=0.05, steps=5, step_control=ctl, segment=3)   # backprop takes none
    with pytest.raises(ValueError, match="exactly one"):
        tgi.rollout(H, q0, p0, h=0.05, steps=5, until=1.0, step_control=ctl)
    with pytest.raises(ValueError, match="need step_control"):
        tgi.rollout(H, q0, p0, h=0.05, steps=5, until=1.0)
    with pytest.raises(ValueError, match="grad must be one of"):
        tgi.rollout(H, q0, p0, h=0.05, steps=5, step_control=ctl, grad="adjoint")


# -- gradients -------------------------------------------------------------------------------------
def test_variable_steps_backprop_gradcheck_initial_state_and_parameter():
    q0, p0 = kepler_initial(0.6)
    ctl = tgi.power_law_control(1.5)

    def f(q, p, k):
        tr = tgi.rollout(kepler_k(k), q, p, h=0.1, steps=12, step_control=ctl)
        return tr.q[-1], tr.p[6], tr.t[-1]             # the times depend on the state too
    inputs = (q0.clone().requires_grad_(), p0.clone().requires_grad_(),
              torch.tensor(1.1, requires_grad=True))
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6)


def _grads(mode, *, method="verlet", steps=40, **options):
    H, k = kepler_module()
    q0, p0 = batch(0.5, 0.8)
    q, p = q0.clone().requires_grad_(), p0.clone().requires_grad_()
    tr = tgi.rollout(H, q, p, h=0.1, steps=steps, method=method, grad=mode,
                     step_control=tgi.power_law_control(1.5), save_every=3, **options)
    loss = (tr.q[-1] ** 2).sum() + tr.t[-1].sum() + (tr.p[5] * tr.q[2]).sum() + tr.rho[4].sum()
    return tr, torch.autograd.grad(loss, (q, p, k))


@pytest.mark.parametrize("mode, options, rtol", [("checkpoint", {}, 1e-10),
                                                 ("checkpoint", dict(segment=4), 1e-10),
                                                 ("reversible", {}, 1e-9)])
def test_lean_gradient_modes_equal_backprop_with_variable_steps(mode, options, rtol):
    ref_tr, ref = _grads("backprop")
    tr, got = _grads(mode, **options)
    assert torch.allclose(tr.q, ref_tr.q, rtol=0, atol=1e-12)     # the same trajectory
    assert torch.allclose(tr.t, ref_tr.t, rtol=0, atol=1e-12)
    for g, r in zip(got, ref):
        assert torch.allclose(g, r, rtol=rtol, atol=rtol * r.abs().max()), (g, r)
    assert ref[2].abs() > 0                                       # the parameter's gradient is there


@pytest.mark.parametrize("mode", ["checkpoint", "reversible"])
def test_lean_gradient_modes_with_until_replay_the_forward_steps(mode):
    ref_tr, ref = _grads("backprop", steps=None, until=4.0, check_every=8)
    tr, got = _grads(mode, steps=None, until=4.0, check_every=8, **({"segment": 5} if mode == "checkpoint" else {}))
    assert tr.steps == ref_tr.steps and tr.steps % 8 == 0
    for g, r in zip(got, ref):
        assert torch.allclose(g, r, rtol=1e-9, atol=1e-9 * r.abs().max())


def test_reversible_gradient_with_implicit_midpoint_on_a_non_separable_hamiltonian():
    H = tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1) * (1 + 0.1 * (q * q).sum(-1))
                        - 1.0 / q.norm(dim=-1))
    q0, p0 = batch(0.6)
    ctl = tgi.StepControl(lambda q, p: (q * q).sum(-1) ** 0.75 / (1 + 0.01 * (p * p).sum(-1)))

    def grads(mode):
        p = p0.clone().requires_grad_()
        tr = tgi.rollout(H, q0, p, h=0.05, steps=15, method="implicit_midpoint", step_control=ctl,
                         grad=mode)
        return torch.autograd.grad(tr.q[-1].sum() + tr.t[-1].sum(), p)[0]
    ref = grads("backprop")
    # backprop itself against central differences (an implicit step's adjoint solve runs in the
    # backward pass: it must see its own step's factor s, not the last step's)
    with torch.no_grad():
        fd = []
        for i in range(2):
            d = torch.zeros_like(p0)
            d[0, i] = 1e-6
            f = [tgi.rollout(H, q0, p0 + sgn * d, h=0.05, steps=15, method="implicit_midpoint",
                             step_control=ctl) for sgn in (1, -1)]
            fd.append(((f[0].q[-1].sum() + f[0].t[-1].sum()) - (f[1].q[-1].sum() + f[1].t[-1].sum())) / 2e-6)
    assert torch.allclose(ref[0], torch.stack(fd), rtol=1e-6, atol=0)
    assert torch.allclose(grads("checkpoint"), ref, rtol=1e-8, atol=0)
    assert torch.allclose(grads("reversible"), ref, rtol=1e-7, atol=0)


def test_lean_modes_refuse_an_untracked_tensor_and_take_params():
    q0, p0 = kepler_initial(0.6)
    k = torch.tensor(1.1, requires_grad=True)   # captured by a closure, not a module parameter
    H = kepler_k(k)
    ctl = tgi.power_law_control()
    for mode in ("checkpoint", "reversible"):
        with pytest.raises(ValueError, match="params"):
            tgi.rollout(H, q0, p0, h=0.1, steps=5, step_control=ctl, grad=mode)
    tr = tgi.rollout(H, q0, p0, h=0.1, steps=5, step_control=ctl, grad="reversible", params=[k])
    (gk,) = torch.autograd.grad(tr.q[-1].sum(), k)
    ref = tgi.rollout(H, q0, p0, h=0.1, steps=5, step_control=ctl)
    (gb,) = torch.autograd.grad(ref.q[-1].sum(), k)
    assert torch.allclose(gk, gb, rtol=1e-10)


def test_variable_steps_gradcheck_lean_modes():
    q0, p0 = kepler_initial(0.7)
    for mode, options in (("checkpoint", dict(segment=3)), ("reversible", {})):
        def f(q, p):
            tr = tgi.rollout(kepler_k(torch.tensor(1.0)), q, p, h=0.1, steps=8, grad=mode,
                             step_control=tgi.power_law_control(), **options)
            return tr.q[-1], tr.t[-1]
        assert torch.autograd.gradcheck(f, (q0.clone().requires_grad_(), p0.clone().requires_grad_()),
                                        eps=1e-6, atol=1e-6), mode
    assert math.isfinite(float(q0.sum()))


def test_lean_modes_differentiate_a_learnable_control():
    class Sigma(nn.Module):                # σ(q, p) = |q|^α with α learnable
        def __init__(self):
            super().__init__()
            self.alpha = nn.Parameter(torch.tensor(1.4))

        def forward(self, q, p):
            return (q * q).sum(-1) ** (0.5 * self.alpha)

    H = kepler(analytic=True)
    q0, p0 = batch(0.7)
    sigma = Sigma()
    ctl = tgi.StepControl(sigma)

    def grad(mode):
        tr = tgi.rollout(H, q0, p0, h=0.1, steps=25, step_control=ctl, grad=mode)
        return torch.autograd.grad(tr.t[-1].sum() + tr.q[-1].sum(), sigma.alpha)[0]
    ref = grad("backprop")
    assert ref.abs() > 0
    assert torch.allclose(grad("checkpoint"), ref, rtol=1e-10)
    assert torch.allclose(grad("reversible"), ref, rtol=1e-9)


@pytest.mark.parametrize("grad", ["checkpoint", "reversible"])
def test_adaptive_lean_modes_refuse_grad_of_grad(grad):
    """Their backward runs without a graph: a second derivative would be zero, silently."""
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: -1 / q.norm(dim=-1))
    q0 = torch.tensor([[0.4, 0.0]], dtype=torch.float64, requires_grad=True)
    p0 = torch.tensor([[0.0, 2.0]], dtype=torch.float64)
    tr = tgi.rollout(H, q0, p0, h=0.05, steps=10, method="verlet",
                     step_control=tgi.power_law_control(1.5), grad=grad)
    q, _ = tr
    with pytest.raises(RuntimeError, match="first-order gradients only"):
        torch.autograd.grad((q[-1] ** 2).sum(), q0, create_graph=True)


def test_a_control_of_q_and_p_is_differentiated_partially_in_every_grad_mode():
    """σ(q, p) after an explicit step: ∇ log σ is the partial derivative at the step's output,
    whose p was computed from its q. Differentiating with respect to q itself added the path
    through p, so the trajectory moved with grad mode (1.6e-3) and the three modes gave three
    gradients, all off the finite differences (0.418 / 0.421 / 0.437 against 0.440)."""
    H = kepler(analytic=True)
    q0, p0 = batch(0.6)
    sigma = lambda q, p: q.norm(dim=-1) ** 1.4 / (1 + 0.01 * (p * p).sum(-1))   # noqa: E731

    def loss(q, grad="backprop"):
        tr = tgi.adaptive_rollout(H, q, p0, eps=0.04, steps=100, control=sigma, grad=grad)
        return (tr.q[-1] ** 2).sum() + tr.t[-1].sum(), tr

    with torch.no_grad():
        _, plain = loss(q0)
    _, graphed = loss(q0.clone().requires_grad_())
    assert torch.equal(plain.q, graphed.q.detach()) and torch.equal(plain.t, graphed.t.detach())
    d = 1e-6
    fd = torch.stack([(loss(q0 + d * e)[0] - loss(q0 - d * e)[0]) / (2 * d) for e in torch.eye(2)])
    for grad in ("backprop", "checkpoint", "reversible"):
        q = q0.clone().requires_grad_()
        g, = torch.autograd.grad(loss(q, grad)[0], q)
        assert torch.allclose(g[0], fd, rtol=1e-6, atol=1e-6), grad


def test_a_start_time_that_requires_grad_is_a_state_in_the_lean_modes():
    """t0 requiring grad, time-dependent H: checkpoint and reversible refused it as a tensor
    the step depends on ("pass them as params=[...]"); they now agree with backprop, which
    agrees with finite differences."""
    q0, p0 = batch(0.6, 0.8)
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1),
                                 lambda q, t: -(1 + 0.2 * torch.sin(t)) / q.norm(dim=-1))

    def loss(t0, grad="backprop"):
        tr = tgi.rollout(H, q0, p0, h=0.05, steps=80, t0=t0, grad=grad,
                         step_control=tgi.power_law_control(1.5))
        return (tr.q[-1] ** 2).sum()

    t0 = torch.tensor([0.3, -0.2], dtype=torch.float64)
    d = 1e-6
    fd = torch.stack([(loss(t0 + d * e) - loss(t0 - d * e)) / (2 * d) for e in torch.eye(2, dtype=t0.dtype)])
    for grad in ("backprop", "checkpoint", "reversible"):
        t = t0.clone().requires_grad_()
        g, = torch.autograd.grad(loss(t, grad), t)
        assert torch.allclose(g, fd, rtol=1e-6, atol=1e-7), grad
