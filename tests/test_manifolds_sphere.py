"""The sphere: retraction-based discretization maps, the eq. (1) integrator on Sⁿ, and the
spherical pendulum on T*S² (RATTLE, and the Lie-group route through SO(3) acting on S²)."""
import numpy as np
import pytest
import torch
from scipy.integrate import solve_ivp

import torchgeo_int as tgi
from torchgeo_int.manifolds import sphere
from torchgeo_int.manifolds.integrators import LieGroupIntegrator, Rattle
from torchgeo_int.manifolds.sphere import SphereMap, SphereODEIntegrator
from torchgeo_int.manifolds.systems import SphericalPendulum
from torchgeo_int.rollout import run_loop


def unit(n=6, dim=3, seed=0):
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed))
    return x / x.norm(dim=-1, keepdim=True)


@pytest.mark.parametrize("retraction", ["exp", "projection"])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("dim", [3, 5])
def test_sphere_map_definition_inverse_adjoint(retraction, alpha, dim):
    R = SphereMap(alpha, retraction)
    x = unit(dim=dim)
    v = sphere.project(x, 0.4 * torch.randn(6, dim))
    res = R.check(x)
    assert res["i"] < 1e-15 and res["ii"] < 1e-14
    x0, x1 = R(x, v)
    assert ((x0.norm(dim=-1) - 1).abs().max() < 1e-15) and ((x1.norm(dim=-1) - 1).abs().max() < 1e-15)
    xb, vb = R.inverse(x0, x1)
    assert torch.allclose(xb, x, atol=1e-13) and torch.allclose(vb, v, atol=1e-13)
    a0, a1 = R.adjoint()(x, v)
    b0, b1 = R(x, -v)
    assert torch.allclose(a0, b1, atol=1e-15) and torch.allclose(a1, b0, atol=1e-15)
    assert R.symmetric == (alpha == 0.5)


def test_sphere_exp_log_and_retraction_inverse():
    x = unit()
    v = sphere.project(x, 0.8 * torch.randn(6, 3))
    assert torch.allclose(sphere.log(x, sphere.exp(x, v)), v, atol=1e-14)
    assert torch.allclose(sphere.retract_inv(x, sphere.retract(x, v)), v, atol=1e-14)
    assert torch.isfinite(torch.autograd.functional.jacobian(lambda w: sphere.exp(x[0], w), torch.zeros(3))).all()


def euler_field(t, x):
    """Euler's equations on the unit momentum sphere: ẋ = x × 𝕀⁻¹x (tangent to S²)."""
    return torch.linalg.cross(x, x / torch.tensor([1.0, 2.0, 3.5], dtype=x.dtype), dim=-1)


def euler_reference(x0, T):
    f = lambda t, y: np.cross(y, y / np.array([1.0, 2.0, 3.5]))
    return torch.tensor(solve_ivp(f, (0, T), x0.numpy(), method="DOP853", rtol=1e-13,
                                  atol=1e-13).y[:, -1])


@pytest.mark.parametrize("retraction", ["exp", "projection"])
@pytest.mark.parametrize("alpha", [0.0, 0.5])
def test_sphere_ode_integrator_order_and_stays_on_sphere(retraction, alpha):
    m = SphereODEIntegrator(SphereMap(alpha, retraction))
    system = tgi.ODESystem(euler_field)
    x0 = torch.tensor([0.6, -0.64, 0.48])
    T = 2.3
    ref = euler_reference(x0, T)
    Ns, errs = [32, 64, 128, 256], []
    for N in Ns:
        with torch.no_grad():
            x = tgi.rollout(system, x0, h=T / N, steps=N, method=m)
        assert (x.norm(dim=-1) - 1).abs().max() < 1e-14
        errs.append(float((x[-1] - ref).norm()))
    slope = -np.polyfit(np.log(Ns), np.log(errs), 1)[0]
    assert abs(slope - m.order) < 0.2, (slope, errs)


