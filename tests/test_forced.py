"""Forced, dissipative and controlled systems (torchgeo_int.forced): zero force is the unforced
method bit for bit, the order of the base method on a damped oscillator with exact solution, the
midpoint discrete energy balance to round-off, and clear errors on bad input."""
import math

import pytest
import torch

import torchgeo_int as tgi
from torchgeo_int.forced import ForcedSystem, ForcedVariationalIntegrator, discrete_work

DT = torch.float64


def pendulum_H():
    return tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: (1 - torch.cos(q)).sum(-1))


def state(n=3, dim=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, dim, generator=g, dtype=DT) * 2 - 1, torch.rand(n, dim, generator=g, dtype=DT) - 0.5


def zero_force(q, z, t, u):
    return torch.zeros_like(q)


# -- zero force: the unforced method, bit for bit ----------------------------------------------
@pytest.mark.parametrize("method", ["implicit_midpoint", "verlet", "symplectic_euler", "yoshida4"])
def test_zero_force_hamiltonian_bit_for_bit(method):
    q0, p0 = state()
    # a non-separable H: every method runs its implicit form on both systems
    H = tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1) * (1 + 0.1 * q.pow(2).sum(-1)) - torch.cos(q).sum(-1))
    ref = tgi.rollout(H, q0, p0, h=0.1, steps=20, method=method)
    out = tgi.rollout(ForcedSystem(H, zero_force), q0, p0, h=0.1, steps=20, method=method)
    assert torch.equal(ref[0], out[0]) and torch.equal(ref[1], out[1])


def test_zero_force_separable_stays_explicit_bit_for_bit():
    q0, p0 = state()
    H = pendulum_H()
    F = ForcedSystem(H, lambda q, z, t, u: torch.zeros_like(q), velocity_dependent=False)
    assert F.separable
    ref = tgi.rollout(H, q0, p0, h=0.1, steps=30, method="verlet")
    out = tgi.rollout(F, q0, p0, h=0.1, steps=30, method="verlet")
    assert torch.equal(ref[0], out[0]) and torch.equal(ref[1], out[1])


@pytest.mark.parametrize("maps", [[tgi.AlphaMap(0.5)], [tgi.AlphaMap(0.0), tgi.AlphaMap(1.0)], [tgi.AlphaMap(0.3)]])
def test_zero_force_variational_bit_for_bit(maps):
    q0, p0 = state()
    L = tgi.Lagrangian.mechanical(lambda q: (1 - torch.cos(q)).sum(-1))
    fr = None if len(maps) == 1 else [0.5, 0.5]
    ref = tgi.rollout(L, q0, p0, h=0.1, steps=20, method=tgi.VariationalIntegrator(maps, fr))
    out = tgi.rollout(ForcedSystem(L, zero_force), q0, p0, h=0.1, steps=20,
                      method=ForcedVariationalIntegrator(maps, fr))
    assert torch.equal(ref[0], out[0]) and torch.equal(ref[1], out[1])


# -- order on the damped oscillator ------------------------------------------------------------
W0, C = 2.0, 0.4


def damped_exact(q0, p0, t):
    """q̈ + C q̇ + W0² q = 0 (p = q̇)."""
    g = C / 2
    wd = math.sqrt(W0 ** 2 - g * g)
    A, B = q0, (p0 + g * q0) / wd
    e = math.exp(-g * t)
    q = e * (A * math.cos(wd * t) + B * math.sin(wd * t))
    p = e * ((-g * A + wd * B) * math.cos(wd * t) + (-g * B - wd * A) * math.sin(wd * t))
    return q, p


def oscillator(lagrangian=False):
    if lagrangian:
        return ForcedSystem(tgi.Lagrangian.mechanical(lambda q: 0.5 * W0 ** 2 * (q * q).sum(-1)), damping=C)
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: 0.5 * W0 ** 2 * (q * q).sum(-1))
    return ForcedSystem(H, damping=C)


def observed_order(system, method, T=1.0, hs=(0.1, 0.05, 0.025)):
    q0, p0 = torch.tensor([[1.0]], dtype=DT), torch.tensor([[0.3]], dtype=DT)
    qe, pe = damped_exact(1.0, 0.3, T)
    errs = []
    for h in hs:
        q, p = tgi.rollout(system, q0, p0, h=h, steps=round(T / h), method=method)
        errs.append(math.hypot(float(q[-1, 0, 0]) - qe, float(p[-1, 0, 0]) - pe))
    return [math.log2(a / b) for a, b in zip(errs, errs[1:])]


