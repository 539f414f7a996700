"""Discrete variational integrators (Sects. 5.2–5.3, 6): L_d = h·L(R_d⁻¹/h), discrete Legendre
transforms, discrete Euler–Lagrange equations, equivalence with the cotangent-lift integrators,
symplecticity, composition (Störmer–Verlet)."""
import math

import numpy as np
import pytest
import torch

import torchgeo_int as tgi
from maps_zoo import warped
from torchgeo_int.integrators.variational import (VARIATIONAL_METHODS, DiscreteEulerLagrange,
                                                  VariationalIntegrator)
from torchgeo_int.lagrangian import (ComposedDiscreteLagrangian, DegenerateLagrangianError,
                                     DiscreteLagrangian, Lagrangian, MechanicalLagrangian)

F64 = dict(dtype=torch.float64)  # module constants are built before conftest sets float64
MASS = torch.tensor([[2.0, 0.3], [0.3, 1.0]], **F64)
Q0, P0 = torch.tensor([0.8, -0.3], **F64), torch.tensor([0.3, 0.5], **F64)


def potential(q):
    """A nonlinear coupled potential (pendulum-like in q₁, quartic coupling)."""
    return (1 - torch.cos(q[..., 0])) + 0.5 * q[..., 1] ** 2 + 0.1 * (q[..., 0] * q[..., 1]) ** 2


def generic_mechanical():
    """L = ½vᵀMv − V(q) as a plain Lagrangian(fn): every derivative by autograd."""
    M = MASS
    return Lagrangian(lambda q, v: 0.5 * (v * (v @ M.to(v.dtype).T)).sum(-1) - potential(q))


def legendre_hamiltonian():
    Minv = torch.linalg.inv(MASS)
    return tgi.SeparableHamiltonian(lambda p: 0.5 * (p * (p @ Minv.to(p.dtype).T)).sum(-1), potential)


def relativistic():
    """L = −√(1 − |v|²) − V(q) (non-quadratic), H = √(1 + |p|²) + V(q)."""
    L = Lagrangian(lambda q, v: -torch.sqrt(1 - (v * v).sum(-1)) - potential(q))
    H = tgi.Hamiltonian(lambda q, p: torch.sqrt(1 + (p * p).sum(-1)) + potential(q))
    return L, H


def run(system, method, q0, p0, h, steps):
    with torch.no_grad():
        q, p = tgi.rollout(system, q0, p0, h=h, steps=steps, method=method, save_every=steps)
    return q[-1], p[-1]


# -- the discrete Lagrangian -----------------------------------------------------------------------
@pytest.mark.parametrize("R", [tgi.AlphaMap(0.0), tgi.AlphaMap(0.3), tgi.MidpointMap(),
                               tgi.RetractionMap(warped, 0.5), tgi.RetractionMap(warped, 0.2)],
                         ids=["a0", "a0.3", "mid", "retr_mid", "retr0.2"])
def test_discrete_lagrangian_derivatives_are_its_gradient(R):
    """D₁L_d, D₂L_d from the base-point chain rule equal autograd of L_d(q₀, q₁) = hL(R_d⁻¹/h)."""
    L, _ = relativistic()
    Ld = DiscreteLagrangian(L, R)
    h = 0.1
    q0 = torch.randn(3, 2).mul(0.5).requires_grad_()
    q1 = (q0.detach() + 0.05 * torch.randn(3, 2)).requires_grad_()
    g0, g1 = torch.autograd.grad(Ld(q0, q1, h).sum(), (q0, q1))
    D1, D2 = Ld.derivatives(q0.detach(), q1.detach(), h)
    assert torch.allclose(D1, g0, atol=1e-12) and torch.allclose(D2, g1, atol=1e-12)


def test_discrete_lagrangian_alpha_formula():
    """For the α-family, L_d = h[½((q₁−q₀)/h)ᵀM((q₁−q₀)/h) − V((1−α)q₀ + αq₁)]: only the
    velocity part of R_d⁻¹ is divided by h."""
    L = generic_mechanical()
    q0, q1, h = torch.randn(4, 2), torch.randn(4, 2), 0.2
    for alpha in (0.0, 0.3, 0.5, 1.0):
        w = (q1 - q0) / h
        expected = h * (0.5 * (w * (w @ MASS.T)).sum(-1) - potential((1 - alpha) * q0 + alpha * q1))
        got = DiscreteLagrangian(L, tgi.AlphaMap(alpha))(q0, q1, h)
        assert torch.allclose(got, expected, atol=1e-14)


