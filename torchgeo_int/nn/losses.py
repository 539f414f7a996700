r"""Losses that fit a learned Hamiltonian H_θ to observed trajectories.

Data convention: observed states at uniform spacing ``dt`` are tensors ``q, p`` of shape
``(N, L, n)`` — N trajectories (or windows), L states each, n coordinates; sample dims lead,
time is dim 1 (:func:`make_windows` cuts long trajectories into such windows).  This is the
transpose of what :func:`torchgeo_int.rollout` returns, ``(T, B, n)`` with time first: every
function here that takes trajectories has ``layout=`` (``"windows"``, ``"time_first"``, or
``None``: sample-first, checked by :func:`check_layout`, which refuses data that look
time-first instead of training on the wrong axis).

* :func:`rollout_loss`     multi-step rollout loss (SRNN-style, Chen et al. ICLR 2020): from
  the first state of each window, k steps of any integrator against the k observed states.
* :func:`residual_loss`    the discretization-map residual of eq. (20) of the seed paper for
  observed pairs (x_k, x_{k+1}): with (base, tangent) = (R_d^{T*})⁻¹(x_k, x_{k+1}),
  r = tangent − h X_{H_θ}(base).  Zero exactly when x_{k+1} is the cotangent-lift step of H_θ from
  x_k, so it trains the map the integrator will apply, with no implicit solve at training time.
  For the midpoint map it is the midpoint loss of SympNets-style training (David & Méhats 2021).
* :func:`derivative_loss`  derivative matching (Greydanus et al. 2019): |X_{H_θ}(x) − ẋ|² at
  observed points, with ẋ the true field or :func:`finite_differences` of the data.
"""
from __future__ import annotations

import torch

from .._validate import (cannot_tell, check_finite, check_nonzero, check_placement, shifted_rows,
                         time_axis)
from ..lifts import CotangentLift
from ..maps import DiscretizationMap, MidpointMap
from ..rollout import as_system, rollout

Tensor = torch.Tensor


def check_data(*tensors: Tensor, names: tuple[str, ...], ndim: int | None = None,
               min_len: int | None = None) -> None:
    """Observed data: floating-point tensors of one shape, dtype and device, all finite.
    ``ndim`` fixes the number of dims; ``min_len`` is the least length of dim 1 (time)."""
    first = None
    for x, name in zip(tensors, names):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
        if ndim is not None and x.dim() != ndim:
            layout = "(N, L, n): N samples, L states in time, n coordinates" if ndim == 3 else f"{ndim} dims"
            raise ValueError(f"{name} must have shape {layout}, got shape {tuple(x.shape)}")
        if x.requires_grad:
            raise ValueError(f"{name} requires grad (it carries the graph of whatever produced it, "
                             f"a teacher model's rollout?): training would backpropagate into it "
                             f"and fail at the second step; pass {name}.detach()")
        if x.numel() == 0:
            raise ValueError(f"{name} holds no data (shape {tuple(x.shape)}): a loss or a metric "
                             "over none is NaN")
        if min_len is not None and x.shape[1] < min_len:
            raise ValueError(f"{name} needs at least {min_len} states along dim 1 (time), "
                             f"got shape {tuple(x.shape)}")
        if first is None:
            first = (x, name)
        else:
            a, an = first
            if x.shape != a.shape:
                raise ValueError(f"{an} and {name} must have the same shape, got "
                                 f"{tuple(a.shape)} and {tuple(x.shape)}")
            if x.dtype != a.dtype or x.device != a.device:
                raise ValueError(f"{an} and {name} must share dtype and device, got "
                                 f"{a.dtype}/{a.device} and {x.dtype}/{x.device}")
        check_finite(x, name)


LAYOUTS = ("windows", "time_first")


#: rows below which a loss's batch is not judged for its layout: the mean |Δ| between two or
#: three windows drawn at random is too noisy (random batches of coarse windows looked
#: time-first in up to 2.5 % of draws of 2 rows and 0.25 % of 3, in none of 4-8: 400 draws of
#: each of 18 pendulum configurations, dt 0.1-1, 4 or 32 trajectories, windows of 1-5 steps)
MIN_ROWS = 4


