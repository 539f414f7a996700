"""odeint's input checks and option parsing: times, states, step size, tolerances, grad options."""
from __future__ import annotations

import math
import numbers

import torch

from ..gradients import GRAD_MODES, check_reconstruction_tol
from .._validate import check_int as check_value
from ..lagrangian import Lagrangian
from ..solvers import default_tol
from ..systems import Hamiltonian

GRAD_OPTIONS = ("grad", "segment", "reconstruction_tol", "params")
COMMON = ("step_size", "batch_dims", "solver", "max_iter", "compile", "perturb", "interp",
          "progress") + GRAD_OPTIONS
PARTITIONED_ONLY = ("split", "separable", "hamiltonian")
ADAPTIVE = ("adaptive", "control", "h_min", "max_steps", "form")   # torchgeo_int.adaptive
OPTIONS: tuple[str, ...] = COMMON + PARTITIONED_ONLY + ADAPTIVE


def check_times(t) -> list[float]:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"t must be a 1-D torch.Tensor of times, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"t must be a floating-point tensor, got dtype {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"t must be one-dimensional, got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError("t is empty: it must hold at least the initial time")
    times = t.detach().tolist()
    if not all(math.isfinite(x) for x in times):
        raise ValueError("t contains NaN or inf")
    d = [b - a for a, b in zip(times, times[1:])]
    if d and not (all(x > 0 for x in d) or all(x < 0 for x in d)):
        raise ValueError("t must be strictly increasing or strictly decreasing")
    return times


def check_func(func):
    """func is a field func(t, y): a Hamiltonian (called H(q, p)) or a Lagrangian (L(q, v)) in
    its place would be called as H(t, y) and fail deep inside the user's energy."""
    if isinstance(func, (Hamiltonian, Lagrangian)):
        kind, args = (("Hamiltonian", "H(q, p)") if isinstance(func, Hamiltonian)
                      else ("Lagrangian", "L(q, v)"))
        raise TypeError(
            f"func is a {kind} ({type(func).__name__}), an energy {args}, not a vector field "
            f"func(t, y) -> dy/dt: step it with tgi.rollout(system, q0, p0, h=..., steps=...)"
            + (", or pass func=None and options=dict(hamiltonian=H) with a geometric method "
               "(e.g. method='verlet')" if kind == "Hamiltonian" else ""))


def check_state(ys, name):
    for i, y in enumerate(ys):
        what = name if len(ys) == 1 else f"{name}[{i}]"
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"{what} must be a tensor, got {type(y).__name__}")
        if not y.is_floating_point():
            raise TypeError(f"{what} must be a real floating-point tensor, got dtype {y.dtype}")
        if y.numel() == 0:
            raise ValueError(f"{what} is empty")
        if y.dtype != ys[0].dtype or y.device != ys[0].device:
            raise ValueError(f"the parts of {name} must share one dtype and device; {name}[0] is "
                             f"{ys[0].dtype} on {ys[0].device}, {what} {y.dtype} on {y.device}")
        if not bool(torch.isfinite(y).all()):
            raise ValueError(f"{what} contains NaN or inf")


def check_int(value, name, minimum):
    """An int option: the message names ``options[name]``."""
    return check_value(value, f"options[{name!r}]", minimum)


def check_step_size(h):
    if h is None:
        return None
    if isinstance(h, torch.Tensor) and h.numel() == 1:
        h = h.item()
    if isinstance(h, bool) or not isinstance(h, numbers.Real) or not (math.isfinite(h) and h > 0):
        raise ValueError(f"options['step_size'] must be a finite number > 0, got {h!r}")
    return float(h)


def tol_values(tol, name):
    if isinstance(tol, (tuple, list)):
        return [v for x in tol for v in tol_values(x, name)]
    if isinstance(tol, torch.Tensor):
        vals = tol.detach().reshape(-1).tolist()
    elif isinstance(tol, numbers.Real) and not isinstance(tol, bool):
        vals = [float(tol)]
    else:
        raise TypeError(f"{name} must be a number, a tensor or a tuple of them, got {type(tol).__name__}")
    if not vals or not all(math.isfinite(v) and v >= 0 for v in vals):
        raise ValueError(f"{name} must be finite and >= 0, got {tol!r}")
    return vals


def solver_tol(rtol, atol, dtype) -> float:
    """min(rtol, atol), clipped below at the round-off floor of dtype (module docstring)."""
    return max(min(tol_values(rtol, "rtol") + tol_values(atol, "atol")), default_tol(dtype))


def parse_grad_options(options):
    """(grad mode, its options for :func:`torchgeo_int.gradients.grad_mode`) from odeint's options."""
    grad = options.get("grad", "backprop")
    if grad not in GRAD_MODES:
        raise ValueError(f"options['grad'] must be one of {GRAD_MODES}, got {grad!r}")
    accepted = {"backprop": (), "checkpoint": ("segment", "params"),
                "reversible": ("reconstruction_tol", "params")}[grad]
    misplaced = [k for k in GRAD_OPTIONS[1:] if k in options and k not in accepted]
    if misplaced:
        raise ValueError(f"option(s) {misplaced} do not apply to grad={grad!r} (segment: "
                         f"'checkpoint'; reconstruction_tol: 'reversible'; params: both)")
    kw = {k: options[k] for k in accepted if k in options}
    if "segment" in kw:
        check_int(kw["segment"], "segment", 1)
    if "reconstruction_tol" in kw:
        kw["reconstruction_tol"] = check_reconstruction_tol(kw["reconstruction_tol"])
    if "params" in kw:
        params = kw["params"]
        try:
            params = None if isinstance(params, torch.Tensor) else list(params)
        except TypeError:
            params = None
        if params is None or not all(isinstance(w, torch.Tensor) for w in params):
            raise TypeError("options['params'] must be a list or tuple of tensors (or an iterable "
                            "of them, such as module.parameters())")
        kw["params"] = params
    return grad, kw
