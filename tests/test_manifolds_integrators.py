"""Lie-group integrators on T*SO(3) and T*(SO(3) × R³): equivalence with the seed paper's
eq. (20) in a chart, symplecticity, reversibility, adjoints, gradients, errors.  Orders and
conservation laws are in test_manifolds_conservation.py; the 10⁵-step run in
test_manifolds_longtime.py."""
import numpy as np
import pytest
import torch
from scipy.integrate import solve_ivp

import torchgeo_int as tgi
from torchgeo_int.manifolds import so3
from torchgeo_int.manifolds.integrators import LIE_METHODS, LieGroupIntegrator, lie_method
from torchgeo_int.manifolds.systems import (FreeRigidBody, HeavyTop, LieHamiltonian, RigidBody,
                                            SO3HNN, SpringTop)
from torchgeo_int.rollout import run_loop

INERTIA = (1.0, 2.0, 3.5)


def free_body():
    return FreeRigidBody(torch.tensor(INERTIA))


def heavy_top():
    return HeavyTop(torch.tensor([1.0, 1.3, 0.6]), mass=1.0, gravity=2.0, com=(0.1, -0.2, 0.5))


def spring_top():
    return SpringTop(torch.tensor([0.8, 1.1, 0.5]), mass=1.5, gravity=1.0, stiffness=6.0,
                     attach=(0.1, 0.0, 0.4))


def hnn():
    torch.manual_seed(3)
    return SO3HNN(hidden=8, kinetic_prior=1.0)


def initial(system, n=1):
    gen = torch.Generator().manual_seed(11)
    g = system.group.random(n, generator=gen)
    mu = torch.tensor([[0.4, -1.1, 0.7, 0.3, -0.2, 0.5]])[:, :system.group.dim].expand(n, -1)
    return g, mu + 0.2 * torch.randn(n, system.group.dim, generator=gen)


def rollout(system, method, g0, mu0, h, steps, save_every=1):
    return run_loop(method.step, g0, mu0, system=system, h=h, steps=steps, t0=0.0,
                    save_every=save_every, check_every=64)


def reference(system, g0, mu0, T):
    """DOP853 (rtol = atol = 1e-13) on the embedded equations Ṙ = R ξ̂, ẋ = v, μ̇ = ad*_ξ μ − f."""
    shape = g0.shape

    def f(t, y):
        g = torch.tensor(y[:g0.numel()]).reshape(shape)
        mu = torch.tensor(y[g0.numel():]).reshape(mu0.shape)
        with torch.no_grad():
            xi, mud = system.vector_field(g, mu)
        if shape[-1] == 3:
            gd = g @ so3.hat(xi)
        else:
            gd = torch.cat([g[..., :3] @ so3.hat(xi[..., :3]), xi[..., 3:].unsqueeze(-1)], -1)
        return np.concatenate([gd.reshape(-1).numpy(), mud.reshape(-1).numpy()])

    sol = solve_ivp(f, (0.0, T), np.concatenate([g0.reshape(-1).numpy(), mu0.reshape(-1).numpy()]),
                    method="DOP853", rtol=1e-13, atol=1e-13)
    y = torch.tensor(sol.y[:, -1])
    return y[:g0.numel()].reshape(shape), y[g0.numel():].reshape(mu0.shape)


# -- the derivation: equal to eq. (20) of the seed paper in a chart ------------------------------------
GREF_VEC = (0.3, -0.5, 0.2)
CHARTS = {"cayley": (so3.cay, so3.cay_inv, so3.dcay_right),
          "exp": (so3.exp, so3.log, so3.dexp_right)}


def chart(tau):
    """Canonical coordinates of T*SO(3) near GREF: g = GREF τ(θ), p = (dτᴸ_θ)ᵀ μ; and the chart
    form of the retraction g ↦ g τ(ξ), ξ = dτᴸ_θ v (a RetractionMap on R³)."""
    f, finv, dR = CHARTS[tau]
    GREF = so3.exp(torch.tensor(GREF_VEC))

    def from_chart(th, p):
        return GREF @ f(th), torch.linalg.solve(dR(-th).mT, p.unsqueeze(-1)).squeeze(-1)

    def to_chart(g, mu):
        th = finv(GREF.mT @ g)
        return th, (dR(-th).mT @ mu.unsqueeze(-1)).squeeze(-1)

    def retraction(th, v):
        return finv(f(th) @ f((dR(-th) @ v.unsqueeze(-1)).squeeze(-1)))

    return from_chart, to_chart, retraction


