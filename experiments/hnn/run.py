r"""HNNs trained through structure-preserving steps vs derivative matching vs a Neural ODE.

    python -m experiments.hnn.run --task spring|pendulum|twobody|twobody_noisy [--quick] [--seeds N] ...
    python -m experiments.hnn.run --table results            # cross-task tables of the reports

Every arm of :mod:`experiments.hnn.train` is trained with each seed on the task of
:mod:`experiments.hnn.data`, then rolled out from the held-out clean initial conditions over
t ∈ [0, 20].  Writes ``results/hnn_<task>.json`` and ``.md`` (mean ± s.e. over seeds, and the
ratios of each arm's metrics to arm (a)'s and to arm (a′)'s, measured in the same run) and the PNGs
``hnn_<task>_phase.png`` (phase portraits / orbits, seed 0) and ``hnn_<task>_energy.png``
(|H(x̂_t) − H(x_t)| with the true H, mean over the initial conditions, seed 0).

``--quick`` (≈ 2 minutes per task on 2 CPU cores): 2 seeds, 300 steps on batches of 64,
two-body with 200 trajectories.  Full: 5 seeds, the HNN paper's budgets (spring and pendulum
2000 full-batch steps, two-body 10000 steps on batches of 200, 1000 trajectories).
Wall-clock numbers depend on the machine's load.  ``--arms a_fd,c --merge`` reruns some arms
into the report already in ``--out`` (training is seeded, so the other arms need no rerun).
``--network invariant`` (two-body tasks): every arm's network of |q₁ − q₂| (V_θ, and the HNN's
H_θ of (|q₁ − q₂|, p)) instead of the state; reports ``hnn_<task>_invariant.*``.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import numpy as np
import torch

import torchgeo_int as tgi
from torchgeo_int._validate import check_real

from ..cli import mean_pm_se, number
from . import data as datasets
from .train import arms as make_arms
from .train import NETWORKS, build_model, evaluate, failed_metrics, train, truth_floor

CONFIG = {
    "spring": dict(lr=1e-3, weight_decay=1e-4, substeps=1,
                   full=dict(steps=2000, batch=None, seeds=5), quick=dict(steps=300, batch=64, seeds=2)),
    "pendulum": dict(lr=1e-3, weight_decay=1e-4, substeps=1,
                     full=dict(steps=2000, batch=None, seeds=5), quick=dict(steps=300, batch=64, seeds=2)),
    "twobody": dict(lr=1e-3, weight_decay=0.0, substeps=1,
                    full=dict(steps=10000, batch=200, seeds=5, trajectories=1000),
                    quick=dict(steps=300, batch=64, seeds=2, trajectories=200)),
}
CONFIG["twobody_noisy"] = dict(CONFIG["twobody"])
#: Every arm's learning rate decays as ½(1 + cos(π·step/steps)) (fit's lr_schedule="cosine").
#: At a constant lr, full-batch Adam on the pendulum reaches a flat loss floor after ~1000 steps
#: and then spikes every ~150 steps (loss +0.5–9 %, ε_H ×2–6, held-out energy MSE ×5–30 for
#: ~25–50 steps, both (e) and (e′), seeds 100 on the study's data and on data seed 100; see
#: experiments/hnn/diagnose.py): the step-2000 numbers sampled a random phase of that cycle
#: ((e) seeds 0/1 ended in a spike, energy MSE ×13 of (a)).  The decay ends every arm at a
#: settled iterate.  ``--lr-schedule constant`` restores the earlier runs.  On the minibatch
#: noisy two-body task (2000 × 200) the schedule flips the comparison: the cosine lowers (a)'s
#: energy MSE ×36–76 (dev seed 100 and seeds 0–1) while (e)'s node states, each reached every
#: ~28 steps, converge less (energy ×1.8–2.3 worse); one schedule for all arms, reported both ways.
for _cfg in CONFIG.values():
    _cfg["lr_schedule"] = "cosine"
#: The shooting arms' settings per task (train.SHOOTING's keys), chosen on development runs
#: (seed 100, --quick budgets; see the README): segment length (a divisor of the intervals per
#: trajectory; None: single shooting), continuity weight, learning rate of the node states, the
#: method / substeps of (e′), and ``batch_factor`` (segments per step = the batch × this;
#: ``batch_factor2`` (e′)'s own, None: the same).
#: Spring and pendulum: single shooting (one node per 3 s trajectory) with the node states solved
#: by Gauss–Newton (TrajectoryFit's gauss_newton), not learned: on the development seed (data and
#: training seed 100, cosine, 2000 steps) segments of 4 with learned states reach ε_H 0.028 /
#: 0.0098 (pendulum / spring), learned single-shooting states stall (pendulum loss 0.96), solved
#: single-shooting states reach 0.018 / 0.0070 (node error 0.042 → 0.032 on the pendulum).
SHOOTING = {
    # (g)'s derivative weight stays 1 on spring: its development draw pointed to 0.3, which did
    # not hold on draws 1-4 or the study's (experiments/hnn/HISTORY.md, "Spring's derivative weight")
    "spring": dict(segment=None, gauss_newton=1),
    # (g)'s derivative weight 10 on the pendulum (1 elsewhere): development draw (data seed 100,
    # seed 0, 2000 steps), (g″)'s energy / state MSE at w_d = 1, 3, 10, 20, 30, 100: 6.3e-4 / 0.24,
    # 5.5e-4 / 0.093, 5.6e-4 / 0.049, 7.1e-4 / 0.060, 3.1e-3 / 0.12, 4.4e-2 / 0.67 ((a) 1.2e-3 /
    # 0.096); on spring's development draw w_d = 10 was 4.7x worse than 1 (experiments/hnn/HISTORY.md)
    "pendulum": dict(segment=None, gauss_newton=1, derivative_weight=10.0),
    # one-step segments, every observation a node solved against its data and its neighbours'
    # continuity (errors in variables), 7 × the batch in segments: the data intervals per step of
    # the segments of 7 it replaces.  Development seed 100 (2000 steps, cosine): energy MSE
    # 5.5e-4 → 3.4e-5, ε_H 0.016 → 0.0050, state MSE 0.037 ((a) there: 2.1e-5, 0.0028, 0.076).
    # The solve is 5/6 of a step's time: each node solved at its every 8th visit only (5 seeds:
    # 2.1x (b5)'s training time, within the issue's 3x; energy / state MSE x2.02 / x0.36 of
    # (a)'s against x1.70 / x0.26 solving every step, at 9x (b5)'s time).
    # (e′): 3 × the batch, not 7: yoshida4's step is three Verlet stages, and at 7 × (e′) cost
    # 4.7x / 4.8x (b5)'s step (two-body / noisy), at 4 × 2.95x-3.11x, at 3 × 2.27x / 2.26x
    # (python -m experiments.hnn.cost --task T --arms b5,e,g,e4; the factor set by cost alone)
    "twobody_noisy": dict(segment=1, gauss_newton=1, solve_every=8, batch_factor=7, batch_factor2=3),
}
#: Noise-free two-body takes the same one-step solved segments.  Development seed 100 (2000
#: steps, cosine; ``diagnose --task twobody``): against segments of 7 with learned states (state
#: lr 1e-4, the previous setting) ε_H 0.0061 → 0.0031, energy MSE 4.95e-5 → 1.39e-5, state MSE
#: 0.0168 → 0.0173; (b1) there: 0.0024, 6.4e-6, 0.0113 — on exact data the states have nothing
#: to estimate, and the one-step rollout arm stays the best.
SHOOTING["twobody"] = dict(SHOOTING["twobody_noisy"])


def study_task(name: str, data_seed: int = 0, *, quick: bool = False):
    """The task's draw as the study trains on it: the two-body tasks with the budget's number of
    trajectories (1000 full, 200 --quick)."""
    mode = CONFIG[name]["quick" if quick else "full"]
    kw = {"trajectories": mode["trajectories"]} if "trajectories" in mode else {}
    return datasets.TASKS[name](data_seed, **kw)


class UsageError(ValueError):
    """A run refused before any training because the command names something unknown (an arm):
    the command line reports it as a usage error, not a traceback."""


#: what a seed's training may raise and the study counts as that seed failing: a non-finite
#: loss, an implicit step or a Gauss–Newton state solve without a solution
TRAINING_FAILURES = (FloatingPointError, tgi.ConvergenceError, torch.linalg.LinAlgError)
METRICS = ("state_mse", "energy_mse", "energy_drift", "eps_H", "eps_H_rel", "train_seconds")


def _mean_se(values):
    """Mean and standard error over the seeds whose rollout succeeded (finite values): a failed
    rollout (inf) is counted in the report's "failed" column, not averaged in."""
    v = np.asarray([x for x in values if x is not None], dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return None, None
    mean = float(v.mean())
    se = float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else float("nan")
    return mean, se


def run(task_name: str, *, quick: bool = False, seeds: int | None = None, steps: int | None = None,
        batch_size: int | None = None, arm_keys=None, out: str | Path = "results",
        progress: bool = True, b_model: str = "auto", node_window: int = 5,
        threads: int | None = 1, merge: bool = False, shooting: dict | None = None,
        from_partial: bool = False, lr_schedule: str | None = "config", data_seed: int = 0,
        weight_decay: float | None = None, network: str = "mlp") -> dict:
    """Train and evaluate the arms (``arm_keys``: a subset) with every seed; write the report.
    ``merge``: keep the other arms of the report already in ``out`` (same task, budget and
    seeds) and replace the ones run now — training is seeded, so an arm rerun is the same model;
    use it to re-evaluate or add arms without retraining the rest.  ``from_partial``: write the
    report of the seeds that an interrupted run finished (``<stem>_partial.json``), training
    nothing.  ``lr_schedule``: fit's, for every arm ("config": the task's CONFIG entry);
    ``weight_decay``: the same for Adam's weight decay (None: the task's CONFIG entry).
    ``data_seed``: the task's draw (trajectories and noise); every training seed shares it.
    ``network``: every arm's (train.NETWORKS: "invariant" builds the two-body tasks' networks
    on |q₁ − q₂|; unknown names and tasks without invariants are refused before training)."""
    if task_name not in CONFIG:
        raise ValueError(f"unknown task {task_name!r}; known: {', '.join(CONFIG)}")
    if threads:
        # shared cores: one intra-op thread per process avoids oversubscription stalls
        torch.set_num_threads(threads)
    cfg = dict(CONFIG[task_name])
    if weight_decay is not None:
        cfg["weight_decay"] = check_real(weight_decay, "weight_decay", 0.0)
    if lr_schedule == "config":
        lr_schedule = cfg.get("lr_schedule")
    mode = dict(cfg["quick" if quick else "full"])
    n_seeds = seeds if seeds is not None else mode["seeds"]
    n_steps = steps if steps is not None else mode["steps"]
    bs = batch_size if batch_size is not None else mode["batch"]
    t_start = time.perf_counter()
    task = study_task(task_name, data_seed, quick=quick)
    shooting = dict(SHOOTING[task_name], **(shooting or {}))
    all_arms = every_arm = make_arms(task, b_model=b_model, node_window=node_window, shooting=shooting,
                                     full_batch=bs is None)
    out = Path(out)
    stem = report_stem(out, task_name, network)
    if network != "mlp" and not from_partial:     # (a partial's network is checked below)
        if not arm_keys:   # by default the arms whose network takes the features: not (d)'s field
            takes = datasets.INVARIANT_FEATURES.get(task_name)
            all_arms = [a for a in all_arms if takes is None or a.model in takes]
        try:               # a task or arm without features: refused now, not after training
            for arm in all_arms if not arm_keys else [a for a in all_arms if a.key in arm_keys]:
                build_model(arm, task, network=network)
        except ValueError as err:
            raise UsageError(str(err)) from None
    if arm_keys:
        unknown = set(arm_keys) - {a.key for a in all_arms}
        if unknown:
            raise UsageError(f"unknown arms {sorted(unknown)}; known: {[a.key for a in all_arms]}")
        all_arms = [a for a in all_arms if a.key in arm_keys]

    try:
        from tqdm.auto import tqdm
        outer = tqdm(total=n_seeds * len(all_arms), desc=f"hnn {task_name}", disable=not progress)
    except ImportError:
        outer = None
    results = {a.key: [] for a in all_arms}
    keep = {}
    previous = old_keep = None
    if merge:      # before training: a report of another budget or data is refused at once
        previous, old_keep = _previous(stem, quick=quick, seeds=n_seeds, steps=n_steps, batch=bs,
                                        lr_schedule=lr_schedule, data_seed=data_seed,
                                        weight_decay=cfg["weight_decay"], network=network)
    if from_partial:       # a run stopped early: report the seeds it finished, train nothing
        part = json.loads(stem.with_name(stem.name + "_partial.json").read_text())
        if part.get("data_seed", 0) != data_seed:
            raise ValueError(f"--from-partial: that run drew data seed {part.get('data_seed', 0)}, "
                             f"this one asks for {data_seed}")
        results = {k: v for k, v in part["per_seed"].items() if v}
        n_seeds, n_steps, bs, shooting = part["seeds_done"], part["steps"], part["batch_size"], part["shooting"]
        lr_schedule = part.get("lr_schedule")
        if part.get("weight_decay", cfg["weight_decay"]) != cfg["weight_decay"]:
            raise ValueError(f"--from-partial: that run used weight decay {part['weight_decay']}, "
                             f"this one asks for {cfg['weight_decay']}")
        if part.get("network", "mlp") != network:
            raise ValueError(f"--from-partial: that run used the network {part.get('network', 'mlp')!r}, "
                             f"this one asks for {network!r}")
        t_start -= part.get("wall_seconds", float("nan"))
        all_arms = [a for a in make_arms(task, b_model=b_model, node_window=node_window, shooting=shooting,
                                         full_batch=bs is None) if a.key in results]
        traj = _trajectories(stem)
        keep = torch.load(traj, weights_only=True) if traj.exists() else {}
        n_loop = 0
    else:
        n_loop = n_seeds
    for seed in range(n_loop):
        trained = {}
        for arm in all_arms:
            if arm.reuse and arm.reuse in trained:      # same arm, same seed: the same model
                got = trained[arm.reuse]
            else:
                source = next(a for a in every_arm if a.key == arm.reuse) if arm.reuse else arm
                try:
                    got = train(source, task, seed=seed, steps=n_steps, batch_size=bs,
                                lr=cfg["lr"], weight_decay=cfg["weight_decay"],
                                substeps=cfg["substeps"], progress=progress, shooting=shooting,
                                lr_schedule=lr_schedule, network=network)
                except TRAINING_FAILURES as err:   # a failed seed of this arm, not a failed run
                    got = f"training: {type(err).__name__}: {str(err)[:300]}"
                trained[source.key] = got
            if isinstance(got, str):
                metrics, traj = failed_metrics(got) | {"train_seconds": None, "seed": seed}, None
            else:
                model, hist = got
                metrics, traj = evaluate(model, arm, task, substeps=cfg["substeps"])
                metrics.update(train_seconds=hist["seconds"], final_loss=hist["loss"][-1], seed=seed)
            results[arm.key].append(metrics)
            if seed == 0:
                keep[arm.key] = traj             # None for a failed seed: left out of the plots
            if outer is not None:
                outer.update(1)
                outer.set_postfix(arm=arm.key, energy_mse=f"{metrics['energy_mse']:.2e}")
        # every seed's metrics as they come, so a run stopped early keeps the seeds it finished
        out.mkdir(parents=True, exist_ok=True)
        if seed == 0:   # (with --merge, beside the earlier arms' rollouts, not over them)
            torch.save({k: v for k, v in (old_keep or {}).items() if k not in results} | keep,
                       _trajectories(stem))
        stem.with_name(stem.name + "_partial.json").write_text(json.dumps(
            {"task": task_name, "quick": quick, "data_seed": data_seed, "seeds_done": seed + 1, "steps": n_steps,
             "batch_size": bs, "shooting": shooting, "lr_schedule": lr_schedule,
             "weight_decay": cfg["weight_decay"], "network": network, "per_seed": results,
             "wall_seconds": time.perf_counter() - t_start}, indent=1, allow_nan=True))
    if outer is not None:
        outer.close()
    wall = time.perf_counter() - t_start
    if merge:
        for key, arm in previous["arms"].items():
            if key not in results:
                results[key] = arm["per_seed"]
                if key in old_keep:
                    keep[key] = old_keep[key]
        all_arms = [a for a in every_arm if a.key in results]
        wall += previous["wall_seconds"]

    summary = {}
    for arm in all_arms:
        summary[arm.key] = _summary(results[arm.key])
    ratios = _ratios(summary, "a")
    ratios_fd = _ratios(summary, "a_fd")

    report = {
        "task": task_name, "quick": quick, "seeds": n_seeds, "steps": n_steps, "batch_size": bs,
        "lr": cfg["lr"], "weight_decay": cfg["weight_decay"], "substeps": cfg["substeps"],
        "shooting": shooting, "lr_schedule": lr_schedule, "network": network,
        "data": task.meta | {"dt": task.dt, "train_trajectories": int(task.q_train.shape[0]),
                             "eval_initial_conditions": int(task.q_eval.shape[0])},
        "arms": {a.key: (_earlier_arm(previous, a.key, results, summary) or
                         {"label": a.label, "model": a.model, "loss": a.loss, "window": a.window,
                          "evaluation": a.evaluation, "shooting": shooting,
                          "per_seed": results[a.key], "summary": summary[a.key]})
                 for a in all_arms},
        "ratios_to_a": ratios,
        "ratios_to_a_fd": ratios_fd,
        "paper_energy_mse_derivative_matching": datasets.PAPER_ENERGY_MSE[task_name],
        "wall_seconds": wall,
        "machine": {"platform": platform.platform(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(),
                    "note": "wall-clock numbers measured on shared, loaded cores"},
    }
    out.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2, allow_nan=True))
    stem.with_suffix(".md").write_text(markdown(report))
    # seed 0's rollouts, so that a later --merge can redraw the figures with every arm
    missing = [a.key for a in all_arms if a.key not in keep]
    if missing:   # merged into a report whose rollouts were not saved: keep its figures
        print(f"--merge: no saved seed-0 rollouts of arm(s) {missing}: the figures were not redrawn")
    else:
        torch.save(keep, _trajectories(stem))
        plot(task, all_arms, keep, stem)
    return report