def check_layout(q, p, layout, who: str, *, whole: bool = False):
    """``(q, p)`` in the sample-first layout ``(N, L, n)`` the losses take.

    ``layout="windows"``: they are already (N samples, L states in time, n); ``"time_first"``:
    they are ``(T, B, n)`` as :func:`torchgeo_int.rollout` returns them, and are transposed to
    (B, T, n).  ``None`` (the default): taken as windows, after one check (one host sync) that
    they do not look time-first — states that change much less between neighbours along dim 0
    (mean |Δ| < ¼ of that along dim 1) are the rows of a trajectory, and the call is refused
    naming both layouts: a rollout's output fed to a loss would otherwise train on the wrong
    axis and converge to garbage.  ``whole``: the data as given to a fit (make_windows,
    TrajectoryFit, finite_differences, the metrics), where also data in which neither axis
    changes 4× less than the other and dim 0 no more than dim 1 (a rolled-out grid of initial
    states, coarse sampling, an ensemble of nearby initial values) are refused, asking which,
    unless the rows are windows cut in order from trajectories
    (:func:`~torchgeo_int._validate.shifted_rows`: what :func:`make_windows` returns); so a
    time-first grid that is dense against its time step still passes.  Else (a loss, called on
    every batch of a fit) only data that look time-first are refused, and only batches of at
    least :data:`MIN_ROWS` rows are judged: a random batch of windows is often ambiguous, and a
    check that depends on the rows drawn would stop a fit part-way.  Sample-first data whose
    samples are closer to each other than consecutive states pass ``layout="windows"``."""
    if layout not in (None, *LAYOUTS):
        raise ValueError(f"layout must be one of {LAYOUTS} or None, got {layout!r}")
    if not all(isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() == 3
               for x in (q, p)):
        return q, p            # check_data reports what is wrong with them
    if layout == "time_first":
        return q.transpose(0, 1), p.transpose(0, 1)
    rows = 2 if whole else MIN_ROWS
    if layout is None and q.shape[0] >= rows and q.shape[1] >= 2 and q.shape == p.shape:
        axis, d0, d1 = time_axis(q, p)
        if axis == 0:
            N, L, n = q.shape
            raise ValueError(
                f"{who} takes q, p sample-first, (N, L, n): N windows or trajectories, L states "
                f"along dim 1 (what tgi.nn.make_windows returns). These, of shape {(N, L, n)}, "
                f"look time-first, (T, B, n) as tgi.rollout returns them: neighbours along dim 0 "
                f"differ by {d0:.2e} on average, along dim 1 by {d1:.2e}. Pass "
                "layout='time_first' to use them as B trajectories of T states, transpose them "
                "(q.transpose(0, 1)), or pass layout='windows' if they are sample-first.")
        if whole and axis is None and d0 <= d1 and not shifted_rows(q, p):
            raise cannot_tell(who, q.shape, d0, d1,
                              "layout='windows' if they are sample-first, (N, L, n): N windows or "
                              "trajectories of L states along dim 1 (what tgi.nn.make_windows "
                              "returns), or layout='time_first' if they are (T, B, n) as "
                              "tgi.rollout returns them.")
    return q, p


def _tangent_cosine(x: Tensor, d: Tensor, dim: int) -> float:
    """cos of the angle between the steps of states x along ``dim`` and the mean of the
    derivatives d at the steps' two ends, over every step (x, d of one shape): near 1 where d
    holds x's time derivatives, near 0 where it holds other points'."""
    n = x.shape[dim]
    dx = x.narrow(dim, 1, n - 1) - x.narrow(dim, 0, n - 1)
    dm = d.narrow(dim, 1, n - 1) + d.narrow(dim, 0, n - 1)
    return float((dx * dm).sum() / (dx.norm() * dm.norm()).clamp_min(torch.finfo(x.dtype).tiny))