# -- equivalence with the cotangent-lift integrators (diagram (22)-(23)) ---------------------------
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 0.3])
@pytest.mark.parametrize("kind", ["generic", "mechanical"])
def test_variational_equals_cotangent_lift(alpha, kind):
    """VI of L = ½vᵀMv − V with AlphaMap(α) = CotangentLiftIntegrator(AlphaMap(α)) of
    H = ½pᵀM⁻¹p + V, trajectories in (q, p), to 1e-11."""
    L = generic_mechanical() if kind == "generic" else Lagrangian.mechanical(potential, MASS)
    H = legendre_hamiltonian() if kind == "generic" else L.hamiltonian_system()
    h, steps = 0.1, 30
    a = run(L, VariationalIntegrator(tgi.AlphaMap(alpha)), Q0, P0, h, steps)
    b = run(H, tgi.CotangentLiftIntegrator(tgi.AlphaMap(alpha)), Q0, P0, h, steps)
    assert (a[0] - b[0]).abs().max() < 1e-11 and (a[1] - b[1]).abs().max() < 1e-11


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_variational_equals_cotangent_lift_non_quadratic(alpha):
    """The diagram commutes for any regular L: the relativistic particle."""
    L, H = relativistic()
    a = run(L, VariationalIntegrator(tgi.AlphaMap(alpha)), Q0, P0, 0.1, 20)
    b = run(H, tgi.CotangentLiftIntegrator(tgi.AlphaMap(alpha)), Q0, P0, 0.1, 20)
    assert (a[0] - b[0]).abs().max() < 1e-11 and (a[1] - b[1]).abs().max() < 1e-11


def test_variational_equals_cotangent_lift_for_a_retraction_map():
    """A map with no closed inverse (solved for the base point): still eq. (20)'s method."""
    L, H = relativistic()
    R = tgi.RetractionMap(warped, 0.5)
    a = run(L, VariationalIntegrator(R), Q0, P0, 0.1, 4)
    b = run(H, tgi.CotangentLiftIntegrator(R), Q0, P0, 0.1, 4)
    assert (a[0] - b[0]).abs().max() < 1e-10 and (a[1] - b[1]).abs().max() < 1e-10


def test_discrete_legendre_transforms_hold_along_the_trajectory():
    """p_k = −D₁L_d(q_k, q_{k+1}), p_{k+1} = D₂L_d(q_k, q_{k+1}), and the DEL residual vanishes."""
    L, _ = relativistic()
    R = tgi.AlphaMap(0.3)
    Ld = DiscreteLagrangian(L, R)
    h = 0.1
    with torch.no_grad():
        q, p = tgi.rollout(L, Q0, P0, h=h, steps=6, method=VariationalIntegrator(R))
    for k in range(6):
        pk, pk1 = Ld.momenta(q[k], q[k + 1], h, k * h)
        assert torch.allclose(pk, p[k], atol=1e-12) and torch.allclose(pk1, p[k + 1], atol=1e-12)
    for k in range(1, 6):
        assert Ld.euler_lagrange(q[k - 1], q[k], q[k + 1], h, (k - 1) * h).abs().max() < 1e-12


@pytest.mark.parametrize("R", [tgi.MidpointMap(), tgi.AlphaMap(0.3), tgi.RetractionMap(warped, 0.5)],
                         ids=["mid", "a0.3", "retr"])
def test_discrete_euler_lagrange_two_step_form(R):
    """(q_{k−1}, q_k) ↦ q_{k+1} from D₁L_d(q_k, q_{k+1}) + D₂L_d(q_{k−1}, q_k) = 0 reproduces the
    position–momentum trajectory, and p_k is recovered."""
    L, _ = relativistic()
    h, steps = 0.1, 5 if isinstance(R, tgi.RetractionMap) else 10
    m = DiscreteEulerLagrange(R)
    with torch.no_grad():
        q_ref, p_ref = tgi.rollout(L, Q0, P0, h=h, steps=steps, method=VariationalIntegrator(R))
        q1 = m.start(L, Q0, P0, 0.0, h)
        qa, qb = tgi.rollout(L, Q0, q1, h=h, steps=steps - 1, method=m)
        pk = m.momentum(L, qa[-1], qb[-1], (steps - 1) * h, h)
    assert (qa - q_ref[:-1]).abs().max() < 1e-11 and (qb - q_ref[1:]).abs().max() < 1e-11
    assert (pk - p_ref[-1]).abs().max() < 1e-11