def _summary(rows):
    """mean ± s.e. of every metric over the seeds that rolled out, and the failed seeds (a
    failed seed's ε_H, measured all the same, was averaged in while its energy and state MSE
    were left out)."""
    ok = [r for r in rows if "failed" not in r]
    out = {m: dict(zip(("mean", "se"), _mean_se([r.get(m) for r in ok]))) for m in METRICS}
    out["failed_seeds"] = [r["seed"] for r in rows if "failed" in r]
    return out


def _earlier_arm(previous, key, results, summary):
    """A merged report's entry for an arm it took from the earlier report, as that report
    described it (its label and shooting settings: this run's would relabel an arm trained with
    others), or None for an arm run now."""
    if (previous is None or key not in previous["arms"]
            or results[key] is not previous["arms"][key]["per_seed"]):
        return None
    entry = dict(previous["arms"][key])
    entry.setdefault("shooting", previous.get("shooting"))
    return entry | {"summary": summary[key]}


def report_stem(out: Path, task_name: str, network: str = "mlp") -> Path:
    """``out/hnn_<task>``, and ``hnn_<task>_<network>`` for another network than the MLPs (the
    reports, figures, rollouts and partial results of the two studies side by side in one dir)."""
    return Path(out) / (f"hnn_{task_name}" + ("" if network == "mlp" else f"_{network}"))


