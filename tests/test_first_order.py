"""First-order integrators from discretization maps, eq. (1): θ-methods, orders, invariants,
the sphere, gradients, batches, float32, errors."""
import math

import numpy as np
import pytest
import torch

import torchgeo_int as tgi
from maps_zoo import warped
from torchgeo_int.integrators.first_order import FIRST_ORDER_METHODS, FirstOrderIntegrator, theta


# -- problems ---------------------------------------------------------------------------------
def forced_pendulum(t, x):
    """A nonlinear, non-autonomous field on R²: the time placement t + αh is part of the order."""
    return torch.stack([x[..., 1], -torch.sin(x[..., 0]) + 0.5 * math.cos(1.3 * t)
                        - 0.1 * x[..., 1] ** 3], -1)


def forced_pendulum_reference(x0, T):
    from scipy.integrate import solve_ivp

    def f(t, y):
        return [y[1], -math.sin(y[0]) + 0.5 * math.cos(1.3 * t) - 0.1 * y[1] ** 3]

    sol = solve_ivp(f, (0.0, T), x0.tolist(), method="DOP853", rtol=1e-13, atol=1e-13)
    return torch.tensor(sol.y[:, -1])


INERTIA = torch.tensor([1.0, 2.0, 3.0])


def rigid_body(t, x):
    """Free rigid body ẋ = x × I⁻¹x: a tangent field on every sphere |x| = c; |x|² (Casimir) and
    xᵀI⁻¹x (energy) are quadratic invariants."""
    return torch.linalg.cross(x, x / INERTIA.to(x.dtype), dim=-1)


def normalize(x, v):
    """The normalisation retraction of the unit sphere, R_x(v) = (x + v)/|x + v|."""
    y = x + v
    return y / y.norm(dim=-1, keepdim=True)


def sphere_midpoint_inverse(x0, x1):
    """R_d⁻¹ of RetractionMap(normalize, ½) in closed form: x = (x₀+x₁)/|x₀+x₁|,
    v = 2(x₁−x₀)/|x₀+x₁| (|x ± v/2| = √(1+|v|²/4) because v ⊥ x)."""
    s = x0 + x1
    n = s.norm(dim=-1, keepdim=True)
    return s / n, 2 * (x1 - x0) / n


def unit(x):
    return x / x.norm(dim=-1, keepdim=True)


class GenericAlpha(tgi.DiscretizationMap):
    """The α-map forced through the generic (Newton on eq. (1')) code path."""

    def __init__(self, alpha):
        super().__init__()
        self.inner = tgi.AlphaMap(alpha)
        self.alpha = alpha

    def _forward(self, x, v):
        return self.inner._forward(x, v)

    @property
    def symmetric(self):
        return self.alpha == 0.5


def run(f, x0, h, steps, method, **kw):
    with torch.no_grad():
        return tgi.rollout(tgi.ODESystem(f), x0, h=h, steps=steps, method=method, **kw)


# -- eq. (1) on the α-family is the θ-method -----------------------------------------------------
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("solver", ["fixed_point", "newton"])
def test_alpha_map_reproduces_theta_method(alpha, solver):
    R = tgi.AlphaMap(alpha)
    m = FirstOrderIntegrator(R, solver=solver)
    x0 = torch.randn(5, 2)
    t, h = 0.7, 0.1
    sys = tgi.ODESystem(forced_pendulum)
    x1, none, _ = m.step(sys, x0, None, t, h)
    assert none is None
    theta_residual = (x1 - x0) / h - forced_pendulum(t + alpha * h, (1 - alpha) * x0 + alpha * x1)
    assert theta_residual.abs().max() < 1e-13
    # Eq. (1) itself, through the map's inverse: h X(τ(R⁻¹(x0, x1))) = R⁻¹(x0, x1).
    xb, v = R.inverse(x0, x1)
    assert (v - h * forced_pendulum(t + alpha * h, xb)).abs().max() < 1e-13


