"""Discretization maps (Sect. 2) and their lifts (Sect. 3): the properties every map must have."""
import pytest
import torch

import torchgeo_int as tgi
from maps_zoo import all_maps, base_maps, dim_of, warped

MAPS = all_maps()
CLOSED_FORM = {"forward_euler", "midpoint", "backward_euler", "alpha0.3", "T(alpha0.3)",
               "T*(alpha0.3)", "T(T(alpha0.3))"}


def point(R, batch=(4, 2), scale=0.3):
    m = dim_of(R)
    return torch.randn(*batch, m), scale * torch.randn(*batch, m)


@pytest.mark.parametrize("name", sorted(MAPS))
def test_definition_2_2(name):
    R = MAPS[name]
    x, _ = point(R)
    res = R.check(x)
    assert res["i"] < 1e-14 and res["ii"] < 1e-12, res


@pytest.mark.parametrize("name", sorted(MAPS))
def test_inverse_of_forward_is_identity(name):
    R = MAPS[name]
    x, v = point(R)
    x0, x1 = R(x, v)
    xr, vr = R.inverse(x0, x1)
    tol = 1e-12 if name in CLOSED_FORM else 1e-10
    assert torch.allclose(xr, x, atol=tol, rtol=0) and torch.allclose(vr, v, atol=tol, rtol=0)


@pytest.mark.parametrize("name", sorted(MAPS))
def test_adjoint(name):
    R = MAPS[name]
    x, v = point(R)
    Ra = R.adjoint()
    # The formula of Prop 2.5, and adjoint of adjoint = map.
    y0, y1 = Ra(x, v)
    z0, z1 = R(x, -v)
    assert torch.allclose(y0, z1, atol=1e-12) and torch.allclose(y1, z0, atol=1e-12)
    w0, w1 = Ra.adjoint()(x, v)
    u0, u1 = R(x, v)
    assert torch.allclose(w0, u0, atol=1e-12) and torch.allclose(w1, u1, atol=1e-12)
    # The adjoint is a discretization map with an inverse.
    xr, vr = Ra.inverse(y0, y1)
    assert torch.allclose(xr, x, atol=1e-10) and torch.allclose(vr, v, atol=1e-10)
    assert Ra.symmetric == R.symmetric


def _sphere_midpoint_inverse(x0, x1):
    # R_d⁻¹ of RetractionMap(normalize, ½): x = (x₀+x₁)/|x₀+x₁|, v = 2(x₁−x₀)/|x₀+x₁|
    n = (x0 + x1).norm(dim=-1, keepdim=True)
    return (x0 + x1) / n, 2 * (x1 - x0) / n


def _normalize(x, v):
    y = x + v
    return y / y.norm(dim=-1, keepdim=True)


def test_closed_inverse_is_checked_and_kept_by_the_adjoint():
    """A closed-form inverse given to RetractionMap is compared with the map on its first call (a
    form written for another α fails with the residual instead of stepping wrongly), and the
    adjoint keeps a closed form (it fell back to Newton before)."""
    linear = lambda x, v: x + v
    x0, x1 = torch.randn(4, 2, 3), torch.randn(4, 2, 3)
    wrong = tgi.RetractionMap(linear, 0.5, inverse=tgi.AlphaMap(0.3).inverse)
    with pytest.raises(ValueError, match=r"alpha=0.5\) is not the inverse of its map"):
        wrong.inverse(x0, x1)
    with pytest.raises(ValueError, match="not the inverse"):   # inside an integrator as well
        tgi.rollout(tgi.ODESystem(lambda t, x: -x), x0[0], h=0.1, steps=2,
                    method=tgi.FirstOrderIntegrator(wrong, form="inverse"))
    shape = tgi.RetractionMap(linear, 0.3, inverse=lambda a, b: (a, b))   # (x, v) of one point
    with pytest.raises(ValueError, match="not the inverse"):
        shape.inverse(x0, x1)
    for R in (tgi.RetractionMap(linear, 0.3, inverse=tgi.AlphaMap(0.3).inverse),
              tgi.RetractionMap(_normalize, 0.5, inverse=_sphere_midpoint_inverse)):
        Ra = R.adjoint()
        assert Ra.has_closed_inverse and Ra.base_fraction == pytest.approx(1 - R.alpha)
        assert Ra.adjoint().alpha == pytest.approx(R.alpha) and Ra.retraction is R.retraction
        x = x0 / x0.norm(dim=-1, keepdim=True)
        v = 0.3 * torch.linalg.cross(x, torch.randn_like(x), dim=-1)   # tangent to the sphere
        y0, y1 = Ra(x, v)
        xr, vr = Ra.inverse(y0, y1)
        assert torch.allclose(xr, x, atol=1e-13) and torch.allclose(vr, v, atol=1e-13)


