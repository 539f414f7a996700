"""The main demo's HNN part: the library's recipe for learning a Hamiltonian from noisy observed
trajectories — a ``TrajectoryFit`` that estimates the clean states by Gauss–Newton and matches
the derivative targets there, trained through Verlet (the study's arm (g)) — next to derivative
matching (Greydanus et al. 2019) on the same targets at the noisy states (a) and on finite
differences (a′), on the study's mass–spring task at its settings and the same seeded number of
Adam steps, so the numbers repeat run to run and equal
``python -m experiments.hnn.run --task spring --seeds 1 --steps 600 --arms a,a_fd,g,g_ode``."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from .run import CONFIG, SHOOTING, plot, study_task
from .train import arms, evaluate, train

#: (name, arm key) in the order they are reported; "trajectory_fit" is (g) rolled out by Verlet
#: at h = dt, "trajectory_fit_dopri5" the same model by dopri5 as (a) and (a′) are ((g″))
ARMS = (("trajectory_fit", "g"), ("trajectory_fit_dopri5", "g_ode"),
        ("derivative_matching", "a"), ("derivative_matching_fd", "a_fd"))


def demo_hnn(steps: int = 600, progress: bool = True, *, task: str = "spring", seed: int = 0,
             threads: int | None = 1, out: str | Path | None = None) -> dict:
    """Train (g), (a) and (a′) on ``task`` (data seed 0, the study's draw) for ``steps`` Adam
    steps each at the study's settings (full batch, lr 1e-3 with the cosine decay, its weight
    decay and shooting settings), roll them out from the held-out clean initial states, and,
    with ``out``, draw the study's figures of them there (``hnn_<task>_phase.png``,
    ``hnn_<task>_energy.png``).  About a minute at the default 600 steps on one CPU core,
    nearly all of it (g).

    Returns ``{name: metrics for name in ("trajectory_fit", "trajectory_fit_dopri5",
    "derivative_matching", "derivative_matching_fd"), "energy_mse_ratio": (g″) / (a),
    "energy_mse_ratio_fd": (g″) / (a′), "seconds": total}``; each metrics dict has state_mse,
    energy_mse, energy_drift, eps_H, steps, train_seconds, method.  (g″) against (a) compares
    like with like: one model class's rollouts by dopri5, both fitted to (a)'s targets.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if task not in CONFIG:
        raise ValueError(f"unknown task {task!r}; known: {', '.join(CONFIG)}")
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    cfg, data = CONFIG[task], study_task(task)
    shooting = dict(SHOOTING.get(task, {}))
    by_key = {a.key: a for a in arms(data, shooting=shooting)}
    out_metrics, keep, trained = {}, {}, {}
    for name, key in ARMS:
        arm = by_key[key]
        source = by_key[arm.reuse] if arm.reuse else arm      # (g″) evaluates (g)'s model
        if source.key not in trained:
            trained[source.key] = train(source, data, seed=seed, steps=steps,
                                        batch_size=cfg["full"]["batch"], lr=cfg["lr"],
                                        weight_decay=cfg["weight_decay"], substeps=cfg["substeps"],
                                        progress=progress, shooting=shooting,
                                        lr_schedule=cfg["lr_schedule"])
        model, hist = trained[source.key]
        metrics, keep[key] = evaluate(model, arm, data, substeps=cfg["substeps"])
        metrics.update(steps=hist["step"], train_seconds=hist["seconds"], method=arm.label)
        out_metrics[name] = metrics
    g = out_metrics["trajectory_fit_dopri5"]["energy_mse"]
    for suffix, base in (("", "derivative_matching"), ("_fd", "derivative_matching_fd")):
        a = out_metrics[base]["energy_mse"]
        out_metrics[f"energy_mse_ratio{suffix}"] = g / a if a else float("nan")
    if out is not None:
        plot(data, [by_key[k] for _, k in ARMS], keep, Path(out) / f"hnn_{task}")
    out_metrics["seconds"] = time.perf_counter() - t0
    return out_metrics