@pytest.mark.parametrize("method,order", [("implicit_midpoint", 2), ("verlet", 2), ("symplectic_euler", 1),
                                          ("yoshida4", 4)])
def test_order_hamiltonian_damped_oscillator(method, order):
    rates = observed_order(oscillator(), method)
    assert min(rates) > order - 0.15, rates


@pytest.mark.parametrize("name,order", [("forced_variational_midpoint", 2), ("forced_variational_verlet", 2),
                                        ("forced_variational_euler", 1)])
def test_order_lagrange_dalembert_damped_oscillator(name, order):
    rates = observed_order(oscillator(lagrangian=True), tgi.FORCED_VARIATIONAL_METHODS[name])
    assert min(rates) > order - 0.15, rates


def test_order_with_control_against_reference():
    """A time-dependent control u(t) = sin(1.3 t) through a state-dependent input map: order 2
    (midpoint, Verlet, the variational midpoint) against a tight solve_ivp reference."""
    from scipy.integrate import solve_ivp
    G = lambda q: (1 + 0.5 * torch.cos(q)).unsqueeze(-1)          # (..., 1, 1)
    u = lambda t: torch.tensor([math.sin(1.3 * t)], dtype=DT)
    H = pendulum_H()
    L = tgi.Lagrangian.mechanical(lambda q: (1 - torch.cos(q)).sum(-1))
    T = 1.0
    ref = solve_ivp(lambda t, x: [x[1], -math.sin(x[0]) - C * x[1] + (1 + 0.5 * math.cos(x[0])) * math.sin(1.3 * t)],
                    (0, T), [0.8, 0.1], rtol=1e-12, atol=1e-12, method="DOP853").y[:, -1]
    q0, p0 = torch.tensor([[0.8]], dtype=DT), torch.tensor([[0.1]], dtype=DT)
    for system, method in [(ForcedSystem(H, damping=C, input_map=G, control=u), "implicit_midpoint"),
                           (ForcedSystem(H, damping=C, input_map=G, control=u), "verlet"),
                           (ForcedSystem(L, damping=C, input_map=G, control=u),
                            tgi.FORCED_VARIATIONAL_METHODS["forced_variational_midpoint"])]:
        errs = []
        for h in (0.2, 0.1, 0.05):
            q, p = tgi.rollout(system, q0, p0, h=h, steps=round(T / h), method=method)
            errs.append(math.hypot(float(q[-1, 0, 0]) - ref[0], float(p[-1, 0, 0]) - ref[1]))
        rates = [math.log2(a / b) for a, b in zip(errs, errs[1:])]
        assert min(rates) > 1.85, (method, rates)


def test_variational_midpoint_equals_forced_implicit_midpoint():
    """For L = ½v² − V the forced discrete Lagrange–d'Alembert midpoint step is the forced
    implicit midpoint step of H (module docstring)."""
    q0, p0 = state()
    force = lambda q, z, t: -0.3 * z + 0.2 * torch.sin(q + t)
    H, L = pendulum_H(), tgi.Lagrangian.mechanical(lambda q: (1 - torch.cos(q)).sum(-1))
    a = tgi.rollout(ForcedSystem(H, force), q0, p0, h=0.1, steps=20, method="implicit_midpoint")
    b = tgi.rollout(ForcedSystem(L, force), q0, p0, h=0.1, steps=20,
                    method=tgi.FORCED_VARIATIONAL_METHODS["forced_variational_midpoint"])
    assert (a[0] - b[0]).abs().max() < 1e-12 and (a[1] - b[1]).abs().max() < 1e-12


