"""The one loop over steps that every path shares (rollout, odeint, the gradient modes, compiled
rollouts): steps in stretches up to the next save or check, outputs stacked under autograd and
written into preallocated buffers without it, non-finite states detected every ``check_every``
steps, a non-converged implicit step named by its number."""
from __future__ import annotations

import cmath
import math
import warnings

import numpy as np
import torch

from .integrators.base import as_stepper
from .solvers import ConvergenceError

__all__ = ["run_loop", "n_saved", "progress_bar"]


#: smallest output buffer (bytes) allocated through numpy on the CPU: numpy asks Linux for
#: transparent huge pages (madvise) from 4 MiB, torch's allocator does not (unless
#: THP_MEM_ALLOC_ENABLE=1 is set before it starts).  A rollout that keeps every state writes
#: into fresh memory, and the first touch of each 4 KiB page (a fault, the page zeroed) is what
#: storing costs: measured on one core, Kepler, 4096 trajectories, 2049 states, writing the
#: states took 21 ns per step·trajectory into torch's memory and 13–15 ns into numpy's.
HUGE_BUFFER = 4 << 20
_NUMPY_DTYPES = {torch.float64: np.float64, torch.float32: np.float32, torch.float16: np.float16,
                 torch.complex128: np.complex128, torch.complex64: np.complex64}