# -- structure ----------------------------------------------------------------------------------------
def _omega(n):
    I, Z = torch.eye(n), torch.zeros(n, n)
    return torch.cat([torch.cat([Z, I], 1), torch.cat([-I, Z], 1)], 0)


@pytest.mark.parametrize("method", [VariationalIntegrator(tgi.AlphaMap(0.3)),
                                    VARIATIONAL_METHODS["variational_midpoint"],
                                    VARIATIONAL_METHODS["variational_verlet"],
                                    VariationalIntegrator(tgi.RetractionMap(warped, 0.5))],
                         ids=["a0.3", "mid", "verlet", "retr"])
def test_symplectic_in_q_p(method):
    """JᵀJ₀J = J₀ for the one-step map (q_k, p_k) ↦ (q_{k+1}, p_{k+1}), by autograd through the
    Newton solve (IFT gradients), on a non-quadratic Lagrangian."""
    L, _ = relativistic()

    def f(z):
        q1, p1 = method(L, z[:2], z[2:], 0.0, 0.2)
        return torch.cat([q1, p1])

    J = torch.autograd.functional.jacobian(f, torch.cat([Q0, P0]))
    assert (J.T @ _omega(2) @ J - _omega(2)).abs().max() < 1e-9


def test_composition_of_discrete_lagrangians_is_stormer_verlet():
    """L_d¹ + L_d² (α = 0 then α = 1 at h/2, intermediate point solved for) = METHODS["verlet"],
    and the composed generating function gives the step's momenta."""
    L = Lagrangian.mechanical(potential, MASS)
    H = L.hamiltonian_system()
    vv = VARIATIONAL_METHODS["variational_verlet"]
    a = run(L, vv, Q0, P0, 0.1, 30)
    b = run(H, tgi.METHODS["verlet"], Q0, P0, 0.1, 30)
    assert (a[0] - b[0]).abs().max() < 1e-12 and (a[1] - b[1]).abs().max() < 1e-12
    c = run(L, tgi.Composition([VariationalIntegrator(tgi.AlphaMap(0.0)),
                                VariationalIntegrator(tgi.AlphaMap(1.0))], [0.5, 0.5]), Q0, P0, 0.1, 30)
    assert (a[0] - c[0]).abs().max() < 1e-12 and (a[1] - c[1]).abs().max() < 1e-12
    # Generating function: p₀ = −D₁L_d³(q₀, q₂), p₂ = D₂L_d³(q₀, q₂), for a non-quadratic L too.
    Lr, _ = relativistic()
    q2, p2 = vv(Lr, Q0, P0, 0.0, 0.1)
    Ld3 = ComposedDiscreteLagrangian(Lr, [tgi.AlphaMap(0.0), tgi.AlphaMap(1.0)], [0.5, 0.5])
    m0, m2 = Ld3.momenta(Q0, q2, 0.1)
    assert torch.allclose(m0, P0, atol=1e-12) and torch.allclose(m2, p2, atol=1e-12)
    # and the envelope theorem: its derivatives are the gradient of its value
    q0_, q2_ = Q0.clone().requires_grad_(), q2.detach().clone().requires_grad_()
    g0, g2 = torch.autograd.grad(Ld3(q0_, q2_, 0.1), (q0_, q2_))
    assert torch.allclose(g0, -m0, atol=1e-10) and torch.allclose(g2, m2, atol=1e-10)