@pytest.mark.parametrize("alpha", [0.0, 0.25, 0.5, 0.8, 1.0])
def test_alpha_map_formulas(alpha):
    R = tgi.AlphaMap(alpha)
    x, v = torch.randn(5, 3), torch.randn(5, 3)
    x0, x1 = R(x, v)
    assert torch.equal(x0, x - alpha * v) and torch.equal(x1, x + (1 - alpha) * v)
    Ra = R.adjoint()
    assert isinstance(Ra, tgi.AlphaMap) and Ra.alpha == 1 - alpha
    assert R.symmetric == (alpha == 0.5)
    xa, va = R.inverse(x0, x1)
    assert torch.allclose(xa, (1 - alpha) * x0 + alpha * x1) and torch.allclose(va, x1 - x0)


def test_named_maps():
    assert tgi.ForwardEulerMap().alpha == 0.0 and tgi.MidpointMap().alpha == 0.5
    assert tgi.BackwardEulerMap().alpha == 1.0 and tgi.MidpointMap().symmetric
    assert not tgi.ForwardEulerMap().symmetric
    assert tgi.RetractionMap(warped, 0.5).symmetric and not tgi.RetractionMap(warped, 0.3).symmetric


@pytest.mark.parametrize("name", sorted(base_maps()))
def test_tangent_lift_is_jvp(name):
    R = base_maps()[name]
    q, qd, v, vd = (0.5 * torch.randn(6, 3) for _ in range(4))
    (a0, a1), (b0, b1) = torch.func.jvp(lambda x, u: R(x, u), (q, qd), (v, vd))
    x0, x1 = tgi.TangentLift(R)(torch.cat([q, v], -1), torch.cat([qd, vd], -1))
    assert torch.allclose(x0, torch.cat([a0, b0], -1), atol=1e-14)
    assert torch.allclose(x1, torch.cat([a1, b1], -1), atol=1e-14)


def test_tangent_lift_of_alpha_map_is_example_3_1():
    a = 0.3
    q, v, qd, vd = (torch.randn(4, 2) for _ in range(4))
    x0, x1 = tgi.TangentLift(tgi.AlphaMap(a))(torch.cat([q, v], -1), torch.cat([qd, vd], -1))
    assert torch.allclose(x0, torch.cat([q - a * qd, v - a * vd], -1))
    assert torch.allclose(x1, torch.cat([q + (1 - a) * qd, v + (1 - a) * vd], -1))


def test_cotangent_lift_of_alpha_map_has_crossed_weights():
    a = 0.3
    q, p, qd, pd = (torch.randn(4, 2) for _ in range(4))
    x0, x1 = tgi.CotangentLift(tgi.AlphaMap(a))(torch.cat([q, p], -1), torch.cat([qd, pd], -1))
    assert torch.allclose(x0, torch.cat([q - a * qd, p - (1 - a) * pd], -1))
    assert torch.allclose(x1, torch.cat([q + (1 - a) * qd, p + a * pd], -1))


def _omega(n):
    I, Z = torch.eye(n), torch.zeros(n, n)
    return torch.cat([torch.cat([Z, I], 1), torch.cat([-I, Z], 1)], 0)  # dq∧dp


@pytest.mark.parametrize("name", ["alpha0.3", "midpoint", "generic_alpha0.3", "retraction_mid",
                                  "retraction_0.2", "adjoint_retraction_0.2"])
