"""The other tree's side of ``python -m experiments.hnn.cost --against REV``: run by
:func:`experiments.hnn.cost.measure` in a child process whose ``sys.path`` starts with that
tree, so ``experiments`` and ``torchgeo_int`` below are *its* packages (this file is the
measuring tree's; it uses only what the study's cost script has had since it was written:
``cost.stepper``, ``run.CONFIG``, ``run.SHOOTING``, ``run.study_task``, ``train.SHOOTING``,
``train.arms``).

Protocol, one JSON line each way: the parent sends the set-up (task, arms, batch, shooting
overrides, data seed, warm-up steps); the child builds each arm as that tree's study builds it,
takes the warm-up steps and answers ``{"ready": <its torchgeo_int's path>}``.  Then each line
``[arm, steps]`` is answered with the seconds those steps took, and ``null`` ends it.  The two
processes take turns (each blocks on the other's answer), so their steps interleave on one core
as the arms of one process do.
"""
import json
import sys
import time

import torch


def main():
    torch.set_num_threads(1)
    import torchgeo_int
    from experiments.hnn import cost, run, train

    setup = json.loads(sys.stdin.readline())
    name = setup["task"]
    task = run.study_task(name, setup["data_seed"]).to(torch.float32)
    cfg = run.CONFIG[name]
    sh = {**train.SHOOTING, **run.SHOOTING.get(name, {}), **setup["shooting"]}
    known = {a.key: a for a in train.arms(task, shooting=sh)}
    missing = [k for k in setup["arms"] if k not in known]
    if missing:
        print(json.dumps({"error": f"arms {missing} are not in that tree's study"}), flush=True)
        return
    batch = setup["batch"] or cfg["full"]["batch"]
    steppers = {k: cost.stepper(known[k], task, batch=batch, lr=cfg["lr"], weight_decay=cfg["weight_decay"],
                                shooting=sh) for k in setup["arms"]}
    for step in steppers.values():
        for _ in range(setup["warmup"]):
            step()
    print(json.dumps({"ready": torchgeo_int.__file__}), flush=True)
    for line in sys.stdin:
        order = json.loads(line)
        if order is None:
            return
        key, n = order
        t = time.perf_counter()
        for _ in range(n):
            steppers[key]()
        print(json.dumps(time.perf_counter() - t), flush=True)


if __name__ == "__main__":
    main()
