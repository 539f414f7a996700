r"""Evaluation of learned dynamics on held-out initial conditions.

Trajectories are ``(B, T, n)`` (samples first, time on dim 1), as in :mod:`.losses`.
``H`` arguments are the *true* energy: a callable ``H(q, p) -> (...,)`` or a System with
``energy``.

* :func:`predict`            roll a model out from (q₀, p₀) without a graph, samples first
* :func:`state_mse`          mean |x̂_t − x_t|² over samples, times and coordinates
* :func:`rollout_mse`        state_mse of a model's rollout from the true initial states
* :func:`energy_mse`         mean (H(x̂_t) − H(x_t))²: the HNN paper's "energy MSE"
* :func:`energy_drift`       max_t |H(x̂_t) − H(x̂₀)| / |H(x̂₀)| per trajectory
* :func:`hamiltonian_error`  ε_H: the error of a learned H_θ up to the additive constant that no
  trajectory can reveal (David & Méhats 2021 measure H_θ against H up to a constant)
"""
from __future__ import annotations

import torch

from .._validate import check_nonzero, time_axis
from ..rollout import as_system, rollout
from ..systems import check_energy
from .losses import check_data, check_layout

Tensor = torch.Tensor
_REDUCTIONS = ("mean", "max", "none")


def _energy_fn(H):
    energy = getattr(H, "energy", None)
    if energy is not None:
        return energy
    if callable(H):
        # one value per sample, as a System's energy checks it: per-coordinate values were
        # reduced by the metric's mean into a number of another quantity (or broadcast)
        return lambda q, p: check_energy(H(q, p), p, "H", H)
    raise TypeError(f"H must be a callable H(q, p) or a System with energy(), got {type(H).__name__}")


