"""Second-order equations on TQ (Sect. 4): Newmark (eq. 10/13), tangent-lift schemes (eq. 11),
the discrete second-order equation (Sect. 4.2)."""
import math

import numpy as np
import pytest
import torch

import torchgeo_int as tgi
from maps_zoo import warped
from torchgeo_int.integrators.sode import (SODE_METHODS, DiscreteSODE, Newmark, NewmarkMap,
                                           SODEIntegrator, TangentLiftSODE)
from torchgeo_int.lagrangian import SecondOrderSystem

F64 = dict(dtype=torch.float64)  # module constants are built before conftest sets float64
MASS = torch.tensor([[2.0, 0.3], [0.3, 1.0]], **F64)
DAMPING = torch.tensor([[0.3, 0.05], [0.05, 0.2]], **F64)
K = torch.tensor([[1.0, -0.4], [-0.4, 1.5]], **F64)
Q0, V0 = torch.tensor([1.0, -0.4], **F64), torch.tensor([0.2, 0.7], **F64)
NEWMARK = {"average": (0.5, 0.25), "linear": (0.5, 1 / 6), "central": (0.5, 0.0),
           "damped": (0.6, 0.3025)}


def duffing_potential(q):
    """A coupled Duffing potential: V = ½qᵀKq + ¼Σq⁴ (nonlinear)."""
    Kq = q @ K.to(q.dtype).T
    return 0.5 * (q * Kq).sum(-1) + 0.25 * (q ** 4).sum(-1)


def duffing_force(q):
    return -(q @ K.to(q.dtype).T) - q ** 3


def duffing(damped=False, mass=MASS, analytic=False):
    """M q̈ = −∇V(q) [− Cq̇]; ``analytic`` gives ∇V in closed form (fast; the order studies)."""
    grad = (lambda q: -duffing_force(q)) if analytic else None
    damping = DAMPING.to(mass.dtype) if damped else None
    return SecondOrderSystem.from_potential(duffing_potential, mass, damping=damping,
                                            potential_grad=grad)


def classical_newmark(gamma, beta, q, v, h, steps, damped=False, mass=MASS):
    """Eq. (13) written out by hand, a_k = M⁻¹f(q_k, v_k); the implicit a_{k+1} is found by a
    plain fixed-point iteration run to round-off (independent of the library's solvers)."""
    Minv = torch.linalg.inv(mass)

    def acc(q, v):
        f = duffing_force(q) - (v @ DAMPING.T if damped else 0.0)
        return f @ Minv.T

    a = acc(q, v)
    for _ in range(steps):
        qp = q + h * v + 0.5 * h * h * (1 - 2 * beta) * a
        vp = v + h * (1 - gamma) * a
        a1 = a
        for _ in range(200):
            new = acc(qp + beta * h * h * a1, vp + gamma * h * a1)
            done = (new - a1).abs().max() < 1e-16
            a1 = new
            if done:
                break
        q = q + h * v + 0.5 * h * h * ((1 - 2 * beta) * a + 2 * beta * a1)
        v = v + h * ((1 - gamma) * a + gamma * a1)
        a = acc(q, v)
    return q, v


def run(system, method, q0, v0, h, steps):
    with torch.no_grad():
        q, v = tgi.rollout(system, q0, v0, h=h, steps=steps, method=method, save_every=steps)
    return q[-1], v[-1]


# -- the Newmark map and the classical update --------------------------------------------------------
@pytest.mark.parametrize("gamma,beta", list(NEWMARK.values()))
def test_newmark_map_is_a_discretization_map(gamma, beta):
    R = NewmarkMap(gamma, beta, 0.1)
    x = torch.randn(5, 4)
    res = R.check(x)
    assert res["i"] < 1e-15 and res["ii"] < 1e-14
    xd = 0.3 * torch.randn(5, 4)
    y0, y1 = R(x, xd)
    xb, xdb = R.inverse(y0, y1)
    assert torch.allclose(xb, x, atol=1e-14) and torch.allclose(xdb, xd, atol=1e-14)
    # The closed-form adjoint is the generic one, (R²(x, −ẋ), R¹(x, −ẋ)).
    a, b = R.adjoint()(x, xd), tgi.AdjointMap(R)(x, xd)
    assert all(torch.allclose(u, w, atol=1e-15) for u, w in zip(a, b))


