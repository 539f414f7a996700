"""The main demo (`make demo`, about 2 minutes on 2 CPU cores).

1. The outer solar system (Hairer–Lubich–Wanner I.2.3) over 2·10⁵ days and Kepler (e = 0.6) over
   50 periods, with our symplectic methods and with torchdiffeq's rk4 / dopri5: a table of steps,
   wall time, max relative energy error and final position error against a tight reference,
   and PNGs of the energy error vs time and the orbits, under results/demo/.
2. An HNN trained through symplectic steps on the pendulum for a minute, next to the
   derivative-matching baseline (Greydanus et al. 2019).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

import torch
import torchdiffeq

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import torchgeo_int as tgi  # noqa: E402
from experiments.problems import kepler_energy, kepler_initial, kepler_system, outer_solar_system  # noqa: E402

OUT = pathlib.Path("results/demo")


def run_ours(system, q0, p0, method, h, steps, save_every):
    t = time.perf_counter()
    with torch.no_grad():
        q, p = tgi.rollout(system, q0, p0, h=h, steps=steps, method=method, save_every=save_every)
    return q, p, time.perf_counter() - t


def run_torchdiffeq(system, q0, p0, method, h, steps, save_every, rtol=None):
    n = q0.numel()

    def f(t, y):
        q, p = y[:n].reshape(q0.shape), y[n:].reshape(p0.shape)
        return torch.cat([system.velocity(p).reshape(-1), system.force(q).reshape(-1)])

    ts = torch.arange(0, steps + 1, save_every, dtype=q0.dtype) * h
    opts = dict(method=method, options=dict(step_size=h)) if rtol is None else \
        dict(method=method, rtol=rtol, atol=rtol)
    t = time.perf_counter()
    with torch.no_grad():
        y = torchdiffeq.odeint(f, torch.cat([q0.reshape(-1), p0.reshape(-1)]), ts, **opts)
    return y[:, :n].reshape(-1, *q0.shape), y[:, n:].reshape(-1, *p0.shape), time.perf_counter() - t


def study(name, system, energy, q0, p0, T, h, save_every, ref, configs):
    rows, curves = [], {}
    E0 = energy(q0, p0)
    for label, kind, method, hh, extra in configs:
        steps = round(T / hh)
        se = max(1, round(save_every * h / hh))
        if kind == "ours":
            q, p, sec = run_ours(system, q0, p0, method, hh, steps, se)
        else:
            q, p, sec = run_torchdiffeq(system, q0, p0, method, hh, steps, se, **extra)
        rel = ((energy(q, p) - E0) / E0).abs()
        err = float((q[-1] - ref).norm() / ref.norm())
        rows.append(dict(problem=name, method=label, steps=steps, h=hh, seconds=sec,
                         max_rel_energy_error=float(rel.max()), final_position_error=err))
        curves[label] = (torch.arange(len(rel)) * se * hh, rel, q)
        print(f"  {label:<28} {steps:>7} {sec:>8.2f} {float(rel.max()):>14.2e} {err:>14.2e}", flush=True)
    return rows, curves


def plot(name, curves, orbit_dims):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, (t, rel, q) in curves.items():
        ax.semilogy(t, rel.clamp_min(1e-17), label=label, lw=0.8)
    ax.set_xlabel("t")
    ax.set_ylabel("|H − H₀| / |H₀|")
    ax.set_title(f"{name}: relative energy error")
    ax.legend(fontsize=7)
    label = next(iter(curves))
    q = curves[label][2]
    for body in orbit_dims:
        bx.plot(q[:, body, 0], q[:, body, 1], lw=0.5) if q.dim() == 3 else bx.plot(q[:, 0], q[:, 1], lw=0.5)
        if q.dim() == 2:
            break
    bx.set_aspect("equal")
    bx.set_title(f"{name}: orbits ({label})")
    fig.tight_layout()
    path = OUT / f"{name.replace(' ', '_')}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def reference_solution(f, y0, T):
    from scipy.integrate import solve_ivp

    sol = solve_ivp(f, (0.0, T), y0, method="DOP853", rtol=1e-13, atol=1e-16)
    return sol.y[:, -1]


def main(argv=None):
    ap = argparse.ArgumentParser(description="torchgeo_int main demo")
    ap.add_argument("--quick", action="store_true", help="smoke-test sizes (seconds)")
    ap.add_argument("--hnn-seconds", type=float, default=60.0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # tiny tensors: threads only add overhead
    OUT.mkdir(parents=True, exist_ok=True)
    import numpy as np

    header = f"  {'method':<28} {'steps':>7} {'wall s':>8} {'max |ΔH/H|':>14} {'final q err':>14}"
    # --- outer solar system ---
    system, q0, p0, m = outer_solar_system()
    T = 2e4 if args.quick else 2e5
    n = q0.numel()

    def f_np(t, y):
        q = torch.tensor(y[:n]).reshape(6, 3)
        p = torch.tensor(y[n:]).reshape(6, 3)
        return np.concatenate([system.velocity(p).reshape(-1).numpy(), system.force(q).reshape(-1).numpy()])

    ref = torch.tensor(reference_solution(f_np, np.concatenate([q0.reshape(-1), p0.reshape(-1)]), T)[:n]).reshape(6, 3)
    print(f"Outer solar system, T = {T:g} days (reference: scipy DOP853, rtol 1e-13)\n{header}")
    configs = [("verlet h=10", "ours", "verlet", 10.0, {}),
               ("yoshida4 h=10", "ours", "yoshida4", 10.0, {}),
               ("kahan_li8 h=50", "ours", "kahan_li8", 50.0, {}),
               ("torchdiffeq rk4 h=10", "td", "rk4", 10.0, {}),
               ("torchdiffeq dopri5 tol=1e-8", "td", "dopri5", 10.0, dict(rtol=1e-8))]
    rows, curves = study("outer solar system", system, system.energy, q0, p0, T, 10.0, 20, ref, configs)
    png1 = plot("outer solar system", curves, range(6))
    # --- Kepler ---
    e, periods = 0.6, (5 if args.quick else 50)
    T = 2 * math.pi * periods
    kq0, kp0 = kepler_initial(e)
    ksys = kepler_system()
    kref = torch.tensor(reference_solution(
        lambda t, y: np.concatenate([y[2:], -y[:2] / np.linalg.norm(y[:2]) ** 3]),
        np.concatenate([kq0.numpy(), kp0.numpy()]), T)[:2])
    print(f"\nKepler e = {e}, {periods} periods (reference: scipy DOP853)\n{header}")
    kconfigs = [("verlet h=0.01", "ours", "verlet", 0.01, {}),
                ("yoshida4 h=0.02", "ours", "yoshida4", 0.02, {}),
                ("implicit_midpoint h=0.01", "ours", "implicit_midpoint", 0.01, {}),
                ("torchdiffeq rk4 h=0.01", "td", "rk4", 0.01, {}),
                ("torchdiffeq dopri5 tol=1e-8", "td", "dopri5", 0.01, dict(rtol=1e-8))]
    if args.quick:
        kconfigs = [c for c in kconfigs if "implicit" not in c[0]]
    krows, kcurves = study("Kepler", ksys, kepler_energy, kq0, kp0, T, 0.01, 10, kref, kconfigs)
    png2 = plot("Kepler", kcurves, [0])
    (OUT / "integrators.json").write_text(json.dumps(rows + krows, indent=1))
    md = ["| problem | method | steps | wall s | max rel. energy error | final position error |",
          "|---|---|---|---|---|---|"]
    md += [f"| {r['problem']} | {r['method']} | {r['steps']} | {r['seconds']:.2f} | "
           f"{r['max_rel_energy_error']:.2e} | {r['final_position_error']:.2e} |" for r in rows + krows]
    (OUT / "integrators.md").write_text("\n".join(md) + "\n")
    print(f"\nwrote {png1}, {png2}, {OUT / 'integrators.md'}")

    # --- HNN ---
    try:
        from experiments.hnn import demo_pendulum
    except ImportError as err:  # the demo still shows the integrators
        print(f"\n(HNN demo unavailable: {err})")
        return
    seconds = 8.0 if args.quick else args.hnn_seconds
    print(f"\nHNN on the pendulum (Greydanus et al. task), ~{seconds:.0f} s of training:")
    r = demo_pendulum(seconds=seconds, progress=True)
    s, d = r["symplectic"], r["derivative_matching"]
    print(f"  trained through symplectic steps ({s['method']}): energy MSE {s['energy_mse']:.3e}, "
          f"state MSE {s['state_mse']:.3e}")
    print(f"  derivative matching (baseline):          energy MSE {d['energy_mse']:.3e}, "
          f"state MSE {d['state_mse']:.3e}")
    print(f"  energy-MSE ratio symplectic / baseline: {r['energy_mse_ratio']:.2f}")
    (OUT / "hnn.json").write_text(json.dumps(r, indent=1, default=float))


if __name__ == "__main__":
    main()
