"""rollout: shapes, gradients, errors, long-time energy behaviour."""
import math

import pytest
import torch

import torchgeo_int as tgi
from problems import kepler, kepler_energy, kepler_initial, outer_solar_system, pendulum_nonseparable


def test_shapes_save_every_and_batch_dims():
    system = kepler(separable=True, analytic=True)
    q0, p0 = kepler_initial(0.5)
    q0, p0 = q0.expand(3, 5, 2).clone(), p0.expand(3, 5, 2).clone()
    with torch.no_grad():
        q, p = tgi.rollout(system, q0, p0, h=0.01, steps=100, method="verlet", save_every=7)
    assert q.shape == (100 // 7 + 2, 3, 5, 2) and p.shape == q.shape   # and the final state
    assert torch.equal(q[0], q0)
    with torch.no_grad():
        qf, pf = tgi.rollout(system, q0, p0, h=0.01, steps=100, method="verlet")
    assert torch.allclose(q[-2], qf[98], atol=1e-14)  # save 14 is step 98
    assert torch.allclose(q[-1], qf[-1], atol=1e-14)  # the last frame is the final state


def test_negative_h_integrates_backwards():
    system = kepler(separable=True, analytic=True)
    q0, p0 = kepler_initial(0.5)
    with torch.no_grad():
        q, p = tgi.rollout(system, q0, p0, h=0.01, steps=50, method="yoshida4")
        qb, pb = tgi.rollout(system, q[-1], p[-1], h=-0.01, steps=50, method="yoshida4", t0=0.5)
    assert torch.allclose(qb[-1], q0, atol=1e-12) and torch.allclose(pb[-1], p0, atol=1e-12)


@pytest.mark.parametrize("method", ["verlet", "implicit_midpoint", "yoshida4"])
def test_gradients_to_initial_state_and_parameters(method):
    """d(loss)/d(q0, p0, θ) through a rollout equals finite differences (float64)."""
    k = torch.tensor(1.3, requires_grad=True)
    system = tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1) + k * (1 - torch.cos(q)).sum(-1)
                             + 0.1 * (q * p).sum(-1) ** 2)
    q0 = torch.tensor([[0.3, -0.2]], requires_grad=True)
    p0 = torch.tensor([[0.1, 0.4]], requires_grad=True)

    def loss(q0, p0, k_):
        with torch.no_grad():
            k.copy_(k_)
        q, p = tgi.rollout(system, q0, p0, h=0.1, steps=8, method=method)
        return (q ** 2).sum() + (p ** 3).sum()

    kval = k.detach().clone()
    L = loss(q0, p0, kval)
    gq, gp, gk = torch.autograd.grad(L, (q0, p0, k))
    eps = 1e-6
    for base, g, idx in [(q0, gq, (0, 1)), (p0, gp, (0, 0))]:
        d = torch.zeros_like(base)
        d[idx] = eps
        with torch.no_grad():
            args_p = [q0 + d, p0] if base is q0 else [q0, p0 + d]
            args_m = [q0 - d, p0] if base is q0 else [q0, p0 - d]
        fd = ((loss(*args_p, kval) - loss(*args_m, kval)) / (2 * eps)).detach()
        assert abs(float(fd) - float(g[idx].detach())) < 1e-6 * max(1.0, abs(float(fd)))
    fd = ((loss(q0, p0, kval + eps) - loss(q0, p0, kval - eps)) / (2 * eps)).detach()
    assert abs(float(fd) - float(gk.detach())) < 1e-6 * max(1.0, abs(float(fd)))


def test_gradcheck_implicit_midpoint_step():
    system = pendulum_nonseparable()
    m = tgi.METHODS["implicit_midpoint"]
    q0 = torch.tensor([0.3, -0.2], requires_grad=True)
    p0 = torch.tensor([0.1, 0.4], requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, p: m(system, q, p, 0.0, 0.2), (q0, p0))


def test_float32_rollout():
    system = kepler(separable=True)
    q0, p0 = kepler_initial(0.5, dtype=torch.float32)
    for method in ("verlet", "implicit_midpoint", "yoshida4"):
        with torch.no_grad():
            q, p = tgi.rollout(system, q0, p0, h=0.01, steps=300, method=method)
        assert q.dtype == torch.float32
        dE = (kepler_energy(q, p) - kepler_energy(q0, p0)).abs().max()
        assert float(dE) < 1e-3


