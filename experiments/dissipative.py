r"""Learning a damped (and a controlled) pendulum: port-Hamiltonian models through the forced
integrators vs a dissipative HNN by derivative matching on finite differences vs a Neural ODE.

    python -m experiments.dissipative [--tasks damped,controlled] [--steps S] [--arms A,B]
                                      [--seeds N] [--verlet] [--quick] [--out results]

Truth: q̈ = −sin q − c q̇ + u(t), c = 0.15, i.e. H = p²/2 + 1 − cos q with Rayleigh damping c and a
torque input G = 1; task ``damped`` has u = 0 (q₀ ~ U(−2.5, 2.5), p₀ ~ U(−1, 1)), task
``controlled`` u(t) = a sin(ωt + φ), a ~ U(0.1, 0.3), ω ~ U(1.3, 2) (above resonance), φ ~ U(0, 2π)
per trajectory, from q₀ ~ U(−1.5, 1.5), p₀ ~ U(−0.5, 0.5) (no trajectory goes over the top).  Data: 32 training trajectories on t ∈ [0, 10] sampled every
dt = 0.25 (clean states, DOP853 at rtol = atol = 1e-11), cut into windows of 5 states; 16 held-out
trajectories (new initial states and controls) over t ∈ [0, 20], twice the training horizon.

Arms, the same data and budget (``--steps`` Adam steps on batches of 64 windows, lr 3e-3 cosine,
float64, the same seeds):
  ours_midpoint  PortHamiltonianNN (H_θ = ½pᵀM_θ⁻¹p + V_θ(q), C_θ = LLᵀ, G_θ(q)) trained on the
                 forced eq. (20) residual of the midpoint map (``forced_residual_loss``), rolled
                 out by the forced implicit midpoint rule at dt — the map it was trained on;
  ours_verlet    the same model trained through 4 steps of forced Störmer–Verlet
                 (``forced_rollout_loss``), rolled out by forced Verlet at dt (``--verlet``;
                 each of its steps costs ~20× the others', so it is off by default);
  dhnn_fd        the same model trained by derivative matching on second-order finite differences
                 of the same states (``forced_derivative_loss``), rolled out by the forced
                 implicit midpoint at dt/4 (its learned continuous field, integrated finely);
  node           a Neural ODE MLP(q, p, u) → (q̇, ṗ) trained through 4 RK4 steps (torchdiffeq).
Metrics on the held-out set: state MSE over the horizon (q and p), energy-decay error
mean_t |E(x̂_t) − E(x_t)| with the true E = H, and the learned damping.  Mean ± s.e. over seeds.
Writes <out>/dissipative[_quick]_<tasks>_<S>steps_<arms>.{json,md}, e.g.
dissipative_damped_2000steps_ours_midpoint_dhnn_fd.md (runs with other tasks, budgets or arms do
not overwrite each other), and, when ``--arms`` is not given, one figure per task,
<out>/dissipative[_quick]_<task>_<S>steps.png.
``--quick`` is a tiny run (4 training and 2 held-out trajectories, 1 seed, t ≤ 2 held out, 3 Adam
steps unless ``--steps`` is given).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from scipy.integrate import solve_ivp
from tqdm import tqdm

import torchgeo_int as tgi
from torchgeo_int.nn import (PortHamiltonianNN, forced_derivative_loss, forced_residual_loss,
                             forced_rollout_loss, finite_differences, seed_everything)

from .cli import mean_pm_se

C_TRUE = 0.15
DT = 0.25
K = 4                     # steps per training window
T_TRAIN, T_TEST = 10.0, 20.0
TASKS = ("damped", "controlled")
ARMS = ("ours_midpoint", "ours_verlet", "dhnn_fd", "node")
DEFAULT_SEEDS, QUICK_SEEDS = 3, 1


def energy(q, p):
    return 0.5 * p[..., 0] ** 2 + 1.0 - torch.cos(q[..., 0])


def make_data(task: str, n: int, horizon: float, seed: int):
    """Trajectories (n, T, 1) of q and p and the control parameters (n, 3) = (a, ω, φ)."""
    rng = np.random.default_rng(seed)
    q0 = rng.uniform(-2.5, 2.5, n)
    p0 = rng.uniform(-1.0, 1.0, n)
    if task == "controlled":
        # driven above resonance and from lower energies, so that no trajectory goes over the top
        # (a rotating pendulum leaves the q-range of the data: V_θ is an MLP of q, not periodic)
        q0, p0 = 0.6 * q0, 0.5 * p0
        ctrl = np.stack([rng.uniform(0.1, 0.3, n), rng.uniform(1.3, 2.0, n),
                         rng.uniform(0.0, 2 * math.pi, n)], 1)
    else:
        ctrl = np.zeros((n, 3))
    t = DT * np.arange(int(round(horizon / DT)) + 1)
    qs, ps = [], []
    for i in range(n):
        a, w, ph = ctrl[i]

        def f(s, x):
            return [x[1], -math.sin(x[0]) - C_TRUE * x[1] + a * math.sin(w * s + ph)]

        sol = solve_ivp(f, (0, t[-1]), [q0[i], p0[i]], method="DOP853", t_eval=t, rtol=1e-11, atol=1e-11)
        qs.append(sol.y[0])
        ps.append(sol.y[1])
    as_t = lambda x: torch.tensor(np.array(x))[..., None]
    return as_t(qs), as_t(ps), torch.tensor(ctrl)


def control_fn(ctrl, t0=None):
    """u(t) = a sin(ω(t0 + t) + φ) for each row, as (N, 1); None for the damped task."""
    if not bool((ctrl[:, 0] != 0).any()):
        return None
    a, w, ph = ctrl[:, :1], ctrl[:, 1:2], ctrl[:, 2:3]
    ph = ph if t0 is None else ph + w * t0
    return lambda t: a * torch.sin(w * t + ph)


def windows(q, p, ctrl, dq=None, dp=None):
    """Windows of K+1 states, their control rows (phase shifted to each window's start)."""
    T = q.shape[1]
    W = T - K
    starts = torch.arange(W, dtype=q.dtype) * DT
    cut = lambda x: x.unfold(1, K + 1, 1).permute(0, 1, 3, 2).reshape(-1, K + 1, x.shape[-1])
    c = ctrl[:, None, :].expand(-1, W, -1).clone()
    c[..., 2] = c[..., 2] + c[..., 1] * starts
    out = [cut(q), cut(p), c.reshape(-1, 3)]
    if dq is not None:
        out += [cut(dq), cut(dp)]
    return out


class NODE(torch.nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.net = tgi.nn.MLP(3, 2, width=width, depth=2)
        self.u = None

    def forward(self, t, x):
        u = self.u(t) if self.u is not None else torch.zeros_like(x[..., :1])
        return self.net(torch.cat([x, u], -1))


def node_rollout(model, q0, p0, u, steps):
    from torchdiffeq import odeint
    model.u = u
    t = DT * torch.arange(steps + 1, dtype=q0.dtype)
    x = odeint(model, torch.cat([q0, p0], -1), t, method="rk4", options=dict(step_size=DT))
    return x[..., :1], x[..., 1:]


def train_arm(arm, task, data, steps, seed, batch=64):
    seed_everything(seed)
    qw, pw, cw, dqw, dpw = data
    model = NODE() if arm == "node" else PortHamiltonianNN(
        1, n_controls=1 if task == "controlled" else 0, damping="constant", width=64)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    gen = torch.Generator().manual_seed(seed)
    t0 = time.time()
    for _ in tqdm(range(steps), desc=f"{task}/{arm}/seed{seed}", leave=False, mininterval=2):
        idx = torch.randint(0, qw.shape[0], (batch,), generator=gen)
        q, p, u = qw[idx], pw[idx], control_fn(cw[idx])
        if arm == "ours_midpoint":
            loss = forced_residual_loss(model, q, p, dt=DT, control=u)
        elif arm == "ours_verlet":
            loss = forced_rollout_loss(model, q, p, dt=DT, control=u, method="verlet")
        elif arm == "dhnn_fd":
            loss = forced_derivative_loss(model, q, p, dqw[idx], dpw[idx], dt=DT, control=u)
        else:
            qs, ps = node_rollout(model, q[:, 0], p[:, 0], u, K)
            eq, ep = qs[1:] - q[:, 1:].transpose(0, 1), ps[1:] - p[:, 1:].transpose(0, 1)
            loss = 0.5 * ((eq * eq).mean() + (ep * ep).mean())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return model, time.time() - t0


@torch.no_grad()
def predict(arm, model, q0, p0, ctrl, steps):
    u = control_fn(ctrl)
    if arm == "node":
        return node_rollout(model, q0, p0, u, steps)
    model.control = u
    if arm == "ours_verlet":
        return tgi.rollout(model, q0, p0, h=DT, steps=steps, method="verlet")
    sub = 4 if arm == "dhnn_fd" else 1
    return tgi.rollout(model, q0, p0, h=DT / sub, steps=steps * sub, method="implicit_midpoint",
                       save_every=sub)


def mean_se(v):
    v = np.asarray(v, float)
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny run (smoke test)")
    ap.add_argument("--seeds", type=int, default=None, help="default 3 (--quick: 1)")
    ap.add_argument("--steps", type=int, default=None,
                    help="Adam steps per arm and seed; default 3000 (--quick: 3)")
    ap.add_argument("--verlet", action="store_true", help="also train the forced-Verlet rollout arm")
    ap.add_argument("--arms", default=None, help="comma-separated subset of the arms to run")
    ap.add_argument("--tasks", default="damped,controlled",
                    help=f"comma-separated subset of {', '.join(TASKS)}")
    ap.add_argument("--out", default="results")
    args = ap.parse_args(argv)
    n_train, n_test, steps, seeds, horizon = 32, 16, 3000, DEFAULT_SEEDS, T_TEST
    if args.quick:
        n_train, n_test, steps, seeds, horizon = 4, 2, 3, QUICK_SEEDS, 2.0
    steps = steps if args.steps is None else args.steps
    seeds = seeds if args.seeds is None else args.seeds
    if steps < 1:
        ap.error(f"--steps must be at least 1, got {steps}")
    if seeds < 1:
        ap.error(f"--seeds must be at least 1, got {seeds}")
    tasks = _names(ap, "--tasks", args.tasks, TASKS)
    arms = ["ours_midpoint"] + (["ours_verlet"] if args.verlet else []) + ["dhnn_fd", "node"]
    if args.arms:
        arms = _names(ap, "--arms", args.arms, ARMS)
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = dict(config=dict(c=C_TRUE, dt=DT, window_steps=K, train_horizon=T_TRAIN,
                              test_horizon=horizon, n_train=n_train, n_test=n_test, steps=steps,
                              seeds=seeds, batch=64, lr=3e-3), tasks={})
    for task in tasks:
        qtr, ptr, ctr = make_data(task, n_train, T_TRAIN, seed=1)
        qte, pte, cte = make_data(task, n_test, horizon, seed=2)
        dq, dp = finite_differences(qtr, ptr, DT)
        data = windows(qtr, ptr, ctr, dq, dp)
        n_steps = qte.shape[1] - 1
        E_true = energy(qte, pte)
        res = {arm: dict(state_mse=[], energy_err=[], damping=[], seconds=[]) for arm in arms}
        curves = {}
        for seed in range(seeds):
            for arm in arms:
                model, secs = train_arm(arm, task, data, steps, seed)
                qs, ps = predict(arm, model, qte[:, 0], pte[:, 0], cte, n_steps)
                qs, ps = qs.transpose(0, 1), ps.transpose(0, 1)          # (N, T, 1)
                mse = float(0.5 * (((qs - qte) ** 2).mean() + ((ps - pte) ** 2).mean()))
                E = energy(qs, ps)
                err = float((E - E_true).abs().mean())
                r = res[arm]
                r["state_mse"].append(mse)
                r["energy_err"].append(err)
                r["seconds"].append(secs)
                if arm != "node":
                    C = model._damping_fn(qte[:1, 0])[0]
                    M = model.system.mass_matrix(qte[:1, 0])[0]
                    r["damping"].append(float((C @ torch.linalg.inv(M))[0, 0].detach()))  # ṗ = −C M⁻¹p
                if seed == 0:
                    curves[arm] = dict(E=E.mean(0).tolist(), mse_t=(0.5 * ((qs - qte) ** 2 + (ps - pte) ** 2))
                                       .mean((0, 2)).tolist(), q0=qs[0, :, 0].tolist())
        summary = {}
        for arm in arms:
            r = res[arm]
            summary[arm] = {k: (mean_se(v) if v else None) for k, v in r.items()}
            summary[arm]["raw"] = r
        for ours in ("ours_midpoint", "ours_verlet"):
            if ours in arms and "dhnn_fd" in arms:
                ratio = [d / o for d, o in zip(res["dhnn_fd"]["state_mse"], res[ours]["state_mse"])]
                summary[f"ratio_dhnn_over_{ours}_state_mse"] = dict(
                    per_seed=ratio, of_means=summary["dhnn_fd"]["state_mse"][0] / summary[ours]["state_mse"][0])
        report["tasks"][task] = summary
        if not args.arms:
            _plot(out / f"{report_stem([task], steps, [], args.quick, seeds)}.png", task, curves,
                  E_true.mean(0), qte[0, :, 0], n_steps)
    stem = report_stem(tasks, steps, arms, args.quick, seeds)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1))
    (out / f"{stem}.md").write_text(_markdown(report, arms))
    print(_markdown(report, arms))
    return report


