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