def test_callable_hamiltonian_and_integrator_instance():
    q0, p0 = torch.tensor([0.5]), torch.tensor([0.0])
    with torch.no_grad():
        a = tgi.rollout(lambda q, p: 0.5 * (p * p + q * q).sum(-1), q0, p0, h=0.1, steps=10,
                        method=tgi.CotangentLiftIntegrator(tgi.AlphaMap(0.5)))
        b = tgi.rollout(tgi.Hamiltonian(lambda q, p: 0.5 * (p * p + q * q).sum(-1)), q0, p0, h=0.1,
                        steps=10, method="implicit_midpoint")
    assert torch.allclose(a[0], b[0], atol=1e-14)


def test_bad_input_raises_clearly():
    system = kepler(separable=True)
    q0, p0 = kepler_initial(0.5)
    with pytest.raises(ValueError, match="unknown method.*verlet"):
        tgi.rollout(system, q0, p0, h=0.1, steps=1, method="leapfrog9")
    with pytest.raises(ValueError, match="NaN"):
        tgi.rollout(system, torch.tensor([float("nan"), 0.0]), p0, h=0.1, steps=1)
    with pytest.raises(TypeError, match="torch.Tensor"):
        tgi.rollout(system, [1.0, 0.0], p0, h=0.1, steps=1)
    with pytest.raises(ValueError, match="same shape"):
        tgi.rollout(system, q0, torch.zeros(3), h=0.1, steps=1)
    with pytest.raises(ValueError, match="step size"):
        tgi.rollout(system, q0, p0, h=0.0, steps=1)
    with pytest.raises(ValueError, match="steps"):
        tgi.rollout(system, q0, p0, h=0.1, steps=-1)
    with pytest.raises(TypeError, match="System"):
        tgi.rollout(3, q0, p0, h=0.1, steps=1)


def test_nonconvergent_implicit_step_names_the_step():
    # Stiff oscillator ω = 10: the midpoint fixed point contracts by hω/2 = 2.5 > 1.
    system = tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1) + 50.0 * (q * q).sum(-1))
    with pytest.raises(tgi.ConvergenceError, match=r"step 0.*did not converge.*tolerance"):
        with torch.no_grad():
            tgi.rollout(system, torch.tensor([1.0]), torch.tensor([0.0]), h=0.5, steps=5,
                        method="implicit_midpoint")


def test_rollout_that_blows_up_says_where():
    system = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: -(q ** 4).sum(-1))
    with pytest.raises(FloatingPointError, match="non-finite between step"):
        with torch.no_grad():
            tgi.rollout(system, torch.tensor([2.0]), torch.tensor([0.0]), h=0.5, steps=200,
                        method="verlet", check_every=16)


def test_outer_solar_system_energy_bounded():
    """HLW I.2.3, h = 10 days over 2·10⁵ days: verlet ≲ 1e-5, yoshida4 ≲ 1e-8 relative."""
    system, q0, p0 = outer_solar_system()
    E0 = system.energy(q0, p0)
    for method, bound in [("verlet", 1e-5), ("yoshida4", 1e-8)]:
        with torch.no_grad():
            q, p = tgi.rollout(system, q0, p0, h=10.0, steps=20_000, method=method, save_every=20)
        rel = ((system.energy(q, p) - E0) / E0).abs()
        assert float(rel.max()) < bound, (method, float(rel.max()))
        # bounded, not drifting: the last quarter is no worse than the first quarter
        quarter = len(rel) // 4
        assert float(rel[-quarter:].max()) < 2.0 * float(rel[:quarter].max())