def report_stem(tasks, steps, arms, quick=False, seeds=None):
    """File stem of a run's report: the tasks, the budget and the arms, e.g.
    ``dissipative_damped_2000steps_ours_midpoint_dhnn_fd`` (``dissipative_quick_…`` for --quick);
    a seed count other than the default adds ``_<N>seeds`` after the budget, so runs that differ
    only in ``--seeds`` do not overwrite each other (and the default keeps the README's names)."""
    default = QUICK_SEEDS if quick else DEFAULT_SEEDS
    n = [] if seeds is None or seeds == default else [f"{seeds}seeds"]
    return "_".join(["dissipative", *(["quick"] if quick else []), *tasks, f"{steps}steps", *n, *arms])


def _names(ap, flag, value, known):
    """The comma-separated names of ``value``, each in ``known`` and none twice (else ap.error)."""
    names = [n.strip() for n in value.split(",")]
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error(f"{flag}: unknown name(s) {', '.join(map(repr, unknown))}; "
                 f"known: {', '.join(known)}")
    if len(set(names)) != len(names):
        ap.error(f"{flag}: a name is given twice in {value!r}")
    return [n for n in known if n in names]          # canonical order: one file name per set


def _mean_pm_se(v) -> str:
    """The report's cell of a (mean, s.e.) pair or None (:func:`experiments.cli.mean_pm_se`)."""
    return mean_pm_se(*v) if v else "—"