def test_average_acceleration_map_is_the_lifted_midpoint_map():
    """γ = ½, β = ¼: the Newmark map is the tangent lift of the midpoint map (Sect. 4.1)."""
    x, xd = torch.randn(3, 4), torch.randn(3, 4)
    a, b = NewmarkMap(0.5, 0.25, 0.37)(x, xd), tgi.TangentLift(tgi.MidpointMap())(x, xd)
    assert all(torch.allclose(u, w, atol=1e-15) for u, w in zip(a, b))
    assert NewmarkMap(0.5, 0.25, 0.1).symmetric and not NewmarkMap(0.5, 0.0, 0.1).symmetric
    # Another member differs from every tangent lift of the α-family by its (h/2)(γ − 2β) term.
    c = NewmarkMap(0.5, 0.0, 0.37)(x, xd)
    assert (c[0] - b[0]).abs().max() > 1e-3


@pytest.mark.parametrize("name", sorted(NEWMARK))
@pytest.mark.parametrize("damped", [False, True])
def test_newmark_equals_classical_update(name, damped):
    """The map-built Newmark (closed form and generic eq. (10) Newton solve on the map) equals the
    hand-written (13) on a nonlinear, mass-matrix problem; with damping f(q, v) = −∇V − Cv, (13)
    holds with a_k = M⁻¹f(q_k, v_k), a_{k+1} = M⁻¹f(q_{k+1}, v_{k+1}) (implicit in v_{k+1})."""
    gamma, beta = NEWMARK[name]
    h, steps = 0.05, 40
    system = duffing(damped)
    qr, vr = classical_newmark(gamma, beta, Q0, V0, h, steps, damped)
    m = Newmark(gamma, beta, tol=1e-15)
    for method in (m, m.generic()):
        q, v = run(system, method, Q0, V0, h, steps)
        assert (q - qr).abs().max() < 1e-12 and (v - vr).abs().max() < 1e-12, method.name


def test_newmark_fixed_point_solver_agrees_with_newton():
    system = duffing(damped=True)
    a = run(system, Newmark(0.5, 0.25, solver="fixed_point"), Q0, V0, 0.05, 20)
    b = run(system, Newmark(0.5, 0.25), Q0, V0, 0.05, 20)
    assert all(torch.allclose(x, y, atol=1e-12) for x, y in zip(a, b))


def test_explicit_newmark_is_velocity_verlet_with_one_force_per_step():
    calls = {"n": 0}

    def potential(q):
        calls["n"] += 1
        return duffing_potential(q)

    system = SecondOrderSystem.from_potential(potential, MASS)
    a = run(system, SODE_METHODS["newmark_central_difference"], Q0, V0, 0.05, 100)
    assert calls["n"] == 101
    b = run(system, "verlet", Q0, V0, 0.05, 100)  # kick–drift–kick on (q, v), F = M⁻¹f
    assert all(torch.allclose(x, y, atol=1e-13) for x, y in zip(a, b))


@pytest.mark.parametrize("base", ["newmark_central_difference", "sode_midpoint"])
def test_composition_with_a_coefficient_table_has_order_4(base):
    """γ = ½ Newmark and the midpoint rule on TQ are symmetric of order 2, so the triple jump
    of tgi.Composition raises them to order 4 (declared and measured)."""
    m = tgi.Composition(SODE_METHODS[base], tgi.TABLES["yoshida4"].gammas)
    assert m.order == 4 and m.symmetric
    Ns = (20, 40, 80) if base == "sode_midpoint" else (40, 80, 160)
    assert abs(measured_order(m, damped=False, Ns=Ns) - 4) < 0.3


