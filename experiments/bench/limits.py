"""Limits: the configurations users run, side by side with the practical CPU limit.

    python -m experiments.bench.limits [--quick] [--batches 1 64 4096 65536] [--configs ...]
                                       [--sections table training odeint midpoint small compute
                                                  training_compiled]

The limit is a numba ``@njit`` loop (the optional ``bench`` extra: ``pip install
'torchgeo_int[bench]'``): Störmer–Verlet as an FSAL kick–drift–kick loop over the batch, every
state stored into preallocated arrays, the force q/|q|³ in scalars.  Without numba its rows are
skipped (said in the output) and the ratios are to the hand-written torch loop instead.

Kepler (e = 0.6, each trajectory's eccentricity perturbed by ±2 %), h = 0.01, float64, one CPU
thread, **every state kept**; each configuration returns the whole trajectory.  For each batch
size every configuration runs side by side in rounds (best of ``--repeats``, more rounds when the
runs are short), so the ratios compare runs of the same moment of a shared machine.  Rows:

* ``numba loop`` — the limit (the denominator of every ratio); ``numba store only`` copies the
  state into the output, step after step: the memory traffic alone;
* ``torch hand loop`` — the same kick–drift–kick in eager torch, states written straight into
  preallocated outputs (``out=``), the closed-form force of ``common.kepler``: the eager limit;
* ``rollout verlet`` under ``torch.no_grad()``; ``… grad mode on``: the same call without
  ``no_grad`` (nothing requires grad: the README tour's way); ``… compile=True`` both ways;
* ``energies``: ``SeparableHamiltonian(kinetic, potential)`` given as energies only (∂T/∂p and
  ∂V/∂q by autograd), eager and ``compile=True``; ``energies, mass=1``: the kinetic energy
  declared as ``mass=1.0`` (∂T/∂p = p in closed form), ∂V/∂q still by autograd;
* ``yoshida4`` (3 forces a step); ``torchdiffeq rk4`` (4 evaluations a step, one per interval of
  the output grid); ``torchode`` / ``diffrax`` rows when those packages are installed.

Sections besides the table (``--sections``):

* ``training``: one training step (forward + backward + Adam) of a 10-step Verlet rollout loss
  through a ``SeparableHNN`` (batch 256, width 200, float32) against derivative matching of the
  same model on the same batch (all 11 states of each window); both again with the networks'
  forces by autograd instead of in closed form (``MLP.input_grad``), and an eager Verlet
  rollout of a ``SeparableHNN`` at B = 1, 256, 4096 both ways;
* ``odeint``: ``tgi.odeint(func, (q0, p0), t, method="verlet", options=dict(separable=True,
  step_size=h))`` with an analytic ``func`` against a hand loop that calls the same ``func``
  twice a step (the same evaluations), B = 4096, final state only; and torchdiffeq's style,
  ``func(t, y)`` on y (B, 4) with 101 output times, verlet and yoshida4, B = 64 and 4096,
  against a hand loop of the same splitting and func calls keeping y at every output time;
* ``midpoint``: ``implicit_midpoint`` (B = 256, every state kept), eager and ``compile=True``,
  against a per-trajectory numba fixed-point loop (same tolerance, convergence checked every
  iteration, warm start from the last stage derivative);
* ``training_compiled`` (only when asked for): ``training``'s Verlet rollout loss, eager and
  ``compile=True``, forces in closed form and by autograd, with each first call's seconds;
* ``compute`` (only when asked for): B = 4096 and 65536, the numba loop and ``rollout(compile=True)``
  each keeping every state and keeping only the final state, side by side: how much of the
  compiled rollout's time is its arithmetic and how much the stores of every state; and one
  call of a compiled one-op function on a (1, 2) state: torch.compile's own cost per call;
* ``small``: B = 1, ``compile=True`` µs per Verlet step and compile time, with inductor's
  Python wrapper and with its C++ wrapper (``cpp_wrapper``, the library's default on the CPU:
  ``torchgeo_int._compile.CPP_WRAPPER``), final state only and every state kept, as compiled
  loops (the default for small states, ``torchgeo_int._compile.LOOP_MAX_NUMEL``) and as the
  Python loop over compiled blocks they replace; the final-state pair again with Kepler given
  by its energies (forces by autograd; in the loops by ``torch.func.grad``).

Writes results/bench/limits.{md,json}.  ns / step·traj = time / (steps × batch).
"""
from __future__ import annotations

import contextlib
import importlib.util
import math
import time

import numpy as np
import torch

import torchgeo_int as tgi
from torchgeo_int import _compile

from ..cli import number
from . import common
from .common import pick
from .throughput import energy_kepler, grad_V, kepler_batch, warnings_off

H = 0.01
BATCHES = [1, 64, 4096, 65536]
QUICK_BATCHES = [1, 256]
SECTIONS = ["table", "training", "odeint", "midpoint", "small"]
#: sections run only when asked for (--sections): not part of make bench's ten minutes
EXTRA_SECTIONS = ["compute", "training_compiled"]
#: state·steps per run (≈ 0.1–1 s at the limit's speed); steps capped at MAX_STEPS.
WORK, QUICK_WORK, MAX_STEPS, MIN_STEPS = 2 ** 23, 2 ** 14, 2000, 64


