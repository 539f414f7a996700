r"""One arm of the HNN study trained data-parallel (DistributedDataParallel) with ``fit``.

    torchrun --nproc_per_node=2 -m experiments.hnn.ddp --task spring --quick [--arm b5] [--check]
    python -m experiments.hnn.ddp --task spring --quick        # the same, one process

Every rank builds the same task and model (same seed); :func:`torchgeo_int.distributed.wrap`
puts the arm's loss behind DDP and :func:`~torchgeo_int.distributed.distributed_loader` gives
each rank its share of every global batch of ``--batch`` (the global batches of single-process
``fit``).  Rank 0 alone shows progress, writes the checkpoint ``results/hnn_ddp_<task>_<arm>.pt``,
evaluates the trained model on the held-out initial conditions and writes
``results/hnn_ddp_<task>_<arm>.json`` / ``.md``.  ``--check`` also trains the same arm in rank
0's process alone on the full global batches and reports the largest parameter difference
(≈ 1e-6 in float32 after hundreds of Adam steps from reduction order; use ``--dtype float64``
for ≈ 1e-12).  Wall-clock numbers depend on the machine's load.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

from torchgeo_int.distributed import cleanup, distributed_loader, init_from_env, reduce_history, wrap
from torchgeo_int.nn.training import fit, seed_everything

from . import data as datasets
from .run import CONFIG
from .train import arms as make_arms
from .train import build_model, evaluate, loss_and_data

RESULTS = Path(__file__).resolve().parents[2] / "results"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", choices=sorted(datasets.TASKS), default="spring")
    ap.add_argument("--arm", default="b5", help="a, b1, b5, b10, c or d (see experiments.hnn.train)")
    ap.add_argument("--quick", action="store_true", help="the quick budget of experiments.hnn.run")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None, help="global batch (divisible by the ranks)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--width", type=int, default=200)
    ap.add_argument("--check", action="store_true", help="compare with single-process training")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per process")
    a = ap.parse_args(argv)
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    cfg = CONFIG[a.task]
    budget = cfg["quick" if a.quick else "full"]
    info = init_from_env(device=a.device)
    W = info.world_size
    dtype = getattr(torch, a.dtype)
    task_kw = {"trajectories": budget["trajectories"]} if "trajectories" in budget else {}
    task = datasets.TASKS[a.task](seed=a.seed, **task_kw)
    arm = {x.key: x for x in make_arms(task)}.get(a.arm)
    if arm is None:
        ap.error(f"unknown arm {a.arm!r}; known: {', '.join(x.key for x in make_arms(task))}")
    loss_fn, data = loss_and_data(arm, task.to(dtype), substeps=cfg["substeps"])
    data = tuple(t.to(info.device) for t in data)   # batches on the model's device (cuda: LOCAL_RANK)
    n = data[0].shape[0]
    steps = a.steps if a.steps is not None else budget["steps"]
    batch = a.batch if a.batch is not None else budget["batch"]
    if batch is None:  # full batch: the largest multiple of W (single-process: batch_size=that)
        batch = n - n % W
    # the study's lr schedule too (CONFIG: cosine), so a DDP run trains as experiments.hnn.run does
    opts = dict(steps=steps, lr=cfg["lr"], weight_decay=cfg["weight_decay"], seed=a.seed,
                lr_schedule=cfg.get("lr_schedule"))

    def fresh_model():
        seed_everything(a.seed)
        return build_model(arm, task, width=a.width).to(dtype).to(info.device)

    model = fresh_model()
    module, loss = wrap(model, loss_fn, device=info.device)
    name = f"hnn_ddp_{a.task}_{arm.key}"
    t0 = time.perf_counter()
    try:
        hist = fit(module, loss, distributed_loader(data, batch, seed=a.seed), progress=info.is_main,
                   desc=f"{a.task}, {arm.label}, {W} processes",
                   checkpoint=RESULTS / f"{name}.pt", **opts)
        hist = reduce_history(hist)
    finally:
        module = loss = None   # DDP gone before its process group (see distributed.cleanup)
        cleanup()
    seconds = time.perf_counter() - t0
    if not info.is_main:
        return
    out = {"config": {**vars(a), "world_size": W, "backend": info.backend, "global_batch": batch,
                      "local_batch": batch // W, "samples": n, "steps": steps},
           "train_seconds": seconds, "final_loss": hist["loss"][-1]}
    # evaluated on the CPU, where the task's test data lives (the model may be on a GPU)
    metrics, _ = evaluate(copy.deepcopy(model).cpu(), arm, task, substeps=cfg["substeps"])
    out["metrics"] = metrics
    if a.check:
        ref = fresh_model()
        t1 = time.perf_counter()
        ref_hist = fit(ref, loss_fn, data, batch_size=batch, progress=True,
                       desc=f"{a.task}, {arm.label}, 1 process", **opts)
        out["single_process_seconds"] = time.perf_counter() - t1
        sd, rsd = model.state_dict(), ref.state_dict()
        out["max_param_diff"] = max(float((sd[k] - rsd[k]).abs().max()) for k in sd)
        out["max_loss_diff"] = max(abs(x - y) for x, y in zip(hist["loss"], ref_hist["loss"]))
    lines = [f"# {arm.label}: {a.task}, {steps} steps, global batch {batch} on {W} process(es) "
             f"({info.backend or 'no process group'}, {a.dtype})", "",
             f"train {seconds:.1f} s; final global-batch loss {out['final_loss']:.4e}",
             f"state MSE {metrics['state_mse']:.4e}, energy MSE {metrics['energy_mse']:.4e}"]
    if a.check:
        lines.append(f"single-process ({out['single_process_seconds']:.1f} s): max |Δθ| = "
                     f"{out['max_param_diff']:.3e}, max |Δloss| = {out['max_loss_diff']:.3e}")
    lines += ["", "Wall-clock numbers depend on the machine's load."]
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=2, default=str))
    (RESULTS / f"{name}.md").write_text(text + "\n")
    print(f"wrote {RESULTS / name}.json / .md", file=sys.stderr)


if __name__ == "__main__":
    main()
