"""Adaptive geometric stepping (torchgeo_int.adaptive): reversible variable steps, time
transformations, dense output, odeint's adaptive option, and their errors."""
import math

import pytest
import torch

import torchgeo_int as tgi
from torchgeo_int.adaptive import DKD_METHODS, hermite

from problems import kepler, kepler_energy, kepler_initial, kepler_reference  # tests/problems.py


def kepler_system():
    return kepler(analytic=True)


def batch(*es):
    qs, ps = zip(*[kepler_initial(e) for e in es])
    return torch.stack(qs), torch.stack(ps)


# -- reversible variable steps --------------------------------------------------------------------
@pytest.mark.parametrize("method", ["verlet", "leapfrog_dkd", "yoshida4"])
def test_variable_step_map_is_time_reversible(method):
    H = kepler_system()
    q0, p0 = batch(0.5, 0.8, 0.9)
    with torch.no_grad():
        fw = tgi.adaptive_rollout(H, q0, p0, eps=0.05, steps=300, method=method)
        bw = tgi.adaptive_rollout(H, fw.q[-1], fw.p[-1], eps=-0.05, steps=300, method=method,
                                  rho0=fw.rho[-1], t0=fw.t[-1])
    h = fw.h()
    assert float(h.max() / h.min()) > 10          # the steps do vary (pericentre vs apocentre)
    assert (fw.t[-1] > 2.0).all()
    assert torch.allclose(bw.q[-1], q0, rtol=0, atol=1e-11)
    assert torch.allclose(bw.p[-1], p0, rtol=0, atol=1e-10)
    assert torch.allclose(bw.t[-1], torch.zeros(3), rtol=0, atol=1e-11)
    assert torch.allclose(bw.rho[-1], fw.rho[0], rtol=1e-11, atol=0)
    # the backward run retraces the forward nodes
    assert torch.allclose(bw.q.flip(0), fw.q, rtol=0, atol=1e-11)


def test_reversible_implicit_midpoint_on_a_non_separable_hamiltonian():
    H = tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1) * (1 + 0.1 * (q * q).sum(-1))
                        - 1.0 / q.norm(dim=-1))
    q0, p0 = batch(0.6)
    ctl = tgi.StepControl(lambda q, p: (q * q).sum(-1) ** 0.75 / (1 + 0.01 * (p * p).sum(-1)))
    with torch.no_grad():
        fw = tgi.adaptive_rollout(H, q0, p0, eps=0.05, steps=60, method="implicit_midpoint", control=ctl)
        bw = tgi.adaptive_rollout(H, fw.q[-1], fw.p[-1], eps=-0.05, steps=60, control=ctl,
                                  method="implicit_midpoint", rho0=fw.rho[-1], t0=fw.t[-1])
    assert torch.allclose(bw.q[-1], q0, rtol=0, atol=1e-10)
    assert torch.allclose(bw.p[-1], p0, rtol=0, atol=1e-10)


def test_reversible_steps_keep_energy_bounded_without_drift():
    H = kepler_system()
    q0, p0 = batch(0.9)
    E0 = kepler_energy(q0, p0)
    with torch.no_grad():
        tr = tgi.adaptive_rollout(H, q0, p0, eps=0.05, steps=4000)   # ~ 25 periods
    err = (kepler_energy(tr.q, tr.p) - E0).abs()[:, 0]
    half = err.shape[0] // 2
    assert err.max() < 1e-2
    assert err[half:].max() < 1.5 * err[:half].max()            # no drift


def test_batch_equals_per_sample_with_own_step_sizes():
    H = kepler_system()
    q0, p0 = batch(0.3, 0.9)
    with torch.no_grad():
        both = tgi.adaptive_rollout(H, q0, p0, eps=0.05, steps=200)
        for i in range(2):
            one = tgi.adaptive_rollout(H, q0[i], p0[i], eps=0.05, steps=200)
            assert torch.allclose(both.q[:, i], one.q, rtol=0, atol=1e-13)
            assert torch.allclose(both.t[:, i], one.t, rtol=1e-14, atol=0)
    assert not torch.allclose(both.t[-1, 0], both.t[-1, 1])    # each sample in its own time


