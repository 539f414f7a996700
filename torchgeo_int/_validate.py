"""Input checks shared by every module: fail loudly with a message that says what was wrong."""
from __future__ import annotations

import math
import numbers

import torch


def check_tensor(x, name: str, *, min_dim: int = 1) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dim(s) (batch dims lead, "
                         f"coordinates last), got shape {tuple(x.shape)}")
    if not (x.is_floating_point() or x.is_complex()):
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


def time_axis(q: torch.Tensor, p: torch.Tensor) -> tuple[int | None, float, float]:
    """Which of dims 0 and 1 of (·, ·, n) states (q, p) looks like time — the layout checks'
    test: trajectories change little between neighbours in time, so the axis whose mean |Δ| is
    under ¼ of the other's is time (None: neither).  Returns (axis, mean |Δ| along dim 0, along
    dim 1), the means for the caller's message; one host sync."""
    with torch.no_grad():
        x = torch.cat([q, p], -1)
        d0, d1 = torch.stack([(x[1:] - x[:-1]).abs().mean(), (x[:, 1:] - x[:, :-1]).abs().mean()]).tolist()
    return (0 if d0 < 0.25 * d1 else 1 if d1 < 0.25 * d0 else None), d0, d1


def shifted_rows(q: torch.Tensor, p: torch.Tensor) -> bool:
    """Whether (N, L, n) states are windows cut from trajectories in order: the first state of
    row i + 1 is, exactly, one of the later states of row i for at least half of the rows, as
    in what ``tgi.nn.make_windows`` returns (trajectory-major).  Such windows are sample-first
    whatever their spacing, though their neighbours along dim 0 differ by a step in time too,
    as much as along dim 1 (one host sync)."""
    with torch.no_grad():
        x = torch.cat([q, p], -1)
        hit = (x[:-1, 1:] == x[1:, :1]).all(-1).any(-1)       # (N − 1,)
        return bool(hit.float().mean() >= 0.5)


def cannot_tell(who: str, shape, d0: float, d1: float, options: str) -> ValueError:
    """The layout checks' refusal where neither axis looks like time (:func:`time_axis` gives
    None): a rolled-out grid of initial states, or coarse sampling, looks like this either way,
    and a guess would train on the wrong axis as often as not."""
    return ValueError(f"{who} cannot tell which axis of q, p of shape {tuple(shape)} is time: "
                      f"neighbours along dim 0 differ by {d0:.2e} on average, along dim 1 by "
                      f"{d1:.2e}, within 4x of each other (a rolled-out grid of initial states, an "
                      f"ensemble of nearby ones, or coarse sampling, looks like this either way). "
                      f"Say which: {options}")


def timed_call(fn, what: str, t, *args):
    """fn(*args), t among them, where t may be a tensor of per-sample times (variable steps,
    ``step_control``: each sample at its own time): a function written for a Python float t
    there fails inside the user's code with an unrelated message, so it is named."""
    try:
        return fn(*args)
    except (TypeError, ValueError, RuntimeError) as err:
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            raise TypeError(f"{what} failed on per-sample times t of shape {tuple(t.shape)} "
                            f"({type(err).__name__}: {err}): with variable steps (step_control) "
                            "each sample has its own time, so t is a tensor of the batch shape; "
                            "write it with torch operations on t (torch.sin(t), not math.sin(t)) "
                            "returning one value per sample") from err
        raise


def check_own_methods(system, what: str) -> None:
    """A system whose states only its own family of methods steps (``stepped_by``: a Lie-group
    system's (g, μ)) refused by ``what`` (a method of another family, variable steps), by name:
    the pair check that follows would only say that g and μ differ in shape."""
    family = getattr(system, "stepped_by", None)
    if family:
        raise ValueError(f"{type(system).__name__} is stepped by {family}, not by {what}")


def check_pair(a, b, names: tuple[str, str]) -> None:
    """Two points of the same space: tensors of one shape, dtype and device."""
    check_tensor(a, names[0])
    check_tensor(b, names[1])
    if a.shape != b.shape:
        raise ValueError(f"{names[0]} and {names[1]} must have the same shape, "
                         f"got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"{names[0]} and {names[1]} must have the same dtype, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"{names[0]} and {names[1]} are on different devices: {a.device} and {b.device}")


