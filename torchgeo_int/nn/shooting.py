r"""Fitting a learned Hamiltonian to whole observed trajectories with learned initial states.

:class:`TrajectoryFit` holds a model H_θ *and* one learnable state per shooting node of every
observed trajectory, initialised from the (noisy) observation at that node.  Its loss, for
trajectories x_0, …, x_{T-1} observed every ``dt`` and a shooting grid of S segments of ``segment``
intervals each (T − 1 = S · segment),

    L = (1 / (2n)) mean_{b,s,j} |Φ^{(j)}(z_{b,s}) − x_{b, s·segment + j}|²        j = 0..segment
      + w · (1 / (2n)) mean_{b, s<S-1} |Φ^{(segment)}(z_{b,s}) − z_{b,s+1}|²,

where z_{b,s} = (q, p) is the learned state at node s of trajectory b and Φ^{(j)} is j·``substeps``
steps of the integrator ``method`` at h = dt / substeps.  One segment per trajectory
(``segment=None``) is *initial-state estimation* for single shooting (SRNN, Chen et al., ICLR
2020: the rollout starts from an estimated clean state, not from a noisy observation, so the
observation noise is not re-injected at every window); more segments are *multiple shooting*
(Bock & Plitt 1984; Ribeiro et al. 2020 for neural ODEs) with the continuity defects penalised
by the weight w (``continuity``): long trajectories stay trainable (short rollouts, a smooth loss)
while the penalty ties the segments into one trajectory.  The estimated node states are a
by-product; a held-out trajectory needs none of them — roll ``fit.model`` out from its first
state as for any other model.

**Observed derivatives** (``derivatives=(dq, dp)``, the time derivatives at the observation
times, e.g. the true field at the clean states as in the HNN paper's data): the loss adds

      w_d · (1 / (2n)) mean_{(b,s,j) ∈ M} |X_{H_θ}(sg[Φ^{(j)}(z_{b,s})]) − ẋ_{b, s·segment + j}|²,

M: j = 0..segment − 1, and j = segment on a trajectory's last segment — each observation once
(an inner node's time is both a segment's end and the next segment's start; its derivative is
matched at the node, and with one-step segments the field is evaluated at half the points);
derivative matching (Greydanus et al. 2019) at the fit's *estimates* of the states (sg: no
gradient to them; they are inputs, as data are) instead of at the noisy observations.  Derivative
matching at noisy inputs is an errors-in-variables regression: its fit is biased by the noise
at its inputs (a harmonic oscillator's coefficients shrink by var(x) / (var(x) + σ²)), a bias
the shooting fit's state estimates, closer to the clean states, reduce.  Solved states
(``gauss_newton``) minimise the whole loss, the derivative residuals included, so that the
states and the derivatives they are matched with agree; learned states get the gradient of the
data and continuity terms only.  ``derivative_points=k`` takes the training loss's mean over k of
the batch's points in M, drawn afresh at each call (an unbiased estimate, as a minibatch is):
the term's cost no longer grows with the segments a step; the state solve still uses them all.
On a separable H_θ = T_θ(p) + V_θ(q) trained through a kick–drift splitting (``verlet``,
``yoshida4``, …) with solved states, ∂V_θ/∂q at a node is computed once for the derivative
term and the rollout's first kick (handed to it as its FSAL cache): the same numbers, one
network evaluation a node fewer.
The weight w_d is a modelling choice to tune on held-out data: in the HNN study (MLPs, noisy
pendulum trajectories, exact derivatives) w_d = 10 beat 1 on five of six data draws (held-out
energy error 4× lower on the study's), while from 30 on the fit broke (the state solve, which
weighs the derivative residuals alike, moves the states to where the model's field matches the
targets rather than the data); on spring 1 and 0.3 traded places from draw to draw; and with a
two-coefficient model of the true pendulum H a constant w_d of 3 or 10 drove the fit into a wrong
basin, while ``derivative_warmup=1000`` (1 → 10 over the first half of training) recovered the
true coefficients on every noise draw tried — with the MLPs it was slightly worse than the
constant weight (``experiments/hnn/HISTORY.md``).

The loss is taken per *segment*, so :func:`~torchgeo_int.nn.fit` can batch segments:
``fit(tf, TrajectoryFit.loss, tf.segments, ...)``; a segment's continuity term reaches the next
node's state whether or not that segment is in the batch.  Weight decay must not pull the
states to zero: :meth:`TrajectoryFit.optimizer` gives the model and the states separate groups
(weight decay on the model only, and a learning rate of their own for the states), and under
minibatching moves only the states that the batch reaches (:class:`~torchgeo_int.nn.LazyAdam`).

**Solved node states** (``gauss_newton=k``): the node states are *incidental* parameters — each is
seen only by its own segment — and first-order steps converge them slowly or not at all (learned
single-shooting states on the pendulum stall at a loss of 0.96; under minibatches a node is reached
once every B·S / batch steps).  With k > 0 the states are not learned by the optimizer but
*solved*: before each loss evaluation in training mode, k Gauss–Newton sweeps minimise the full
loss over the batch's node states with H_θ fixed (each node with its neighbours fixed: red–black
block Gauss–Seidel on chains of neighbouring nodes).  The model then takes its gradient step at
(nearly) optimal states — the variable-projection method for separable least squares (Golub &
Pereyra, SIAM J. Numer. Anal. 1973), where by the envelope theorem ∂L/∂θ at the solved states is
the gradient of the reduced loss θ ↦ min_z L(θ, z).  The states then carry no graph
(``requires_grad=False``) and :meth:`TrajectoryFit.optimizer` has only the model's group.  A sweep
costs about the network evaluations of 2n + 3 graph-free rollouts of the batch's states by
differences, of n + 3 by the chain rule through a kick–drift splitting, n/2 + 3 with the
closed-form Hessians of a :class:`~torchgeo_int.nn.SeparableHNN`
(:meth:`TrajectoryFit.solve_states`).  The last sweep rolls its candidate states out in the
caller's grad mode; where every node of a half-sweep accepts its step that rollout is the loss's
for those nodes (the same states and θ, so the same numbers), and the loss rolls out only the
batch's other nodes.  On minibatched multiple shooting (noisy two-body, segments of 7, batch 200,
development seed) it lowered the node error 0.12 → 0.096 but not the error of the learned H, in
about 8× the training time. ``solve_every=k`` solves a node at its first visit and then at every
k-th only: the states, once near their solution, move slowly with θ.
"""
from __future__ import annotations

import difflib
import inspect

import torch
from torch import nn

from .._validate import check_finite, check_int, check_real
from ..gradients import grad_mode
from ..integrators import get_method
from ..integrators.base import SplittingStepper
from ..rollout import as_system, rollout
from ..solve import solve
from .losses import check_data, check_derivative_layout, check_layout
from .optim import LazyAdam

Tensor = torch.Tensor


def _positive(value, name, *, allow_zero=False):
    return check_real(value, name, 0.0, lo_open=not allow_zero)


def _step_size(x: Tensor) -> Tensor:
    """The forward-difference step of each row of x (…, k): ε = √u · max(1, |x|_∞), shape (…, 1)."""
    return torch.finfo(x.dtype).eps ** 0.5 * x.abs().amax(-1, keepdim=True).clamp_min(1.0)