@pytest.mark.parametrize("make", [heavy_top, hnn], ids=["heavy_top", "hnn"])
@pytest.mark.parametrize("tau", ["cayley", "exp"])
@pytest.mark.parametrize("alpha", [0.5, 0.0, 0.3])
def test_equals_seed_cotangent_lift_integrator_in_a_chart(make, tau, alpha):
    """The left-trivialised step equals tgi.CotangentLiftIntegrator(RetractionMap(R, α)) — the
    seed paper's eq. (20), built by the generic code from the chart form of the same map — on
    the chart Hamiltonian H(g(θ), μ(θ, p)).  This checks the derivation of the Lie-group
    equations (both the rigid-body and the general autograd path)."""
    system = make()
    from_chart, to_chart, retraction = chart(tau)
    Hc = tgi.Hamiltonian(lambda th, p: system.energy(*from_chart(th, p)))
    generic = tgi.CotangentLiftIntegrator(tgi.RetractionMap(retraction, alpha), solver="newton",
                                          tol=1e-14)
    th0, p0 = torch.tensor([[0.05, 0.1, -0.07]]), torch.tensor([[0.4, -1.1, 0.7]])
    with torch.no_grad():
        th1, p1 = generic(Hc, th0, p0, 0.0, 0.1)
        g1, mu1 = LieGroupIntegrator(tau, alpha, tol=1e-15)(system, *from_chart(th0, p0), 0.0, 0.1)
    g1c, mu1c = from_chart(th1, p1)
    assert (g1 - g1c).abs().max() < 1e-13 and (mu1 - mu1c).abs().max() < 1e-13


def test_free_body_paths_agree():
    """Closed-form Cayley path, general rigid-body path and autograd path give one step."""
    I = torch.tensor(INERTIA)
    g0, mu0 = initial(free_body(), 3)
    closed = free_body()
    rigid = RigidBody(I, lambda g: 0.0 * g[..., 0, 0])
    generic = LieHamiltonian(lambda g, mu: 0.5 * (mu * mu / I).sum(-1))
    m = LieGroupIntegrator("cayley", 0.5, tol=1e-15)
    with torch.no_grad():
        outs = [m(s, g0, mu0, 0.0, 0.2) for s in (closed, rigid, generic)]
    for g, mu in outs[1:]:
        assert (g - outs[0][0]).abs().max() < 1e-14 and (mu - outs[0][1]).abs().max() < 1e-14


def test_newton_equals_fixed_point():
    for system in (heavy_top(), hnn()):
        g0, mu0 = initial(system, 2)
        with torch.no_grad():
            a = LieGroupIntegrator("exp", 0.5, tol=1e-15)(system, g0, mu0, 0.0, 0.2)
            b = LieGroupIntegrator("exp", 0.5, solver="newton", tol=1e-15)(system, g0, mu0, 0.0, 0.2)
        assert all((x - y).abs().max() < 1e-13 for x, y in zip(a, b))


def test_method_table():
    for tau in ("cayley", "exp"):
        assert LIE_METHODS[f"lie_midpoint_{tau}"].order == 2
        assert LIE_METHODS[f"lie_euler_{tau}"].order == 1
        for table in tgi.TABLES.values():
            m = LIE_METHODS[f"lie_{table.name}_{tau}"]
            assert m.order == table.order and m.symmetric and m.symplectic
        assert not LIE_METHODS[f"lie_euler_{tau}"].symmetric
        assert LIE_METHODS[f"lie_euler_{tau}"].adjoint().same_as(LIE_METHODS[f"lie_euler_adjoint_{tau}"])


