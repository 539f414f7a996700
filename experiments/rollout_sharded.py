r"""Huge batched rollouts split over processes (torch.distributed), with throughput per rank.

    torchrun --nproc_per_node=2 experiments/rollout_sharded.py --batch 100000 --steps 1000
    python experiments/rollout_sharded.py --quick            # one process, small

Kepler problems H = |p|²/2 − 1/|q| with eccentricities uniform in [0.1, 0.7] (every rank draws
the same global batch from ``--seed`` and rolls out its contiguous shard with
``tgi.rollout``), in ``--chunk`` steps per call so memory stays bounded.  Rank 0 prints the
energy error (max / mean of |H(x_t) − H(x_0)| over samples and saved times) and the
throughput in sample-steps per second per rank and in total (B·steps / the slowest rank), and
writes ``results/rollout_sharded.json`` and ``.md`` (or ``--out PATH``: ``PATH.json``, ``PATH.md``).
The timed loop includes the energy evaluations at the saved states.  Wall-clock numbers depend
on the load.  On GPUs (``--device cuda``) each process takes GPU LOCAL_RANK and the nccl backend.
``--save-every`` must divide ``--steps`` and the chunk (``min(--chunk, --steps)``), and
``--chunk`` must divide ``--steps`` when it is smaller; ``--method`` is one of the Hamiltonian
methods or explicit splittings (``tgi.METHODS``, ``tgi.SPLITTING_METHODS``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from pathlib import Path

import torch

import torchgeo_int as tgi
from torchgeo_int.distributed import cleanup, init_from_env, sharded_rollout
from torchgeo_int.systems import SeparableHamiltonian

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:        # run as a script: the experiments package is beside it
    sys.path.insert(0, str(ROOT))
from experiments.problems import int_at_least, report_paths, require_cuda  # noqa: E402

RESULTS = ROOT / "results"


def kepler():
    return SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: -1.0 / q.norm(dim=-1),
                                kinetic_grad=lambda p: p,
                                potential_grad=lambda q: q / q.norm(dim=-1, keepdim=True) ** 3)


def initial_conditions(B, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    e = 0.1 + 0.6 * torch.rand(B, generator=g, dtype=torch.float64)
    q0 = torch.stack([1 - e, torch.zeros_like(e)], -1)
    p0 = torch.stack([torch.zeros_like(e), ((1 + e) / (1 - e)).sqrt()], -1)
    return q0.to(dtype), p0.to(dtype)


def nonzero_float(text: str) -> float:
    """argparse type of the step size: finite and not 0 (negative steps integrate backwards)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value == 0:
        raise argparse.ArgumentTypeError(f"expected a finite nonzero step size, got {text}")
    return value


#: the methods of a (q, p) Hamiltonian rollout of the separable Kepler system
METHOD_NAMES = sorted(set(tgi.METHODS) | set(tgi.SPLITTING_METHODS))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int_at_least(1), default=None, help="default 100000 (--quick 2000)")
    ap.add_argument("--steps", type=int_at_least(1), default=None, help="default 1000 (--quick 200)")
    ap.add_argument("--h", type=nonzero_float, default=0.01)
    ap.add_argument("--method", default="verlet", choices=METHOD_NAMES, metavar="METHOD",
                    help="a name of tgi.METHODS or tgi.SPLITTING_METHODS (default verlet)")
    ap.add_argument("--save-every", type=int_at_least(1), default=10)
    ap.add_argument("--chunk", type=int_at_least(1), default=100,
                    help="steps per rollout call (memory bound)")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--threads", type=int_at_least(1), default=None, help="torch threads per process")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help="batch 2000, 200 steps (where --batch / --steps are not given)")
    ap.add_argument("--out", default=str(RESULTS / "rollout_sharded"),
                    help="writes OUT.json and OUT.md (default results/rollout_sharded)")
    a = ap.parse_args(argv)
    # --quick sets the sizes not given, so an explicit --batch or --steps is what runs
    a.batch = a.batch if a.batch is not None else 2000 if a.quick else 100_000
    a.steps = a.steps if a.steps is not None else 200 if a.quick else 1000
    if a.steps % a.chunk and a.chunk < a.steps:
        ap.error(f"--steps ({a.steps}) must be a multiple of --chunk ({a.chunk})")
    chunk = min(a.chunk, a.steps)
    if a.steps % a.save_every or chunk % a.save_every:
        ap.error(f"--save-every ({a.save_every}) must divide --steps ({a.steps}) and the chunk "
                 f"({chunk}): each chunk starts from the last saved state")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if a.batch < world:
        ap.error(f"--batch ({a.batch}) is smaller than the {world} processes")
    require_cuda(ap, a.device)
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    info = init_from_env(device=a.device)
    try:
        dtype = getattr(torch, a.dtype)
        q0, p0 = initial_conditions(a.batch, a.seed, dtype)
        # a short warm-up so the timed run measures the steady loop, not first-call overheads
        sharded_rollout(kepler(), q0[:max(info.world_size, 64)], p0[:max(info.world_size, 64)],
                        h=a.h, steps=a.save_every, method=a.method, save_every=a.save_every,
                        device=info.device)
        with torch.no_grad():
            res = sharded_rollout(kepler(), q0, p0, h=a.h, steps=a.steps, method=a.method,
                                  save_every=a.save_every, chunk_steps=chunk,
                                  device=info.device)
    finally:
        cleanup()
    if info.is_main:
        cfg = {k: v for k, v in vars(a).items() if k != "out"}
        cfg.update(world_size=info.world_size, backend=info.backend, device=str(info.device),
                   torch=torch.__version__, threads_per_process=torch.get_num_threads(),
                   machine=platform.processor() or platform.machine())
        res = {k: v for k, v in res.items() if k not in ("q", "p", "rank", "seconds", "throughput")}
        lines = [f"# Sharded rollout: Kepler, {a.batch} orbits × {a.steps} {a.method} steps "
                 f"(h = {a.h}, {a.dtype}) on {info.world_size} process(es), {cfg['device']}", "",
                 "| rank | orbits | seconds | sample-steps / s |", "|---|---|---|---|"]
        for r, (b, s, t) in enumerate(zip(res["batch_per_rank"], res["seconds_per_rank"],
                                          res["throughput_per_rank"])):
            lines.append(f"| {r} | {b} | {s:.3f} | {t:.3e} |")
        lines += [f"| total | {a.batch} | {max(res['seconds_per_rank']):.3f} | "
                  f"{res['throughput_total']:.3e} |", "",
                  f"energy error |H(x_t) − H(x_0)|: max {res['energy_error_max']:.3e}, "
                  f"mean {res['energy_error_mean']:.3e}; relative max {res['energy_rel_error_max']:.3e}",
                  "", "Wall-clock numbers depend on the machine's load."]
        text = "\n".join(lines)
        print(text)
        js, md = report_paths(a.out)
        js.write_text(json.dumps({"config": cfg, "results": res}, indent=2))
        md.write_text(text + "\n")
        print(f"wrote {js} and {md}", file=sys.stderr)


if __name__ == "__main__":
    main()