def _perturbed(x: Tensor, eps: Tensor) -> Tensor:
    """The points x and x + ε e_c of each row of x (N, k): shape (N, 1 + k, k)."""
    pts = x.unsqueeze(1).repeat(1, x.shape[-1] + 1, 1)
    pts[:, 1:].diagonal(dim1=1, dim2=2).add_(eps)
    return pts


def _differences(X: Tensor, eps: Tensor) -> Tensor:
    """Values at x and x + ε e_k, ``X[..., N, 1 + k, :]``, as the value and the difference
    quotients (f(x + ε e_k) − f(x)) / ε in the same layout (eps of shape (N, 1))."""
    return torch.cat([X[..., :1, :], (X[..., 1:, :] - X[..., :1, :]) / eps[:, :, None]], -2)


def _lifted(half, jacobian=None):
    r"""The tangent lift of a map f: Rⁿ → Rⁿ (a splitting's ∂T/∂p or force term) on stacks
    ``x`` of shape (…, 1 + k, n): the point x₀ = ``x[..., 0, :]`` and k tangents d_i, to
    [f(x₀); f′(x₀) d_1; …; f′(x₀) d_k].  f′(x₀) from ``jacobian`` (x ↦ (f(x), f′(x)), rows
    ∂f/∂x_c; a closed-form Hessian) where given, else forward differences, column
    c = (f(x₀ + ε e_c) − f(x₀)) / ε (:func:`_step_size`): n + 1 evaluations of f however many
    tangents ride along.  A kick p ← p + a h f(q) or a drift on such stacks is the step's
    tangent map (both are affine in the stack), so a splitting stepper built on lifted halves
    propagates ∂Φ/∂z by the chain rule."""
    def lifted(x: Tensor) -> Tensor:
        n = x.shape[-1]
        base = x[..., 0, :].reshape(-1, n)
        if jacobian is not None:
            f, jac = jacobian(base)
            f = f.unsqueeze(1)
        else:
            eps = _step_size(base)                                     # (L, 1)
            values = _differences(half(_perturbed(base, eps).reshape(-1, n)).view(-1, n + 1, n), eps)
            f, jac = values[:, :1], values[:, 1:]                      # row c: ∂f/∂x_c
        tangents = x[..., 1:, :].reshape(base.shape[0], -1, n) @ jac
        return torch.cat([f, tangents], 1).view(x.shape)
    return lifted


