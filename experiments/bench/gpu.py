"""The throughput table on a GPU: batches up to 10⁷ trajectories, float32 and float64.

    python -m experiments.bench.gpu [--quick] [--batches ...] [--dtypes float32 float64]

On CUDA (when ``torch.cuda.is_available()``): Kepler as in ``throughput``, batches 10⁴ … 10⁷
(--quick: 10⁴, 10⁵), both dtypes, every configuration of ``throughput`` (hand-written loops,
the hand Verlet loop compiled, ours eager and compile=True, energy-defined Kepler, implicit
midpoint, torchdiffeq rk4); each timing is
bracketed by ``torch.cuda.synchronize`` and the peak memory of one run is
``torch.cuda.max_memory_allocated`` above what was allocated before it.  One Kepler system per
dtype is shared across batch sizes, so each compiled graph is compiled twice (static, then
shape-dynamic), not once per batch size.  Prints a line per batch size as it goes.

Without CUDA it runs the same code on the CPU at small sizes (batches 1 and 256, --quick: 64)
so that it is tested; the numbers are then the CPU's.

Writes results/bench/gpu.{md,json,png}, after every batch size (a run cut short keeps what it measured).
"""
from __future__ import annotations

import time

import torch

from . import common, throughput

GPU_BATCHES = [10 ** 4, 10 ** 5, 10 ** 6, 10 ** 7]
GPU_QUICK = [10 ** 4, 10 ** 5]
CPU_BATCHES = [1, 256]
CPU_QUICK = [64]
# The GPU table: the eager and compiled forms of ours against the hand loops (eager, and the
# compiled one: the practical limit there), final state and every state kept.
GPU_CONFIGS = ["hand_verlet", "hand_verlet+compile", "verlet", "verlet+compile", "verlet(save all)",
               "verlet+compile(save all)", "verlet(energies)", "verlet+compile(energies)",
               "hand_yoshida4", "yoshida4", "yoshida4+compile", "hand_midpoint", "implicit_midpoint",
               "implicit_midpoint+compile", "torchdiffeq_rk4"]


def main(argv=None):
    ap = throughput.add_arguments(common.parser(__doc__))
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"],
                    choices=["float32", "float64"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    out = common.setup(args)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    args.repeats = args.repeats or (2 if args.quick else 3)
    batches = args.batches or ((GPU_QUICK if args.quick else GPU_BATCHES) if cuda
                               else (CPU_QUICK if args.quick else CPU_BATCHES))
    configs = args.configs or (GPU_CONFIGS if cuda else None)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        print(f"GPU: {torch.cuda.get_device_name(device)}")
    else:
        print("no CUDA device: running the GPU table on the CPU at small sizes")
    where = torch.cuda.get_device_name(device) if cuda else "CPU (no CUDA device)"
    rows, t0, md, md_r = [], time.perf_counter(), "", ""
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        shared, _, _ = throughput.kepler_batch(1, dtype=dtype, device=device)
        for b in batches:
            try:
                part = throughput.measure(b, args, device=device, dtype=dtype, names=configs,
                                          system=shared)
            except torch.cuda.OutOfMemoryError as err:   # report, keep the smaller sizes
                print(f"batch {b} {dtype_name}: out of memory ({err}); skipped")
                torch.cuda.empty_cache()
                continue
            for r in part:
                r["dtype"] = dtype_name
            rows += part
            best = max(part, key=lambda r: r["throughput"])
            print(f"{dtype_name} batch {b}: best {best['config']} {best['throughput']:.3g} "
                  f"steps·traj/s ({time.perf_counter() - t0:.0f} s so far)", flush=True)
            md, md_r = _write(rows, args, out, where, cuda, time.perf_counter() - t0)
    if not rows:   # every batch size out of memory: the (empty) report all the same
        md, md_r = _write(rows, args, out, where, cuda, time.perf_counter() - t0)
    print(md + "\n\n" + md_r)
    print(f"wrote {out / 'gpu.md'}")
    return rows


def _write(rows, args, out, where, cuda, seconds):
    """The tables so far (written after every batch size, so a run cut short keeps them)."""
    ratios = []
    for dtype_name in args.dtypes:
        for r in throughput.ratio_rows([x for x in rows if x["dtype"] == dtype_name]):
            r["dtype"] = dtype_name
            ratios.append(r)
    cols = [("dtype", "dtype")] + throughput.COLUMNS + ([("cuda_peak_MiB", "CUDA peak MiB")] if cuda else [])
    md = common.markdown_table(rows, cols)
    md_r = common.markdown_table(ratios, [("dtype", "dtype"), ("batch", "batch"), ("ratio", "time ratio"),
                                          ("value", "value"), ("goal", "goal ≤"), ("meets", "meets")])
    setup = (f"Kepler e = 0.6 (±2 %), h = {throughput.H}, {where}, no autograd, best of "
             f"{args.repeats}; {seconds:.0f} s in all")
    plot_rows = [dict(r, config=f"{r['config']} {r['dtype']}") for r in rows]
    throughput.plot(plot_rows, out / "gpu.png", f"Kepler throughput, {where}")
    common.write(out, "gpu", "GPU throughput", [("Setup", setup), ("Throughput", md + "\n\n![gpu](gpu.png)"),
                                                ("Ratios", md_r)], dict(setup=setup, rows=rows, ratios=ratios))
    return md, md_r


if __name__ == "__main__":
    main()