def _trajectories(stem: Path) -> Path:
    return stem.with_name(stem.name + "_trajectories.pt")


def _previous(stem: Path, **expected):
    """The report (and seed-0 rollouts, if saved) that --merge adds to; it must have been run
    with the same budget."""
    path = stem.with_suffix(".json")
    if not path.exists():
        raise FileNotFoundError(f"--merge needs an earlier report {path}")
    rep = json.loads(path.read_text())
    got = dict(quick=rep["quick"], seeds=rep["seeds"], steps=rep["steps"], batch=rep["batch_size"],
               lr_schedule=rep.get("lr_schedule"), data_seed=rep["data"].get("seed", 0),
               weight_decay=rep.get("weight_decay"), network=rep.get("network", "mlp"))
    if got != expected:
        raise ValueError(f"--merge: {path} was run with {got}, this run is {expected}")
    traj = _trajectories(stem)
    keep = torch.load(traj, weights_only=True) if traj.exists() else {}
    return rep, keep


#: The arms whose order --quick must reproduce (the new ones and their references).
RANKED = ("a", "a_fd", "b5", "e", "e4", "g", "g_ode", "f", "f_v")


def ranking(rep: dict, metric: str = "energy_mse", keys=RANKED) -> list[str]:
    """The arms of a report among ``keys`` (those that ran, with a finite mean), best first by
    the seed mean of ``metric``."""
    rows = [(a["summary"][metric]["mean"], k) for k, a in rep["arms"].items()
            if k in keys and a["summary"][metric]["mean"] is not None]
    return [k for _, k in sorted(rows)]


