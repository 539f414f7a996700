"""The one solve path: ``rollout``, ``odeint``, the nn layers and ``distributed`` all end here.

    bind(integrator, system, compile)  → a stepper (:class:`~torchgeo_int.integrators.base.Stepper`):
                                          ``step(system, q, p, t, h, cache)`` and
                                          ``steps(q, p, t0, h, n, cache)`` (Φ_h^n)
    solve(integrator, system, q0, p0, h, steps, ..., grad, compile)
                                       → the states every ``save_every`` steps

The loop is :func:`torchgeo_int._loop.run_loop`, which calls the stepper's ``steps`` once per
stretch between saves and checks; a gradient mode (:class:`~torchgeo_int.gradients.Backprop`,
``Checkpoint(segment)``, ``Reversible(tol)``) owns its variant of it; ``compile=True`` replaces
the stepper by its compiled wrapper (:mod:`torchgeo_int._compile`), told the rollout's plan
(steps, t0, save_every) when the mode's ``compiled_blocks`` allows blocks of steps.  Imports go
one way: integrators → _loop → gradients, _compile → solve → rollout, odeint → nn, distributed.
"""
from __future__ import annotations

from ._compile import compiled_step
from ._loop import run_loop
from .gradients import GRAD_MODES, Backprop, Checkpoint, GradMode, Reversible, grad_mode

__all__ = ["bind", "solve", "run_loop", "grad_mode", "GradMode", "Backprop", "Checkpoint",
           "Reversible", "GRAD_MODES"]

BACKPROP = Backprop()


def bind(integrator, system, *, compile: bool = False, **plan):
    """The stepper of ``integrator`` on ``system``: its bound stepper, or the compiled one
    (``plan``: the rollout's ``steps``, ``t0``, ``save_every``; see
    :class:`~torchgeo_int._compile.CompiledStep`)."""
    return compiled_step(integrator, system, **plan) if compile else integrator.bind(system)


def solve(integrator, system, q0, p0, *, h: float, steps: int, t0: float = 0.0,
          save_every: int = 1, check_every: int = 64, grad: GradMode = BACKPROP,
          compile: bool = False, step=None, step_offset: int = 0, cache=None,
          return_cache: bool = False, progress=None):
    """``steps`` steps of ``integrator`` from (q0, p0) at t0 (inputs already validated by the
    front-end); returns ``(qs, ps)`` (``ps`` None for a first-order state), and the last cache
    with ``return_cache=True``.  ``step``: a stepper bound once by a driver that runs several
    stretches (odeint's groups of intervals; with ``compile`` each call builds its compiled
    stepper, whose plan is this call's); ``step_offset`` numbers their steps in errors;
    ``progress`` (a tqdm bar) is told the forward steps."""
    if compile:
        plan = dict(steps=steps, t0=t0, save_every=save_every) if grad.compiled_blocks else {}
        step = bind(integrator, system, compile=True, **plan)
    elif step is None:
        step = bind(integrator, system)
    return grad.run(integrator, step, q0, p0, system=system, h=h, steps=steps, t0=t0,
                    save_every=save_every, check_every=check_every, step_offset=step_offset,
                    cache=cache, return_cache=return_cache, progress=progress)