# -- eq. (10) vs eq. (11) with the lifted midpoint map ---------------------------------------------
def test_average_acceleration_equals_tangent_midpoint_on_linear_problem():
    """On a linear damped problem M q̈ = −Kq − Cq̇, eq. (11) with the tangent lift of the midpoint
    map (the midpoint rule on TQ) and Newmark(½, ¼) (the trapezoidal rule) coincide."""
    system = SecondOrderSystem(lambda t, q, v: -(q @ K.T) - v @ DAMPING.T, MASS)
    h, steps = 0.1, 50
    a = run(system, SODE_METHODS["newmark_average_acceleration"], Q0, V0, h, steps)
    for method in (SODE_METHODS["sode_midpoint"], TangentLiftSODE(tgi.MidpointMap(), solver="newton"),
                   SODEIntegrator(tgi.TangentLift(tgi.MidpointMap()), equation=11)):
        b = run(system, method, Q0, V0, h, steps)
        assert all((x - y).abs().max() < 1e-12 for x, y in zip(a, b)), method.name


def test_lifted_midpoint_on_nonlinear_problem():
    """Nonlinear F: eq. (10) with the lifted midpoint map is still Newmark(½, ¼) exactly, but
    eq. (11) with it is the midpoint rule: both order 2, one step apart by O(h³)."""
    system = duffing()
    lift = tgi.TangentLift(tgi.MidpointMap())
    a = run(system, SODE_METHODS["newmark_average_acceleration"], Q0, V0, 0.05, 40)
    b = run(system, SODEIntegrator(lift, equation=10), Q0, V0, 0.05, 40)
    assert all((x - y).abs().max() < 1e-12 for x, y in zip(a, b))
    diffs = []
    for h in (0.1, 0.05, 0.025):
        a = run(system, SODE_METHODS["newmark_average_acceleration"], Q0, V0, h, 1)
        b = run(system, SODE_METHODS["sode_midpoint"], Q0, V0, h, 1)
        diffs.append(float(torch.cat([a[0] - b[0], a[1] - b[1]]).norm()))
    assert diffs[-1] > 1e-7
    rates = [math.log2(diffs[i] / diffs[i + 1]) for i in range(2)]
    assert all(abs(r - 3) < 0.3 for r in rates), rates


# -- orders ----------------------------------------------------------------------------------------
_REF = {}


def reference(T, damped):
    """(q, v) at T from scipy's DOP853 at rtol = atol = 1e-13."""
    if (T, damped) not in _REF:
        from scipy.integrate import solve_ivp

        Minv, Kn, Cn = np.linalg.inv(MASS.numpy()), K.numpy(), DAMPING.numpy()

        def f(t, y):
            q, v = y[:2], y[2:]
            force = -Kn @ q - q ** 3 - (Cn @ v if damped else 0.0)
            return np.concatenate([v, Minv @ force])

        sol = solve_ivp(f, (0.0, T), np.concatenate([Q0.numpy(), V0.numpy()]), method="DOP853",
                        rtol=1e-13, atol=1e-13)
        _REF[(T, damped)] = torch.tensor(sol.y[:, -1])
    return _REF[(T, damped)]


def measured_order(method, damped, T=3.3, Ns=(20, 40, 80, 160)):
    """Log-log slope of the (q, v) error at T (not a period) over h = T/N."""
    system = duffing(damped, analytic=True)
    ref = reference(T, damped)
    errs = []
    for N in Ns:
        q, v = run(system, method, Q0, V0, T / N, N)
        errs.append(float((torch.cat([q, v]) - ref).norm()))
    assert min(errs) > 1e-10, errs  # still above the reference's accuracy
    return -np.polyfit(np.log(Ns), np.log(errs), 1)[0]


ORDER_CASES = {
    **{f"newmark_{k}": Newmark(*gb) for k, gb in NEWMARK.items()},
    "tangent_midpoint": SODE_METHODS["sode_midpoint"],
    "tangent_alpha0.3": TangentLiftSODE(tgi.AlphaMap(0.3)),
    "tangent_retraction_mid": TangentLiftSODE(tgi.RetractionMap(warped, 0.5)),
    "eq10_lifted_alpha0.3": SODEIntegrator(tgi.TangentLift(tgi.AlphaMap(0.3)), equation=10),
}


