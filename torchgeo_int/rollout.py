r"""Batched rollouts: the one loop over steps that every integrator shares.

``rollout(system, q0, p0, h=..., steps=..., method=...)`` returns the trajectory
``(q, p)``, each of shape ``(steps // save_every + 1, *q0.shape)``; for a first-order system
(``p0=None``, an eq. (1) integrator) it returns the trajectory of x alone.  Batch dims are free
(the integrators act on every sample at once); there is no per-sample Python loop.
"""
from __future__ import annotations

import torch

from ._validate import check_finite, check_pair, check_tensor
from .integrators import get_method
from .solvers import ConvergenceError
from .systems import Hamiltonian, System

GRAD_MODES = ("backprop", "checkpoint", "reversible")


def as_system(system) -> System:
    if isinstance(system, System):
        return system
    if callable(system):
        return Hamiltonian(system)
    raise TypeError(f"system must be a torchgeo_int System or a callable H(q, p), got {type(system).__name__}")


def _check_int(value, name, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def rollout(system, q0: torch.Tensor, p0: torch.Tensor | None = None, *, h: float, steps: int,
            method="verlet", t0: float = 0.0, save_every: int = 1, check_every: int = 64,
            grad: str = "backprop", compile: bool = False, **grad_options):
    r"""Integrate from (q0, p0) at t0 with ``steps`` steps of size ``h`` (negative h integrates
    backwards) and return the states every ``save_every`` steps, the initial one included.

    ``system``: a :class:`System` (Hamiltonian, SeparableHamiltonian, VectorFieldSystem, an HNN) or
    a callable H(q, p).  ``method``: a name in ``METHODS`` or an Integrator.
    Gradients flow to q0, p0 and the system's parameters (through implicit steps by the solver's
    implicit backward).  ``grad`` chooses how: ``"backprop"`` (plain autograd), or a memory-lean
    mode of :mod:`torchgeo_int.gradients` (options in ``grad_options``).  ``compile=True`` runs
    the steps through ``torch.compile`` (:mod:`torchgeo_int._compile`): explicit splittings on
    separable systems as compiled blocks of steps (without autograd) or compiled single steps
    (with it), implicit methods with a compiled vector field; results equal the eager ones to
    round-off.
    Non-finite states are detected every ``check_every`` steps (one host sync each) and raise
    ``FloatingPointError`` naming the steps; an implicit step that does not converge raises
    ``ConvergenceError`` naming the step.
    """
    system = as_system(system)
    first_order = p0 is None
    integrator = get_method(method, first_order=first_order)
    if first_order:
        check_tensor(q0, "x0")
        check_finite(q0, "x0")
        if not integrator.first_order:
            raise ValueError(f"p0 is None (a first-order system) but {integrator.name!r} is a "
                             "Hamiltonian method; pass p0 or a first-order method")
    elif integrator.check_state is not None:
        integrator.check_state(system, q0, p0)  # e.g. Lie groups: g (..., 3, 3) with μ (..., 3)
    else:
        check_pair(q0, p0, ("q0", "p0"))
        check_finite(q0, "q0")
        check_finite(p0, "p0")
        if integrator.first_order:
            raise ValueError(f"{integrator.name!r} integrates first-order systems: call rollout(system, x0)")
    _check_int(steps, "steps", 0)
    _check_int(save_every, "save_every", 1)
    _check_int(check_every, "check_every", 1)
    h = float(h)
    if h == 0.0 or h != h or abs(h) == float("inf"):
        raise ValueError(f"h must be a finite nonzero step size, got {h}")
    if grad not in GRAD_MODES:
        raise ValueError(f"grad must be one of {GRAD_MODES}, got {grad!r}")
    if grad_options and grad == "backprop":
        raise TypeError(f"unexpected options for grad='backprop': {sorted(grad_options)}")

    step = integrator.bind(system)
    args = dict(system=system, h=h, steps=steps, t0=float(t0), save_every=save_every,
                check_every=check_every)
    if compile:
        from ._compile import compiled_rollout, compiled_step
        if grad == "backprop":
            out = compiled_rollout(integrator, system, q0, p0, h=h, steps=steps, t0=float(t0),
                                   save_every=save_every, check_every=check_every)
            return out[0] if first_order else out
        step = compiled_step(integrator, system)
    if grad != "backprop":
        from .gradients import rollout_with_grad_mode
        out = rollout_with_grad_mode(grad, integrator, step, q0, p0, **args, **grad_options)
    else:
        out = run_loop(step, q0, p0, **args)
    return out[0] if first_order else out


def run_loop(step, q0, p0, *, system, h, steps, t0, save_every, check_every, cache=None,
             step_offset=0, return_cache=False):
    """The loop itself (shared by the gradient modes, which run it on segments)."""
    n_out = steps // save_every + 1
    # Under autograd the outputs are stacked (in-place writes into one buffer would chain every
    # step through CopySlices); without it they go into preallocated buffers.
    track = torch.is_grad_enabled()
    states = [x for x in (q0, p0) if x is not None]
    if track:
        outs = [[x] for x in states]
    else:
        outs = [torch.empty((n_out, *x.shape), dtype=x.dtype, device=x.device) for x in states]
        for o, x in zip(outs, states):
            o[0] = x

    q, p = q0, p0
    run = getattr(step, "run", None)   # n steps in one call (a bound explicit splitting)
    k = 0
    while k < steps:
        # Steps run in stretches up to the next save or check, so the per-step Python cost is
        # the call of `step` alone (or nothing, with `run`).
        end = min(steps, (k // save_every + 1) * save_every, (k // check_every + 1) * check_every)
        if run is not None:
            q, p, cache = run(q, p, h, end - k, cache)
        else:
            j = k
            try:
                for j in range(k, end):
                    q, p, cache = step(system, q, p, t0 + j * h, h, cache)
            except ConvergenceError as err:
                raise err.with_step(step_offset + j) from None
        k = end
        cur = (q,) if p is None else (q, p)
        if k % save_every == 0:
            i = k // save_every
            for o, x in zip(outs, cur):
                if track:
                    o.append(x)
                else:
                    o[i] = x
        if k % check_every == 0 or k == steps:
            finite = torch.stack([torch.isfinite(x).all() for x in cur]).all()
            if not bool(finite):
                a, b = step_offset + (k - 1) // check_every * check_every, step_offset + k
                raise FloatingPointError(
                    f"the rollout became non-finite between step {a} and step {b} "
                    f"(t = {t0 + k * h:g}); reduce h or check the system")
    result = tuple(torch.stack(o) for o in outs) if track else tuple(outs)
    if p0 is None:
        result = (result[0], None)
    return (result, cache) if return_cache else result