def test_sphere_ode_long_run_projection_has_no_drift_off_the_sphere():
    x0 = unit(4)
    with torch.no_grad():
        x = tgi.rollout(tgi.ODESystem(euler_field), x0, h=0.05, steps=1000, save_every=50,
                        method=SphereODEIntegrator(SphereMap(0.5, "projection")))
    assert (x.norm(dim=-1) - 1).abs().max() < 5e-16 * 4


# -- the spherical pendulum ---------------------------------------------------------------------------
PEND = SphericalPendulum(mass=1.3, length=0.8, gravity=2.0)


def pendulum_initial(n=1):
    q = torch.tensor([[0.6, 0.0, -0.8], [0.0, 0.8, 0.6], [0.28, -0.96, 0.0]])[:n]
    p = sphere.project(q, torch.tensor([[0.0, 0.9, 0.3], [0.5, 0.0, 0.1], [0.2, 0.3, 0.7]])[:n])
    return q, p


def pendulum_reference(q0, p0, T):
    M, c = PEND.M, PEND.c

    def f(t, y):
        q, p = y[:3], y[3:]
        F = -c * (np.array([0, 0, 1.0]) - q[2] * q)
        return np.concatenate([p / M, F - (p @ p / M) * q])

    y = solve_ivp(f, (0, T), np.concatenate([q0, p0]), method="DOP853", rtol=1e-13, atol=1e-13).y[:, -1]
    return torch.tensor(y[:3]), torch.tensor(y[3:])


def test_rattle_order_2():
    q0, p0 = pendulum_initial()
    T = 2.7
    qr, pr = pendulum_reference(q0[0].numpy(), p0[0].numpy(), T)
    Ns, errs = [32, 64, 128, 256], []
    for N in Ns:
        with torch.no_grad():
            q, p = tgi.rollout(PEND, q0, p0, h=T / N, steps=N, method=Rattle(), save_every=N)
        errs.append(float((q[-1, 0] - qr).norm() + (p[-1, 0] - pr).norm()))
    assert abs(-np.polyfit(np.log(Ns), np.log(errs), 1)[0] - 2) < 0.1, errs


