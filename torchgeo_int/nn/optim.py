r"""Adam for per-sample parameters that a minibatch reaches only in part.

A :class:`~torchgeo_int.nn.TrajectoryFit` holds one learnable state per shooting node; a batch of
segments reaches only the nodes of its segments (and, through the continuity term, the next
ones).  ``torch.optim.Adam`` treats the node states as one dense tensor: the rows no segment of
the batch reached get a zero gradient, but their first moment m is not zero, so Adam still moves
them by lr · m̂ / (√v̂ + ε) at every step after their last visit — with β₁ = 0.9 about
Σ_k 0.9^k ≈ 10 × the visited step in total, in the direction of a gradient that is stale —
and it decays their moments and advances the shared bias correction as if they had been seen.

:class:`LazyAdam` is Adam in which the parameters of groups marked ``rows=True`` are updated row
by row (a row: one index of the leading dims, the last dim being the state vector).  A row whose
gradient is exactly zero at a step is left alone: it does not move, its moments are not decayed
and its own step count (for the bias corrections) does not advance — the "lazy" Adam of
``torch.optim.SparseAdam`` (and TensorFlow's LazyAdam) for dense tensors.  On a full batch every
row has a gradient and the update is Adam's.  The other groups get exactly ``torch.optim.Adam``'s
update (L2 weight decay added to the gradient, as ``Adam(weight_decay=…)``).
"""
from __future__ import annotations

import math

import torch

from .._validate import check_real

Tensor = torch.Tensor


class LazyAdam(torch.optim.Optimizer):
    r"""Adam whose ``rows=True`` parameter groups take steps only in the rows the gradient
    reaches (see the module docstring).

    ``params``: parameters or parameter groups (dicts); each group may set ``lr``, ``betas``,
    ``eps``, ``weight_decay`` and ``rows`` (default: the constructor's).  A parameter of a
    ``rows`` group must have at least one dim; its rows are the indices of all dims but the last
    (a 1-d parameter is one row per element).  Weight decay does not count as a gradient: a row
    with zero gradient is not decayed either.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, rows: bool = False):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, rows=rows)
        super().__init__(params, defaults)
        for group in self.param_groups:
            self._check_group(group)

    @staticmethod
    def _check_group(group):
        check_real(group["lr"], "lr", 0.0, lo_open=True)
        betas = group["betas"]
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        for i, b in enumerate(betas):
            check_real(b, f"betas[{i}]", 0.0, 1.0)
        check_real(group["eps"], "eps", 0.0, lo_open=True)
        check_real(group["weight_decay"], "weight_decay", 0.0)
        if not isinstance(group["rows"], bool):
            raise TypeError(f"rows must be a bool, got {group['rows']!r}")
        if group["rows"]:
            for p in group["params"]:
                if p.dim() == 0:
                    raise ValueError("a parameter of a rows=True group needs at least one dim "
                                     "(its rows are the indices of all dims but the last)")

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        if hasattr(self, "defaults"):
            self._check_group(self.param_groups[-1])

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, wd, rows = group["lr"], group["eps"], group["weight_decay"], group["rows"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise RuntimeError("LazyAdam takes dense gradients (use torch.optim.SparseAdam "
                                       "for sparse ones)")
                state = self.state[p]
                if not state:
                    shape = (p.shape[:-1] if p.dim() > 1 else p.shape) if rows else ()
                    state["step"] = torch.zeros(shape, dtype=_count_dtype(p), device=p.device)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                elif state["step"].dtype != _count_dtype(p):   # saved by a version counting in p's dtype
                    state["step"] = state["step"].to(_count_dtype(p))
                if rows:
                    g = grad if p.dim() > 1 else grad.unsqueeze(-1)
                    mask = g.ne(0).any(-1)                    # the rows the gradient reaches
                    if not bool(mask.any()):
                        continue
                    self._rows_update(p, grad, state, mask, lr, beta1, beta2, eps, wd)
                else:
                    if wd:
                        grad = grad.add(p, alpha=wd)
                    state["step"] += 1
                    step = float(state["step"])
                    state["exp_avg"].lerp_(grad, 1 - beta1)
                    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                    bc1 = 1 - beta1 ** step
                    bc2_sqrt = math.sqrt(1 - beta2 ** step)
                    denom = (state["exp_avg_sq"].sqrt() / bc2_sqrt).add_(eps)
                    p.addcdiv_(state["exp_avg"], denom, value=-lr / bc1)
        return loss

    @staticmethod
    def _rows_update(p, grad, state, mask, lr, beta1, beta2, eps, wd):
        flat = p.dim() == 1
        view = (lambda x: x.unsqueeze(-1)) if flat else (lambda x: x)
        P, G = view(p), view(grad)
        m, v = view(state["exp_avg"]), view(state["exp_avg_sq"])
        if state["step"].device != p.device:    # a checkpoint loaded with map_location="cpu"
            state["step"] = state["step"].to(p.device)
        step = state["step"]
        g = G[mask]
        if wd:
            g = g + wd * P[mask]
        step[mask] += 1
        t = step[mask].unsqueeze(-1)
        m_r = m[mask].lerp_(g, 1 - beta1)
        v_r = v[mask].mul_(beta2).addcmul_(g, g, value=1 - beta2)
        m[mask], v[mask] = m_r, v_r
        # in the count's dtype, then p's: in bfloat16 β₂ = 0.999 rounds to 1 (no update at all)
        bc1 = (1 - beta1 ** t).to(p.dtype)
        bc2_sqrt = (1 - beta2 ** t).sqrt().to(p.dtype)
        denom = (v_r.sqrt() / bc2_sqrt).add_(eps)
        P[mask] = P[mask] - (lr / bc1) * m_r / denom


def _count_dtype(p: Tensor) -> torch.dtype:
    """The dtype of the step counts: float64 (exact counts, bias corrections as torch.optim.Adam
    computes them) where the device has it; a count in bfloat16/float16 stops at 256/2048."""
    return torch.float32 if p.device.type == "mps" else torch.float64


__all__ = ["LazyAdam"]