def test_declared_properties_and_adjoints():
    V = VARIATIONAL_METHODS
    assert V["variational_euler"].order == 1 and not V["variational_euler"].symmetric
    assert V["variational_midpoint"].order == 2 and V["variational_midpoint"].symmetric
    assert V["variational_verlet"].order == 2 and V["variational_verlet"].symmetric
    assert not VariationalIntegrator([tgi.AlphaMap(0.0), tgi.AlphaMap(1.0)], [0.3, 0.7]).symmetric
    assert all(m.symplectic for m in V.values())
    L, _ = relativistic()
    for m in (V["variational_euler"], VariationalIntegrator(tgi.AlphaMap(0.3)), V["variational_verlet"]):
        with torch.no_grad():  # Φ*_h = Φ_{−h}⁻¹
            q1, p1 = m.adjoint()(L, Q0, P0, 0.0, 0.1)
            q2, p2 = m(L, q1, p1, 0.1, -0.1)
        assert torch.allclose(q2, Q0, atol=1e-11) and torch.allclose(p2, P0, atol=1e-11)
    a = V["variational_euler"].adjoint()(L, Q0, P0, 0.0, 0.1)
    b = V["variational_euler_adjoint"](L, Q0, P0, 0.0, 0.1)
    assert all(torch.allclose(x, y, atol=1e-13) for x, y in zip(a, b))


# -- orders ---------------------------------------------------------------------------------------------
_REF = {}


def reference(T):
    """Relativistic particle, (q, p) at T from scipy's DOP853 at rtol = atol = 1e-13."""
    if T not in _REF:
        from scipy.integrate import solve_ivp

        def f(t, y):
            q, p = y[:2], y[2:]
            dV = np.array([math.sin(q[0]) + 0.2 * q[0] * q[1] ** 2, q[1] + 0.2 * q[0] ** 2 * q[1]])
            return np.concatenate([p / math.sqrt(1 + p @ p), -dV])

        sol = solve_ivp(f, (0.0, T), np.concatenate([Q0.numpy(), P0.numpy()]), method="DOP853",
                        rtol=1e-13, atol=1e-13)
        _REF[T] = torch.tensor(sol.y[:, -1])
    return _REF[T]


@pytest.mark.parametrize("name", sorted(VARIATIONAL_METHODS))
def test_measured_order(name):
    """Log-log slope of the (q, p) error at T = 2.7 (not a period) on the relativistic particle."""
    m = VARIATIONAL_METHODS[name]
    L, _ = relativistic()
    T, Ns = 2.7, (16, 32, 64)
    errs = [float((torch.cat(run(L, m, Q0, P0, T / N, N)) - reference(T)).norm()) for N in Ns]
    slope = -np.polyfit(np.log(Ns), np.log(errs), 1)[0]
    assert abs(slope - m.order) < 0.3, (slope, errs)


@pytest.mark.parametrize("name", ["variational_midpoint", "variational_verlet", "variational_euler"])
def test_time_dependent_lagrangian(name):
    """L = ½v² − ½q² + q sin t (driven oscillator), q(0) = p(0) = 0: q = (sin t − t cos t)/2,
    p = t sin t / 2; the (q, p) error."""
    L = Lagrangian(lambda q, v, t: (0.5 * v * v - 0.5 * q * q + q * math.sin(t)).sum(-1))
    assert L.time_dependent
    m = VARIATIONAL_METHODS[name]
    T = 2.0
    exact = torch.tensor([(math.sin(T) - T * math.cos(T)) / 2, T * math.sin(T) / 2])
    errs = [float((torch.cat(run(L, m, torch.zeros(1), torch.zeros(1), T / N, N)) - exact).norm())
            for N in (40, 80, 160)]
    slopes = [math.log2(errs[i] / errs[i + 1]) for i in range(2)]
    assert all(abs(s - m.order) < 0.3 for s in slopes), slopes


def test_composition_with_a_coefficient_table_has_order_4():
    """The symmetric variational midpoint rule composed by the triple jump: order 4 (declared,
    measured)."""
    m = tgi.Composition(VARIATIONAL_METHODS["variational_midpoint"], tgi.TABLES["yoshida4"].gammas)
    assert m.order == 4 and m.symmetric and m.symplectic
    L, _ = relativistic()
    T, Ns = 2.7, (8, 16, 32)
    errs = [float((torch.cat(run(L, m, Q0, P0, T / N, N)) - reference(T)).norm()) for N in Ns]
    slope = -np.polyfit(np.log(Ns), np.log(errs), 1)[0]
    assert abs(slope - 4) < 0.3, (slope, errs)


