r"""Diagnose the shooting arms (e) / (e′) of the HNN study on a task (spring, pendulum, two-body,
noisy two-body).

    python -m experiments.hnn.diagnose --task pendulum --arms e,e4 --steps 2000 --every 200 \
        --seed 100 [--state-lr 1e-2] [--continuity 1] [--segment 4] [--substeps 1] [--gauss-newton 1] \
        [--batch-size N] [--state-optimizer adam|lazy] [--schedule cosine] [--data-seed 100] \
        [--tag NAME] [--out results]

Trains arm (e) (Verlet at h = dt / substeps) and/or (e′) (``--method2``, yoshida4 by default)
exactly as :func:`experiments.hnn.train.train` does (same seeded model, the TrajectoryFit of
``shooting_fit``, ``TrajectoryFit.optimizer`` with the study's lr 1e-3 / weight decay 1e-4, the
same full-batch order as ``fit``), and every ``--every`` steps logs

* ``loss``      the training loss (data misfit + continuity term) of the step,
* ``defect``    the RMS continuity defect |Φ(z_s) − z_{s+1}| over the inner nodes,
* ``node_err``  the RMS distance of the learned node states to the *clean* states at the nodes
                (the noise of the observations is σ = 0.1 per coordinate, so the observed
                states start at RMS distance ≈ 0.1·√2 on spring and pendulum, 0.1·√8 on noisy
                two-body, 0 on noise-free two-body, whose observations are the clean states),
* ``eps_H``     the study's ε_H (learned H vs true H on the clean test points, up to a constant),
* ``energy``    held-out energy MSE (the study's evaluation: clean test initial states rolled
                out over t ∈ [0, 20] by the arm's method at h = dt),
* ``hw_max``    max over the training observations of h·ω_θ with ω_θ² = ∂²T_θ/∂p²·∂²V_θ/∂q²
                (the local frequency of the learned separable H; the true pendulum has
                h·ω ≤ 0.167 at h = dt; Verlet is unstable for h·ω ≥ 2 and its phase error
                grows like (h·ω)²/24),
* ``hw_p99``    the 99th percentile of the same.

Finding (pendulum, 2026-12-03): at the study's constant lr, full-batch Adam reaches a flat loss
floor after ~1000 steps and then spikes every ~150–200 steps (loss +0.5–9 % over the running
minimum, ε_H ×2–6, held-out energy MSE ×5–30, recovered within ~25–50 steps), for (e) and (e′)
alike, with state_lr 1e-3, continuity 10 or substeps 2; the learned h·ω stays at the truth's
0.17 (no stiffness, no resonance).  The step-2000 metrics sample a random phase of that cycle:
the reported (e) seeds 0/1 ended in a spike (final loss 8.89e-3 / 8.84e-3 vs the 8.72e-3 floor).
``--schedule cosine`` (fit's lr_schedule) removes the spikes.  Reproduce:
``--data-seed 0 --arms e --every 25`` (constant) vs the same with ``--schedule cosine``.

Use the development seed (100), never the reported seeds 0–4.  The clean training states are
re-drawn from the task's random stream (the same draws as :mod:`experiments.hnn.data`) and
checked against the noisy observations.  Writes ``<out>/diagnose_<task>_<tag>.md`` (one table
per arm) and ``.json``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from torchgeo_int.nn.metrics import hamiltonian_error
from torchgeo_int.nn.training import TensorBatches, lr_factor, seed_everything
from torchgeo_int.nn.shooting import TrajectoryFit

from ..cli import number
from . import data as datasets
from .run import CONFIG, SHOOTING as TASK_SHOOTING
from .train import SHOOTING, arms as make_arms, build_model, evaluate, shooting_fit, state_lr, train


def clean_training_states(task_name: str, seed: int, task) -> torch.Tensor:
    """The clean training trajectories (B, T, 2n) of the task drawn with data seed ``seed``:
    spring / pendulum replay the random draws of ``data._one_dof_task`` (direction, radius,
    noise of q, of p); noisy two-body redraws the same orbits without noise; noise-free two-body's
    observations are the clean states."""
    if task_name == "twobody":
        return torch.cat([task.q_train, task.p_train], -1)
    if task_name == "twobody_noisy":
        c = datasets.twobody(seed, trajectories=task.meta["trajectories"])
        clean = torch.cat([c.q_train, c.p_train], -1)
    else:
        spec = {"pendulum": (45, lambda rs: rs.rand() + 1.3,
                             lambda y: np.stack([2 * y[..., 1], -3 * np.sin(y[..., 0])], -1)),
                "spring": (30, lambda rs: rs.rand() * 0.9 + 0.1,
                           lambda y: np.stack([2 * y[..., 1], -2 * y[..., 0]], -1))}
        T, radius, field_fn = spec[task_name]
        rs = np.random.RandomState(seed)
        y0s = []
        for _ in range(50):
            y0 = rs.rand(2) * 2 - 1
            r = radius(rs)
            y0s.append(y0 / np.sqrt((y0 ** 2).sum()) * r)
            rs.randn(T), rs.randn(T)
        clean = torch.as_tensor(datasets._solve_many(field_fn, y0s, np.linspace(0.0, 3.0, T))[:25],
                                dtype=torch.float64)
    noise = torch.cat([task.q_train, task.p_train], -1).double() - clean
    if not 0.05 < float(noise.std()) < 0.2:        # the replay must reproduce the task's draws
        raise RuntimeError(f"replayed clean states do not match the observations (residual std "
                           f"{float(noise.std()):.3g}, expected ≈ 0.1)")
    return clean


def local_frequency(model, q, p, h):
    """h·ω_θ at the points, ω_θ² = |∂²H_θ/∂q² · ∂²H_θ/∂p²| (1 dof; separable H: exact);
    NaN for more degrees of freedom."""
    if q.shape[-1] != 1:
        return torch.full(q.shape[:-1], float("nan"), dtype=q.dtype)
    q = q.detach().clone().requires_grad_(True)
    p = p.detach().clone().requires_grad_(True)
    H = model.hamiltonian(q, p).sum()
    gq, gp = torch.autograd.grad(H, (q, p), create_graph=True)
    hqq = torch.autograd.grad(gq.sum(), q, retain_graph=True)[0]
    hpp = torch.autograd.grad(gp.sum(), p)[0]
    return h * (hqq * hpp).abs().sqrt().squeeze(-1).detach()


def run_arm(arm, task, clean, *, seed, steps, every, lr, weight_decay, shooting, batch_size=None,
            opt_options=None, schedule=None, oracle=False):
    seed_everything(seed)
    model = build_model(arm, task).float()
    if oracle:              # the node states are the clean ones, fixed: nothing to solve
        shooting = dict(shooting, gauss_newton=0, solve_every=1)
    tf = shooting_fit(arm, model, task.to(torch.float32), shooting=shooting)
    if oracle:
        S, seg, n = tf.n_segments, tf.segment, tf.dim
        with torch.no_grad():
            nodes = clean[:, :S * seg:seg].to(tf.q_nodes.dtype)
            tf.q_nodes.copy_(nodes[..., :n])
            tf.p_nodes.copy_(nodes[..., n:])
        tf.q_nodes.requires_grad_(False)
        tf.p_nodes.requires_grad_(False)
    opt = tf.optimizer(lr=lr, state_lr=state_lr(shooting), weight_decay=weight_decay,
                       **(opt_options or {}))
    B, S, seg = tf.trajectories, tf.n_segments, tf.segment
    clean_nodes = clean[:, :S * seg:seg]                              # (B, S, 2n)
    h = task.dt / tf.substeps
    all_ids = tf.segments[0]
    batches = TensorBatches(tf.segments, batch_size, seed=seed)      # fit's batch order
    torch.manual_seed(seed)
    rows = []

    def log(step, loss):
        with torch.no_grad():
            nodes = torch.cat([tf.q_nodes, tf.p_nodes], -1).double()
            node_err = float(((nodes - clean_nodes) ** 2).sum(-1).mean().sqrt())
            defect = float((tf.continuity_defects() ** 2).mean().sqrt()) if S > 1 else 0.0
        metrics, _ = evaluate(model, arm, task)
        n = task.dim
        hw = local_frequency(copy_double(model), task.q_train.reshape(-1, n).double(),
                             task.p_train.reshape(-1, n).double(), h)
        rows.append(dict(step=step, loss=loss, defect=defect, node_err=node_err,
                         eps_H=metrics["eps_H"], energy=metrics["energy_mse"],
                         state=metrics["state_mse"], hw_max=float(hw.max()),
                         hw_p99=float(hw.quantile(0.99))))
        r = rows[-1]
        print(f"  {arm.key} step {step:5d}  loss {loss:.3e}  defect {defect:.3e}  node_err "
              f"{node_err:.4f}  eps_H {r['eps_H']:.4f}  energy {r['energy']:.3e}  state "
              f"{r['state']:.3e}  hw max {r['hw_max']:.3f} p99 {r['hw_p99']:.3f}", flush=True)

    t0 = time.perf_counter()
    tf.eval()                            # the step-0 loss must not solve the states (gauss_newton)
    log(0, float(tf(all_ids).detach()))
    tf.train()
    losses = []
    step, epoch = 0, 0
    while step < steps:
        for (ids,) in batches.epoch(epoch):
            loss = tf(ids)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if schedule is not None:                               # as fit(lr_schedule=...)
                factor = lr_factor(schedule, step, steps)
                for group in opt.param_groups:
                    group.setdefault("initial_lr", group["lr"])
                    group["lr"] = group["initial_lr"] * factor
            opt.step()
            losses.append(float(loss.detach()))
            step += 1
            if step % every == 0 or step == steps:
                log(step, float(loss.detach()))
            if step >= steps:
                break
        epoch += 1
    return rows, time.perf_counter() - t0, spikes(losses) if batch_size is None else {}


def run_plain_arm(arm, task, *, seed, steps, lr, weight_decay, batch_size=None, schedule=None):
    """A non-shooting arm ((a), (b), …) trained by the study's ``train`` in one go: one row, at
    the end (no node states: defect and node error are NaN)."""
    model, hist = train(arm, task, seed=seed, steps=steps, batch_size=batch_size, lr=lr,
                        weight_decay=weight_decay, progress=False, lr_schedule=schedule)
    metrics, _ = evaluate(model, arm, task)
    n = task.dim
    hw = local_frequency(copy_double(model), task.q_train.reshape(-1, n).double(),
                         task.p_train.reshape(-1, n).double(), task.dt) if arm.model != "MLPVectorField" \
        else torch.full((1,), float("nan"))
    row = dict(step=steps, loss=hist["loss"][-1], defect=float("nan"), node_err=float("nan"),
               eps_H=metrics.get("eps_H", float("nan")), energy=metrics["energy_mse"],
               state=metrics["state_mse"], hw_max=float(hw.max()), hw_p99=float(hw.quantile(0.99)))
    print(f"  {arm.key} step {steps}  loss {row['loss']:.3e}  eps_H {row['eps_H']:.4f}  energy "
          f"{row['energy']:.3e}  state {row['state']:.3e}", flush=True)
    return [row], hist["seconds"], spikes(hist["loss"]) if batch_size is None else {}


def spikes(losses, start=500, rise=0.005):
    """Full-batch loss spikes after step ``start``: steps whose loss exceeds the running minimum
    by more than ``rise`` (relative), the largest such excess, and the first such steps."""
    best, hits, worst = float("inf"), [], 0.0
    for i, v in enumerate(losses):
        if i >= start and v > best * (1 + rise):
            hits.append(i + 1)
            worst = max(worst, v / best - 1)
        best = min(best, v)
    onsets = [h for j, h in enumerate(hits) if j == 0 or hits[j - 1] != h - 1]
    return {"steps_above": len(hits), "max_rise": worst, "onsets": onsets[:30]}


def copy_double(model):
    import copy
    return copy.deepcopy(model).double()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="pendulum", choices=["pendulum", "spring", "twobody", "twobody_noisy"])
    ap.add_argument("--arms", default="e,e4",
                    help="comma-separated: e, e4 (logged along training) or any other arm of the "
                         "study (a, b5, …: trained by train.train, one row at the end)")
    ap.add_argument("--seed", type=int, default=100, help="training seed (develop on 100, not 0–4)")
    ap.add_argument("--data-seed", type=int, default=100,
                    help="seed of the task's data (the study's data are seed 0; develop on 100)")
    ap.add_argument("--trajectories", type=int, default=1000, help="two-body orbits")
    ap.add_argument("--state-optimizer", choices=["adam", "lazy"],
                    help="TrajectoryFit.optimizer(lazy_states=...): default the library's")
    ap.add_argument("--steps", type=number("int", 1), default=2000)
    ap.add_argument("--every", type=number("int", 1), default=200)
    ap.add_argument("--batch-size", type=int, help="random segments per step (default: all; the "
                    "study multiplies its batch by the task's batch_factor, (e′)'s by batch_factor2)")
    ap.add_argument("--segment", type=int, help="shooting segment length (0: single shooting)")
    ap.add_argument("--continuity", type=float)
    ap.add_argument("--state-lr", type=float)
    ap.add_argument("--gauss-newton", type=int, help="Gauss–Newton steps on the batch's node states "
                    "per training step (TrajectoryFit's gauss_newton; 0: learned by the optimizer)")
    ap.add_argument("--solve-every", type=int, help="solve the node states at every k-th training "
                    "step only (TrajectoryFit's solve_every; with --gauss-newton)")
    ap.add_argument("--substeps", type=int, default=1, help="substeps of arm (e)")
    ap.add_argument("--oracle-states", action="store_true",
                    help="a probe: the shooting arms' node states fixed at the clean states (not "
                         "estimated; the data stay noisy): what perfect state estimation would give")
    ap.add_argument("--method2")
    ap.add_argument("--substeps2", type=int)
    ap.add_argument("--schedule", choices=["cosine"], help="fit's lr_schedule (default: constant)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tag", default="base")
    ap.add_argument("--out", default="results")
    args = ap.parse_args(argv)
    if args.seed in range(5):
        print("warning: seeds 0-4 are the study's reported seeds; develop on another (100)")
    torch.set_num_threads(args.threads)
    cfg = CONFIG[args.task]
    if args.task.startswith("twobody"):
        task = datasets.TASKS[args.task](args.data_seed, trajectories=args.trajectories)
    else:
        task = datasets.TASKS[args.task](args.data_seed)
    clean = clean_training_states(args.task, args.data_seed, task)
    opt_options = ({} if args.state_optimizer is None
                   else {"lazy_states": args.state_optimizer == "lazy"})
    shooting = dict(SHOOTING, **TASK_SHOOTING[args.task])
    for k in ("segment", "continuity", "state_lr", "method2", "substeps2", "gauss_newton",
              "solve_every"):
        v = getattr(args, k)
        if v is not None:
            shooting[k] = v
    if shooting.get("segment") == 0:     # as in run.py: 0 asks for single shooting
        shooting["segment"] = None
    arms = {a.key: a for a in make_arms(task, shooting=shooting)}
    keys = args.arms.split(",")
    unknown = [k for k in keys if k not in arms]
    if unknown:
        ap.error(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(arms)}")
    # only the shooting arms have node states to fix; the others run as usual beside them (the
    # baseline of the same command), which is said, not left silent
    oracle_arms = [k for k in keys if arms[k].loss == "shooting"] if args.oracle_states else []
    if args.oracle_states and len(oracle_arms) < len(keys):
        print("--oracle-states applies to the shooting arms only ("
              + (", ".join(oracle_arms) or "none of those asked for") + "); arm(s) "
              + ", ".join(k for k in keys if k not in oracle_arms)
              + " have no node states and run as usual")
    out = {"task": args.task, "seed": args.seed, "data_seed": args.data_seed, "steps": args.steps,
           "shooting": shooting, "substeps_e": args.substeps, "batch_size": args.batch_size,
           "state_optimizer": args.state_optimizer, "schedule": args.schedule,
           "oracle_states": args.oracle_states, "oracle_arms": oracle_arms, "arms": {}}
    md = [f"# diagnose {args.task}, tag {args.tag}", "",
          f"training seed {args.seed}, data seed {args.data_seed}, {args.steps} steps, lr {cfg['lr']}, wd {cfg['weight_decay']}, "
          f"batch {args.batch_size or 'full'}, shooting {shooting}, substeps of (e) {args.substeps}, "
          f"state optimizer {args.state_optimizer or 'default'}, lr schedule {args.schedule or 'constant'}"
          + (f", node states of {', '.join(oracle_arms) or 'no arm'} fixed at the clean states "
             "(--oracle-states)" if args.oracle_states else ""), ""]
    for key in keys:
        arm = arms[key]
        if key == "e" and args.substeps > 1:
            from dataclasses import replace
            arm = replace(arm, substeps=args.substeps)
        print(f"{args.task} {args.tag}: arm {key} ({arm.label})", flush=True)
        if arm.loss != "shooting":
            rows, secs, spk = run_plain_arm(arm, task, seed=args.seed, steps=args.steps, lr=cfg["lr"],
                                            weight_decay=cfg["weight_decay"],
                                            batch_size=args.batch_size, schedule=args.schedule)
        else:
            rows, secs, spk = run_arm(arm, task, clean, seed=args.seed, steps=args.steps,
                                      every=args.every, lr=cfg["lr"],
                                      weight_decay=cfg["weight_decay"], shooting=shooting,
                                      batch_size=args.batch_size, opt_options=opt_options,
                                      schedule=args.schedule, oracle=args.oracle_states)
        out["arms"][key] = {"label": arm.label, "rows": rows, "seconds": secs, "spikes": spk}
        md += [f"## {arm.label} ({secs:.0f} s)", "",
               "| step | loss | defect | node err | ε_H | energy MSE | state MSE | h·ω max | h·ω p99 |",
               "|---|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['step']} | {r['loss']:.3e} | {r['defect']:.3e} | {r['node_err']:.4f} | "
               f"{r['eps_H']:.4f} | {r['energy']:.3e} | {r['state']:.3e} | {r['hw_max']:.3f} | "
               f"{r['hw_p99']:.3f} |" for r in rows]
        if spk:
            md += ["", f"Loss spikes after step 500 (loss > 1.005 × running min): {spk['steps_above']} "
                       f"steps, largest rise {100 * spk['max_rise']:.1f} %, onsets {spk['onsets']}"]
        md.append("")
    path = Path(args.out)
    path.mkdir(parents=True, exist_ok=True)
    stem = path / f"diagnose_{args.task}_{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(out, indent=1))
    stem.with_suffix(".md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
