"""When a derivative taken with autograd needs a graph of its own.

The forces of a Hamiltonian are ∂H/∂q, ∂H/∂p by ``torch.autograd.grad`` on inputs made into fresh
leaves.  With ``create_graph=True`` the result depends on those leaves, so a rollout run under grad
mode would keep every step's graph (memory O(steps)) and hand back outputs that say
``requires_grad`` even when nothing the caller owns requires grad.  The graph is needed only when
the value depends on some *other* tensor that requires grad (a parameter, a tensor a closure
captured, an input that is part of the caller's graph); :func:`reaches_other_leaves` tells.
"""
from __future__ import annotations

import torch

Tensor = torch.Tensor


def internal_leaf(x: Tensor) -> Tensor:
    """x as a fresh leaf that requires grad, marked as the package's own (``internal``): a
    derivative's input or a solver's start, never a tensor of the caller's, so the lean grad
    modes' check for tensors a closure captured (``gradients._untracked_leaves``) passes it."""
    leaf = x.detach().requires_grad_()
    leaf.internal = True
    return leaf


def grad_inputs(xs: tuple[Tensor, ...], keep: bool) -> tuple[Tensor, ...]:
    """The tensors to differentiate a function of ``xs`` with respect to, for its *partial*
    derivatives: each x that carries the caller's graph (``keep`` and ``x.requires_grad``) as
    ``x.view_as(x)``, a node of its own, so that ∂/∂x follows x's direct uses only and not
    another input computed from x (p from q after a kick: differentiating with respect to q
    itself would add ∂p/∂q's path, a total derivative), the result still differentiable back
    to x; every other x as an :func:`internal_leaf`."""
    return tuple(x.view_as(x) if (keep and x.requires_grad) else internal_leaf(x) for x in xs)


def reaches_other_leaves(out: Tensor, own: tuple[Tensor, ...]) -> bool:
    """Whether ``out``'s autograd graph reaches a leaf that requires grad other than ``own``.

    A walk over the graph of one evaluation (a few dozen nodes for an MLP), stopped at the first
    such leaf; callers walk only when none of their inputs requires grad, i.e. only where the
    walk saves a graph per step."""
    if out.grad_fn is None:
        return out.requires_grad and not any(out is x for x in own)
    stack, seen = [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        leaf = getattr(node, "variable", None)          # AccumulateGrad: a leaf tensor
        if leaf is not None:
            if not any(leaf is x for x in own):
                return True
            continue
        stack.extend(nxt for nxt, _ in node.next_functions)
    return False


def leaves_after(like: tuple[Tensor, ...], history: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """Zeros shaped like ``like`` that require grad, to differentiate *with respect to* (the
    u of a double-vjp ∂/∂u (Jᵀu · t)), placed after every autograd node behind ``history``.

    ``autograd.grad(outputs, inputs)`` visits the graph behind ``outputs`` down to the
    topological number of its inputs only; a fresh leaf has number 0, so an output that also
    depends on a rollout's state would have its whole history visited at every call (step k
    costing O(k)).  Here each zero is ``zeros + 0·(a scalar of every history tensor)``: same
    value, no gradient through it, but a node numbered after the history, which is then skipped.
    With no history requiring grad these are plain leaves."""
    hist = [t for t in history if isinstance(t, Tensor) and t.requires_grad]
    if not hist:
        return tuple(torch.zeros_like(o, requires_grad=True) for o in like)
    # nan_to_num: 0·inf is NaN, and a zero must stay zero whatever the history holds
    anchor = sum((t.reshape(-1)[:1].sum() * 0.0).nan_to_num(0.0, 0.0, 0.0) for t in hist)
    return tuple(torch.zeros_like(o) + anchor.to(o.dtype) for o in like)


def batch_jacobian(out: Tensor, x: Tensor, create_graph: bool) -> Tensor:
    """Per-sample Jacobian ∂out/∂x, (..., m, n) for out (..., m) and x (..., n), from m
    batch-summed reverse passes (samples are independent); zeros where out does not depend on x."""
    if not out.requires_grad:  # out does not depend on x
        return out.new_zeros(*out.shape, x.shape[-1])
    rows = []
    for i in range(out.shape[-1]):
        (g,) = torch.autograd.grad(out[..., i].sum(), x, retain_graph=True,
                                   create_graph=create_graph, allow_unused=True)
        rows.append(torch.zeros_like(x) if g is None else g)
    return torch.stack(rows, -2)
