"""``python -m experiments.bench [--quick] [--all] [--only NAME ...] [--skip NAME ...]``: the
benchmarks (``make bench``).

Runs throughput, limits (ours against a numba loop, the practical CPU limit: needs the optional
``bench`` extra, else its numba rows are skipped with a note), training_cost, memory (when
``experiments/bench/memory.py`` is there; at its --quick size unless --full-memory) and, on a
machine with CUDA, gpu; with ``--all`` (``make bench-all``) also work_precision, an accuracy
study rather than a speed benchmark, which alone takes ≈ 7 CPU-minutes (its sweep and the 10⁶-day
energy run) and would push ``make bench`` past its 10-minute budget.  Each writes its
markdown/JSON/PNG under results/bench/, and results/bench/index.md lists them with their run
times.  Not run from here, since it needs
a scratch checkout of torchdiffeq's master branch: ``python -m experiments.bench.torchdiffeq_master
--torchdiffeq-src PATH`` (its Broyden implicit midpoint vs ours, vs batch size).  A benchmark that fails is reported
and the others still run; the exit status is then 1.  Default run: under 10 minutes on one
idle CPU core (``--all``: about 17); --quick: a few minutes.
"""
from __future__ import annotations

import argparse
import importlib
import pathlib
import sys
import time
import traceback

import torch

from . import common

BENCHES = ["throughput", "limits", "work_precision", "training_cost", "memory", "gpu"]
#: run only with --all (or named in --only)
OPTIONAL = ["work_precision"]


def _available(name):
    if name == "memory":
        return (pathlib.Path(__file__).parent / "memory.py").exists(), "experiments/bench/memory.py absent"
    if name == "gpu":
        return torch.cuda.is_available(), "no CUDA device (python -m experiments.bench.gpu runs it on the CPU)"
    return True, ""


def _argv(name, args):
    if name == "memory":
        # Its own options (--quick only).  Its full size (10⁴ steps, a child process per cell,
        # capped at 12 GiB) takes ~10 min on two cores: quick unless asked.
        return [] if args.full_memory else ["--quick"]
    argv = ["--out", args.out, "--threads", str(args.threads)]
    return argv + (["--quick"] if args.quick else []) + (["--no-progress"] if args.no_progress else [])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--all", action="store_true", help=f"also run {', '.join(OPTIONAL)}")
    ap.add_argument("--only", nargs="+", choices=BENCHES, default=None)
    ap.add_argument("--skip", nargs="+", choices=BENCHES, default=[])
    ap.add_argument("--out", default=str(common.RESULTS / "bench"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--full-memory", action="store_true",
                    help="run experiments.bench.memory at its full size (default: its --quick)")
    args = ap.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines, failed, t_all = [], [], time.perf_counter()
    for name in BENCHES:
        if (args.only and name not in args.only) or name in args.skip:
            continue
        if name in OPTIONAL and not (args.all or args.only):
            print(f"== {name}: not run (run it with --all, make bench-all)")
            lines.append(f"| {name} | not run: --all runs it | — |")
            continue
        ok, why = _available(name)
        if not ok:
            print(f"== {name}: skipped ({why})")
            lines.append(f"| {name} | skipped: {why} | — |")
            continue
        print(f"\n== {name} " + "=" * 60, flush=True)
        t0 = time.perf_counter()
        try:
            importlib.import_module(f"{__package__}.{name}").main(_argv(name, args))
            status = f"[{name}.md]({name}.md)"
        except Exception:   # noqa: BLE001 — report, run the others, fail at the end
            traceback.print_exc()
            failed.append(name)
            status = "FAILED (see the console)"
        lines.append(f"| {name} | {status} | {time.perf_counter() - t0:.0f} |")
    index = ["# Benchmarks", "", common.machine() + ("; --quick sizes" if args.quick else ""), "",
             "| benchmark | result | seconds |", "|---|---|---|", *lines, "",
             f"total {time.perf_counter() - t_all:.0f} s"]
    (out / "index.md").write_text("\n".join(index) + "\n")
    print("\n".join(index))
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