def output_buffer(shape, like) -> torch.Tensor:
    """An uninitialised tensor of ``shape`` with ``like``'s dtype and device: the rows a rollout
    writes its states into; large CPU ones on huge pages (see ``HUGE_BUFFER``)."""
    shape = tuple(shape)
    dtype = _NUMPY_DTYPES.get(like.dtype)
    if (dtype is not None and like.device.type == "cpu"
            and math.prod(shape) * like.element_size() >= HUGE_BUFFER):
        return torch.from_numpy(np.empty(shape, dtype=dtype))
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def n_saved(steps: int, save_every: int) -> int:
    """The frames a rollout returns: steps 0, save_every, ... ≤ steps, and the final step."""
    return -(-steps // save_every) + 1


def progress_bar(total, desc):
    """A tqdm bar over ``total`` steps; None, with a warning, when tqdm (an optional
    dependency) is not installed."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        warnings.warn("progress=True needs tqdm (pip install tqdm); running without a bar",
                      RuntimeWarning, stacklevel=3)
        return None
    return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)


def run_loop(step, q0, p0, *, system, h, steps, t0, save_every, check_every, cache=None,
             step_offset=0, return_cache=False, progress=None):
    """Run ``steps`` steps of ``step`` from (q0, p0) at t0 and return the states every
    ``save_every`` steps, the initial one included, and the final state (one more frame when
    save_every does not divide steps; :func:`n_saved` frames in all) (``p0=None``: a first-order
    state, the second output is None).  ``step`` is a stepper
    (:class:`~torchgeo_int.integrators.base.Stepper`: ``steps(q, p, t0, h, n, cache, start=,
    out=)``), or a step function ``step(system, q, p, t, h, cache) -> (q, p, cache)``, bound to
    ``system`` here.  ``cache`` starts the FSAL/warm-start chain (``return_cache=True`` returns
    the last one); ``step_offset`` numbers the steps in errors (a run continuing an earlier one);
    ``progress``: an object with ``update(n)`` (a tqdm bar), told the steps of each stretch."""
    n_out = n_saved(steps, save_every)
    # States that carry a graph are stacked at the end (in-place writes into one buffer would
    # chain every step through CopySlices); the others go into preallocated buffers: under
    # no_grad, and under grad mode while nothing the steps touch requires grad (a rollout of a
    # fixed system without torch.no_grad()), switching to stacking at the first state that
    # does.  A stepper that ``writes_out`` (a bound splitting) puts each saved state straight
    # into its row.
    grad_mode = torch.is_grad_enabled()
    states = [x for x in (q0, p0) if x is not None]
    params = system.parameters() if isinstance(system, torch.nn.Module) else ()
    track = grad_mode and (any(x.requires_grad for x in states)
                           or any(w.requires_grad for w in params))
    if track:
        outs = [[x] for x in states]
    else:
        outs = [output_buffer((n_out, *x.shape), x) for x in states]
        for o, x in zip(outs, states):
            o[0] = x

    q, p = q0, p0
    stepper = as_stepper(step, system)
    into = stepper.writes_out   # steps(..., out=rows) writes the stretch's last state there
    # Under grad mode with nothing known to require grad, a step may still read a tensor that
    # does (a module a closure holds): out= refuses the stretch's last write, and the stretch
    # would run twice.  So the first stretch goes without out=, and its end says whether the
    # rest may write into the rows.
    probe_into = into and grad_mode and not track
    into = into and not probe_into
    # Every state saved, no graph: one ``saves`` call per stretch up to the next check writes
    # the stretch's states into their rows (a compiled stepper writes whole blocks at once).
    # Under grad mode only a stepper that decides itself whether a graph is needed
    # (``decides_graph``: it returns None when one is) — otherwise a step reading a captured
    # tensor that requires grad would put the buffers into the graph.
    saving = (save_every == 1 and not track and p is not None
              and (not grad_mode or getattr(stepper, "decides_graph", False)))
    # A stepper with ``long_steps`` (compiled, small states) may run a whole stretch between
    # saves (every state saved: the whole rollout) in one go, checks included: its final state
    # is checked once, and a stretch that ends non-finite runs again from its start in the
    # checked stretches below, which name the steps as they would have without it.
    long = getattr(stepper, "long_steps", None) if not track and p is not None else None
    k = 0
    while k < steps:
        if long is not None:
            end = steps if saving else min(steps, (k // save_every + 1) * save_every)
            if progress is not None:     # a bar that moves: at most a hundredth of the run a call
                end = min(end, k + max(check_every, -(-steps // 100)))
            try:
                done = long(q, p, t0, h, end - k, cache, start=k,
                            rows=(outs[0][k + 1:end + 1], outs[1][k + 1:end + 1]) if saving else None)
            except ConvergenceError as err:
                raise err.with_step(step_offset + (k if err.step is None else err.step)) from None
            if done is not None:
                if not _finite(done[:2]):
                    long = None      # from k again, checked (the check below raises)
                    continue
                q, p, cache = done
                if progress is not None:
                    progress.update(end - k)
                k = end
                if not saving:
                    i = -(-k // save_every)
                    outs[0][i], outs[1][i] = q, p
                continue
        if saving:
            end = min(steps, (k // check_every + 1) * check_every)
            try:
                done = stepper.saves(q, p, t0, h, end - k, cache, start=k,
                                     rows=(outs[0][k + 1:end + 1], outs[1][k + 1:end + 1]))
            except ConvergenceError as err:
                raise err.with_step(step_offset + (k if err.step is None else err.step)) from None
            saving = done is not None
            if saving:
                q, p, cache = done
                if progress is not None:
                    progress.update(end - k)
                k = end
                _check_finite((q, p), k, steps, check_every, step_offset, t0, h)
                continue
        # Steps run in stretches up to the next save or check: one ``steps`` call each, so the
        # per-step Python cost is the stepper's own loop.
        end = min(steps, (k // save_every + 1) * save_every, (k // check_every + 1) * check_every)
        written = False
        try:
            if into and not track and (end % save_every == 0 or end == steps) and p is not None:
                i = -(-end // save_every)
                try:
                    q, p, cache = stepper.steps(q, p, t0, h, end - k, cache, start=k,
                                                out=(outs[0][i], outs[1][i]))
                    written = True
                except ConvergenceError:
                    raise
                except RuntimeError:
                    # out= refuses inputs that require grad (checked before any write): under
                    # grad mode the steps began to depend on such a tensor (a captured one);
                    # the stretch runs again without out= (q, p and the cache are its start)
                    if not grad_mode:
                        raise
            if not written:
                q, p, cache = stepper.steps(q, p, t0, h, end - k, cache, start=k)
        except ConvergenceError as err:
            # the stepper numbers its step from the run's start; the run from the caller's
            raise err.with_step(step_offset + (k if err.step is None else err.step)) from None
        if progress is not None:
            progress.update(end - k)
        k = end
        cur = (q,) if p is None else (q, p)
        if probe_into:
            into, probe_into = not any(x.requires_grad for x in cur), False
        if (k % save_every == 0 or k == steps) and not written:
            i = -(-k // save_every)
            if not track and grad_mode and any(x.requires_grad for x in cur):
                # the steps depend on a tensor that requires grad (one a closure captured): the
                # states so far are constants, the rest keep their graph
                outs, track = [list(o[:i].clone().unbind(0)) for o in outs], True
            for o, x in zip(outs, cur):
                if track:
                    o.append(x)
                else:
                    o[i] = x
        _check_finite(cur, k, steps, check_every, step_offset, t0, h)
    result = tuple(torch.stack(o) for o in outs) if track else tuple(outs)
    if p0 is None:
        result = (result[0], None)
    return (result, cache) if return_cache else result


def _check_finite(cur, k, steps, check_every, step_offset, t0, h):
    """At a check (every ``check_every`` steps, and the last step): a FloatingPointError naming
    the stretch of steps in which the state became non-finite."""
    if k % check_every == 0 or k == steps:
        if not _finite(cur):
            a, b = step_offset + (k - 1) // check_every * check_every, step_offset + k
            raise FloatingPointError(
                f"the rollout became non-finite between step {a} and step {b} "
                f"(t = {t0 + k * h:g}); reduce h or check the system")


def _finite(states) -> bool:
    """Whether every element of the tensors ``states`` is finite (one host sync; two when the
    sums are not finite).

    A sum is finite only if every term is (NaN and ±inf propagate), so a finite sum of the sums
    says so with one reduction a tensor; a sum that is not finite (a non-finite element, or finite
    elements whose sum overflows) is decided element by element.  ``isfinite(x).all()`` costs
    four elementwise kernels and a reduction: 48 µs against 7 a check of a Kepler (q, p) at
    B = 4096, 580 against 31 at B = 65536 (one CPU thread).  A state whose sum overflows (half
    precision overflows early) pays both."""
    total = None
    for x in states:
        s = x.sum()
        total = s if total is None else total + s
    if total is None or cmath.isfinite(total.item()):    # (cmath: complex states too)
        return True
    return bool(torch.stack([torch.isfinite(x).all() for x in states]).all())