class TrajectoryFit(nn.Module):
    r"""A model H_θ and learnable shooting-node states for observed trajectories ``q, p`` of
    shape ``(B, T, n)`` (B trajectories, T states ``dt`` apart); see the module docstring.

    ``segment``: intervals per shooting segment (``None``: the whole trajectory, T − 1); it must
    divide T − 1.  ``method`` / ``substeps``: the training integrator and its steps per data
    interval (any name of ``METHODS`` or an Integrator: ``"yoshida4"``,
    ``"implicit_midpoint_yoshida4"``, …).  ``continuity``: the weight w of the continuity
    defects (≥ 0; unused with one segment).  ``q0, p0``: initial node states of shape
    ``(B, S, n)`` (or ``(B, n)`` when S = 1) instead of the observations at the nodes.
    ``rollout_options`` go to :func:`torchgeo_int.rollout` (``grad="checkpoint"`` …).
    ``gauss_newton``: Gauss–Newton steps on the batch's node states before every training-mode
    loss evaluation (0: the states are learned by the optimizer; see the module docstring and
    :meth:`solve_states`).  ``solve_every``: a node is solved at its first training-mode
    visit (its segment in the batch) and then at every k-th; at its other visits it keeps its
    last solved state, from an earlier θ — block coordinate descent, as a stiff solver keeps
    its Jacobian for some steps.  Where the solve dominates a step (one-step segments: a sweep
    costs several rollouts of the batch) this divides the training time by up to k.  The visit
    counts are the buffer ``visits`` (saved with the module, so a resumed fit solves where the
    uninterrupted one would).  ``derivatives``: ``(dq, dp)`` of the data's shape, the observed
    time derivatives, matched at the fit's states with the weight ``derivative_weight`` (see the
    module docstring), at ``derivative_points`` random points of the batch's (None: all).
    ``derivative_warmup=k``: in training mode the weight rises linearly from 1 to
    ``derivative_weight`` over the first k loss evaluations (the state solve's with it; the
    count is the buffer ``loss_calls``); evaluation mode takes ``derivative_weight``.
    ``layout``: as the losses' (:func:`~torchgeo_int.nn.losses.check_layout`): ``None`` refuses
    data that look time-first, ``"time_first"`` takes ``(T, B, n)`` as
    :func:`~torchgeo_int.rollout` returns it, ``"windows"`` skips the check.

    Attributes: ``model``, ``q_nodes`` / ``p_nodes`` (``nn.Parameter`` of shape ``(B, S, n)``),
    ``segments`` (the tuple ``(arange(B·S),)``, the data to hand to ``fit``).
    """

    def __init__(self, model, q: Tensor, p: Tensor, *, dt: float, segment: int | None = None,
                 method="verlet", substeps: int = 1, continuity: float = 1.0,
                 q0: Tensor | None = None, p0: Tensor | None = None, gauss_newton: int = 0,
                 solve_every: int = 1, layout: str | None = None,
                 derivatives: tuple[Tensor, Tensor] | None = None, derivative_weight: float = 1.0,
                 derivative_points: int | None = None, derivative_warmup: int = 0,
                 **rollout_options):
        super().__init__()
        system = as_system(model)
        if getattr(system, "time_dependent", False):
            raise NotImplementedError("TrajectoryFit rolls segments out from t = 0: it needs an "
                                      "autonomous H(q, p)")
        # layout="time_first" transposes here; the look-time-first check (layout=None) comes
        # after the grid's, whose message already names the transpose where the grid fails
        q, p = check_layout(q, p, "windows" if layout is None else layout, "TrajectoryFit")
        check_data(q, p, names=("q", "p"), ndim=3, min_len=2)
        self.model = system
        self.dt = _positive(dt, "dt")
        self.substeps = check_int(substeps, "substeps", 1)
        self.continuity = _positive(continuity, "continuity", allow_zero=True)
        get_method(method)   # a misspelled name is refused here, not at the first loss
        self.method = method
        # checked now, not at the first forward: what the fit sets itself, then the grad mode's
        own = sorted(set(rollout_options) & {"h", "steps", "method", "save_every", "t0", "step_control"})
        if own:
            raise ValueError(f"TrajectoryFit sets {own} itself (dt / substeps, the grid, from t = 0); "
                             "its rollout_options are check_every, compile, progress, grad and the "
                             "grad mode's options")
        try:
            grad_mode(rollout_options.get("grad", "backprop"),
                      **{k: v for k, v in rollout_options.items()
                         if k not in ("grad", "check_every", "compile", "progress")})
        except ValueError as err:     # most often a misspelled argument of TrajectoryFit's own
            own_args = list(inspect.signature(TrajectoryFit.__init__).parameters)[4:-1]
            near = {k: difflib.get_close_matches(k, own_args, 1) for k in rollout_options}
            hint = "; ".join(f"{k!r}: did you mean {m[0]!r}?" for k, m in near.items() if m)
            raise ValueError(f"TrajectoryFit: {err}. Keywords that are not TrajectoryFit's own "
                             f"({', '.join(own_args)}) go to the rollout"
                             + (f" ({hint})" if hint else "")) from None
        if "check_every" in rollout_options:       # (also read by the path that hands in the first force)
            check_int(rollout_options["check_every"], "check_every", 1)
        self.rollout_options = rollout_options
        B, T, n = q.shape
        d = getattr(model, "dim", None)
        if isinstance(d, int) and not isinstance(d, bool) and d != n:
            # caught here, not at the first loss, where only the network's input check would name it
            raise ValueError(f"TrajectoryFit: the model's states have dim {d} (model.dim) but the "
                             f"data's have n = {n} (q, p of shape (B, T, n) = {tuple(q.shape)})")
        intervals = T - 1
        seg = intervals if segment is None else check_int(segment, "segment", 1)
        if intervals % seg:
            raise ValueError(f"the shooting grid does not divide the data: {T} states make {intervals} "
                             f"intervals, not a multiple of segment = {seg} (choose a divisor of "
                             f"{intervals}, or trim the trajectories)"
                             + (f"; q and p are batch-first (B, T, n) — if yours are time-first "
                                f"(T, B, n) = {tuple(q.shape)}, transpose(0, 1) them"
                                if (B - 1) % seg == 0 else ""))
        if layout is None:
            check_layout(q, p, None, "TrajectoryFit", whole=True)
        S = intervals // seg
        self.trajectories, self.n_segments, self.segment, self.dim = B, S, seg, n

        def cut(x):                                       # (B, T, n) → (B·S, seg + 1, n)
            return x.unfold(1, seg + 1, seg).permute(0, 1, 3, 2).reshape(B * S, seg + 1, n)

        self.register_buffer("q_obs", cut(q), persistent=False)
        self.register_buffer("p_obs", cut(p), persistent=False)
        self.derivative_weight = _positive(derivative_weight, "derivative_weight", allow_zero=True)
        if derivatives is not None:
            if not isinstance(derivatives, (tuple, list)) or len(derivatives) != 2:
                raise TypeError("derivatives must be a pair (dq, dp) of the data's shape (B, T, n)")
            dq, dp = derivatives
            if layout == "time_first":
                dq, dp = check_layout(dq, dp, layout, "TrajectoryFit")
            swapped = (q.shape[1], q.shape[0], q.shape[2])
            if swapped != q.shape and any(isinstance(x, Tensor) and x.shape == swapped for x in (dq, dp)):
                raise ValueError(f"derivatives must have the states' layout, (B, T, n) = {tuple(q.shape)}; "
                                 f"got {swapped}, time-first: transpose(0, 1) them")
            check_data(q, p, dq, dp, names=("q", "p", "dq", "dp"), ndim=3)
            check_derivative_layout(q, p, dq, dp, "TrajectoryFit", time_dim=1)   # (the square case)
            dq, dp = cut(dq), cut(dp)
        elif derivative_weight != 1.0 or derivative_points is not None or derivative_warmup:
            what = (f"derivative_weight = {derivative_weight}" if derivative_weight != 1.0
                    else f"derivative_points = {derivative_points}" if derivative_points is not None
                    else f"derivative_warmup = {derivative_warmup}")
            raise ValueError(f"{what} applies to observed derivatives: pass derivatives=(dq, dp) with it")
        else:
            dq = dp = None
        self.derivative_points = (None if derivative_points is None
                                  else check_int(derivative_points, "derivative_points", 1))
        self.derivative_warmup = check_int(derivative_warmup, "derivative_warmup", 0)
        # training-mode loss evaluations so far: the warm-up's clock (saved with the module where
        # there is a warm-up, so a resumed fit continues it)
        self.register_buffer("loss_calls", torch.zeros((), dtype=torch.long, device=q.device),
                             persistent=self.derivative_warmup > 0)
        self.register_buffer("dq_obs", dq, persistent=False)
        self.register_buffer("dp_obs", dp, persistent=False)
        given = (q0 is not None, p0 is not None)
        if any(given) and not all(given):
            raise ValueError("give both q0 and p0 (initial node states), or neither")
        if all(given):
            q0, p0 = (self._check_states(x, name, q) for x, name in ((q0, "q0"), (p0, "p0")))
        else:
            q0, p0 = q[:, :intervals:seg], p[:, :intervals:seg]          # observations at the nodes
        self.gauss_newton = check_int(gauss_newton, "gauss_newton", 0)
        self.solve_every = check_int(solve_every, "solve_every", 1)
        if self.solve_every > 1 and not self.gauss_newton:
            raise ValueError(f"solve_every = {solve_every} applies to solved states: pass "
                             f"gauss_newton ≥ 1 with it (learned states move at every step)")
        # training-mode visits of each segment's node so far (solve_every's clock, per node)
        self.register_buffer("visits", torch.zeros(B * S, dtype=torch.long, device=q.device))
        solved = self.gauss_newton > 0           # solved states are not learned: no graph to them
        self.q_nodes = nn.Parameter(q0.detach().contiguous().clone(), requires_grad=not solved)
        self.p_nodes = nn.Parameter(p0.detach().contiguous().clone(), requires_grad=not solved)

    def _check_states(self, x, name, like):
        B, S, n = self.trajectories, self.n_segments, self.dim
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor")
        if S == 1 and x.dim() == 2:
            x = x.unsqueeze(1)
        if x.shape != (B, S, n):
            alt = f" or ({B}, {n})" if S == 1 else ""
            raise ValueError(f"{name} must hold one state per trajectory and shooting node: the data "
                             f"have {B} trajectories and {S} segment(s) of dim {n}, so shape "
                             f"({B}, {S}, {n}){alt}; got {tuple(x.shape)}")
        if x.dtype != like.dtype or x.device != like.device:
            raise ValueError(f"{name} must have the data's dtype and device ({like.dtype}/{like.device}), "
                             f"got {x.dtype}/{x.device}")
        check_finite(x, name)
        return x

    @property
    def segments(self) -> tuple[Tensor]:
        """``(arange(B·S),)``: segment b·S + s is segment s of trajectory b (data for ``fit``)."""
        return (torch.arange(self.trajectories * self.n_segments, device=self.q_nodes.device),)

    @staticmethod
    def loss(fit_module: "TrajectoryFit", index: Tensor | None = None) -> Tensor:
        """``loss_fn`` for :func:`~torchgeo_int.nn.fit`: ``fit_module(index)``."""
        if isinstance(fit_module, torch.Tensor):     # (a wrapped module — DDP, compile — is fine)
            raise TypeError(f"TrajectoryFit.loss(fit_module, index) is fit's loss_fn (fit(tf, "
                            f"tf.loss, …)); called on an instance, tf.loss(index) passes "
                            f"{type(fit_module).__name__} as the module: call tf(index)")
        return fit_module(index)

    def initial_states(self) -> tuple[Tensor, Tensor]:
        """The estimated states at t = 0 of the observed trajectories, ``(B, n)`` each (detached)."""
        return self.q_nodes[:, 0].detach(), self.p_nodes[:, 0].detach()

    def _index(self, index: Tensor | None) -> Tensor:
        """Checked flat segment ids b·S + s (all if None): an integer tensor of distinct ids in
        range, returned as int64."""
        total = self.trajectories * self.n_segments
        if index is None:
            return torch.arange(total, device=self.q_nodes.device)
        if not isinstance(index, Tensor) or index.is_floating_point() or index.is_complex() \
                or index.dtype == torch.bool or index.dim() != 1 or index.numel() == 0:
            raise ValueError("index must be a non-empty 1-d integer tensor of segment ids")
        if bool(((index < 0) | (index >= total)).any()):
            raise ValueError(f"segment ids must lie in [0, {total}) ({self.trajectories} trajectories "
                             f"× {self.n_segments} segments), got {index.min().item()}..{index.max().item()}")
        if index.unique().numel() != index.numel():   # one node, one term and one update a call
            raise ValueError("the segment ids must be distinct (a repeated id would weigh its "
                             "segment twice and count one visit)")
        return index.long()    # (a uint8 tensor would index as a mask)

    def forward(self, index: Tensor | None = None, *energy_args) -> Tensor:
        """The loss over the segments ``index`` (integer tensor of flat ids b·S + s; all if None)."""
        if energy_args:    # called as H(q, p): by rollout, predict, rollout_mse, …
            raise TypeError("a TrajectoryFit is a loss over its data, not a Hamiltonian: roll out "
                            "or evaluate its model, tf.model")
        total = self.trajectories * self.n_segments
        index = self._index(index)
        n, S = self.dim, self.n_segments
        # the loss's rollouts by segment ids: [(ids, (qs, ps), X_H at the nodes or None)]
        pieces, share = [], True
        if self.gauss_newton and self.training:
            due = index[self.visits[index] % self.solve_every == 0]
            if due.numel():
                # the last sweep's accepted candidates, rolled out in the caller's grad mode, are
                # the loss's rollouts of those nodes (the same states and θ): not rolled out
                # twice.  Single shooting solved whole takes X_H at its nodes with its other
                # points, in one evaluation of the field, not from the rollouts' first kicks (see
                # _loss_roll), as when it alone reused its rollouts: the spring and pendulum
                # studies (full batches, single shooting, one sweep) train bit for bit as then
                share = S > 1 or due.numel() < index.numel()
                pieces = self._solve(due, self.gauss_newton, keep_grad=torch.is_grad_enabled(),
                                     share=share)[1]
                share = share or not pieces          # (none came back: the loss rolls all out)
            self.visits[index] += 1
        qn, pn = self.q_nodes.reshape(total, n), self.p_nodes.reshape(total, n)
        rest = index if not pieces else index[~torch.isin(index, torch.cat([ids for ids, *_ in pieces]))]
        if rest.numel():
            pieces.append((rest, *self._loss_roll(qn[rest], pn[rest], share)))
        if len(pieces) == 1:
            index, (qs, ps), node = pieces[0]
        else:                  # (the rows in the pieces' order: the loss is a mean over them)
            index = torch.cat([ids for ids, *_ in pieces])
            qs, ps = (torch.cat([r[i] for _, r, _ in pieces], 1) for i in (0, 1))
            node = None if pieces[0][2] is None else torch.cat([f for *_, f in pieces])
        eq = qs - self.q_obs[index].transpose(0, 1)
        ep = ps - self.p_obs[index].transpose(0, 1)
        loss = 0.5 * ((eq * eq).mean() + (ep * ep).mean())
        if self.continuity > 0 and S > 1:
            inner = (index % S) != S - 1                      # segments with a next node
            if bool(inner.any()):
                nxt = index[inner] + 1
                dq = qs[-1][inner] - qn[nxt]
                dp = ps[-1][inner] - pn[nxt]
                loss = loss + self.continuity * 0.5 * ((dq * dq).mean() + (dp * dp).mean())
        if self._matches_derivatives():
            # derivative matching at the fit's estimates of the states, not at the noisy
            # observations: the inputs carry the estimate's error instead of the noise
            # (errors in variables), and no graph to the states (they are inputs, as data are)
            parts = self._derivative_parts(index)
            Q, P, dQ, dP = (torch.cat([x[j].reshape(-1, n) for _, j in parts])
                            for x in (qs.detach(), ps.detach(), self.dq_obs[index].transpose(0, 1),
                                      self.dp_obs[index].transpose(0, 1)))
            k = self.derivative_points
            if self.training and k is not None and k < Q.shape[0]:
                # an unbiased estimate of the mean over the batch's points at k of them, drawn
                # afresh each step (a minibatch of the derivative data, as (a) takes)
                pick = torch.randperm(Q.shape[0], device=Q.device)[:k]
                Q, P, dQ, dP = Q[pick], P[pick], dQ[pick], dP[pick]
            if node is None:
                fq, fp = self.model.vector_field(Q, P, 0.0)
            else:                     # the first index.numel() points are the nodes (j = 0)
                N = index.numel()
                f = node if Q.shape[0] == N else torch.cat([node, self._field(torch.cat([Q[N:], P[N:]], -1))])
                fq, fp = f[:, :n], f[:, n:]
            eq, ep = fq - dQ, fp - dP
            loss = loss + self._derivative_weight_now() * 0.5 * ((eq * eq).mean() + (ep * ep).mean())
        if self.training and self.derivative_warmup:    # the warm-up's clock; nothing else reads it
            self.loss_calls += 1
        return loss

    def _derivative_weight_now(self) -> float:
        """The derivative weight of this loss evaluation: ``derivative_weight``, or during a
        warm-up (training mode, the first ``derivative_warmup`` evaluations) the linear ramp
        from 1 to it."""
        k, w = self.derivative_warmup, self.derivative_weight
        if not (k and self.training):
            return w
        return 1.0 + (w - 1.0) * min(1.0, int(self.loss_calls) / k)

    def _roll(self, q: Tensor, p: Tensor, force: Tensor | None = None, stepper=None):
        """Φ^{(j)}(q, p), j = 0..segment: the segment rollout of the loss, the solve and the
        defects, ``(segment + 1, N, n)`` each.  ``force``: the force term at q, handed to the
        first kick of ``stepper`` (:meth:`_first_kick`) as its FSAL cache."""
        h, steps = self.dt / self.substeps, self.segment * self.substeps
        if force is None:
            return rollout(self.model, q, p, h=h, steps=steps, method=self.method,
                           save_every=self.substeps, **self.rollout_options)
        return solve(get_method(self.method), self.model, q, p, h=h, steps=steps,
                     save_every=self.substeps, step=stepper, cache=force,
                     check_every=self.rollout_options.get("check_every", 64))

    def _loss_roll(self, q: Tensor, p: Tensor, share: bool = True):
        """The loss's rollout of the node states (q, p) (N, n): ((qs, ps) of :meth:`_roll`, X_H at
        the nodes (N, 2n) or None).  With ``share``, where the derivative term takes every point
        at the nodes and no gradient reaches them, X_H there comes from the training
        integrator's halves and its force is handed to the rollout's first kick
        (:meth:`_first_kick`): one evaluation for both."""
        if (share and self._matches_derivatives() and not self.q_nodes.requires_grad
                and (self.derivative_points is None or not self.training)):
            stepper = self._first_kick()
            if stepper is not None:
                force, field = self._halves_at(stepper, torch.cat([q, p], -1))
                return self._roll(q, p, force, stepper), field
        return self._roll(q, p), None

    def _roll_states(self, z: Tensor, force: Tensor | None = None, stepper=None, forces: bool = False):
        """:meth:`_roll` of states z = (q, p) of shape (N, 2n): (segment + 1, N, 2n) — the state
        solve's graph-free rollouts.  With a splitting ``stepper`` (:meth:`_first_kick`) its own
        step loop (the numbers :meth:`_roll` computes), also on the lifted stacks (…, 1 + 2n, 2n)
        of :meth:`_tangent_rollout`: the solve rolls out a few states many times a step, and
        :func:`~torchgeo_int.rollout`'s checks and output buffers cost more than such a rollout
        (on the two-body study's one-step segments, a fifth of the solve).  That loop does not
        check finiteness: :meth:`_gauss_newton_step` checks the nodes' own rollouts and rejects
        a candidate whose rollout is not finite.  With ``forces`` (and a stepper and the first
        ``force`` given; without a stepper it is ignored) also the force terms at the rollout's
        states, (segment + 1, N, …, n), the steps' own (FSAL), or None where a step ends in a
        drift."""
        if stepper is None:
            return torch.cat(self._roll(z[:, :self.dim], z[:, self.dim:], force), -1)
        n, h = self.dim, self.dt / self.substeps
        q, p, out, fs = z[..., :n], z[..., n:], [z], [force]
        for _ in range(self.segment):
            q, p, force = stepper.steps(q, p, 0.0, h, self.substeps, force)
            out.append(torch.cat([q, p], -1))
            fs.append(force)
        if not forces:
            return torch.stack(out)
        return torch.stack(out), None if any(f is None for f in fs) else torch.stack(fs)

    #: rollout options under which the training rollout may be handed its first force
    _PLAIN = {"grad": "backprop", "compile": False, "progress": False}

    def _first_kick(self):
        """The training integrator bound to the model when its step starts with a kick of a
        kick–drift splitting on a separable H (``verlet``, ``yoshida4``, …: its first force
        can be handed to it, the FSAL cache), run by plain backprop, not compiled; else None.
        The field X_H = (∂T/∂p, −∂V/∂q) at the nodes that the derivative terms need then
        shares ∂V/∂q with the rollout's first kick: one network evaluation, not two."""
        if any(k != "check_every" and self._PLAIN.get(k, object()) != v for k, v in self.rollout_options.items()):
            return None
        stepper = get_method(self.method).bind(self.model)
        if not isinstance(stepper, SplittingStepper) or stepper.timed or stepper.pairs[0][0] == 0.0:
            return None
        return stepper

    def _halves_at(self, stepper, z: Tensor, force: Tensor | None = None):
        """At states z = (q, p) of shape (..., 2n): the force term at q (``force`` where already
        known) and X_H(z) of z's shape, by the stepper's own halves (the numbers its kicks and
        drifts compute; a lifted stepper's on stacks)."""
        n = self.dim
        force = stepper.force_term(z[..., :n]) if force is None else force
        return force, torch.cat([stepper.velocity(z[..., n:]), self.model.force_sign * force], -1)

    def solve_states(self, index: Tensor | None = None, *, steps: int = 1) -> Tensor:
        r"""``steps`` Gauss–Newton sweeps over the node states of the segments ``index`` (all if
        None), H_θ fixed; returns the local objective ℓ of each node after the last sweep.

        Node z = z_{b,s} minimises its part of the full loss (the data of its segment and the
        continuity terms that contain it, with the weights of the full-batch loss),

            ℓ(z) = 1/(segment+1) Σ_j |Φ^{(j)}(z) − x_j|² + w_d′ Σ_{j ∈ M_s} |X_{H_θ}(Φ^{(j)}(z)) − ẋ_j|²
                   + w′ (|Φ^{(segment)}(z) − z_{s+1}|² + |Φ^{(segment)}(z_{s−1}) − z|²),
            w′ = w · S / (S − 1),   w_d′ = w_d · S / (S · segment + 1),

        with its neighbours fixed at their current values (the w_d term only with observed
        ``derivatives``: the states are estimated from everything observed; M_s = {0, …,
        segment − 1}, and segment too on a trajectory's last segment).  A sweep updates the nodes in
        two halves, red–black block Gauss–Seidel on each chain of neighbouring nodes of
        ``index``: first the even nodes s of the chains and every node with no neighbour in
        ``index`` (its neighbours stay as they are in either half), then the odd ones; each half
        sees its neighbours' new states, about twice Jacobi's rate on a chain.  Where the odd
        nodes are fewer than :attr:`GAUSS_SEIDEL_FRACTION` of ``index`` (the few neighbours that a
        sparse minibatch of segment ids happens to hold) they join the first half and see their
        neighbours' old states (Jacobi).  The Jacobians
        ∂Φ^{(j)}/∂z (and ∂X_H/∂z) are forward differences, ε = √u · max(1, |x|_∞), u the unit
        roundoff, of one graph-free rollout of the 2n + 1 states z and z + ε e_k: a Gauss–Newton
        step needs them only to the accuracy of its linear model.  Through a kick–drift splitting
        on a separable H_θ (``verlet``, ``yoshida4``, …; see :meth:`_first_kick`) on at least
        :attr:`CHAIN_RULE_SIZE` node coordinates they come by the chain rule instead
        (:meth:`_tangent_rollout`): each kick and drift differentiates its half at its one state
        — in closed form where the half is a network's closed-form gradient (a
        :class:`~torchgeo_int.nn.SeparableHNN`'s: :meth:`~torchgeo_int.nn.MLP.input_grad_hessian`,
        exact), else by differences at n + 1 points — and the tangents ride along.  For the
        two-body study's one-step Verlet segments (n = 4, derivatives matched) that is 4
        closed-form Hessians a node, the work of about 12 gradients, instead of 28 gradients;
        either way less than the (segment + 1)·2n reverse passes that exact Jacobians through
        autograd-defined forces would need.
        The normal equations get a Levenberg–Marquardt shift of 10⁻⁶ of their mean diagonal, and
        where the step does not lower ℓ it is halved, up to 8 times (backtracking; not where
        its predicted decrease is at ℓ's rounding level; a candidate whose rollout is not finite
        does not lower it), and a node keeps its old state only where none of them does (a
        monotone iteration of each node's ℓ with its neighbours as its step sees them).  A node
        whose own rollout (or its predecessor's, into it) is not finite raises
        ``FloatingPointError``.  With one segment (single shooting) a sweep is one Gauss–Newton
        step of a separable least squares problem per trajectory: quadratic convergence on
        consistent data."""
        index = self._index(index)
        best = self._solve(index, steps)[0]
        first, second = self._halves(index)
        # ℓ was taken before a neighbour moved (the first half's before the second's, or in one
        # half before the others): take it again there
        again = None if self.continuity <= 0 else \
            first & self._has_neighbour(index, index if second is None else index[second])
        if again is not None and bool(again.any()):
            with torch.no_grad():
                stepper = self._first_kick()
                z, *_, objective = self._objective(index[again], stepper)
                best[again] = objective(self._roll_states(z, None, stepper), z)
        return best

    def _has_neighbour(self, index: Tensor, others: Tensor) -> Tensor:
        """Whether node s of each segment id in ``index`` has s − 1 or s + 1 (same trajectory)
        among the ids ``others``."""
        S = self.n_segments
        s = index % S
        return (((s > 0) & torch.isin(index - 1, others))
                | ((s < S - 1) & torch.isin(index + 1, others)))

    def _halves(self, index: Tensor):
        """The two halves of a sweep over ``index`` (see :meth:`solve_states`): masks (first,
        second), second None where every node is in the first (no two are neighbours, or too
        few for a half of their own, or with one segment a trajectory, or with no continuity
        term to couple them)."""
        S = self.n_segments
        everything = torch.ones_like(index, dtype=torch.bool)
        if S == 1 or self.continuity <= 0:
            return everything, None
        second = ((index % S) % 2 == 1) & self._has_neighbour(index, index)
        if int(second.sum()) < max(1.0, self.GAUSS_SEIDEL_FRACTION * index.numel()):
            return everything, None
        return ~second, second

    #: the odd nodes of a sweep's chains are a half-sweep of their own (Gauss–Seidel) from this
    #: fraction of its nodes, else they join the first half (Jacobi for them).  A half-sweep
    #: has a fixed cost: on the two-body study (1400 segment ids a step, each solved at one
    #: visit in 8) about half the steps' solved nodes hold 1–3 neighbours, whose half-sweep
    #: cost 2.7 ms, 2.7 % of a (g) step, for a better start of 1–3 nodes of 39 200.  A chain
    #: of the whole grid (a full batch) is half odd nodes
    GAUSS_SEIDEL_FRACTION = 1 / 8

    @torch.no_grad()
    def _solve(self, index, steps, keep_grad: bool | None = None, share: bool = True):
        """:meth:`solve_states` on checked ids (:meth:`_index`): (ℓ per node, and with
        ``keep_grad`` the loss's rollouts of the last sweep's new states, in that grad mode,
        ``[(ids, (qs, ps), X_H at the nodes or None)]`` (:meth:`_loss_roll` with ``share``), one
        a half-sweep where every node of it took its step; else [])."""
        steps = check_int(steps, "steps", 1)
        best = torch.empty(index.shape[0], dtype=self.q_nodes.dtype, device=index.device)
        colors = [c for c in self._halves(index) if c is not None]
        pieces = []
        for sweep in range(steps):
            for color in colors:
                keep = keep_grad if sweep == steps - 1 else None
                best[color], rolled = self._gauss_newton_step(index[color], keep, share)
                if rolled is not None:
                    pieces.append((index[color], *rolled))
        return best, pieces

    def _objective(self, index: Tensor, stepper=None):
        """The parts of ℓ (:meth:`solve_states`) for the nodes ``index``, their neighbours as they
        are now: (the nodes' states z (N, 2n), obs (seg+1, N, 2n), a, w′, has_prev, has_next, the previous
        segments' ends, the next nodes, the derivative terms (the observed derivatives (seg+1,
        N, 2n), :meth:`_derivative_parts`, their weight) or None, objective(F, z) -> ℓ per node
        from its rollout F)."""
        S = self.n_segments
        z = self._states(index)
        obs = torch.cat([self.q_obs[index], self.p_obs[index]], -1).transpose(0, 1)   # (seg+1, N, m)
        a = 1.0 / (self.segment + 1)
        w = self.continuity * S / (S - 1) if S > 1 else 0.0
        none = torch.zeros_like(index, dtype=torch.bool)
        has_prev = (index % S) != 0 if w > 0 else none
        has_next = (index % S) != S - 1 if w > 0 else none
        # the previous segments' ends Φ^{(segment)}(z_{s−1}) do not depend on z: one rollout
        prev_end = self._roll_states(self._states(index[has_prev] - 1), None, stepper)[-1] \
            if bool(has_prev.any()) else None
        nxt = self._states(index[has_next] + 1)
        derivs = None
        if self._matches_derivatives():
            dobs = torch.cat([self.dq_obs[index], self.dp_obs[index]], -1).transpose(0, 1)
            # the full loss's weight of a derivative residual against a data residual's a: its
            # mean runs over S·segment + 1 points a trajectory, the data's over S·(segment + 1)
            derivs = dobs, self._derivative_parts(index), S / (S * self.segment + 1) * self._derivative_weight_now()

        def objective(F, z, fields=None):      # ℓ per node from its rollout F (and X_H there)
            val = a * ((F - obs) ** 2).sum((0, 2))
            if derivs is not None:
                dobs, parts, ad = derivs
                for i, (rows, j) in enumerate(parts):
                    D = self._field(F[j]) if fields is None else fields[i]
                    val[rows] += ad * ((D - dobs[j]) ** 2).sum((0, 2))
            if prev_end is not None:
                val[has_prev] += w * ((prev_end - z[has_prev]) ** 2).sum(-1)
            if nxt.shape[0]:
                val[has_next] += w * ((F[-1][has_next] - nxt) ** 2).sum(-1)
            return val

        return z, obs, a, w, has_prev, has_next, prev_end, nxt, derivs, objective

    def _states(self, ids: Tensor) -> Tensor:
        """The node states (q, p) of the flat segment ids ``ids``, shape (len(ids), 2n) (a
        gather of those rows, not of every node)."""
        n = self.dim
        return torch.cat([self.q_nodes.view(-1, n)[ids], self.p_nodes.view(-1, n)[ids]], -1)

    def _matches_derivatives(self) -> bool:
        return self.dq_obs is not None and self.derivative_weight > 0

    def _derivative_parts(self, index: Tensor):
        """Where the derivatives of the segments ``index`` are matched, each observation once:
        ``[(nodes, j)]`` with ``x[j]`` the matched part of a ``(segment + 1, N, …)`` tensor x,
        restricted to the ``nodes`` (a slice or mask of the N): j < segment on every segment,
        j = segment on a trajectory's last one (an inner node's time is matched at the node)."""
        S = self.n_segments
        last = (index % S) == S - 1
        if bool(last.all()):                  # single shooting: every state, in one part
            return [(slice(None), (slice(None), slice(None)))]
        parts = [(slice(None), (slice(None, -1), slice(None)))]
        if bool(last.any()):
            parts.append((last, (slice(-1, None), last)))
        return parts

    def _part_fields(self, X: Tensor, parts, D0: Tensor | None = None, stepper=None,
                     forces: Tensor | None = None) -> list[Tensor]:
        """X_H at ``X[j]`` for each part ``(rows, j)`` of :meth:`_derivative_parts` (X of shape
        ``(segment + 1, N, …, 2n)``), every part's points in one evaluation: of
        :meth:`_field`, or with a splitting ``stepper`` (the Jacobian rollout's lifted one) by
        its halves (:meth:`_halves_at`), the force terms ``forces`` at X's points where known
        (the rollout's own, FSAL).  ``D0``: X_H at ``X[0]`` (the nodes) where already known (the
        first part is the one that starts at j = 0, on every node)."""
        def points(x):       # the parts' points of x, the first part's nodes left out with D0
            return [x[j][1:] if i == 0 and D0 is not None else x[j] for i, (_, j) in enumerate(parts)]

        def flat(xs):
            return torch.cat([x.flatten(0, 1) for x in xs])
        pts = points(X)
        D = flat(pts)                                                # (points, …, 2n)
        if D.shape[0] and stepper is None:
            D = self._field(D)
        elif D.shape[0]:
            D = self._halves_at(stepper, D, None if forces is None else flat(points(forces)))[1]
        fields = [d.view(x.shape) for d, x in zip(D.split([x.shape[0] * x.shape[1] for x in pts]), pts)]
        if D0 is not None:
            fields[0] = torch.cat([D0.unsqueeze(0), fields[0]])
        return fields

    def _tangent_rollout(self, stepper, z: Tensor, parts=None):
        r"""The rollout Φ^{(j)}(z), j = 0..segment, of the states z (N, 2n) with its Jacobians by
        the chain rule, through the splitting ``stepper`` (:meth:`_first_kick`) on lifted halves
        (:func:`_lifted`): shape (segment + 1, N, 1 + 2n, 2n), the state in ``[..., 0, :]`` and
        ∂Φ^{(j)}/∂z_k in ``[..., 1 + k, :]``.  Each kick and drift takes its half's Jacobian at
        its one state (closed form, :meth:`_closed_form_jacobian`, or differences at n + 1
        points) instead of rolling out 2n + 1 states.  With the derivative ``parts``
        (:meth:`_derivative_parts`) also X_H at their states, linearised alike: the force terms
        the rollout's own (the node's serves the first kick and the field at once), ∂T/∂p at
        all of them in one evaluation; else None."""
        n, m = self.dim, 2 * self.dim
        velocity, force_term = (_lifted(half, self._closed_form_jacobian(half, energy)) for half, energy in
                                ((stepper.velocity, "kinetic"), (stepper.force_term, "potential")))
        lifted = SplittingStepper(stepper.system, stepper.pairs, stepper.last, velocity, force_term)
        eye = torch.eye(m, dtype=z.dtype, device=z.device).expand(z.shape[0], m, m)
        Z = torch.cat([z.unsqueeze(1), eye], 1)                              # (N, 1 + m, m)
        X, forces = self._roll_states(Z, force_term(Z[..., :n]), lifted, forces=True)
        if parts is None:
            return X, None
        return X, self._part_fields(X, parts, stepper=lifted, forces=forces)

    def _closed_form_jacobian(self, half, energy: str):
        """The model's ``energy`` module's ``input_grad_hessian`` where ``half`` is that module's
        closed-form gradient (a :class:`~torchgeo_int.nn.SeparableHNN`'s ∂T/∂p and ∂V/∂q, the
        halves its splitting steps call) and its Hessian has a closed form too; else None (the
        lifted half takes forward differences)."""
        module = getattr(self.model, energy, None)
        if (module is None or getattr(half, "__self__", None) is not module
                or getattr(half, "__func__", None) is not getattr(type(module), "input_grad", None)
                or not getattr(module, "closed_form_hessian", False)):
            return None
        return module.input_grad_hessian

    def _field(self, X: Tensor) -> Tensor:
        """X_{H_θ} at states X = (q, p) of shape (..., 2n), as one tensor of that shape."""
        n = self.dim
        fq, fp = self.model.vector_field(X[..., :n].reshape(-1, n), X[..., n:].reshape(-1, n), 0.0)
        return torch.cat([fq, fp], -1).reshape(X.shape)

    #: step halvings a Gauss–Newton step may take where the full step does not lower ℓ
    HALVINGS = 8
    #: the chain rule (:meth:`_tangent_rollout`) from this many node coordinates (nodes × n) in
    #: a half-sweep; below, differences of whole rollouts: a lifted half makes about three times
    #: the tensor operations of a plain one, and on a few nodes their fixed cost (µs each on a
    #: CPU) outweighs the rows it saves.  On the HNN study's CPU (SeparableHNN, width 200, one
    #: thread): the 25 nodes of spring's single shooting (n = 1, 29-step segments) are solved
    #: 20–25 % faster by differences for (e), alike for (g); 88 two-body nodes (n = 4, one-step
    #: segments) 20–30 % faster by the chain rule.  The threshold sits between the two
    CHAIN_RULE_SIZE = 32

    def _gauss_newton_step(self, index: Tensor, keep_grad: bool | None = None, share: bool = True):
        """One monotone Gauss–Newton step on the nodes ``index`` (neighbours fixed), written into
        ``q_nodes`` / ``p_nodes``; ℓ per node after it (see :meth:`solve_states`), and with
        ``keep_grad`` the loss's rollout of the candidate in that grad mode when every node
        took the step, ``((qs, ps), X_H at the nodes or None)`` (:meth:`_loss_roll` with
        ``share``; None otherwise)."""
        total, n, seg = self.trajectories * self.n_segments, self.dim, self.segment
        m = 2 * n
        stepper = self._first_kick()
        z, obs, a, w, has_prev, has_next, prev_end, nxt, derivs, objective = self._objective(index, stepper)
        eye = torch.eye(m, dtype=z.dtype, device=z.device)
        N = z.shape[0]
        # X: (seg + 1, N, 1 + m, m), the rollout Φ^{(j)}(z) in [..., 0, :] and its derivatives
        # ∂Φ^{(j)}/∂z_k in [..., k + 1, :]; fields: X_H at the derivative parts' states, alike
        if stepper is not None and N * n >= self.CHAIN_RULE_SIZE:
            X, fields = self._tangent_rollout(stepper, z, None if derivs is None else derivs[1])
        else:      # forward differences of the rollout: the 2n + 1 states z and z + ε e_k
            eps = _step_size(z)
            Z = _perturbed(z, eps)                                          # (N, m + 1, m)
            force = D0 = None
            if stepper is not None and derivs is not None:
                # H = T(p) + V(q): a perturbation of q leaves ∂T/∂p as it is and one of p the
                # force, so each half is evaluated at its n + 1 distinct states of the m + 1 (the
                # field at the nodes), and the forces go to the rollout's first kicks
                force = stepper.force_term(Z[:, :n + 1, :n].reshape(-1, n)).view(N, n + 1, n)   # z, q perturbed
                vel = stepper.velocity(Z[:, [0, *range(n + 1, m + 1)], n:].reshape(-1, n)).view(N, n + 1, n)
                force = torch.cat([force, force[:, :1].expand(N, n, n)], 1)
                vel = torch.cat([vel[:, :1].expand(N, n + 1, n), vel[:, 1:]], 1)
                D0 = torch.cat([vel, self.model.force_sign * force], -1)         # X_H(Z)
                force = force.reshape(N * (m + 1), n)
            X = self._roll_states(Z.reshape(N * (m + 1), m), force, stepper).reshape(seg + 1, N, m + 1, m)
            fields = None if derivs is None else [
                _differences(D, eps[rows]) for (rows, _), D in zip(derivs[1], self._part_fields(X, derivs[1], D0))]
            X = _differences(X, eps)
        F = X[:, :, 0]                                                       # Φ^{(j)}(z)
        bad = ~torch.isfinite(F).all(-1).all(0)
        if prev_end is not None:
            bad[has_prev] |= ~torch.isfinite(prev_end).all(-1)
        if bool(bad.any()):        # (a candidate's overflow is a rejected step; the nodes' own is not)
            raise FloatingPointError(
                f"TrajectoryFit's state solve: the rollout of {int(bad.sum())} of {N} node states "
                f"(segment ids {index[bad][:5].tolist()}{' …' if int(bad.sum()) > 5 else ''}), or of "
                f"the previous node into it, is not finite: the model or the states overflow (a "
                f"learning rate too large, or states far from the data)")
        J = X[:, :, 1:].transpose(-1, -2)                                    # (seg+1, N, out, in)
        A = a * torch.einsum("jnoi,jnok->nik", J, J)
        g = a * torch.einsum("jnoi,jno->ni", J, F - obs)
        if derivs is not None:       # the derivative residuals X_H(Φ^{(j)}(z)) − ẋ_j, linearised alike
            dobs, parts, ad = derivs
            for (rows, j), D in zip(parts, fields):
                Jd = D[:, :, 1:].transpose(-1, -2)
                A[rows] += ad * torch.einsum("jnoi,jnok->nik", Jd, Jd)
                g[rows] += ad * torch.einsum("jnoi,jno->ni", Jd, D[:, :, 0] - dobs[j])
        if nxt.shape[0]:
            Jn = J[-1][has_next]
            A[has_next] += w * Jn.transpose(-1, -2) @ Jn
            g[has_next] += w * (Jn.transpose(-1, -2) @ (F[-1][has_next] - nxt).unsqueeze(-1)).squeeze(-1)
        if prev_end is not None:                            # residual Φ(z_{s−1}) − z: Jacobian −I
            A[has_prev] += w * eye
            g[has_prev] -= w * (prev_end - z[has_prev])
        shift = 1e-6 * A.diagonal(dim1=-2, dim2=-1).mean(-1)[:, None, None] * eye
        step = torch.linalg.solve(A + shift, g.unsqueeze(-1)).squeeze(-1)
        cand = z - step
        rolled = fields_c = None
        if keep_grad is not None:           # the loss's rollout of the candidate (see _solve)
            try:
                with torch.set_grad_enabled(keep_grad):
                    rolled = self._loss_roll(cand[:, :n], cand[:, n:], share)
            except FloatingPointError:      # rollout()'s check: a candidate that overflows is
                rolled = None               # a rejected step, as below (not the loss's rollout)
        if rolled is not None:
            Fc = torch.cat([x.detach() for x in rolled[0]], -1)
            if derivs is not None and rolled[1] is not None:
                fields_c = self._part_fields(Fc, derivs[1], rolled[1].detach())
        elif stepper is not None and derivs is not None:
            Fc, forces = self._roll_states(cand, stepper.force_term(cand[:, :n]), stepper, forces=True)
            fields_c = self._part_fields(Fc, derivs[1], stepper=stepper, forces=forces)
        else:
            Fc = self._roll_states(cand, None, stepper)
        before = objective(F, z, None if fields is None else [D[:, :, 0] for D in fields])
        after = objective(Fc, cand, fields_c)
        better = torch.isfinite(after) & (after < before)
        full = bool(better.all())
        # far from the solution the linear model can overshoot: halve the step where it does not
        # lower ℓ.  With A positive definite it is a descent direction of ℓ, so a short enough
        # step lowers ℓ unless z is stationary; keeping the state instead froze the nodes (and
        # with them the model's gradient) once every full step overshot.  Not where the model's
        # predicted decrease, gᵀ·step, is at ℓ's rounding level: such a node has converged
        tol = 100 * torch.finfo(z.dtype).eps
        far = None if full else ~better & ((g * step).sum(-1) > tol * before)
        if far is not None and bool(far.any()):      # (no second host sync when every node took it)
            rej = far.nonzero().squeeze(1)
            objective_r = self._objective(index[rej], stepper)[-1]        # the same terms, those nodes
            zr, dr, br = z[rej], step[rej], before[rej]
            ok = torch.zeros_like(br, dtype=torch.bool)
            t = 1.0
            for _ in range(self.HALVINGS):
                t /= 2
                c = zr - t * dr
                val = objective_r(self._roll_states(c, None, stepper), c)
                new = ~ok & torch.isfinite(val) & (val < br)
                cand[rej[new]], after[rej[new]] = c[new], val[new]
                ok |= new
                if bool(ok.all()):
                    break
            better[rej] = ok
        z = torch.where(better[:, None], cand, z)
        self.q_nodes.view(total, n)[index] = z[:, :n]
        self.p_nodes.view(total, n)[index] = z[:, n:]
        return torch.where(better, after, before), (rolled if full else None)

    @torch.no_grad()
    def continuity_defects(self) -> Tensor:
        """|Φ^{(segment)}(z_{b,s}) − z_{b,s+1}| for every inner node, shape ``(B, S − 1)``."""
        B, S, n = self.trajectories, self.n_segments, self.dim
        qs, ps = self._roll(self.q_nodes.reshape(-1, n), self.p_nodes.reshape(-1, n))
        end = torch.cat([qs[-1], ps[-1]], -1).reshape(B, S, 2 * n)[:, :-1]
        nodes = torch.cat([self.q_nodes, self.p_nodes], -1)[:, 1:]
        return (end - nodes).norm(dim=-1)

    def optimizer(self, *, lr: float = 1e-3, state_lr: float | None = None,
                  weight_decay: float = 0.0, name: str = "adam",
                  lazy_states: bool | None = None) -> torch.optim.Optimizer:
        """An optimizer with two parameter groups: the model's parameters (``lr``,
        ``weight_decay``) and the node states (``state_lr``, default ``lr``; no weight decay,
        which would pull the states towards 0).

        ``lazy_states`` (default: True for ``name="adam"``): the node states take Adam steps
        only in the rows (node states) that the batch reaches — :class:`~torchgeo_int.nn.LazyAdam`
        with ``rows=True`` for the states and Adam's own update for the model.  Under
        minibatching ``torch.optim.Adam`` keeps moving the node states of segments outside the
        batch along their stale first moment (≈ 10× the visited step in total at β₁ = 0.9) and
        decays their moments as if they had been seen; on a full batch the two are the same
        update.  ``lazy_states=False`` gives ``torch.optim.Adam``; it needs ``name="adam"``
        to be True."""
        opts = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
        if name not in opts:
            raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(opts)}")
        if lazy_states is None:
            lazy_states = name == "adam"
        if not isinstance(lazy_states, bool):
            raise TypeError(f"lazy_states must be a bool or None, got {lazy_states!r}")
        if lazy_states and name != "adam":
            raise ValueError(f"lazy_states=True is an Adam update (LazyAdam); it needs name='adam', "
                             f"got {name!r}")
        model_params = [p for p in self.model.parameters() if p.requires_grad]
        if not model_params:
            raise ValueError("the model has no trainable parameters")
        lr = _positive(lr, "lr")
        weight_decay = _positive(weight_decay, "weight_decay", allow_zero=True)
        if self.gauss_newton:                  # solved states: the optimizer sees the model only
            if state_lr is not None:
                raise ValueError(f"state_lr has no effect: the node states are solved by Gauss–Newton "
                                 f"(gauss_newton={self.gauss_newton}), not learned")
            return opts[name]([{"params": model_params, "lr": lr, "weight_decay": weight_decay}], lr=lr)
        state_lr = lr if state_lr is None else _positive(state_lr, "state_lr")
        groups = [{"params": model_params, "lr": lr, "weight_decay": weight_decay},
                  {"params": [self.q_nodes, self.p_nodes], "lr": state_lr, "weight_decay": 0.0}]
        if lazy_states:
            groups[1]["rows"] = True
            return LazyAdam(groups, lr=lr)
        return opts[name](groups, lr=lr)


__all__ = ["TrajectoryFit"]