# -- symplecticity, reversibility, adjoints ---------------------------------------------------------------
def chart_step(system, method, h, tau="cayley"):
    from_chart, to_chart, _ = chart(tau)

    def step(z):
        g1, mu1 = method(system, *from_chart(z[:3], z[3:]), 0.0, h)
        return torch.cat(to_chart(g1, mu1))

    return step


@pytest.mark.parametrize("make", [heavy_top, hnn], ids=["heavy_top", "hnn"])
@pytest.mark.parametrize("name", ["lie_midpoint_cayley", "lie_euler_exp", "lie_yoshida4_cayley"])
def test_symplectic_in_a_chart(make, name):
    """Jᵀ Ω J = Ω for the one-step map in canonical chart coordinates (θ, p), J by autograd
    through the implicit solves (IFT backward)."""
    system = make()
    z = torch.tensor([0.05, 0.1, -0.07, 0.4, -1.1, 0.7])
    J = torch.autograd.functional.jacobian(chart_step(system, LIE_METHODS[name], 0.15), z)
    I, Z = torch.eye(3), torch.zeros(3, 3)
    Om = torch.cat([torch.cat([Z, I], 1), torch.cat([-I, Z], 1)])
    assert (J - torch.eye(6)).abs().max() > 1e-2     # a real step, not the identity
    assert (J.T @ Om @ J - Om).abs().max() < 1e-11


def test_naive_lie_update_is_not_symplectic():
    """Control for the test above: weighting μ̄ as the plain average (μ_k + μ_{k+1})/2 instead
    of the dτ-weighted one (a natural mistake) breaks Jᵀ Ω J = Ω."""
    system = heavy_top()

    class Naive(LieGroupIntegrator):
        def step(self, system, g, mu, t, h, cache=None):
            def F(mb):
                V = h * system.velocity(mb)
                f = -system.torque(g @ so3.cay(0.5 * V))
                mu1 = so3.rotate_cay(-0.5 * V, so3.rotate_cay(-0.5 * V, mu) - h * f)
                return 0.5 * (mu + mu1)
            mb = tgi.fixed_point(F, mu)
            V = h * system.velocity(mb)
            f = -system.torque(g @ so3.cay(0.5 * V))
            mu1 = so3.rotate_cay(-0.5 * V, so3.rotate_cay(-0.5 * V, mu) - h * f)
            return g @ so3.cay(0.5 * V) @ so3.cay(0.5 * V), mu1, None

    z = torch.tensor([0.05, 0.1, -0.07, 0.4, -1.1, 0.7])
    J = torch.autograd.functional.jacobian(chart_step(system, Naive(), 0.15), z)
    I, Z = torch.eye(3), torch.zeros(3, 3)
    Om = torch.cat([torch.cat([Z, I], 1), torch.cat([-I, Z], 1)])
    assert (J.T @ Om @ J - Om).abs().max() > 1e-4


@pytest.mark.parametrize("name", ["lie_midpoint_cayley", "lie_midpoint_exp", "lie_yoshida4_cayley"])
def test_symmetric_methods_are_reversible(name):
    system, m = heavy_top(), LIE_METHODS[name]
    g0, mu0 = initial(system, 3)
    with torch.no_grad():
        g1, mu1 = m(system, g0, mu0, 0.0, 0.2)
        gb, mb = m(system, g1, mu1, 0.2, -0.2)
    assert (gb - g0).abs().max() < 1e-13 and (mb - mu0).abs().max() < 1e-13


@pytest.mark.parametrize("tau", ["cayley", "exp"])
def test_adjoint_is_inverse_of_reversed_step(tau):
    """Φ*_h = Φ_{−h}⁻¹: the α = 1 step of size h undoes the α = 0 step of size −h."""
    system = spring_top()
    g0, mu0 = initial(system, 2)
    m = LieGroupIntegrator(tau, 0.0, tol=1e-15)
    with torch.no_grad():
        g1, mu1 = m(system, g0, mu0, 0.0, -0.2)
        gb, mb = m.adjoint()(system, g1, mu1, -0.2, 0.2)
    assert (gb - g0).abs().max() < 1e-13 and (mb - mu0).abs().max() < 1e-13