def test_discrete_forces_weighted_by_the_map():
    """f_d^− = (1−α)hF̄, f_d^+ = αhF̄ for the α-map: p_k = −D₁L_d − f_d^−, p_{k+1} = D₂L_d + f_d^+."""
    alpha, h = 0.3, 0.1
    L = tgi.Lagrangian.mechanical(lambda q: (1 - torch.cos(q)).sum(-1))
    force = lambda q, v, t: -0.5 * v + torch.cos(q)
    q0, p0 = state()
    q1, p1 = ForcedVariationalIntegrator(tgi.AlphaMap(alpha))(ForcedSystem(L, force), q0, p0, 0.0, h)
    D1, D2 = tgi.DiscreteLagrangian(L, tgi.AlphaMap(alpha)).derivatives(q0, q1, h)
    Fb = force((1 - alpha) * q0 + alpha * q1, (q1 - q0) / h, alpha * h)
    assert (p0 - (-D1 - (1 - alpha) * h * Fb)).abs().max() < 1e-12
    assert (p1 - (D2 + alpha * h * Fb)).abs().max() < 1e-13


# -- discrete energy balance -------------------------------------------------------------------
def test_energy_balance_midpoint_quadratic_to_roundoff():
    """Quadratic H, any force (nonlinear, damping, time-dependent control): ΔH = W_k exactly."""
    S = torch.tensor([[2.0, 0.3], [0.3, 1.0]], dtype=DT)
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: 0.5 * ((q @ S) * q).sum(-1))
    F = ForcedSystem(H, lambda q, z, t, u: 0.3 * torch.sin(q.flip(-1)) * z, damping=torch.tensor([0.2, 0.05], dtype=DT),
                     input_map=torch.tensor([[1.0], [0.5]], dtype=DT), control=lambda t: torch.tensor([math.cos(t)], dtype=DT))
    q0, p0 = state(4, 2)
    h = 0.2
    q, p = tgi.rollout(F, q0, p0, h=h, steps=50, method="implicit_midpoint")
    E = H.energy(q, p)
    W = discrete_work(F, q, p, h=h)
    assert (E[1:] - E[:-1] - W).abs().max() < 2e-14 * (1 + E.abs().max())
    assert float(W.abs().max()) > 1e-3        # the force does work


def test_energy_balance_midpoint_nonlinear_defect_is_potential_quadrature():
    """Any V: E_{k+1} − E_k = W_k + D_k, D_k = V(q_{k+1}) − V(q_k) − ∇V(q̄)·Δq, to round-off, on
    both sides (Hamiltonian forced midpoint, Lagrange–d'Alembert midpoint)."""
    V = lambda q: (1 - torch.cos(q)).sum(-1) + 0.1 * (q ** 4).sum(-1)
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), V)
    L = tgi.Lagrangian.mechanical(V)
    u = lambda t: torch.tensor([0.4 * math.sin(2 * t)], dtype=DT)
    h = 0.15
    q0, p0 = state(3, 1)
    for system, method in [(ForcedSystem(H, damping=0.3, input_map=torch.ones(1, 1, dtype=DT), control=u), "implicit_midpoint"),
                           (ForcedSystem(L, damping=0.3, input_map=torch.ones(1, 1, dtype=DT), control=u),
                            tgi.FORCED_VARIATIONAL_METHODS["forced_variational_midpoint"])]:
        q, p = tgi.rollout(system, q0, p0, h=h, steps=40, method=method)
        E = H.energy(q, p)
        W = discrete_work(system, q, p, h=h)
        qb = 0.5 * (q[1:] + q[:-1])
        gV = tgi.systems.grad_of(V, (qb,))[0]
        D = V(q[1:]) - V(q[:-1]) - (gV * (q[1:] - q[:-1])).sum(-1)
        assert (E[1:] - E[:-1] - W - D).abs().max() < 1e-14 * 20
        assert D.abs().max() > 1e-8            # the defect is real for a nonlinear V ...
        assert D.abs().max() < 0.05 * W.abs().max()   # ... and small next to the work


def test_damping_alone_never_increases_energy():
    """Rayleigh damping on a quadratic H: W_k = −h v̄ᵀCv̄ ≤ 0, so E_k is nonincreasing."""
    F = oscillator()
    q, p = tgi.rollout(F, torch.tensor([[1.0]], dtype=DT), torch.tensor([[0.0]], dtype=DT), h=0.5, steps=40,
                       method="implicit_midpoint")
    E = F.energy(q, p)[:, 0]
    assert bool((E[1:] <= E[:-1] + 1e-15).all()) and float(E[-1]) < 1e-2 * float(E[0])