@pytest.mark.parametrize("method", ["verlet", "yoshida4", "symplectic_euler_adjoint"])
@pytest.mark.parametrize("kind", ["analytic", "autograd", "time_dependent"])
def test_bound_step_is_the_step_bit_for_bit(method, kind):
    """rollout's bound step (integrator.bind) takes exactly the operations of integrator.step."""
    if kind == "time_dependent":
        system = tgi.SeparableHamiltonian(lambda p, t: 0.5 * (p * p).sum(-1) * (1 + 0.1 * t),
                                          lambda q, t: -(1 + 0.2 * math.sin(t)) / q.norm(dim=-1))
        assert system.halves() is None
    else:
        system = kepler(separable=True, analytic=kind == "analytic")
        assert system.halves() is not None
    m = tgi.METHODS[method]
    bound = m.bind(system)
    q0, p0 = kepler_initial(0.5)
    q0, p0 = q0.expand(3, 2) * torch.tensor([[1.0], [0.9], [1.1]]), p0.expand(3, 2).clone()
    qa, pa, ca = q0, p0, None
    qb, pb, cb = q0, p0, None
    with torch.no_grad():
        for k in range(25):
            qa, pa, ca = m.step(system, qa, pa, 0.3 + 0.02 * k, 0.02, ca)
            qb, pb, cb = bound(system, qb, pb, 0.3 + 0.02 * k, 0.02, cb)
    assert torch.equal(qa, qb) and torch.equal(pa, pb)
    assert (ca is None) == (cb is None) and (ca is None or torch.equal(ca, cb))
    # n steps in one call (what rollout's loop uses; a time-dependent system's steps at the
    # times t0 + j·h), the last state written into the given output rows
    rows = torch.empty_like(q0), torch.empty_like(p0)
    with torch.no_grad():
        qc, pc, cc = bound.steps(q0, p0, 0.3, 0.02, 25, out=rows)
    assert bound.writes_out and torch.equal(qc, qa) and torch.equal(pc, pa)
    assert torch.equal(rows[0], qa) and torch.equal(rows[1], pa)


def test_kick_folds_the_force_sign():
    """H = T + V: the kick adds ∂V/∂q with coefficient −a h (force = force_sign · force_term)."""
    system = kepler(separable=True, analytic=True)
    q, p = kepler_initial(0.5)
    assert system.force_sign == -1.0
    assert torch.equal(system.force_sign * system.force_term(q), system.force(q))
    vf = tgi.VectorFieldSystem(lambda t, q, p: (p, -q), separable=True)
    assert vf.force_sign == 1.0 and torch.equal(vf.force_term(q), -q)


def test_errors_name_the_step_inside_a_stretch_of_steps():
    """The loop runs stretches of steps between checks; errors still name the exact step."""
    # ω² jumps from 1 to 400 at t = 0.35: the midpoint fixed point stops contracting at step 3.
    stiff = tgi.Hamiltonian(lambda q, p, t: 0.5 * (p * p).sum(-1)
                            + 0.5 * (1.0 + 399.0 * float(t > 0.35)) * (q * q).sum(-1))
    with pytest.raises(tgi.ConvergenceError, match=r"integrator step 3:"):
        with torch.no_grad():
            tgi.rollout(stiff, torch.tensor([1.0]), torch.tensor([0.0]), h=0.1, steps=10,
                        method="implicit_midpoint", check_every=8)
    blowup = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: -(q ** 4).sum(-1))
    q, p, first_bad = torch.tensor([2.0]), torch.tensor([0.0]), None
    with torch.no_grad():
        for k in range(1, 40):
            q, p = tgi.METHODS["verlet"](blowup, q, p, 0.0, 0.5)
            if not bool(torch.isfinite(q).all() and torch.isfinite(p).all()):
                first_bad = k
                break
    assert first_bad is not None and first_bad > 2
    for every in (1, 4):
        b = -(-first_bad // every) * every
        with pytest.raises(FloatingPointError, match=rf"between step {b - every} and step {b}\b"):
            with torch.no_grad():
                tgi.rollout(blowup, torch.tensor([2.0]), torch.tensor([0.0]), h=0.5, steps=40,
                            method="verlet", check_every=every)


def test_bound_loop_respects_overridden_halves():
    """A SeparableHamiltonian subclass that overrides velocity/force_term is stepped through its
    own methods by the bound loop too."""
    class Stiffer(tgi.SeparableHamiltonian):
        def velocity(self, p, t=0.0):
            return 2.0 * p            # T = |p|² (not the kinetic passed in)

    system = Stiffer(lambda p: 0.5 * (p * p).sum(-1), lambda q: 0.5 * (q * q).sum(-1))
    assert system.halves() is None
    q0, p0 = torch.tensor([[1.0]]), torch.tensor([[0.0]])
    with torch.no_grad():
        q, p = tgi.rollout(system, q0, p0, h=0.01, steps=100, method="verlet")
        qs, ps = q0, p0
        for k in range(100):
            qs, ps = tgi.METHODS["verlet"](system, qs, ps, 0.01 * k, 0.01)
    assert torch.equal(q[-1], qs) and torch.equal(p[-1], ps)
    # ω² = 2: the frequency of the overridden system, not of the kinetic energy given
    assert abs(float(q[-1, 0, 0]) - math.cos(math.sqrt(2.0))) < 1e-3


def test_fixed_point_failure_names_newton_and_newton_solves_it():
    """A step where the midpoint fixed point cannot contract (h·ω/2 = 2.5) says how to use Newton
    on the same equations, and Newton then takes the step."""
    system = tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1) + 50.0 * (q * q).sum(-1))
    q0, p0 = torch.tensor([1.0]), torch.tensor([0.0])
    with pytest.raises(tgi.ConvergenceError, match=r"solver='newton'.*AlphaMap\(0.5\)|AlphaMap\(0.5\).*solver='newton'"):
        with torch.no_grad():
            tgi.rollout(system, q0, p0, h=0.5, steps=5, method="implicit_midpoint")
    newton = tgi.CotangentLiftIntegrator(tgi.AlphaMap(0.5), solver="newton")
    with torch.no_grad():
        q, p = tgi.rollout(system, q0, p0, h=0.5, steps=5, method=newton)
    E = 0.5 * p ** 2 + 50.0 * q ** 2   # the midpoint rule keeps a quadratic H exactly
    assert torch.allclose(E, E[0], rtol=1e-12)