# -- gradients ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["lie_midpoint_cayley", "lie_euler_exp"])
def test_gradcheck_through_a_lie_rollout(name):
    """Exact gradients through three implicit steps (implicit-function-theorem backward) w.r.t.
    the initial state (g entries perturbed off the group: the maps are defined on matrices) and
    the inertia."""
    g0, mu0 = initial(heavy_top())
    method = LIE_METHODS[name]

    def f(g, mu, inertia):
        system = HeavyTop(inertia, mass=1.0, gravity=2.0, com=(0.1, -0.2, 0.5))
        g1, m1 = rollout(system, method, g, mu, 0.1, 3)
        return g1[-1], m1[-1]

    inputs = (g0.clone().requires_grad_(), mu0.clone().requires_grad_(),
              torch.tensor([1.0, 1.3, 0.6], requires_grad=True))
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6)


def test_gradcheck_free_body_closed_form():
    g0, mu0 = initial(free_body())

    def f(mu, inertia):
        g1, m1 = rollout(FreeRigidBody(inertia), LIE_METHODS["lie_midpoint_cayley"], g0, mu, 0.2, 3)
        return g1[-1], m1[-1]

    assert torch.autograd.gradcheck(f, (mu0.clone().requires_grad_(),
                                        torch.tensor(INERTIA, requires_grad=True)), eps=1e-6, atol=1e-6)


def test_hnn_parameter_gradient_matches_finite_difference():
    system = hnn()
    g0, mu0 = initial(system, 2)
    target = torch.randn(2, 3)

    def loss():
        g, mu = rollout(system, LIE_METHODS["lie_midpoint_exp"], g0, mu0, 0.1, 3)
        return ((mu[-1] - target) ** 2).sum() + (g[-1, :, 0] ** 2).sum()

    w = system.net[0].weight
    (grad,) = torch.autograd.grad(loss(), [w])
    eps, idx = 1e-6, (3, 5)
    with torch.no_grad():
        w[idx] += eps
        up = loss()
        w[idx] -= 2 * eps
        down = loss()
        w[idx] += eps
    assert abs(float(grad[idx]) - float((up - down) / (2 * eps))) < 1e-6
    assert grad.abs().max() > 0


