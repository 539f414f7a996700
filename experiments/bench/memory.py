"""Peak memory and time of one HNN training step through a long rollout, per gradient mode.

    OMP_NUM_THREADS=1 python -m experiments.bench.memory [--quick] [--implicit] [--mem-cap-gib 12]

Each (mode, steps) runs in a fresh subprocess (one forward + backward of a loss on the final
state, batch 1024 — 256 with --quick —, float32, a separable MLP Hamiltonian, h = 0.01) and
reports three numbers:

* **graph MiB**: the peak of the bytes held by autograd's saved tensors (counted through
  ``torch.autograd.graph.saved_tensors_hooks``, each storage once, released when autograd frees
  it, recomputation during backward included) — what the gradient mode controls, exact and
  free of allocator noise;
* **RSS MiB**: the rise of the process's high-water mark (ru_maxrss) during the step — the
  honest total (graph, transients, allocator slack); on CUDA torch.cuda.max_memory_allocated;
* **s**: wall time of the step (it includes the counting hooks, a few per cent).

A child that exceeds ``--mem-cap-gib`` of address space (RLIMIT_AS, CPU only; it keeps a cell
that needs tens of GB from taking the machine down) is reported as OOM.
Modes: ``tgi.rollout(grad=backprop|checkpoint|reversible)`` (verlet), ``tgi.odeint`` (verlet,
``options=dict(hamiltonian=H, separable=True, grad=checkpoint|reversible)``), and torchdiffeq
``odeint`` (rk4, backprop) / ``odeint_adjoint`` (rk4) on the same Hamiltonian's field.
Also measures the reversible reconstruction error |x̂₀ − x₀| after N steps forward and N back
(float64 and float32).  Writes results/bench/memory.{md,json,png}.

``--implicit``: the same for implicit midpoint on a non-separable MLP Hamiltonian H_θ(q, p)
(2·2→64→64→1, h = 0.01), modes ``implicit_backprop|implicit_checkpoint|implicit_reversible``
at 100/300/1000 steps, and the reconstruction error of the −h solves.  Writes
results/bench/memory_implicit.{md,json}.
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
MODES = ["backprop", "checkpoint", "reversible", "odeint_checkpoint", "odeint_reversible",
         "torchdiffeq", "torchdiffeq_adjoint"]
IMPLICIT_MODES = ["implicit_backprop", "implicit_checkpoint", "implicit_reversible"]


class SavedTensorMeter:
    """Bytes held by autograd's saved tensors, now and at the peak, while the context is active:
    ``with SavedTensorMeter() as m: loss.backward()`` then ``m.peak`` (bytes).

    Every tensor autograd saves for backward passes the pack hook; its storage is counted once
    however many nodes save it (parameters, shared views) and until the last of them is freed
    (the packed handle's ``__del__``).  Tensors saved by the backward pass itself (recomputed
    segments, reversible steps) are counted too: the hooks are in the thread-local state the
    autograd engine runs under."""

    def __init__(self):
        self.live, self.current, self.peak = {}, 0, 0

    def __enter__(self):
        import torch
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, _Held.unpack)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)

    def _pack(self, t):
        storage = t.untyped_storage()
        key = (storage.data_ptr(), str(t.device))
        nbytes, count = self.live.get(key, (storage.nbytes(), 0))
        if count == 0:
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        self.live[key] = (nbytes, count + 1)
        return _Held(self, key, t.detach())   # no grad_fn: no cycle tensor → node → handle

    def _release(self, key):
        nbytes, count = self.live[key]
        if count == 1:
            del self.live[key]
            self.current -= nbytes
        else:
            self.live[key] = (nbytes, count - 1)


class _Held:
    __slots__ = ("meter", "key", "tensor")

    def __init__(self, meter, key, tensor):
        self.meter, self.key, self.tensor = meter, key, tensor

    @staticmethod
    def unpack(held):
        return held.tensor

    def __del__(self):
        self.meter._release(self.key)


def build(batch, device, dtype, separable=True):
    import torch
    from torch import nn

    import torchgeo_int as tgi

    torch.manual_seed(0)
    n_in = 2 if separable else 4
    net = nn.Sequential(nn.Linear(n_in, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    net = net.to(device=device, dtype=dtype)
    if not separable:
        class MLPHamiltonian(tgi.Hamiltonian):   # H = ½|p|² + ½|q|² + 0.1·MLP(q, p)
            def __init__(self):
                super().__init__()
                self.net = net

            def hamiltonian(self, q, p):
                z = torch.cat([q, p], -1)
                return 0.5 * (z * z).sum(-1) + 0.1 * self.net(z).squeeze(-1)

        q0 = torch.randn(batch, 2, device=device, dtype=dtype)
        p0 = torch.randn(batch, 2, device=device, dtype=dtype)
        return MLPHamiltonian(), net, q0, p0

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
    """Run in the child: one forward+backward, report time, graph and RSS peaks."""
    import torch

    import torchgeo_int as tgi

    dtype = getattr(torch, dtype_name)
    implicit = mode.startswith("implicit_")
    system, net, q0, p0 = build(batch, device, dtype, separable=not implicit)
    h = 0.01
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    meter = SavedTensorMeter()
    with meter:
        if implicit:
            qs, ps = tgi.rollout(system, q0, p0, h=h, steps=steps, method="implicit_midpoint",
                                 grad=mode.split("_", 1)[1], save_every=steps)
            q, p = qs[-1], ps[-1]
        elif mode.startswith("torchdiffeq"):
            import torchdiffeq

            class F(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.net = net

                def forward(self, t, y):
                    q, p = y[..., :2], y[..., 2:]
                    return torch.cat([system.velocity(p), system.force(q)], -1)

            solve = torchdiffeq.odeint_adjoint if mode.endswith("adjoint") else torchdiffeq.odeint
            t = torch.tensor([0.0, steps * h], device=device, dtype=dtype)
            y = solve(F(), torch.cat([q0, p0], -1), t, method="rk4", options=dict(step_size=h))[-1]
            q, p = y[..., :2], y[..., 2:]
        elif mode.startswith("odeint_"):
            class H(torch.nn.Module):      # a module: odeint finds its parameters
                def __init__(self):
                    super().__init__()
                    self.system = system

                def forward(self, q, p):
                    return self.system.energy(q, p)

            t = torch.tensor([0.0, steps * h], device=device, dtype=dtype)
            qs, ps = tgi.odeint(None, (q0, p0), t, method="verlet",
                                options=dict(step_size=h, hamiltonian=H(), separable=True,
                                             grad=mode.split("_", 1)[1]))
            q, p = qs[-1], ps[-1]
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
    return dict(mode=mode, steps=steps, seconds=time.perf_counter() - t0, peak_mib=peak,
                graph_mib=meter.peak / 2 ** 20, oom=False)


def run_child(mode, steps, batch, device, dtype_name, cap_gib):
    """One cell in a fresh process; an out-of-memory child becomes a row with oom=True."""
    cmd = [sys.executable, "-m", "experiments.bench.memory", "--child", mode, str(steps),
           str(batch), device, dtype_name, "--mem-cap-gib", str(cap_gib)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = res.stdout.strip().splitlines()
    if res.returncode == 0 and lines:
        return json.loads(lines[-1])
    err = res.stderr.strip().splitlines()
    if any(w in res.stderr for w in ("can't allocate memory", "MemoryError", "out of memory")) \
            or res.returncode in (-9, 137):
        return dict(mode=mode, steps=steps, seconds=None, peak_mib=None, graph_mib=None,
                    oom=True, cap_gib=cap_gib)
    raise RuntimeError(f"memory bench child {mode} {steps} failed ({res.returncode}): "
                       + "\n".join(err[-5:]))


def reconstruction_error(steps_list, dtype_name, method="verlet"):
    """max|x̂₀ − x₀| after n steps of h and n of −h (verlet: the separable MLP H; implicit
    midpoint: the non-separable one, each −h step a solve to the default tolerance)."""
    import torch

    import torchgeo_int as tgi

    dtype = getattr(torch, dtype_name)
    system, _, q0, p0 = build(64, "cpu", dtype, separable=method == "verlet")
    out = []
    with torch.no_grad():
        for n in steps_list:
            q, p = tgi.rollout(system, q0, p0, h=0.01, steps=n, save_every=n, method=method)
            qb, pb = tgi.rollout(system, q[-1], p[-1], h=-0.01, steps=n, save_every=n,
                                 method=method)
            err = torch.maximum((qb[-1] - q0).abs().max(), (pb[-1] - p0).abs().max())
            out.append(dict(steps=n, dtype=dtype_name, max_abs_error=float(err)))
    return out


def _cell(r):
    if r["oom"]:
        return f"OOM (> {r['cap_gib']:g} GiB)"
    return f"{r['graph_mib']:.1f} / {r['peak_mib']:.0f} / {r['seconds']:.1f}"


def table(rows, recon, steps_list, batch, device, cap_gib, modes=MODES, method="verlet"):
    lines = [f"Memory of one training step ({method}, batch {batch}, float32, {device}), "
             "per cell: peak autograd graph MiB / peak RSS rise MiB / seconds:", "",
             "| mode | " + " | ".join(f"{n} steps" for n in steps_list) + " |",
             "|---|" + "---|" * len(steps_list)]
    for m in modes:
        cells = [_cell(next(r for r in rows if r["mode"] == m and r["steps"] == n))
                 for n in steps_list]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    oom = [r for r in rows if r["oom"]]
    if oom:
        lines += ["", f"OOM: the child exceeded its {cap_gib:g} GiB address-space cap (graph "
                  "memory grows linearly in steps for these modes)."]
    lines += ["", "Reversible reconstruction error max|x̂₀ − x₀| after N steps forward and N back "
              "(batch 64, |x₀| ~ 1):", "", "| dtype | steps | error |", "|---|---|---|"]
    lines += [f"| {r['dtype']} | {r['steps']} | {r['max_abs_error']:.2e} |" for r in recon]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--implicit", action="store_true",
                    help="implicit midpoint on a non-separable H instead of verlet")
    ap.add_argument("--child", nargs=5, metavar=("MODE", "STEPS", "BATCH", "DEVICE", "DTYPE"))
    ap.add_argument("--mem-cap-gib", type=float, default=12.0,
                    help="address-space cap of each child on CPU (default 12)")
    args = ap.parse_args(argv)
    if args.child:
        mode, steps, batch, device, dtype = args.child
        if device == "cpu" and args.mem_cap_gib > 0:
            cap = int(args.mem_cap_gib * 2 ** 30)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        print(json.dumps(one_step(mode, int(steps), int(batch), device, dtype)))
        return
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.implicit:
        return main_implicit(args, device)
    steps_list = [100, 300, 1000] if args.quick else [100, 1000, 10000]
    batch = 256 if args.quick else 1024  # big enough that the graph, not allocator noise, dominates RSS
    rows = _measure(MODES, steps_list, batch, device, args.mem_cap_gib)
    recon = reconstruction_error([100, 1000, 10000, 100000] if not args.quick else [100, 1000, 10000],
                                 "float64") + reconstruction_error([100, 1000, 10000], "float32")
    text = table(rows, recon, steps_list, batch, device, args.mem_cap_gib)
    _write("memory", "Memory per training step", text, rows, recon, batch, device)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for m in MODES:
            rs = [r for r in rows if r["mode"] == m and not r["oom"]]
            ax.loglog([r["steps"] for r in rs], [max(r["graph_mib"], 0.01) for r in rs], "o-", label=m)
        ax.set_xlabel("rollout steps")
        ax.set_ylabel("peak autograd graph of a training step [MiB]")
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(RESULTS / "memory.png", dpi=120)
    except ImportError:
        pass


def main_implicit(args, device):
    steps_list = [30, 100] if args.quick else [100, 300, 1000]
    batch = 256 if args.quick else 1024
    rows = _measure(IMPLICIT_MODES, steps_list, batch, device, args.mem_cap_gib)
    lengths = [100, 1000] if args.quick else [100, 1000, 10000]
    recon = (reconstruction_error(lengths, "float64", "implicit_midpoint")
             + reconstruction_error(lengths, "float32", "implicit_midpoint"))
    text = table(rows, recon, steps_list, batch, device, args.mem_cap_gib, IMPLICIT_MODES,
                 "implicit midpoint, a non-separable MLP Hamiltonian")
    _write("memory_implicit", "Memory per training step, implicit midpoint", text, rows, recon,
           batch, device)


def _measure(modes, steps_list, batch, device, cap_gib):
    """One child process per (mode, steps), with progress."""
    try:
        from tqdm import tqdm
    except ImportError:  # progress is a nicety
        tqdm = lambda x, **k: x  # noqa: E731
    jobs = [(m, n) for n in steps_list for m in modes]
    return [run_child(m, n, batch, device, "float32", cap_gib) for m, n in tqdm(jobs, desc="memory")]


def _write(stem, heading, text, rows, recon, batch, device):
    """Print the table; write results/bench/<stem>.{md,json}."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    print(text)
    (RESULTS / f"{stem}.md").write_text(f"# {heading}\n\n{text}\n")
    (RESULTS / f"{stem}.json").write_text(json.dumps(dict(rows=rows, reconstruction=recon,
                                                          batch=batch, device=device), indent=1))


if __name__ == "__main__":
    main()