# -- gradients flow through the forced steps -------------------------------------------------
def test_gradients_to_damping_and_input_map():
    c = torch.tensor(0.3, dtype=DT, requires_grad=True)
    g = torch.tensor([[1.0]], dtype=DT, requires_grad=True)
    H = pendulum_H()
    F = ForcedSystem(H, damping=lambda q: (c * torch.ones_like(q)).unsqueeze(-1), input_map=lambda q: g.expand(*q.shape, 1),
                     control=torch.tensor([0.5], dtype=DT))
    q0, p0 = state()
    q, p = tgi.rollout(F, q0, p0, h=0.1, steps=10, method="implicit_midpoint")
    gc, gg = torch.autograd.grad(q[-1].sum() + p[-1].sum(), (c, g))
    # finite differences of the same rollout
    def val(cv, gv):
        Fd = ForcedSystem(H, damping=cv, input_map=torch.tensor([[gv]], dtype=DT), control=torch.tensor([0.5], dtype=DT))
        with torch.no_grad():
            q, p = tgi.rollout(Fd, q0, p0, h=0.1, steps=10, method="implicit_midpoint")
        return float(q[-1].sum() + p[-1].sum())
    e = 1e-6
    assert abs(float(gc) - (val(0.3 + e, 1.0) - val(0.3 - e, 1.0)) / (2 * e)) < 1e-6
    assert abs(float(gg) - (val(0.3, 1.0 + e) - val(0.3, 1.0 - e)) / (2 * e)) < 1e-6


# -- bad input --------------------------------------------------------------------------------
def test_negative_damping_is_refused():
    H = pendulum_H()
    with pytest.raises(ValueError, match="nonnegative"):
        ForcedSystem(H, damping=-0.1)
    with pytest.raises(ValueError, match="positive semidefinite"):
        ForcedSystem(H, damping=torch.tensor([[1.0, 0.0], [0.0, -0.5]], dtype=DT))
    with pytest.raises(ValueError, match="symmetric"):
        ForcedSystem(H, damping=torch.tensor([[1.0, 0.5], [0.0, 1.0]], dtype=DT))
    F = ForcedSystem(H, damping=lambda q: -torch.ones(*q.shape, 1, dtype=DT))
    q0, p0 = state()
    with pytest.raises(ValueError, match="positive semidefinite"):
        tgi.rollout(F, q0, p0, h=0.1, steps=2, method="implicit_midpoint")


def test_control_of_wrong_shape_is_refused():
    H = pendulum_H()
    q0, p0 = state(3, 1)
    G = torch.ones(1, 2, dtype=DT)         # two controls
    for u in (torch.ones(3, dtype=DT), torch.ones(5, 2, dtype=DT), lambda t: torch.ones(1, dtype=DT)):
        with pytest.raises(ValueError, match="control"):
            tgi.rollout(ForcedSystem(H, input_map=G, control=u), q0, p0, h=0.1, steps=2, method="implicit_midpoint")
    with pytest.raises(ValueError, match="no control"):
        tgi.rollout(ForcedSystem(H, input_map=G), q0, p0, h=0.1, steps=2, method="implicit_midpoint")
    with pytest.raises(ValueError, match="nothing uses it"):
        ForcedSystem(H, control=torch.ones(2, dtype=DT))
    with pytest.raises(ValueError, match="shaped like q"):
        tgi.rollout(ForcedSystem(H, lambda q, z: torch.ones(2, dtype=DT)), q0, p0, h=0.1, steps=1,
                    method="implicit_midpoint")


def test_wrong_system_kinds_are_refused():
    with pytest.raises(TypeError, match="SecondOrderSystem"):
        ForcedSystem(tgi.SecondOrderSystem.from_potential(lambda q: (q * q).sum(-1)), damping=0.1)
    with pytest.raises(TypeError, match="Lagrangian"):
        tgi.rollout(ForcedSystem(pendulum_H(), damping=0.1), *state(), h=0.1, steps=1,
                    method=tgi.FORCED_VARIATIONAL_METHODS["forced_variational_midpoint"])