def check_placement(system, x: torch.Tensor, name: str = "q0") -> None:
    """A system with parameters (a learned Hamiltonian, an ``nn.Module``) must sit on the state's
    device and, for floating parameters, in its dtype: otherwise the first force call fails
    deep inside the network (``Expected all tensors to be on the same device``, ``mat1 and mat2
    must have the same dtype``).  One parameter is looked at: a module is moved whole."""
    if not isinstance(system, torch.nn.Module):
        return
    w = next(system.parameters(), None)
    if w is None:
        return
    if w.device != x.device:
        raise ValueError(f"the system's parameters are on {w.device} but {name} is on {x.device}: "
                         f"move the data (.to('{w.device}')) or the model (.to('{x.device}'))")
    if w.is_floating_point() and x.is_floating_point() and w.dtype != x.dtype:
        raise TypeError(f"the system's parameters are {w.dtype} but {name} is {x.dtype}: convert "
                        f"the data (.to({w.dtype})) or the model (.to({x.dtype}))")


def check_finite(x: torch.Tensor, name: str) -> None:
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or inf")


def check_even_last_dim(x: torch.Tensor, name: str) -> int:
    m = x.shape[-1]
    if m % 2:
        raise ValueError(f"{name} is a point of a tangent/cotangent bundle, cat([q, v|p], -1): "
                         f"its last dim must be even, got {m}")
    return m // 2


def check_int(value, name: str, minimum: int) -> int:
    """An int (not a bool) >= minimum."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_real(value, name: str, lo: float, hi: float | None = None, *,
               lo_open: bool = False) -> float:
    """A finite real (an int or float, not a bool) >= lo (> lo with ``lo_open``) and < hi, as a
    float: learning rates, decay rates, weights."""
    ok = (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
          and (value > lo if lo_open else value >= lo) and (hi is None or value < hi))
    if not ok:
        bound = f"{'>' if lo_open else '>='} {lo:g}" + (f" and < {hi:g}" if hi is not None else "")
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def check_scalar(x, name: str, what: str = "number") -> float:
    """A finite real number as a float: an int or float (not a bool), or a 0-d real tensor that
    does not require grad (its gradient would be lost in the conversion: say so rather than
    detach it silently).  ``what`` names it in the message ("time", "number")."""
    if isinstance(x, torch.Tensor):
        if x.dim() != 0 or x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"{name} must be a real number or a 0-d real tensor, got a tensor of "
                            f"shape {tuple(x.shape)} and dtype {x.dtype}")
        if x.requires_grad:
            raise ValueError(f"{name} requires grad, but it is read as a Python number (no "
                             f"gradient reaches it); differentiate through the states instead")
    elif isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be a finite {what}, got {x}")
    return x


def check_nonzero(x, name: str, what: str = "number") -> float:
    """A finite nonzero real (:func:`check_scalar`), as a float: a step size h, a data spacing
    dt.  ``what`` names it in the message ("step size", "number")."""
    x = check_scalar(x, name, f"nonzero {what}")
    if x == 0.0:
        raise ValueError(f"{name} must be a finite nonzero {what}, got {x}")
    return x


def broadcasts_to(shape, target) -> bool:
    """Whether a tensor of ``shape`` broadcasts to ``target`` without enlarging it (a number
    for every sample, per-sample values, a derivative differing by singleton dims)."""
    try:
        return tuple(torch.broadcast_shapes(tuple(shape), tuple(target))) == tuple(target)
    except RuntimeError:
        return False


def singular_threshold(n: int, dtype) -> float:
    """Condition numbers at or above 1/(n·eps) leave no correct digit in A⁻¹f (A n × n)."""
    return 1.0 / (max(n, 1) * torch.finfo(dtype).eps)


def find_singular(A: torch.Tensor, dtype):
    """The samples of a batch of square matrices A (..., m, m) that are numerically singular for
    ``dtype``: condition number (taken in float64) infinite or ≥ singular_threshold(m, dtype).
    None when there are none, else (how many, of how many, the worst condition number) for the
    caller's error."""
    with torch.no_grad():
        A = A.double()
        finite = torch.isfinite(A).all(-1).all(-1)      # a non-finite matrix is singular here
        eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
        cond = torch.linalg.cond(torch.where(finite[..., None, None], A, eye))
        cond = torch.where(finite, cond, torch.full_like(cond, math.inf))
    bad = ~torch.isfinite(cond) | (cond >= singular_threshold(A.shape[-1], dtype))
    if not bool(bad.any()):
        return None
    worst = float(torch.where(torch.isfinite(cond), cond, torch.full_like(cond, math.inf)).max())
    return int(bad.sum()), bad.numel(), worst