@pytest.mark.parametrize("form", ["base", "inverse"])
@pytest.mark.parametrize("alpha", [0.3, 0.5])
def test_generic_map_path_equals_theta_method(form, alpha):
    """Newton on eq. (1') (base point) or on eq. (1) via R.inverse, for a map outside the
    α-family code path, reproduces the closed-form θ-method."""
    x0 = torch.randn(4, 2)
    a = run(forced_pendulum, x0, 0.1, 5, theta(alpha))
    b = run(forced_pendulum, x0, 0.1, 5, FirstOrderIntegrator(GenericAlpha(alpha), form=form))
    assert (a - b).abs().max() < 1e-12


def test_nonlinear_map_solves_eq1():
    """A curved retraction on R² (nested Newton inverse): both forms solve eq. (1)."""
    R = tgi.RetractionMap(warped, 0.5)
    x0 = torch.randn(3, 2)
    t, h = 0.2, 0.1
    sys = tgi.ODESystem(forced_pendulum)
    outs = []
    for form in ("base", "inverse"):
        x1, _, _ = FirstOrderIntegrator(R, form=form).step(sys, x0, None, t, h)
        xb, v = R.inverse(x0, x1)
        assert (v - h * forced_pendulum(t + 0.5 * h, xb)).abs().max() < 1e-12
        outs.append(x1)
    assert (outs[0] - outs[1]).abs().max() < 1e-12


# -- orders -------------------------------------------------------------------------------------
def slope(errors, Ns):
    return -np.polyfit(np.log(Ns), np.log(errors), 1)[0]


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 1.0])
def test_measured_order_theta(alpha):
    x0 = torch.tensor([0.8, -0.3])
    T = 2.3
    ref = forced_pendulum_reference(x0, T)
    m = theta(alpha)
    Ns = [40, 80, 160, 320] if alpha != 0.5 else [20, 40, 80, 160]
    errs = [float((run(forced_pendulum, x0, T / N, N, m, save_every=N)[-1] - ref).norm())
            for N in Ns]
    assert abs(slope(errs, Ns) - m.order) < 0.15, (errs, m.order)
    assert m.order == (2 if alpha == 0.5 else 1)


@pytest.mark.parametrize("alpha", [0.5, 0.3])
def test_measured_order_on_the_sphere(alpha):
    """Rigid body on S² with the normalisation retraction: order 2 for α = ½, 1 otherwise."""
    from scipy.integrate import solve_ivp

    x0 = unit(torch.tensor([0.6, 0.3, 0.74]))
    T = 1.7
    I = INERTIA.numpy()
    sol = solve_ivp(lambda t, x: np.cross(x, x / I), (0.0, T), x0.numpy(), method="DOP853",
                    rtol=1e-13, atol=1e-13)
    ref = torch.tensor(sol.y[:, -1])
    m = FirstOrderIntegrator(tgi.RetractionMap(normalize, alpha))
    Ns = [16, 32, 64] if alpha == 0.5 else [32, 64, 128]
    errs = [float((run(rigid_body, x0, T / N, N, m, save_every=N)[-1] - ref).norm()) for N in Ns]
    assert abs(slope(errs, Ns) - m.order) < 0.2, errs


# -- invariants ---------------------------------------------------------------------------------
def test_midpoint_preserves_quadratic_invariants():
    n = 5
    U = torch.randn(n, n)
    A = U - U.T  # skew: |y| is invariant
    y0 = torch.randn(n)
    # Exact preservation holds for the exact solve; the solve's tolerance enters the invariant
    # as a slow drift (~ tol per step here), so ask for a solve at round-off.
    y = run(lambda t, y: y @ A.T, y0, 0.1, 1000, theta(0.5, tol=1e-15))
    assert (y.norm(dim=-1) - y0.norm()).abs().max() < 1e-12
    # The free rigid body: both quadratic invariants, in ambient coordinates.
    x0 = torch.tensor([0.6, 0.3, 0.74])
    x = run(rigid_body, x0, 0.05, 1000, FIRST_ORDER_METHODS["implicit_midpoint"])
    assert ((x * x).sum(-1) - (x0 * x0).sum()).abs().max() < 1e-12
    assert ((x * x / INERTIA).sum(-1) - (x0 * x0 / INERTIA).sum()).abs().max() < 1e-12
    # A non-symmetric θ does not preserve them (control: the check can fail).
    y = run(lambda t, y: y @ A.T, y0, 0.1, 200, theta(0.3))
    assert (y.norm(dim=-1) - y0.norm()).abs().max() > 1e-3


