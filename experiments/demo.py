"""What torchgeo_int is for, in about two minutes: ``make demo`` (``python experiments/demo.py``).

1. Kepler (e = 0.6, T = 200, ≈ 32 orbits) and the outer solar system (HLW I.2.3, T = 2·10⁵ days)
   with our symplectic methods and with torchdiffeq's rk4 and dopri5, at about the same number
   of force evaluations: verlet takes one a step, yoshida4 three, kahan_li8 seventeen, rk4 four,
   implicit_midpoint (a fixed point) about eight, so h scales with that count; dopri5 runs at
   rtol = atol = 1e-8 and picks its own steps.  Prints, per
   problem: method, steps, force evaluations, wall time, max relative energy error, final
   position error (max over bodies of |q − q_ref|, relative to the largest |q_ref|: a fraction
   of the orbit's size) against scipy's DOP853 at rtol = 1e-13.  The symplectic methods keep the
   energy error bounded; rk4 and dopri5 drift.
2. Plots under results/demo/: energy error vs time (log–log) and the orbits; the tables in
   integrators.md, every number in integrators.json (and hnn.json for part 3).
3. If ``experiments.hnn`` provides ``demo_hnn``, learns the mass–spring Hamiltonian from noisy
   trajectories with the library's recipe — a ``TrajectoryFit`` through Verlet steps that
   estimates the clean states and matches the derivative targets there (about a minute) — and
   compares it with derivative matching on the same targets at the noisy states and on finite
   differences, at the same seeded number of gradient steps; figures of the rollouts.

    python experiments/demo.py [--quick] [--hnn-steps 600] [--no-hnn] [--out results/demo]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:          # run as a script: make `experiments` importable
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import torchgeo_int as tgi  # noqa: E402
from experiments.bench import common  # noqa: E402
from experiments.cli import number  # noqa: E402

# (method, force evaluations per step); h = base_h × that count, so that every fixed-step
# method spends about one force evaluation per base_h (implicit midpoint: ≈ 8 fixed-point
# evaluations a step at these h).
METHODS = [("verlet", 1), ("yoshida4", 3), ("kahan_li8", 17), ("implicit_midpoint", 8),
           ("rk4", 4), ("dopri5", None)]
SETTINGS = {   # final time, base step
    "kepler": dict(T=200.0, h=0.005),
    "outer_solar_system": dict(T=2e5, h=10.0),
}
N_OUT = 500


def integrate(problem, name, evals_per_step, T, base_h):
    """Trajectory (times, q, p), steps, force evaluations, wall seconds."""
    q0, p0 = problem.q0, problem.p0
    t0 = time.perf_counter()
    if name in tgi.METHODS:
        h = base_h * evals_per_step
        steps = int(round(T / h))
        counting = common.Counting(problem.system)
        with torch.no_grad():
            q, p = tgi.rollout(counting, q0, p0, h=h, steps=steps, method=name,
                               save_every=max(1, steps // N_OUT))
        times = np.arange(len(q)) * max(1, steps // N_OUT) * h
        evals = counting.evaluations
    else:
        h = base_h * evals_per_step if evals_per_step else None
        steps = int(round(T / h)) if h else None
        # output times on rk4's own grid (torchdiffeq interpolates linearly between its steps)
        every = max(1, steps // N_OUT) * h if h else T / N_OUT
        times = np.arange(0.0, T + 0.5 * every, every)
        kw = dict(h=h) if h else dict(rtol=1e-8)
        (q, p), evals = common.torchdiffeq_solve(problem.system, q0, p0, T, name, shape=q0.shape,
                                                 times=times, **kw)
        if steps is None:          # dopri5: accepted + rejected steps, ~6 evaluations each
            steps = f"~{evals // 6}"
    seconds = time.perf_counter() - t0
    return times, q, p, steps, evals, seconds


def run_problem(key, args):
    problem = common.PROBLEMS[key]()
    s = SETTINGS[key]
    T = s["T"] * (args.fraction if args.fraction is not None else (0.1 if args.quick else 1.0))
    qr, _ = common.reference(problem, T)
    E0 = float(problem.energy(problem.q0, problem.p0))
    rows, curves = [], {}
    for name, per_step in METHODS:
        times, q, p, steps, evals, seconds = integrate(problem, name, per_step, T, s["h"])
        rel = ((problem.energy(q, p) - E0) / abs(E0)).abs()
        curves[name] = (times, rel.numpy(), q.numpy())
        rows.append(dict(method=name, steps=steps, evals=evals, seconds=seconds,
                         max_rel_energy_error=float(rel.max()),
                         final_position_error=common.position_error(q[-1], qr)))
        print(f"  {key:18s} {name:18s} {seconds:6.2f} s", flush=True)
    return problem, T, rows, curves, qr


def _time(T, problem):
    return f"T = {T:g} {problem.unit}" if problem.unit else f"T = {T:g} (units with GM = 1)"


def plot_energy(results, path):
    """Log–log energy error; torchdiffeq's curves dashed, thick and drawn on top (our methods'
    oscillating curves fill bands late in time that hid thin dotted lines), legend below the
    axes so that it covers no curve."""
    plt = common.plt()
    fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 5.6), squeeze=False)
    for ax, (key, (problem, T, rows, curves, _)) in zip(axes[0], results.items()):
        for name, (t, rel, _) in curves.items():
            ours = name in tgi.METHODS
            ax.loglog(t[1:], np.maximum(rel[1:], 1e-17), label=name if ours else f"{name} (torchdiffeq)",
                      lw=0.8 if ours else 2.2, ls="-" if ours else "--", alpha=0.85 if ours else 1.0,
                      zorder=2 if ours else 3)
        ax.set_xlabel(f"t{' [' + problem.unit + ']' if problem.unit else ' (GM = 1)'}")
        ax.set_ylabel("|H − H₀| / |H₀|")
        ax.set_title(f"{key}, {_time(T, problem)}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    fig.suptitle("energy error at ≈ equal force evaluations; solid: torchgeo_int, dashed: "
                 "torchdiffeq", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_orbits(results, path):
    """One panel per Kepler method (their orbits overlap: drawn on one axes only the last one
    showed), with the reference final state, then the outer solar system."""
    plt = common.plt()
    names = ("verlet", "rk4", "dopri5")
    fig, axes = plt.subplots(2, 2, figsize=(11, 10))
    axes = axes.ravel()
    problem, T, rows, curves, qr = results["kepler"]
    for ax, name in zip(axes, names):
        q = curves[name][2]
        ax.plot(q[:, 0], q[:, 1], ".", ms=2, label=f"{name}: saved states")
        ax.plot(*np.asarray(qr).reshape(-1)[:2], "k+", ms=12, mew=2, label="reference final state")
        ax.set_aspect("equal")
        ax.set_xlabel("x (GM = 1)")
        ax.set_ylabel("y")
        ax.set_title(f"Kepler e = 0.6, {name}, {_time(T, problem)}", fontsize=10)
        ax.legend(fontsize=8, loc="center")     # inside the orbit: the one empty region
    ax = axes[-1]
    if "outer_solar_system" not in results:
        ax.axis("off")
    else:
        problem, T, rows, curves, _ = results["outer_solar_system"]
        _, _, _, _, bodies = common.load_outer_solar_system()
        q = curves["kahan_li8"][2]
        for i, body in enumerate(bodies):
            ax.plot(q[:, i, 0], q[:, i, 1], ".", ms=2, label=body)
        ax.set_aspect("equal")
        ax.set_xlabel("x [AU]")
        ax.set_ylabel("y [AU]")
        ax.set_title(f"outer solar system, kahan_li8, {_time(T, problem)}", fontsize=10)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3,
                  markerscale=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def hnn_part(steps, out):
    """The HNN demo of experiments/hnn, if it is there; a one-line note otherwise."""
    try:
        from experiments.hnn import demo_hnn
    except ImportError as err:
        print(f"HNN demo: skipped (experiments.hnn.demo_hnn is not available: {err})")
        return None
    print(f"\nHNN on the mass–spring task (noisy trajectories), {steps} Adam steps each: a "
          "TrajectoryFit through Verlet steps, then derivative matching at the noisy states on the "
          "true derivatives and on finite differences")
    res = demo_hnn(steps=steps, progress=True, out=out)
    for line in hnn_summary(res):
        print("  " + line)
    (out / "hnn.json").write_text(json.dumps(res, indent=1, default=str))
    return res


def _verdict(ours: float, theirs: float) -> str:
    if not (ours == ours and theirs == theirs):
        return "no comparison (a NaN)"
    if ours == theirs:
        return "a tie"
    r = theirs / ours if ours < theirs else ours / theirs
    factor = f"{r:.0f}" if r >= 100 else f"{r:.2g}"          # (not 1.1e+02)
    return f"trajectory fit {'better' if ours < theirs else 'worse'}, {factor}× {'lower' if ours < theirs else 'higher'}"


def hnn_summary(res) -> list[str]:
    """Lines that say, per metric and per derivative-matching arm, which one wins against the
    trajectory fit rolled out as they are (dopri5) and by what factor (a bare ratio with "< 1 is
    better" read as a win when it was a loss)."""
    fit, verlet = res["trajectory_fit_dopri5"], res["trajectory_fit"]
    lines = ["rolled out over t ∈ [0, 20] from 25 held-out states; energy MSE (true H) and "
             "state MSE (vs the true trajectories), lower is better:",
             f"TrajectoryFit, the derivative targets at its estimated states (study arm (g)), by "
             f"dopri5: energy {fit['energy_mse']:.3g}, state {fit['state_mse']:.3g} (by Verlet at "
             f"h = dt: energy {verlet['energy_mse']:.3g}, state {verlet['state_mse']:.3g})"]
    for key, what in (("derivative_matching", "derivative matching on the same targets at the "
                                              "noisy states"),
                      ("derivative_matching_fd", "derivative matching on finite differences of "
                                                 "the noisy states")):
        a = res[key]
        lines.append(f"{what}: energy {a['energy_mse']:.3g} ({_verdict(fit['energy_mse'], a['energy_mse'])}), "
                     f"state {a['state_mse']:.3g} ({_verdict(fit['state_mse'], a['state_mse'])})")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter times, a 100-step HNN part")
    ap.add_argument("--fraction", type=number("float", 0.0, lo_open=True), default=None,
                    help="integrate over this fraction of the final times (default 1; --quick 0.1)")
    ap.add_argument("--hnn-steps", type=number("int", 1), default=None,
                    help="Adam steps per HNN (600; --quick 100)")
    ap.add_argument("--no-hnn", action="store_true")
    ap.add_argument("--problems", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--out", default=str(common.RESULTS / "demo"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)   # small problems: threads only add overhead on a shared machine
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    print("integrating (float64, eager, 1 CPU thread) …")
    results = {key: run_problem(key, args) for key in args.problems}
    cols = [("method", "method"), ("steps", "steps"), ("evals", "force evals"),
            ("seconds", "wall s"), ("max_rel_energy_error", "max |ΔH/H₀|"),
            ("final_position_error", "final position error (÷ max |q_ref|)")]
    md = []
    for key, (problem, T, rows, _, _) in results.items():
        table = common.markdown_table(rows, cols)
        head = f"{key}, T = {T:g}{' days' if problem.unit else ''}"
        print(f"\n{head}\n{table}")
        md += [f"## {head}", "", table, ""]
    md += ["Final position error: max over bodies of |q(T) − q_ref(T)| divided by the largest "
           "|q_ref(T)| (dimensionless: a fraction of the orbit's size), with q_ref from scipy's "
           "DOP853 at rtol = atol = 1e-13. Every number is in integrators.json.", ""]
    if "kepler" in results:
        plot_energy(results, out / "energy_error.png")
        plot_orbits(results, out / "orbits.png")
        md += ["![energy error](energy_error.png)", "", "![orbits](orbits.png)", ""]
    steps = args.hnn_steps if args.hnn_steps is not None else (100 if args.quick else 600)
    hnn = None if args.no_hnn else hnn_part(steps, out)
    (out / "integrators.md").write_text("# torchgeo_int demo\n\n" + common.machine() + "\n\n" + "\n".join(md))
    (out / "integrators.json").write_text(json.dumps(
        dict(problems={k: dict(T=v[1], rows=v[2]) for k, v in results.items()}, hnn=hnn),
        indent=1, default=str))
    wrote = "integrators.md, integrators.json, energy_error.png, orbits.png" + (
        ", hnn.json, hnn_spring_phase.png, hnn_spring_energy.png" if hnn else "")
    print(f"\nwrote {out}/: {wrote} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