def test_cotangent_lift_is_symplectomorphism(name):
    """Jᵀ diag(−J₀, J₀) J = W, W the matrix of dq∧dṗ + dq̇∧dp (Props 3.3–3.5)."""
    n = 2
    RC = tgi.CotangentLift(base_maps()[name])

    def f(z):
        x0, x1 = RC(z[:2 * n], z[2 * n:])
        return torch.cat([x0, x1])

    z = 0.5 * torch.randn(4 * n)
    J = torch.autograd.functional.jacobian(f, z)
    J0 = _omega(n)
    target = torch.block_diag(-J0, J0)
    # Coordinates of TT*Q are (q, p, q̇, ṗ); dq∧dṗ + dq̇∧dp pairs q with ṗ and q̇ with p.
    I, Z = torch.eye(n), torch.zeros(n, n)
    W = torch.cat([torch.cat([Z, Z, Z, I], 1), torch.cat([Z, Z, -I, Z], 1),
                   torch.cat([Z, I, Z, Z], 1), torch.cat([-I, Z, Z, Z], 1)], 0)
    assert (J.T @ target @ J - W).abs().max() < 1e-10


def test_naive_theta_cotangent_map_is_not_symplectic():
    """Control: weighting q and p alike (the θ-method pitfall) fails the same check."""
    n, a = 2, 0.3

    def f(z):
        q, p, qd, pd = z.split(n)
        return torch.cat([q - a * qd, p - a * pd, q + (1 - a) * qd, p + (1 - a) * pd])

    J = torch.autograd.functional.jacobian(f, torch.randn(4 * n))
    J0 = _omega(n)
    I, Z = torch.eye(n), torch.zeros(n, n)
    W = torch.cat([torch.cat([Z, Z, Z, I], 1), torch.cat([Z, Z, -I, Z], 1),
                   torch.cat([Z, I, Z, Z], 1), torch.cat([-I, Z, Z, Z], 1)], 0)
    assert (J.T @ torch.block_diag(-J0, J0) @ J - W).abs().max() > 0.1


@pytest.mark.parametrize("name", ["retraction_0.2", "alpha0.3"])
def test_lifts_commute_with_adjoint(name):
    R = base_maps()[name]
    x, v = torch.randn(3, 4), 0.3 * torch.randn(3, 4)
    for Lift in (tgi.TangentLift, tgi.CotangentLift):
        a = Lift(R).adjoint()(x, v)
        b = tgi.AdjointMap(Lift(R))(x, v)
        assert all(torch.allclose(u, w, atol=1e-12) for u, w in zip(a, b))


def test_batch_shapes_and_dtypes():
    R = tgi.CotangentLift(tgi.RetractionMap(warped, 0.5))
    for shape in [(6,), (2, 6), (2, 3, 6)]:
        x0, x1 = R(torch.randn(shape), 0.2 * torch.randn(shape))
        assert x0.shape == shape and x1.shape == shape
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(4, 3, dtype=dtype)
        for Rm in (tgi.AlphaMap(0.3), tgi.RetractionMap(warped, 0.5)):
            y0, y1 = Rm(x, 0.1 * x)
            assert y0.dtype == dtype and y1.dtype == dtype
            xr, vr = Rm.inverse(y0, y1)
            assert xr.dtype == dtype
            assert torch.allclose(xr, x, atol=1e-5 if dtype == torch.float32 else 1e-12)


def test_retraction_inverse_is_differentiable():
    R = tgi.RetractionMap(warped, 0.5)
    x0 = torch.randn(3, 2, requires_grad=True)
    x1 = (x0 + 0.2 * torch.randn(3, 2)).detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: R.inverse(a, b), (x0, x1))