@pytest.mark.parametrize("name,damped", [(n, d) for n in sorted(ORDER_CASES) for d in (False, True)
                                          if not ("retraction" in n and not d)])  # one slow case
def test_measured_order(name, damped):
    m = ORDER_CASES[name]
    if name.startswith("newmark"):
        assert m.order == (2 if m.gamma == 0.5 else 1)
    slope = measured_order(m, damped, Ns=(20, 40, 80) if "retraction" in name or "eq10" in name else (20, 40, 80, 160))
    assert abs(slope - m.order) < 0.3, slope


@pytest.mark.parametrize("name", ["newmark_average_acceleration", "newmark_central_difference",
                                  "newmark_damped", "sode_midpoint", "discrete_midpoint"])
def test_time_dependent_force(name):
    """Driven oscillator q̈ = −q + sin t, q(0) = q̇(0) = 0: q = (sin t − t cos t)/2 (the position
    error; the methods must evaluate f at the right times, else the order drops)."""
    system = SecondOrderSystem(lambda t, q: -q + math.sin(t))
    T = 2.0
    exact = (math.sin(T) - T * math.cos(T)) / 2
    zero = torch.zeros(1)
    errs = []
    for N in (40, 80, 160):
        h = T / N
        if name == "discrete_midpoint":
            m = DiscreteSODE(tgi.MidpointMap())
            with torch.no_grad():
                q1 = m.start(system, zero, zero, 0.0, h)
            q = run(system, m, zero, q1, h, N - 1)[1]
        else:
            m = SODE_METHODS[name]
            q = run(system, m, zero, zero, h, N)[0]
        errs.append(abs(float(q) - exact))
    slopes = [math.log2(errs[i] / errs[i + 1]) for i in range(2)]
    assert all(abs(s - m.order) < 0.3 for s in slopes), slopes


# -- structure: symplecticity, symmetry, adjoints -------------------------------------------------------
def _omega(n):
    I, Z = torch.eye(n), torch.zeros(n, n)
    return torch.cat([torch.cat([Z, I], 1), torch.cat([-I, Z], 1)], 0)


def one_step_jacobian(method, system, z, h=0.1):
    def f(z):
        q, v = method(system, z[:2], z[2:], 0.0, h)
        return torch.cat([q, v])

    return torch.autograd.functional.jacobian(f, z)


@pytest.mark.parametrize("name", sorted(SODE_METHODS))
def test_declared_symplecticity_holds(name):
    """With M = I and F = −∇V the state (q, v) is canonical: the declared-symplectic methods
    satisfy JᵀJ₀J = J₀, the others (trapezoidal Newmark, damped Newmark, Euler) do not."""
    m = SODE_METHODS[name]
    system = SecondOrderSystem.from_potential(duffing_potential)
    J = one_step_jacobian(m, system, torch.cat([Q0, V0]), h=0.2)
    defect = float((J.T @ _omega(2) @ J - _omega(2)).abs().max())
    if m.symplectic:
        assert defect < 1e-10, defect
    else:
        assert defect > 1e-6, defect


@pytest.mark.parametrize("gamma,beta", list(NEWMARK.values()))
def test_newmark_adjoint(gamma, beta):
    """Φ*_h = Φ_{−h}⁻¹ with Φ* = Newmark(1 − γ, ½ − γ + β); γ = ½ is symmetric (time-reversible)."""
    m = Newmark(gamma, beta)
    system = duffing(damped=True)
    adj = m.adjoint()
    with torch.no_grad():
        q1, v1 = adj(system, Q0, V0, 0.0, 0.1)
        q2, v2 = m(system, q1, v1, 0.1, -0.1)
    assert torch.allclose(q2, Q0, atol=1e-12) and torch.allclose(v2, V0, atol=1e-12)
    assert m.symmetric == (gamma == 0.5)
    assert math.isclose(adj.gamma, 1 - gamma) and math.isclose(adj.beta, 0.5 - gamma + beta)


