"""The main demo's HNN part: an HNN trained through symplectic steps on the pendulum, next to
derivative matching (Greydanus et al. 2019) with the true derivatives and with finite
differences, at the same seeded budget of gradient steps (so the numbers repeat run to run)."""
from __future__ import annotations

import time

import torch

from . import data as datasets
from .train import arms, evaluate, train

#: (name, arm key) in the order they train; "symplectic" is (b) with ``window`` steps.
ARMS = (("symplectic", None), ("derivative_matching", "a"), ("derivative_matching_fd", "a_fd"))


def demo_pendulum(steps: int = 3000, progress: bool = True, *, window: int = 5,
                  batch_size: int = 64, seed: int = 0, threads: int | None = 1) -> dict:
    """Train (b) SeparableHNN through ``window`` Verlet steps, (a) HNN by derivative matching
    on the true derivatives at the clean states (the HNN paper's targets, which no other arm
    sees) and (a′) on finite differences of the noisy states (the information (b) has), each
    for ``steps`` Adam steps on batches of ``batch_size`` (same lr, weight decay and MLP), on
    the HNN paper's pendulum task; roll them out from the 25 held-out clean initial states over
    t ∈ [0, 20].  About a minute at the default 3000 steps on one CPU core, nearly all of it (b).

    Returns ``{name: metrics for name in ("symplectic", "derivative_matching",
    "derivative_matching_fd"), "energy_mse_ratio": symplectic / derivative_matching,
    "energy_mse_ratio_fd": symplectic / derivative_matching_fd, "seconds": total}``; each metrics
    dict has state_mse, energy_mse, energy_drift, eps_H, steps, train_seconds, method.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    task = datasets.pendulum(0)
    by_key = {a.key: a for a in arms(task, windows=(window,))}
    out = {}
    for name, key in ARMS:
        arm = by_key[key or f"b{window}"]
        model, hist = train(arm, task, seed=seed, steps=steps, batch_size=batch_size, lr=1e-3,
                            weight_decay=1e-4, progress=progress)
        metrics, _ = evaluate(model, arm, task)
        metrics.update(steps=hist["step"], train_seconds=hist["seconds"], method=arm.label)
        out[name] = metrics
    b = out["symplectic"]["energy_mse"]
    for suffix, base in (("", "derivative_matching"), ("_fd", "derivative_matching_fd")):
        a = out[base]["energy_mse"]
        out[f"energy_mse_ratio{suffix}"] = b / a if a else float("nan")
    out["seconds"] = time.perf_counter() - t0
    return out
