r"""Training cost per step of the HNN study's arms, side by side, against (b5).

    python -m experiments.hnn.cost --task twobody_noisy [--arms b5,e,g] [--batch-size 200] [--solve-every k]

Each arm is set up as :func:`experiments.hnn.train.train` sets it up (the task's network,
loss, shooting settings, optimizer and batch) and timed over the same steps: a few warm-up steps,
then ``--rounds`` rounds in which every arm takes ``--steps`` steps in turn, so a change in the
machine's load reaches every arm alike (the study's "train s" column runs the arms one after
the other, and moves with whatever else the cores run).  One thread.  Shooting arms with solved
states are timed in their *steady state*: each node is placed at a random point of its
``solve_every`` cycle, so a step solves 1/solve_every of its batch, as after the first visits
(the first visit of every node solves it; over a 2000-step run on the two-body tasks those
first visits are the first ~28 steps).  Prints ms a step and the ratio to the first arm
(default (b5), the issue's reference) and writes ``results/hnn_cost_<task>.{md,json}``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from torchgeo_int._validate import check_int
from torchgeo_int.nn.training import make_optimizer

from .run import CONFIG, SHOOTING, study_task
from .train import SHOOTING as SHOOTING_DEFAULTS
from .train import arms as make_arms
from .train import batch_factor, build_model, loss_and_data, seed_everything, shooting_fit, state_lr


def stepper(arm, task, *, batch: int | None, lr: float, weight_decay: float, shooting: dict, seed: int = 0):
    """A function taking one training step of ``arm`` (a fresh seeded model and optimizer)."""
    seed_everything(seed)
    model = build_model(arm, task).to(task.q_train.dtype)
    g = torch.Generator().manual_seed(seed)
    if arm.loss == "shooting":
        tf = shooting_fit(arm, model, task, shooting=shooting)
        opt = tf.optimizer(lr=lr, state_lr=state_lr(shooting), weight_decay=weight_decay)
        total = tf.trajectories * tf.n_segments
        size = total if batch is None else min(batch * batch_factor(arm, shooting), total)
        # every node visited before, at a random point of its solve cycle (the steady state)
        tf.visits.copy_(torch.randint(1, 1 << 20, tf.visits.shape, generator=g))

        def step():
            loss = tf(torch.randperm(total, generator=g)[:size])
            opt.zero_grad()
            loss.backward()
            opt.step()
        return step
    loss_fn, data = loss_and_data(arm, task)
    opt = make_optimizer(model, lr=lr, weight_decay=weight_decay)       # fit's, as train's
    rows = data[0].shape[0]
    size = rows if batch is None else min(batch, rows)

    def step():
        idx = torch.randperm(rows, generator=g)[:size]
        loss = loss_fn(model, *(x[idx] for x in data))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def measure(task_name: str, arm_keys, *, batch_size: int | None = None, rounds: int = 10,
            steps: int = 16, warmup: int = 8, shooting: dict | None = None, data_seed: int = 0):
    """ms a step of each arm (interleaved rounds, one thread) and its ratio to the first arm's."""
    if task_name not in CONFIG:
        raise ValueError(f"unknown task {task_name!r}; known: {', '.join(CONFIG)}")
    rounds, steps, warmup = (check_int(rounds, "rounds", 1), check_int(steps, "steps", 1),
                             check_int(warmup, "warmup", 0))
    for k in ("solve_every", "batch_factor2"):      # the others come from the study's own flags
        if (shooting or {}).get(k) is not None:
            check_int(shooting[k], k, 1)
    torch.set_num_threads(1)
    cfg = CONFIG[task_name]
    mode = cfg["full"]
    task = study_task(task_name, data_seed).to(torch.float32)
    sh = {**SHOOTING_DEFAULTS, **SHOOTING.get(task_name, {}), **(shooting or {})}
    known = {a.key: a for a in make_arms(task, shooting=sh)}
    unknown = [k for k in arm_keys if k not in known]
    if unknown:
        raise ValueError(f"unknown arms {unknown}; known: {list(known)}")
    batch = batch_size or mode["batch"]                   # None: full batch, as the study
    run = {k: stepper(known[k], task, batch=batch, lr=cfg["lr"], weight_decay=cfg["weight_decay"],
                      shooting=sh) for k in arm_keys}
    for k in arm_keys:
        for _ in range(warmup):
            run[k]()
    seconds = dict.fromkeys(arm_keys, 0.0)
    for _ in range(rounds):
        for k in arm_keys:
            t = time.perf_counter()
            for _ in range(steps):
                run[k]()
            seconds[k] += time.perf_counter() - t
    ms = {k: 1e3 * seconds[k] / (rounds * steps) for k in arm_keys}
    ref = arm_keys[0]
    return dict(task=task_name, batch=batch, rounds=rounds, steps=steps, shooting=sh, reference=ref,
                arms={k: dict(label=known[k].label, ms_per_step=ms[k], ratio=ms[k] / ms[ref])
                      for k in arm_keys})


def markdown(rep: dict) -> str:
    lines = [f"Training cost per step, {rep['task']} (batch {rep['batch'] or 'full'}; {rep['rounds']} interleaved "
             f"rounds of {rep['steps']} steps an arm, one thread; shooting arms in steady state"
             + (f", each node solved at one visit in {rep['shooting']['solve_every']}" if rep["shooting"]["gauss_newton"]
                and rep["shooting"]["solve_every"] > 1 else "") + ")", "",
             f"| arm | ms a step | against ({rep['reference']}) |", "|---|---|---|"]
    for a in rep["arms"].values():
        lines.append(f"| {a['label']} | {a['ms_per_step']:.1f} | {a['ratio']:.2f}× |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", required=True, choices=sorted(CONFIG))
    ap.add_argument("--arms", default="b5,e,g", help="comma-separated arms; ratios to the first (default b5,e,g)")
    ap.add_argument("--batch-size", type=int, help="samples per step (default: the task's full-run batch)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=16, help="steps an arm takes in each round")
    ap.add_argument("--solve-every", type=int, help="the shooting arms' solve_every (default: the task's)")
    ap.add_argument("--batch-factor2", type=int, help="(e′)'s segments per step per sample (default: the task's)")
    ap.add_argument("--out", default="results")
    args = ap.parse_args(argv)
    shooting = {k: v for k, v in dict(solve_every=args.solve_every,
                                      batch_factor2=args.batch_factor2).items() if v is not None}
    try:
        rep = measure(args.task, args.arms.split(","), batch_size=args.batch_size, rounds=args.rounds,
                      steps=args.steps, shooting=shooting)
    except ValueError as e:
        ap.error(str(e))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"hnn_cost_{args.task}.json").write_text(json.dumps(rep, indent=1))
    (out / f"hnn_cost_{args.task}.md").write_text(markdown(rep) + "\n")
    print(markdown(rep))


if __name__ == "__main__":
    main()