@pytest.mark.parametrize("alpha", [0.5, 0.3])
def test_sphere_retraction_keeps_unit_norm(alpha):
    """|x| = 1 to round-off over 10³ steps: x_{k+1} is a value of the retraction."""
    x0 = unit(torch.tensor([[0.6, 0.3, 0.74], [0.0, 1.0, 0.1]]))
    m = FirstOrderIntegrator(tgi.RetractionMap(normalize, alpha))
    x = run(rigid_body, x0, 0.05, 1000 if alpha == 0.5 else 300, m)
    assert (x.norm(dim=-1) - 1).abs().max() <= 1e-13
    # The trajectory moves (not a fixed point) and keeps the body's energy approximately.
    assert (x[-1] - x0).abs().max() > 0.1
    E = (x * x / INERTIA).sum(-1)
    assert (E - E[0]).abs().max() < 1e-2


def test_sphere_inverse_form_agrees_with_base_form():
    """Eq. (1) through the closed-form R_d⁻¹ of the sphere: the same steps as eq. (1')."""
    x0 = unit(torch.tensor([[0.6, 0.3, 0.74], [0.0, 1.0, 0.1]]))
    R = tgi.RetractionMap(normalize, 0.5, inverse=sphere_midpoint_inverse)
    a = run(rigid_body, x0, 0.05, 100, FirstOrderIntegrator(R, form="base"))
    b = run(rigid_body, x0, 0.05, 100, FirstOrderIntegrator(R, form="inverse"))
    assert (a - b).abs().max() < 1e-11
    xb, v = sphere_midpoint_inverse(b[:-1], b[1:])
    assert (v - 0.05 * rigid_body(0.0, xb)).abs().max() < 1e-13


def test_ambient_sphere_jacobian_needs_the_normal_term():
    """Why eq. (1') carries x − R¹(x, 0): without it the ambient Jacobian is singular."""
    R = tgi.RetractionMap(normalize, 0.5)
    x = unit(torch.tensor([0.6, 0.3, 0.74]))
    h = 0.05

    def plain(z):
        return R._forward(z, h * rigid_body(0.0, z))[0]

    def gauged(z):
        return plain(z) + z - R._forward(z, torch.zeros_like(z))[0]

    s_plain = torch.linalg.svdvals(torch.autograd.functional.jacobian(plain, x))
    s_gauged = torch.linalg.svdvals(torch.autograd.functional.jacobian(gauged, x))
    assert s_plain.min() < 1e-12 and s_gauged.min() > 0.5


# -- symmetry, adjoints, declared properties --------------------------------------------------------
def test_declared_properties_and_registry():
    assert set(FIRST_ORDER_METHODS) == {"explicit_euler", "implicit_euler", "implicit_midpoint"}
    for name, alpha in [("explicit_euler", 0.0), ("implicit_euler", 1.0), ("implicit_midpoint", 0.5)]:
        m = FIRST_ORDER_METHODS[name]
        assert m.first_order and not m.symplectic and m.alpha == alpha
        assert m.order == (2 if alpha == 0.5 else 1) and m.symmetric == (alpha == 0.5)
        assert m.adjoint().alpha == 1.0 - alpha
        assert tgi.get_method(name, first_order=True) is m
    sphere = FirstOrderIntegrator(tgi.RetractionMap(normalize, 0.5))
    assert sphere.order == 2 and sphere.symmetric
    assert FirstOrderIntegrator(tgi.RetractionMap(normalize, 0.3)).order == 1
    assert theta(0.3).adjoint().same_as(theta(0.7))


@pytest.mark.parametrize("name", ["theta0.3", "sphere0.3"])
def test_adjoint_method_is_inverse_of_reversed_step(name):
    """Φ*_h = Φ_{−h}⁻¹: a step of the adjoint with h, then the method with −h, returns."""
    if name == "theta0.3":
        m, f, x0 = theta(0.3), forced_pendulum, torch.tensor([[0.8, -0.3]])
    else:
        m, f, x0 = (FirstOrderIntegrator(tgi.RetractionMap(normalize, 0.3)), rigid_body,
                    unit(torch.tensor([[0.6, 0.3, 0.74]])))
    sys = tgi.ODESystem(f)
    x1, _, _ = m.adjoint().step(sys, x0, None, 0.4, 0.1)
    x2, _, _ = m.step(sys, x1, None, 0.5, -0.1)
    assert (x2 - x0).abs().max() < 1e-12


