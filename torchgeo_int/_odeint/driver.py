"""odeint's driver: the runs of equal steps over t, each one call of the one solve path."""
from __future__ import annotations

import math

import torch

from .._loop import progress_bar
from ..solve import bind, grad_mode, solve
from .contract import StepHooks, TimeMap

CHECK_EVERY = 64  # steps between finiteness checks (one host sync each)


def hooked_step(step, run):
    """The bound step with torchdiffeq's per-step hooks (perturb, callback_step), if any."""
    if not (run["fresh"] or run["callback"] is not None):
        return step
    return StepHooks(step, caller=run["caller"], perturb=run["perturb"], callback=run["callback"],
                     to_user=run["to_user"], fresh=run["fresh"])


def integrate(integrator, system, states, times, step_size, t_dtype, grad="backprop",
              grad_options=None, compile=False, *, caller=None, t=None, perturb=False,
              fresh=False, callback=None, progress=None, to_user=None):
    """Run the steps over t; returns each state's trajectory at every t, (len(t), *shape).

    Each group of equal steps is one :func:`torchgeo_int.solve.solve` with the stepper bound
    once; under a lean grad mode each is its own checkpointed or reversible autograd node with a
    fresh FSAL cache (the parameters resolved, and the closure check made, once).  ``compile``:
    the groups run as ``rollout(..., compile=True)`` does (:mod:`torchgeo_int._compile`).
    ``t``: the times as a tensor that requires grad — each interval then runs on its own, under
    a ``contract.TimeMap`` that carries the gradient to t; ``perturb``/``fresh``/``callback``:
    torchdiffeq's per-step hooks (``contract.StepHooks``); ``progress``: a label, for a tqdm bar
    over the steps."""
    outs = [[x.unsqueeze(0)] for x in states]
    q, p = states[0], (states[1] if len(states) > 1 else None)
    cache, offset = None, 0
    groups = equal_step_runs(times, step_size, torch.finfo(t_dtype).eps)
    if t is not None:   # one interval at a time: each has its own step h_i(t)
        groups = [(i0 + j, 1, n) for i0, m, n in groups for j in range(m)]
    groups = [(i0, m, n, times[i0], times[i0 + m], (times[i0 + m] - times[i0]) / (m * n))
              for i0, m, n in groups]
    mode = grad_mode(grad, **(grad_options or {}))
    step = hooked_step(bind(integrator, system), dict(caller=caller, perturb=perturb, fresh=fresh,
                                                      callback=callback, to_user=to_user))
    bar = None
    if progress is not None:
        bar = progress_bar(sum(m * n for _, m, n, *_ in groups), f"odeint {progress}")
    if groups:   # the parameters are resolved, and the closure check made, once
        mode = mode.with_params(step, system, states, groups[0][3], groups[0][5])
    for i0, m, n, ta, tb, h in groups:
        if t is not None:
            h_t = (t[i0 + 1] - t[i0]).to(caller.dtype) / n
            caller.time_map = TimeMap(t[i0].to(caller.dtype), ta, h_t / h)
            cache = None   # an FSAL force carries the last interval's c: recomputed
        try:
            res, cache = solve(integrator, system, q, p, h=h, steps=m * n, t0=ta, save_every=n,
                               check_every=CHECK_EVERY, grad=mode, compile=compile, step=step,
                               step_offset=offset, cache=cache, return_cache=True, progress=bar)
        finally:
            if t is not None:
                caller.time_map = None
        offset += m * n
        res = res[:len(states)]
        for o, r in zip(outs, res):
            o.append(r[1:])
        q, p = res[0][-1], (res[1][-1] if len(states) > 1 else None)
    if bar is not None:
        bar.close()
    if len(groups) == 1:   # one run: its frames are already the whole output (no copy)
        return tuple(res)
    return tuple(torch.cat(o) for o in outs)


def _step_count(r, tol):
    """Steps for an interval of r step sizes: ceil(r), or k = ⌊r⌋ when r exceeds k by no more
    than t's round-off (``tol``: |Δt| is good to ~eps·|t|, so linspace grids take the step counts
    users expect) nor by 10⁻³·r (a step at most 0.1 % above h: at large |t| the round-off is
    whole steps, and subtracting it dropped them, 1000 steps of h becoming one)."""
    k = math.floor(r)
    return k if k >= 1 and r - k <= min(tol, 1e-3 * r) else max(1, math.ceil(r))


def equal_step_runs(times, step_size, eps):
    """Runs (first interval, number of intervals, steps per interval) of consecutive intervals
    of t that share one step size."""
    N = len(times) - 1
    dts = [times[i + 1] - times[i] for i in range(N)]
    scale = [max(abs(times[i]), abs(times[i + 1])) for i in range(N)]
    if step_size is None:
        ns = [1] * N
    else:
        ns = [_step_count(abs(d) / step_size, 16 * eps * s / step_size) for d, s in zip(dts, scale)]
    groups, i = [], 0
    while i < N:
        j = i + 1
        # one run lands on every t of it to within a few ulps of t, not on the mean of
        # intervals that differ by more (t = [1e6, 1e6 + 1, 1e6 + 3] in float32 landed at 1e6 + 1.5)
        while (j < N and ns[j] == ns[i]
               and abs(dts[j] - dts[i]) <= 2 * eps * max(scale[i], scale[j])):
            j += 1
        groups.append((i, j - i, ns[i]))
        i = j
    return groups
