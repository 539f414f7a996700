r"""Training cost per step of the HNN study's arms, side by side, against (b5).

    python -m experiments.hnn.cost --task twobody_noisy [--arms b5,e,g] [--batch-size 200] [--solve-every k]
    python -m experiments.hnn.cost --task twobody --arms b5,g --against REV    # this tree against REV

Each arm is set up as :func:`experiments.hnn.train.train` sets it up (the task's network,
loss, shooting settings, optimizer and batch) and timed over the same steps: a few warm-up steps,
then ``--rounds`` rounds in which every arm takes ``--steps`` steps in turn, so a change in the
machine's load reaches every arm alike (the study's "train s" column runs the arms one after
the other, and moves with whatever else the cores run).  One thread.  Shooting arms with solved
states are timed in their *steady state*: each node is placed at a random point of its
``solve_every`` cycle, so a step solves 1/solve_every of its batch, as after the first visits
(the first visit of every node solves it; over a 2000-step run on the two-body tasks those
first visits are the first ~28 steps).  Prints ms a step and the ratio to the first arm
(default (b5), the issue's reference) and writes ``results/hnn_cost_<task>.{md,json}``
(``…_against.{md,json}`` with ``--against``).

``--against REV`` times the same arms as another tree builds them (a git revision of this
repository, or a directory holding a tree's ``torchgeo_int/`` and ``experiments/``:
:mod:`experiments.trees`), in a child process (:mod:`experiments.hnn.cost_worker`) that takes
turns with this one, arm by arm in each round, which of the two goes first alternating from round to round: a change's effect on a
step, measured free of the machine's drift between two runs (on the 2-core machine that drift,
±4 %, is as large as the changes it is used to measure).  What is left is the scatter of the
rounds themselves: an arm that the two trees build alike comes out within a few per cent of
1 in the last column, which bounds what a run can resolve.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch

from experiments import trees
from torchgeo_int._validate import check_int
from torchgeo_int.nn.training import make_optimizer

from .run import CONFIG, SHOOTING, study_task
from .train import SHOOTING as SHOOTING_DEFAULTS
from .train import arms as make_arms
from .train import NETWORKS, batch_factor, build_model, loss_and_data, seed_everything, shooting_fit, state_lr


def stepper(arm, task, *, batch: int | None, lr: float, weight_decay: float, shooting: dict, seed: int = 0,
            network: str = "mlp"):
    """A function taking one training step of ``arm`` (a fresh seeded model and optimizer;
    ``network``: :func:`~experiments.hnn.train.build_model`'s)."""
    seed_everything(seed)
    model = build_model(arm, task, network=network).to(task.q_train.dtype)
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


#: the other tree's side of --against: this checkout's file, run on that tree's packages
WORKER = Path(__file__).with_name("cost_worker.py")


def _ask(worker, message):
    try:
        return worker.ask(message)
    except RuntimeError as e:
        raise RuntimeError(f"--against: {e}") from None


def measure(task_name: str, arm_keys, *, batch_size: int | None = None, rounds: int = 10,
            steps: int = 16, warmup: int = 8, shooting: dict | None = None, data_seed: int = 0,
            against: str | None = None, network: str = "mlp"):
    """ms a step of each arm (interleaved rounds, one thread) and its ratio to the first arm's.
    ``against``: also the same arms as that tree builds them (:func:`experiments.trees.tree`),
    each round taking each arm's steps here and there in turn; the report's ``against`` holds
    its ms a step, its ratios to its first arm, and this tree's time over its, arm by arm, with
    that tree's labels of the arms and the ``shooting`` overrides it does not know (ignored
    there): a row whose labels differ compares differently built arms, which the markdown says.
    ``network``: every arm's (the study's ``--network``); refused with ``against`` (the MLPs only)."""
    if task_name not in CONFIG:
        raise ValueError(f"unknown task {task_name!r}; known: {', '.join(CONFIG)}")
    rounds, steps, warmup = (check_int(rounds, "rounds", 1), check_int(steps, "steps", 1),
                             check_int(warmup, "warmup", 0))
    unknown = sorted(set(shooting or {}) - set(SHOOTING_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown shooting settings {unknown}; known: {sorted(SHOOTING_DEFAULTS)}")
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
    if against is not None and network != "mlp":
        raise ValueError("--against times the study's MLPs: --network is this tree's only")
    with contextlib.ExitStack() as stack:
        other = label = None
        if against is not None:
            try:
                tree, label = stack.enter_context(trees.tree(against, needs=("torchgeo_int/__init__.py",
                                                                             "experiments/hnn/cost.py")))
            except ValueError as e:
                raise ValueError(f"--against: {e}") from None
            other = stack.enter_context(trees.Worker(tree, WORKER))
            ready = _ask(other, dict(task=task_name, arms=list(arm_keys), batch=batch_size,
                                     shooting=dict(shooting or {}), data_seed=data_seed, warmup=warmup))
            if "error" in ready:
                raise ValueError(f"--against: {ready['error']}")
            wrong = [f for f in ready["ready"] if f is None or not Path(f).resolve().is_relative_to(tree.resolve())]
            if wrong:
                raise RuntimeError(f"--against: the worker imported {wrong}, not {tree}'s packages")
        run = {k: stepper(known[k], task, batch=batch, lr=cfg["lr"], weight_decay=cfg["weight_decay"],
                          shooting=sh, network=network) for k in arm_keys}
        for k in arm_keys:
            for _ in range(warmup):
                run[k]()
        seconds = dict.fromkeys(arm_keys, 0.0)
        theirs = dict.fromkeys(arm_keys, 0.0)
        for r in range(rounds):
            for k in arm_keys:
                if other is not None and r % 2:     # the other tree first in every other round
                    theirs[k] += _ask(other, [k, steps])
                t = time.perf_counter()
                for _ in range(steps):
                    run[k]()
                seconds[k] += time.perf_counter() - t
                if other is not None and not r % 2:  # (it runs while this process waits for it)
                    theirs[k] += _ask(other, [k, steps])
    ms = {k: 1e3 * seconds[k] / (rounds * steps) for k in arm_keys}
    ref = arm_keys[0]
    rep = dict(task=task_name, batch=batch, rounds=rounds, steps=steps, shooting=sh, reference=ref, network=network,
               arms={k: dict(label=known[k].label, ms_per_step=ms[k], ratio=ms[k] / ms[ref])
                     for k in arm_keys})
    if other is not None:
        them = {k: 1e3 * theirs[k] / (rounds * steps) for k in arm_keys}
        rep["against"] = dict(tree=label, ignored=ready["ignored"],
                              arms={k: dict(label=ready["labels"][k], ms_per_step=them[k], ratio=them[k] / them[ref],
                                            this_over_that=ms[k] / them[k]) for k in arm_keys})
    return rep


def markdown(rep: dict) -> str:
    lines = [f"Training cost per step, {rep['task']} (batch {rep['batch'] or 'full'}; {rep['rounds']} interleaved "
             f"rounds of {rep['steps']} steps an arm, one thread; shooting arms in steady state"
             + (f", each node solved at one visit in {rep['shooting']['solve_every']}" if rep["shooting"]["gauss_newton"]
                and rep["shooting"]["solve_every"] > 1 else "")
             + (f"; network {rep['network']}" if rep.get("network", "mlp") != "mlp" else "") + ")", "",
             f"| arm | ms a step | against ({rep['reference']}) |", "|---|---|---|"]
    other = rep.get("against")
    if other:
        lines[-2:] = [lines[-2] + f" {other['tree']}: ms a step | against ({rep['reference']}) "
                      f"| this tree / {other['tree']} |", "|---|---|---|---|---|---|"]
    notes = []
    for k, a in rep["arms"].items():
        row = f"| {a['label']} | {a['ms_per_step']:.1f} | {a['ratio']:.2f}× |"
        if other:
            o = other["arms"][k]
            row += f" {o['ms_per_step']:.1f} | {o['ratio']:.2f}× | {o['this_over_that']:.3f} |"
            if o["label"] != a["label"]:
                notes.append(f"* ({k}) is built differently there: {o['label']}")
        lines.append(row)
    if other and other["ignored"]:
        notes.append(f"* {other['tree']}'s study has no setting {', '.join(other['ignored'])}: its arms ran "
                     f"with their own (a ratio of such an arm compares different settings)")
    return "\n".join(lines + ([""] + notes if notes else []))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", required=True, choices=sorted(CONFIG))
    ap.add_argument("--arms", default="b5,e,g", help="comma-separated arms; ratios to the first (default b5,e,g)")
    ap.add_argument("--batch-size", type=int, help="samples per step (default: the task's full-run batch)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=16, help="steps an arm takes in each round")
    ap.add_argument("--solve-every", type=int, help="the shooting arms' solve_every (default: the task's)")
    ap.add_argument("--batch-factor2", type=int, help="(e′)'s segments per step per sample (default: the task's)")
    ap.add_argument("--against", metavar="REV", help="also time the arms as REV builds them (a git revision "
                    "of this repository, or a directory with a tree's torchgeo_int/ and experiments/), "
                    "in a child process taking turns with this one")
    ap.add_argument("--network", choices=NETWORKS, default="mlp",
                    help="every arm's network, as the study's --network (default: the MLPs)")
    ap.add_argument("--out", default="results")
    args = ap.parse_args(argv)
    shooting = {k: v for k, v in dict(solve_every=args.solve_every,
                                      batch_factor2=args.batch_factor2).items() if v is not None}
    try:
        rep = measure(args.task, args.arms.split(","), batch_size=args.batch_size, rounds=args.rounds,
                      steps=args.steps, shooting=shooting, against=args.against, network=args.network)
    except ValueError as e:
        ap.error(str(e))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = (f"hnn_cost_{args.task}" + ("_against" if args.against else "")   # (a plain run's kept)
            + ("" if args.network == "mlp" else f"_{args.network}"))
    (out / f"{stem}.json").write_text(json.dumps(rep, indent=1))
    (out / f"{stem}.md").write_text(markdown(rep) + "\n")
    print(markdown(rep))


if __name__ == "__main__":
    main()