# -- gradients, batches, float32 -------------------------------------------------------------------------
def test_gradients_match_finite_differences():
    k = torch.tensor(1.3, requires_grad=True)
    q0, p0 = Q0.clone().requires_grad_(), P0.clone().requires_grad_()

    def loss(k_, q0_, p0_, method=VARIATIONAL_METHODS["variational_midpoint"]):
        L = Lagrangian(lambda q, v: -torch.sqrt(1 - (v * v).sum(-1)) - k_ * potential(q))
        q, p = tgi.rollout(L, q0_, p0_, h=0.1, steps=8, method=method)
        return (q[-1] ** 2).sum() + (q[-1] * p[-1]).sum()

    g = torch.autograd.grad(loss(k, q0, p0), (k, q0, p0))
    eps, e = 1e-6, torch.eye(2)
    with torch.no_grad():
        fd_k = (loss(k + eps, Q0, P0) - loss(k - eps, Q0, P0)) / (2 * eps)
        fd_q = torch.stack([(loss(k, Q0 + eps * e[i], P0) - loss(k, Q0 - eps * e[i], P0)) / (2 * eps)
                            for i in range(2)])
        fd_p = torch.stack([(loss(k, Q0, P0 + eps * e[i]) - loss(k, Q0, P0 - eps * e[i])) / (2 * eps)
                            for i in range(2)])
    assert abs(float(g[0] - fd_k)) < 1e-7
    assert (g[1] - fd_q).abs().max() < 1e-7 and (g[2] - fd_p).abs().max() < 1e-7


def test_batched_equals_per_sample():
    L, _ = relativistic()
    q0, p0 = 0.5 * torch.randn(2, 3, 2), 0.5 * torch.randn(2, 3, 2)
    m = VARIATIONAL_METHODS["variational_verlet"]
    qb, pb = run(L, m, q0, p0, 0.1, 5)
    for i in range(2):
        for j in range(3):
            qs, ps = run(L, m, q0[i, j], p0[i, j], 0.1, 5)
            assert torch.allclose(qb[i, j], qs, atol=1e-12) and torch.allclose(pb[i, j], ps, atol=1e-12)


def test_float32():
    L64, _ = relativistic()
    for m in (VARIATIONAL_METHODS["variational_midpoint"], VARIATIONAL_METHODS["variational_verlet"]):
        a = run(L64, m, Q0, P0, 0.1, 20)
        b = run(L64, m, Q0.float(), P0.float(), 0.1, 20)
        assert b[0].dtype == torch.float32
        # each step's Newton stops at |Δv| ≲ tol (1 + |v|), tol = 1.3e-6 in float32 (the momentum
        # residual is divided by the mass scale, ≈ 1.5 here): 20 steps stay within 4e-5
        assert all((x.double() - y).abs().max() < 4e-5 for x, y in zip(b, a))
    Lm = Lagrangian.mechanical(potential, MASS.float())
    a = run(Lm, VARIATIONAL_METHODS["variational_verlet"], Q0.float(), P0.float(), 0.1, 20)
    b = run(Lm.hamiltonian_system(), "verlet", Q0.float(), P0.float(), 0.1, 20)
    assert all((x - y).abs().max() < 1e-5 for x, y in zip(a, b))


# -- the Lagrangian system -----------------------------------------------------------------------------
def test_lagrangian_system_transforms():
    """FL and FL⁻¹ are inverse; vector_field is Hamilton's equations of the Legendre-transformed H;
    energy is H; sode() gives the Euler–Lagrange acceleration."""
    L, H = relativistic()
    q, p = torch.randn(4, 2) * 0.5, torch.randn(4, 2) * 0.5
    v = L.inverse_legendre(q, p)
    assert torch.allclose(L.legendre(q, v), p, atol=1e-13)
    for a, b in zip(L.vector_field(q, p), H.vector_field(q, p)):
        assert torch.allclose(a, b, atol=1e-12)
    assert torch.allclose(L.energy(q, p), H.energy(q, p), atol=1e-13)
    assert torch.allclose(L.lagrangian_energy(q, v), H.energy(q, p), atol=1e-13)
    # position-dependent mass L = ½(1 + q²)v² − V: q̈ = (−q v² − V'(q))/(1 + q²)
    Lm = Lagrangian(lambda q, v: (0.5 * (1 + q * q) * v * v - 0.5 * q * q).sum(-1))
    q1, v1 = torch.randn(5, 1), torch.randn(5, 1)
    acc = Lm.sode().acceleration(q1, v1)
    assert torch.allclose(acc, (-q1 * v1 ** 2 - q1) / (1 + q1 ** 2), atol=1e-13)
    # the variational integrator of a mechanical Lagrangian runs through the Hamiltonian methods too
    Lmech = Lagrangian.mechanical(potential, MASS)
    a = run(Lmech, "implicit_midpoint", Q0, P0, 0.1, 10)
    b = run(Lmech, VARIATIONAL_METHODS["variational_midpoint"], Q0, P0, 0.1, 10)
    assert all(torch.allclose(x, y, atol=1e-12) for x, y in zip(a, b))