def check_derivative_layout(q: Tensor, p: Tensor, dq: Tensor, dp: Tensor, who: str,
                            time_dim: int | None = None) -> None:
    """Derivatives of square (T == B) trajectories laid out with time on the other axis than the
    states' are refused: their shapes agree, so they would be paired with other states without
    an error.  The test: the states' steps along time are tangent to the derivatives that
    belong to them (:func:`_tangent_cosine`), so a transpose that is clearly more tangent
    (cos > 0.3, 3× the given pairing's and 4× the 1/√terms of random points) means the given
    one is wrong.  ``time_dim``: the states' time axis where known (else the better of dims 0
    and 1).  Three or more states; one host sync per cosine."""
    if not (q.dim() == 3 and q.shape[0] == q.shape[1] >= 3 and dq.shape == q.shape
            and dp.shape == p.shape):
        return
    with torch.no_grad():
        x, d = torch.cat([q, p], -1), torch.cat([dq, dp], -1)
        dims = (0, 1) if time_dim is None else (time_dim,)
        given = max(_tangent_cosine(x, d, k) for k in dims)
        swapped = max(_tangent_cosine(x, d.transpose(0, 1), k) for k in dims)
    # random points (no trajectory) give cosines of about 1/√(terms) either way: 4 of those
    terms = (q.shape[0] - 1) * q.shape[1] * x.shape[-1]
    if swapped > max(0.3, 3 * given, 4 / terms ** 0.5):
        raise ValueError(f"{who}: the derivatives dq, dp look transposed against the states q, p "
                         f"(time on the other axis; with T == B = {q.shape[0]} their shapes agree): "
                         f"the states' steps are tangent to the transposed derivatives (cos "
                         f"{swapped:.2f}) and not to the given ones (cos {given:.2f}). Give both "
                         "in one layout: transpose(0, 1) the derivatives")


def _autonomous(model, data="windows without their start times") -> None:
    if getattr(model, "time_dependent", False):
        raise NotImplementedError(f"the trajectory and derivative losses take {data}, so they "
                                  f"need an autonomous H(q, p)")


def make_windows(q: Tensor, p: Tensor, k: int, *, stride: int = 1, layout: str | None = None
                 ) -> tuple[Tensor, Tensor]:
    """All windows of k+1 consecutive states of trajectories ``q, p`` of shape ``(B, T, n)``:
    returns ``(q_w, p_w)`` of shape ``(B * W, k + 1, n)`` with W = (T − k − 1)//stride + 1,
    trajectory-major (window j of trajectory b is row b·W + j).  ``layout="time_first"`` takes
    ``(T, B, n)``, what :func:`torchgeo_int.rollout` returns (see :func:`check_layout`)."""
    q, p = check_layout(q, p, layout, "make_windows", whole=True)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ValueError(f"stride must be an int >= 1, got {stride!r}")
    check_data(q, p, names=("q", "p"), ndim=3, min_len=k + 1)

    def cut(x):
        w = x.unfold(1, k + 1, stride)             # (B, W, n, k+1)
        return w.permute(0, 1, 3, 2).reshape(-1, k + 1, x.shape[-1])

    return cut(q), cut(p)


def rollout_loss(model, q: Tensor, p: Tensor, *, dt: float, method="verlet", substeps: int = 1,
                 layout: str | None = None, **rollout_options) -> Tensor:
    r"""Mean squared error of a k-step rollout from the first state of each window:

        (1 / (2 k n N)) Σ_windows Σ_{j=1..k} |Φ_h^{substeps}{}^{∘ j}(x₀) − x_j|²,   h = dt / substeps,

    over windows ``q, p`` of shape ``(N, k + 1, n)`` (k ≥ 1; ``layout``: :func:`check_layout`,
    ``"time_first"`` takes a rollout's ``(k + 1, N, n)``).  ``method`` is any integrator;
    gradients go through every step (implicit ones by the solver's implicit backward).
    ``rollout_options`` go to :func:`torchgeo_int.rollout`: ``grad="checkpoint"`` or
    ``"reversible"`` (:mod:`torchgeo_int.gradients`) keeps long windows' memory small.
    """
    q, p = check_layout(q, p, layout, "rollout_loss")
    system = as_system(model)
    _autonomous(system)
    dt = check_nonzero(dt, "dt")
    if isinstance(substeps, bool) or not isinstance(substeps, int) or substeps < 1:
        raise ValueError(f"substeps must be an int >= 1, got {substeps!r}")
    check_data(q, p, names=("q", "p"), ndim=3, min_len=2)
    check_placement(system, q, "q")
    k = q.shape[1] - 1
    qs, ps = rollout(system, q[:, 0], p[:, 0], h=dt / substeps, steps=k * substeps,
                     method=method, save_every=substeps, **rollout_options)
    # rollout puts time first: (k+1, N, n) → compare with the data's (N, k+1, n)
    eq = qs[1:] - q[:, 1:].transpose(0, 1)
    ep = ps[1:] - p[:, 1:].transpose(0, 1)
    return 0.5 * ((eq * eq).mean() + (ep * ep).mean())