def test_adaptive_rollout_backprop_matches_finite_differences():
    H = kepler_system()
    q0, p0 = kepler_initial(0.6)

    def f(p):
        tr = tgi.adaptive_rollout(H, q0, p, eps=0.1, steps=15)
        return tr.q[-1].sum() + tr.t[-1]
    assert torch.autograd.gradcheck(f, (p0.clone().requires_grad_(),), eps=1e-6, atol=1e-6)


def test_reversible_errors():
    H = kepler_system()
    q0, p0 = kepler_initial(0.9)
    with pytest.raises(ValueError, match="not symmetric"):
        tgi.adaptive_rollout(H, q0, p0, eps=0.05, steps=10, method="symplectic_euler")
    with pytest.raises(ValueError, match="sigma must be finite and > 0"):
        tgi.adaptive_rollout(H, q0, p0, eps=0.05, steps=10, control=lambda q: -q.norm(dim=-1))
    with pytest.raises(tgi.StepSizeCollapse, match="rho became non-positive"):
        tgi.adaptive_rollout(H, q0, p0, eps=3.0, steps=200)
    with pytest.raises(tgi.StepSizeCollapse, match="h_min"):
        tgi.adaptive_rollout(H, q0, p0, eps=0.05, steps=100, h_min=0.01)
    with pytest.raises(tgi.StepSizeCollapse, match="did not reach"):
        tgi.adaptive_rollout(H, q0, p0, eps=0.05, until=100.0, max_steps=100)
    with pytest.raises(ValueError, match="exactly one"):
        tgi.adaptive_rollout(H, q0, p0, eps=0.05)


# -- time transformations -------------------------------------------------------------------------
def test_log_hamiltonian_leapfrog_conserves_kepler_energy_to_round_off():
    H = kepler_system()
    q0, p0 = batch(0.9, 0.99)
    E0 = kepler_energy(q0, p0)
    with torch.no_grad():
        tr = tgi.time_transformed_rollout(H, q0, p0, eps=2 * math.pi / 100, steps=2000)
        K = tgi.LogHamiltonian(H, state_shape=(2,))
        gamma = K.energy(tr.Q, tr.P)
    err = (kepler_energy(tr.q, tr.p) - E0).abs()
    assert err.max() < 1e-12 * 1e2          # round-off growth only, at e = 0.99 too
    assert gamma.abs().max() < 1e-12        # the transformed Hamiltonian stays 0
    # fictive time per period is 2π for every e (dt/dτ = r): 20 periods, each sample its own t
    assert torch.allclose(tr.t[-1] / (2 * math.pi), torch.full((2,), 20.0), rtol=2e-2)
    assert (tr.h() > 0).all()
    # the kick–drift–kick form is second order only (that exactness is the DKD's)
    with torch.no_grad():
        kdk = tgi.time_transformed_rollout(H, q0, p0, eps=2 * math.pi / 100, steps=200, method="verlet")
    assert (kepler_energy(kdk.q, kdk.p) - E0).abs().max() > 1e-6


def test_poincare_transform_energy_bounded_and_hamiltonian_near_zero():
    H = kepler_system()
    q0, p0 = batch(0.5)
    E0 = kepler_energy(q0, p0)
    with torch.no_grad():
        tr = tgi.time_transformed_rollout(H, q0, p0, eps=0.1, steps=130, transform="poincare")
        K = tgi.PoincareTransform(H, state_shape=(2,)).energy(tr.Q, tr.P)
    err = (kepler_energy(tr.q, tr.p) - E0).abs()[:, 0]
    assert (tr.t[-1] > 2 * math.pi).all()                       # two periods (τ-period 2π)
    assert err.max() < 5e-3
    assert err[65:].max() < 1.5 * err[:66].max()                # bounded, no drift
    assert K.abs().max() < 5e-3