def compare_rankings(quick: dict, full: dict, metric: str = "energy_mse", keys=RANKED) -> dict:
    """Whether a --quick report orders the arms both reports share as the full one does (two
    reports of different networks are refused: their arms are different models)."""
    nets = [rep.get("network", "mlp") for rep in (quick, full)]
    if nets[0] != nets[1]:
        raise ValueError(f"the reports are of different networks ({nets[0]!r} and {nets[1]!r})")
    shared = set(quick["arms"]) & set(full["arms"]) & set(keys)
    rq, rf = ranking(quick, metric, shared), ranking(full, metric, shared)
    return {"metric": metric, "quick": rq, "full": rf, "same": rq == rf}


def cross_task_table(reports: list[dict], metric: str, keys=None) -> str:
    """A markdown table of one metric (mean ± s.e.), arms as rows and tasks as columns, with
    each arm's ratio to (a) in the same run."""
    keys = keys or [k for k in reports[0]["arms"]]
    head = ("| " + metric.replace("_", " ") + " | "
            + " | ".join(r["task"] + ("" if r.get("network", "mlp") == "mlp" else f" ({r['network']} network)")
                         for r in reports) + " |")
    lines = [head, "|---" * (len(reports) + 1) + "|"]
    for k in keys:
        cells = []
        for r in reports:
            arm = r["arms"].get(k)
            if arm is None:
                cells.append("—")
                continue
            s = arm["summary"][metric]
            cell = mean_pm_se(s["mean"], s["se"])
            base = r["arms"].get("a", {}).get("summary", {}).get(metric, {}).get("mean")
            if k != "a" and base and s["mean"] is not None:
                cell += f" (×{s['mean'] / base:.2g})"
            failed = len(arm["summary"].get("failed_seeds", []))
            cells.append(cell + (f", {failed} failed" if failed else ""))
        label = reports[0]["arms"].get(k, {}).get("label", k)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ratios(summary, base):
    """Each other arm's seed-mean metrics divided by arm ``base``'s ({} if base was not run)."""
    if base not in summary:
        return {}
    out = {}
    for key, s in summary.items():
        if key == base:
            continue
        out[f"{key}/{base}"] = {}
        for m in ("state_mse", "energy_mse", "energy_drift", "eps_H"):
            num, den = s[m]["mean"], summary[base][m]["mean"]
            out[f"{key}/{base}"][m] = (num / den) if (num is not None and den) else None
    return out