# -- review fixes (2026-12-05) ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype,k", [(torch.float64, 1e6), (torch.float32, 1e2)])
def test_variational_steps_do_not_depend_on_the_units_of_mass(dtype, k):
    # L = k[½v² − (1 − cos q)]: the motion does not depend on k; the Legendre residual (a
    # momentum) was tested against a velocity-sized tolerance: ConvergenceError from k ≈ 1e3
    # in float64 (1e2 in float32)
    def run(scale, name):
        L = tgi.Lagrangian.mechanical(lambda q: scale * (1 - torch.cos(q)).sum(-1),
                                      mass=torch.tensor(scale, dtype=dtype))
        system = L if not name.startswith("forced") else ForcedSystem(L, damping=0.1 * scale)
        q0, p0 = torch.tensor([[0.5]], dtype=dtype), torch.tensor([[scale]], dtype=dtype)
        return tgi.rollout(system, q0, p0, h=0.1, steps=20, method=name)[0]
    for name in ("variational_midpoint", "variational_verlet", "forced_variational_midpoint"):
        assert torch.allclose(run(1.0, name), run(k, name), atol=100 * torch.finfo(dtype).eps)


def test_alpha_pair_compositions_are_symmetric_second_order():
    m = tgi.VariationalIntegrator([tgi.AlphaMap(0.7), tgi.AlphaMap(0.3)], [0.5, 0.5])
    assert m.symmetric and m.order == 2          # AlphaMap(0.7).adjoint() is α = 0.30000000000000004


def test_control_set_after_construction_makes_the_system_time_dependent():
    H = pendulum_H()
    u = lambda t: torch.tensor([math.sin(3 * t)])          # noqa: E731
    late = ForcedSystem(H, input_map=torch.ones(1, 1))
    assert not late.time_dependent
    late.control = u
    fresh = ForcedSystem(H, input_map=torch.ones(1, 1), control=u)
    assert late.time_dependent and fresh.time_dependent
    q0, p0 = torch.zeros(1, 1), torch.zeros(1, 1)
    sigma = lambda q: torch.ones(q.shape[:-1])              # noqa: E731  σ ≡ 1: fixed steps
    with torch.no_grad():
        a = tgi.rollout(fresh, q0, p0, h=0.1, steps=20, method="verlet", step_control=sigma)
        b = tgi.rollout(late, q0, p0, h=0.1, steps=20, method="verlet", step_control=sigma)
    assert torch.equal(a.p, b.p)                # the late control used to be read at t = 0


def test_input_map_dtype_and_damping_gradients():
    H = pendulum_H()
    q0, p0 = state(2)
    G32 = torch.ones(1, 1, dtype=torch.float32)      # a float32 map with float64 states
    F = ForcedSystem(H, input_map=G32, control=torch.tensor([0.5]))
    q, _ = tgi.rollout(F, q0, p0, h=0.1, steps=5, method="verlet")
    assert q.dtype == torch.float64
    with pytest.raises(TypeError, match="floating point"):
        ForcedSystem(H, input_map=torch.ones(1, 1, dtype=torch.int64), control=torch.tensor([0.5]))
    c = torch.tensor(0.3, requires_grad=True)        # a tensor damping that requires grad
    q, p = tgi.rollout(ForcedSystem(H, damping=c), q0, p0, h=0.1, steps=5, method="implicit_midpoint")
    (g,) = torch.autograd.grad(p[-1].sum(), c)
    with torch.no_grad():
        fd = [tgi.rollout(ForcedSystem(H, damping=float(c) + s), q0, p0, h=0.1, steps=5,
                          method="implicit_midpoint")[1][-1].sum() for s in (1e-6, -1e-6)]
    assert abs(float(g) - float(fd[0] - fd[1]) / 2e-6) < 1e-6
    with pytest.raises(ValueError, match="cannot be differentiated"):
        tgi.Lagrangian.mechanical(lambda q: q.sum(-1), mass=torch.tensor(2.0, requires_grad=True))


def test_discrete_work_times_and_inputs():
    H = pendulum_H()
    u = lambda t: torch.tensor([math.sin(3 * t)])          # noqa: E731
    F = ForcedSystem(H, input_map=torch.ones(1, 1), control=u)
    q0, p0 = state(2)
    t0 = 10000.3                                  # times in Python floats, as the step's
    q, p = tgi.rollout(F.float(), q0.float(), p0.float(), h=0.1, steps=10, method="implicit_midpoint", t0=t0)
    W = discrete_work(F, q, p, h=0.1, t0=t0)
    E = H.energy(q.double(), p.double())
    assert (E[1:] - E[:-1] - W.double()).abs().max() < 1e-5
    assert discrete_work(F, q[:1], p[:1], h=0.1).shape == (0, 2)
    with pytest.raises(ValueError, match="finite nonzero step"):
        discrete_work(F, q, p, h=0.0)
    with pytest.raises(ValueError, match="same shape"):
        discrete_work(F, q, p[:-1], h=0.1)