# -- bad input ------------------------------------------------------------------------------------------
def test_degenerate_lagrangian_raises():
    """∂²L/∂v² singular: L = ½(v₁ + v₂)² − V has no Legendre transform."""
    L = Lagrangian(lambda q, v: 0.5 * v.sum(-1) ** 2 - potential(q))
    with pytest.raises(DegenerateLagrangianError, match="singular"):
        L.check_regular(Q0, P0)
    with pytest.raises(ValueError, match="degenerate"):
        L.inverse_legendre(Q0, P0)
    for m in (VARIATIONAL_METHODS["variational_midpoint"], VARIATIONAL_METHODS["variational_verlet"],
              VariationalIntegrator(tgi.RetractionMap(warped, 0.5))):
        with pytest.raises(ValueError, match="degenerate"):
            with torch.no_grad():
                tgi.rollout(L, Q0, P0, h=0.1, steps=2, method=m)
    with pytest.raises(ValueError, match="degenerate"):
        with torch.no_grad():
            tgi.rollout(L, Q0, Q0 + 0.01, h=0.1, steps=2, method=DiscreteEulerLagrange(tgi.MidpointMap()))
    with pytest.raises(ValueError, match="singular"):
        Lagrangian.mechanical(potential, torch.tensor([[1.0, 1.0], [1.0, 1.0]]))


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="sum to 1"):
        VariationalIntegrator([tgi.AlphaMap(0.0), tgi.AlphaMap(1.0)], [0.5, 0.6])
    with pytest.raises(ValueError, match="one step fraction per map"):
        VariationalIntegrator([tgi.AlphaMap(0.0), tgi.AlphaMap(1.0)], [1.0])
    with pytest.raises(ValueError, match="closed-form inverse"):
        ComposedDiscreteLagrangian(relativistic()[0], [tgi.RetractionMap(warped, 0.0), tgi.AlphaMap(1.0)])
    with pytest.raises(TypeError, match="DiscretizationMap"):
        VariationalIntegrator("midpoint")
    with pytest.raises(TypeError, match="Lagrangian"):
        tgi.rollout(legendre_hamiltonian(), Q0, P0, h=0.1, steps=2,
                    method=VARIATIONAL_METHODS["variational_midpoint"])
    with pytest.raises(ValueError, match="one value per sample"):
        Lagrangian(lambda q, v: v * v).L(Q0, P0)
    with pytest.raises(TypeError, match="callable"):
        Lagrangian(3.0)
    with pytest.raises(TypeError, match="Lagrangian"):
        DiscreteLagrangian(legendre_hamiltonian(), tgi.MidpointMap())
    assert isinstance(Lagrangian.mechanical(potential), MechanicalLagrangian)