def test_rattle_long_run_constraints_energy_momentum():
    q0, p0 = pendulum_initial(3)
    with torch.no_grad():
        q, p = tgi.rollout(PEND, q0, p0, h=0.05, steps=20000, method=Rattle(), save_every=10)
    assert (q.norm(dim=-1) - 1).abs().max() < 1e-15 * 4          # on the sphere, no drift
    assert (q * p).sum(-1).abs().max() < 1e-14                    # p tangent
    Lz = torch.linalg.cross(q, p, dim=-1)[..., 2]                 # vertical angular momentum
    assert (Lz - Lz[0]).abs().max() < 1e-12
    E = PEND.energy(q, p)
    dE = (E - E[0]).abs()
    n = len(dE)
    first, last = dE[: n // 10].amax(0), dE[-n // 10:].amax(0)
    assert (last < 1.5 * first + 1e-12).all() and dE.max() < 1e-2, (first, last)


def test_rattle_symplectic_on_TS2_and_reversible():
    q0, p0 = pendulum_initial(1)
    q0, p0 = q0[0], p0[0]
    h, m = 0.2, Rattle()

    def step(z):
        q1, p1 = m(PEND, z[:3], z[3:], 0.0, h)
        return torch.cat([q1, p1])

    z = torch.cat([q0, p0])
    J = torch.autograd.functional.jacobian(step, z)
    # a basis of T_{(q,p)}(T*S²): δq ⊥ q with δp fixing q·p, and (0, δp) with δp ⊥ q
    t = torch.linalg.svd(torch.eye(3) - torch.outer(q0, q0))[0][:, :2].T
    B = torch.stack([torch.cat([t[0], -(t[0] @ p0) * q0]), torch.cat([t[1], -(t[1] @ p0) * q0]),
                     torch.cat([torch.zeros(3), t[0]]), torch.cat([torch.zeros(3), t[1]])], 1)
    I, Z = torch.eye(3), torch.zeros(3, 3)
    Om = torch.cat([torch.cat([Z, I], 1), torch.cat([-I, Z], 1)])
    before = B.T @ Om @ B
    assert before.abs().max() > 0.5   # the restricted form is non-degenerate: the test can fail
    assert torch.allclose((J @ B).T @ Om @ (J @ B), before, atol=1e-13)
    q1, p1 = m(PEND, q0, p0, 0.0, h)
    qb, pb = m(PEND, q1, p1, h, -h)
    assert torch.allclose(qb, q0, atol=1e-15) and torch.allclose(pb, p0, atol=1e-14)


def test_pendulum_through_so3_action_matches_and_keeps_body_spin_zero():
    """The Lie-group route: the symmetric top's axis follows the pendulum (order 2 against the
    reference), μ₃ stays 0 (to the solver tolerance), and q = g e₃ stays on the sphere."""
    top = PEND.as_top()
    q0, p0 = pendulum_initial(2)
    g0, mu0 = PEND.to_top_state(q0, p0)
    qc, pc = PEND.from_top_state(g0, mu0)
    assert torch.allclose(qc, q0) and torch.allclose(pc, p0)
    assert torch.allclose(top.energy(g0, mu0), PEND.energy(q0, p0))
    T = 2.7
    ref = [pendulum_reference(q0[i].numpy(), p0[i].numpy(), T) for i in range(2)]
    m = LieGroupIntegrator("cayley", 0.5)
    Ns, errs = [32, 64, 128], []
    for N in Ns:
        with torch.no_grad():
            g, mu = run_loop(m.step, g0, mu0, system=top, h=T / N, steps=N, t0=0.0, save_every=1,
                             check_every=64)
        # exact at the solution of the implicit step, so to the solver's tolerance (5e-14)
        assert mu[..., 2].abs().max() < 1e-13
        q, p = PEND.from_top_state(g[-1], mu[-1])
        errs.append(max(float((q[i] - ref[i][0]).norm() + (p[i] - ref[i][1]).norm()) for i in range(2)))
        assert ((g[..., :, 2].norm(dim=-1) - 1).abs().max()) < 1e-14
    assert abs(-np.polyfit(np.log(Ns), np.log(errs), 1)[0] - 2) < 0.1, errs


def test_bad_input():
    with pytest.raises(ValueError, match="retraction"):
        SphereMap(0.5, "stereographic")
    with pytest.raises(TypeError, match="SphereMap"):
        SphereODEIntegrator(tgi.MidpointMap())
    q0, p0 = pendulum_initial()
    with pytest.raises(ValueError, match=r"T\*S\^n"):
        Rattle().check_state(PEND, 2 * q0, p0)
    with pytest.raises(TypeError, match="SphericalPendulum"):
        Rattle().step(tgi.SeparableHamiltonian(lambda p: (p * p).sum(-1), lambda q: (q * q).sum(-1)),
                      q0, p0, 0.0, 0.1)
    with pytest.raises(FloatingPointError):   # a step far too large: no real multiplier
        with torch.no_grad():
            tgi.rollout(PEND, q0, p0 * 50, h=3.0, steps=4, method=Rattle(), check_every=1)


def test_rattle_and_the_maps_checks_on_an_empty_batch_and_nan():
    """An empty batch is stepped (a (steps+1, 0, 3) trajectory), a NaN state is named as input,
    not reported later as a step-size problem; the maps' Def 2.2 checks take empty batches."""
    from torchgeo_int.manifolds import SO3
    from torchgeo_int.manifolds.lie import LieGroupMap
    empty = torch.zeros(0, 3, dtype=torch.float64)
    q, p = tgi.rollout(PEND, empty, empty, h=0.1, steps=3, method=Rattle())
    assert q.shape == p.shape == (4, 0, 3)
    q0, p0 = pendulum_initial()
    bad = q0.clone()
    bad[..., 0] = float("nan")
    with pytest.raises(ValueError, match="q0 contains NaN"):
        tgi.rollout(PEND, bad, p0, h=0.1, steps=3, method=Rattle())
    assert SphereMap(0.5).check(empty) == {"i": 0.0, "ii": 0.0}
    assert LieGroupMap(SO3, "cayley", 0.5).check(torch.zeros(0, 3, 3, dtype=torch.float64)) == {"i": 0.0, "ii": 0.0}


def test_a_rattle_step_of_size_zero_is_the_identity():
    """h = 0 through the public step gave NaN (the multiplier's 0/0); the Lie steps return
    their input."""
    P = SphericalPendulum(mass=1.3, length=0.8, gravity=2.0)
    q0 = torch.tensor([[0.6, 0.0, -0.8]], dtype=torch.float64)
    p0 = sphere.project(q0, torch.tensor([[0.0, 0.9, 0.3]], dtype=torch.float64))
    q, p = Rattle()(P, q0, p0, 0.0, 0.0)
    assert torch.equal(q, q0) and torch.equal(p, p0)


@pytest.mark.parametrize("how", ["verlet", "implicit_midpoint", "rattle", "odeint", "step_control"])
def test_the_methods_of_r3_are_refused_on_the_spherical_pendulum(how):
    """SphericalPendulum is H in R³ with the constraint |q| = 1 kept by the sphere's RATTLE:
    verlet (any method of R³) stepped it without the constraint, |q| reaching 12-16 in 50 steps,
    with no error; odeint's options['hamiltonian'] and variable steps likewise.  Each is refused
    naming manifolds.Rattle(); the constrained 'rattle' (ConstrainedSystem's) names it too."""
    x = torch.tensor([[0.6, 0.0, -0.8]], dtype=torch.float64)
    p = torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64)
    calls = {"verlet": lambda: tgi.rollout(PEND, x, p, h=0.1, steps=5, method="verlet"),
             "implicit_midpoint": lambda: tgi.rollout(PEND, x, p, h=0.1, steps=5, method="implicit_midpoint"),
             "rattle": lambda: tgi.rollout(PEND, x, p, h=0.1, steps=5, method="rattle"),
             "odeint": lambda: tgi.odeint(None, torch.cat([x, p], -1), torch.linspace(0, 1, 3),
                                          method="verlet", options=dict(hamiltonian=PEND)),
             "step_control": lambda: tgi.rollout(PEND, x, p, h=0.1, steps=5, method="verlet",
                                                 step_control=tgi.power_law_control(1.0))}
    with pytest.raises((ValueError, TypeError), match=r"tgi\.manifolds\.Rattle\(\)"):
        calls[how]()
    q, _ = tgi.rollout(PEND, x, p, h=0.1, steps=50, method=Rattle())
    assert (q.norm(dim=-1) - 1).abs().max() < 1e-12


def test_rattle_checks_the_states_as_rollout_does():
    """The sphere's RATTLE: q0, p0 of mixed dtypes (ran, returning mixed outputs), integers (a
    raw torch.finfo error), 0-d (IndexError) and points of R² (blamed on the library's own
    grad_V) are refused naming the problem."""
    x, p = pendulum_initial()
    cases = [((x.float(), p), TypeError, "same dtype"), ((x.long(), p.long()), TypeError, "floating"),
             ((x[0, 0], p[0, 0]), ValueError, "at least 1 dim"), ((x[..., :2], p[..., :2]), ValueError, r"\(\.\.\., 3\)")]
    for (q0, p0), err, match in cases:
        with pytest.raises(err, match=match):
            tgi.rollout(PEND, q0, p0, h=0.1, steps=3, method=Rattle())