def test_discrete_work_refuses_sample_first_trajectories():
    """(B, K+1, n) trajectories passed where (K+1, B, n) are taken used to return the "work"
    between neighbouring trajectories without an error; they are refused, naming the transpose,
    and ``layout="time_first"`` takes an ensemble of nearby trajectories as given."""
    F = ForcedSystem(pendulum_H(), damping=0.1)
    q0 = torch.linspace(-1.0, 1.0, 8, dtype=torch.float64)[:, None]
    q, p = tgi.rollout(F, q0, torch.zeros_like(q0), h=0.05, steps=20, method="implicit_midpoint")
    W = discrete_work(F, q, p, h=0.05)                                  # time-first: accepted
    assert W.shape == (20, 8)
    with pytest.raises(ValueError, match=r"look sample-first, \(B, K\+1, n\).*transpose\(0, 1\)"):
        discrete_work(F, q.transpose(0, 1), p.transpose(0, 1), h=0.05)
    with pytest.raises(ValueError, match="layout must be None or 'time_first'"):
        discrete_work(F, q, p, h=0.05, layout="windows")
    near = 1e-4 * torch.arange(8, dtype=torch.float64)[:, None]        # an ensemble, 1e-4 apart
    qe, pe = tgi.rollout(F, 0.5 + near, near, h=0.05, steps=20, method="implicit_midpoint")
    with pytest.raises(ValueError, match="look sample-first"):
        discrete_work(F, qe, pe, h=0.05)
    torch.testing.assert_close(discrete_work(F, qe, pe, h=0.05, layout="time_first"),
                               discrete_work(F, qe[:, :1], pe[:, :1], h=0.05).expand(20, 8), rtol=0, atol=1e-5)


def test_forced_losses_read_a_control_left_on_the_model_at_the_data_times():
    """``model.control = u`` then a residual or derivative loss without ``control=``: the field
    was evaluated at t = 0, so u(0) was read at every pair (the true system's forced midpoint
    residual was 0.26 instead of round-off).  The model's callable control is now stacked at
    the data's times as a passed one is, and stays the model's control: a second loss, on
    windows of another count, reads it again."""
    from torchgeo_int.nn import finite_differences, forced_derivative_loss, forced_residual_loss
    u = lambda t: torch.tensor([math.sin(3 * t)])          # noqa: E731
    truth = ForcedSystem(pendulum_H(), damping=0.15, input_map=torch.ones(1, 1), control=u)
    q0, p0 = state(8)
    q, p = tgi.rollout(truth, q0, p0, h=0.1, steps=10, method="implicit_midpoint")
    q, p = q.transpose(0, 1), p.transpose(0, 1)            # windows (N, L, n)
    passed = float(forced_residual_loss(truth, q, p, dt=0.1, control=u))
    truth.control = u
    left = float(forced_residual_loss(truth, q, p, dt=0.1))
    assert passed < 1e-24 and left == passed and truth.control is u
    assert float(forced_residual_loss(truth, q[:3], p[:3], dt=0.1)) < 1e-24 and truth.control is u
    dq, dp = finite_differences(q, p, 0.1)
    passed = forced_derivative_loss(truth, q, p, dq, dp, dt=0.1, control=u)
    truth.control = u
    assert torch.equal(forced_derivative_loss(truth, q, p, dq, dp, dt=0.1), passed)
    assert truth.control is u
    with pytest.raises(ValueError, match="pass dt"):       # u(t) needs the states' times
        forced_derivative_loss(truth, q, p, dq, dp)