def steps_for(batch, quick):
    work = QUICK_WORK if quick else WORK
    return int(max(MIN_STEPS, min(MAX_STEPS if not quick else MIN_STEPS, work // batch)))


def has(module) -> bool:
    return importlib.util.find_spec(module) is not None


NO_NUMBA = ("numba is not installed (pip install 'torchgeo_int[bench]'): the numba rows are "
            "skipped and the ratios are to the torch hand loop")

# ----------------------------------------------------------------------------------------------
# The limit: numba loops


_NUMBA: dict = {}


# The loops, plain Python over numpy arrays: jitted by numba_kernels (and testable without it)


def _kdk(q0, p0, h, steps, qs, ps):
    """Verlet, FSAL: one force a step; state n of trajectory i in qs[n % R, i], ps[n % R, i]
    with R = len(qs): every state when R = steps + 1, the last two alternating when R = 2 (its
    arithmetic without the stores of every state; the final state in row steps % 2)."""
    B, R = q0.shape[0], qs.shape[0]
    g = np.empty((B, 2))
    for i in range(B):
        x, y = q0[i, 0], q0[i, 1]
        r = math.sqrt(x * x + y * y)
        c = 1.0 / (r * r * r)
        g[i, 0], g[i, 1] = x * c, y * c
        qs[0, i, 0], qs[0, i, 1], ps[0, i, 0], ps[0, i, 1] = x, y, p0[i, 0], p0[i, 1]
    a = 0.5 * h
    for n in range(steps):
        j, k = n % R, (n + 1) % R
        for i in range(B):
            px = ps[j, i, 0] - a * g[i, 0]
            py = ps[j, i, 1] - a * g[i, 1]
            x = qs[j, i, 0] + h * px
            y = qs[j, i, 1] + h * py
            r = math.sqrt(x * x + y * y)
            c = 1.0 / (r * r * r)
            gx, gy = x * c, y * c
            g[i, 0], g[i, 1] = gx, gy
            qs[k, i, 0], qs[k, i, 1] = x, y
            ps[k, i, 0], ps[k, i, 1] = px - a * gx, py - a * gy


def _store(q0, p0, steps, qs, ps):
    """The same stores and loads, no arithmetic: the memory traffic of keeping every state."""
    qs[0], ps[0] = q0, p0
    for n in range(steps):
        for i in range(q0.shape[0]):
            qs[n + 1, i, 0], qs[n + 1, i, 1] = qs[n, i, 0], qs[n, i, 1]
            ps[n + 1, i, 0], ps[n + 1, i, 1] = ps[n, i, 0], ps[n, i, 1]


def _midpoint(q0, p0, h, steps, tol, max_iter, qs, ps):
    """Implicit midpoint per trajectory: k = X_H(z + h/2 k) by fixed point (warm start from
    the last k; stop when max(|Δk_q|∞/(1+|k_q|∞), |Δk_p|∞/(1+|k_p|∞)) ≤ tol), z += h k.
    Returns the total number of iterations (-1 if some step did not converge)."""
    total = 0
    for i in range(q0.shape[0]):
        x, y, u, v = q0[i, 0], q0[i, 1], p0[i, 0], p0[i, 1]
        qs[0, i, 0], qs[0, i, 1], ps[0, i, 0], ps[0, i, 1] = x, y, u, v
        r = math.sqrt(x * x + y * y)
        c = 1.0 / (r * r * r)
        kx, ky, ku, kv = u, v, -x * c, -y * c
        for n in range(steps):
            done = False
            for _ in range(max_iter):
                mx, my = x + 0.5 * h * kx, y + 0.5 * h * ky
                nkx, nky = u + 0.5 * h * ku, v + 0.5 * h * kv
                r = math.sqrt(mx * mx + my * my)
                c = 1.0 / (r * r * r)
                nku, nkv = -mx * c, -my * c
                dq = max(abs(nkx - kx), abs(nky - ky)) / (1.0 + max(abs(kx), abs(ky)))
                dp = max(abs(nku - ku), abs(nkv - kv)) / (1.0 + max(abs(ku), abs(kv)))
                kx, ky, ku, kv = nkx, nky, nku, nkv
                total += 1
                if max(dq, dp) <= tol:
                    done = True
                    break
            if not done:
                return -1
            x, y, u, v = x + h * kx, y + h * ky, u + h * ku, v + h * kv
            qs[n + 1, i, 0], qs[n + 1, i, 1], ps[n + 1, i, 0], ps[n + 1, i, 1] = x, y, u, v
    return total


def numba_kernels():
    """The jitted loops (compiled once per process; numba must be installed)."""
    if _NUMBA:
        return _NUMBA
    import numba
    jit = numba.njit(cache=False)
    kdk, store, midpoint = jit(_kdk), jit(_store), jit(_midpoint)
    _NUMBA.update(kdk=kdk, store=store, midpoint=midpoint)
    z = np.zeros((1, 2))
    q, p = np.array([[0.4, 0.0]]), np.array([[0.0, 2.0]])
    kdk(q, p, H, 1, np.zeros((2, 1, 2)), np.zeros((2, 1, 2)))      # compile outside the timings
    store(z, z, 1, np.zeros((2, 1, 2)), np.zeros((2, 1, 2)))
    midpoint(q, p, H, 1, 1e-13, 100, np.zeros((2, 1, 2)), np.zeros((2, 1, 2)))
    return _NUMBA


def _np_out(q0, steps):
    return np.empty((steps + 1, *q0.shape)), np.empty((steps + 1, *q0.shape))


def numba_verlet(q0, p0, steps):
    qs, ps = _np_out(q0, steps)
    numba_kernels()["kdk"](q0.numpy(), p0.numpy(), H, steps, qs, ps)
    return torch.from_numpy(qs), torch.from_numpy(ps)


def numba_verlet_final(q0, p0, steps):
    """The same loop keeping the last two states only; returns the final one as (1, B, 2)."""
    qs, ps = _np_out(q0, 1)
    numba_kernels()["kdk"](q0.numpy(), p0.numpy(), H, steps, qs, ps)
    return torch.from_numpy(qs[steps % 2][None]), torch.from_numpy(ps[steps % 2][None])


def numba_store(q0, p0, steps):
    qs, ps = _np_out(q0, steps)
    numba_kernels()["store"](q0.numpy(), p0.numpy(), steps, qs, ps)
    return torch.from_numpy(qs), torch.from_numpy(ps)


def numba_midpoint(q0, p0, steps, max_iter=100):
    qs, ps = _np_out(q0, steps)
    tol = tgi.default_tol(torch.float64)
    its = numba_kernels()["midpoint"](q0.numpy(), p0.numpy(), H, steps, tol, max_iter, qs, ps)
    if its < 0:
        raise tgi.ConvergenceError("the numba midpoint loop did not converge", iterations=max_iter,
                                   residual=float("nan"), tol=tol)
    return torch.from_numpy(qs), torch.from_numpy(ps)


# ----------------------------------------------------------------------------------------------
# The torch configurations (each returns every state: (steps + 1, B, 2) twice)


def hand_torch(q0, p0, steps):
    """FSAL kick–drift–kick in eager torch, each state written into the output (out=), the
    output allocated as numpy's (huge pages, like the numba loop's and the rollouts' buffers:
    storing into fresh torch memory costs ≈ 1.5× more per state at B ≥ 4096)."""
    qs = torch.from_numpy(np.empty((steps + 1, *q0.shape)))
    ps = torch.from_numpy(np.empty((steps + 1, *q0.shape)))
    qs[0], ps[0] = q0, p0
    g = grad_V(q0)
    for n in range(steps):
        ph = torch.add(ps[n], g, alpha=-0.5 * H)
        torch.add(qs[n], ph, alpha=H, out=qs[n + 1])
        g = grad_V(qs[n + 1])
        torch.add(ph, g, alpha=-0.5 * H, out=ps[n + 1])
    return qs, ps


def flat_field(system):
    return common.FlatField(system, (2,))


def configurations(system, names=None):
    """name -> (fn(q0, p0, steps) -> (qs, ps), no_grad).  ``system``: the closed-form Kepler."""
    energies = energy_kepler()

    def ours(method, compile=False, sys=system):
        def run(q0, p0, steps):
            return tgi.rollout(sys, q0, p0, h=H, steps=steps, method=method, compile=compile)
        return run

    out = {}
    if has("numba"):
        out["numba loop"] = (numba_verlet, True)
        out["numba store only"] = (numba_store, True)
    out["torch hand loop"] = (hand_torch, True)
    out["rollout verlet"] = (ours("verlet"), True)
    out["rollout verlet, grad mode on"] = (ours("verlet"), False)
    out["rollout verlet compile=True"] = (ours("verlet", compile=True), True)
    out["rollout verlet compile=True, grad mode on"] = (ours("verlet", compile=True), False)
    out["energies (autograd forces)"] = (ours("verlet", sys=energies), True)
    out["energies compile=True"] = (ours("verlet", compile=True, sys=energies), True)
    out["energies, mass=1 (autograd ∂V/∂q only)"] = (ours("verlet", sys=energy_kepler(mass=True)), True)
    out["rollout yoshida4"] = (ours("yoshida4"), True)

    def rk4(q0, p0, steps):
        func = flat_field(system)
        t = torch.arange(steps + 1, dtype=q0.dtype) * H
        import torchdiffeq
        ys = torchdiffeq.odeint(func, func.flatten(q0, p0), t, method="rk4")
        return func.unflatten(ys)
    out["torchdiffeq rk4"] = (rk4, True)

    if has("torchode"):
        out["torchode rk4"] = (torchode_rk4(system), True)
    if has("diffrax") and has("jax"):
        out["diffrax SemiImplicitEuler (JAX, jit)"] = (diffrax_semi_implicit(), True)
    return pick(out, names)


def torchode_rk4(system):
    """torchode's fixed-step RK4 on the flat field, every state on the grid (its own loop)."""
    import torchode

    def run(q0, p0, steps):
        func = flat_field(system)
        y0 = func.flatten(q0, p0)
        t = (torch.arange(steps + 1, dtype=q0.dtype) * H).expand(y0.shape[0], -1)
        term = torchode.ODETerm(lambda t, y: func(t, y))
        solver = torchode.AutoDiffAdjoint(torchode.RK4(term), torchode.FixedStepController())
        sol = solver.solve(torchode.InitialValueProblem(y0=y0, t_eval=t), dt0=torch.full((y0.shape[0],), H, dtype=q0.dtype))
        return func.unflatten(sol.ys.transpose(0, 1))
    return run


def diffrax_semi_implicit():
    """diffrax's SemiImplicitEuler (JAX, jit, float64), the whole batch as one state, every
    step saved.  (Not Verlet: diffrax has no Störmer–Verlet; the issue's reference row.)"""
    import jax
    import diffrax

    jax.config.update("jax_enable_x64", True)
    cache = {}

    def run(q0, p0, steps):
        key = (tuple(q0.shape), steps)
        if key not in cache:
            def fq(t, p, args):
                return p

            def fp(t, q, args):
                r = jax.numpy.linalg.norm(q, axis=-1, keepdims=True)
                return -q / r ** 3
            terms = (diffrax.ODETerm(fq), diffrax.ODETerm(fp))

            @jax.jit
            def solve(q, p):
                return diffrax.diffeqsolve(terms, diffrax.SemiImplicitEuler(), 0.0, steps * H, H,
                                           (q, p), saveat=diffrax.SaveAt(steps=True),
                                           max_steps=steps).ys
            cache[key] = solve
        qs, ps = cache[key](q0.numpy(), p0.numpy())
        qs, ps = torch.from_numpy(np.asarray(qs)), torch.from_numpy(np.asarray(ps))
        return torch.cat([q0[None], qs]), torch.cat([p0[None], ps])
    return run


# ----------------------------------------------------------------------------------------------
# Measuring


def _ctx(no_grad):
    return torch.no_grad() if no_grad else contextlib.nullcontext()


def side_by_side(confs, q0, p0, steps, repeats, budget=1.0, every=True):
    """{name: dict(seconds, first_call_s, rounds, max_diff)}: a warm-up (compile) call of each,
    then rounds of all of them — ``repeats``, or more (up to 30) while a round takes less than
    ``budget`` / rounds seconds; max_diff: max |Δ| from the first config's states (every state
    kept with ``every``, else the final state)."""
    rows, ref = {}, None
    with warnings_off():
        for name, (fn, no_grad) in confs.items():
            with _ctx(no_grad):
                (qs, ps), s = common.timed(lambda: fn(q0, p0, steps))
            if every and qs.shape[0] != steps + 1:
                raise AssertionError(f"{name}: {qs.shape[0]} states, expected {steps + 1}")
            # every state against the first config's (a compiled every-state rollout that wrote
            # a wrong row would pass a final-state check); else the final state
            out = (qs, ps) if every else (qs[-1], ps[-1])
            if ref is None:
                ref = out
            diff = float(torch.maximum((out[0] - ref[0]).abs().max(), (out[1] - ref[1]).abs().max()))
            rows[name] = dict(first_call_s=s, max_diff=diff, requires_grad=bool(qs.requires_grad))
            del qs, ps
        best = {name: math.inf for name in confs}
        done, rounds = 0, repeats
        while done < rounds:
            spent = 0.0
            for name, (fn, no_grad) in confs.items():
                with _ctx(no_grad):
                    out, s = common.timed(lambda: fn(q0, p0, steps))
                del out
                best[name], spent = min(best[name], s), spent + s
            done += 1
            if done == 1:
                rounds = min(30, max(repeats, math.ceil(budget / max(spent, 1e-3))))
    for name, r in rows.items():
        r.update(seconds=best[name], rounds=rounds)
    return rows


def table(args):
    batches = args.batches or (QUICK_BATCHES if args.quick else BATCHES)
    rows = []
    for batch in common.progress(batches, args=args, desc="limits"):
        system, q0, p0 = kepler_batch(batch)
        steps = args.steps or steps_for(batch, args.quick)
        confs = configurations(system, args.configs)
        res = side_by_side(confs, q0, p0, steps, args.repeats)
        if args.no_progress:
            print(f"limits: batch {batch} done ({steps} steps)", flush=True)
        den = "numba loop" if "numba loop" in res else "torch hand loop"
        for name, r in res.items():
            rows.append(dict(config=name, batch=batch, steps=steps, **r,
                             ns=1e9 * r["seconds"] / (steps * batch),
                             ratio=r["seconds"] / res[den]["seconds"] if den in res else None,
                             denominator=den))
    return rows


def pivot(rows, key="ratio"):
    """Configuration rows × batch columns: the limit in ns, the others as ×ratio."""
    batches = sorted({r["batch"] for r in rows})
    by = {(r["config"], r["batch"]): r for r in rows}
    names = list(dict.fromkeys(r["config"] for r in rows))
    den = rows[0]["denominator"] if rows else "numba loop"
    lines = ["| configuration | " + " | ".join(f"B = {b}" for b in batches) + " |",
             "|---" * (len(batches) + 1) + "|"]
    for name in names:
        cells = []
        for b in batches:
            r = by.get((name, b))
            if r is None:
                cells.append("—")
            elif name == den:
                cells.append(f"{r['ns']:.3g} ns")
            else:
                x = r[key]
                cells.append(f"×{x:,.0f}" if x >= 100 else f"×{x:.3g}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def training(args):
    """ms per training step: 10-step Verlet rollout loss vs derivative matching, SeparableHNN."""
    from torchgeo_int import nn as tnn

    from . import training_cost as tc

    batch, window, width = (32, 3, 32) if args.quick else (256, 10, 200)
    data = tc.make_data(batch, window)
    make = lambda: tnn.SeparableHNN(1, width=width, depth=2)  # noqa: E731
    slow = lambda: autograd_forces(make())                   # noqa: E731
    derivative = lambda m, d: tc.derivative_loss(m, d[0], d[1], d[2], d[3])  # noqa: E731
    verlet = lambda m, d: tc.rollout_loss(m, "verlet", d[0], d[1])         # noqa: E731
    confs = {"derivative matching": (make, derivative), "rollout loss, verlet": (make, verlet),
             "derivative matching, autograd forces": (slow, derivative),
             "rollout loss, verlet, autograd forces": (slow, verlet)}
    repeats = 2 if args.quick else 7
    rows, best = [], {}
    for _ in range(1 if args.quick else 2):       # two interleaved passes: best of both
        for name, (model, loss) in confs.items():
            r = tc.measure(name, model, loss, data, repeats, "cpu")
            best[name] = min(best.get(name, math.inf), r["ms_per_step"])
    for name in confs:
        rows.append(dict(config=name, ms_per_step=best[name],
                         vs_derivative=best[name] / best["derivative matching"]))
    setup = (f"SeparableHNN(1, width={width}, depth=2), pendulum windows: batch {batch}, "
             f"{window} steps of dt = {tc.DT}, float32, one training step = loss, backward, Adam")
    return setup, rows


def training_compiled(args):
    """ms per training step of :func:`training`'s Verlet rollout loss, eager and
    ``compile=True``, the forces in closed form and by autograd (compiled: ``torch.func.grad``
    in the graph, differentiated by the outer backward), side by side in rounds; the first
    call (compile and one step) in seconds; each loss at the first step against eager's."""
    from torchgeo_int import nn as tnn

    from . import training_cost as tc

    batch, window, width = (32, 3, 32) if args.quick else (256, 10, 200)
    data = tc.make_data(batch, window)
    confs = {f"{forces}, {'compile=True' if c else 'eager'}": (forces, c)
             for forces in ("closed form", "autograd") for c in (False, True)}
    steps, first, loss0, failed = {}, {}, {}, {}
    for name, (forces, c) in confs.items():
        torch.manual_seed(0)
        model = tnn.SeparableHNN(1, width=width, depth=2).to(data[0].dtype)
        model = autograd_forces(model) if forces == "autograd" else model
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step(model=model, opt=opt, c=c):
            opt.zero_grad(set_to_none=True)
            loss = tc.rollout_loss(model, "verlet", data[0], data[1], compile=c)
            loss.backward()
            opt.step()
            return float(loss.detach())

        t = time.perf_counter()
        with warnings_off():
            loss0[name] = step()
        first[name], steps[name] = time.perf_counter() - t, step
        failed[name] = c and _compile._kernels(tgi.METHODS["verlet"], model).failed
    best = {}
    for _ in range(2 if args.quick else 3):     # rounds: every configuration in each
        for name, step in steps.items():
            _, s = common.min_time(step, 2 if args.quick else 5)
            best[name] = min(best.get(name, math.inf), s)
    den = best["closed form, eager"]
    rows = [dict(config=name, ms_per_step=1e3 * best[name], ratio=best[name] / den,
                 first_call_s=first[name],
                 loss_diff=abs(loss0[name] - loss0[f"{confs[name][0]}, eager"]),
                 ran=(f"eagerly ({failed[name]})" if failed[name]
                      else "compiled" if confs[name][1] else "eagerly"))
            for name in confs]
    setup = (f"SeparableHNN(1, width={width}, depth=2), pendulum windows: batch {batch}, "
             f"{window} Verlet steps of dt = {tc.DT}, float32, one training step = loss, "
             "backward, Adam")
    return setup, rows


class _Energy(torch.nn.Module):
    """An energy module without the closed-form protocol (``closed_form_grad``/``input_grad``):
    ``SeparableHamiltonian`` takes its gradient by autograd."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x)


def autograd_forces(model):
    """A ``SeparableHNN``'s networks as ``SeparableHamiltonian(T, V)`` with ∂T/∂p and ∂V/∂q by
    autograd (the path before the closed-form forces of ``MLP.input_grad``), for side-by-side
    rows; the parameters are the model's."""
    return tgi.SeparableHamiltonian(_Energy(model.kinetic), _Energy(model.potential),
                                    time_dependent=False)


def hnn_rollouts(args):
    """µs per eager Verlet step of a ``SeparableHNN`` (width 200, float32), every state kept,
    no_grad: closed-form forces against autograd's, side by side, B = 1, 256, 4096; for the
    MLPs of the state (dim 2) and for V_θ = MLP(|q₁ − q₂|) of two bodies in the plane (dim 4,
    ``PairDistances(2, 2)``: its ``input_vjp`` pulls the MLP's closed-form gradient back)."""
    from torchgeo_int import nn as tnn

    width = 32 if args.quick else 200
    nets = {"": lambda: tnn.SeparableHNN(2, width=width),
            "|q₁ − q₂| features, ": lambda: tnn.SeparableHNN(
                4, width=width, potential_features=tnn.PairDistances(2, 2))}
    rows = []
    for batch in ([1, 64] if args.quick else [1, 256, 4096]):
        steps = 16 if args.quick else max(16, min(200, 2 ** 16 // batch))
        run = lambda system: (lambda q, p, n: tgi.rollout(system, q, p, h=0.1, steps=n))  # noqa: E731
        for net, make in nets.items():
            torch.manual_seed(0)
            model = make().float()
            q0, p0 = (0.5 * torch.randn(batch, model.dim, dtype=torch.float32) for _ in range(2))
            closed = f"{net}closed-form forces"
            confs = {closed: (run(model), True),
                     f"{net}autograd forces": (run(autograd_forces(model)), True)}
            res = side_by_side(confs, q0, p0, steps, args.repeats)
            for name, r in res.items():
                rows.append(dict(batch=batch, config=name, steps=steps,
                                 us=1e6 * r["seconds"] / steps,
                                 ratio=r["seconds"] / res[closed]["seconds"],
                                 max_diff=r["max_diff"]))
    return rows


def odeint_vs_hand(args):
    batch = 256 if args.quick else 4096
    steps = 64 if args.quick else 2000
    _, q0, p0 = kepler_batch(batch)

    def func(t, y):
        q, p = y
        return p, -grad_V(q)

    def hand(q, p, n):
        t = torch.zeros((), dtype=q.dtype)
        dp = func(t, (q, p))[1]                    # two calls a step, as odeint's (FSAL)
        for _ in range(n):
            p = torch.add(p, dp, alpha=0.5 * H)
            q = torch.add(q, func(t, (q, p))[0], alpha=H)
            dp = func(t, (q, p))[1]
            p = torch.add(p, dp, alpha=0.5 * H)
        return q[None], p[None]

    def ode(q, p, n):
        t = torch.tensor([0.0, n * H], dtype=q.dtype)
        return tgi.odeint(func, (q, p), t, method="verlet", options=dict(separable=True, step_size=H))

    res = side_by_side({"hand loop, func twice a step": (hand, True),
                        "tgi.odeint verlet separable": (ode, True)}, q0, p0, steps,
                       2 if args.quick else 7, every=False)
    return batch, steps, res


def kepler_y_field(t, y):
    """torchdiffeq's style: one tensor y = (q, p) along the last dim, dy returned whole."""
    q, p = y[..., :2], y[..., 2:]
    return torch.cat([p, -grad_V(q)], -1)


def odeint_flat_vs_hand(args):
    """Rows of ``tgi.odeint(kepler_y_field, y0, t, method, options=dict(separable=True,
    step_size=h))`` with y0 (B, 4) and 101 output times, against a hand loop of the same
    splitting that calls the same func on the full state as often (FSAL) and keeps y at every
    output time."""
    out, n_out = [], 101
    for batch in ([256] if args.quick else [64, 4096]):
        _, q0, p0 = kepler_batch(batch)
        for method in ("verlet", "yoshida4"):
            kicks, drifts = tgi.METHODS[method].splitting()
            per = 1 if args.quick else (20 if batch == 64 else 4) // (1 + (method != "verlet"))
            t = torch.linspace(0.0, (n_out - 1) * per * H, n_out, dtype=q0.dtype)

            def hand(q, p, _n, kicks=kicks, drifts=drifts, per=per):
                t0 = torch.zeros((), dtype=q.dtype)
                ys = [torch.cat([q, p], -1)]
                force = kepler_y_field(t0, torch.cat([q, p], -1))[..., 2:]
                for _ in range(n_out - 1):
                    for _ in range(per):
                        for j, b in enumerate(drifts):
                            if j > 0:
                                force = kepler_y_field(t0, torch.cat([q, p], -1))[..., 2:]
                            p = torch.add(p, force, alpha=kicks[j] * H)
                            q = torch.add(q, kepler_y_field(t0, torch.cat([q, p], -1))[..., :2],
                                          alpha=b * H)
                        force = kepler_y_field(t0, torch.cat([q, p], -1))[..., 2:]
                        p = torch.add(p, force, alpha=kicks[-1] * H)
                    ys.append(torch.cat([q, p], -1))
                y = torch.stack(ys)
                return y[..., :2], y[..., 2:]

            def ode(q, p, _n, method=method, t=t):
                y = tgi.odeint(kepler_y_field, torch.cat([q, p], -1), t, method=method,
                               options=dict(separable=True, step_size=H))
                return y[..., :2], y[..., 2:]

            res = side_by_side({"hand": (hand, True), "odeint": (ode, True)}, q0, p0,
                               (n_out - 1) * per, 2 if args.quick else 7, every=False)
            out.append(dict(config=f"{method}, B = {batch}", steps=(n_out - 1) * per,
                            hand_ms=1e3 * res["hand"]["seconds"],
                            odeint_ms=1e3 * res["odeint"]["seconds"],
                            ratio=res["odeint"]["seconds"] / res["hand"]["seconds"],
                            max_diff=res["odeint"]["max_diff"]))
    return out


def midpoint(args):
    batch, steps = (16, 16) if args.quick else (256, 500)
    system, q0, p0 = kepler_batch(batch)

    def ours(compile):
        return lambda q, p, n: tgi.rollout(system, q, p, h=H, steps=n, method="implicit_midpoint",
                                           compile=compile)
    confs = {}
    if has("numba"):
        confs["numba per-trajectory fixed point"] = (numba_midpoint, True)
    confs["rollout implicit_midpoint"] = (ours(False), True)
    confs["rollout implicit_midpoint compile=True"] = (ours(True), True)
    res = side_by_side(confs, q0, p0, steps, 2 if args.quick else 5)
    return batch, steps, res


def compute(args):
    """Where the time of a compiled every-state rollout goes, B = 4096 and 65536: the numba loop
    and ``rollout(compile=True)`` each keeping every state and keeping only the final state (the
    arithmetic alone), side by side in the same rounds; ratios to the every-state numba loop.
    Returns (rows, K), K the compiled block's steps."""
    rows = []
    for batch in ([256] if args.quick else [4096, 65536]):
        system, q0, p0 = kepler_batch(batch)
        K = _compile.default_block(tgi.METHODS["verlet"], system)
        steps = args.steps or steps_for(batch, args.quick)
        steps = max(K, steps - steps % K)      # whole compiled blocks in both rollouts

        def ours(save_every):
            return lambda q0, p0, n: tgi.rollout(system, q0, p0, h=H, steps=n, method="verlet",
                                                 compile=True, save_every=save_every or n)
        confs = {"numba loop, every state": (numba_verlet, True),
                 "numba loop, final state only": (numba_verlet_final, True),
                 "rollout compile=True, every state": (ours(1), True),
                 "rollout compile=True, final state only": (ours(None), True)}
        res = side_by_side(confs, q0, p0, steps, args.repeats, every=False)
        den = res["numba loop, every state"]["seconds"]
        rows += [dict(config=name, batch=batch, steps=steps, ns=1e9 * r["seconds"] / (steps * batch),
                      ratio=r["seconds"] / den, max_diff=r["max_diff"]) for name, r in res.items()]
    return rows, K


def small(args):
    """B = 1, compile=True: µs per Verlet step and compile seconds, the rows of ``SMALL_ROWS``
    (a fresh system each, so each compiles its own graphs; inductor's caches pointed at an empty
    folder).  Their first calls run in this process, after whatever compiled before (under
    ``make bench`` the table's B = 1 rows): the one-time start-up of torch.compile is not in them
    but in the first row's.  What a user's first ``compile=True`` call costs is
    :func:`cold_first_call`'s, in a fresh process."""
    import os
    import tempfile

    steps = 64 if args.quick else 2000
    rows = []
    old_dir = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory() as cold:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cold
        try:
            with torch._inductor.config.patch(fx_graph_cache=False):
                _small_rows(args, steps, rows)
        finally:
            if old_dir is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = old_dir
    return steps, rows


def cold_first_call(steps) -> tuple[float, str | None]:
    """(s, error): the first ``rollout(compile=True)`` call in a fresh Python process with an
    empty inductor cache — Kepler at B = 1, ``steps`` Verlet steps, the final state, the
    library's defaults (compiled loops, C++ wrapper): what a user's first call pays, torch.compile's
    one-time start-up included (the imports not)."""
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path
    code = ("import time, torch, torchgeo_int as tgi\n"
            "from experiments.bench.throughput import kepler_batch\n"
            "torch.set_num_threads(1)\n"
            "system, q0, p0 = kepler_batch(1)\n"
            "t0 = time.perf_counter()\n"
            "with torch.no_grad():\n"
            f"    tgi.rollout(system, q0, p0, h={H}, steps={steps}, compile=True)\n"
            "print(time.perf_counter() - t0)\n")
    root = str(Path(__file__).resolve().parents[2])
    with tempfile.TemporaryDirectory() as cold:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cold, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        try:
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                 text=True, timeout=600, cwd=root)
        except subprocess.TimeoutExpired:
            return math.nan, "timed out after 600 s"
    if out.returncode:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return math.nan, f"exit {out.returncode}: {tail[:200]}"
    return float(out.stdout.strip().splitlines()[-1]), None


def _call_floor(args, calls=1000):
    """(µs, error): µs per call of a compiled function that adds 1 to a (1, 2) state, compiled
    as compile=True compiles its graphs (fullgraph, ``_compile._inductor_options``, so with the
    C++ wrapper where the library uses it): the per-call cost of torch.compile itself, which a
    block of K steps spreads over K (the best of 2 or 5 runs of ``calls`` calls).  A compile
    that fails (e.g. no C++ compiler for the wrapper) gives (nan, the reason)."""
    x = torch.zeros(1, 2, dtype=torch.float64)
    try:
        fn = torch.compile(lambda y: y + 1.0, fullgraph=True,
                           options=_compile._inductor_options("cpu", x.numel()))
        with torch.no_grad(), warnings_off():
            fn(x)

            def many():
                for _ in range(calls):
                    fn(x)
            _, s = common.min_time(many, 2 if args.quick else 5)
    except Exception as e:  # noqa: BLE001 — reported in the table, as _small_rows does
        return math.nan, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return 1e6 * s / calls, None


@contextlib.contextmanager
def _settings(**values):
    """compile=True's settings in ``torchgeo_int._compile`` (``CPP_WRAPPER``: inductor's C++
    wrapper or its Python one, read when a graph is first compiled; ``LOOP_MAX_NUMEL``: 0 runs
    small states as a Python loop over compiled blocks, not compiled loops) for the block."""
    old = {name: getattr(_compile, name) for name in values}
    for name, value in values.items():
        setattr(_compile, name, value)
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(_compile, name, value)


#: the small section's rows: (C++ wrapper, every state kept, compiled loops[, Kepler from its
#: energies]); beside each loop row with the C++ wrapper (the default) the blocks the loops replace
SMALL_ROWS = [(False, False, True), (True, False, True), (True, False, False),
              (True, True, True), (True, True, False),
              (True, False, True, True), (True, False, False, True)]


def _small_rows(args, steps, rows):
    for wrapper, every, loop, *energies in SMALL_ROWS:
        system, q0, p0 = kepler_batch(1)
        energies = bool(energies and energies[0])
        if energies:    # ∂T/∂p and ∂V/∂q by autograd (the loops: by torch.func.grad)
            system = energy_kepler()
        save = 1 if every else steps

        def run(q, p, n, system=system, save=save):
            return tgi.rollout(system, q, p, h=H, steps=n, save_every=save, compile=True)
        loops = _compile.LOOP_MAX_NUMEL if loop else 0
        with _settings(CPP_WRAPPER=wrapper, LOOP_MAX_NUMEL=loops), torch.no_grad(), warnings_off():
            try:
                _, first = common.timed(lambda: run(q0, p0, steps))
                _, s = common.min_time(lambda: run(q0, p0, steps), 2 if args.quick else 7)
                # compile=True falls back to eager (with a warning, silenced here) when a
                # graph does not compile: say so, the row timed the eager step then
                kernels = _compile._kernels(tgi.METHODS["verlet"], system)
                err = None if kernels.failed is None else f"ran eagerly: {kernels.failed}"
                if err is None and loop and kernels.loop_failed:
                    err = f"ran blocks: the loop failed: {kernels.loop_failed}"
            except Exception as e:  # noqa: BLE001 — report (e.g. no C++ compiler for the wrapper)
                first = s = math.nan
                err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        rows.append(dict(system="energies" if energies else "closed form", cpp_wrapper=wrapper,
                         states="every" if every else "final",
                         how="compiled loops" if loop else "blocks",
                         us_per_step=1e6 * s / steps, first_call_s=first, error=err))


# ----------------------------------------------------------------------------------------------


def store_layouts(args, m=2, K=16):
    """What storing costs a compiled block whose states are batch-innermost (the CPU blocks'
    layout, ``_compile.batch_inner``): K steps of a stand-in step x ↦ x·c on x of shape (m, B)
    compiled into one graph that writes each state into a row of a fresh (steps, …) output, in
    three ways — a row-major row (B, m) by ``copy_(x.t())`` (a transposing copy: the blocks'
    way before ``row_major_state``), a batch-innermost row (m, B) by a plain copy (no
    transposition: the floor), and a row-major row by ``_compile.row_major_state`` (the state
    stored once, then a chain of ``torch.where`` over the m components: the blocks' way now).
    ns per value stored (m values a state·trajectory), best of the rounds, side by side."""
    batch = 256 if args.quick else 4096
    steps = K * (4 if args.quick else 64)
    x0 = torch.randn(m, batch, dtype=torch.float64)
    ways = {"row-major rows, transposed copy": ((batch, m), lambda x: x.t()),
            "batch-innermost rows, plain copy (no transposition)": ((m, batch), lambda x: x),
            "row-major rows, row_major_state (torch.where over the components)":
                ((batch, m), lambda x: _compile.row_major_state(x.t()))}
    runs = {}
    for name, (shape, form) in ways.items():
        def block(x, *rows, form=form):
            for j in range(K):
                x = x * 1.0000001
                rows[j].copy_(form(x))
            return x
        compiled = torch.compile(block, dynamic=False)

        def run(_q, _p, _n, shape=shape, compiled=compiled):
            out = torch.from_numpy(np.empty((steps, *shape)))
            x = x0
            for i in range(0, steps, K):
                x = compiled(x, *out[i:i + K].unbind(0))
            rows = out if shape[0] == batch else out.transpose(1, 2)    # (steps, B, m) views
            return rows, rows
        runs[name] = (run, True)
    res = side_by_side(runs, x0, x0, steps, args.repeats, every=False)
    return [dict(config=name, batch=batch, m=m, steps=steps, max_diff=r["max_diff"],
                 ns_per_value=1e9 * r["seconds"] / (steps * batch * m)) for name, r in res.items()]


def main(argv=None):
    ap = common.parser(__doc__)
    ap.add_argument("--batches", type=number("int", 1), nargs="+", default=None)
    ap.add_argument("--configs", nargs="+", default=None, help="a subset of the table's rows")
    ap.add_argument("--steps", type=number("int", 1), default=None, help="steps per run (default: by batch)")
    ap.add_argument("--repeats", type=number("int", 1), default=None)
    ap.add_argument("--sections", nargs="+", choices=SECTIONS + EXTRA_SECTIONS, default=SECTIONS)
    args = ap.parse_args(argv)
    out = common.setup(args)
    args.repeats = args.repeats or (2 if args.quick else 3)
    t0 = time.perf_counter()
    numba_note = "" if has("numba") else f"**{NO_NUMBA}.**\n\n"
    data, sections = dict(numba=has("numba")), []
    if "table" in args.sections:
        rows = table(args)
        data["table"] = rows
        den = rows[0]["denominator"]
        md = pivot(rows)
        detail = common.markdown_table(rows, [
            ("batch", "batch"), ("config", "configuration"), ("steps", "steps"),
            ("rounds", "rounds"), ("ns", "ns / step·traj"), ("ratio", f"× {den}"),
            ("first_call_s", "first call s"), ("max_diff", "max |Δ| vs first row, every state"),
            ("requires_grad", "output requires grad")])
        sections += [("Every state kept: ratios to the " + den, numba_note + md),
                     ("Detail", detail)]
        print(md)
    if "training" in args.sections:
        setup, rows = training(args)
        data["training"] = dict(setup=setup, rows=rows)
        md = setup + "\n\n" + common.markdown_table(rows, [
            ("config", "loss"), ("ms_per_step", "ms / training step"),
            ("vs_derivative", "× derivative matching")])
        rows = hnn_rollouts(args)
        data["hnn_rollouts"] = rows
        md2 = (f"Eager Verlet rollout of a `SeparableHNN(2, width={32 if args.quick else 200})`, "
               "and of one of dim 4 whose V_θ is an MLP of |q₁ − q₂| (`PairDistances(2, 2)`), "
               "float32, every state kept, no_grad (ratios to that network's closed form):\n\n" + common.markdown_table(rows, [
                   ("batch", "batch"), ("config", "forces"), ("steps", "steps"),
                   ("us", "µs / step"), ("ratio", "× closed form"),
                   ("max_diff", "max |Δ|, every state")]))
        sections.append(("Training step (forward + backward + Adam)", md + "\n\n" + md2))
        print(md + "\n\n" + md2)
    if "training_compiled" in args.sections:
        setup, rows = training_compiled(args)
        data["training_compiled"] = dict(setup=setup, rows=rows)
        md = setup + "\n\n" + common.markdown_table(rows, [
            ("config", "forces, steps"), ("ms_per_step", "ms / training step"),
            ("ratio", "× closed form, eager"), ("first_call_s", "first call s"),
            ("loss_diff", "|Δ loss| vs eager, first step"), ("ran", "steps ran")])
        sections.append(("Training step, eager and compiled", md))
        print(md)
    if "odeint" in args.sections:
        batch, steps, res = odeint_vs_hand(args)
        data["odeint"] = dict(batch=batch, steps=steps, rows=res)
        hand, ode = res.values()
        md = (f"Kepler, B = {batch}, {steps} steps of h = {H}, final state only, float64: "
              f"hand loop {1e3 * hand['seconds']:.1f} ms, odeint {1e3 * ode['seconds']:.1f} ms, "
              f"ratio **{ode['seconds'] / hand['seconds']:.3f}** (max |Δ| {ode['max_diff']:.1e}).")
        flat = odeint_flat_vs_hand(args)
        data["odeint"]["flat"] = flat
        md += ("\n\ntorchdiffeq's style, `func(t, y)` on y (B, 4), 101 output times, "
               "`separable=True`, every output kept, float64:\n\n" + common.markdown_table(flat, [
                   ("config", "method, batch"), ("steps", "steps"), ("hand_ms", "hand loop ms"),
                   ("odeint_ms", "odeint ms"), ("ratio", "ratio"), ("max_diff", "max |Δ|")]))
        sections.append(("odeint vs the same-evaluations hand loop", md))
        print(md)
    if "midpoint" in args.sections:
        batch, steps, res = midpoint(args)
        data["midpoint"] = dict(batch=batch, steps=steps, rows=res)
        den = next(iter(res))
        md = f"Kepler, B = {batch}, {steps} steps, every state kept, float64, tol = default_tol.\n\n"
        md += common.markdown_table([dict(config=k, ms=1e3 * r["seconds"],
                                          ratio=r["seconds"] / res[den]["seconds"],
                                          max_diff=r["max_diff"]) for k, r in res.items()],
                                    [("config", "configuration"), ("ms", "ms"),
                                     ("ratio", f"× {den}"), ("max_diff", "max |Δ|, every state")])
        sections.append(("Implicit midpoint", numba_note * (den != "numba per-trajectory fixed point") + md))
        print(md)
    if "compute" in args.sections:
        if not has("numba"):
            print(f"compute: skipped ({NO_NUMBA})")
        else:
            rows, K = compute(args)
            floor, err = _call_floor(args)
            data["compute"] = rows
            data["call_floor"] = dict(us=floor, block=K, error=err)
            md = ("Kepler, float64, one thread, the same rounds; ratios to the numba loop that keeps "
                  "every state.\n\n" + common.markdown_table(rows, [
                      ("batch", "batch"), ("config", "configuration"), ("steps", "steps"),
                      ("ns", "ns / step·traj"), ("ratio", "× numba, every state"),
                      ("max_diff", "max |Δ| final")]))
            md += ("\n\ntorch.compile's own cost per call (a compiled `y + 1` on a (1, 2) tensor, "
                   f"the library's inductor options): {floor:.1f} µs, spread over a block of "
                   f"K = {K} steps: {floor / K:.2f} µs a step before any arithmetic"
                   + (f" ({err})." if err else "."))
            layouts = store_layouts(args)
            data["store_layouts"] = layouts
            md += ("\n\nStoring a batch-innermost state (m = 2, a stand-in step x·c, 16 steps a "
                   "compiled call, fresh outputs):\n\n" + common.markdown_table(layouts, [
                       ("config", "rows written as"), ("batch", "batch"), ("steps", "steps"),
                       ("ns_per_value", "ns / value stored"), ("max_diff", "max |Δ| last row")]))
            sections.append(("Compiled every-state rollout: arithmetic and stores", md))
            print(md)
    if "small" in args.sections:
        steps, rows = small(args)
        cold, cold_err = cold_first_call(steps)
        data["small"] = dict(steps=steps, rows=rows, cold_first_call_s=cold, cold_error=cold_err)
        md = (f"Kepler, B = 1, {steps} Verlet steps, `rollout(compile=True)`, no_grad; "
              "first call = compile + one run, in this process after what compiled before it "
              "(torch.compile's start-up is in the first row's only).  **The first call in a "
              f"fresh process** (the defaults: final state, compiled loops, C++ wrapper; an empty "
              f"inductor cache): {cold:.1f} s" + (f" ({cold_err})" if cold_err else "") + ".\n\n"
              + common.markdown_table(rows, [
                  ("system", "Kepler's forces"), ("cpp_wrapper", "inductor cpp_wrapper"),
                  ("states", "states kept"),
                  ("how", "steps run as"), ("us_per_step", "µs / step"), ("first_call_s", "first call s"), ("error", "error")]))
        sections.append(("Small batch, compiled", md))
        print(md)
    setup = (f"Kepler e = 0.6 (±2 %), h = {H}, float64, CPU, {torch.get_num_threads()} thread; "
             f"{time.perf_counter() - t0:.0f} s in all.  numba "
             f"{'installed' if has('numba') else 'absent'}; torchode "
             f"{'installed' if has('torchode') else 'absent'}; diffrax "
             f"{'installed' if has('diffrax') else 'absent'}.")
    common.write(out, "limits", "Limits: ours against the CPU limit", [("Setup", setup), *sections], data)
    print(f"wrote {out / 'limits.md'}")
    return data


if __name__ == "__main__":
    main()
