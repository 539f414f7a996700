"""Peak memory and time of one HNN training step through a long rollout, per gradient mode.

    python -m experiments.bench.memory [--quick]

Each (mode, steps) runs in a fresh subprocess; peak memory is the rise of the process's
high-water mark (ru_maxrss) during the training step (on CUDA: torch.cuda.max_memory_allocated).
Modes: rollout grad = backprop / checkpoint / reversible (verlet), and torchdiffeq odeint
(rk4, backprop) / odeint_adjoint (rk4) on the same separable MLP Hamiltonian.
Also measures the reversible reconstruction error |x̂₀ − x₀| after N steps back and forth.
Writes results/bench/memory.{md,json,png}.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import time

RESULTS = pathlib.Path("results/bench")
MODES = ["backprop", "checkpoint", "reversible", "torchdiffeq", "torchdiffeq_adjoint"]


def build(batch, device, dtype):
    import torch
    from torch import nn

    import torchgeo_int as tgi

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    net = net.to(device=device, dtype=dtype)

    class Potential(nn.Module):   # a module, so the lean gradient modes find its parameters
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, q):
            return self.net(q).squeeze(-1)

    system = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), Potential())
    q0 = torch.randn(batch, 2, device=device, dtype=dtype)
    p0 = torch.randn(batch, 2, device=device, dtype=dtype)
    return system, net, q0, p0


def one_step(mode, steps, batch, device, dtype_name):
    """Run in the child: one forward+backward, report time and peak memory."""
    import torch

    import torchgeo_int as tgi

    dtype = getattr(torch, dtype_name)
    system, net, q0, p0 = build(batch, device, dtype)
    h = 0.01
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if mode.startswith("torchdiffeq"):
        import torchdiffeq

        class F(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = net

            def forward(self, t, y):
                q, p = y[..., :2], y[..., 2:]
                return torch.cat([system.velocity(p), system.force(q)], -1)

        f = F()
        solve = torchdiffeq.odeint_adjoint if mode.endswith("adjoint") else torchdiffeq.odeint
        t = torch.tensor([0.0, steps * h], device=device, dtype=dtype)
        y = solve(f, torch.cat([q0, p0], -1), t, method="rk4", options=dict(step_size=h))[-1]
        q, p = y[..., :2], y[..., 2:]
    else:
        qs, ps = tgi.rollout(system, q0, p0, h=h, steps=steps, method="verlet", grad=mode,
                             save_every=steps)
        q, p = qs[-1], ps[-1]
    loss = (q ** 2).mean() + (p ** 2).mean()
    loss.backward()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2 ** 20
    else:
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024  # KiB → MiB
    return dict(mode=mode, steps=steps, seconds=time.perf_counter() - t0, peak_mib=peak)


def reconstruction_error(steps_list, dtype_name):
    import torch

    import torchgeo_int as tgi

    dtype = getattr(torch, dtype_name)
    system, _, q0, p0 = build(64, "cpu", dtype)
    out = []
    with torch.no_grad():
        for n in steps_list:
            q, p = tgi.rollout(system, q0, p0, h=0.01, steps=n, save_every=n)
            qb, pb = tgi.rollout(system, q[-1], p[-1], h=-0.01, steps=n, save_every=n)
            err = torch.maximum((qb[-1] - q0).abs().max(), (pb[-1] - p0).abs().max())
            out.append(dict(steps=n, dtype=dtype_name, max_abs_error=float(err)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", nargs=5, metavar=("MODE", "STEPS", "BATCH", "DEVICE", "DTYPE"))
    args = ap.parse_args(argv)
    if args.child:
        mode, steps, batch, device, dtype = args.child
        print(json.dumps(one_step(mode, int(steps), int(batch), device, dtype)))
        return
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    steps_list = [100, 300, 1000] if args.quick else [100, 1000, 10000]
    batch = 256 if args.quick else 1024  # big enough that the graph, not allocator noise, dominates RSS
    rows = []
    try:
        from tqdm import tqdm
    except ImportError:  # progress is a nicety
        tqdm = lambda x, **k: x
    jobs = [(m, n) for n in steps_list for m in MODES]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for mode, n in tqdm(jobs, desc="memory"):
        cmd = [sys.executable, "-m", "experiments.bench.memory", "--child", mode, str(n), str(batch),
               device, "float32"]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    recon = reconstruction_error([100, 1000, 10000, 100000] if not args.quick else [100, 1000, 10000],
                                 "float64") + reconstruction_error([100, 1000, 10000], "float32")

    RESULTS.mkdir(parents=True, exist_ok=True)
    lines = [f"# Memory per training step (verlet, batch {batch}, float32, {device})", "",
             "| mode | " + " | ".join(f"{n} steps: MiB / s" for n in steps_list) + " |",
             "|---|" + "---|" * len(steps_list)]
    for m in MODES:
        cells = []
        for n in steps_list:
            r = next(r for r in rows if r["mode"] == m and r["steps"] == n)
            cells.append(f"{r['peak_mib']:.1f} / {r['seconds']:.2f}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += ["", "Reversible reconstruction error max|x̂₀ − x₀| after N steps forward and N back:", "",
              "| dtype | steps | error |", "|---|---|---|"]
    lines += [f"| {r['dtype']} | {r['steps']} | {r['max_abs_error']:.2e} |" for r in recon]
    text = "\n".join(lines)
    print(text)
    (RESULTS / "memory.md").write_text(text + "\n")
    (RESULTS / "memory.json").write_text(json.dumps(dict(rows=rows, reconstruction=recon), indent=1))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for m in MODES:
            rs = [r for r in rows if r["mode"] == m]
            ax.loglog([r["steps"] for r in rs], [max(r["peak_mib"], 0.1) for r in rs], "o-", label=m)
        ax.set_xlabel("rollout steps")
        ax.set_ylabel("peak memory of a training step [MiB]")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(RESULTS / "memory.png", dpi=120)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