def test_a_defaulted_parameter_of_the_force_is_a_constant_unless_named_as_its_slot():
    """F(q, z, c=0.3) got t in c (and time_dependent), F(q, k=2.0) got p in k: both ran other
    dynamics silently.  A default named as its slot (z, t, u) still takes it."""
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: 0.5 * (q * q).sum(-1))
    q0, p0 = torch.tensor([[1.0]], dtype=DT), torch.tensor([[0.0]], dtype=DT)
    run = lambda F, m: tgi.rollout(ForcedSystem(H, F), q0, p0, h=0.1, steps=50, method=m)[0][-1]  # noqa: E731
    assert not ForcedSystem(H, lambda q, z, c=0.3: -c * z).time_dependent
    assert torch.equal(run(lambda q, z, c=0.3: -c * z, "implicit_midpoint"), run(lambda q, z: -0.3 * z, "implicit_midpoint"))
    assert not ForcedSystem(H, lambda q, k=2.0: -k * q).velocity_dependent
    assert torch.equal(run(lambda q, k=2.0: -k * q, "verlet"), run(lambda q: -2.0 * q, "verlet"))
    assert ForcedSystem(H, lambda q, z, t=0.0: -0.1 * z * math.cos(t)).time_dependent


def test_damping_of_the_wrong_length_is_named_and_a_float_time_control_under_variable_steps_too():
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: (1 - torch.cos(q)).sum(-1))
    q0, p0 = torch.tensor([[0.8, 0.1]], dtype=DT), torch.zeros(1, 2, dtype=DT)
    with pytest.raises(ValueError, match="the damping matrix is 3x3 but the state has 2 coordinates"):
        tgi.rollout(ForcedSystem(H, damping=torch.tensor([0.1, 0.2, 0.3], dtype=DT)), q0, p0, h=0.1, steps=2)
    # per-sample times under step_control: a control written for a float t is named
    S = ForcedSystem(H, damping=0.15, input_map=torch.ones(1, 1, dtype=DT),
                     control=lambda t: torch.tensor([0.3 * math.sin(t)], dtype=DT))
    q0, p0 = torch.tensor([[0.8], [0.3], [-0.5]], dtype=DT), torch.zeros(3, 1, dtype=DT)
    sigma = lambda q: 1 / (1 + q[..., 0] ** 2)   # noqa: E731
    with pytest.raises(TypeError, match=r"the control u\(t\) failed on per-sample times t of shape \(3,\)"):
        tgi.rollout(S, q0, p0, h=0.01, steps=10, method="implicit_midpoint", step_control=sigma)
    S.control = lambda t: 0.3 * torch.sin(torch.as_tensor(t, dtype=DT)).reshape(-1, 1)
    tr = tgi.rollout(S, q0, p0, h=0.01, steps=10, method="implicit_midpoint", step_control=sigma)
    assert tr.q.shape == (11, 3, 1) and bool(torch.isfinite(tr.q).all())


def test_forced_losses_leave_the_control_as_passed_and_refused_ones_not_at_all():
    """A residual or derivative loss leaves on the model the control it was given (not its own
    stacked (N, L − 1, k) values, which made the next rollout of another batch fail); a control
    the losses refuse — a float, a tensor of the wrong shape, also inside a rollout loss — is
    named clearly and the model's control before the call is back."""
    from torchgeo_int.nn import (PortHamiltonianNN, finite_differences, forced_derivative_loss,
                                 forced_residual_loss, forced_rollout_loss)
    torch.manual_seed(0)
    m = PortHamiltonianNN(1, n_controls=1)
    q = p = torch.randn(16, 5, 1).cumsum(1) * 0.05
    u = lambda t: torch.tensor([math.sin(t)])      # noqa: E731
    forced_residual_loss(m, q, p, dt=0.1, control=u)
    assert m.control is u
    assert tgi.rollout(m, torch.randn(3, 1), torch.randn(3, 1), h=0.1, steps=2)[0].shape == (3, 3, 1)
    dq, dp = finite_differences(q, p, 0.1)
    held = torch.ones(16, 1)
    forced_derivative_loss(m, q, p, dq, dp, control=held)
    assert m.control is held
    m.control = u
    cases = [(lambda t: 0.3, TypeError, "got float from u"), (torch.ones(5, 1), ValueError, r"N = 16 windows.*got \(5, 1\)"),
             (torch.tensor(0.3), ValueError, r"got \(\)"), (torch.ones(16, 4, 1), ValueError, r"got \(16, 4, 1\)")]
    for bad, err, match in cases:
        with pytest.raises(err, match=match):
            forced_residual_loss(m, q, p, dt=0.1, control=bad)
        assert m.control is u
    with pytest.raises(ValueError, match="k = 1"):
        forced_rollout_loss(m, q, p, dt=0.1, control=torch.ones(16, 2))
    assert m.control is u
