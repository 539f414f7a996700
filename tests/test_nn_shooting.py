"""TrajectoryFit (initial-state estimation + multiple shooting) and the modified-Hamiltonian
series / correction of torchgeo_int.nn.  float64, fixed seeds, small sizes."""
import math

import pytest
import torch

import torchgeo_int as tgi
from torchgeo_int.nn import (CorrectedHamiltonian, InverseModifiedHamiltonian, ModifiedHamiltonian,
                             SeparableHNN, TrajectoryFit,
                             correct_hamiltonian, derivative_loss, fit, hamiltonian_error,
                             modified_hamiltonian, rollout_mse)
from torchgeo_int.nn.correction import SERIES

DT = torch.float64


@pytest.fixture(autouse=True)
def _float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(DT)
    yield
    torch.set_default_dtype(old)


def _oscillator():
    return tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: 0.5 * (q * q).sum(-1))


def _pendulum():
    return tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: (1 - torch.cos(q)).sum(-1))


def _data(H, B=6, T=21, dt=0.1, method="verlet", substeps=1, noise=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q0 = torch.rand(B, 1, generator=g) * 2 - 1
    p0 = torch.rand(B, 1, generator=g) * 2 - 1
    q, p = tgi.rollout(H, q0, p0, h=dt / substeps, steps=(T - 1) * substeps, method=method,
                       save_every=substeps)
    q, p = q.transpose(0, 1), p.transpose(0, 1)
    clean = (q.clone(), p.clone())
    if noise:
        q = q + noise * torch.randn(q.shape, generator=g)
        p = p + noise * torch.randn(p.shape, generator=g)
    return q, p, clean


# ---------------------------------------------------------------- TrajectoryFit


@pytest.mark.parametrize("segment", [None, 4, 1])
def test_exact_steps_of_the_method_give_zero_loss_and_no_defects(segment):
    """Data that are Verlet steps of H, nodes at the observations: every segment's rollout hits
    every observation and the next node, for single and multiple shooting."""
    H = _pendulum()
    q, p, _ = _data(H, T=21)
    tf = TrajectoryFit(H, q, p, dt=0.1, segment=segment, method="verlet")
    assert tf.n_segments == (1 if segment is None else 20 // segment)
    assert tf.q_nodes.shape == (6, tf.n_segments, 1)
    assert float(tf().detach()) < 1e-28
    if tf.n_segments > 1:
        assert float(tf.continuity_defects().max()) < 1e-13
    # another method's steps do not fit: the loss sees the integrator
    other = TrajectoryFit(H, q, p, dt=0.1, segment=segment, method="symplectic_euler")
    assert float(other().detach()) > 1e-8


def test_substeps_and_higher_order_methods_fit_the_exact_flow_better():
    """Data of the exact flow (yoshida8 at a tiny step): yoshida4 and implicit-midpoint-yoshida4
    at h = dt fit far better than Verlet at h = dt, and Verlet with 4 substeps 4² times closer
    (the loss, a squared error, 256× smaller)."""
    H = _pendulum()
    q, p, _ = _data(H, B=4, T=6, dt=0.2, method="yoshida8", substeps=8)
    loss = {}
    for method, sub in [("verlet", 1), ("verlet", 4), ("yoshida4", 1), ("implicit_midpoint_yoshida4", 1)]:
        loss[method, sub] = float(TrajectoryFit(H, q, p, dt=0.2, method=method, substeps=sub)().detach())
    v1 = loss["verlet", 1]
    assert 256 * 0.7 < v1 / loss["verlet", 4] < 256 * 1.3      # error O(h²) → loss O(h⁴)
    assert loss["yoshida4", 1] < 1e-3 * v1
    assert loss["implicit_midpoint_yoshida4", 1] < 1e-2 * v1


def test_continuity_ties_a_segment_to_the_next_node_and_grad_modes_agree():
    H = _oscillator()
    q, p, _ = _data(H, T=13, noise=0.05)
    tf = TrajectoryFit(H, q, p, dt=0.1, segment=4, continuity=2.0)
    tf(torch.tensor([0])).backward()               # segment 0 of trajectory 0 alone
    assert float(tf.p_nodes.grad[0, 1].abs().sum()) > 0      # reaches node 1 through continuity
    assert float(tf.p_nodes.grad[0, 2].abs().sum()) == 0
    assert float(tf.p_nodes.grad[1:].abs().sum()) == 0
    # no continuity: independent segments
    free = TrajectoryFit(H, q, p, dt=0.1, segment=4, continuity=0.0)
    free(torch.tensor([0])).backward()
    assert float(free.p_nodes.grad[0, 1].abs().sum()) == 0
    # the loss is the data misfit + w × the mean squared defect
    idx = torch.arange(tf.trajectories * tf.n_segments)
    with torch.no_grad():
        d = tf.continuity_defects()
        assert float(tf(idx)) == pytest.approx(float(free(idx)) + 2.0 * 0.5 * float((d ** 2).mean()),
                                               rel=1e-12)
    # grad="checkpoint" through a learned model: same loss, same gradients
    torch.manual_seed(0)
    model = SeparableHNN(1, width=8)
    grads = []
    for opts in ({}, {"grad": "checkpoint"}):
        t = TrajectoryFit(model, q, p, dt=0.1, segment=4, **opts)
        model.zero_grad()
        loss = t()
        loss.backward()
        grads.append((float(loss.detach()), [x.grad.clone() for x in model.parameters()]))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-12)
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_estimated_initial_states_beat_the_noisy_observations():
    """SRNN's initial-state estimation: with the true H fixed, fitting the states to a whole noisy
    trajectory brings them much closer to the clean states than the observations are."""
    H = _oscillator()
    q, p, (qc, pc) = _data(H, B=16, T=21, dt=0.15, noise=0.1, seed=1)
    tf = TrajectoryFit(H, q, p, dt=0.15)
    opt = torch.optim.Adam([tf.q_nodes, tf.p_nodes], lr=0.02)
    for _ in range(60):
        opt.zero_grad()
        tf().backward()
        opt.step()
    q0, p0 = tf.initial_states()
    err_est = ((q0 - qc[:, 0]) ** 2 + (p0 - pc[:, 0]) ** 2).mean()
    err_obs = ((q[:, 0] - qc[:, 0]) ** 2 + (p[:, 0] - pc[:, 0]) ** 2).mean()
    assert float(err_est) < 0.2 * float(err_obs)


def test_fit_trains_model_and_states_and_the_model_alone_evaluates():
    H = _oscillator()
    q, p, _ = _data(H, B=8, T=13, noise=0.05, seed=2)
    torch.manual_seed(0)
    model = SeparableHNN(1, width=16)
    tf = TrajectoryFit(model, q, p, dt=0.1, segment=3, method="verlet", substeps=2)
    opt = tf.optimizer(lr=3e-3, state_lr=1e-3, weight_decay=1e-4)
    assert [g["weight_decay"] for g in opt.param_groups] == [1e-4, 0.0]
    assert [g["lr"] for g in opt.param_groups] == [3e-3, 1e-3]
    states0 = tf.q_nodes.detach().clone()
    first = float(tf().detach())
    hist = fit(tf, TrajectoryFit.loss, tf.segments, steps=60, batch_size=16, optimizer=opt,
               progress=False)
    assert hist["loss"][-1] < 0.3 * first
    assert not torch.equal(tf.q_nodes.detach(), states0)
    # held-out trajectories: the model alone, no states
    qt, pt, _ = _data(H, B=4, T=13, seed=3)
    assert math.isfinite(float(rollout_mse(tf.model, qt, pt, dt=0.1)))


def test_trajectory_fit_errors():
    H = _oscillator()
    q, p, _ = _data(H, B=3, T=13)
    with pytest.raises(ValueError, match="shooting grid does not divide"):
        TrajectoryFit(H, q, p, dt=0.1, segment=5)
    with pytest.raises(ValueError, match=r"time-first \(T, B, n\) = \(13, 3, 1\), transpose"):
        TrajectoryFit(H, q.transpose(0, 1), p.transpose(0, 1), dt=0.1, segment=4)
    with pytest.raises(ValueError, match="one state per trajectory and shooting node"):
        TrajectoryFit(H, q, p, dt=0.1, segment=4, q0=torch.zeros(3, 1), p0=torch.zeros(3, 1))
    with pytest.raises(ValueError, match="one state per trajectory"):
        TrajectoryFit(H, q, p, dt=0.1, q0=torch.zeros(4, 1), p0=torch.zeros(4, 1))
    with pytest.raises(ValueError, match="both q0 and p0"):
        TrajectoryFit(H, q, p, dt=0.1, q0=torch.zeros(3, 1))
    with pytest.raises(ValueError, match="segment must be an int"):
        TrajectoryFit(H, q, p, dt=0.1, segment=0)
    with pytest.raises(ValueError, match="continuity"):
        TrajectoryFit(H, q, p, dt=0.1, continuity=-1.0)
    with pytest.raises(ValueError, match="shape"):
        TrajectoryFit(H, q[0], p[0], dt=0.1)
    tf = TrajectoryFit(H, q, p, dt=0.1, segment=4, q0=q[:, :12:4] + 0.1, p0=p[:, :12:4])
    assert torch.equal(tf.q_nodes.detach(), q[:, :12:4] + 0.1)
    with pytest.raises(ValueError, match=r"segment ids must lie in \[0, 9\)"):
        tf(torch.tensor([9]))
    with pytest.raises(ValueError, match="integer tensor"):
        tf(torch.tensor([0.0]))
    with pytest.raises(ValueError, match="no trainable parameters"):
        tf.optimizer()

    with pytest.raises(ValueError, match="gauss_newton must be an int"):
        TrajectoryFit(H, q, p, dt=0.1, gauss_newton=-1)
    with pytest.raises(ValueError, match="solve_every must be an int"):
        TrajectoryFit(H, q, p, dt=0.1, gauss_newton=1, solve_every=0)
    with pytest.raises(ValueError, match="solve_every = 2 applies to solved states"):
        TrajectoryFit(H, q, p, dt=0.1, solve_every=2)
    with pytest.raises(ValueError, match=r"model's states have dim 2 \(model.dim\) but the data's have n = 1"):
        TrajectoryFit(SeparableHNN(2, width=4), q, p, dt=0.1)
    solved = TrajectoryFit(SeparableHNN(1, width=4), q, p, dt=0.1, gauss_newton=1)
    with pytest.raises(ValueError, match="state_lr has no effect"):
        solved.optimizer(state_lr=1e-2)
    with pytest.raises(ValueError, match="steps must be an int"):
        solved.solve_states(steps=0)
    with pytest.raises(ValueError, match="segment ids must be distinct"):
        solved.solve_states(torch.tensor([1, 1]))
    with pytest.raises(ValueError, match=r"segment ids must lie in \[0, 3\)"):
        solved.solve_states(torch.tensor([3]))
    with pytest.raises(TypeError, match=r"derivatives must be a pair \(dq, dp\)"):
        TrajectoryFit(H, q, p, dt=0.1, derivatives=q)
    with pytest.raises(ValueError, match="q and dq must have the same shape"):
        TrajectoryFit(H, q, p, dt=0.1, derivatives=(q[:, 1:], p[:, 1:]))
    with pytest.raises(ValueError, match=r"derivatives must have the states' layout, \(B, T, n\) = \(3, 13, 1\); "
                                         r"got \(13, 3, 1\), time-first: transpose"):
        TrajectoryFit(H, q, p, dt=0.1, derivatives=(q.transpose(0, 1), p.transpose(0, 1)))
    with pytest.raises(ValueError, match="derivative_weight"):
        TrajectoryFit(H, q, p, dt=0.1, derivatives=(q, p), derivative_weight=-1.0)
    with pytest.raises(ValueError, match="derivative_weight = 2.0 applies to observed derivatives"):
        TrajectoryFit(H, q, p, dt=0.1, derivative_weight=2.0)
    with pytest.raises(ValueError, match="derivative_points = 5 applies to observed derivatives"):
        TrajectoryFit(H, q, p, dt=0.1, derivative_points=5)
    with pytest.raises(ValueError, match="derivative_points"):
        TrajectoryFit(H, q, p, dt=0.1, derivatives=(q, p), derivative_points=0)


def _minimise_states(fit_module, objective, *, max_iter):
    """L-BFGS on the fit's node states for ``objective()`` (the reference minimiser)."""
    opt = torch.optim.LBFGS([fit_module.q_nodes, fit_module.p_nodes], max_iter=max_iter,
                            tolerance_grad=1e-14, tolerance_change=1e-16, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    opt.step(closure)


def _vf(H, q, p):
    dq, dp = H.vector_field(q, p, 0.0)
    return dq.detach(), dp.detach()


def _each_time_once(x, S):
    """Segment rollouts (segment + 1, B·S, n) → the fit's state at every observation time,
    (B, T, n): time s·segment + j from segment s's j-th state for j < segment, and the last time
    from the last segment's end (an inner node's time at the node, not at the segment before)."""
    B, n = x.shape[1] // S, x.shape[2]
    body = x[:-1].transpose(0, 1).reshape(B, S * (x.shape[0] - 1), n)
    return torch.cat([body, x[-1].reshape(B, S, n)[:, -1:]], 1)


@pytest.mark.parametrize("segment", [None, 4])
def test_derivatives_are_matched_at_the_fits_states_not_at_the_observations(segment):
    """With ``derivatives``, the loss adds w × derivative_loss at the states the fit rolls out,
    each observation time once (an inner node's time at the node), with no graph to the node
    states."""
    H = _oscillator()
    q, p, (qc, pc) = _data(H, B=4, T=13, noise=0.05, seed=3)
    dq, dp = _vf(H, qc, pc)
    torch.manual_seed(0)
    model = SeparableHNN(1, width=8)
    plain = TrajectoryFit(model, q, p, dt=0.1, segment=segment)
    tf = TrajectoryFit(model, q, p, dt=0.1, segment=segment, derivatives=(dq, dp), derivative_weight=3.0)
    qs, ps = plain._roll(plain.q_nodes.reshape(-1, 1), plain.p_nodes.reshape(-1, 1))   # (seg+1, N, 1)
    S = plain.n_segments
    want = plain() + 3.0 * derivative_loss(model, *(_each_time_once(x.detach(), S) for x in (qs, ps)), dq, dp)
    got = tf()
    assert float(got) == pytest.approx(float(want), rel=1e-12)
    got.backward()
    g_states = tf.p_nodes.grad.clone()
    tf.zero_grad()
    plain().backward()
    torch.testing.assert_close(g_states, plain.p_nodes.grad, rtol=1e-12, atol=0)   # states: data terms only
    # weight 0: the plain fit
    zero = TrajectoryFit(model, q, p, dt=0.1, segment=segment, derivatives=(dq, dp), derivative_weight=0.0)
    assert float(zero()) == float(plain())


@pytest.mark.parametrize("segment,method", [(None, "verlet"), (1, "verlet"), (4, "yoshida4")])
def test_the_nodes_force_serves_the_rollout_and_the_derivative_term_once(monkeypatch, segment, method):
    """Solved node states with observed derivatives on a separable H_θ: X_H at the nodes shares
    ∂V/∂q with the rollout's first kick (its FSAL cache), one evaluation a node instead of two,
    and the state solve evaluates each half only at the n + 1 of its Jacobian's m + 1 states
    that differ in that half.  The loss, its gradient and the solved states are those of
    evaluating every one (the states to the forward differences' rounding)."""
    g = torch.Generator().manual_seed(5)
    B, T, n = 3, 9, 2
    q, p, dq, dp = (torch.randn(B, T, n, generator=g) for _ in range(4))
    torch.manual_seed(0)
    model = SeparableHNN(n, width=8)
    rows = []
    grad_V = model.potential.input_grad
    monkeypatch.setattr(model.potential, "input_grad", lambda x: rows.append(x[..., 0].numel()) or grad_V(x))

    def run(reuse):
        tf = TrajectoryFit(model, q, p, dt=0.1, segment=segment, method=method, gauss_newton=1,
                           derivatives=(dq, dp), derivative_weight=2.0,
                           layout="windows").eval()   # (random stand-ins: no axis looks like time)
        if not reuse:
            monkeypatch.setattr(tf, "_first_kick", lambda: None)
        rows.clear()
        loss = tf()
        forward_rows = sum(rows)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        rows.clear()
        tf.solve_states(steps=2)
        return loss.detach(), grads, forward_rows, sum(rows), tf.q_nodes.detach(), tf.p_nodes.detach()

    got, want = run(True), run(False)
    nodes = B * (1 if segment is None else (T - 1) // segment)
    assert float(got[0]) == float(want[0])
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    assert want[2] - got[2] == nodes                        # the forward: one ∂V/∂q a node saved
    assert got[3] < want[3]                                  # the solve: fewer too
    torch.testing.assert_close(got[4], want[4], rtol=0, atol=1e-6)
    torch.testing.assert_close(got[5], want[5], rtol=0, atol=1e-6)
    assert float((got[4] - q[:, :T - 1:segment or T - 1]).abs().max()) > 1e-3     # the solve moved them


def test_the_shared_force_path_keeps_flat_batches_and_the_checks():
    """The solve's halves see flat (N, n) batches, as every other evaluation does (a potential
    written for 2-d batches keeps working), and check_every is checked when the fit is built,
    whichever path its rollouts take."""
    class Pendulum(torch.nn.Module):                      # indexes q[:, 0]: 2-d batches only
        def __init__(self):
            super().__init__()
            self.k = torch.nn.Parameter(torch.tensor(1.3))

        def forward(self, q):
            return self.k * (1 - torch.cos(q[:, 0]))

    g = torch.Generator().manual_seed(2)
    q, p, dq, dp = (torch.randn(2, 5, 1, generator=g) for _ in range(4))
    model = tgi.SeparableHamiltonian(None, Pendulum(), mass=1.0)
    tf = TrajectoryFit(model, q, p, dt=0.1, segment=2, gauss_newton=1, derivatives=(dq, dp))
    assert tf._first_kick() is not None and math.isfinite(float(tf(torch.arange(4))))
    with pytest.raises(ValueError, match="check_every"):
        TrajectoryFit(model, q, p, dt=0.1, check_every=0)


def test_derivative_points_match_a_random_subset_an_unbiased_estimate():
    """``derivative_points=k``: in training mode the derivative term is the mean over k of the
    batch's points drawn afresh each call, so its average over draws is the full term; evaluation
    mode, and k at least the batch's points, take every point."""
    H = _oscillator()
    q, p, (qc, pc) = _data(H, B=4, T=13, noise=0.05, seed=3)
    dq, dp = _vf(H, qc, pc)
    torch.manual_seed(0)
    model = SeparableHNN(1, width=8)
    plain = TrajectoryFit(model, q, p, dt=0.1, segment=4)
    full = TrajectoryFit(model, q, p, dt=0.1, segment=4, derivatives=(dq, dp))
    with torch.no_grad():
        base, want = float(plain()), float(full()) - float(plain())
        assert want > 0
        sub = TrajectoryFit(model, q, p, dt=0.1, segment=4, derivatives=(dq, dp), derivative_points=5)
        torch.manual_seed(1)
        draws = torch.tensor([float(sub()) - base for _ in range(600)])
        assert float(draws.std()) > 0.05 * want                       # the draws do differ
        assert float(draws.mean()) == pytest.approx(want, rel=4 * float(draws.std()) / 600 ** 0.5 / want)
        assert float(sub.eval()()) == pytest.approx(float(full()), rel=1e-12)
        every = TrajectoryFit(model, q, p, dt=0.1, segment=4, derivatives=(dq, dp), derivative_points=4 * 13)
        assert float(every()) == pytest.approx(float(full()), rel=1e-12)


def test_derivative_warmup_ramps_the_weight_from_one_in_training_mode():
    """derivative_warmup=k: the t-th training-mode loss evaluation weighs the derivative term by
    1 + (w − 1)·min(1, t/k) — the loss of a fit with that constant weight, its state solve
    included — evaluation mode by w; the count is saved with the module, so a resumed fit
    continues the ramp."""
    H = _oscillator()
    q, p, (qc, pc) = _data(H, B=4, T=13, noise=0.05, seed=3)
    dq, dp = _vf(H, qc, pc)
    torch.manual_seed(0)
    model = SeparableHNN(1, width=8)
    kw = dict(dt=0.1, segment=4, derivatives=(dq, dp))
    warm = TrajectoryFit(model, q, p, derivative_weight=5.0, derivative_warmup=4, **kw)
    for t in range(6):
        ref = TrajectoryFit(model, q, p, derivative_weight=1 + 4 * min(1, t / 4), **kw)
        assert float(warm()) == pytest.approx(float(ref()), rel=1e-13)
    assert int(warm.loss_calls) == 6 and float(warm.eval()()) == float(ref.eval()())
    again = TrajectoryFit(model, q, p, derivative_weight=5.0, derivative_warmup=8, **kw)
    again.load_state_dict(warm.state_dict())                # 6 of 8 done: the weight is 4
    ref = TrajectoryFit(model, q, p, derivative_weight=4.0, **kw)
    assert float(again()) == pytest.approx(float(ref()), rel=1e-13)
    assert "loss_calls" not in ref.state_dict()             # no warm-up: the state dict as before
    # the state solve takes the ramp's weight: at t = 0 it is weight 1's
    solved = TrajectoryFit(H, q, p, gauss_newton=1, derivative_weight=5.0, derivative_warmup=10, **kw)
    plain = TrajectoryFit(H, q, p, gauss_newton=1, **kw)
    solved(), plain()
    assert torch.equal(solved.q_nodes, plain.q_nodes) and torch.equal(solved.p_nodes, plain.p_nodes)
    with pytest.raises(ValueError, match="derivative_warmup"):
        TrajectoryFit(model, q, p, derivative_warmup=-1, **kw)
    with pytest.raises(ValueError, match="derivative_warmup = 3 applies to observed derivatives"):
        TrajectoryFit(model, q, p, dt=0.1, derivative_warmup=3)


def test_derivatives_at_estimated_states_beat_derivative_matching_at_noisy_ones():
    """Errors in variables: derivative matching of exact derivatives at noisy states shrinks an
    oscillator's coefficients (b p² + a q²)/2 by var(x) / (var(x) + σ²); matched at the states a
    solved single-shooting fit estimates, they are recovered several times more closely."""
    H = _oscillator()
    q, p, (qc, pc) = _data(H, B=16, T=21, dt=0.15, noise=0.15, seed=4)
    dq, dp = _vf(H, qc, pc)

    def coefficients(loss_fn, data, fit_module):
        fit(fit_module, loss_fn, data, steps=300, lr=0.05, progress=False, seed=0)
        H = getattr(fit_module, "model", fit_module)
        return torch.stack([H.kinetic.c.detach(), H.potential.c.detach()])

    a = coefficients(derivative_loss, tuple(x.reshape(-1, 1) for x in (q, p, dq, dp)), _half_oscillator())
    tf = TrajectoryFit(_half_oscillator(), q, p, dt=0.15, gauss_newton=1, derivatives=(dq, dp))
    g = coefficients(TrajectoryFit.loss, tf.segments, tf)
    err_a, err_g = float((a - 1).abs().max()), float((g - 1).abs().max())
    assert err_a > 0.03                      # the shrinkage is there to remove
    assert err_g < 0.3 * err_a, (a, g)


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        return 0.5 * self.c * (x * x).sum(-1)


def _half_oscillator():
    """(b p² + a q²)/2 with learnable b, a, both starting at 0.5 (the truth: 1, 1)."""
    return tgi.SeparableHamiltonian(_Scaled(), _Scaled())


def test_segment_ids_are_distinct_integers_whatever_their_dtype():
    """A repeated id is refused on every call (it was refused only on visits that solved, and
    learned states weighed the segment twice); a uint8 tensor is ids, not a mask."""
    H = _pendulum()
    q, p, _ = _data(H, B=2, T=13, noise=0.05)
    for kw in (dict(gauss_newton=1, solve_every=3), dict()):
        tf = TrajectoryFit(H, q, p, dt=0.1, segment=4, **kw)
        for _ in range(4):                                   # visits 0..3: due and not due
            with pytest.raises(ValueError, match="segment ids must be distinct"):
                tf(torch.tensor([0, 0]))
        assert int(tf.visits.sum()) == 0
        assert torch.equal(tf.eval()(torch.tensor([2, 0, 1], dtype=torch.uint8)),
                           tf(torch.tensor([2, 0, 1])))
    with pytest.raises(TypeError, match="roll out or evaluate its model, tf.model"):
        tgi.nn.predict(tf, q[:, 0], p[:, 0], h=0.1, steps=3)


def test_solve_states_returns_each_nodes_objective_at_the_final_states():
    """ℓ as documented, evaluated by hand after the sweep for every node, even ones included
    (their ℓ was taken before the odd half moved their neighbours)."""
    H = _pendulum()
    q, p, _ = _data(H, B=3, T=13, noise=0.05)
    seg, w = 3, 0.7
    tf = TrajectoryFit(H, q, p, dt=0.1, segment=seg, continuity=w, gauss_newton=1, substeps=2)
    best = tf.solve_states(torch.tensor([7, 0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11]))
    S = tf.n_segments
    nodes = torch.cat([tf.q_nodes, tf.p_nodes], -1).reshape(-1, 2)
    qs, ps = tgi.rollout(H, nodes[:, :1], nodes[:, 1:], h=0.05, steps=2 * seg, save_every=2)
    X, obs = torch.cat([qs, ps], -1), torch.cat([tf.q_obs, tf.p_obs], -1).transpose(0, 1)
    wp = w * S / (S - 1)
    ell = []
    for i in [7, 0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11]:
        v = ((X[:, i] - obs[:, i]) ** 2).sum() / (seg + 1)
        if i % S < S - 1:
            v = v + wp * ((X[-1, i] - nodes[i + 1]) ** 2).sum()
        if i % S > 0:
            v = v + wp * ((X[-1, i - 1] - nodes[i]) ** 2).sum()
        ell.append(v)
    assert torch.allclose(best, torch.stack(ell), rtol=1e-10, atol=1e-15)


# ---------------------------------------------------------------- solved node states


@pytest.fixture(params=["differences", "chain rule"])
def jacobians(request, monkeypatch):
    """The solve's Jacobians both ways: differences of whole rollouts, or the chain rule through
    the splitting's lifted halves (TrajectoryFit.CHAIN_RULE_SIZE picks by size)."""
    monkeypatch.setattr(TrajectoryFit, "CHAIN_RULE_SIZE", 10 ** 9 if request.param == "differences" else 0)
    return request.param


@pytest.mark.parametrize("segment", [None, 4])
def test_gauss_newton_states_reach_the_minimiser_of_the_loss(segment, jacobians):
    """H fixed: from perturbed nodes, Gauss–Newton recovers the exact states of Verlet data
    (single shooting quadratically), and on noisy data it reaches the states that L-BFGS finds
    for the same loss; with either Jacobian."""
    H = _pendulum()
    q, p, _ = _data(H, B=6, T=21)
    tf = TrajectoryFit(H, q, p, dt=0.1, segment=segment, gauss_newton=1).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        tf.q_nodes += 0.1 * torch.randn(tf.q_nodes.shape, generator=g)
        tf.p_nodes += 0.1 * torch.randn(tf.p_nodes.shape, generator=g)
    losses = [float(tf())]
    for _ in range(4 if segment is None else 30):
        tf.solve_states()
        losses.append(float(tf()))
    assert all(b <= a for a, b in zip(losses, losses[1:]))          # monotone
    assert losses[-1] < 1e-24 if segment is None else losses[-1] < 1e-12 * losses[0]
    if segment is None:
        assert losses[2] < 1e-6 * losses[1]                              # quadratic
    qn, pn, _ = _data(H, B=6, T=21, noise=0.1, seed=2)
    solved = TrajectoryFit(H, qn, pn, dt=0.1, segment=segment, gauss_newton=2).eval()
    best = solved.solve_states(steps=40 if segment else 6)
    ref = TrajectoryFit(H, qn, pn, dt=0.1, segment=segment)
    _minimise_states(ref, ref, max_iter=400)
    assert float(solved()) == pytest.approx(float(ref().detach()), rel=1e-7)
    torch.testing.assert_close(solved.q_nodes, ref.q_nodes.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(solved.p_nodes, ref.p_nodes.detach(), atol=1e-5, rtol=0)
    assert best.shape == (6 * solved.n_segments,) and bool((best >= 0).all())


@pytest.mark.parametrize("segment", [None, 4, 1])
def test_gauss_newton_with_derivatives_minimises_the_whole_loss_over_the_states(segment, jacobians):
    """With observed derivatives the solved states minimise data + continuity + derivative
    residuals |X_H(Φ^{(j)}(z)) − ẋ_j|², each observation time once (the loss's terms, as
    functions of the states): the
    minimiser L-BFGS finds for that objective; and, with H exact, they lie closer to the clean
    states than the states solved from the positions and momenta alone."""
    H = _pendulum()
    qn, pn, (qc, pc) = _data(H, B=6, T=21, noise=0.1, seed=2)
    dq, dp = _vf(H, qc, pc)
    w = 0.5
    solved = TrajectoryFit(H, qn, pn, dt=0.1, segment=segment, gauss_newton=2,
                           derivatives=(dq, dp), derivative_weight=w).eval()
    best = solved.solve_states(steps=40 if segment else 8)
    ref = TrajectoryFit(H, qn, pn, dt=0.1, segment=segment)
    S, seg = ref.n_segments, ref.segment

    def objective():
        qs, ps = ref._roll(ref.q_nodes.reshape(-1, 1), ref.p_nodes.reshape(-1, 1))
        fq, fp = H.vector_field(*(_each_time_once(x, S) for x in (qs, ps)))
        return ref() + w * 0.5 * (((fq - dq) ** 2).mean() + ((fp - dp) ** 2).mean())

    _minimise_states(ref, objective, max_iter=500)
    torch.testing.assert_close(solved.q_nodes, ref.q_nodes.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(solved.p_nodes, ref.p_nodes.detach(), atol=1e-5, rtol=0)
    assert bool((best >= 0).all())
    plain = TrajectoryFit(H, qn, pn, dt=0.1, segment=segment, gauss_newton=2).eval()
    plain.solve_states(steps=40 if segment else 8)
    S = solved.n_segments
    err = [float(((f.q_nodes - qc[:, :20:seg][:, :S]) ** 2 + (f.p_nodes - pc[:, :20:seg][:, :S]) ** 2).mean())
           for f in (solved, plain)]
    assert err[0] < 0.6 * err[1], err


@pytest.mark.parametrize("method, segment, substeps", [("verlet", 1, 1), ("verlet", 3, 2), ("yoshida4", None, 1)])
def test_gauss_newton_jacobians_come_by_the_chain_rule_at_n_plus_one_points_a_half(method, segment, substeps):
    """Through a kick–drift splitting the solve's Jacobians are the chain rule on lifted halves:
    ∂Φ^{(j)}/∂z and ∂X_H(Φ^{(j)}(z))/∂z equal autograd's (jacrev of the rollout) to the forward
    differences' accuracy, and each kick (drift) evaluates ∂V/∂q (∂T/∂p) at n + 1 points a node,
    however many tangents ride along (2n + 1 perturbed rollouts before: 3(2n + 1) − n a Verlet
    step with the field at the node, now 2(n + 1) + n + 1).  X_H where the derivatives are
    matched takes the rollout's own force terms there (FSAL) and ∂T/∂p anew."""
    n, rows = 2, {"V": 0, "T": 0}
    A = torch.tensor([[1.0, 0.3], [0.3, 0.7]])

    def counted(key, f):
        def g(x):
            rows[key] += x.shape[0]
            return f(x)
        return g
    H = tgi.SeparableHamiltonian(
        lambda p: 0.5 * (p @ A * p).sum(-1) + 0.1 * (p ** 4).sum(-1), lambda q: (1 - torch.cos(q)).sum(-1),
        kinetic_grad=counted("T", lambda p: p @ A + 0.4 * p ** 3), potential_grad=counted("V", torch.sin))
    g = torch.Generator().manual_seed(3)
    q, p = (torch.randn(3, 7, n, generator=g) for _ in range(2))
    dq, dp = (torch.randn(3, 7, n, generator=g) for _ in range(2))
    tf = TrajectoryFit(H, q, p, dt=0.1, segment=segment, method=method, substeps=substeps,
                       gauss_newton=1, derivatives=(dq, dp))
    index = torch.arange(tf.trajectories * tf.n_segments)
    z = torch.cat([tf.q_nodes, tf.p_nodes], -1).reshape(-1, 2 * n)[index] + 0.05
    stepper = tf._first_kick()
    assert stepper is not None
    parts = tf._derivative_parts(index)
    rows.update(V=0, T=0)
    plain = tf._roll_states(z, stepper.force_term(z[:, :n]), stepper)     # counts: a plain rollout's
    R = dict(rows)
    rows.update(V=0, T=0)
    X, fields = tf._tangent_rollout(stepper, z, parts)
    N, seg = z.shape[0], tf.segment
    # X_H where the derivative parts take it besides the nodes: j = 1..segment − 1 of every
    # segment and the last segments' ends (single shooting: j = 1..segment)
    extra = seg * N if len(parts) == 1 else (seg - 1) * N + int(parts[1][0].sum())
    assert rows["V"] == (n + 1) * R["V"]                 # every ∂V/∂q there: the rollout's own
    assert rows["T"] == (n + 1) * (R["T"] + N + extra)
    torch.testing.assert_close(X[..., 0, :], plain)

    def roll(zz):                                              # (seg + 1, 2n) of one state
        return tf._roll_states(zz.unsqueeze(0), None, stepper)[:, 0]
    for k in range(N):
        jac = torch.func.jacrev(roll)(z[k])                      # (seg + 1, 2n, 2n)
        torch.testing.assert_close(X[:, k, 0], roll(z[k]))
        torch.testing.assert_close(X[:, k, 1:].transpose(-1, -2), jac, atol=1e-6, rtol=1e-6)
    first = fields[0]                           # X_H at j < segment (single shooting: ≤), every node
    J = first.shape[0]
    Fj = X[:J, :, 0]

    def field(x):
        fq, fp = H.vector_field(x[..., :n], x[..., n:])
        return torch.cat([fq, fp], -1)
    torch.testing.assert_close(first[:, :, 0], field(Fj))
    dfield = torch.func.vmap(torch.func.jacrev(field))(Fj.reshape(-1, 2 * n)).reshape(*Fj.shape, 2 * n)
    want = dfield @ X[:J, :, 1:].transpose(-1, -2)             # ∂X_H/∂x · ∂Φ/∂z
    torch.testing.assert_close(first[:, :, 1:].transpose(-1, -2), want, atol=1e-6, rtol=1e-6)



def test_a_separable_hnns_solve_takes_its_hessians_in_closed_form():
    """SeparableHNN's halves are its networks' closed-form gradients: the chain rule takes their
    Hessians in closed form too (MLP.input_grad_hessian, no differences), so the Jacobian
    rollout equals autograd's (jacrev) to rounding, not to √u; a kinetic_grad of the user's
    (not the network's gradient) goes back to differences."""
    torch.manual_seed(4)
    model = SeparableHNN(2, width=16)
    g = torch.Generator().manual_seed(5)
    q, p = (torch.randn(3, 5, 2, generator=g) for _ in range(2))
    tf = TrajectoryFit(model, q, p, dt=0.1, segment=2, gauss_newton=1)
    stepper = tf._first_kick()
    assert tf._closed_form_jacobian(stepper.velocity, "kinetic") == model.kinetic.input_grad_hessian
    assert tf._closed_form_jacobian(stepper.force_term, "potential") == model.potential.input_grad_hessian
    assert tf._closed_form_jacobian(stepper.force_term, "kinetic") is None     # another module's
    z = torch.cat([tf.q_nodes, tf.p_nodes], -1).reshape(-1, 4)
    X, _ = tf._tangent_rollout(stepper, z)
    for k in range(z.shape[0]):
        jac = torch.func.jacrev(lambda zz: tf._roll_states(zz.unsqueeze(0), None, stepper)[:, 0])(z[k])
        torch.testing.assert_close(X[:, k, 1:].transpose(-1, -2), jac, rtol=1e-12, atol=1e-13)
    user = tgi.SeparableHamiltonian(model.kinetic, model.potential, kinetic_grad=model.kinetic.input_grad)
    fit_u = TrajectoryFit(user, q, p, dt=0.1, segment=2, gauss_newton=1)
    assert fit_u._closed_form_jacobian(fit_u._first_kick().velocity, "kinetic") is None


def test_a_network_that_redefines_its_gradient_keeps_the_differences():
    """A ScalarMLP subclass whose input_grad is another function (here of x/3) inherits an
    input_grad_hessian that is not its Hessian: closed_form_hessian is False, the solve takes
    differences, and the Jacobian rollout still equals jacrev's."""
    from torchgeo_int.nn import ScalarMLP

    class Scaled(ScalarMLP):                                   # f(x) = net(x / 3)
        def forward(self, x):
            return super().forward(x / 3)

        def input_grad(self, x):
            return self.net.input_grad(x / 3) / 3

    torch.manual_seed(6)
    H = tgi.SeparableHamiltonian(Scaled(2, width=8), Scaled(2, width=8))
    assert H.kinetic.closed_form_grad and not H.kinetic.closed_form_hessian
    assert ScalarMLP(2, width=8).closed_form_hessian
    g = torch.Generator().manual_seed(7)
    q, p = (torch.randn(3, 7, 2, generator=g) for _ in range(2))
    tf = TrajectoryFit(H, q, p, dt=0.1, segment=3, gauss_newton=1)
    stepper = tf._first_kick()
    assert tf._closed_form_jacobian(stepper.velocity, "kinetic") is None
    z = torch.cat([tf.q_nodes, tf.p_nodes], -1).reshape(-1, 4)
    X, _ = tf._tangent_rollout(stepper, z)
    torch.testing.assert_close(X[..., 0, :], tf._roll_states(z, None, stepper))
    jac = torch.func.jacrev(lambda zz: tf._roll_states(zz.unsqueeze(0), None, stepper)[:, 0])(z[0])
    torch.testing.assert_close(X[:, 0, 1:].transpose(-1, -2), jac, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("segment", [None, 2])
def test_a_node_whose_rollout_overflows_is_refused_by_the_solve(segment, jacobians):
    """A node state far outside the data (q = 1e70 through a q⁶ potential) overflows its
    rollout: the solve raises FloatingPointError naming it (as the rollout's own check did
    before the solve rolled out by the stepper's loop), whichever way it takes the Jacobians."""
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: (q ** 6).sum(-1),
                                 kinetic_grad=lambda p: p, potential_grad=lambda q: 6 * q ** 5)
    g = torch.Generator().manual_seed(1)
    q, p = (torch.randn(2, 9, 1, generator=g) for _ in range(2))
    tf = TrajectoryFit(H, q, p, dt=0.1, segment=segment, gauss_newton=1, layout="windows")
    with torch.no_grad():
        tf.q_nodes[0, 0] = 1e70
    with pytest.raises(FloatingPointError, match=r"rollout of 1 of \d+ node states \(segment ids \[0\]\)"):
        tf.solve_states()

def test_a_sweep_solves_nodes_without_a_neighbour_in_the_batch_in_its_first_half():
    """Red–black only where it matters: nodes none of whose neighbours is solved with them go in
    the first half with the even nodes of the chains, the chains' odd nodes in the second; a
    batch without neighbours is one half.  The states are those of solving each chain and each
    lone node on its own (Gauss–Seidel's order on a chain, even nodes first, is kept)."""
    H = _pendulum()
    q, p, _ = _data(H, B=4, T=21, noise=0.05, seed=5)
    kw = dict(dt=0.1, segment=2, gauss_newton=1, continuity=0.5)
    S = 10
    # trajectory 0: a chain s = 3, 4, 5; lone nodes s = 7 (odd) and, on trajectory 1, s = 2
    ids = torch.tensor([3, 4, 5, 7, S + 2, 2 * S + 9])
    tf = TrajectoryFit(H, q, p, **kw)
    first, second = tf._halves(ids)
    assert first.tolist() == [False, True, False, True, True, True]
    assert second.tolist() == [True, False, True, False, False, False]
    lone = TrajectoryFit(H, q, p, **kw)
    assert lone._halves(ids[3:])[1] is None
    best = tf.solve_states(ids)
    parts = TrajectoryFit(H, q, p, **kw)
    alone = [parts.solve_states(ids[:3])] + [parts.solve_states(ids[k:k + 1]) for k in range(3, 6)]
    torch.testing.assert_close(tf.q_nodes, parts.q_nodes, rtol=0, atol=1e-14)
    torch.testing.assert_close(tf.p_nodes, parts.p_nodes, rtol=0, atol=1e-14)
    torch.testing.assert_close(best, torch.cat(alone), rtol=1e-12, atol=1e-15)


def test_a_few_neighbours_in_a_sparse_batch_join_the_first_half():
    """The odd nodes of a sweep's chains take a half-sweep of their own only from
    GAUSS_SEIDEL_FRACTION of its nodes: one pair among a sparse batch's lone nodes is one half,
    each node of the pair solved against its neighbour's old state (Jacobi), and the ℓ returned
    is taken at the new states of both."""
    H = _pendulum()
    q, p, _ = _data(H, B=4, T=21, noise=0.05, seed=5)
    kw = dict(dt=0.1, segment=2, gauss_newton=1, continuity=0.5)
    S = 10
    ids = torch.tensor([3, 4, 7, S + 1, S + 5, S + 8, 2 * S + 2, 2 * S + 6, 3 * S + 0, 3 * S + 4])
    tf = TrajectoryFit(H, q, p, **kw)
    assert tf._halves(ids)[1] is None                      # 1 odd node of 10 < 1/8 of them
    assert tf._halves(ids[:4])[1] is not None              # 1 of 4: a half of its own
    best = tf.solve_states(ids)
    jacobi = [TrajectoryFit(H, q, p, **kw) for _ in ids]
    for fit, i in zip(jacobi, ids):
        fit.solve_states(i.view(1))
    qn, pn = tf.q_nodes.reshape(-1, 1), tf.p_nodes.reshape(-1, 1)
    for fit, i in zip(jacobi, ids):
        torch.testing.assert_close(qn[i], fit.q_nodes.reshape(-1, 1)[i], rtol=0, atol=1e-14)
        torch.testing.assert_close(pn[i], fit.p_nodes.reshape(-1, 1)[i], rtol=0, atol=1e-14)
    with torch.no_grad():
        z, *_, objective = tf._objective(ids)
        torch.testing.assert_close(best, objective(tf._roll_states(z), z), rtol=1e-12, atol=1e-15)


def test_gauss_newton_halves_a_step_that_overshoots(monkeypatch):
    """Far from the solution (100-step single shooting through a pendulum of the wrong frequency)
    the full Gauss–Newton step raises some nodes' ℓ; it is then halved until ℓ falls, so every
    node moves and every ℓ falls.  Without the halvings (the earlier monotone step) those nodes
    kept their states, and a fit whose nodes all froze so had no gradient left and stalled
    (the parametric pendulum of experiments/hnn/parametric.py, arm (g))."""
    def pendulum(b, a):
        return tgi.SeparableHamiltonian(lambda p: b * 0.5 * (p * p).sum(-1), lambda q: a * (1 - torch.cos(q)).sum(-1))
    g = torch.Generator().manual_seed(0)
    q0, p0 = (torch.rand(32, 1, generator=g, dtype=torch.float64) * 4 - 2 for _ in range(2))
    q, p = (x.transpose(0, 1) for x in tgi.rollout(pendulum(1.0, 3.0), q0, p0, h=0.068, steps=99))

    def first_sweep():
        tf = TrajectoryFit(pendulum(2.0, 3.0), q, p, dt=0.068, gauss_newton=1).eval()
        nodes, *_, objective = tf._objective(torch.arange(32))             # every node's state
        before = objective(tf._roll_states(nodes), nodes)
        return before, tf.solve_states(steps=1)

    before, after = first_sweep()
    assert bool((after < before).all())
    monkeypatch.setattr(TrajectoryFit, "HALVINGS", 0)
    before0, after0 = first_sweep()
    assert int((after0 >= before0).sum()) >= 5        # the full step overshoots on these nodes
    assert float(after.sum()) < float(after0.sum())


def test_gauss_newton_solves_only_the_batch_and_the_model_trains_at_solved_states():
    """Training mode solves the batch's nodes before the loss (the others stay), the states carry
    no graph and are not in the optimizer; a fit of single shooting with solved states trains the
    model, and the gradient is the reduced loss's (the states' own gradient vanishes at the
    solution: envelope theorem)."""
    H = _oscillator()
    q, p, _ = _data(H, B=8, T=13, noise=0.05, seed=2)
    torch.manual_seed(0)
    model = SeparableHNN(1, width=16)
    tf = TrajectoryFit(model, q, p, dt=0.1, segment=4, gauss_newton=1)
    assert not tf.q_nodes.requires_grad and not tf.p_nodes.requires_grad
    opt = tf.optimizer(lr=3e-3, weight_decay=1e-4)
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["weight_decay"] == 1e-4
    before = tf.q_nodes.detach().clone()
    tf(torch.tensor([0, 5]))                                     # segments 0 and 5 of 24
    moved = (tf.q_nodes.detach() != before).reshape(-1)
    assert bool(moved[[0, 5]].all()) and not bool(moved[[1, 2, 3, 4, 6]].any())
    tf.eval()                                                    # evaluation never solves
    frozen = tf.q_nodes.detach().clone()
    tf()
    assert torch.equal(tf.q_nodes.detach(), frozen)
    tf.train()
    # the envelope theorem: at solved single-shooting states, d loss / d states ≈ 0
    single = TrajectoryFit(model, q, p, dt=0.1, gauss_newton=1).eval()
    single.solve_states(steps=6)
    zq = single.q_nodes.detach().clone().requires_grad_(True)
    zp = single.p_nodes.detach().clone().requires_grad_(True)
    free = TrajectoryFit(model, q, p, dt=0.1, q0=zq, p0=zp)
    gq, gp = torch.autograd.grad(free(), (free.q_nodes, free.p_nodes))
    assert float(torch.cat([gq, gp]).abs().max()) < 1e-9
    first = float(single().detach())
    single.train()
    hist = fit(single, TrajectoryFit.loss, single.segments, steps=80, optimizer=single.optimizer(lr=3e-3),
               progress=False)
    assert hist["loss"][-1] < 0.5 * first


@pytest.mark.parametrize("method, steps", [("verlet", 1), ("yoshida4", 2), ("implicit_midpoint", 1)])
@pytest.mark.parametrize("segment, derivatives", [(None, False), (5, False), (2, True)])
def test_the_loss_reuses_the_solves_last_rollouts(monkeypatch, method, steps, segment, derivatives):
    """With every node solved, the loss is made of the rollouts of the solve's accepted
    candidates (the same states, the same θ), one a half-sweep, not a second rollout — and loss
    and θ-gradient equal those of solving first and then evaluating (bit for bit with one
    half, as single shooting; to rounding with two, whose rows the loss takes in the halves'
    order); a half one of whose nodes does not take its full step (an overshoot, halved) makes
    the loss roll it out again.  (The solve's own rollouts are graph-free; a splitting's run its
    step loop, not ``_roll``: only the grad-mode rollouts are counted.)"""
    H = _oscillator()
    q, p, _ = _data(H, B=6, T=11, noise=0.05, seed=4)
    torch.manual_seed(1)
    model = SeparableHNN(1, width=16)
    kw = dict(segment=segment)
    if derivatives:
        kw["derivatives"] = tuple(x + 0.05 * torch.randn_like(x) for x in H.vector_field(q, p, 0.0))
    halves = 1 if segment is None else 2

    def fitted():
        tf = TrajectoryFit(model, q, p, dt=0.1, method=method, gauss_newton=steps, **kw)
        calls = []
        roll = tf._roll
        tf._roll = lambda *a: calls.append(torch.is_grad_enabled()) or roll(*a)   # noqa: B023
        return tf, calls

    def graph(calls):                       # the rollouts that build a graph, and the last's mode
        return calls.count(True), calls[-1]

    a, calls_a = fitted()
    assert len([c for c in a._halves(a._index(None)) if c is not None]) == halves
    loss_a = a()
    grads_a = torch.autograd.grad(loss_a, list(model.parameters()))
    assert graph(calls_a) == (halves, True)                 # the solve's last candidates, reused
    b, calls_b = fitted()
    b.solve_states(steps=steps)
    b.eval()                                                # evaluation: no solve, one rollout
    loss_b = b()
    grads_b = torch.autograd.grad(loss_b, list(model.parameters()))
    assert graph(calls_b) == (1, True)
    assert torch.equal(a.q_nodes, b.q_nodes) and torch.equal(a.p_nodes, b.p_nodes)
    if halves == 1:
        assert float(loss_a) == float(loss_b)
        assert all(torch.equal(x, y) for x, y in zip(grads_a, grads_b))
    else:
        torch.testing.assert_close(loss_a, loss_b, rtol=1e-13, atol=0)
        for x, y in zip(grads_a, grads_b):
            torch.testing.assert_close(x, y, rtol=1e-11, atol=1e-15)
    calls_a.clear()
    a.train()
    solve = torch.linalg.solve                              # a Gauss–Newton step that overshoots:
    monkeypatch.setattr(torch.linalg, "solve", lambda A, g: 1e4 * solve(A, g))   # halved, not full
    a()
    assert calls_a.count(True) == halves + 1 and calls_a[-1]  # the candidates, then the loss's own


def test_the_loss_rolls_out_the_unsolved_nodes_beside_the_solved_ones():
    """With ``solve_every`` > 1 a batch mixes nodes solved now (their rollouts come from the
    solve) and nodes that are not: the loss rolls out only those, and its value and θ-gradient
    equal those of the same states evaluated afterwards (to rounding: its rows come in another
    order), continuity and derivative terms (X_H at the nodes from the rollouts' first kicks)
    included."""
    H = _oscillator()
    q, p, _ = _data(H, B=5, T=13, noise=0.05, seed=6)
    derivs = tuple(x + 0.05 * torch.randn_like(x) for x in H.vector_field(q, p, 0.0))
    torch.manual_seed(2)
    model = SeparableHNN(1, width=16)
    tf = TrajectoryFit(model, q, p, dt=0.1, segment=3, gauss_newton=1, solve_every=2,
                       derivatives=derivs)
    rows = []
    roll = tf._roll
    tf._roll = lambda q, *a: (rows.append(q.shape[0]) if torch.is_grad_enabled() else None) or roll(q, *a)
    total = tf.trajectories * tf.n_segments
    tf.visits[::3] = 1                                      # a third of the nodes are not due
    index = torch.randperm(total, generator=torch.Generator().manual_seed(0))[:12]
    due = int((tf.visits[index] % 2 == 0).sum())
    assert 0 < due < index.numel()
    loss = tf(index)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    assert sum(rows) == index.numel() and rows[-1] == index.numel() - due   # each row once
    tf.eval()
    again = tf(index)
    torch.testing.assert_close(loss, again, rtol=1e-13, atol=0)
    for x, y in zip(grads, torch.autograd.grad(again, list(model.parameters()))):
        torch.testing.assert_close(x, y, rtol=1e-11, atol=1e-15)
    assert tf.visits[index].min() >= 1


def test_a_half_whose_step_is_not_taken_whole_is_rolled_out_by_the_loss(monkeypatch):
    """Two half-sweeps, the second's full step overshooting (halved): the first half's rollout
    is the loss's, the second's is rolled out again at its halved states, and the loss and
    θ-gradient equal those of evaluating the states afterwards."""
    H = _oscillator()
    q, p, _ = _data(H, B=6, T=11, noise=0.05, seed=4)
    torch.manual_seed(1)
    model = SeparableHNN(1, width=16)
    tf = TrajectoryFit(model, q, p, dt=0.1, segment=5, gauss_newton=1)
    calls = []
    roll = tf._roll
    tf._roll = lambda *a: calls.append(torch.is_grad_enabled()) or roll(*a)
    solve, seen = torch.linalg.solve, []

    def second_overshoots(A, g):
        seen.append(1)
        return solve(A, g) * (1e4 if len(seen) == 2 else 1.0)
    monkeypatch.setattr(torch.linalg, "solve", second_overshoots)
    loss = tf()
    monkeypatch.setattr(torch.linalg, "solve", solve)
    assert len(seen) == 2 and calls.count(True) == 3        # two candidates, the second again
    grads = torch.autograd.grad(loss, list(model.parameters()))
    tf.eval()
    again = tf()
    torch.testing.assert_close(loss, again, rtol=1e-13, atol=0)
    for x, y in zip(grads, torch.autograd.grad(again, list(model.parameters()))):
        torch.testing.assert_close(x, y, rtol=1e-11, atol=1e-15)


@pytest.mark.parametrize("segment", [None, 2])
def test_a_candidate_that_overflows_is_a_rejected_step_in_training(monkeypatch, segment):
    """The loss takes its rollouts of the solved nodes from the solve's candidates, through
    rollout()'s finiteness check: a candidate that overflows there (a step of 1e70 through a q⁶
    potential) is a rejected step, not an error — that node keeps its state, the others take
    theirs, and the loss is finite."""
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: (q ** 6).sum(-1),
                                 kinetic_grad=lambda p: p, potential_grad=lambda q: 6 * q ** 5)
    g = torch.Generator().manual_seed(1)
    q, p = (torch.randn(2, 9, 1, generator=g) for _ in range(2))
    tf = TrajectoryFit(H, q, p, dt=0.1, segment=segment, gauss_newton=1, layout="windows",
                       continuity=0.0)
    before = torch.cat([tf.q_nodes, tf.p_nodes], -1).reshape(-1, 2).clone()
    solve = torch.linalg.solve

    def first_node_overflows(A, g):
        step = solve(A, g).clone()
        step[0] = 1e70
        return step
    monkeypatch.setattr(torch.linalg, "solve", first_node_overflows)
    loss = tf()
    assert torch.isfinite(loss)
    after = torch.cat([tf.q_nodes, tf.p_nodes], -1).reshape(-1, 2)
    assert torch.equal(after[0], before[0]) and bool((after[1:] != before[1:]).any(-1).all())


def test_trajectory_fit_refuses_time_first_data_unless_told():
    """A rollout's (T, B, n) output handed over as is would be fitted along the wrong axis: it
    is refused naming both layouts; layout="time_first" takes it, the same fit as transposed."""
    H = _oscillator()
    q, p, _ = _data(H, B=16, T=13, noise=0.01, seed=3)
    qt, pt = q.transpose(0, 1), p.transpose(0, 1)                  # (13, 16, 1): 12 and 15 intervals, both ÷ 3
    with pytest.raises(ValueError, match="look time-first"):
        TrajectoryFit(H, qt, pt, dt=0.1, segment=3)
    a = TrajectoryFit(H, qt, pt, dt=0.1, segment=3, layout="time_first")
    b = TrajectoryFit(H, q, p, dt=0.1, segment=3)
    assert a.trajectories == 16 and torch.equal(a.q_obs, b.q_obs) and float(a()) == float(b())
    assert TrajectoryFit(H, qt, pt, dt=0.1, segment=3, layout="windows").trajectories == 13
    with pytest.raises(ValueError, match="layout must be one of"):
        TrajectoryFit(H, q, p, dt=0.1, layout="batch_first")


def test_solve_every_solves_each_node_at_its_first_and_every_kth_visit(tmp_path):
    """solve_every=k: a node is solved at its training-mode visits 0, k, 2k, … and keeps its
    state in between (a node first reached late is solved then); evaluation neither solves nor
    counts; the counts travel with state_dict, so a resumed fit solves where the uninterrupted
    one does; the fit still trains."""
    H = _oscillator()
    q, p, _ = _data(H, B=8, T=13, noise=0.05, seed=2)
    torch.manual_seed(0)
    model = SeparableHNN(1, width=16)
    tf = TrajectoryFit(model, q, p, dt=0.1, segment=4, gauss_newton=1, solve_every=3)
    ids = torch.tensor([0, 5, 7])
    solved_at = []
    for i in range(7):
        before = tf.q_nodes.detach().clone().reshape(-1)
        tf(ids if i != 4 else torch.tensor([0, 5, 7, 11]))       # node 11 first reached at call 4
        moved = tf.q_nodes.detach().reshape(-1) != before
        solved_at.append(sorted(torch.nonzero(moved).flatten().tolist()))
        if i == 1:                                  # an evaluation in between: no solve, no count
            tf.eval()
            tf(ids)
            tf.train()
    assert solved_at == [[0, 5, 7], [], [], [0, 5, 7], [11], [], [0, 5, 7]]
    assert tf.visits[[0, 5, 7, 11]].tolist() == [7, 7, 7, 1] and int(tf.visits.sum()) == 22
    assert "visits" in tf.state_dict()

    def make():
        torch.manual_seed(1)
        return TrajectoryFit(SeparableHNN(1, width=16), q, p, dt=0.1, segment=4, gauss_newton=1,
                             solve_every=3)
    whole = make()
    fit(whole, TrajectoryFit.loss, whole.segments, steps=10, batch_size=4,
        optimizer=whole.optimizer(lr=3e-3), progress=False)
    ck = str(tmp_path / "ck.pt")
    part = make()
    fit(part, TrajectoryFit.loss, part.segments, steps=4, batch_size=4,
        optimizer=part.optimizer(lr=3e-3), progress=False, checkpoint=ck)
    resumed = make()
    fit(resumed, TrajectoryFit.loss, resumed.segments, steps=10, batch_size=4,
        optimizer=resumed.optimizer(lr=3e-3), progress=False, checkpoint=ck, resume=True)
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    first = float(tf.eval()().detach())
    tf.train()
    hist = fit(tf, TrajectoryFit.loss, tf.segments, steps=80, batch_size=8,
               optimizer=tf.optimizer(lr=3e-3), progress=False)
    assert float(tf.eval()().detach()) < 0.7 * first and len(hist["loss"]) == 80


# ---------------------------------------------------------------- modified Hamiltonians


def _exact_modified_oscillator(method, h):
    """The exact modified Hamiltonian of ``method`` at step h for H = (q² + p²)/2: the quadratic
    invariant of the step matrix, scaled so that its time-h flow is the step."""
    a = 1 - h * h / 4
    c = math.acos(1 - h * h / 2) / (h * math.sqrt(a))
    if method == "verlet":
        return lambda q, p: c * 0.5 * ((p * p).sum(-1) + a * (q * q).sum(-1))
    if method in ("symplectic_euler", "symplectic_euler_adjoint"):
        s = -1 if method == "symplectic_euler" else 1
        return lambda q, p: c * 0.5 * ((q * q + p * p).sum(-1) + s * h * (q * p).sum(-1))
    return lambda q, p: 2 * math.atan(h / 2) / h * 0.5 * (q * q + p * p).sum(-1)


def _exactly_trained_oscillator(method, h):
    """The quadratic H_θ whose ``method`` step at h IS the oscillator's exact time-h rotation:
    what a model trained through the method on exact data of H = (q² + p²)/2 converges to (the
    test checks the step)."""
    if method == "verlet":                        # kick–drift–kick
        a, b = math.sin(h) / h, 2 * math.tan(h / 2) / h
        return lambda q, p: 0.5 * (a * (p * p).sum(-1) + b * (q * q).sum(-1))
    if method == "implicit_midpoint":             # rotates by 2 atan(ch/2)
        c = 2 * math.tan(h / 2) / h
        return lambda q, p: 0.5 * c * (q * q + p * p).sum(-1)
    a, g = math.tan(h) / h, (1 / math.cos(h) - 1) / h
    g = g if method == "symplectic_euler" else -g
    return lambda q, p: 0.5 * a * (q * q + p * p).sum(-1) + g * (q * p).sum(-1)


@pytest.mark.parametrize("method", sorted(SERIES))
def test_the_correction_of_an_exactly_trained_model_recovers_the_true_h(method):
    """A model trained through Φ_h converges to H_θ with Φ_h[H_θ] = φ_h[H]: H̃_h[H_θ] = H, so
    H_θ ≈ H − h^p H_p.  The correction H_θ + Δ_h[H_θ] recovers H to O(h^r), r the truncation
    order; the other direction, H_θ − Δ_h[H_θ], doubles the model's error instead."""
    H = _oscillator()
    Q, P = _grid()
    p_order, rest = SERIES[method]
    errs = []
    for h in (0.2, 0.1):
        model = tgi.Hamiltonian(_exactly_trained_oscillator(method, h))
        q0, p0 = torch.tensor([[0.7]]), torch.tensor([[0.2]])
        q, p = tgi.rollout(model, q0, p0, h=h, steps=1, method=method)
        exact = (0.7 * math.cos(h) + 0.2 * math.sin(h), -0.7 * math.sin(h) + 0.2 * math.cos(h))
        assert abs(float(q[1, 0, 0]) - exact[0]) + abs(float(p[1, 0, 0]) - exact[1]) < 1e-14
        raw = float(hamiltonian_error(model, H.energy, Q, P))
        corrected = float(hamiltonian_error(correct_hamiltonian(model, method, h), H.energy, Q, P))
        wrong_way = float(hamiltonian_error(InverseModifiedHamiltonian(model, method, h, iterations=1),
                                            H.energy, Q, P))
        errs.append(corrected)
        assert corrected < 0.05 * raw and wrong_way > 1.5 * raw
    assert 0.75 * 2 ** rest < errs[0] / errs[1] < 1.3 * 2 ** rest


def _grid():
    g = torch.linspace(-1, 1, 7)
    Q, P = torch.meshgrid(g, g, indexing="ij")
    return Q.reshape(-1, 1), P.reshape(-1, 1)


@pytest.mark.parametrize("method", sorted(SERIES))
def test_series_and_correction_match_the_exact_modified_oscillator(method):
    """The exact H̃ of the harmonic oscillator: our truncated series H + Δ_h[H] matches it to
    O(h^r) (r = the truncation order: 4 for the symmetric methods, 3 for symplectic Euler), and
    the inverse series of the exact H̃ recovers H to the same order, far below |H̃ − H| = O(h^p).  The step is the method's own: the exact H̃ is checked to
    be conserved by it to round-off."""
    H = _oscillator()
    Q, P = _grid()
    p_order, rest = SERIES[method]
    errs = []
    for h in (0.1, 0.05):
        exact = _exact_modified_oscillator(method, h)
        q, p = tgi.rollout(H, torch.tensor([[0.7]]), torch.tensor([[0.2]]), h=h, steps=30, method=method)
        e = exact(q, p)
        assert float((e - e[0]).abs().max()) < 1e-14
        series = float(hamiltonian_error(modified_hamiltonian(H, method, h), exact, Q, P))
        corrected = float(hamiltonian_error(InverseModifiedHamiltonian(tgi.Hamiltonian(exact), method, h),
                                            H.energy, Q, P))
        raw = float(hamiltonian_error(tgi.Hamiltonian(exact), H.energy, Q, P))
        errs.append((series, corrected, raw))
        assert corrected < 0.02 * raw
    rate = 2 ** rest
    assert 0.75 * rate < errs[0][0] / errs[1][0] < 1.3 * rate
    assert 0.75 * rate < errs[0][1] / errs[1][1] < 1.3 * rate
    assert 0.75 * 2 ** p_order < errs[0][2] / errs[1][2] < 1.3 * 2 ** p_order


def _coupled():
    """A non-separable H in two degrees of freedom (mixed q–p terms)."""
    def H(q, p):
        return (0.5 * (p * p).sum(-1) * (1 + 0.3 * torch.sin(q[..., 0]))
                + 0.2 * q[..., 0] * p[..., 1] + (1 - torch.cos(q)).sum(-1) + 0.1 * q[..., 0] * q[..., 1])
    return tgi.Hamiltonian(H)


@pytest.mark.parametrize("method", sorted(SERIES))
@pytest.mark.parametrize("system", ["pendulum", "coupled"])
def test_modified_hamiltonian_is_conserved_to_higher_order(method, system):
    """Along the method's own trajectories H oscillates by O(h^p), the truncated H̃_h by
    O(h^r) only: halving h divides its oscillation by ≈ 2^r."""
    if system == "pendulum":
        H, q0, p0 = _pendulum(), torch.tensor([[1.0]]), torch.tensor([[0.3]])
    else:
        H, q0, p0 = _coupled(), torch.tensor([[0.8, -0.4]]), torch.tensor([[0.3, 0.5]])
    p_order, rest = SERIES[method]
    out = []
    for h in (0.1, 0.05):
        q, p = tgi.rollout(H, q0, p0, h=h, steps=round(2 / h), method=method)
        e, m = H.energy(q, p), modified_hamiltonian(H, method, h).energy(q, p).detach()
        out.append((float((e - e[0]).abs().max()), float((m - m[0]).abs().max())))
    assert out[0][1] < 0.05 * out[0][0]
    assert 0.7 * 2 ** rest < out[0][1] / out[1][1] < 1.4 * 2 ** rest
    assert 0.7 * 2 ** p_order < out[0][0] / out[1][0] < 1.4 * 2 ** p_order


def test_correction_of_a_learned_model_is_a_differentiable_hamiltonian():
    torch.manual_seed(0)
    model = SeparableHNN(1, width=8)
    corr = CorrectedHamiltonian(model, "verlet", 0.1)
    assert (InverseModifiedHamiltonian(model, "verlet", 0.1).iterations == 1
            and InverseModifiedHamiltonian(model, "symplectic_euler", 0.1).iterations == 2)
    q, p = torch.randn(5, 1), torch.randn(5, 1)
    corr.energy(q, p).sum().backward()                        # gradients reach the parameters
    assert all(x.grad is not None and float(x.grad.abs().sum()) > 0 for x in model.parameters())
    with torch.no_grad():
        qs, ps = tgi.rollout(corr, q, p, h=0.1, steps=5, method="implicit_midpoint")
    assert qs.shape == (6, 5, 1) and bool(torch.isfinite(qs).all())
    # the correction is O(h²): small against H_θ's own variation
    d = (corr.energy(q, p) - model.energy(q, p)).detach()
    assert float((d - d.mean()).abs().max()) < 0.1 * float(model.energy(q, p).detach().std())


def test_correction_errors():
    H = _oscillator()
    for bad in ("yoshida4", "implicit_midpoint_yoshida4", tgi.METHODS["suzuki4"]):
        with pytest.raises(ValueError, match="no modified-Hamiltonian series"):
            correct_hamiltonian(H, bad, 0.1)
        with pytest.raises(ValueError, match="no modified-Hamiltonian series"):
            ModifiedHamiltonian(H, bad, 0.1)
    assert correct_hamiltonian(H, tgi.METHODS["verlet"], 0.1).method == "verlet"
    with pytest.raises(ValueError, match="h must be"):
        correct_hamiltonian(H, "verlet", 0.0)
    with pytest.raises(ValueError, match="iterations"):
        InverseModifiedHamiltonian(H, "verlet", 0.1, iterations=0)


def test_separable_verlet_term_equals_the_general_formula():
    """For H = T + V the separable form h²(V''(T',T')/12 − T''(V',V')/24) that a SeparableHNN
    gets is the general verlet term; the corrected model agrees both ways."""
    from torchgeo_int.nn.correction import series_terms
    torch.manual_seed(1)
    q, p = torch.randn(7, 2), torch.randn(7, 2)
    for H in (_pendulum(), SeparableHNN(2, width=8)):
        fast = series_terms(H, q, p, "verlet", 0.3).detach()
        general = series_terms(lambda a, b: H.energy(a, b), q, p, "verlet", 0.3).detach()
        torch.testing.assert_close(fast, general, rtol=1e-10, atol=1e-13)
        assert float(fast.abs().max()) > 1e-4


# ---------------------------------------------------------------- LazyAdam (node states under minibatching)


def _adam_pair(seed=0, wd=0.0):
    torch.manual_seed(seed)
    a = torch.nn.Parameter(torch.randn(5, 3))
    b = torch.nn.Parameter(a.detach().clone())
    return a, b


@pytest.mark.parametrize("wd", [0.0, 1e-2])
def test_lazy_adam_is_adam_on_dense_groups_and_on_full_gradients(wd):
    from torchgeo_int.nn import LazyAdam
    for rows in (False, True):
        a, b = _adam_pair()
        ref = torch.optim.Adam([a], lr=1e-2, weight_decay=wd)
        lazy = LazyAdam([b], lr=1e-2, weight_decay=wd, rows=rows)
        g = torch.Generator().manual_seed(1)
        for _ in range(25):
            grad = torch.randn(5, 3, generator=g)
            a.grad, b.grad = grad.clone(), grad.clone()
            ref.step()
            lazy.step()
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_lazy_adam_in_half_precision_moves_like_adam(dtype):
    """The step counts and bias corrections are not kept in the parameter's dtype: in bfloat16
    β₂ = 0.999 rounds to 1 (no update), and the counts stop at 256 / 2048."""
    from torchgeo_int.nn import LazyAdam
    for rows in (False, True):
        a = torch.nn.Parameter(torch.zeros(4, 3, dtype=dtype))
        b = torch.nn.Parameter(torch.zeros(4, 3, dtype=dtype))
        ref, lazy = torch.optim.Adam([a], lr=1e-3), LazyAdam([b], lr=1e-3, rows=rows)
        for _ in range(3000):
            a.grad, b.grad = torch.ones_like(a), torch.ones_like(b)
            ref.step()
            lazy.step()
        assert float(lazy.state[b]["step"].flatten()[0]) == 3000
        torch.testing.assert_close(b.float(), a.float(), rtol=0.02, atol=0.0)


def test_lazy_adam_leaves_rows_the_gradient_does_not_reach():
    """torch.optim.Adam keeps moving a row after its last gradient (its first moment is not 0);
    LazyAdam leaves it where it was, and a revisited row continues with its own bias correction."""
    from torchgeo_int.nn import LazyAdam
    a, b = _adam_pair()
    ref = torch.optim.Adam([a], lr=1e-2)
    lazy = LazyAdam([b], lr=1e-2, rows=True)
    grad = torch.randn(5, 3)
    for opt, x in ((ref, a), (lazy, b)):
        x.grad = grad.clone()
        opt.step()                                  # every row visited once
    seen_a, seen_b = a.detach().clone(), b.detach().clone()
    masked = grad.clone()
    masked[1:] = 0                                  # then only row 0 for 10 steps
    for opt, x in ((ref, a), (lazy, b)):
        for _ in range(10):
            x.grad = masked.clone()
            opt.step()
    assert torch.equal(b.detach()[1:], seen_b[1:])                      # lazy: unseen rows still
    assert (a.detach()[1:] - seen_a[1:]).abs().min() > 1e-3             # Adam: they drifted
    assert lazy.state[b]["step"].tolist() == [11.0, 1.0, 1.0, 1.0, 1.0]
    # a row's first visit after a pause is a fresh bias-corrected Adam step of that row alone
    one = torch.zeros(5, 3)
    one[2] = grad[2]
    b.grad = one
    before = b.detach().clone()
    lazy.step()
    m = 0.9 * 0.1 * grad[2] + 0.1 * grad[2]
    v = 0.999 * 0.001 * grad[2] ** 2 + 0.001 * grad[2] ** 2
    expected = before[2] - 1e-2 * (m / (1 - 0.9 ** 2)) / ((v / (1 - 0.999 ** 2)).sqrt() + 1e-8)
    torch.testing.assert_close(b.detach()[2], expected)
    assert torch.equal(b.detach()[[0, 1, 3, 4]], before[[0, 1, 3, 4]])


def test_trajectory_fit_minibatch_moves_only_the_reached_node_states():
    H = _oscillator()
    q, p, _ = _data(H, B=6, T=13, noise=0.05, seed=4)
    torch.manual_seed(0)
    tf = TrajectoryFit(SeparableHNN(1, width=8), q, p, dt=0.1, segment=3)     # 6 × 4 segments
    opt = tf.optimizer(lr=1e-3, state_lr=1e-2)
    assert type(opt).__name__ == "LazyAdam" and [g["rows"] for g in opt.param_groups] == [False, True]
    ids = torch.tensor([0, 5, 11])      # traj 0 seg 0, traj 1 seg 1, traj 2 seg 3 (its last)
    reached = {0, 1, 5, 6, 11}          # the batch's nodes and, through continuity, the next ones
    nodes = lambda: torch.cat([tf.q_nodes, tf.p_nodes], -1).detach().reshape(24, 2).clone()  # noqa: E731

    def moved_by(optimizer, batch):
        """The node rows that one training step on ``batch`` moved."""
        before = nodes()
        loss = tf(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        after = nodes()
        return {i for i in range(24) if not torch.equal(after[i], before[i])}
    for _ in range(3):
        assert moved_by(opt, ids) == reached
    # the same steps with another batch: rows seen before but not now stay where they are
    assert moved_by(opt, torch.tensor([20])) == {20, 21}
    # torch.optim.Adam (lazy_states=False) moves the rows of the earlier batch as well
    adam = tf.optimizer(lr=1e-3, state_lr=1e-2, lazy_states=False)
    assert isinstance(adam, torch.optim.Adam)
    moved_by(adam, ids)
    assert moved_by(adam, torch.tensor([20])) == reached | {20, 21}


def test_lazy_adam_full_batch_fit_matches_adam_and_resumes(tmp_path):
    H = _oscillator()
    q, p, _ = _data(H, B=4, T=9, noise=0.05, seed=5)
    out = []
    for lazy in (True, False):
        torch.manual_seed(0)
        tf = TrajectoryFit(SeparableHNN(1, width=8), q, p, dt=0.1, segment=4)
        opt = tf.optimizer(lr=1e-3, state_lr=1e-2, weight_decay=1e-4, lazy_states=lazy)
        fit(tf, TrajectoryFit.loss, tf.segments, steps=8, optimizer=opt, progress=False)
        out.append(torch.cat([x.detach().reshape(-1) for x in tf.parameters()]))
    torch.testing.assert_close(out[0], out[1], rtol=1e-10, atol=1e-12)
    # checkpoint / resume of the per-row state: 3 + 5 minibatch steps = 8 uninterrupted
    runs = []
    for split in (None, 3):
        torch.manual_seed(0)
        tf = TrajectoryFit(SeparableHNN(1, width=8), q, p, dt=0.1, segment=4)
        opt = tf.optimizer(lr=1e-3, state_lr=1e-2)
        ck = tmp_path / f"ck{split}.pt"
        if split:
            fit(tf, TrajectoryFit.loss, tf.segments, steps=split, batch_size=3, optimizer=opt,
                progress=False, checkpoint=ck)
            torch.manual_seed(0)
            tf = TrajectoryFit(SeparableHNN(1, width=8), q, p, dt=0.1, segment=4)
            opt = tf.optimizer(lr=1e-3, state_lr=1e-2)
        fit(tf, TrajectoryFit.loss, tf.segments, steps=8, batch_size=3, optimizer=opt,
            progress=False, checkpoint=ck, resume=bool(split))
        runs.append(torch.cat([x.detach().reshape(-1) for x in tf.parameters()]))
    assert torch.equal(runs[0], runs[1])


def test_lazy_adam_errors():
    from torchgeo_int.nn import LazyAdam
    x = torch.nn.Parameter(torch.zeros(3, 2))
    for kw, msg in ((dict(lr=0.0), "lr"), (dict(lr=float("nan")), "lr"), (dict(betas=(0.9,)), "betas"),
                    (dict(betas=(0.9, 1.0)), r"betas\[1\]"), (dict(eps=0.0), "eps"),
                    (dict(weight_decay=-1.0), "weight_decay")):
        with pytest.raises(ValueError, match=msg):
            LazyAdam([x], **kw)
    with pytest.raises(TypeError, match="rows must be a bool"):
        LazyAdam([x], rows=1)
    with pytest.raises(ValueError, match="at least one dim"):
        LazyAdam([torch.nn.Parameter(torch.zeros(()))], rows=True)
    opt = LazyAdam([x])
    with pytest.raises(ValueError, match="lr"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))], "lr": -1.0})
    x.grad = torch.zeros(3, 2).to_sparse()
    with pytest.raises(RuntimeError, match="dense gradients"):
        opt.step()
    H = _oscillator()
    q, p, _ = _data(H, B=2, T=5)
    tf = TrajectoryFit(SeparableHNN(1, width=4), q, p, dt=0.1, segment=2)
    with pytest.raises(ValueError, match="needs name='adam'"):
        tf.optimizer(name="sgd", lazy_states=True)
    with pytest.raises(TypeError, match="lazy_states must be a bool"):
        tf.optimizer(lazy_states="yes")
    assert isinstance(tf.optimizer(name="sgd"), torch.optim.SGD)


# ---------------------------------------------------------------- review fixes (2026-12-05)


@pytest.mark.parametrize("method", ["verlet", "symplectic_euler", "implicit_midpoint"])
def test_series_of_hamiltonians_with_constant_derivatives(method):
    """A free particle and uniform gravity: H_q or H_pp constant, so autograd has no graph for
    the next derivative; the series used to raise instead of taking those terms as 0."""
    torch.manual_seed(0)
    q, p = torch.randn(5, 2), torch.randn(5, 2)
    h, g = 0.1, 9.8
    free = tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1))
    grav = tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1) + g * q.sum(-1))
    grav_sep = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: g * q.sum(-1))
    assert torch.equal(ModifiedHamiltonian(free, method, h).energy(q, p), free.energy(q, p))
    d = ModifiedHamiltonian(grav, method, h).energy(q, p) - grav.energy(q, p)
    # K = H_pp(H_q, H_q) = 2g², {H, H_p·H_q} = 2g² (two coordinates)
    expect = {"verlet": torch.full((5,), h * h * (2 * g * g / 48 - 2 * g * g / 16)),
              "implicit_midpoint": torch.full((5,), -(h * h / 24) * 2 * g * g),
              "symplectic_euler": -(h / 2) * g * p.sum(-1) + (h * h / 12) * 2 * g * g}[method]
    torch.testing.assert_close(d, expect, rtol=1e-12, atol=1e-12)
    if method == "verlet":      # the separable fast path agrees
        torch.testing.assert_close(ModifiedHamiltonian(grav_sep, method, h).energy(q, p) - grav.energy(q, p),
                                   expect, rtol=1e-12, atol=1e-12)
    CorrectedHamiltonian(grav, method, h).energy(q, p)      # and the correction runs