def test_tangent_lift_sode_adjoint():
    system = duffing(damped=True)
    for R in (tgi.AlphaMap(0.3), tgi.RetractionMap(warped, 0.2)):
        m = TangentLiftSODE(R)
        with torch.no_grad():
            q1, v1 = m.adjoint()(system, Q0, V0, 0.0, 0.1)
            q2, v2 = m(system, q1, v1, 0.1, -0.1)
        assert torch.allclose(q2, Q0, atol=1e-11) and torch.allclose(v2, V0, atol=1e-11)


def test_tangent_lift_alpha_formula_and_generic_path():
    """Closed-form α stage solve = generic forward-form Newton (eq. 11) on TangentLift(R), and
    the midpoint rule q_{k+1} − q_k = h v̄, v_{k+1} − v_k = h F(q̄, v̄) holds."""
    system = duffing(damped=True)
    h = 0.1
    for alpha in (0.0, 0.3, 0.5, 1.0):
        a = TangentLiftSODE(tgi.AlphaMap(alpha))(system, Q0, V0, 0.0, h)
        b = SODEIntegrator(tgi.TangentLift(tgi.AlphaMap(alpha)), equation=11)(system, Q0, V0, 0.0, h)
        assert all(torch.allclose(x, y, atol=1e-13) for x, y in zip(a, b)), alpha
    q1, v1 = SODE_METHODS["sode_midpoint"](system, Q0, V0, 0.0, h)
    qb, vb = (Q0 + q1) / 2, (V0 + v1) / 2
    assert torch.allclose(q1 - Q0, h * vb, atol=1e-14)
    assert torch.allclose(v1 - V0, h * system.acceleration(qb, vb), atol=1e-13)


# -- the discrete second-order equation (Sect. 4.2) --------------------------------------------------
def test_discrete_sode_midpoint_two_step_formula():
    """(q_{k+1} − 2q_k + q_{k−1})/h² = ½[F((q_{k−1}+q_k)/2) + F((q_k+q_{k+1})/2)], F = F(q)."""
    system = duffing()
    m = DiscreteSODE(tgi.MidpointMap())
    h = 0.1
    q_prev = torch.randn(4, 2)
    q = q_prev + h * torch.randn(4, 2)
    _, q1, _ = m.step(system, q_prev, q, 0.0, h)
    F = system.acceleration
    lhs = (q1 - 2 * q + q_prev) / h ** 2
    rhs = 0.5 * (F((q_prev + q) / 2) + F((q + q1) / 2))
    assert (lhs - rhs).abs().max() < 1e-10  # 1e-14 in q, divided by h²


@pytest.mark.parametrize("R", [tgi.MidpointMap(), tgi.AlphaMap(0.3), tgi.ForwardEulerMap(),
                               tgi.RetractionMap(warped, 0.5)], ids=["mid", "a0.3", "fe", "retr"])
def test_discrete_sode_is_the_tangent_lift_scheme(R):
    """Its sequence is the q-trajectory of eq. (11) with R_d^T, and v_k is recovered."""
    system = duffing(damped=True)
    h, steps = 0.05, 12
    m = DiscreteSODE(R)
    with torch.no_grad():
        q_ref, v_ref = tgi.rollout(system, Q0, V0, h=h, steps=steps, method=TangentLiftSODE(R, solver="newton"))
        q1 = m.start(system, Q0, V0, 0.0, h)
        qa, qb = tgi.rollout(system, Q0, q1, h=h, steps=steps - 1, method=m)
    assert (qa - q_ref[:-1]).abs().max() < 1e-11 and (qb - q_ref[1:]).abs().max() < 1e-11
    with torch.no_grad():
        v = m.velocity(system, qa[-1], qb[-1], (steps - 1) * h, h)
    assert (v - v_ref[-1]).abs().max() < 1e-10
    assert m.order == (2 if R.symmetric else 1)