def test_symmetric_methods_are_time_reversible():
    for m, f, x0 in [(theta(0.5), forced_pendulum, torch.tensor([[0.8, -0.3]])),
                     (FirstOrderIntegrator(tgi.RetractionMap(normalize, 0.5)), rigid_body,
                      unit(torch.tensor([[0.6, 0.3, 0.74]])))]:
        sys = tgi.ODESystem(f)
        x1, _, _ = m.step(sys, x0, None, 0.4, 0.1)
        x2, _, _ = m.step(sys, x1, None, 0.5, -0.1)
        assert (x2 - x0).abs().max() < 1e-12


# -- gradients, batches, float32 ---------------------------------------------------------------------
@pytest.mark.parametrize("case", ["midpoint_fixed_point", "implicit_euler_newton", "sphere",
                                  "sphere_inverse"])
def test_gradcheck_through_implicit_steps(case):
    k = torch.tensor(0.7, requires_grad=True)

    if case.startswith("sphere"):
        def f(t, x):
            return torch.linalg.cross(x, x / INERTIA, dim=-1) * k
        inverse = sphere_midpoint_inverse if case == "sphere_inverse" else None
        m = FirstOrderIntegrator(tgi.RetractionMap(normalize, 0.5, inverse=inverse),
                                 form="inverse" if inverse else "base")
        x0 = unit(torch.tensor([[0.6, 0.3, 0.74]])).requires_grad_()
    else:
        def f(t, x):
            return torch.stack([x[..., 1], -k * torch.sin(x[..., 0]) * (1 + x[..., 1] ** 2)], -1)
        m = theta(0.5) if case == "midpoint_fixed_point" else theta(1.0, solver="newton")
        x0 = torch.tensor([[0.8, -0.3]], requires_grad=True)

    def traj(x0, kval):
        if not torch.equal(k, kval):  # an in-place change would invalidate saved graphs
            with torch.no_grad():
                k.copy_(kval)
        return tgi.rollout(tgi.ODESystem(f), x0, h=0.2, steps=3, method=m)

    k0 = k.detach().clone()
    assert torch.autograd.gradcheck(lambda x0: traj(x0, k0), (x0,))
    # The gradient to the field's parameter, against a central difference.
    (gk,) = torch.autograd.grad(traj(x0.detach(), k0).pow(2).sum(), k)
    eps = 1e-6
    with torch.no_grad():
        fd = float((traj(x0, k0 + eps).pow(2).sum() - traj(x0, k0 - eps).pow(2).sum()) / (2 * eps))
    assert abs(float(gk) - fd) < 1e-7 * max(1.0, abs(fd))


@pytest.mark.parametrize("method", ["implicit_midpoint", "implicit_euler", "sphere"])
def test_batch_is_per_sample(method):
    if method == "sphere":
        m, f = FirstOrderIntegrator(tgi.RetractionMap(normalize, 0.5)), rigid_body
        x0 = unit(torch.randn(2, 3, 3))
    else:
        m, f = FIRST_ORDER_METHODS[method], forced_pendulum
        x0 = torch.randn(2, 3, 2) * torch.tensor([[[0.1]], [[1.5]]])  # very different samples
    xb = run(f, x0, 0.1, 20, m)
    assert xb.shape == (21, *x0.shape)
    for i in range(2):
        for j in range(3):
            xs = run(f, x0[i, j], 0.1, 20, m)
            assert (xb[:, i, j] - xs).abs().max() < 1e-12


def test_float32():
    A = torch.tensor([[0.0, 1.0, -0.5], [-1.0, 0.0, 0.3], [0.5, -0.3, 0.0]], dtype=torch.float32)
    y0 = torch.tensor([1.0, 0.2, -0.4], dtype=torch.float32)
    y = run(lambda t, y: y @ A.T, y0, 0.1, 300, FIRST_ORDER_METHODS["implicit_midpoint"])
    assert y.dtype == torch.float32
    assert (y.norm(dim=-1) - y0.norm()).abs().max() < 1e-5
    x0 = unit(torch.tensor([[0.6, 0.3, 0.74]], dtype=torch.float32))
    x = run(rigid_body, x0, 0.05, 200, FirstOrderIntegrator(tgi.RetractionMap(normalize, 0.5)))
    assert x.dtype == torch.float32
    assert (x.norm(dim=-1) - 1).abs().max() < 1e-6