def map_pairs(q: Tensor, p: Tensor, dt, R: DiscretizationMap | None):
    """Windows (N, L, n) of observed states validated and mapped pair by pair through
    (R_d^{T*})⁻¹ (eq. (7); R the midpoint map when None): (dt, R, n, base, tangent), the
    shared start of the residual losses (no implicit solve)."""
    dt = check_nonzero(dt, "dt")
    R = MidpointMap() if R is None else R
    if not isinstance(R, DiscretizationMap):
        raise TypeError(f"R must be a DiscretizationMap, got {type(R).__name__}")
    check_data(q, p, names=("q", "p"), ndim=3, min_len=2)
    x = torch.cat([q, p], -1)
    base, tangent = CotangentLift(R).inverse(x[:, :-1], x[:, 1:])
    return dt, R, q.shape[-1], base, tangent

def residual_loss(model, q: Tensor, p: Tensor, *, dt: float, R: DiscretizationMap | None = None,
                  per_time: bool = True, layout: str | None = None) -> Tensor:
    r"""The eq. (20) residual of every observed pair (x_j, x_{j+1}) of windows ``(N, L, n)``:

        (base, tangent) = (R_d^{T*})⁻¹(x_j, x_{j+1}),        r_j = tangent − h X_{H_θ}(base),

    loss = mean |r_j|² over pairs and coordinates, divided by h² when ``per_time`` (the same
    minimiser; the loss is then in the units of derivative matching, |tangent/h − X_H(base)|²).
    ``R`` is any discretization map on Q (default the midpoint map: base = the midpoints, tangent =
    the differences, i.e. the implicit-midpoint residual); it is used through its cotangent lift,
    so the data's pairs are mapped by eq. (7) and X_H is evaluated once per pair: no implicit
    solve at training time.  A zero loss means the data are exact steps of the integrator
    ``CotangentLiftIntegrator(R)`` for H_θ.  ``layout``: :func:`check_layout`.
    """
    q, p = check_layout(q, p, layout, "residual_loss")
    system = as_system(model)
    _autonomous(system)
    dt, R, n, base, tangent = map_pairs(q, p, dt, R)
    check_placement(system, q, "q")
    # the base point's time is t + αh; the model is autonomous, so any t will do
    dq, dp = system.vector_field(base[..., :n], base[..., n:], 0.0)
    r = tangent - dt * torch.cat([dq, dp], -1)
    loss = (r * r).mean()
    return loss / (dt * dt) if per_time else loss


def derivative_loss(model, q: Tensor, p: Tensor, dq: Tensor, dp: Tensor) -> Tensor:
    r"""Derivative matching (Greydanus et al. 2019): ½ (mean (X^q_{H_θ} − dq)² + mean (X^p_{H_θ} −
    dp)²), the means over every coordinate of points ``(..., n)`` (any leading dims), i.e.
    (1 / 2nP) Σ |X_{H_θ}(q, p) − (dq, dp)|² over the P points — the HNN paper's L2 loss on the
    time derivatives, in :func:`rollout_loss`'s units."""
    system = as_system(model)
    _autonomous(system, "points without their times (the field would be read at t = 0)")
    check_data(q, p, dq, dp, names=("q", "p", "dq", "dp"))
    check_derivative_layout(q, p, dq, dp, "derivative_loss")
    check_placement(system, q, "q")
    fq, fp = system.vector_field(q, p, 0.0)
    eq, ep = fq - dq, fp - dp
    return 0.5 * ((eq * eq).mean() + (ep * ep).mean())


def finite_differences(q: Tensor, p: Tensor, dt: float, *, layout: str | None = None
                       ) -> tuple[Tensor, Tensor]:
    """Time derivatives of trajectories ``(B, T, n)`` by second-order finite differences
    (central inside, one-sided second order at both ends; T ≥ 3): the derivative targets of
    :func:`derivative_loss` when only states are observed.  ``layout``: :func:`check_layout`
    (the result has the layout of the input)."""
    q, p = check_layout(q, p, layout, "finite_differences", whole=True)
    dt = check_nonzero(dt, "dt")
    check_data(q, p, names=("q", "p"), ndim=3, min_len=3)
    dq = torch.gradient(q, spacing=dt, dim=1, edge_order=2)[0]
    dp = torch.gradient(p, spacing=dt, dim=1, edge_order=2)[0]
    if layout == "time_first":
        return dq.transpose(0, 1), dp.transpose(0, 1)
    return dq, dp


__all__ = ["rollout_loss", "residual_loss", "derivative_loss", "finite_differences",
           "make_windows", "check_data", "check_layout", "check_derivative_layout"]
