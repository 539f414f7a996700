"""Work–precision: error at the final time vs wall time and vs force evaluations, every method.

    python -m experiments.bench.work_precision [--quick] [--problems kepler outer_solar_system]

Every method in ``tgi.METHODS`` (fixed steps, N = T/h doubling) and torchdiffeq's rk4 (fixed
steps) and dopri5 / dopri8 (rtol = atol swept), on Kepler (e = 0.6, T = 20, not a multiple of the
period 2π) and the outer solar system (HLW I.2.3, T = 2·10⁴ days).  Error: max-norm of (q, p) at T
against scipy's DOP853 at rtol = atol = 1e-13, relative to the max-norm of the reference state
(so errors below ~1e-12 are the reference's).  Force evaluations: calls of ∇V (an implicit
method's fixed-point iteration evaluates the whole field: one each).  Wall time: best of up to
3 runs, one CPU thread, eager mode.

Then the long-time energy error on the outer solar system (T = 10⁶ days; --quick: 2·10⁴) at an
equal budget of about one force evaluation per 10 days: verlet h = 10, yoshida4 h = 30,
kahan_li8 h = 170, implicit_midpoint h = 80 (≈ 8 fixed-point evaluations a step), rk4 h = 40
(4 evaluations a step), dopri5 at rtol = atol = 1e-8 (it picks its own steps).

Writes results/bench/work_precision.{md,json}, work_precision_<problem>.png and
long_time_energy.png.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

import torchgeo_int as tgi

from . import common

TORCHDIFFEQ_FIXED = ["rk4"]
TORCHDIFFEQ_ADAPTIVE = ["dopri5", "dopri8"]

# Final time, and the step counts N = N0·2^k (k < points) per order; implicit methods get fewer
# points (each step is a fixed-point solve, ~5–15 field evaluations).
SETTINGS = {
    "kepler": dict(T=20.0, N0={1: 1024, 2: 256, 4: 128, 6: 64, 8: 64}, points=6,
                   rtols=[1e-4, 1e-6, 1e-8, 1e-10, 1e-12]),
    "outer_solar_system": dict(T=2e4, N0={1: 256, 2: 64, 4: 32, 6: 16, 8: 16}, points=6,
                               rtols=[1e-5, 1e-7, 1e-9, 1e-11]),
}
QUICK = {
    "kepler": dict(T=5.0, N0={1: 256, 2: 64, 4: 32, 6: 16, 8: 16}, points=3, rtols=[1e-5, 1e-8]),
    "outer_solar_system": dict(T=2e3, N0={1: 64, 2: 16, 4: 8, 6: 8, 8: 8}, points=2,
                               rtols=[1e-6, 1e-9]),
}
TARGETS = (1e-4, 1e-8)  # the table reports the cost of reaching these errors
RUN_BUDGET = 8.0       # s: a method stops refining once a single run takes longer


def _implicit(name):
    return name.startswith("implicit_midpoint")


def run_method(problem, name, T, N0, points, budget):
    """Rows (N, h, error, seconds, evaluations) of one fixed-step method of METHODS, N = N0·2^k
    until ``points`` runs succeeded (a step size where an implicit solve does not converge is
    recorded as failed and does not count) or one run took longer than ``budget`` seconds."""
    m = tgi.METHODS[name]
    qr, pr = common.reference(problem, T)
    rows = []
    for N in (N0 * 2 ** k for k in range(points + 4)):
        if sum(1 for r in rows if not r.get("failed")) == points:
            break
        counting = common.Counting(problem.system)
        try:
            with torch.no_grad():
                (q, p), s = common.timed(lambda: tgi.rollout(counting, problem.q0, problem.p0, h=T / N,
                                                             steps=N, method=m, save_every=N))
                if s < 1.0:  # repeat without the counting wrapper; keep the best
                    _, s2 = common.min_time(lambda: tgi.rollout(problem.system, problem.q0, problem.p0,
                                                                h=T / N, steps=N, method=m,
                                                                save_every=N), repeats=2)
                    s = min(s, s2)
        except (tgi.ConvergenceError, FloatingPointError) as err:
            rows.append(dict(N=N, h=T / N, error=None, seconds=None, evals=None,
                             failed=type(err).__name__))
            continue
        rows.append(dict(N=N, h=T / N, error=common.state_error(q[-1], p[-1], qr, pr), seconds=s,
                         evals=counting.evaluations))
        if s > budget:
            break
    return rows


def run_torchdiffeq(problem, name, T, Ns=None, rtols=None, budget=RUN_BUDGET):
    qr, pr = common.reference(problem, T)
    rows = []
    for x in (Ns or rtols):
        kw = dict(h=T / x) if Ns else dict(rtol=x)
        call = lambda: common.torchdiffeq_solve(problem.system, problem.q0, problem.p0, T, name,
                                                shape=problem.q0.shape, **kw)
        ((q, p), nfe), s = common.timed(call)
        if s < 1.0:
            _, s2 = common.min_time(call, repeats=2)
            s = min(s, s2)
        row = dict(error=common.state_error(q, p, qr, pr), seconds=s, evals=nfe)
        row.update(dict(N=x, h=T / x) if Ns else dict(rtol=x))
        rows.append(row)
        if s > budget:
            break
    return rows


def cost_at(rows, target, key):
    """log-log interpolation of ``key`` (seconds or evals) at error = target; None if the sweep
    does not reach it."""
    pts = sorted((r["error"], r[key]) for r in rows if r.get("error") and r.get(key))
    pts = [(e, c) for e, c in pts if e > 0]
    for (e1, c1), (e2, c2) in zip(pts, pts[1:]):
        if e1 <= target <= e2:
            if e1 == e2:
                return float(min(c1, c2))
            w = (math.log(target) - math.log(e1)) / (math.log(e2) - math.log(e1))
            return float(math.exp(math.log(c1) + w * (math.log(c2) - math.log(c1))))
    if pts and pts[0][0] <= target:   # every point is below target: the cheapest one
        return float(min(c for e, c in pts))
    return None


ALL_METHODS = (sorted(tgi.METHODS, key=lambda n: (_implicit(n), tgi.METHODS[n].order, n))
               + TORCHDIFFEQ_FIXED + TORCHDIFFEQ_ADAPTIVE)


def sweep(problem_name, settings, args):
    problem = common.PROBLEMS[problem_name]()
    T = settings["T"]
    results = {}
    names = [n for n in ALL_METHODS if args.methods is None or n in args.methods]
    for name in common.progress(names, args=args, desc=f"work-precision {problem_name}"):
        if name in TORCHDIFFEQ_ADAPTIVE:
            results[name] = run_torchdiffeq(problem, name, T, rtols=settings["rtols"])
            continue
        order = 4 if name in TORCHDIFFEQ_FIXED else tgi.METHODS[name].order
        points = settings["points"] - (2 if _implicit(name) and not args.quick else 0)
        if name in TORCHDIFFEQ_FIXED:
            Ns = [settings["N0"][order] * 2 ** k for k in range(points)]
            results[name] = run_torchdiffeq(problem, name, T, Ns=Ns)
        else:
            results[name] = run_method(problem, name, T, settings["N0"][order], points,
                                       RUN_BUDGET / (4 if args.quick else 1))
    return problem, results


def summary_rows(results, targets=TARGETS):
    rows = []
    for name, pts in results.items():
        ok = [r for r in pts if r.get("error") is not None]
        best = min(ok, key=lambda r: r["error"]) if ok else None
        m = tgi.METHODS.get(name)
        rows.append(dict(
            method=name, kind=("torchdiffeq" if m is None else
                               ("implicit" if _implicit(name) else "explicit")),
            order=(m.order if m else {"rk4": 4, "dopri5": 5, "dopri8": 8}[name]),
            **{f"seconds_at_{t:g}": cost_at(pts, t, "seconds") for t in targets},
            **{f"evals_at_{t:g}": cost_at(pts, t, "evals") for t in targets},
            best_error=best["error"] if best else None, points=len(ok),
            failed=sum(1 for r in pts if r.get("failed"))))
    return rows


def plot(problem_name, results, path, T):
    plt = common.plt()
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5), sharey=True)
    cmap = plt.get_cmap("tab20")
    for i, (name, pts) in enumerate(results.items()):
        ok = [r for r in pts if r.get("error")]
        if not ok:
            continue
        style = ":" if name not in tgi.METHODS else ("--" if _implicit(name) else "-")
        for ax, key in zip(axes, ("seconds", "evals")):
            ax.loglog([r[key] for r in ok], [r["error"] for r in ok], style, marker="o", ms=3,
                      color=cmap(i % 20), label=name)
    axes[0].set_xlabel("wall time [s] (1 CPU thread, eager)")
    axes[1].set_xlabel("force evaluations")
    axes[0].set_ylabel(f"relative error at T = {T:g}")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2, loc="lower left")
    fig.suptitle(f"work–precision, {problem_name} (solid: explicit, dashed: implicit, dotted: "
                 "torchdiffeq)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# Long-time energy

LONG_TIME = [  # (method, h): about one force evaluation per 10 days each (implicit midpoint:
    # ≈ 8 fixed-point evaluations a step)
    ("verlet", 10.0), ("yoshida4", 30.0), ("kahan_li8", 170.0), ("implicit_midpoint", 80.0),
    ("rk4", 40.0), ("dopri5", None)]


def long_time_energy(T, args, n_out=400):
    problem = common.outer_solar_system()
    E0 = float(problem.energy(problem.q0, problem.p0))
    rows, curves = [], {}
    todo = [(n, h) for n, h in LONG_TIME if args.methods is None or n in args.methods]
    for name, h in common.progress(todo, args=args, desc="long-time energy"):
        t0 = time.perf_counter()
        if name in tgi.METHODS:
            steps = int(round(T / h))
            save = max(1, steps // n_out)
            counting = common.Counting(problem.system)
            with torch.no_grad():
                q, p = tgi.rollout(counting, problem.q0, problem.p0, h=h, steps=steps, method=name,
                                   save_every=save)
            times = np.arange(len(q)) * save * h
            evals = counting.evaluations
        else:
            # Output times on rk4's own grid: torchdiffeq interpolates linearly between its fixed
            # steps, which alone would add an O(h²) energy error.
            every = max(1, int(round(T / h)) // n_out) * h if h else T / n_out
            times = np.arange(0.0, T + 0.5 * every, every)
            kw = dict(h=h) if h else dict(rtol=1e-8)
            (q, p), evals = common.torchdiffeq_solve(problem.system, problem.q0, problem.p0, T, name,
                                                     shape=problem.q0.shape, times=times, **kw)
        seconds = time.perf_counter() - t0
        rel = ((problem.energy(q, p) - E0) / abs(E0)).abs().numpy()
        curves[name] = (times[1:], rel[1:])
        rows.append(dict(method=name, h=h if h else "adaptive (rtol 1e-8)", evals=evals,
                         seconds=seconds, max_rel_energy_error=float(rel.max()),
                         final_rel_energy_error=float(rel[-1])))
    return rows, curves


def plot_long_time(curves, T, path):
    plt = common.plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, (t, rel) in curves.items():
        ax.loglog(t, np.maximum(rel, 1e-18), label=name, lw=1)
    ax.set_xlabel("t [days]")
    ax.set_ylabel("|H − H₀| / |H₀|")
    ax.set_title(f"outer solar system, T = {T:g} days, ≈ 1 force evaluation per 10 days")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = common.parser(__doc__)
    ap.add_argument("--problems", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--methods", nargs="+", default=None, choices=ALL_METHODS,
                    help="a subset of the methods (default: all)")
    ap.add_argument("--long-time", type=float, default=None,
                    help="final time of the energy study in days (default 1e6; --quick 2e4; 0 skips)")
    args = ap.parse_args(argv)
    out = common.setup(args)
    table = QUICK if args.quick else SETTINGS
    sections, data = [], {}
    for name in args.problems:
        problem, results = sweep(name, table[name], args)
        T = table[name]["T"]
        rows = summary_rows(results)
        cols = [("method", "method"), ("kind", "kind"), ("order", "order")]
        for t in TARGETS:
            cols += [(f"seconds_at_{t:g}", f"wall s to {t:g}"), (f"evals_at_{t:g}", f"evals to {t:g}")]
        md = common.markdown_table(rows, cols + [("best_error", "best error"), ("points", "points"),
                                                 ("failed", "failed h")])
        md += ("\n\nCost to reach a relative error at T (log-log interpolation between the "
               "sweep's points; — : not reached); failed h: step sizes where an implicit solve "
               "did not converge (outside the method's range).")
        print(f"\n{name}, T = {T:g}\n{md}")
        sections.append((f"{name}, T = {T:g}", md + f"\n\n![work-precision](work_precision_{name}.png)"))
        plot(name, results, out / f"work_precision_{name}.png", T)
        data[name] = dict(T=T, targets=TARGETS, results=results, summary=rows)
    T_long = args.long_time if args.long_time is not None else (2e4 if args.quick else 1e6)
    if T_long:
        rows, curves = long_time_energy(T_long, args)
        md = common.markdown_table(rows, [
            ("method", "method"), ("h", "h [days]"), ("evals", "force evals"),
            ("seconds", "wall s"), ("max_rel_energy_error", "max |ΔH/H₀|"),
            ("final_rel_energy_error", "final |ΔH/H₀|")])
        print(f"\nouter solar system, energy over T = {T_long:g} days\n{md}")
        sections.append((f"Long-time energy, outer solar system, T = {T_long:g} days",
                         md + "\n\n![energy](long_time_energy.png)"))
        plot_long_time(curves, T_long, out / "long_time_energy.png")
        data["long_time"] = dict(T=T_long, rows=rows)
    common.write(out, "work_precision", "Work–precision", sections, data)
    print(f"wrote {out / 'work_precision.md'}")
    return data


if __name__ == "__main__":
    main()
