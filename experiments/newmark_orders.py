"""Second-order and variational integrators: convergence orders, energy behaviour, step cost.

Problems
* SODE: the coupled Duffing system M q̈ = −Kq − q³ (− Cq̇ when damped), M = [[2, .3], [.3, 1]],
  integrated on the state (q, v) by the Newmark family, eq. (11) tangent-lift schemes and the
  discrete second-order form; reference scipy DOP853 (rtol = atol = 1e-13) at T = 3.3 (not a
  period).
* Lagrangian: the relativistic particle L = −√(1 − |v|²) − V(q) on the state (q, p) with the
  variational integrators, and the cotangent-lift integrators of H = √(1 + |p|²) + V on the
  same problem for comparison; reference DOP853 at T = 2.7.

Measured
* error at T vs h = T/N, N doubling; the fitted log-log slope (the order) per method;
* relative energy error over a long undamped run (h = 0.05, 2·10⁴ steps; --quick: 2·10³) of the
  Duffing system: bounded for the symmetric members, decaying for the damped Newmark;
* wall time per step of a rollout (float64, batch 1) next to a hand-written loop of the same
  explicit update (velocity Verlet) — noisy on shared machines; ratios matter, not absolutes.

    python experiments/newmark_orders.py [--quick] [--Ns 20,40,80] [--methods A,B]
                                         [--energy-steps S] [--cost-steps S] [--out results]

Writes <out>/newmark_orders.{md,json} and <out>/newmark_orders_{convergence,energy}.png.
About 12 min on a busy 2-core CPU (the retraction-map cases dominate), --quick about 1 min.
``--Ns``, ``--energy-steps`` and ``--cost-steps`` override the sizes, ``--methods`` keeps only the
convergence cases of the named methods (smoke tests).  N = 20, 40, 80 is not yet asymptotic for
sode_explicit_euler on the Duffing system (fitted ≈ 1.2–1.4 for order 1; from N = 80 on ≈ 1.05).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

import torchgeo_int as tgi
from torchgeo_int.integrators.sode import (SODE_METHODS, DiscreteSODE, Newmark, SODEIntegrator,
                                           TangentLiftSODE)
from torchgeo_int.integrators.variational import VARIATIONAL_METHODS, VariationalIntegrator
from torchgeo_int.lagrangian import Lagrangian, SecondOrderSystem

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:        # run as a script: the experiments package is beside it
    sys.path.insert(0, str(ROOT))
from experiments.problems import step_counts  # noqa: E402

torch.set_default_dtype(torch.float64)

MASS = torch.tensor([[2.0, 0.3], [0.3, 1.0]])
DAMPING = torch.tensor([[0.3, 0.05], [0.05, 0.2]])
K = torch.tensor([[1.0, -0.4], [-0.4, 1.5]])
Q0, V0 = torch.tensor([1.0, -0.4]), torch.tensor([0.2, 0.7])
P0_REL = torch.tensor([0.3, 0.5])


def duffing(damped):
    V = lambda q: 0.5 * (q * (q @ K.T)).sum(-1) + 0.25 * (q ** 4).sum(-1)  # noqa: E731
    return SecondOrderSystem.from_potential(V, MASS, damping=DAMPING if damped else None,
                                            potential_grad=lambda q: q @ K.T + q ** 3)


def duffing_reference(T, damped):
    from scipy.integrate import solve_ivp

    Minv, Kn, Cn = np.linalg.inv(MASS.numpy()), K.numpy(), DAMPING.numpy()

    def f(t, y):
        q, v = y[:2], y[2:]
        return np.concatenate([v, Minv @ (-Kn @ q - q ** 3 - (Cn @ v if damped else 0.0))])

    y0 = np.concatenate([Q0.numpy(), V0.numpy()])
    return torch.tensor(solve_ivp(f, (0, T), y0, method="DOP853", rtol=1e-13, atol=1e-13).y[:, -1])


def potential(q):
    return (1 - torch.cos(q[..., 0])) + 0.5 * q[..., 1] ** 2 + 0.1 * (q[..., 0] * q[..., 1]) ** 2


def relativistic():
    L = Lagrangian(lambda q, v: -torch.sqrt(1 - (v * v).sum(-1)) - potential(q))
    H = tgi.Hamiltonian(lambda q, p: torch.sqrt(1 + (p * p).sum(-1)) + potential(q))
    return L, H


def relativistic_reference(T):
    from scipy.integrate import solve_ivp

    def f(t, y):
        q, p = y[:2], y[2:]
        dV = np.array([math.sin(q[0]) + 0.2 * q[0] * q[1] ** 2, q[1] + 0.2 * q[0] ** 2 * q[1]])
        return np.concatenate([p / math.sqrt(1 + p @ p), -dV])

    y0 = np.concatenate([Q0.numpy(), P0_REL.numpy()])
    return torch.tensor(solve_ivp(f, (0, T), y0, method="DOP853", rtol=1e-13, atol=1e-13).y[:, -1])


def final(system, method, q0, p0, h, N):
    if isinstance(method, DiscreteSODE):
        with torch.no_grad():
            q1 = method.start(system, q0, p0, 0.0, h)
            qa, qb = tgi.rollout(system, q0, q1, h=h, steps=N - 1, method=method, save_every=N - 1)
            v = method.velocity(system, qa[-1], qb[-1], (N - 1) * h, h)
        return torch.cat([qb[-1], v])
    with torch.no_grad():
        q, p = tgi.rollout(system, q0, p0, h=h, steps=N, method=method, save_every=N)
    return torch.cat([q[-1], p[-1]])


def convergence(cases, Ns, progress):
    rows = []
    for label, system, method, q0, p0, T, ref in cases:
        errs = []
        for N in Ns:
            errs.append(float((final(system, method, q0, p0, T / N, N) - ref).norm()))
            progress.update()
        ok = [i for i, e in enumerate(errs) if e > 1e-11]  # drop the round-off plateau
        slope = -np.polyfit(np.log([Ns[i] for i in ok]), np.log([errs[i] for i in ok]), 1)[0]
        rows.append(dict(problem=label, method=method.name, declared_order=method.order,
                         measured_order=round(float(slope), 3), T=T, Ns=list(Ns), errors=errs))
    return rows


def energy_study(steps, progress):
    system = duffing(False)
    out = {}
    for name in ["newmark_average_acceleration", "newmark_linear_acceleration",
                 "newmark_central_difference", "newmark_damped", "sode_midpoint"]:
        with torch.no_grad():
            q, v = tgi.rollout(system, Q0, V0, h=0.05, steps=steps, method=SODE_METHODS[name],
                               save_every=max(1, steps // 400))
        E = system.energy(q, v)
        out[name] = ((E - E[0]) / E[0]).tolist()
        progress.update()
    return out


def step_cost(steps):
    """Seconds per step: rollout of each method vs a hand-written velocity Verlet loop."""
    system = duffing(False)
    Minv = torch.linalg.inv(MASS)

    def acc(q):
        return (-(q @ K.T) - q ** 3) @ Minv.T

    def hand(q, v, h):
        a = acc(q)
        for _ in range(steps):
            v = v + 0.5 * h * a
            q = q + h * v
            a = acc(q)
            v = v + 0.5 * h * a
        return q, v

    timings = {}
    with torch.no_grad():
        t0 = time.perf_counter()
        hand(Q0, V0, 0.05)
        timings["hand_written_velocity_verlet"] = (time.perf_counter() - t0) / steps
        for name, m in SODE_METHODS.items():
            # Implicit steps are ~10x dearer; explicit Euler is unstable on long oscillations.
            n = steps if name == "newmark_central_difference" else max(steps // 10, 20)
            t0 = time.perf_counter()
            tgi.rollout(system, Q0, V0, h=0.05, steps=n, method=m)
            timings[name] = (time.perf_counter() - t0) / n
    return timings



def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer step sizes and a short energy run")
    ap.add_argument("--Ns", type=step_counts, default=None,
                    help="step counts N (h = T/N) of the convergence study; "
                         "default 20,40,80,160,320 (--quick: 20,40,80)")
    ap.add_argument("--methods", default=None,
                    help="comma-separated method names: only their convergence cases")
    ap.add_argument("--energy-steps", type=int, default=None,
                    help="steps of the energy study; default 20000 (--quick: 2000)")
    ap.add_argument("--cost-steps", type=int, default=None,
                    help="steps of the step-cost timing; default 2000 (--quick: 200)")
    ap.add_argument("--out", default="results")
    args = ap.parse_args(argv)
    Ns = tuple(args.Ns) if args.Ns is not None else ((20, 40, 80) if args.quick else (20, 40, 80, 160, 320))
    energy_steps = args.energy_steps if args.energy_steps is not None else (2_000 if args.quick else 20_000)
    cost_steps = args.cost_steps if args.cost_steps is not None else (200 if args.quick else 2000)
    if energy_steps < 1 or cost_steps < 1:
        ap.error(f"--energy-steps and --cost-steps must be at least 1, got {energy_steps}, {cost_steps}")
    custom = any(x is not None for x in (args.Ns, args.methods, args.energy_steps, args.cost_steps))
    mode = ("quick" if args.quick else "full") + (" (sizes or methods overridden)" if custom else "")
    results = Path(args.out)

    L, H = relativistic()
    retr = tgi.RetractionMap(lambda x, v: x + v + 0.3 * torch.tanh(x) * v ** 2 + 0.1 * v ** 3, 0.5)
    cases = []
    for damped in (False, True):
        T, ref = 3.3, duffing_reference(3.3, damped)
        label = "duffing_damped" if damped else "duffing"
        sysm = duffing(damped)
        for m in [*SODE_METHODS.values(), TangentLiftSODE(tgi.AlphaMap(0.3)),
                  SODEIntegrator(tgi.TangentLift(tgi.AlphaMap(0.3)), equation=10,
                                 name="eq10(T(alpha0.3))"),
                  DiscreteSODE(tgi.MidpointMap(), name="discrete_sode_midpoint")]:
            cases.append((label, sysm, m, Q0, V0, T, ref))
        if not args.quick:
            cases.append((label, sysm, TangentLiftSODE(retr, name="sode_retraction_mid"), Q0, V0, T, ref))
    T, ref = 2.7, relativistic_reference(2.7)
    for m in VARIATIONAL_METHODS.values():
        cases.append(("relativistic", L, m, Q0, P0_REL, T, ref))
    for name in ("symplectic_euler", "implicit_midpoint", "verlet"):
        cases.append(("relativistic", H, tgi.METHODS[name], Q0, P0_REL, T, ref))
    if not args.quick:
        cases.append(("relativistic", L, VariationalIntegrator(retr, name="variational_retraction_mid"),
                      Q0, P0_REL, T, ref))
    if args.methods:
        keep = [m.strip() for m in args.methods.split(",")]
        known = list(dict.fromkeys(c[2].name for c in cases))
        unknown = [m for m in keep if m not in known]
        if unknown:
            ap.error(f"--methods: unknown name(s) {', '.join(map(repr, unknown))}; known: {', '.join(known)}")
        cases = [c for c in cases if c[2].name in keep]

    total = len(cases) * len(Ns) + 5
    with tqdm(total=total, desc="newmark_orders") as progress:
        rows = convergence(cases, Ns, progress)
        energy = energy_study(energy_steps, progress)
    timings = step_cost(cost_steps)

    data = dict(quick=args.quick, mode=mode, torch=torch.__version__, Ns=list(Ns), energy_steps=energy_steps,
                convergence=rows,
                energy_relative_error={k: dict(max_abs=max(abs(x) for x in v), final=v[-1])
                                       for k, v in energy.items()},
                seconds_per_step=timings)
    results.mkdir(parents=True, exist_ok=True)
    (results / "newmark_orders.json").write_text(json.dumps(data, indent=2))

    lines = ["# Second-order and variational integrators", "",
             f"torch {torch.__version__}, float64, {mode} run, N = {', '.join(map(str, Ns))}.", "",
             "## Convergence (error at T vs h = T/N)", "",
             "| problem | method | declared | measured | error at largest N |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['problem']} | {r['method']} | {r['declared_order']} | {r['measured_order']:.2f} "
              f"| {r['errors'][-1]:.2e} |" for r in rows]
    lines += ["", f"## Relative energy error, undamped Duffing, h = 0.05, {energy_steps} steps", "",
              "| method | max abs | final |", "|---|---|---|"]
    lines += [f"| {k} | {v['max_abs']:.2e} | {v['final']:.2e} |"
              for k, v in data["energy_relative_error"].items()]
    lines += ["", "## Wall time per step (batch 1, float64; noisy on shared cores)", "",
              "| method | µs/step | × hand-written |", "|---|---|---|"]
    base = timings["hand_written_velocity_verlet"]
    lines += [f"| {k} | {v * 1e6:.0f} | {v / base:.1f} |" for k, v in timings.items()]
    (results / "newmark_orders.md").write_text("\n".join(lines) + "\n")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    problems = sorted({r["problem"] for r in rows})
    fig, axes = plt.subplots(1, len(problems), figsize=(6 * len(problems), 4.5))
    for ax, prob in zip(np.atleast_1d(axes), problems):
        for r in rows:
            if r["problem"] == prob:
                ax.loglog([r["T"] / N for N in r["Ns"]], r["errors"], "o-", ms=3,
                          label=f"{r['method']} ({r['measured_order']:.2f})")
        ax.set_title(prob)
        ax.set_xlabel("h")
        ax.set_ylabel("error at T")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(results / "newmark_orders_convergence.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, v in energy.items():
        ax.plot(np.linspace(0, 0.05 * energy_steps, len(v)), v, label=k, lw=0.8)
    ax.set_xlabel("t")
    ax.set_ylabel("(E − E₀)/E₀")
    ax.set_yscale("symlog", linthresh=1e-6)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(results / "newmark_orders_energy.png", dpi=120)
    plt.close(fig)
    print((results / "newmark_orders.md").read_text())
    return data


if __name__ == "__main__":
    main()