NETWORK_NOTE = {"invariant": "every network of the invariant |q₁ − q₂| (V_θ = MLP(|q₁ − q₂|), "
                             "T_θ = MLP(p); the HNN's H_θ = MLP(|q₁ − q₂|, p))"}


def markdown(rep: dict) -> str:
    lines = [f"# HNN study: {rep['task']}{' (--quick)' if rep['quick'] else ''}", "",
             f"{rep['seeds']} seed(s), {rep['steps']} Adam steps (lr {rep['lr']}"
             f"{', ' + rep['lr_schedule'] + ' decay' if rep.get('lr_schedule') else ''}, weight decay "
             f"{rep['weight_decay']}), batch {rep['batch_size'] or 'full'}"
             f"{'' if rep.get('network', 'mlp') == 'mlp' else ', ' + NETWORK_NOTE[rep['network']]}; data dt = "
             f"{rep['data']['dt']:.4g}, {rep['data']['train_trajectories']} training trajectories, "
             f"{rep['data']['eval_initial_conditions']} held-out initial conditions rolled out to "
             f"t = {rep['data']['horizon']:.3g}.  Mean ± s.e. over seeds; energy metrics use the true H.",
             "",
             "Rollouts that failed (an implicit step with no solution, or a blow-up) are "
             "counted under 'failed' and left out of that arm's means.",
             "",
             "| arm | evaluated by | state MSE | energy MSE | energy drift | ε_H | train s | failed |",
             "|---|---|---|---|---|---|---|---|"]
    for key, arm in rep["arms"].items():
        s = arm["summary"]
        lines.append(f"| {arm['label']} | {arm['evaluation']} | " + " | ".join(
            mean_pm_se(s[m]["mean"], s[m]["se"]) for m in ("state_mse", "energy_mse", "energy_drift",
                                                     "eps_H", "train_seconds"))
            + f" | {len(s.get('failed_seeds', []))}/{len(arm['per_seed'])} |")
    for field, base in (("ratios_to_a", "(a)"), ("ratios_to_a_fd", "(a′)")):
        if not rep.get(field):
            continue
        lines += ["", f"Ratios to arm {base}, same run (ratio of the seed means, failed rollouts "
                      f"left out; < 1: better than {base}):", "",
                  "| ratio | state MSE | energy MSE | energy drift | ε_H |", "|---|---|---|---|---|"]
        for name, r in rep[field].items():
            cells = ["—" if r[m] is None else f"{r[m]:.3g}"
                     for m in ("state_mse", "energy_mse", "energy_drift", "eps_H")]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for metric in ("energy_mse", "state_mse"):
        order = ranking(rep, metric, keys=tuple(rep["arms"]))
        lines += ["", f"Arms by {metric.replace('_', ' ')} (best first): " + ", ".join(order)]
    failed = [(k, r["seed"], r["failed"]) for k, a in rep["arms"].items() for r in a["per_seed"] if "failed" in r]
    if failed:
        lines += ["", "Failed rollouts: " + "; ".join(f"{k} seed {s}: {m}" for k, s, m in failed)]
    paper = rep["paper_energy_mse_derivative_matching"]
    if paper is not None:
        lines += ["", f"The HNN paper reports an energy MSE of {paper:.3g} "
                  "for derivative matching on this task (its own budget and evaluation); our arm (a) is a "
                  "re-implementation, and the ratios above compare arms of this run only."]
    if rep.get("shooting"):
        lines += ["", f"Shooting arms (e), (e′), (f): {rep['shooting']} (segment None: single "
                  "shooting; (f) reuses (e)'s trained model, (g″) (g)'s); train s of (f) is (e)'s "
                  "training, of (g″) (g)'s."]
    lines += [
              f"Wall time of the run: {rep['wall_seconds']:.0f} s (shared, loaded cores: noisy).", ""]
    return "\n".join(lines)