# -- batches, gradients, float32 -------------------------------------------------------------------------
def test_batched_equals_per_sample():
    system = duffing(damped=True)
    q0, v0 = 0.5 * torch.randn(3, 2), 0.5 * torch.randn(3, 2)
    for m in (Newmark(0.5, 0.25), SODE_METHODS["sode_midpoint"]):
        qb, vb = run(system, m, q0, v0, 0.05, 10)
        for i in range(3):
            qs, vs = run(system, m, q0[i], v0[i], 0.05, 10)
            assert torch.allclose(qb[i], qs, atol=1e-12) and torch.allclose(vb[i], vs, atol=1e-12)


@pytest.mark.parametrize("method", [Newmark(0.5, 0.25), Newmark(0.6, 0.3025),
                                    TangentLiftSODE(tgi.MidpointMap())], ids=["avg", "damped", "mid"])
def test_gradients_match_finite_differences(method):
    """d(loss)/d(q0, v0, stiffness) through implicit steps (solver IFT backward) = central FD."""
    k = torch.tensor(1.3, requires_grad=True)
    q0, v0 = Q0.clone().requires_grad_(), V0.clone().requires_grad_()

    def loss(k_, q0_, v0_):
        s = SecondOrderSystem(lambda t, q, v: -k_ * q - q ** 3 - 0.2 * v, MASS)
        q, v = tgi.rollout(s, q0_, v0_, h=0.1, steps=15, method=method)
        return (q[-1] ** 2).sum() + (q[-1] * v[-1]).sum()

    g = torch.autograd.grad(loss(k, q0, v0), (k, q0, v0))
    eps = 1e-6
    with torch.no_grad():
        fd_k = (loss(k + eps, Q0, V0) - loss(k - eps, Q0, V0)) / (2 * eps)
        e = torch.eye(2)
        fd_q = torch.stack([(loss(k, Q0 + eps * e[i], V0) - loss(k, Q0 - eps * e[i], V0)) / (2 * eps)
                            for i in range(2)])
        fd_v = torch.stack([(loss(k, Q0, V0 + eps * e[i]) - loss(k, Q0, V0 - eps * e[i])) / (2 * eps)
                            for i in range(2)])
    assert abs(float(g[0] - fd_k)) < 1e-7
    assert (g[1] - fd_q).abs().max() < 1e-7 and (g[2] - fd_v).abs().max() < 1e-7


def test_float32():
    system64 = duffing(damped=True)
    system32 = duffing(damped=True, mass=MASS.float())
    for m in (Newmark(0.5, 0.25), Newmark(0.5, 0.0), SODE_METHODS["sode_midpoint"]):
        q64, v64 = run(system64, m, Q0, V0, 0.05, 40)
        q32, v32 = run(system32, m, Q0.float(), V0.float(), 0.05, 40)
        assert q32.dtype == torch.float32
        assert (q32.double() - q64).abs().max() < 1e-5 and (v32.double() - v64).abs().max() < 1e-5


# -- bad input ------------------------------------------------------------------------------------------
def test_singular_or_bad_mass_raises():
    f = lambda t, q: -q  # noqa: E731
    for mass in (torch.tensor([[1.0, 2.0], [2.0, 4.0]]), torch.tensor([1.0, 0.0]), 0.0,
                 torch.tensor([[1.0, 1.0], [1.0, 1.0 + 1e-17]])):
        with pytest.raises(ValueError, match="singular"):
            SecondOrderSystem(f, mass)
    with pytest.raises(ValueError, match="square"):
        SecondOrderSystem(f, torch.ones(2, 3))
    with pytest.raises(ValueError, match="NaN"):
        SecondOrderSystem(f, torch.tensor([1.0, float("nan")]))
    with pytest.raises(TypeError):
        SecondOrderSystem(f, "heavy")
    system = SecondOrderSystem(f, torch.eye(3))
    with pytest.raises(ValueError, match="3x3"):
        system.acceleration(torch.zeros(2))