def test_bad_input_raises():
    R = tgi.AlphaMap(0.5)
    with pytest.raises(TypeError, match="torch.Tensor"):
        R([1.0], torch.zeros(1))
    with pytest.raises(ValueError, match="same shape"):
        R(torch.zeros(2, 3), torch.zeros(2, 2))
    with pytest.raises(TypeError, match="dtype"):
        R(torch.zeros(3), torch.zeros(3, dtype=torch.float32))
    with pytest.raises(ValueError, match="even"):
        tgi.CotangentLift(R)(torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        tgi.AlphaMap(1.5)
    with pytest.raises(TypeError):
        tgi.TangentLift(lambda x, v: x)
    with pytest.raises(TypeError):
        tgi.RetractionMap("not callable")


# -- review 2026-12-05: subclasses, bundles, bad points --------------------------------------------
def _retr(x, v):
    return x + v + 0.3 * torch.sin(x) * v * v


class _TwoRetractions(tgi.RetractionMap):
    """A RetractionMap subclass with its own map (R_x(−αv), x + (1−α)v): a discretization map
    (Def 2.2 holds), but not RetractionMap(1 − α)'s adjoint, and not symmetric at α = ½."""
    def _forward(self, x, v):
        a = self.alpha
        return self.retraction(x, -a * v), x + (1 - a) * v


def test_an_alpha_map_subclass_cannot_change_the_formula():
    # AlphaMap's closed forms (inverse, DR_d, adjoint, the integrators' α steps) would be wrong
    with pytest.raises(TypeError, match="subclass DiscretizationMap"):
        class Shifted(tgi.AlphaMap):
            def _forward(self, x, v):
                return x - 0.5 * v + v * v, x + 0.5 * v + v * v


@pytest.mark.parametrize("R", [_TwoRetractions(_retr, 0.3), _TwoRetractions(_retr, 0.5)],
                         ids=["retraction0.3", "retraction0.5"])
def test_a_subclass_with_its_own_map_gets_the_adjoint_of_prop_2_5(R):
    """adjoint() and symmetric assumed the parent's formula for a subclass overriding _forward:
    the adjoint was RetractionMap(1 − α) (wrong by 5e-3), and at α = ½ the map was declared
    symmetric (order 2 declared, 1 measured)."""
    x, v = torch.randn(5, 2), 0.4 * torch.randn(5, 2)
    y0, y1 = R.adjoint()(x, v)
    z0, z1 = R(x, -v)
    assert torch.allclose(y0, z1, atol=1e-14) and torch.allclose(y1, z0, atol=1e-14)
    assert not R.symmetric
    I = tgi.CotangentLiftIntegrator(R)
    assert I.order == 1
    H = tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1) + (1 - torch.cos(q)).sum(-1))
    q, p = torch.tensor([[0.4, -0.2]]), torch.tensor([[0.1, 0.3]])
    q1, p1, _ = I.step(H, q, p, 0.0, 0.1)
    q2, p2, _ = I.adjoint().step(H, q1, p1, 0.1, -0.1)   # Φ*₋ₕ ∘ Φₕ = id
    assert torch.allclose(q2, q, atol=1e-12) and torch.allclose(p2, p, atol=1e-12)


def test_adjoint_keeps_a_raised_newton_limit():
    R = tgi.RetractionMap(_retr, 0.3)
    R.newton_max_iter = 500
    assert R.adjoint().newton_max_iter == 500
    assert tgi.TangentLift(R).adjoint().base.newton_max_iter == 500


def test_bundle_maps_refuse_odd_points_and_bad_points_are_named():
    N = tgi.NewmarkMap(0.5, 0.1, 0.1)
    for M in (N, tgi.AdjointMap(N)):   # the adjoint lost `bundle`: (3,) in, (4,) out
        with pytest.raises(ValueError, match="even"):
            M(torch.ones(3), torch.ones(3))
    H = tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1) + 0.5 * (q * q).sum(-1))
    I = tgi.CotangentLiftIntegrator(tgi.CotangentLift(tgi.AlphaMap(0.3)))
    with pytest.raises(ValueError, match="q0 is a point of a tangent/cotangent bundle"):
        tgi.rollout(H, torch.ones(1, 3), torch.ones(1, 3), h=0.1, steps=1, method=I)
    R = tgi.RetractionMap(_retr, 0.3)
    x = torch.randn(2, 2)
    bad = x.clone()
    bad[0, 1] = float("nan")
    with pytest.raises(ValueError, match="x0 contains NaN"):   # Newton's "too far apart" before
        R.inverse(bad, x)
    with pytest.raises(ValueError, match="v contains NaN"):
        R(x, bad)
    with pytest.raises(TypeError, match="real floating-point"):
        tgi.TangentLift(R)(x.to(torch.complex128), x.to(torch.complex128))
    with torch.inference_mode():
        with pytest.raises(RuntimeError, match="inference_mode.*no_grad"):
            tgi.TangentLift(R)(torch.randn(2, 4), torch.randn(2, 4))
    assert R.check(torch.zeros(0, 2)) == {"i": 0.0, "ii": 0.0}


def test_a_retraction_that_returns_another_shape_is_refused():
    """R_x(v) is a point of x's shape: a retraction that reduced it ran silently ((4,) tensors)
    and, in a rollout, surfaced as Newton's "too far apart"."""
    R = tgi.RetractionMap(lambda x, v: (x + v).sum(-1), alpha=0.5)
    with pytest.raises(ValueError, match=r"returned \(4,\) for points x of shape \(4, 2\)"):
        R(torch.randn(4, 2), torch.randn(4, 2))
