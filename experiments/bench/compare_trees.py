"""Throughput and memory of two checkouts of torchgeo_int, side by side (a refactor's before/after).

    OMP_NUM_THREADS=1 python experiments/bench/compare_trees.py --before REV --after REV \
        [--rounds 7] [--memory-repeats 3] [--quick] [--out results/bench/compare_trees.md]

REV: a directory holding ``torchgeo_int`` (a worktree) or a git revision of this repository
(:func:`experiments.trees.tree`).  Each tree's ``torchgeo_int`` runs in its own worker process
(:class:`experiments.trees.Worker`, one thread); the measuring code is
this checkout's ``experiments.bench`` (``throughput.configurations``, ``memory.one_step``), so
both trees run identical benchmarks through the public API.  Rows:

* throughput: rollouts of Kepler (``throughput.kepler_batch``, h = 0.01, float64, no autograd) —
  eager ``verlet`` / ``yoshida4`` / ``implicit_midpoint`` (final state), ``verlet(save all)``,
  the ``+compile`` rows, and ``odeint`` (verlet on an analytic separable ``func``, as
  ``experiments.bench.limits --sections odeint``);
* memory: one HNN training step (``memory.one_step``: forward + backward through 1000 verlet
  steps, batch 256, float32) per gradient mode, each in a fresh process: graph MiB (autograd's
  saved tensors: deterministic), RSS rise and seconds.

The two workers are driven in rounds — before, after, after, before, ... — so a shared machine's
load falls on both alike; each cell is the best of its rounds, and the table gives after/before.
Compilation (the first call of a ``+compile`` row) is done once per worker, outside the timings.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]   # this checkout: its experiments package
#: (config of ``throughput.configurations`` or "odeint", batch, steps)
ROWS = [("verlet", 1, 1024), ("verlet", 64, 1024), ("verlet", 4096, 128),
        ("yoshida4", 1, 512), ("yoshida4", 4096, 64),
        ("verlet(save all)", 64, 1024),
        ("implicit_midpoint", 1, 256), ("implicit_midpoint", 4096, 32),
        ("verlet+compile", 64, 1024), ("verlet+compile", 4096, 128),
        ("yoshida4+compile", 4096, 64), ("verlet+compile(save all)", 64, 1024),
        ("implicit_midpoint+compile", 64, 128),
        ("odeint", 1, 1024), ("odeint", 4096, 128)]
QUICK_ROWS = [("verlet", 64, 256), ("verlet+compile", 64, 256), ("odeint", 64, 256)]
#: --rows every_state: rollouts that keep every state (output rows, compiled blocks written into
#: them) and implicit midpoint at a middling batch (compiled fixed-point iterations)
EVERY_STATE_ROWS = [("verlet(save all)", 4096, 256), ("verlet(save all)", 65536, 32),
                    ("verlet+compile(save all)", 1, 1024), ("verlet+compile(save all)", 64, 1024),
                    ("verlet+compile(save all)", 4096, 256), ("implicit_midpoint", 256, 64),
                    ("implicit_midpoint+compile", 256, 64)]
MEMORY_MODES = ["backprop", "checkpoint", "reversible", "odeint_checkpoint", "odeint_reversible"]


def _import_tree(tree):
    """torchgeo_int from ``tree``, then this checkout's experiments (which import it by name)."""
    sys.path.insert(0, str(tree))
    import torchgeo_int
    if not pathlib.Path(torchgeo_int.__file__).resolve().is_relative_to(pathlib.Path(tree).resolve()):
        raise RuntimeError(f"torchgeo_int came from {torchgeo_int.__file__}, not {tree}")
    sys.path.remove(str(tree))
    sys.path.insert(0, str(ROOT))


def worker(tree):
    """Serve timing requests on stdin: {"row": [config, batch, steps]} -> {"s": seconds}."""
    _import_tree(tree)
    import torch

    import torchgeo_int as tgi
    from experiments.bench import common, throughput

    torch.set_num_threads(1)
    fns = {}

    def odeint_run(q, p, n):
        def func(t, y):
            q, p = y
            return p, -throughput.grad_V(q)
        t = torch.tensor([0.0, n * throughput.H], dtype=q.dtype)
        return tgi.odeint(func, (q, p), t, method="verlet",
                          options=dict(separable=True, step_size=throughput.H))

    for line in sys.stdin:
        order = json.loads(line)
        if order is None:
            return
        config, batch, steps = order["row"]
        key = (config, batch)
        with torch.no_grad(), throughput.warnings_off():
            if key not in fns:
                system, q0, p0 = throughput.kepler_batch(batch)
                fn = odeint_run if config == "odeint" else \
                    throughput.configurations(system, [config], "cpu")[config][1]
                fns[key] = (fn, q0, p0)
                fn(q0, p0, steps)                      # compile / warm up
            fn, q0, p0 = fns[key]
            _, s = common.timed(lambda: fn(q0, p0, steps))
        print(json.dumps({"s": s}), flush=True)