def test_bad_arguments_raise():
    with pytest.raises(TypeError, match="force"):
        SecondOrderSystem(lambda q: -q)
    with pytest.raises(TypeError, match="force"):
        SecondOrderSystem(3.0)
    with pytest.raises(ValueError, match="shaped like q"):
        SecondOrderSystem(lambda t, q: q.sum(-1)).acceleration(torch.zeros(2))
    with pytest.raises(TypeError, match="gamma"):
        Newmark(float("nan"), 0.25)
    with pytest.raises(TypeError, match="beta"):
        Newmark(0.5, "a")
    with pytest.raises(ValueError, match="solver"):
        Newmark(0.5, 0.25, solver="bisection")
    with pytest.raises(ValueError, match="equation"):
        SODEIntegrator(tgi.TangentLift(tgi.MidpointMap()), equation=12)
    with pytest.raises(TypeError, match="DiscretizationMap"):
        TangentLiftSODE("midpoint")
    with pytest.raises(ValueError, match="even"):
        NewmarkMap(0.5, 0.25, 0.1)(torch.zeros(3), torch.zeros(3))
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), duffing_potential)
    with pytest.raises(TypeError, match="SecondOrderSystem"):
        tgi.rollout(H, Q0, V0, h=0.1, steps=3, method=Newmark(0.5, 0.25))
    with pytest.raises(ValueError, match="NaN or inf"):
        tgi.rollout(duffing(), torch.tensor([float("nan"), 0.0]), V0, h=0.1, steps=3,
                    method=Newmark(0.5, 0.25))


def test_nonconvergence_raises_convergence_error_with_step():
    """A step far too large for the implicit solve fails loudly, naming the step."""
    system = SecondOrderSystem.from_potential(lambda q: (q ** 8).sum(-1))
    with pytest.raises(tgi.ConvergenceError, match="integrator step"):
        with torch.no_grad():
            tgi.rollout(system, torch.tensor([3.0, 2.0]), V0, h=2.0, steps=5,
                        method=Newmark(0.5, 0.25, solver="fixed_point"))


@pytest.mark.parametrize("dtype, hw", [(torch.float64, 100.0), (torch.float64, 1000.0), (torch.float32, 100.0)])
def test_average_acceleration_runs_at_any_step_on_a_stiff_oscillator(dtype, hw):
    """β = ¼ is unconditionally stable, but its Newton solve stopped on the residual, whose
    round-off is ε·βh²ω² relative: ConvergenceError from hω ≈ 50 (float64) and 30 (float32).
    Converged is now also Newton's correction within tol; the energy is kept to round-off."""
    w = 100.0
    osc = tgi.lagrangian.SecondOrderSystem.from_potential(lambda q: 0.5 * w * w * (q * q).sum(-1),
                                                          potential_grad=lambda q: w * w * q)
    q0, v0 = torch.tensor([1.0], dtype=dtype), torch.tensor([0.0], dtype=dtype)
    with torch.no_grad():
        q, v = tgi.rollout(osc, q0, v0, h=hw / w, steps=50, method="newmark_average_acceleration")
    E = 0.5 * v[-1] ** 2 + 0.5 * w * w * q[-1] ** 2
    assert float(E / (0.5 * w * w)) == pytest.approx(1.0, rel=1e-4 if dtype == torch.float32 else 1e-10)


def test_a_force_written_without_t_first_is_refused():
    """force(q, v) — the order of ForcedSystem's F(q, z) — was read as force(t=q, q=v): another
    system integrated without an error (-3.72 where the damped oscillator is at -0.85)."""
    for f in (lambda q, v: -q - 0.1 * v, lambda x, v, t: -x):
        with pytest.raises(TypeError, match="takes t first"):
            SecondOrderSystem(f)
    S = SecondOrderSystem(lambda t, q, v: -q - 0.1 * v)
    q, _ = tgi.rollout(S, torch.ones(1, 1), torch.zeros(1, 1), h=0.1, steps=30, method="sode_midpoint")
    assert abs(float(q[-1]) + 0.85) < 0.01
