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

The loss is taken per *segment*, so :func:`~torchgeo_int.nn.fit` can batch segments:
``fit(tf, TrajectoryFit.loss, tf.segments, ...)``; a segment's continuity term reaches the next
node's state whether or not that segment is in the batch.  Weight decay must not pull the
states to zero: :meth:`TrajectoryFit.optimizer` gives the model and the states separate groups
(weight decay on the model only, and a learning rate of their own for the states), and under
minibatching moves only the states that the batch reaches (:class:`~torchgeo_int.nn.LazyAdam`).
"""
from __future__ import annotations


import torch
from torch import nn

from .._validate import check_finite, check_real
from ..rollout import as_system, rollout
from .losses import check_data
from .optim import LazyAdam

Tensor = torch.Tensor


def _int(value, name, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _positive(value, name, *, allow_zero=False):
    return check_real(value, name, 0.0, lo_open=not allow_zero)


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

    Attributes: ``model``, ``q_nodes`` / ``p_nodes`` (``nn.Parameter`` of shape ``(B, S, n)``),
    ``segments`` (the tuple ``(arange(B·S),)``, the data to hand to ``fit``).
    """

    def __init__(self, model, q: Tensor, p: Tensor, *, dt: float, segment: int | None = None,
                 method="verlet", substeps: int = 1, continuity: float = 1.0,
                 q0: Tensor | None = None, p0: Tensor | None = None, **rollout_options):
        super().__init__()
        system = as_system(model)
        if getattr(system, "time_dependent", False):
            raise NotImplementedError("TrajectoryFit rolls segments out from t = 0: it needs an "
                                      "autonomous H(q, p)")
        check_data(q, p, names=("q", "p"), ndim=3, min_len=2)
        self.model = system
        self.dt = _positive(dt, "dt")
        self.substeps = _int(substeps, "substeps", 1)
        self.continuity = _positive(continuity, "continuity", allow_zero=True)
        self.method = method
        self.rollout_options = rollout_options
        B, T, n = q.shape
        intervals = T - 1
        seg = intervals if segment is None else _int(segment, "segment", 1)
        if intervals % seg:
            raise ValueError(f"the shooting grid does not divide the data: {T} states make {intervals} "
                             f"intervals, not a multiple of segment = {seg} (choose a divisor of "
                             f"{intervals}, or trim the trajectories)")
        S = intervals // seg
        self.trajectories, self.n_segments, self.segment, self.dim = B, S, seg, n

        def cut(x):                                       # (B, T, n) → (B·S, seg + 1, n)
            return x.unfold(1, seg + 1, seg).permute(0, 1, 3, 2).reshape(B * S, seg + 1, n)

        self.register_buffer("q_obs", cut(q), persistent=False)
        self.register_buffer("p_obs", cut(p), persistent=False)
        given = (q0 is not None, p0 is not None)
        if any(given) and not all(given):
            raise ValueError("give both q0 and p0 (initial node states), or neither")
        if all(given):
            q0, p0 = (self._check_states(x, name, q) for x, name in ((q0, "q0"), (p0, "p0")))
        else:
            q0, p0 = q[:, :intervals:seg], p[:, :intervals:seg]          # observations at the nodes
        self.q_nodes = nn.Parameter(q0.detach().clone())
        self.p_nodes = nn.Parameter(p0.detach().clone())

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
        return fit_module(index)

    def initial_states(self) -> tuple[Tensor, Tensor]:
        """The estimated states at t = 0 of the observed trajectories, ``(B, n)`` each (detached)."""
        return self.q_nodes[:, 0].detach(), self.p_nodes[:, 0].detach()

    def forward(self, index: Tensor | None = None) -> Tensor:
        """The loss over the segments ``index`` (integer tensor of flat ids b·S + s; all if None)."""
        total = self.trajectories * self.n_segments
        if index is None:
            index = torch.arange(total, device=self.q_nodes.device)
        if not isinstance(index, Tensor) or index.is_floating_point() or index.is_complex() \
                or index.dtype == torch.bool or index.dim() != 1 or index.numel() == 0:
            raise ValueError("index must be a non-empty 1-d integer tensor of segment ids")
        if bool(((index < 0) | (index >= total)).any()):
            raise ValueError(f"segment ids must lie in [0, {total}) ({self.trajectories} trajectories "
                             f"× {self.n_segments} segments), got {index.min().item()}..{index.max().item()}")
        n, seg, S = self.dim, self.segment, self.n_segments
        qn, pn = self.q_nodes.reshape(total, n), self.p_nodes.reshape(total, n)
        qs, ps = rollout(self.model, qn[index], pn[index], h=self.dt / self.substeps,
                         steps=seg * self.substeps, method=self.method, save_every=self.substeps,
                         **self.rollout_options)               # (seg + 1, N, n); qs[0] is the node
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
        return loss

    @torch.no_grad()
    def continuity_defects(self) -> Tensor:
        """|Φ^{(segment)}(z_{b,s}) − z_{b,s+1}| for every inner node, shape ``(B, S − 1)``."""
        B, S, n = self.trajectories, self.n_segments, self.dim
        qs, ps = rollout(self.model, self.q_nodes.reshape(-1, n), self.p_nodes.reshape(-1, n),
                         h=self.dt / self.substeps, steps=self.segment * self.substeps,
                         method=self.method, save_every=self.segment * self.substeps)
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
        state_lr = lr if state_lr is None else _positive(state_lr, "state_lr")
        weight_decay = _positive(weight_decay, "weight_decay", allow_zero=True)
        groups = [{"params": model_params, "lr": lr, "weight_decay": weight_decay},
                  {"params": [self.q_nodes, self.p_nodes], "lr": state_lr, "weight_decay": 0.0}]
        if lazy_states:
            groups[1]["rows"] = True
            return LazyAdam(groups, lr=lr)
        return opts[name](groups, lr=lr)


__all__ = ["TrajectoryFit"]
