"""Holonomic constraints (torchgeo_int.constraints): RATTLE and the constrained variational
integrators keep g(q) = 0 and G M⁻¹p = 0 at every step, are symplectic on T*N (restricted two-form
by autograd), have order 2, keep the energy bounded, agree with the sphere's closed-form RATTLE,
and refuse constraints whose Jacobian lost rank."""
import math

import pytest
import torch

import torchgeo_int as tgi
from torchgeo_int.constraints import ConstrainedSystem, ConstraintRankError, Rattle
from torchgeo_int.solvers import default_tol

DT = torch.float64
METHODS = list(tgi.CONSTRAINED_METHODS)


def cartesian_pendulum(length=1.0, gravity=1.0):
    L = tgi.Lagrangian.mechanical(lambda q: gravity * q[..., 1])
    return ConstrainedSystem(L, lambda q: 0.5 * ((q * q).sum(-1, keepdim=True) - length ** 2))


def pendulum_state(theta, omega, length=1.0):
    th = torch.as_tensor(theta, dtype=DT)
    q = length * torch.stack([torch.sin(th), -torch.cos(th)], -1)
    p = length * torch.as_tensor(omega, dtype=DT).unsqueeze(-1) * torch.stack([torch.cos(th), torch.sin(th)], -1)
    return q, p


def double_pendulum(l1=1.0, l2=0.8, m1=1.0, m2=0.7):
    mass = torch.tensor([m1, m1, m2, m2], dtype=DT)
    L = tgi.Lagrangian.mechanical(lambda q: m1 * q[..., 1] + m2 * q[..., 3], mass=mass)

    def g(q):
        a, b = q[..., :2], q[..., 2:]
        return 0.5 * torch.stack([(a * a).sum(-1) - l1 ** 2, ((b - a) ** 2).sum(-1) - l2 ** 2], -1)
    S = ConstrainedSystem(L, g)
    th1, th2 = torch.tensor([0.7, -0.4], dtype=DT), torch.tensor([1.5, 0.3], dtype=DT)
    a = l1 * torch.stack([torch.sin(th1), -torch.cos(th1)], -1)
    b = a + l2 * torch.stack([torch.sin(th2), -torch.cos(th2)], -1)
    q = torch.cat([a, b], -1)
    p = S.project_momentum(q, torch.tensor([[0.3, -0.2, 0.5, 0.4], [-0.6, 0.1, 0.2, 0.3]], dtype=DT))
    return S, q, p


def four_bar(l1=1.0, l2=2.0, l3=1.5, d=2.5):
    """Crank AB (A = 0), coupler BC, rocker CD (D = (d, 0)): q = (B, C) ∈ R⁴, three constraints,
    one degree of freedom; point masses at B and C under gravity."""
    D = torch.tensor([d, 0.0], dtype=DT)
    L = tgi.Lagrangian.mechanical(lambda q: q[..., 1] + q[..., 3], mass=torch.tensor([1.0, 1.0, 0.5, 0.5], dtype=DT))

    def g(q):
        B, C = q[..., :2], q[..., 2:]
        return 0.5 * torch.stack([(B * B).sum(-1) - l1 ** 2, ((C - B) ** 2).sum(-1) - l2 ** 2,
                                  ((C - D) ** 2).sum(-1) - l3 ** 2], -1)
    S = ConstrainedSystem(L, g)
    th = torch.tensor([1.0, 2.0], dtype=DT)
    B = l1 * torch.stack([torch.cos(th), torch.sin(th)], -1)
    # C: the upper intersection of the circles |C − B| = l2 and |C − D| = l3
    e = D - B
    dist = e.norm(dim=-1, keepdim=True)
    x = (l2 ** 2 - l3 ** 2 + dist ** 2) / (2 * dist)
    y = torch.sqrt(l2 ** 2 - x ** 2)
    u = e / dist
    C = B + x * u + y * torch.stack([-u[..., 1], u[..., 0]], -1)
    q = torch.cat([B, C], -1)
    p = S.project_momentum(q, torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, -1.5, 0.3, 0.0]], dtype=DT))
    return S, q, p


def systems():
    S = cartesian_pendulum()
    q, p = pendulum_state([0.5, 2.0], [0.3, -0.5])
    return {"pendulum": (S, q, p), "double_pendulum": double_pendulum(), "four_bar": four_bar()}