def memory_child(tree, mode, steps, batch):
    _import_tree(tree)
    from experiments.bench import memory
    print(json.dumps(memory.one_step(mode, steps, batch, "cpu", "float32")), flush=True)


def memory_cell(tree, mode, steps, batch):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH="")
    res = subprocess.run([sys.executable, __file__, "--memory-child", str(tree), mode, str(steps),
                          str(batch)], env=env, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"memory child {mode} in {tree} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", help="the reference tree: a directory holding torchgeo_int (a worktree), "
                    "or a git revision of this repository")
    ap.add_argument("--after", help="the tree compared with it (the same kinds)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--memory-repeats", type=int, default=3)
    ap.add_argument("--memory-steps", type=int, default=1000)
    ap.add_argument("--memory-batch", type=int, default=256)
    ap.add_argument("--quick", action="store_true", help="three rows, two rounds, one memory mode")
    ap.add_argument("--rows", choices=["default", "every_state"], default="default",
                    help="every_state: the every-state and implicit-midpoint rows (EVERY_STATE_ROWS)")
    ap.add_argument("--out", default=None, help="write the markdown table there too")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--memory-child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    if args.memory_child:
        tree, mode, steps, batch = args.memory_child
        return memory_child(tree, mode, int(steps), int(batch))
    if not (args.before and args.after):
        ap.error("--before and --after are required")
    if str(ROOT) not in sys.path:             # (run as a script: this checkout's experiments)
        sys.path.insert(0, str(ROOT))
    from experiments import trees as source_trees
    with contextlib.ExitStack() as stack:
        trees, labels = {}, {}
        for k, v in (("before", args.before), ("after", args.after)):
            try:
                trees[k], labels[k] = stack.enter_context(source_trees.tree(v))
            except ValueError as e:
                ap.error(f"--{k}: {e}")
        text = _compare(args, trees, labels, stack)
    print(text)
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(text + "\n")


def _compare(args, trees, labels, stack):
    """The markdown table of the two trees' rows and memory cells."""
    from experiments.trees import Worker
    rows = QUICK_ROWS if args.quick else EVERY_STATE_ROWS if args.rows == "every_state" else ROWS
    rounds = 2 if args.quick else args.rounds
    start = time.perf_counter()
    workers = {k: stack.enter_context(Worker(v, __file__, "--worker", v, env={"PYTHONPATH": ""}))
               for k, v in trees.items()}
    best = {(k, r): float("inf") for k in trees for r in rows}
    for i in range(rounds):
        for row in rows:
            order = ("before", "after") if (i + rows.index(row)) % 2 == 0 else ("after", "before")
            for k in order:
                try:
                    s = workers[k].ask({"row": list(row)})["s"]
                except RuntimeError as e:
                    raise RuntimeError(f"{k} ({labels[k]}) on {row}: {e}") from None
                best[k, row] = min(best[k, row], s)
        print(f"[compare_trees] round {i + 1}/{rounds} done, {time.perf_counter() - start:.0f} s",
              file=sys.stderr, flush=True)
    for w in workers.values():
        w.close()
    lines = ["| row | batch | steps | before ms | after ms | after/before |", "|---|---|---|---|---|---|"]
    for row in rows:
        b, a = best["before", row], best["after", row]
        lines.append(f"| {row[0]} | {row[1]} | {row[2]} | {1e3 * b:.2f} | {1e3 * a:.2f} | {a / b:.3f} |")

    modes = MEMORY_MODES[:1] if args.quick else MEMORY_MODES
    repeats = 1 if args.quick else args.memory_repeats
    mem = {}
    if repeats == 0:      # --memory-repeats 0: throughput only
        modes = []
    for i in range(repeats):
        for j, mode in enumerate(modes):
            for k in (("before", "after") if (i + j) % 2 == 0 else ("after", "before")):
                r = memory_cell(trees[k], mode, args.memory_steps, args.memory_batch)
                old = mem.get((k, mode))
                mem[k, mode] = r if old is None else {
                    "graph_mib": max(old["graph_mib"], r["graph_mib"]),
                    "peak_mib": min(old["peak_mib"], r["peak_mib"]),
                    "seconds": min(old["seconds"], r["seconds"])}
    lines += [] if not modes else ["", f"memory: one training step, {args.memory_steps} verlet steps, batch "
              f"{args.memory_batch}, float32 (graph MiB exact; RSS rise and s: best of {repeats})", "",
              "| mode | graph MiB before | after | RSS MiB before | after | s before | s after | s after/before |",
              "|---|---|---|---|---|---|---|---|"]
    for mode in modes:
        b, a = mem["before", mode], mem["after", mode]
        lines.append(f"| {mode} | {b['graph_mib']:.2f} | {a['graph_mib']:.2f} | {b['peak_mib']:.1f} | "
                     f"{a['peak_mib']:.1f} | {b['seconds']:.3f} | {a['seconds']:.3f} | "
                     f"{a['seconds'] / b['seconds']:.3f} |")
    lines += ["", f"before: {labels['before']}; after: {labels['after']}; {rounds} rounds; "
              f"{time.perf_counter() - start:.0f} s in all"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