# -- units and precision of the Lagrangian's own solves (review 2026-12-05) -----------------------
def test_lagrangian_solves_do_not_depend_on_the_units():
    """L and k·L have the same motion: FL⁻¹ and the interior points of a composed discrete
    Lagrangian stopped at their start for small k (a momentum residual tested against velocities
    or positions), so implicit_midpoint on k·L left the particle at rest."""
    def make(k):
        return tgi.Lagrangian(lambda q, v: k * (0.5 * (v * v).sum(-1) - (1 - torch.cos(q)).sum(-1)))
    q, v = torch.tensor([[0.3, 0.1]]), torch.tensor([[0.2, -0.1]])
    ref = None
    for k in (1.0, 1e-8, 1e-14, 1e6):
        L = make(k)
        p = L.legendre(q, v)
        assert torch.allclose(L.inverse_legendre(q, p), v, atol=1e-12, rtol=0), k
        qk, _ = tgi.rollout(L, q, p, h=0.1, steps=10, method="implicit_midpoint")
        Ld = ComposedDiscreteLagrangian(L, [tgi.AlphaMap(0.3), tgi.AlphaMap(0.5)], [0.5, 0.5])
        mid = Ld.interior(q, q + 0.1 * v, 0.1)[0]
        if ref is None:
            ref = qk[-1], mid
        assert torch.allclose(qk[-1], ref[0], atol=1e-10, rtol=0), k
        assert torch.allclose(mid, ref[1], atol=1e-12, rtol=0), k
    # float32 at k = 1e-6: FL⁻¹ to float32's round-off (it returned 0 before)
    L = make(1e-6)
    q32, v32 = q.float(), v.float()
    assert torch.allclose(L.inverse_legendre(q32, L.legendre(q32, v32)), v32, atol=1e-6, rtol=0)