def test_time_transformation_errors():
    H = kepler_system()
    q0, p0 = kepler_initial(0.5)
    with pytest.raises(ValueError, match="g must be finite and > 0"):
        tgi.time_transformed_rollout(H, q0, p0, eps=0.1, steps=5, transform="poincare",
                                     g=lambda q, p: -q.norm(dim=-1))
    positive = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: 0.5 * (q * q).sum(-1))
    with pytest.raises(ValueError, match="V\\(q\\) < 0"):
        tgi.time_transformed_rollout(positive, q0, p0, eps=0.1, steps=5)
    with pytest.raises(TypeError, match="SeparableHamiltonian"):
        tgi.LogHamiltonian(tgi.Hamiltonian(lambda q, p: (p * p).sum(-1)), state_shape=(2,))
    with pytest.raises(ValueError, match="transform must be"):
        tgi.time_transformed_rollout(H, q0, p0, eps=0.1, steps=5, transform="sundman")


# -- dense output -----------------------------------------------------------------------------------
def test_hermite_dense_output_has_order_four_error():
    # exact harmonic-oscillator nodes at uneven spacing: the interpolation error alone
    def errors(h):
        gen = torch.Generator().manual_seed(0)
        steps = h * (0.5 + torch.rand(int(2 / h), generator=gen))
        tn = torch.cat([torch.zeros(1), steps.cumsum(0)])
        q, p = torch.sin(tn)[:, None], torch.cos(tn)[:, None]
        sys_ = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: 0.5 * (q * q).sum(-1))
        tt = torch.linspace(0.0, float(tn[-1]), 97)
        qi, pi = tgi.dense_output(sys_, tn, q, p, tt)
        return max((qi[:, 0] - torch.sin(tt)).abs().max(), (pi[:, 0] - torch.cos(tt)).abs().max())
    e1, e2 = errors(0.1), errors(0.05)
    slope = math.log2(e1 / e2)
    assert 3.6 < slope < 4.4, slope


def test_dense_output_reproduces_nodes_and_converges_on_a_trajectory():
    H = kepler_system()
    q0, p0 = batch(0.6, 0.8)
    with torch.no_grad():
        tr = tgi.time_transformed_rollout(H, q0, p0, eps=0.02, steps=400,
                                          method="leapfrog_dkd_yoshida4")
        qn, pn = tr.at(tr.t[150:151])                      # per-sample node times (n, *batch)
        assert torch.allclose(qn[0], tr.q[150], rtol=0, atol=1e-14)
        # interpolated state at common times: close to a fine fixed-step reference
        tt = torch.tensor([0.37, 1.9, 3.3])
        qi, pi = tr.at(tt)
        for i, e in enumerate((0.6, 0.8)):
            for k, T in enumerate(tt.tolist()):
                ref_q, ref_p = kepler_reference(e, T)
                assert torch.allclose(qi[k, i], ref_q, atol=1e-7)
                assert torch.allclose(pi[k, i], ref_p, atol=1e-6)
        with pytest.raises(ValueError, match="outside the integrated interval"):
            tr.at(torch.tensor([1e3]))


# -- odeint ---------------------------------------------------------------------------------------
def _kepler_func(t, y):
    q, p = y
    return p, -q / q.norm(dim=-1, keepdim=True) ** 3


def test_odeint_adaptive_reversible_dense_output_and_batch():
    q0, p0 = batch(0.5, 0.9)
    t = torch.linspace(0.0, 7.0, 8)
    opts = dict(adaptive="reversible", step_size=0.04, separable=True, batch_dims=1,
                control=lambda q: q.norm(dim=-1) ** 1.5)
    with torch.no_grad():
        q, p = tgi.odeint(_kepler_func, (q0, p0), t, method="yoshida4", options=opts)
        assert q.shape == (8, 2, 2)
        assert torch.equal(q[0], q0)
        H = kepler_system()
        for i in range(2):
            one = tgi.odeint(_kepler_func, (q0[i], p0[i]), t, method="yoshida4",
                             options={**opts, "batch_dims": 0})
            assert torch.allclose(one[0], q[:, i], atol=1e-12)
            ref_q = torch.stack([kepler_reference((0.5, 0.9)[i], T)[0] for T in t.tolist()[1:]])
            assert torch.allclose(q[1:, i], ref_q, atol=1e-3)
        E = kepler_energy(q, p)
        assert (E - E[0]).abs().max() < 1e-3