# -- the constraints hold at every step ---------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", ["pendulum", "double_pendulum", "four_bar"])
def test_constraint_and_hidden_constraint_every_step(method, name):
    S, q0, p0 = systems()[name]
    q, p = tgi.rollout(S, q0, p0, h=0.1, steps=20, method=tgi.CONSTRAINED_METHODS[method])
    assert float(S.constraint(q).abs().max()) < 1e-12
    assert float(S.hidden(q, p).abs().max()) < 1e-12
    E = S.energy(q, p)
    assert float((E - E[0]).abs().max()) < 1e-2 * (1 + float(E[0].abs().max()))
    assert float((q[-1] - q0).abs().max()) > 0.05        # it moved


def test_rattle_equals_the_sphere_closed_form_rattle():
    from torchgeo_int.manifolds.integrators import Rattle as SphereRattle
    from torchgeo_int.manifolds.sphere import project_state
    from torchgeo_int.manifolds.systems import SphericalPendulum
    sp = SphericalPendulum(mass=1.3, length=1.0, gravity=2.0)
    g = torch.Generator().manual_seed(0)
    q0, p0 = project_state(torch.randn(4, 3, generator=g, dtype=DT), torch.randn(4, 3, generator=g, dtype=DT))
    S = ConstrainedSystem(tgi.Lagrangian.mechanical(lambda q: sp.c * q[..., 2], mass=sp.M),
                          lambda q: 0.5 * ((q * q).sum(-1, keepdim=True) - 1.0))
    a = tgi.rollout(sp, q0, p0, h=0.05, steps=30, method=SphereRattle())
    for method in ("rattle", "constrained_variational_verlet"):
        b = tgi.rollout(S, q0, p0, h=0.05, steps=30, method=tgi.CONSTRAINED_METHODS[method])
        assert float((a[0] - b[0]).abs().max()) < 1e-12 and float((a[1] - b[1]).abs().max()) < 1e-12


# -- symplecticity on T*N ------------------------------------------------------------------------
def _restricted_form_defect(S, step, q, p):
    """max |Bᵀ(DΦᵀΩDΦ − Ω)B| for a basis B of T_{(q,p)}T*N (null space of the linearised
    constraints g = 0, G M⁻¹p = 0), DΦ by autograd through the step (Newton's implicit backward)."""
    n = q.shape[-1]
    x = torch.cat([q, p], -1)

    def Phi(x):
        q1, p1 = step(x[:n].unsqueeze(0), x[n:].unsqueeze(0))
        return torch.cat([q1[0], p1[0]])

    def cons(x):
        qq, pp = x[:n].unsqueeze(0), x[n:].unsqueeze(0)
        return torch.cat([S.constraint(qq)[0], S.hidden(qq, pp)[0]])

    J = torch.autograd.functional.jacobian(Phi, x)
    A = torch.autograd.functional.jacobian(cons, x)
    _, s, Vh = torch.linalg.svd(A)
    B = Vh[A.shape[0]:].T                                  # 2n × 2(n − m)
    I = torch.eye(n, dtype=DT)
    Om = torch.cat([torch.cat([0 * I, I], 1), torch.cat([-I, 0 * I], 1)], 0)
    lhs, rhs = B.T @ J.T @ Om @ J @ B, B.T @ Om @ B
    return float((lhs - rhs).abs().max()), float(rhs.abs().max())


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", ["pendulum", "double_pendulum", "four_bar"])
def test_symplectic_on_the_constraint_manifold(method, name):
    S, q, p = systems()[name]
    M = tgi.CONSTRAINED_METHODS[method]
    defect, scale = _restricted_form_defect(S, lambda q, p: M(S, q, p, 0.0, 0.1), q[0], p[0])
    assert scale > 0.1 and defect < 1e-10


def test_symplecticity_check_detects_a_non_symplectic_projection():
    """The same check on SHAKE-less 'Euler then project' fails: the test can fail."""
    S, q, p = systems()["double_pendulum"]

    def euler_project(q, p):
        q1 = q + 0.1 * S.mass_solve(p)
        # back onto g = 0 by a few Newton steps along Gᵀ, then project the momentum
        for _ in range(20):
            G = S.jacobian(q1)
            lam = torch.linalg.solve(G @ G.mT, S.constraint(q1).unsqueeze(-1))
            q1 = q1 - (G.mT @ lam).squeeze(-1)
        p1 = p - 0.1 * S.lagrangian.grad_V(q)
        return q1, S.project_momentum(q1, p1)
    defect, _ = _restricted_form_defect(S, euler_project, q[0], p[0])
    assert defect > 1e-3