def test_hnn_fits_rigid_body_data():
    """A learned H on T*SO(3) trained through Lie-group rollouts: the one-step loss drops."""
    truth = free_body()
    g0, mu0 = initial(truth, 16)
    with torch.no_grad():
        g1, mu1 = LIE_METHODS["lie_midpoint_cayley"](truth, g0, mu0, 0.0, 0.1)
    torch.manual_seed(0)
    model = SO3HNN(hidden=16, kinetic_prior=0.5)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    method = LieGroupIntegrator("cayley", 0.5)
    losses = []
    for _ in range(25):
        g, mu = method(model, g0, mu0, 0.0, 0.1)
        loss = ((mu - mu1) ** 2).mean() + ((g - g1) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.3 * losses[0], losses


# -- errors -----------------------------------------------------------------------------------------------------
def test_bad_input():
    m = LieGroupIntegrator()
    g0, mu0 = initial(free_body())
    with pytest.raises(TypeError, match="LieGroupSystem"):
        m.step(tgi.Hamiltonian(lambda q, p: (p * p).sum(-1)), g0, mu0, 0.0, 0.1)
    with pytest.raises(ValueError, match="tau"):
        LieGroupIntegrator("quaternion")
    with pytest.raises(ValueError, match="solver"):
        LieGroupIntegrator(solver="anderson")
    with pytest.raises(ValueError, match="alpha"):
        LieGroupIntegrator(alpha=-0.1)
    with pytest.raises(ValueError, match="unknown Lie-group method"):
        lie_method("rk4")
    with pytest.raises(ValueError, match=r"\(\.\.\., 3, 3\)"):
        m.check_state(free_body(), torch.eye(4), mu0)
    with pytest.raises(ValueError, match="batch shape"):
        m.check_state(free_body(), g0, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="NaN"):
        m.check_state(free_body(), g0, torch.full((1, 3), float("inf")))
    with pytest.raises(ValueError, match="positive definite"):
        FreeRigidBody(torch.tensor([1.0, -1.0, 2.0]))
    with pytest.raises(ValueError, match="inertia"):
        FreeRigidBody(torch.ones(4))
    with pytest.raises(tgi.ConvergenceError, match="step 0"):
        with torch.no_grad():
            rollout(heavy_top(), LieGroupIntegrator("cayley", 0.5, max_iter=6), g0, 30 * mu0, 2.0, 2)


def test_checkpoint_of_autograd_lie_systems_and_a_fitted_spring_top_inertia():
    """grad='checkpoint' refused every SO3HNN / autograd LieHamiltonian rollout (its derivative's
    fresh leaf was taken for an unlisted tensor); SpringTop froze a Parameter inertia (a copy made
    at construction: the optimiser moved the Parameter, the body kept the old moments)."""
    torch.manual_seed(0)
    model = hnn()
    g0, mu0 = initial(model, 2)

    def grads(grad):
        model.zero_grad()
        gs, ms = tgi.rollout(model, g0, mu0, h=0.1, steps=6, method="lie_midpoint_cayley", grad=grad)
        ((ms ** 2).sum() + gs[..., 0, 1].sum()).backward()
        return [torch.zeros_like(w) if w.grad is None else w.grad.clone() for w in model.parameters()]

    for a, b in zip(grads("backprop"), grads("checkpoint")):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-14)
    I = torch.tensor([1.0, 2.0, 3.5])
    lh = LieHamiltonian(lambda g, mu: 0.5 * (mu * mu / I).sum(-1) + g[..., 2, 2])
    got = []
    for grad in ("backprop", "checkpoint"):
        mu = mu0.clone().requires_grad_()
        gs, ms = tgi.rollout(lh, g0, mu, h=0.1, steps=6, method="lie_midpoint_exp", grad=grad)
        got.append(torch.autograd.grad((ms ** 2).sum(), mu)[0])
    assert torch.allclose(*got, rtol=1e-12, atol=1e-14)
    moments = torch.nn.Parameter(torch.tensor([0.8, 1.1, 0.5]))
    top = SpringTop(moments, mass=1.5)
    assert [n for n, _ in top.named_parameters()] == ["moments"]
    g0, mu0 = initial(top, 2)
    before = tgi.rollout(top, g0, mu0, h=0.05, steps=5, method="lie_midpoint_cayley")[1][-1]
    with torch.no_grad():
        moments.mul_(1.5)
    after = tgi.rollout(top, g0, mu0, h=0.05, steps=5, method="lie_midpoint_cayley")[1][-1]
    assert not torch.allclose(before, after) and torch.equal(top.inertia[:3], moments.detach())
    assert torch.equal(top.inertia[3:], torch.full((3,), 1.5))


def test_another_family_of_method_on_a_lie_system_is_named():
    """verlet, or variable steps, on a FreeRigidBody said only that g0 and mu0 differ in shape."""
    fb = free_body()
    g0, mu0 = initial(fb, 2)
    for kw, what in ((dict(), "not by 'verlet'"),
                     (dict(method="lie_midpoint_cayley", step_control=tgi.power_law_control(1.5)),
                      "not by variable steps")):
        with pytest.raises(ValueError, match=f"FreeRigidBody is stepped by a Lie-group method .*{what}"):
            tgi.rollout(fb, g0, mu0, h=0.1, steps=3, **kw)


def test_a_lie_hamiltonian_of_the_wrong_shape_is_refused_in_the_rollout_too():
    """A per-coordinate or keepdim H(g, μ) rolled out (its gradient sums it); only energy()
    refused it, though the errors table said it was refused."""
    I = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    g0 = torch.eye(3, dtype=torch.float64).expand(2, 3, 3).clone()
    mu0 = torch.randn(2, 3, dtype=torch.float64)
    for H in (lambda g, mu: 0.5 * (mu * mu / I).sum(-1, keepdim=True), lambda g, mu: 0.5 * mu * mu / I):
        with pytest.raises(ValueError, match="the Hamiltonian .* must return one value per sample"):
            tgi.rollout(tgi.manifolds.LieHamiltonian(H), g0, mu0, h=0.1, steps=2, method="lie_midpoint_cayley")