def test_warm_start_does_not_change_the_step():
    """The cached stage is only an initial guess: with and without it the step agrees."""
    m = theta(0.5)
    sys = tgi.ODESystem(forced_pendulum)
    x0 = torch.tensor([[0.8, -0.3]])
    _, _, cache = m.step(sys, x0, None, 0.0, 0.1)
    a, _, _ = m.step(sys, x0, None, 0.3, 0.1)
    b, _, _ = m.step(sys, x0, None, 0.3, 0.1, -5 * cache)
    assert (a - b).abs().max() < 1e-13


# -- errors -------------------------------------------------------------------------------------------
def test_bad_input_raises():
    with pytest.raises(TypeError, match="DiscretizationMap"):
        FirstOrderIntegrator(lambda x, v: x)
    with pytest.raises(ValueError, match="solver"):
        theta(0.5, solver="bisection")
    with pytest.raises(ValueError, match="form"):
        FirstOrderIntegrator(tgi.MidpointMap(), form="ambient")
    with pytest.raises(ValueError, match="backward"):
        theta(0.5, backward="adjoint")
    with pytest.raises(ValueError, match="max_iter"):
        theta(0.5, max_iter=0)
    with pytest.raises(ValueError, match="alpha"):
        theta(1.5)
    with pytest.raises(ValueError, match="unknown first-order method"):
        tgi.get_method("verlet", first_order=True)
    m, x0 = theta(0.5), torch.tensor([[0.8, -0.3]])
    with pytest.raises(ValueError, match="first-order"):
        m.step(tgi.ODESystem(forced_pendulum), x0, x0, 0.0, 0.1)
    with pytest.raises(TypeError, match="first-order systems"):
        m.step(tgi.Hamiltonian(lambda q, p: (q * p).sum(-1)), x0, None, 0.0, 0.1)
    with pytest.raises(ValueError, match="shape"):
        m.step(tgi.ODESystem(lambda t, x: x[..., :1]), x0, None, 0.0, 0.1)
    # rollout: a first-order method needs p0=None and vice versa.
    with pytest.raises(ValueError, match="first-order"):
        tgi.rollout(tgi.ODESystem(forced_pendulum), x0, x0, h=0.1, steps=2, method=m)
    with pytest.raises(ValueError, match="'verlet' is a Hamiltonian method"):   # by name as well
        tgi.rollout(tgi.ODESystem(forced_pendulum), x0, h=0.1, steps=2, method="verlet")
    with pytest.raises(ValueError, match="unknown first-order method"):
        tgi.rollout(tgi.ODESystem(forced_pendulum), x0, h=0.1, steps=2, method="no_such_method")
    with pytest.raises(ValueError, match="Hamiltonian method"):
        tgi.rollout(tgi.ODESystem(forced_pendulum), x0, h=0.1, steps=2, method=tgi.METHODS["verlet"])
    # by name, p0=None selects the first-order midpoint rule
    xs = tgi.rollout(tgi.ODESystem(forced_pendulum), x0, h=0.1, steps=2, method="implicit_midpoint")
    assert xs.shape == (3, 1, 2)


def test_nonconvergence_names_the_step():
    """A stiff linear system beyond the fixed point's contraction radius fails loudly; Newton
    (the stiff option) solves it."""
    lam = -200.0
    f = lambda t, x: lam * x  # noqa: E731
    x0 = torch.ones(1, 1)
    with pytest.raises(tgi.ConvergenceError, match="integrator step 0"):
        run(f, x0, 0.1, 3, theta(1.0, max_iter=30))
    x = run(f, x0, 0.1, 3, theta(1.0, solver="newton"))
    assert torch.allclose(x[-1], x0 / (1 - lam * 0.1) ** 3, rtol=1e-13, atol=0)