# -- order 2 --------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_order_two_cartesian_pendulum(method):
    from scipy.integrate import solve_ivp
    S = cartesian_pendulum()
    th0, om0, T = 1.2, 0.0, 1.0
    ref = solve_ivp(lambda t, x: [x[1], -math.sin(x[0])], (0, T), [th0, om0], method="DOP853",
                    rtol=1e-13, atol=1e-13).y[:, -1]
    qe, pe = pendulum_state([ref[0]], [ref[1]])
    q0, p0 = pendulum_state([th0], [om0])
    errs = []
    for h in (0.1, 0.05, 0.025):
        q, p = tgi.rollout(S, q0, p0, h=h, steps=round(T / h), method=tgi.CONSTRAINED_METHODS[method])
        errs.append(float(torch.cat([q[-1] - qe, p[-1] - pe], -1).abs().max()))
    rates = [math.log2(a / b) for a, b in zip(errs, errs[1:])]
    assert min(rates) > 1.85, rates


# -- long time ------------------------------------------------------------------------------------
def test_energy_bounded_long_run():
    """300 RATTLE steps of h = 0.4 (t = 120, ~15 periods) of the Cartesian pendulum: the energy
    error oscillates at O(h²) with no drift (10⁵ steps: experiments/constraints_longtime.py)."""
    S = cartesian_pendulum()
    q0, p0 = pendulum_state([0.5, 1.5, 2.5], [0.0, 0.0, 0.0])
    with torch.no_grad():
        q, p = tgi.rollout(S, q0, p0, h=0.4, steps=300, method=Rattle())
    err = (S.energy(q, p) - S.energy(q0, p0)).abs().amax(-1)
    first, last = float(err[:75].max()), float(err[-75:].max())
    assert last < 1.3 * first and first < 0.15
    assert float(S.constraint(q).abs().max()) < 1e-12


# -- gradients ------------------------------------------------------------------------------------
def test_gradients_through_the_multipliers():
    """d q_K / d(length) through RATTLE's Newton solves equals finite differences."""
    ell = torch.tensor(1.0, dtype=DT, requires_grad=True)
    L = tgi.Lagrangian.mechanical(lambda q: q[..., 1])

    def system(l):
        return ConstrainedSystem(L, lambda q: 0.5 * ((q * q).sum(-1, keepdim=True) - l ** 2))
    q0, p0 = pendulum_state([0.7], [0.2])
    q, _ = tgi.rollout(system(ell), q0 * ell, p0, h=0.1, steps=10, method=Rattle())
    (g,) = torch.autograd.grad(q[-1].sum(), ell)

    def val(l):
        with torch.no_grad():
            return float(tgi.rollout(system(l), q0 * l, p0, h=0.1, steps=10, method=Rattle())[0][-1].sum())
    e = 1e-6
    assert abs(float(g) - (val(1 + e) - val(1 - e)) / (2 * e)) < 1e-6


# -- bad input ------------------------------------------------------------------------------------
def test_rank_deficient_constraints_are_refused():
    L = tgi.Lagrangian.mechanical(lambda q: q[..., 1])
    q0, p0 = pendulum_state([0.5], [0.0])
    twice = ConstrainedSystem(L, lambda q: torch.cat([(q * q).sum(-1, keepdim=True) - 1] * 2, -1))
    squared = ConstrainedSystem(L, lambda q: ((q * q).sum(-1, keepdim=True) - 1) ** 2)
    for S in (twice, squared):
        for method in METHODS:
            with pytest.raises(ConstraintRankError, match="lost rank"):
                tgi.rollout(S, q0, p0, h=0.1, steps=2, method=tgi.CONSTRAINED_METHODS[method])
    # rank lost along the way: a step that reaches a singular configuration
    S = cartesian_pendulum()
    with pytest.raises(ConstraintRankError):
        S.project_momentum(torch.zeros(1, 2, dtype=DT), p0)