def _markdown(report, arms):
    lines = [f"# Damped / controlled pendulum (c = {C_TRUE}, dt = {DT}); mean ± s.e. over "
             f"{report['config']['seeds']} seeds, {report['config']['steps']} Adam steps each", ""]
    for task, s in report["tasks"].items():
        lines += [f"## {task}", "", "| arm | state MSE | energy-decay error | learned c | train s |",
                  "|---|---|---|---|---|"]
        for arm in arms:
            a = s[arm]
            f = _mean_pm_se
            lines.append(f"| {arm} | {f(a['state_mse'])} | {f(a['energy_err'])} | {f(a['damping'])} "
                         f"| {a['seconds'][0]:.0f} |")
        lines.append("")
        for ours in ("ours_midpoint", "ours_verlet"):
            r = s.get(f"ratio_dhnn_over_{ours}_state_mse")
            if r:
                lines += [f"state MSE ratio dhnn_fd / {ours}: {r['of_means']:.3g} (of the means); "
                          f"per seed {', '.join(f'{x:.3g}' for x in r['per_seed'])}", ""]
    return "\n".join(lines)


def _plot(path, task, curves, E_true, q_true, n_steps):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = DT * np.arange(n_steps + 1)
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    ax[0].plot(t, E_true.numpy(), "k", lw=2, label="truth")
    for arm, c in curves.items():
        ax[0].plot(t, c["E"], label=arm)
        ax[1].semilogy(t, np.maximum(c["mse_t"], 1e-16), label=arm)
        ax[2].plot(t, c["q0"], label=arm)
    ax[2].plot(t, q_true.numpy(), "k", lw=2, label="truth")
    ax[0].set(title=f"{task}: mean energy along held-out rollouts", xlabel="t")
    ax[1].set(title="state MSE vs t (held-out)", xlabel="t")
    ax[2].set(title="q(t), held-out trajectory 0", xlabel="t")
    for a in ax:
        a.axvline(T_TRAIN, color="gray", ls=":")
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
