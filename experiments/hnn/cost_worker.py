"""The other tree's side of ``python -m experiments.hnn.cost --against REV``: run by
:func:`experiments.hnn.cost.measure` in a child process whose ``sys.path`` starts with that
tree, so ``experiments`` and ``torchgeo_int`` below are *its* packages (this file is the
measuring tree's; it uses only what the study's cost script has had since 7231338:
``cost.stepper``, ``run.CONFIG``, ``run.SHOOTING``, ``run.study_task``, ``train.SHOOTING``,
``train.arms``).

Protocol, one JSON line each way on a copy of the original stdout (the study's own prints go
to stderr): the parent sends the set-up (task, arms, batch, shooting overrides, data seed,
warm-up steps); the child builds each arm as that tree's study builds it, takes the warm-up
steps and answers with where its packages came from, each arm's label and the overrides that
tree's study does not know (and so ignores).  Then each line ``[arm, steps]`` is answered with
the seconds those steps took, and ``null`` ends it.  The two processes take turns (each blocks
on the other's answer), so their steps interleave on one core as the arms of one process do.
"""
import json
import os
import sys
import time


def main():
    reply = os.fdopen(os.dup(1), "w")        # the protocol's channel; fd 1 and print() go to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(message):
        reply.write(json.dumps(message) + "\n")
        reply.flush()

    import torch
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
        send({"error": f"arms {missing} are not in that tree's study"})
        return
    batch = setup["batch"] or cfg["full"]["batch"]
    steppers = {k: cost.stepper(known[k], task, batch=batch, lr=cfg["lr"], weight_decay=cfg["weight_decay"],
                                shooting=sh) for k in setup["arms"]}
    for step in steppers.values():
        for _ in range(setup["warmup"]):
            step()
    send({"ready": [getattr(torchgeo_int, "__file__", None), getattr(cost, "__file__", None)],
          "labels": {k: known[k].label for k in setup["arms"]},
          "ignored": sorted(set(setup["shooting"]) - set(train.SHOOTING))})
    for line in sys.stdin:
        order = json.loads(line)
        if order is None:
            return
        key, n = order
        t = time.perf_counter()
        for _ in range(n):
            steppers[key]()
        send(time.perf_counter() - t)


if __name__ == "__main__":
    main()