def test_odeint_adaptive_errors():
    q0, p0 = kepler_initial(0.5)
    t = torch.linspace(0.0, 1.0, 3)
    with pytest.raises(ValueError, match="not symmetric"):
        tgi.odeint(_kepler_func, (q0, p0), t, method="symplectic_euler",
                   options=dict(adaptive="reversible", step_size=0.01, separable=True))
    with pytest.raises(ValueError, match="needs options\\['step_size'\\]"):
        tgi.odeint(_kepler_func, (q0, p0), t, method="verlet", options=dict(adaptive="reversible"))
    with pytest.raises(ValueError, match="must be 'reversible'"):
        tgi.odeint(_kepler_func, (q0, p0), t, method="verlet",
                   options=dict(adaptive="error", step_size=0.01))
    with pytest.raises(ValueError, match="not options\\['compile'\\]"):
        tgi.odeint(_kepler_func, (q0, p0), t, method="verlet",
                   options=dict(adaptive="reversible", step_size=0.01, compile=True))


def test_dkd_leapfrog_is_a_symmetric_second_order_method():
    m = DKD_METHODS["leapfrog_dkd"]
    assert m.symmetric and m.order == 2 and m.splitting() == ((0.0, 1.0, 0.0), (0.5, 0.5))
    assert DKD_METHODS["leapfrog_dkd_yoshida4"].order == 4
    assert torch.allclose(hermite(torch.tensor(0.), torch.tensor(1.), torch.tensor([1.]),
                                  torch.tensor([2.]), torch.tensor([1.]), torch.tensor([1.]),
                                  torch.tensor(0.5)), torch.tensor([1.5]))


def test_time_transformed_rollout_gradient_modes_agree_with_backprop():
    H = kepler_system()
    q0, p0 = kepler_initial(0.7)

    def grad(mode):
        p = p0.clone().requires_grad_()
        tr = tgi.time_transformed_rollout(H, q0, p, eps=0.1, steps=40, grad=mode)
        (tr.q[-1].sum() + tr.t[-1]).backward()      # through p_t = −H(q0, p) too
        return p.grad
    ref = grad("backprop")
    assert torch.allclose(grad("checkpoint"), ref, rtol=1e-10, atol=0)
    assert torch.allclose(grad("reversible"), ref, rtol=1e-8, atol=0)


# -- review fixes (2026-12-05) ----------------------------------------------------------------------
@pytest.mark.parametrize("transform", ["logh", "poincare"])
def test_time_transformed_rollout_differentiates_the_hamiltonians_parameters(transform):
    # p_t = −H(q₀, p₀) depends on H's parameters; it was taken without a graph unless q0 or p0
    # required grad, so dL/dk was 0 (logh: k reaches the flow only through p_t) or wrong
    q0, p0 = kepler_initial(0.6)

    def loss(k):
        H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: -k / q.norm(dim=-1))
        tr = tgi.time_transformed_rollout(H, q0, p0, eps=0.1, steps=30, transform=transform)
        return tr.q[-1].sum() + tr.t[-1]
    k = torch.tensor(1.0, requires_grad=True)
    loss(k).backward()
    d = 1e-6
    with torch.no_grad():
        fd = (loss(torch.tensor(1.0 + d)) - loss(torch.tensor(1.0 - d))) / (2 * d)
    assert abs(float(fd)) > 0.1
    assert torch.allclose(k.grad, fd, rtol=1e-6, atol=0)