def test_output_buffers_large_ones_on_huge_pages_same_values():
    """Output rows of ≥ HUGE_BUFFER bytes come from numpy (huge pages on Linux), others from
    torch; either way the dtype, shape, device and the rollout's values are the same."""
    from torchgeo_int import _loop
    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.complex64):
        like = torch.zeros((), dtype=dtype)
        small, big = _loop.output_buffer((3, 2), like), _loop.output_buffer((1 << 20, 2), like)
        assert small.dtype == big.dtype == dtype and big.shape == (1 << 20, 2)
    sys_ = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: 0.5 * (q * q).sum(-1))
    q0 = torch.linspace(-1, 1, 4096, dtype=torch.float64)[:, None]
    p0 = torch.zeros_like(q0)
    with torch.no_grad():
        q, p = tgi.rollout(sys_, q0, p0, h=0.1, steps=200, method="verlet")   # 6.6 MB each
        assert q.numel() * 8 >= _loop.HUGE_BUFFER
        qs, ps = tgi.rollout(sys_, q0[:8], p0[:8], h=0.1, steps=200, method="verlet")
    assert torch.equal(q[:, :8], qs) and torch.equal(p[:, :8], ps)
    assert q.is_contiguous() and q.shape == (201, 4096, 1)


def test_finiteness_check_by_sums_decides_as_the_elementwise_one():
    """rollout's check sums each state (one reduction) and decides element by element only when
    the sum is not finite: the same answer for NaN, ±inf, inf − inf, finite values whose sum
    overflows, complex and empty states, every float dtype."""
    from torchgeo_int import _loop

    def exact(states):
        return all(bool(torch.isfinite(x).all()) for x in states)

    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.complex128):
        big = torch.finfo(torch.float32 if dtype.is_complex else dtype).max
        cases = [torch.ones(5, dtype=dtype), torch.full((4,), big, dtype=dtype),   # sum overflows
                 torch.tensor([1.0, float("nan")]).to(dtype),
                 torch.tensor([float("inf"), -float("inf")]).to(dtype),
                 torch.tensor([float("-inf"), 2.0]).to(dtype), torch.zeros(0, dtype=dtype)]
        for a in cases:
            for b in cases:
                assert _loop._finite((a, b)) == exact((a, b)), (dtype, a, b)
    assert _loop._finite(())
    with pytest.raises(FloatingPointError, match="non-finite"):   # through a rollout
        tgi.rollout(tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1),
                                             lambda q: -(q ** 4).sum(-1)),
                    torch.tensor([2.0]), torch.tensor([0.0]), h=0.5, steps=64, method="verlet")