def test_a_mass_given_as_a_number_keeps_float64_runs_at_float64():
    """A Python mass was stored in the default dtype: with float32 as default, M⁻¹ = 1/3 in
    float32 capped a float64 run at 1e-6."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        L = tgi.Lagrangian.mechanical(lambda q: 0.5 * (q * q).sum(-1), 3.0)
        S = tgi.SecondOrderSystem(lambda t, q: -q, mass=3.0)
        full = tgi.Lagrangian.mechanical(lambda q: 0.5 * (q * q).sum(-1),
                                         torch.tensor([[3.0, 0.0], [0.0, 3.0]]))
    finally:
        torch.set_default_dtype(default)
    q = torch.tensor([[1.0]], dtype=torch.float64)
    assert abs(float(L.velocity(q)) - 1 / 3) < 1e-16
    assert abs(float(S.acceleration(q)) + 1 / 3) < 1e-16
    # a float32 (n, n) mass holds exactly representable values: M⁻¹ formed in float64
    q2 = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    assert torch.allclose(full.velocity(q2), q2 / 3, atol=1e-16, rtol=0)
    qs, _ = tgi.rollout(L, q, torch.zeros_like(q), h=0.05, steps=400, method="yoshida8")
    assert abs(float(qs[-1]) - math.cos(20 / math.sqrt(3))) < 1e-12


@pytest.mark.parametrize("kind", ["mechanical", "generic"])
def test_a_regular_lagrangian_with_a_zero_diagonal_hessian(kind):
    """M = [[0, 1], [1, 0]] (or L = v₁v₂ − V) is regular: its mass scale was the zero diagonal,
    and the variational midpoint rule divided by 0 (or by 2e-308)."""
    V = lambda q: 0.5 * (q ** 2).sum(-1)
    if kind == "mechanical":
        L = tgi.Lagrangian.mechanical(V, torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
    else:
        L = tgi.Lagrangian(lambda q, v: v[..., 0] * v[..., 1] - V(q))
    q0, v0 = torch.tensor([[0.5, -0.2]]), torch.tensor([[0.1, 0.3]])
    p0 = L.legendre(q0, v0)
    qa, pa = tgi.rollout(L, q0, p0, h=0.1, steps=10, method="variational_midpoint")
    # the same map as the implicit midpoint rule on H = p₁p₂ + V (Legendre of this L)
    H = tgi.Hamiltonian(lambda q, p: p[..., 0] * p[..., 1] + V(q))
    qb, pb = tgi.rollout(H, q0, p0, h=0.1, steps=10, method="implicit_midpoint")
    assert torch.allclose(qa, qb, atol=1e-11) and torch.allclose(pa, pb, atol=1e-11)


def test_triple_jump_fractions_declare_and_measure_order_4():
    """A composed discrete Lagrangian of midpoint maps at the triple jump's fractions is the
    composition of their variational maps: order 4 (declared 2 before, measured 4)."""
    th = 1 / (2 - 2 ** (1 / 3))
    m = VariationalIntegrator([tgi.MidpointMap()] * 3, [th, 1 - 2 * th, th])
    assert m.order == 4 and m.symmetric
    L, _ = relativistic()
    T, Ns = 2.7, (8, 16, 32)
    errs = [float((torch.cat(run(L, m, Q0, P0, T / N, N)) - reference(T)).norm()) for N in Ns]
    slope = -np.polyfit(np.log(Ns), np.log(errs), 1)[0]
    assert abs(slope - 4) < 0.3, (slope, errs)
    # [α, 1 − α] stays order 2, a lone α-map order 1
    assert VariationalIntegrator([tgi.AlphaMap(0.3), tgi.AlphaMap(0.7)]).order == 2
    assert VariationalIntegrator(tgi.AlphaMap(0.3)).order == 1


def test_a_symmetric_composition_of_order_one_steps_declares_order_2():
    # Φ*_{h/2} ∘ Φ_{h/2} (symplectic Euler and its adjoint) is symmetric, so of even order
    c = tgi.Composition([tgi.METHODS["symplectic_euler"], tgi.METHODS["symplectic_euler_adjoint"]],
                        [0.5, 0.5])
    assert c.symmetric and c.order == 2
    L, _ = relativistic()
    H = tgi.Hamiltonian(lambda q, p: L.energy(q, p))
    T, Ns = 2.7, (16, 32, 64)
    errs = [float((torch.cat(run(H, c, Q0, P0, T / N, N)) - reference(T)).norm()) for N in Ns]
    slope = -np.polyfit(np.log(Ns), np.log(errs), 1)[0]
    assert abs(slope - 2) < 0.3, (slope, errs)


@pytest.mark.parametrize("method", ["variational_midpoint", "variational_verlet", "variational_euler"])
def test_a_growing_velocity_hessian_does_not_stop_the_rollout(method):
    """L = e^q |v|²/2: ∂²L/∂v² grows 10⁴× along the motion; the momentum residuals were divided
    by the first step's scale, and their round-off passed the tolerance (ConvergenceError at
    steps 45 / 66 / 103).  Restarted in chunks (a fresh scale each) the motion is the same."""
    L = tgi.Lagrangian(lambda q, v: 0.5 * torch.exp(q.sum(-1)) * (v * v).sum(-1))
    q0, p0 = torch.tensor([0.0], dtype=torch.float64), torch.tensor([10.0], dtype=torch.float64)
    q, p = tgi.rollout(L, q0, p0, h=0.05, steps=440, method=method)
    qc, pc = q0, p0
    for _ in range(11):
        qs, ps = tgi.rollout(L, qc, pc, h=0.05, steps=40, method=method)
        qc, pc = qs[-1], ps[-1]
    assert torch.allclose(q[-1], qc, rtol=1e-9) and torch.allclose(p[-1], pc, rtol=1e-9)


@pytest.mark.parametrize("V", [lambda q: (q * q).sum(-1, keepdim=True), lambda q: q * q],
                         ids=["keepdim", "per-coordinate"])
def test_a_potential_of_the_wrong_shape_is_refused_on_the_lagrangian_side_too(V):
    """Lagrangian.mechanical / SecondOrderSystem.from_potential check V's shape as the
    Hamiltonian side does: a keepdim V broadcast the energy to (B, B) (samples mixed, no error),
    a per-coordinate one failed in energy with a raw size mismatch."""
    q, v = torch.randn(3, 2, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
    L = tgi.Lagrangian.mechanical(V)
    for call in (lambda: L.energy(q, v), lambda: L.lagrangian(q, v),
                 lambda: tgi.rollout(L, q, v, h=0.1, steps=2, method="variational_midpoint"),
                 lambda: tgi.SecondOrderSystem.from_potential(V).energy(q, v),
                 lambda: tgi.SecondOrderSystem.from_potential(V, potential_grad=lambda q: 2 * q).energy(q, v)):
        with pytest.raises(ValueError, match="the potential .* must return one value per sample"):
            call()


def test_from_potential_refuses_a_negative_damping_as_forced_systems_do():
    with pytest.raises(ValueError, match="a negative damping pumps energy in"):
        tgi.SecondOrderSystem.from_potential(lambda q: (q * q).sum(-1), damping=-1.0)
    with pytest.raises(ValueError, match="positive semidefinite"):
        tgi.SecondOrderSystem.from_potential(lambda q: (q * q).sum(-1),
                                             damping=torch.tensor([[1.0, 0.0], [0.0, -2.0]]))
