"""A one-minute demo: an HNN trained through symplectic steps on the pendulum, next to the
derivative-matching baseline (Greydanus et al. 2019) trained for the same wall time."""
from __future__ import annotations

import time

import torch

from . import data as datasets
from .train import arms, evaluate, train


def demo_pendulum(seconds: float = 60.0, progress: bool = True, *, window: int = 5,
                  batch_size: int = 64, seed: int = 0, threads: int | None = 1) -> dict:
    """Train (b) SeparableHNN through ``window`` Verlet steps and (a) HNN by derivative
    matching on the HNN paper's pendulum task, each for about 0.45·``seconds`` of wall time
    (same lr, batch size and MLP), then roll both out from the 25 held-out clean initial states
    over t ∈ [0, 20].  Returns ``{"symplectic": metrics, "derivative_matching": metrics,
    "energy_mse_ratio": symplectic / derivative_matching, "seconds": total}``; each metrics dict
    has state_mse, energy_mse, energy_drift, eps_H, steps, train_seconds.
    """
    if not seconds > 0:
        raise ValueError(f"seconds must be positive, got {seconds!r}")
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    task = datasets.pendulum(0)
    by_key = {a.key: a for a in arms(task, windows=(window,))}
    out = {}
    for name, key in (("symplectic", f"b{window}"), ("derivative_matching", "a")):
        arm = by_key[key]
        model, hist = train(arm, task, seed=seed, steps=10 ** 7, batch_size=batch_size, lr=1e-3,
                            weight_decay=1e-4, progress=progress, max_time=0.45 * seconds)
        metrics, _ = evaluate(model, arm, task)
        metrics.update(steps=hist["step"], train_seconds=hist["seconds"], method=arm.label)
        out[name] = metrics
    a, b = out["derivative_matching"]["energy_mse"], out["symplectic"]["energy_mse"]
    out["energy_mse_ratio"] = b / a if a else float("nan")
    out["seconds"] = time.perf_counter() - t0
    return out
