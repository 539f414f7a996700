"""The one solve path: ``rollout``, ``odeint``, the nn layers and ``distributed`` all end here.

    bind(integrator, system, compile)  → a stepper: ``step(system, q, p, t, h, cache)``
                                          (+ ``step.run(q, p, h, n, cache)`` for n steps at once)
    solve(integrator, system, q0, p0, h, steps, ..., grad, compile)
                                       → the states every ``save_every`` steps

The loop is :func:`torchgeo_int._loop.run_loop`; a gradient mode
(:class:`~torchgeo_int.gradients.Backprop`, ``Checkpoint(segment)``, ``Reversible(tol)``) owns
its variant of it; ``compile=True`` wraps the stepper (:mod:`torchgeo_int._compile`), and with
plain backprop runs the compiled plan of the whole rollout (blocks, macro steps).  Imports go one
way: integrators → _loop → gradients, _compile → solve → rollout, odeint → nn, distributed.
"""
from __future__ import annotations

from ._compile import compiled_rollout, compiled_step
from ._loop import run_loop
from .gradients import GRAD_MODES, Backprop, Checkpoint, GradMode, Reversible, grad_mode

__all__ = ["bind", "solve", "run_loop", "grad_mode", "GradMode", "Backprop", "Checkpoint",
           "Reversible", "GRAD_MODES"]

BACKPROP = Backprop()


def bind(integrator, system, *, compile: bool = False):
    """The stepper of ``integrator`` on ``system``: its bound step, or the compiled one."""
    return compiled_step(integrator, system) if compile else integrator.bind(system)


def solve(integrator, system, q0, p0, *, h: float, steps: int, t0: float = 0.0,
          save_every: int = 1, check_every: int = 64, grad: GradMode = BACKPROP,
          compile: bool = False, step=None, step_offset: int = 0, cache=None,
          return_cache: bool = False, progress=None):
    """``steps`` steps of ``integrator`` from (q0, p0) at t0 (inputs already validated by the
    front-end); returns ``(qs, ps)`` (``ps`` None for a first-order state), and the last cache
    with ``return_cache=True``.  ``step``: a stepper bound once by a driver that runs several
    stretches (odeint's groups of intervals); ``step_offset`` numbers their steps in errors;
    ``progress`` (a tqdm bar) is told the forward steps."""
    if compile and isinstance(grad, Backprop):
        out = compiled_rollout(integrator, system, q0, p0, h=h, steps=steps, t0=t0,
                               save_every=save_every, check_every=check_every,
                               step_offset=step_offset, progress=progress)
        return (out, None) if return_cache else out
    if step is None:
        step = bind(integrator, system, compile=compile)
    return grad.run(integrator, step, q0, p0, system=system, h=h, steps=steps, t0=t0,
                    save_every=save_every, check_every=check_every, step_offset=step_offset,
                    cache=cache, return_cache=return_cache, progress=progress)
