"""Work–precision of the splitting and composition methods: energy and position error against
force evaluations and wall time, every method of ``tgi.SPLITTING_METHODS`` and the compositions
of Verlet in ``tgi.METHODS``.

    python -m experiments.bench.splitting_wp [--quick] [--problems kepler outer_solar_system]

Problems (HLW I.2.3 data, analytic gradients): the outer solar system over T = 10⁵ days and
Kepler e = 0.6 over T = 50 (≈ 8 periods).  For each method the step is h = s / r with s its
force evaluations per step and r force evaluations per unit time on a geometric grid, so runs
are compared at equal work.  Energy error: max over 100 equally spaced saved states of
|H − H₀| / |H₀|; position error: max over bodies of |q(T) − q_ref(T)| / max |q_ref(T)| against
scipy's DOP853 at rtol = atol = 1e-13 (≈ 1e-12 accurate, the floor).  Force evaluations are
counted by the potential gradient itself (every call, FSAL, processing included); wall time is
one eager rollout (1 CPU thread) with no saving beyond the 100 states.  A method's sweep (r
doubling) stops once its energy error is below 1e-11 or its CPU budget is spent.  The
near-integrable rows (``wh_*``, outer solar system) run the tables with exact Kepler drifts in
Jacobi coordinates (:mod:`torchgeo_int.integrators.wisdom_holman`), a force evaluation being
one ∂H_I/∂q'.

Writes results/bench/splitting_wp.{md,json} and splitting_wp_<problem>.png.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

import torchgeo_int as tgi

from . import common
from .work_precision import cost_at

BASELINES = ["verlet", "yoshida4", "suzuki4", "yoshida6", "kahan_li6", "yoshida8", "kahan_li8"]
SETTINGS = {
    "outer_solar_system": dict(T=1e5, rates=(0.01, 2.56), budget=10.0,
                               wh_rates=(0.0025, 0.04), wh_budget=8.0),
    "kepler": dict(T=50.0, rates=(2.0, 1024.0), budget=4.0),
}
QUICK = {
    "outer_solar_system": dict(T=2e3, rates=(0.05, 0.2), budget=2.0, wh_rates=(0.02, 0.08),
                               wh_budget=2.0),
    "kepler": dict(T=10.0, rates=(5.0, 20.0), budget=1.0),
}
#: Near-integrable runs (outer solar system): the table run with Kepler drifts in Jacobi
#: coordinates (torchgeo_int.integrators.wisdom_holman), the ε-dependent advantage of SABA_n.
WH_TABLES = ["verlet", "saba1", "saba2", "saba3", "saba4", "sbab2", "sbab3"]
TARGETS = (1e-6, 1e-10)
SAVES = 100
#: a method's sweep ends below this energy error (past the 1e-10 target) or after its CPU budget
#: (seconds of process time for the whole sweep: wall time on a shared machine says little)
STOP = 1e-11


def evaluations_per_step(m) -> float:
    ev = getattr(m, "evaluations", None)
    if ev is not None:
        return float(ev)
    kicks = m.splitting()[0]
    n = sum(1 for a in kicks if a != 0.0)
    return float(n - 1 if kicks[0] != 0.0 and kicks[-1] != 0.0 else n)


def counted(problem):
    """The problem's system with a force counter in its potential gradient (the bound loops
    call it directly: the counter costs ~0.1 µs a call)."""
    inner = problem.system
    calls = [0]

    def grad(q):
        calls[0] += 1
        return inner.potential_grad(q)

    system = tgi.SeparableHamiltonian(inner.kinetic, inner.potential, kinetic_grad=inner.kinetic_grad,
                                      potential_grad=grad)
    return system, calls


def run_method(problem, name, T, rates, budget, n_rates=None):
    m = tgi.get_method(name)
    s = evaluations_per_step(m)
    system, calls = counted(problem)
    qr, pr = common.reference(problem, T)
    E0 = float(problem.energy(problem.q0, problem.p0))
    r0, r1 = rates
    k = n_rates or int(round(math.log2(r1 / r0))) + 1            # r doubling
    rows, cpu0 = [], time.process_time()
    for r in np.geomspace(r0, r1, k):
        N = max(SAVES, int(round(T * r / s / SAVES)) * SAVES)   # a multiple of the saves
        h = T / N
        calls[0] = 0
        try:
            with torch.no_grad():
                (q, p), sec = common.timed(lambda: tgi.rollout(system, problem.q0, problem.p0, h=h,
                                                               steps=N, method=m,
                                                               save_every=N // SAVES))
        except FloatingPointError:
            rows.append(dict(N=N, h=h, failed="non-finite"))
            continue
        E = problem.energy(q, p)
        energy = float(((E - E0).abs() / abs(E0)).max())
        rows.append(dict(N=N, h=h, evals=calls[0], seconds=sec, energy_error=energy,
                         position_error=common.position_error(q[-1], qr)))
        if energy < STOP or time.process_time() - cpu0 > budget:
            break
    return rows


def run_wh(problem, table, T, rates, budget, n_rates=None):
    """Like :func:`run_method`, for ``NearIntegrable(table)`` on the Jacobi N-body system."""
    from torchgeo_int.integrators.wisdom_holman import JacobiNBody, NearIntegrable

    G, masses, *_ = common.load_outer_solar_system()
    m = NearIntegrable(table)
    calls = [0]

    class Counted(JacobiNBody):
        def interaction_grad(self, qj):
            calls[0] += 1
            return super().interaction_grad(qj)

    system = Counted(masses, G, potential_grad=problem.system.potential_grad)
    qj0, pj0 = system.to_jacobi(problem.q0, problem.p0)
    qr, _ = common.reference(problem, T)
    E0 = float(problem.energy(problem.q0, problem.p0))
    r0, r1 = rates
    rows, cpu0 = [], time.process_time()
    for r in np.geomspace(r0, r1, n_rates or int(round(math.log2(r1 / r0))) + 1):
        N = max(SAVES, int(round(T * r / m.evaluations / SAVES)) * SAVES)
        h = T / N
        calls[0] = 0
        try:
            with torch.no_grad():
                (q, p), sec = common.timed(lambda: tgi.rollout(system, qj0, pj0, h=h, steps=N, method=m,
                                                               save_every=N // SAVES))
        except (FloatingPointError, ValueError) as err:
            rows.append(dict(N=N, h=h, failed=type(err).__name__))
            continue
        energy = float(((system.energy(q, p) - E0).abs() / abs(E0)).max())
        qx, _ = system.from_jacobi(q[-1], p[-1])
        rows.append(dict(N=N, h=h, evals=calls[0], seconds=sec, energy_error=energy,
                         position_error=common.position_error(qx, qr)))
        if energy < STOP or time.process_time() - cpu0 > budget:
            break
    return rows


def sweep(problem_name, settings, names, args):
    problem = common.PROBLEMS[problem_name]()
    out = {}
    for name in common.progress(names, args=args, desc=f"splitting work-precision {problem_name}"):
        out[name] = run_method(problem, name, settings["T"], settings["rates"], settings["budget"],
                               n_rates=3 if args.quick else None)
        if args.no_progress:
            print(f"{problem_name} {name}: {len(out[name])} runs", flush=True)
    if "wh_rates" in settings and not args.no_wh:
        for table in common.progress(args.wh_tables or WH_TABLES, args=args,
                                     desc="near-integrable (Kepler drifts)"):
            out[f"wh_{table}"] = run_wh(problem, table, settings["T"], args.wh_rates or settings["wh_rates"],
                                        settings["wh_budget"], n_rates=2 if args.quick else None)
    return out


def _method(name):
    if name.startswith("wh_"):
        from torchgeo_int.integrators.wisdom_holman import NearIntegrable
        return NearIntegrable(name[3:])
    return tgi.get_method(name)


def summary(results):
    rows = []
    for name, pts in results.items():
        m = _method(name)
        ok = [r for r in pts if "energy_error" in r]
        row = dict(method=name, order=m.order, evals_per_step=evaluations_per_step(m),
                   kind=("Kepler drift (Jacobi)" if name.startswith("wh_") else
                         "processed" if isinstance(m, tgi.ProcessedSplitting) else
                         "new" if name in tgi.SPLITTING_METHODS else "existing"))
        if name.startswith("wh_"):
            row["order"] = f"{m.order} (ε: {m.epsilon_order})"
        for t in TARGETS:
            e_rows = [dict(error=r["energy_error"], evals=r["evals"], seconds=r["seconds"]) for r in ok]
            x_rows = [dict(error=r["position_error"], evals=r["evals"], seconds=r["seconds"]) for r in ok]
            row[f"evals_energy_{t:g}"] = cost_at(e_rows, t, "evals")
            row[f"seconds_energy_{t:g}"] = cost_at(e_rows, t, "seconds")
            row[f"evals_position_{t:g}"] = cost_at(x_rows, t, "evals")
        rows.append(row)
    return rows


def equal_work(results, name, ref="verlet"):
    """Energy error of ``ref`` over that of ``name`` at ``name``'s evaluation counts (log-log
    interpolation of ref's curve), per point: how many times smaller name's error is."""
    a = sorted((r["evals"], r["energy_error"]) for r in results[ref] if "energy_error" in r)
    out = []
    for r in results[name]:
        if "energy_error" not in r:
            continue
        x = r["evals"]
        for (x1, e1), (x2, e2) in zip(a, a[1:]):
            if x1 <= x <= x2:
                w = (math.log(x) - math.log(x1)) / (math.log(x2) - math.log(x1))
                e = math.exp(math.log(e1) + w * (math.log(e2) - math.log(e1)))
                out.append(dict(evals=x, ratio=e / r["energy_error"]))
    return out


def plot(problem_name, results, path, T):
    plt = common.plt()
    fig, axes = plt.subplots(1, 3, figsize=(19, 7.5), sharey=False)
    cmap = plt.get_cmap("tab20")
    for i, (name, pts) in enumerate(results.items()):
        ok = [r for r in pts if "energy_error" in r and r["energy_error"] > 0]
        if not ok:
            continue
        kind = ("--" if name.startswith("wh_") else "-" if name in tgi.SPLITTING_METHODS else ":")
        style = dict(marker="o", ms=3, color=cmap(i % 20), label=name, lw=1.6 if kind == "-" else 1.0)
        axes[0].loglog([r["evals"] for r in ok], [r["energy_error"] for r in ok], kind, **style)
        axes[1].loglog([r["seconds"] for r in ok], [r["energy_error"] for r in ok], kind, **style)
        axes[2].loglog([r["evals"] for r in ok], [max(r["position_error"], 1e-16) for r in ok], kind, **style)
    axes[0].set_xlabel("force evaluations")
    axes[1].set_xlabel("wall time [s] (1 CPU thread, eager)")
    axes[2].set_xlabel("force evaluations")
    axes[0].set_ylabel("max relative energy error")
    axes[1].set_ylabel("max relative energy error")
    axes[2].set_ylabel(f"relative position error at T = {T:g}")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, ncol=10, loc="lower center")
    fig.suptitle(f"splitting methods, {problem_name} (solid: new tables, dotted: compositions "
                 "of Verlet already in METHODS, dashed: Kepler drifts in Jacobi coordinates)")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    ap = common.parser(__doc__)
    ap.add_argument("--problems", nargs="+", default=["outer_solar_system", "kepler"],
                    choices=sorted(SETTINGS))
    ap.add_argument("--methods", nargs="+", default=None)
    ap.add_argument("--no-wh", action="store_true", help="skip the near-integrable (Kepler drift) runs")
    ap.add_argument("--wh-only", action="store_true", help="only the near-integrable runs")
    ap.add_argument("--wh-tables", nargs="+", default=None, help=f"default: {' '.join(WH_TABLES)}")
    ap.add_argument("--wh-rates", nargs=2, type=float, default=None,
                    help="first and last force evaluations per day of the near-integrable runs")
    ap.add_argument("--replot", action="store_true",
                    help="rewrite the tables and figures from the JSON of an earlier run")
    ap.add_argument("--merge", nargs="+", default=None, metavar="DIR",
                    help="with --replot: the union of the results of runs (each method's sweep is "
                         "independent) written in these folders, e.g. by parallel --methods runs")
    args = ap.parse_args(argv)
    out = common.setup(args)
    names = [] if args.wh_only else (args.methods or (BASELINES + list(tgi.SPLITTING_METHODS)))
    settings = QUICK if args.quick else SETTINGS
    data, sections = {}, []
    for pname in args.problems:
        s = settings[pname]
        stem = "splitting_wp" + ("_" + args.problems[0] if len(args.problems) == 1 else "")
        if args.replot:
            import json
            import pathlib
            results = {}
            for d in (args.merge or [out]):
                part = json.loads((pathlib.Path(d) / f"{stem}.json").read_text())["data"][pname]
                for k, v in part["results"].items():   # a method's rows from several runs
                    rows = results.setdefault(k, [])
                    rows += [r for r in v if all(r.get("N") != x.get("N") for x in rows)]
            for k in results:
                results[k].sort(key=lambda r: r["N"])
        else:
            results = sweep(pname, s, names, args)
        rows = summary(results)
        plot(pname, results, out / f"splitting_wp_{pname}.png", s["T"])
        cols = [("method", "method"), ("kind", "kind"), ("order", "order"),
                ("evals_per_step", "evals/step")]
        for t in TARGETS:
            cols += [(f"evals_energy_{t:g}", f"evals @ ΔE {t:g}"),
                     (f"seconds_energy_{t:g}", f"s @ ΔE {t:g}")]
        cols += [(f"evals_position_{t:g}", f"evals @ Δq {t:g}") for t in TARGETS]
        rows.sort(key=lambda r: (r["evals_energy_1e-10"] is None, r["evals_energy_1e-10"] or 0))
        text = common.markdown_table(rows, cols)
        checks = goals(results, rows) if pname == "outer_solar_system" else {}
        if checks:
            text += "\n\n" + "\n".join(f"* {k}: {v}" for k, v in checks.items())
        sections.append((f"{pname} (T = {s['T']:g})", text))
        data[pname] = dict(results=results, summary=rows, goals=checks)
        print(f"\n## {pname}\n{text}")
    stem = "splitting_wp" + ("_" + args.problems[0] if len(args.problems) == 1 else "")
    common.write(out, stem, "Work–precision of splitting methods", sections, data)
    return data


def goals(results, rows):
    by = {r["method"]: r for r in rows}
    key = "evals_energy_1e-10"
    out = {}
    groups = [("best new T+V method", lambda r: r["kind"] in ("new", "processed")),
              ("best Kepler-drift method", lambda r: r["kind"].startswith("Kepler"))]
    for label, keep in groups:
        new = [r for r in rows if keep(r) and r[key]]
        if new and by.get("yoshida4", {}).get(key) and by.get("kahan_li8", {}).get(key):
            best = min(new, key=lambda r: r[key])
            out[f"{label} at ΔE = 1e-10"] = (
                f"{best['method']}: {best[key]:.4g} evals; yoshida4 {by['yoshida4'][key]:.4g} "
                f"({by['yoshida4'][key] / best[key]:.2f}× more), kahan_li8 {by['kahan_li8'][key]:.4g} "
                f"({by['kahan_li8'][key] / best[key]:.2f}× more)")
    if "verlet" in results:
        for n in [f"saba{i}" for i in range(1, 5)] + [f"wh_saba{i}" for i in range(1, 5)]:
            if n in results:
                ratios = [x["ratio"] for x in equal_work(results, n)]
                if ratios:
                    split = "H_Kepler + H_interaction" if n.startswith("wh_") else "T+V split"
                    out[f"{n} ({split}) vs verlet (T+V) at equal evaluations"] = (
                        f"verlet's energy error / {n}'s: {min(ratios):.3g} … {max(ratios):.3g}")
    return out


if __name__ == "__main__":
    main()