def plot(task, arms, keep, stem: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [a for a in arms if keep.get(a.key) is not None]
    if not shown:                # every arm's seed 0 failed: nothing to draw
        print(f"no rollout of seed 0 succeeded: {stem.name}'s figures were not drawn")
        return
    cols = min(4, len(shown))
    rows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 3.0 * rows), squeeze=False)
    for ax in axes.flat[len(shown):]:
        ax.set_visible(False)
    ics = range(min(3, task.q_eval.shape[0]))
    for ax, arm in zip(axes.flat, shown):
        q, p = keep[arm.key]
        for i in ics:
            if task.name.startswith("twobody"):
                ax.plot(task.q_eval[i, :, 0], task.q_eval[i, :, 1], "k-", lw=2, alpha=0.5)
                ax.plot(q[i, :, 0], q[i, :, 1], lw=1)
                ax.set_xlabel("$x_1$")
            else:
                ax.plot(task.q_eval[i, :, 0], task.p_eval[i, :, 0], "k-", lw=2, alpha=0.5)
                ax.plot(q[i, :, 0], p[i, :, 0], lw=1)
                ax.set_xlabel("$q$")
        ax.set_title(arm.label, fontsize=7)
        ax.set_aspect("equal", adjustable="datalim")
    for ax in axes[:, 0]:
        ax.set_ylabel("$y_1$" if task.name.startswith("twobody") else "$p$")
    fig.suptitle(f"{task.name}: truth (grey) and rollouts (seed 0)", fontsize=9)
    fig.tight_layout()
    fig.savefig(stem.with_name(stem.name + "_phase.png"), dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    t = task.dt * np.arange(task.q_eval.shape[1])
    e_true = task.energy(task.q_eval, task.p_eval)
    for arm in shown:
        q, p = keep[arm.key]
        err = (task.energy(q, p) - e_true).abs().mean(0).numpy()
        ax.semilogy(t[1:], err[1:], label=arm.label, lw=1)       # t = 0 is exact for every arm
    ax.set_xlabel("t")
    ax.set_ylabel("mean |H(x̂_t) − H(x_t)|")
    ax.set_title(f"{task.name}: energy error along the rollouts (true H, seed 0)", fontsize=9)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(stem.with_name(stem.name + "_energy.png"), dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=sorted(CONFIG))
    ap.add_argument("--quick", action="store_true", help="2 seeds, 300 steps, batches of 64 (~2 min)")
    ap.add_argument("--seeds", type=number("int", 1), help="number of seeds (default 5, --quick 2)")
    ap.add_argument("--steps", type=number("int", 1), help="gradient steps per arm")
    ap.add_argument("--batch-size", type=number("int", 1), help="samples (points or windows) per step")
    ap.add_argument("--arms", help="comma-separated subset of a,a_fd,a_s,b1,b5,b10,c,c_ode,d,e,e4,g,g_ode,f,f_v")
    ap.add_argument("--segment", type=number("int", 0), help="shooting segment length of (e)/(e′)/(f) (0: single shooting)")
    ap.add_argument("--continuity", type=number("real", 0.0), help="continuity weight of the shooting arms")
    ap.add_argument("--state-lr", type=number("real", 0.0, lo_open=True), help="learning rate of the shooting-node states")
    ap.add_argument("--gauss-newton", type=number("int", 0), help="Gauss–Newton sweeps on the node states per "
                    "step (0: states learned with --state-lr)")
    ap.add_argument("--solve-every", type=number("int", 1), help="solve the node states at every k-th training "
                    "step only (TrajectoryFit's solve_every; with --gauss-newton)")
    ap.add_argument("--derivative-weight", type=number("real", 0.0),
                    help="weight of (g)'s derivative matching at the estimated states (default 1)")
    ap.add_argument("--derivative-points", type=number("int", 1),
                    help="(g): derivatives matched at this many of the batch's points a step, drawn "
                         "at random (default: all)")
    ap.add_argument("--derivative-warmup", type=number("int", 0),
                    help="(g): training steps over which the derivative weight rises from 1 to its value")
    ap.add_argument("--method2", help="training/evaluation method of (e′) (default yoshida4)")
    ap.add_argument("--substeps2", type=number("int", 1), help="substeps per data interval of (e′)")
    ap.add_argument("--batch-factor2", type=number("int", 1),
                    help="(e′)'s segments per step per sample of the batch (default: the task's batch_factor)")
    ap.add_argument("--b-model", choices=["auto", "hnn"], default="auto",
                    help="'hnn': arm (b) uses HNN + implicit midpoint even on separable tasks")
    ap.add_argument("--node-window", type=number("int", 1), default=5)
    ap.add_argument("--lr-schedule", choices=["config", "constant", "cosine"], default="config",
                    help="learning-rate schedule of every arm (default: the task's CONFIG)")
    ap.add_argument("--weight-decay", type=number("real", 0.0),
                    help="Adam's weight decay for every arm (default: the task's CONFIG entry)")
    ap.add_argument("--network", choices=NETWORKS, default="mlp",
                    help="every arm's network: 'mlp' (the HNN paper's, of the state) or 'invariant' "
                         "(the same MLPs of the two-body tasks' |q1 - q2|: V_θ, and H_θ of (|q1 - q2|, p); "
                         "every arm but (d), whose field takes no features; reports hnn_<task>_invariant.*)")
    ap.add_argument("--data-seed", type=number("int", 0), default=0,
                    help="the task's draw of trajectories and noise (default 0, the study's)")
    ap.add_argument("--threads", type=number("int", 0), default=1, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--out", default="results")
    ap.add_argument("--merge", action="store_true",
                    help="replace only the arms run now in the report already in --out")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--from-partial", action="store_true",
                    help="report the seeds an interrupted run of --task finished (train nothing)")
    ap.add_argument("--table", metavar="DIR", help="only print the cross-task tables of the reports in DIR")
    ap.add_argument("--floor", action="store_true",
                    help="only print the true H's energy / state MSE when rolled out by Verlet at h = dt "
                         "(the trajectory arms' evaluation) on each task")
    ap.add_argument("--compare", nargs=2, metavar=("QUICK_JSON", "FULL_JSON"),
                    help="only compare the arm rankings of a --quick and a full report")
    args = ap.parse_args(argv)
    if args.table:
        reports = [json.loads(path.read_text()) for t in CONFIG for n in NETWORKS
                   if (path := report_stem(args.table, t, n).with_suffix(".json")).exists()]
        if not reports:
            raise SystemExit(f"no hnn_<task>.json reports in {args.table}")
        for metric in ("energy_mse", "state_mse", "eps_H", "train_seconds"):
            print(cross_task_table(reports, metric) + "\n")
        return
    if args.floor:
        print("| the true H by Verlet at h = dt | dt | energy MSE | state MSE |\n|---|---|---|---|")
        for name in CONFIG:
            task = study_task(name, args.data_seed)
            f = truth_floor(task)
            print(f"| {name} | {task.dt:.4g} | {f['energy_mse']:.3g} | {f['state_mse']:.3g} |")
        return
    if args.compare:
        missing = [p for p in args.compare if not Path(p).is_file()]
        if missing:
            ap.error(f"--compare: no such report {', '.join(missing)}")
        quick, full = (json.loads(Path(p).read_text()) for p in args.compare)
        try:
            for metric in ("energy_mse", "state_mse"):
                print(json.dumps(compare_rankings(quick, full, metric)))
        except ValueError as err:
            ap.error(f"--compare: {err}")
        return
    if not args.task:
        ap.error("--task is required (or --table DIR, or --compare QUICK_JSON FULL_JSON)")
    shooting = {k: v for k, v in dict(segment=args.segment, continuity=args.continuity,
                                      state_lr=args.state_lr, method2=args.method2,
                                      substeps2=args.substeps2, batch_factor2=args.batch_factor2,
                                      gauss_newton=args.gauss_newton,
                                      solve_every=args.solve_every,
                                      derivative_weight=args.derivative_weight,
                                      derivative_points=args.derivative_points,
                                      derivative_warmup=args.derivative_warmup).items() if v is not None}
    if shooting.get("segment") == 0:
        shooting["segment"] = None
    try:    # an unknown arm is found once the task's arms are built: a usage error too
        rep = run(args.task, quick=args.quick, seeds=args.seeds, steps=args.steps,
                  batch_size=args.batch_size, arm_keys=args.arms.split(",") if args.arms else None,
                  out=args.out, progress=not args.no_progress, b_model=args.b_model,
                  node_window=args.node_window, threads=args.threads, merge=args.merge,
                  shooting=shooting, from_partial=args.from_partial, data_seed=args.data_seed,
                  weight_decay=args.weight_decay, network=args.network,
                  lr_schedule=None if args.lr_schedule == "constant" else args.lr_schedule)
    except UsageError as err:
        ap.error(str(err))
    print(markdown(rep))


if __name__ == "__main__":
    main()