def test_bad_states_and_systems_are_refused():
    S = cartesian_pendulum()
    q0, p0 = pendulum_state([0.5], [0.3])
    with pytest.raises(ValueError, match="T\\*N"):
        tgi.rollout(S, 1.1 * q0, p0, h=0.1, steps=1, method=Rattle())
    with pytest.raises(ValueError, match="T\\*N"):
        tgi.rollout(S, q0, p0 + q0, h=0.1, steps=1, method=Rattle())
    bad = ConstrainedSystem(tgi.Lagrangian.mechanical(lambda q: q[..., 1]), lambda q: (q * q).sum(-1))
    with pytest.raises(ValueError, match="\\(\\.\\.\\., m\\)"):
        tgi.rollout(bad, q0, p0, h=0.1, steps=1, method=Rattle())
    with pytest.raises(TypeError, match="MechanicalLagrangian"):
        ConstrainedSystem(tgi.Lagrangian(lambda q, v: (v * v).sum(-1)), lambda q: q)
    with pytest.raises(TypeError, match="ConstrainedSystem"):
        tgi.rollout(tgi.Lagrangian.mechanical(lambda q: q[..., 1]), q0, p0, h=0.1, steps=1, method=Rattle())


# -- review fixes (2026-12-05): units, scaled constraints, NaN ------------------------------------
@pytest.mark.parametrize("dtype,k", [(torch.float64, 1e9), (torch.float32, 1e3)])
def test_constrained_steps_do_not_depend_on_the_units_of_mass(dtype, k):
    # the same motion with every mass × k: Newton's tests compared a momentum residual (RATTLE's
    # impulse ν, the variational Legendre equation) with velocity-sized tolerances and failed or
    # held g only to tol·|ν|
    out = {}
    for scale in (1.0, k):
        L = tgi.Lagrangian.mechanical(lambda q: scale * q[..., 1], mass=torch.tensor(scale, dtype=dtype))
        S = ConstrainedSystem(L, lambda q: (q * q).sum(-1, keepdim=True) - 1)
        th = torch.tensor([0.5], dtype=dtype)
        q0 = torch.stack([th.sin(), -th.cos()], -1)
        p0 = scale * 0.3 * torch.stack([th.cos(), th.sin()], -1)
        for name, method in tgi.CONSTRAINED_METHODS.items():
            q, p = tgi.rollout(S, q0, p0, h=0.05, steps=40, method=method)
            out[name, scale] = q
            # to the solver's tolerance (5e-14 / 1.3e-6); before: 7.7e-6 for RATTLE at k = 1e9 in
            # float64, and ConvergenceError for the variational ones
            assert ((q * q).sum(-1) - 1).abs().max() < 20 * default_tol(dtype)
    for name in tgi.CONSTRAINED_METHODS:
        assert torch.allclose(out[name, 1.0], out[name, k], atol=100 * default_tol(dtype))


def test_scaled_but_independent_constraints_are_not_a_rank_loss():
    # a planar pendulum in R³: |q|² = 1 and s·q_z = 0 have orthogonal gradients for any s; the
    # Gram G M⁻¹ Gᵀ's condition s² is a scaling, not a rank loss (it is equilibrated now)
    L = tgi.Lagrangian.mechanical(lambda q: q[..., 1])
    for s in (1e4, 1e7):
        S = ConstrainedSystem(L, lambda q: torch.stack([0.5 * ((q * q).sum(-1) - 1), s * q[..., 2]], -1))
        q0 = torch.tensor([[0.6, -0.8, 0.0]], dtype=DT)
        p0 = torch.tensor([[0.8, 0.6, 0.0]], dtype=DT)
        q, p = tgi.rollout(S, q0, p0, h=0.05, steps=20, method=Rattle())
        assert ((q * q).sum(-1) - 1).abs().max() < 1e-13 and q[..., 2].abs().max() < 1e-15


def test_nan_constraints_empty_constraints_and_variable_steps_are_refused():
    L = tgi.Lagrangian.mechanical(lambda q: q[..., 1])
    q0, p0 = pendulum_state([0.5], [0.3])
    nan = ConstrainedSystem(L, lambda q: (q * q).sum(-1, keepdim=True) - 1 + float("nan"))
    with pytest.raises(ValueError, match="T\\*N"):          # NaN compared False with the tolerance
        nan.check_state(q0, p0)
    empty = ConstrainedSystem(L, lambda q: q[..., :0])
    with pytest.raises(ValueError, match="m = 0"):
        tgi.rollout(empty, q0, p0, h=0.1, steps=1, method=Rattle())
    with pytest.raises(ValueError, match="ConstrainedSystem"):
        tgi.rollout(cartesian_pendulum(), q0, p0, h=0.1, steps=2, method=Rattle(),
                    step_control=lambda q: torch.ones(q.shape[:-1], dtype=DT))