def test_odeint_adaptive_steps_each_sample_of_a_coupled_tuple_state_as_one():
    # two bodies in absolute coordinates: q, p of shape (2, 2) are ONE sample (batch_dims = 0).
    # In the user's shapes (the explicit-splitting fast path) each body had its own steps and time.
    def two_body(t, y):
        q, p = y
        d = q[0] - q[1]
        f = -d / d.norm() ** 3
        return p, torch.stack([f, -f])
    q0 = torch.tensor([[0.5, 0.0], [-0.5, 0.0]])
    p0 = torch.tensor([[0.0, 0.6], [0.0, -0.6]])
    t = torch.linspace(0.0, 2.0, 5)
    opts = dict(adaptive="reversible", step_size=0.02, control=lambda q: (q[0] - q[1]).norm() ** 1.5)
    with torch.no_grad():
        q, p = tgi.odeint(two_body, (q0, p0), t, method="verlet", options={**opts, "separable": True})
        q_gen, _ = tgi.odeint(two_body, (q0, p0), t, method="verlet", options=opts)
        ref, _ = tgi.odeint(two_body, (q0, p0), t, method="yoshida4", options=dict(step_size=1e-3))
    assert q.shape == (5, 2, 2)
    assert torch.allclose(q, q_gen, atol=1e-12)     # the explicit and the generic step agree
    assert torch.allclose(q, ref, atol=5e-3)


def test_odeint_adaptive_option_names_are_refused_without_adaptive_and_for_torchdiffeq():
    q0, p0 = kepler_initial(0.5)
    t = torch.linspace(0.0, 1.0, 3)
    for extra in (dict(control=lambda q: q.norm(dim=-1)), dict(h_min=1.0), dict(form="bogus"),
                  dict(max_steps=10)):
        with pytest.raises(ValueError, match="pass options\\['adaptive'\\] = 'reversible'"):
            tgi.odeint(_kepler_func, (q0, p0), t, method="verlet",
                       options=dict(step_size=0.01, separable=True, **extra))
    with pytest.raises(ValueError, match="torchdiffeq's method 'dopri5' has its own error control"):
        tgi.odeint(lambda t, y: -y, q0, t, method="dopri5", options=dict(adaptive="reversible"))
    with pytest.raises(ValueError, match="max_steps must be an int >= 1"):
        tgi.odeint(_kepler_func, (q0, p0), t, method="verlet",
                   options=dict(adaptive="reversible", step_size=0.01, max_steps=2.7))


def test_a_constant_step_control_gives_fixed_steps():
    H = kepler_system()
    q0, p0 = kepler_initial(0.5)
    with torch.no_grad():
        tr = tgi.adaptive_rollout(H, q0, p0, eps=0.01, steps=50, control=lambda q: torch.ones(q.shape[:-1]))
        q, p = tgi.rollout(H, q0, p0, h=0.01, steps=50)
    assert torch.allclose(tr.q, q, atol=1e-14) and torch.allclose(tr.t[-1], torch.tensor(0.5))