def test_training_inputs_that_would_train_silently_wrong_are_refused():
    from torchgeo_int.nn import PortHamiltonianNN, energy_drift, fit, predict, rollout_loss
    from torchgeo_int.nn.dissipative import forced_derivative_loss, forced_rollout_loss
    torch.manual_seed(0)
    H = _pendulum()
    q, p = tgi.rollout(H, torch.randn(8, 1), torch.randn(8, 1), h=0.1, steps=50)   # (51, 8, 1)
    with pytest.raises(ValueError, match="look time-first"):
        energy_drift(H, q, p)
    assert float(energy_drift(H, q, p, layout="time_first")) < 0.05
    m = PortHamiltonianNN(1, n_controls=1, damping="constant", input_map="constant")
    with pytest.raises(ValueError, match="look time-first"):
        forced_rollout_loss(m, q[:6], p[:6], dt=0.1)
    qw, pw = tgi.nn.make_windows(q, p, 3, layout="time_first")
    with pytest.raises(ValueError, match="substeps must be an int >= 1"):
        forced_rollout_loss(m, qw, pw, dt=0.1, substeps=0)
    with pytest.raises(ValueError, match="pass dt"):
        forced_derivative_loss(m, qw, pw, qw, pw, control=lambda t: torch.tensor([math.sin(t)]))
    for init in (0.0, -0.1, float("nan")):   # C = LLᵀ at L = 0 has zero gradient: never learns
        with pytest.raises(ValueError, match="damping_init"):
            PortHamiltonianNN(1, damping="constant", damping_init=init)
    model = SeparableHNN(1, width=8)
    loss = lambda m_, a, b: rollout_loss(m_, a, b, dt=0.1)     # noqa: E731
    for clip in (0.0, -1.0, float("nan")):                      # -1 trained uphill
        with pytest.raises(ValueError, match="grad_clip"):
            fit(model, loss, (qw, pw), steps=1, grad_clip=clip, progress=False)
    teacher_q, teacher_p = tgi.rollout(SeparableHNN(1, width=8), torch.randn(4, 1), torch.randn(4, 1),
                                       h=0.1, steps=6)           # carries the teacher's graph
    with pytest.raises(ValueError, match="requires grad"):
        TrajectoryFit(model, teacher_q, teacher_p, dt=0.1, layout="time_first")
    with pytest.raises(ValueError, match="TrajectoryFit sets \\['save_every'\\] itself"):
        TrajectoryFit(model, qw, pw, dt=0.1, save_every=2)
    with pytest.raises(ValueError, match="unknown option"):
        TrajectoryFit(model, qw, pw, dt=0.1, foo=1)
    with pytest.raises(ValueError, match="shape \\(B, n\\)"):
        predict(model, torch.zeros(1), torch.zeros(1), h=0.1, steps=3)


def test_unshuffled_batches_reach_every_sample_when_the_size_does_not_divide():
    from torchgeo_int.nn.training import TensorBatches
    x = torch.arange(100.0)[:, None]
    seen = set()
    b = TensorBatches(x, batch_size=64, shuffle=False)
    for e in range(3):
        for (xb,) in b.epoch(e):
            assert xb.shape == (64, 1)
            seen |= set(xb[:, 0].long().tolist())
    assert seen == set(range(100))                  # the last 36 were never seen
    even = TensorBatches(x, batch_size=50, shuffle=False)   # dividing: the same batches each epoch
    assert all(torch.equal(a[0], c[0]) for a, c in zip(even.epoch(0), even.epoch(3)))