def test_constrained_midpoint_on_a_nonlinear_potential_is_its_own_second_order_symplectic_method():
    # with a linear potential (every system above) the constrained midpoint rule and RATTLE take
    # the same step; here they differ, and the midpoint rule is still order 2 and symplectic on T*N
    L = tgi.Lagrangian.mechanical(lambda q: q[..., 1] + 0.5 * q[..., 0] ** 4)
    S = ConstrainedSystem(L, lambda q: 0.5 * ((q * q).sum(-1, keepdim=True) - 1.0))
    q0, p0 = pendulum_state([1.0], [0.3])
    mid = tgi.CONSTRAINED_METHODS["constrained_midpoint"]
    a = tgi.rollout(S, q0, p0, h=0.1, steps=10, method=mid)[0][-1]
    b = tgi.rollout(S, q0, p0, h=0.1, steps=10, method=Rattle())[0][-1]
    assert float((a - b).abs().max()) > 1e-5
    defect, scale = _restricted_form_defect(S, lambda q, p: mid(S, q, p, 0.0, 0.1), q0[0], p0[0])
    assert scale > 0.1 and defect < 1e-10
    ref = tgi.rollout(S, q0, p0, h=1e-3, steps=1000, method=Rattle(), save_every=1000)
    errs = [float(torch.cat([x[-1] - r[-1] for x, r in zip(
        tgi.rollout(S, q0, p0, h=h, steps=round(1 / h), method=mid, save_every=round(1 / h)), ref)],
        -1).abs().max()) for h in (0.1, 0.05, 0.025)]
    rates = [math.log2(e1 / e2) for e1, e2 in zip(errs, errs[1:])]
    assert min(rates) > 1.85, rates


def test_initial_state_checks_are_unit_free_and_reach_compositions():
    """A non-tangent p0 passed with a heavy mass (G M⁻¹p, a velocity, was compared with |p|), and
    a Composition of Rattle steps projected an off-manifold start silently; a
    ConstrainedVariationalIntegrator over triple-jump fractions declared order 4 (measured 2)."""
    th = torch.tensor([0.5], dtype=DT)
    q0 = torch.stack([th.sin(), -th.cos()], -1)
    v0 = 0.3 * torch.stack([th.cos(), th.sin()], -1) + 0.3 * q0          # 0.3 off the tangent
    for k in (1.0, 1e9):
        L = tgi.Lagrangian.mechanical(lambda q: k * q[..., 1], mass=torch.tensor(k, dtype=DT))
        S = ConstrainedSystem(L, lambda q: 0.5 * ((q * q).sum(-1, keepdim=True) - 1))
        with pytest.raises(ValueError, match="must lie on T\\*N"):
            tgi.rollout(S, q0, k * v0, h=0.05, steps=3, method=Rattle())
    S = ConstrainedSystem(tgi.Lagrangian.mechanical(lambda q: q[..., 1]),
                          lambda q: 0.5 * ((q * q).sum(-1, keepdim=True) - 1))
    g1 = 1 / (2 - 2 ** (1 / 3))
    TJ = [g1, 1 - 2 * g1, g1]
    for m in (tgi.Composition([Rattle()] * 3, TJ), tgi.Composition([Rattle()] * 2, [0.5, 0.5])):
        with pytest.raises(ValueError, match="must lie on T\\*N"):
            tgi.rollout(S, torch.tensor([[0.0, -1.3]], dtype=DT), torch.tensor([[0.5, 0.4]], dtype=DT),
                        h=0.1, steps=3, method=m)
    assert tgi.Composition([Rattle()] * 3, TJ).order == 4
    assert tgi.ConstrainedVariationalIntegrator([tgi.MidpointMap()] * 3, TJ).order == 2
    assert tgi.ConstrainedVariationalIntegrator([tgi.AlphaMap(0.3)] * 2, [0.5, 0.5]).order == 1


@pytest.mark.parametrize("method", ["rattle", "constrained_midpoint", "constrained_variational_verlet"])
def test_an_empty_batch_rolls_out_to_empty_states(method):
    """B = 0 failed in the state check with a raw max() error; other systems return empty rows."""
    C = tgi.ConstrainedSystem(tgi.Lagrangian.mechanical(lambda q: q[..., 1]),
                              lambda q: (q * q).sum(-1, keepdim=True) - 1)
    q, p = tgi.rollout(C, torch.zeros(0, 2), torch.zeros(0, 2), h=0.1, steps=3, method=method)
    assert q.shape == p.shape == (4, 0, 2)