def _reduce(x: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return x.mean()
    if reduction == "max":
        return x.max()
    if reduction == "none":
        return x
    raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def predict(model, q0: Tensor, p0: Tensor, *, h: float, steps: int, method="verlet",
            save_every: int = 1) -> tuple[Tensor, Tensor]:
    """``rollout`` under ``torch.no_grad()``, returned samples first: ``(B, ⌈steps/save_every⌉ + 1, n)``
    for ``q0, p0`` of shape ``(B, n)``."""
    if not (isinstance(q0, Tensor) and q0.dim() == 2):
        raise ValueError(f"predict takes a batch of initial states q0, p0 of shape (B, n), got "
                         f"{tuple(q0.shape) if isinstance(q0, Tensor) else type(q0).__name__}; "
                         "for one state pass q0[None], p0[None]")
    with torch.no_grad():
        q, p = rollout(as_system(model), q0, p0, h=h, steps=steps, method=method,
                       save_every=save_every)
    return q.transpose(0, 1), p.transpose(0, 1)


def _same_layout(q_pred, p_pred, q_true, p_true, who: str) -> None:
    """Predicted and true trajectories of one square shape (T == B) that put time on different
    axes — a rollout's (T, B, n) against data's (B, T, n) — are refused: their shapes agree, so
    the metric would pair different states without an error (one host sync, square shapes only;
    other shapes differ and are refused by the shape check)."""
    if q_pred.dim() == 3 and q_pred.shape[0] == q_pred.shape[1] >= 2:
        a, b = time_axis(q_pred, p_pred)[0], time_axis(q_true, p_true)[0]
        if a is None or b is None:
            # neither axis looks like time on one side: where the prediction starts from the
            # truth's initial states (a rollout from them), those states say the layouts
            a, b = _start_layouts(q_pred, p_pred, q_true, p_true)
        if a is not None and b is not None and a != b:
            side = ("the prediction", "the truth") if a == 0 else ("the truth", "the prediction")
            raise ValueError(f"{who}: {side[0]} looks time-first, (T, B, n) as tgi.rollout returns it, "
                             f"and {side[1]} sample-first, (B, T, n); with T == B = {q_pred.shape[0]} "
                             "their shapes agree and the metric would pair different states: "
                             "transpose(0, 1) one of them (tgi.nn.predict returns sample-first)")


def _start_layouts(q_pred, p_pred, q_true, p_true):
    """(time axis of the prediction, of the truth) where the prediction's initial states equal
    the truth's (to √eps of their size) in one pairing of the time axes and not in the other
    (``x[0]`` time-first, ``x[:, 0]`` sample-first); (None, None) where that does not decide."""
    with torch.no_grad():
        x, y = torch.cat([q_pred, p_pred], -1), torch.cat([q_true, p_true], -1)
        tol = torch.finfo(x.dtype).eps ** 0.5 * max(1.0, float(y.abs().max()))

        def same(u, v):
            return bool(((u - v).abs() <= tol).all())
        alike = same(x[:, 0], y[:, 0]) or same(x[0], y[0])
        if alike:
            return None, None
        if same(x[0], y[:, 0]):
            return 0, 1
        if same(x[:, 0], y[0]):
            return 1, 0
    return None, None


def state_mse(q_pred: Tensor, p_pred: Tensor, q_true: Tensor, p_true: Tensor) -> Tensor:
    """Mean squared error over every sample, time and coordinate of (q, p).  Predicted and true
    trajectories must share their layout (a square T == B pair whose time axes differ is refused)."""
    check_data(q_pred, p_pred, q_true, p_true, names=("q_pred", "p_pred", "q_true", "p_true"))
    _same_layout(q_pred, p_pred, q_true, p_true, "state_mse")
    return 0.5 * (((q_pred - q_true) ** 2).mean() + ((p_pred - p_true) ** 2).mean())


def rollout_mse(model, q_true: Tensor, p_true: Tensor, *, dt: float, method="verlet",
                substeps: int = 1, layout: str | None = None) -> Tensor:
    """:func:`state_mse` of the model's rollout from the first state of each true trajectory
    ``(B, T, n)`` (spacing ``dt``, ``substeps`` integrator steps per interval) over the T − 1
    intervals: the rollout MSE over the horizon (T − 1)·dt.  ``layout``:
    :func:`~torchgeo_int.nn.losses.check_layout` (``"time_first"`` for a rollout's (T, B, n))."""
    q_true, p_true = check_layout(q_true, p_true, layout, "rollout_mse", whole=True)
    check_data(q_true, p_true, names=("q_true", "p_true"), ndim=3, min_len=2)
    if isinstance(substeps, bool) or not isinstance(substeps, int) or substeps < 1:
        raise ValueError(f"substeps must be an int >= 1, got {substeps!r}")
    dt = check_nonzero(dt, "dt")     # (predict would name its h = dt / substeps)
    steps = (q_true.shape[1] - 1) * substeps
    q, p = predict(model, q_true[:, 0], p_true[:, 0], h=dt / substeps, steps=steps, method=method,
                   save_every=substeps)
    return state_mse(q, p, q_true, p_true)


def energy_mse(H, q_pred: Tensor, p_pred: Tensor, q_true: Tensor, p_true: Tensor) -> Tensor:
    """mean_t (H(x̂_t) − H(x_t))² with the true H on both trajectories (Greydanus et al.);
    their layouts as :func:`state_mse`'s."""
    check_data(q_pred, p_pred, q_true, p_true, names=("q_pred", "p_pred", "q_true", "p_true"))
    _same_layout(q_pred, p_pred, q_true, p_true, "energy_mse")
    E = _energy_fn(H)
    with torch.no_grad():
        return ((E(q_pred, p_pred) - E(q_true, p_true)) ** 2).mean()


def energy_drift(H, q: Tensor, p: Tensor, *, reduction: str = "mean", layout: str | None = None) -> Tensor:
    """max over t of |H(x_t) − H(x₀)| / |H(x₀)| for each trajectory ``(B, T, n)``, reduced over
    the trajectories (``"mean"``, ``"max"`` or ``"none"``).  H(x₀) must be nonzero.  ``layout``:
    as the losses' (:func:`~torchgeo_int.nn.losses.check_layout`; a rollout's (T, B, n) output is
    refused unless ``layout="time_first"``)."""
    q, p = check_layout(q, p, layout, "energy_drift", whole=True)
    check_data(q, p, names=("q", "p"), ndim=3)
    E = _energy_fn(H)
    with torch.no_grad():
        e = E(q, p)
        e0 = e[:, :1]
        if bool((e0 == 0).any()):
            raise ValueError("energy_drift is relative to H(x0), which is zero for some trajectory; "
                             "shift H by a constant")
        return _reduce(((e - e0).abs() / e0.abs()).amax(1), reduction)


def hamiltonian_error(H_model, H_true, q: Tensor, p: Tensor, *, relative: bool = False) -> Tensor:
    r"""ε_H = ( mean_i |H_θ(x_i) − H(x_i) − c|² )^{1/2} over the points x_i = (q, p) (any shape
    ``(..., n)``), with c = mean_i (H_θ(x_i) − H(x_i)), the constant that best aligns them:
    a Hamiltonian is determined by its dynamics only up to an additive constant.
    ``relative=True`` divides by the spread of the true H, (mean_i |H(x_i) − mean H|²)^{1/2}.
    """
    check_data(q, p, names=("q", "p"))
    Em, Et = _energy_fn(H_model), _energy_fn(H_true)
    with torch.no_grad():
        d = Em(q, p) - Et(q, p)
        err = ((d - d.mean()) ** 2).mean().sqrt()
        if relative:
            e = Et(q, p)
            err = err / ((e - e.mean()) ** 2).mean().sqrt()
    return err


__all__ = ["predict", "state_mse", "rollout_mse", "energy_mse", "energy_drift", "hamiltonian_error"]