def test_adaptive_inputs_that_are_not_numbers_or_shapes_are_refused():
    H = kepler_system()
    q0, p0 = batch(0.5, 0.6)
    nan = float("nan")
    with pytest.raises(ValueError, match="t0 contains NaN"):
        tgi.adaptive_rollout(H, q0, p0, eps=0.05, steps=5, t0=nan)
    with pytest.raises(ValueError, match="h_min"):
        tgi.adaptive_rollout(H, q0, p0, eps=0.05, steps=5, h_min=nan)
    with pytest.raises(ValueError, match="h_min"):
        tgi.adaptive_rollout(H, q0, p0, eps=0.05, steps=5, h_min=-1.0)
    with pytest.raises(ValueError, match="max_steps must be an int >= 1"):
        tgi.adaptive_rollout(H, q0, p0, eps=0.05, until=1.0, max_steps=None)
    with pytest.raises(ValueError, match="rho0 must be a number or a tensor of the batch shape"):
        tgi.adaptive_rollout(H, q0, p0, eps=0.05, steps=5, rho0=torch.ones(3))
    with pytest.raises(ValueError, match="until must be a finite time"):
        tgi.adaptive_rollout(H, q0, p0, eps=0.05, until=float("inf"))
    with torch.no_grad():
        tr = tgi.adaptive_rollout(H, q0, p0, eps=0.05, steps=20)
    with pytest.raises(ValueError, match="times contains NaN"):
        tr.at(torch.tensor([nan]))
    # time transformations
    with pytest.raises(ValueError, match="chunk must be an int >= 1"):   # chunk=0 looped forever
        tgi.time_transformed_rollout(H, q0, p0, eps=0.1, until=2.0, chunk=0, max_steps=100)
    with pytest.raises(ValueError, match="t0 contains NaN"):
        tgi.time_transformed_rollout(H, q0, p0, eps=0.1, steps=5, t0=nan)
    with pytest.raises(ValueError, match="g is the Poincaré transformation's"):
        tgi.time_transformed_rollout(H, q0, p0, eps=0.1, steps=5, g=lambda q, p: q.norm(dim=-1))


def test_time_transformed_rollout_counts_its_steps_and_takes_g_of_q():
    H = kepler_system()
    q0, p0 = kepler_initial(0.5)
    with torch.no_grad():
        tr = tgi.time_transformed_rollout(H, q0, p0, eps=0.1, steps=10, save_every=3)
        a = tgi.time_transformed_rollout(H, q0, p0, eps=0.1, steps=8, transform="poincare",
                                         g=lambda q: q.norm(dim=-1))
        b = tgi.time_transformed_rollout(H, q0, p0, eps=0.1, steps=8, transform="poincare",
                                         g=lambda q, p: q.norm(dim=-1))
    assert tr.steps == 10
    assert torch.equal(a.q, b.q)


def test_until_is_checked_as_a_time():
    """until was read by float(until): a string ran, an until requiring grad lost its gradient
    silently, and one of two elements failed with torch's "only one element tensors can be
    converted"; now checked as t0 and h are, naming until."""
    H = kepler_system()
    q0, p0 = batch(0.5, 0.6)
    for until, err, match in (("2.0", TypeError, "until must be a real number, got str"),
                              (torch.tensor(2.0, requires_grad=True), ValueError, "until requires grad"),
                              (torch.tensor([2.0, 3.0]), TypeError, r"until must be .*0-d real tensor")):
        with pytest.raises(err, match=match):
            tgi.adaptive_rollout(H, q0, p0, eps=0.05, until=until)
        with pytest.raises(err, match=match):
            tgi.time_transformed_rollout(H, q0, p0, eps=0.1, until=until, chunk=8)
    with torch.no_grad():
        a = tgi.adaptive_rollout(H, q0, p0, eps=0.05, until=torch.tensor(2.0))   # 0-d: a time
        b = tgi.adaptive_rollout(H, q0, p0, eps=0.05, until=2.0)
    assert torch.equal(a.t, b.t) and bool((a.t[-1] >= 2.0).all())


@pytest.mark.parametrize("method", ["newmark_average_acceleration", "sode_midpoint", "variational_verlet"])
def test_variable_steps_refuse_methods_that_step_a_systems_own_structure(method):
    """step_control with a second-order or variational method failed inside the step naming the
    internal _TimeScaled ("pass a SecondOrderSystem, got _TimeScaled"): refused up front."""
    system = (tgi.SecondOrderSystem(lambda t, q: -q) if method != "variational_verlet"
              else tgi.Lagrangian.mechanical(lambda q: (q * q).sum(-1)))
    with pytest.raises(ValueError, match=f"{method}.*does not step: use a Hamiltonian method"):
        tgi.rollout(system, torch.randn(3, 2), torch.randn(3, 2), h=0.1, steps=4, method=method,
                    step_control=tgi.power_law_control(1.0))
