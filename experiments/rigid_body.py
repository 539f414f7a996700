"""Rigid body and heavy top on T*SO(3): Lie-group symplectic integrators against non-geometric
baselines.

* long run of the free rigid body and of the heavy top: energy error, distance from SO(3)
  (max |gᵀg − I|), Casimir / Noether-momentum errors over time, for the Lie midpoint (Cayley,
  exp), the triple-jump composition, and two baselines on the embedded equations Ṙ = R ξ̂,
  μ̇ = μ × ξ − f: torchdiffeq's RK4 (no structure) and explicit Lie–Euler (stays on SO(3), not
  symplectic);
* convergence against DOP853 (rtol 1e-13) of the heavy top: error vs h and fitted orders;
* wall-clock per step (noisy on shared machines: ratios within one run only).

    python experiments/rigid_body.py [--quick] [--long-steps N] [--Ns 8,16,32] [--out results]

Writes <out>/rigid_body/{long_run.png, convergence.png, table.md, table.json}.
``--quick`` runs 10× fewer long-run steps and fewer step sizes; ``--long-steps`` (free body; the
heavy top runs a fifth of it) and ``--Ns`` (the convergence study's step counts) override them.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np
import torch
from tqdm import tqdm

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from torchgeo_int.manifolds import so3  # noqa: E402
from torchgeo_int.manifolds.integrators import LIE_METHODS  # noqa: E402
from torchgeo_int.manifolds.systems import FreeRigidBody, HeavyTop  # noqa: E402
from torchgeo_int.rollout import run_loop  # noqa: E402

from experiments.problems import step_counts  # noqa: E402

METHODS = ["lie_midpoint_cayley", "lie_midpoint_exp", "lie_yoshida4_cayley", "lie_euler_cayley"]


def systems():
    return {"free_body": FreeRigidBody(torch.tensor([1.0, 2.0, 3.5])),
            "heavy_top": HeavyTop(torch.tensor([1.0, 1.3, 0.6]), mass=1.0, gravity=2.0,
                                  com=(0.1, -0.2, 0.5))}


def initial(system, n=4):
    gen = torch.Generator().manual_seed(11)
    g = so3.random_rotation(n, generator=gen)
    return g, torch.tensor([0.4, -1.1, 0.7]) + 0.2 * torch.randn(n, 3, generator=gen)


def embedded_rhs(system):
    def f(t, y):
        g, mu = y[..., :9].reshape(*y.shape[:-1], 3, 3), y[..., 9:]
        xi, mud = system.vector_field(g, mu)
        return torch.cat([(g @ so3.hat(xi)).flatten(-2), mud], -1)
    return f


def run_baseline(kind, system, g0, mu0, h, steps, save_every):
    """RK4 (torchdiffeq, fixed step) on the embedded equations, or explicit Lie–Euler."""
    if kind == "rk4":
        import torchdiffeq
        y0 = torch.cat([g0.flatten(-2), mu0], -1)
        t = torch.arange(0, steps + 1, save_every, dtype=y0.dtype) * h
        ys = torchdiffeq.odeint(embedded_rhs(system), y0, t, method="rk4",
                                options=dict(step_size=h))
        return ys[..., :9].reshape(*ys.shape[:-1], 3, 3), ys[..., 9:]
    g, mu, gs, ms = g0, mu0, [g0], [mu0]
    for k in range(steps):
        xi, mud = system.vector_field(g, mu)
        g, mu = g @ so3.cay(h * xi), mu + h * mud
        if (k + 1) % save_every == 0:
            gs.append(g)
            ms.append(mu)
    return torch.stack(gs), torch.stack(ms)


def invariants(name, system, g, mu):
    orth = so3.orthogonality_error(g)[0].amax(-1)
    E = system.energy(g, mu)
    dE = ((E - E[0]).abs() / E[0].abs()).amax(-1)
    if name == "free_body":
        cas = (mu.norm(dim=-1) / mu[0].norm(dim=-1) - 1).abs().amax(-1)
    else:
        c = system.casimirs(g, mu)[0]
        cas = (c - c[0]).abs().amax(-1)
    return orth, dE, cas


def long_run(free_body_steps):
    steps = {"free_body": free_body_steps, "heavy_top": max(free_body_steps // 5, 1)}
    h, save_every = 0.01, 10
    rows, curves = [], {}
    for name, system in systems().items():
        g0, mu0 = initial(system)
        runs = METHODS[:3] + ["rk4", "lie_euler_explicit"]
        for method in tqdm(runs, desc=f"long run {name}"):
            t0 = time.perf_counter()
            with torch.no_grad():
                if method in LIE_METHODS:
                    g, mu = run_loop(LIE_METHODS[method].step, g0, mu0, system=system, h=h,
                                     steps=steps[name], t0=0.0, save_every=save_every,
                                     check_every=256)
                else:
                    g, mu = run_baseline("rk4" if method == "rk4" else "euler", system, g0, mu0,
                                         h, steps[name], save_every)
            wall = time.perf_counter() - t0
            orth, dE, cas = invariants(name, system, g, mu)
            curves[(name, method)] = (orth.numpy(), dE.numpy(), cas.numpy())
            n = len(dE)
            rows.append(dict(system=name, method=method, steps=steps[name], h=h,
                             max_rel_energy_error=float(dE.max()),
                             energy_drift_ratio=float(dE[n // 2:].mean() / dE[1:n // 2].mean()),
                             max_orthogonality_error=float(orth.max()),
                             max_casimir_error=float(cas.max()),
                             us_per_step=1e6 * wall / steps[name]))
    return rows, curves, h * save_every


def convergence(Ns):
    system = systems()["heavy_top"]
    g0, mu0 = initial(system, 1)
    T = 1.7
    from scipy.integrate import solve_ivp
    f = embedded_rhs(system)
    sol = solve_ivp(lambda t, y: f(t, torch.tensor(y)).numpy(), (0, T),
                    torch.cat([g0.flatten(-2), mu0], -1)[0].numpy(), method="DOP853",
                    rtol=1e-13, atol=1e-13)
    ref = torch.tensor(sol.y[:, -1])
    Ns = list(Ns)
    out = {}
    for method in tqdm(METHODS + ["lie_euler_adjoint_exp", "lie_yoshida6_cayley"],
                       desc="convergence"):
        errs = []
        for N in Ns:
            with torch.no_grad():
                g, mu = run_loop(LIE_METHODS[method].step, g0, mu0, system=system, h=T / N,
                                 steps=N, t0=0.0, save_every=N, check_every=64)
            errs.append(float((torch.cat([g[-1].flatten(-2), mu[-1]], -1)[0] - ref).norm()))
        keep = [i for i, e in enumerate(errs) if 1e-11 < e < 1e-1]
        slope = (-np.polyfit(np.log(np.array(Ns)[keep]), np.log(np.array(errs)[keep]), 1)[0]
                 if len(keep) >= 2 else float("nan"))
        out[method] = dict(N=Ns, errors=errs, fitted_order=float(slope),
                           declared_order=LIE_METHODS[method].order)
    return out, T


def plots(out_dir, curves, dt, conv, T):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), constrained_layout=True)
    for r, name in enumerate(["free_body", "heavy_top"]):
        for (sname, method), (orth, dE, cas) in curves.items():
            if sname != name:
                continue
            t = np.arange(len(dE)) * dt
            for c, (y, label) in enumerate([(dE, "relative energy error"),
                                            (orth, "max |gᵀg − I|"),
                                            (cas, "|μ| error" if name == "free_body" else "Γ·μ error")]):
                axes[r, c].semilogy(t[1:], np.maximum(y[1:], 1e-17), label=method, lw=0.8)
                axes[r, c].set_title(f"{name}: {label}")
                axes[r, c].set_xlabel("t")
        axes[r, 0].legend(fontsize=7)
    fig.savefig(out_dir / "long_run.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 5))
    for method, d in conv.items():
        ax.loglog(T / np.array(d["N"]), d["errors"], "o-",
                  label=f"{method} (p≈{d['fitted_order']:.2f})")
    ax.set_xlabel("h")
    ax.set_ylabel(f"error at T = {T} (heavy top)")
    ax.legend(fontsize=7)
    fig.savefig(out_dir / "convergence.png", dpi=120)
    plt.close(fig)


def write_tables(out_dir, rows, conv, mode):
    lines = ["# Rigid body / heavy top on T*SO(3)", "",
             f"mode: {mode}; wall-clock numbers are noisy (shared CPU)", "",
             "| system | method | steps | max rel. energy err | drift ratio | max orth. err "
             "| max Casimir err | µs/step |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['system']} | {r['method']} | {r['steps']} | "
                     f"{r['max_rel_energy_error']:.2e} | {r['energy_drift_ratio']:.2f} | "
                     f"{r['max_orthogonality_error']:.1e} | {r['max_casimir_error']:.1e} | "
                     f"{r['us_per_step']:.0f} |")
    lines += ["", "drift ratio: mean energy error over the second half / first half "
              "(≈1 bounded, ≈3 linear drift)", "",
              "| method (heavy top) | declared order | fitted order |", "|---|---|---|"]
    for m, d in conv.items():
        lines.append(f"| {m} | {d['declared_order']} | {d['fitted_order']:.2f} |")
    (out_dir / "table.md").write_text("\n".join(lines) + "\n")
    (out_dir / "table.json").write_text(json.dumps(dict(mode=mode, long_run=rows, convergence=conv),
                                                   indent=1))
    print("\n".join(lines))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="10x fewer long-run steps, N ≤ 128")
    ap.add_argument("--long-steps", type=int, default=None,
                    help="free-body steps of the long run (heavy top: a fifth); "
                         "default 100000 (--quick: 10000)")
    ap.add_argument("--Ns", type=step_counts, default=None,
                    help="step counts of the convergence study, e.g. 8,16,32; "
                         "default 8,…,512 (--quick: 8,…,128)")
    ap.add_argument("--out", default="results", help="writes <out>/rigid_body/")
    args = ap.parse_args(argv)
    long_steps = args.long_steps if args.long_steps is not None else (10_000 if args.quick else 100_000)
    if long_steps < 200:
        ap.error(f"--long-steps must be at least 200 (states are saved every 10 steps and the heavy "
                 f"top runs a fifth of them), got {long_steps}")
    Ns = args.Ns if args.Ns is not None else (
        [8, 16, 32, 64, 128] if args.quick else [8, 16, 32, 64, 128, 256, 512])
    custom = args.long_steps is not None or args.Ns is not None
    mode = ("quick" if args.quick else "full") + (f" (long run {long_steps} steps, N = "
                                                  f"{', '.join(map(str, Ns))})" if custom else "")
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    out_dir = pathlib.Path(args.out) / "rigid_body"
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, curves, dt = long_run(long_steps)
    conv, T = convergence(Ns)
    plots(out_dir, curves, dt, conv, T)
    write_tables(out_dir, rows, conv, mode)
    return dict(long_run=rows, convergence=conv)


if __name__ == "__main__":
    main()
