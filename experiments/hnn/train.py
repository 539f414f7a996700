r"""The arms of the HNN study: what is trained, on what, and how it is rolled out afterwards.

(a)   ``a``    HNN (MLP H_θ(q, p)) by derivative matching (Greydanus et al. 2019), on the noisy
               states with the true derivatives at the clean states, as in their data.py.
(a′)  ``a_fd`` the same, with the derivatives estimated from the noisy states themselves
               (second-order finite differences along each trajectory): derivative matching
               with only the information the other arms get.
(b)   ``b1``, ``b5``, ``b10``   trained through k = 1, 5, 10 symplectic steps per window of the
               noisy trajectories (SRNN-style rollout loss): SeparableHNN + Verlet when the task
               is separable (all three are), HNN + implicit midpoint otherwise (``b_model="hnn"``
               forces the latter).  Rolled out with the same method and step.
(c)   ``c``    HNN with the discretization-map residual loss of eq. (20) for the midpoint map on
               consecutive noisy pairs (no solve in training); rolled out by implicit midpoint.
(c′)  ``c_ode`` the same model (same seed, same training), rolled out by dopri5 on its field as
               (a) is: it tells a bad H_θ from a midpoint map of H_θ that has no step at h = dt.
(d)   ``d``    unstructured Neural ODE (MLP vector field) trained through torchdiffeq's RK4 on
               windows of ``node_window`` steps; rolled out by the same RK4.
(e)   ``e``    the model of (b) fitted to *whole* noisy trajectories with estimated shooting-node
               states (:class:`torchgeo_int.nn.TrajectoryFit`: initial-state estimation, SRNN,
               + multiple shooting with a continuity penalty) through Verlet at h = dt; rolled
               out by Verlet at h = dt.  The states are learned by the optimizer, or solved by
               Gauss–Newton before each step (``gauss_newton``: variable projection), per task
               in ``run.SHOOTING``.
(e′)  ``e4``   the same through ``shooting["method2"]`` (yoshida4 at h = dt by default), rolled
               out by that method at the same step; segments per step ``batch_factor2`` × the
               batch where that is set (its step costs more than Verlet's), else as (e).
(g)   ``g``    (e) with the derivative targets of (a) as well (TrajectoryFit's ``derivatives``):
               derivative matching at the fit's estimated states instead of at the noisy
               observations, the states solved from the observed states *and* derivatives; the
               same data as (a), the same training and evaluation as (e).
(g″)  ``g_ode`` (g)'s model (the same training, reused) rolled out by dopri5 (rtol 1e-9), as (a)'s
               is: (g) learns from (a)'s targets of the true field as well as through Verlet.
(f)   ``f``, ``f_v``   (e)'s model (the same training, reused) corrected for Verlet's modified
               Hamiltonian (:class:`torchgeo_int.nn.CorrectedHamiltonian`, H_θ + h² H₂[H_θ]),
               rolled out by dopri5 (rtol 1e-9) and by Verlet at h = dt.

The HNN of (a) is rolled out by an accurate integrator of its learned field (torchdiffeq dopri5,
rtol 1e-9), as their analysis does with scipy.  Every arm uses the same MLP (2 × 200, tanh,
orthogonal init), Adam with the same lr / weight decay, and the same number of gradient steps
on batches of the same size (points for (a), windows for the others).  Training runs in
float32; evaluation in float64 on a copy of the trained model.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch
from torchdiffeq import odeint

from torchgeo_int import CotangentLiftIntegrator, MidpointMap
from torchgeo_int.solvers import ConvergenceError
from torchgeo_int.nn.losses import (derivative_loss, finite_differences, make_windows, residual_loss,
                                   rollout_loss)
from torchgeo_int.nn.metrics import energy_drift, energy_mse, hamiltonian_error, predict, state_mse
from torchgeo_int.nn.correction import CorrectedHamiltonian
from torchgeo_int.nn.modules import HNN, MLPVectorField, SeparableHNN
from torchgeo_int.nn.shooting import TrajectoryFit
from torchgeo_int.nn.training import fit, seed_everything

from .data import INVARIANT_FEATURES, Task


@dataclass(frozen=True)
class Arm:
    key: str
    label: str
    model: str          # HNN | SeparableHNN | MLPVectorField
    loss: str           # derivative | rollout | residual | node
    window: int         # steps per training window (0: points)
    method: str         # the integrator of training (and of evaluation, except for (a))
    evaluation: str
    train_method: str = ""      # when training and evaluation differ ((f)): the training one
    correction: bool = False    # evaluate the modified-Hamiltonian correction of the model
    reuse: str = ""             # key of the arm whose trained model (same seed) this one reuses
    substeps: int = 1           # integrator steps per data interval, training and evaluation
    derivatives: bool = False   # shooting arms: also match the derivative targets at the fit's states
    batch_factor: int | None = None     # shooting arms: segments per step = batch × this (None: the task's)


def arms(task: Task, *, b_model: str = "auto", node_window: int = 5, windows=(1, 5, 10),
         shooting: dict | None = None, full_batch: bool = False):
    """The study's arms on ``task``.  ``full_batch``: every step sees the whole data set, so the
    shooting arms' batch factors do not apply and (e′)'s label does not name its own."""
    sep = task.separable and b_model != "hnn"
    b_cls, b_method = ("SeparableHNN", "verlet") if sep else ("HNN", "implicit_midpoint")
    out = [Arm("a", "(a) HNN, derivative matching", "HNN", "derivative", 0, "dopri5",
               "dopri5 (rtol 1e-9) on the learned field"),
           Arm("a_fd", "(a′) HNN, derivative matching on finite differences", "HNN",
               "derivative_fd", 0, "dopri5", "dopri5 (rtol 1e-9) on the learned field")]
    if sep:     # (a)'s recipe on the rollout arms' model: separates training from architecture
        out.append(Arm("a_s", "(a_s) SeparableHNN, derivative matching", "SeparableHNN",
                       "derivative", 0, "dopri5", "dopri5 (rtol 1e-9) on the learned field"))
    for k in windows:
        out.append(Arm(f"b{k}", f"(b) {b_cls} through {k} {b_method} step{'s' * (k > 1)}", b_cls,
                       "rollout", k, b_method,
                       f"{b_method}{' (Newton)' * (b_method == 'implicit_midpoint')}, h = dt"))
    out.append(Arm("c", "(c) HNN, midpoint residual loss (eq. 20)", "HNN", "residual", 1,
                   "implicit_midpoint", "implicit_midpoint (Newton), h = dt"))
    out.append(Arm("c_ode", "(c′) HNN, midpoint residual loss, rolled out by dopri5", "HNN",
                   "residual", 1, "dopri5", "dopri5 (rtol 1e-9) on the learned field"))
    out.append(Arm("d", f"(d) Neural ODE through {node_window} RK4 steps", "MLPVectorField", "node",
                   node_window, "rk4", "rk4 (torchdiffeq), h = dt"))
    sh = dict(SHOOTING, **(shooting or {}))
    seg = sh["segment"]
    grid = "single shooting" if seg is None else f"shooting segments of {seg} steps"
    states = "Gauss–Newton-solved states" if sh["gauss_newton"] else "learned states"
    m2 = sh["method2"]
    sub2 = sh["substeps2"]
    bf2 = sh["batch_factor2"]
    bf2_label = ("" if full_batch or bf2 is None or bf2 == sh["batch_factor"]
                 else f", {bf2} × the batch")
    out.append(Arm("e", f"(e) {b_cls}, {states}, {grid}, {b_method}", b_cls, "shooting",
                   seg or 0, b_method, f"{b_method}, h = dt"))
    out.append(Arm("e4", f"(e′) {b_cls}, {states}, {grid}, {m2}"
                         f"{f' × {sub2} substeps' if sub2 > 1 else ''}{bf2_label}", b_cls, "shooting",
                   seg or 0, m2, f"{m2}, h = dt{f'/{sub2}' if sub2 > 1 else ''}", substeps=sub2,
                   batch_factor=bf2))
    out.append(Arm("g", "(g) (e) + derivative matching at its estimated states", b_cls, "shooting",
                   seg or 0, b_method, f"{b_method}, h = dt", derivatives=True))
    out.append(Arm("g_ode", "(g) rolled out by dopri5", b_cls, "shooting", seg or 0, "dopri5",
                   "dopri5 (rtol 1e-9) on the learned field", train_method=b_method,
                   derivatives=True, reuse="g"))
    out.append(Arm("f", f"(f) (e) + modified-H correction, rolled out by dopri5", b_cls, "shooting",
                   seg or 0, "dopri5", "dopri5 (rtol 1e-9) on the corrected field",
                   train_method=b_method, correction=True, reuse="e"))
    out.append(Arm("f_v", f"(f) (e) + modified-H correction, rolled out by {b_method}", b_cls,
                   "shooting", seg or 0, b_method, f"{b_method}, h = dt, on the corrected H",
                   train_method=b_method, correction=True, reuse="e"))
    return out


#: Defaults of the shooting arms (e), (e′), (f), (g); run.SHOOTING sets them per task.
#: ``batch_factor2``: (e′)'s own batch factor (None: ``batch_factor``), for a method whose step
#: costs more than Verlet's.
SHOOTING = dict(segment=None, continuity=1.0, state_lr=1e-3, method2="yoshida4", substeps2=1,
                gauss_newton=0, solve_every=1, batch_factor=1, batch_factor2=None,
                derivative_weight=1.0, derivative_points=None, derivative_warmup=0)


def batch_factor(arm: Arm, sh: dict) -> int:
    """Segments per training step of a shooting arm, per sample of the batch."""
    return sh["batch_factor"] if arm.batch_factor is None else arm.batch_factor


def state_lr(sh: dict):
    """The node states' learning rate, or None where they are solved (``gauss_newton`` > 0)."""
    return None if sh["gauss_newton"] else sh["state_lr"]


#: The study's networks: "mlp" (the HNN paper's MLPs of the state) and "invariant" (the same
#: MLPs of the task's invariants, data.INVARIANT_FEATURES: the two-body tasks' |q₁ − q₂|).
NETWORKS = ("mlp", "invariant")


def build_model(arm: Arm, task: Task, *, width: int = 200, depth: int = 2, network: str = "mlp"):
    cls = {"HNN": HNN, "SeparableHNN": SeparableHNN, "MLPVectorField": MLPVectorField}[arm.model]
    if network not in NETWORKS:
        raise ValueError(f"network must be one of {NETWORKS}, got {network!r}")
    opts = {}
    if network == "invariant":
        feats = INVARIANT_FEATURES.get(task.name)
        if feats is None:
            raise ValueError(f"network 'invariant': task {task.name!r} has no invariant features "
                             f"(tasks with them: {', '.join(INVARIANT_FEATURES)})")
        if arm.model not in feats:
            raise ValueError(f"network 'invariant': arm {arm.key} trains a {arm.model}, which takes "
                             f"no features (arms of {' and '.join(feats)} do)")
        opts = ({"features": feats["HNN"]} if arm.model == "HNN"
                else {"potential_features": feats["SeparableHNN"]})
    return cls(task.dim, width=width, depth=depth, activation="tanh", **opts)


def node_loss(model, q, p, *, dt, substeps=1):
    """Windows (N, k+1, n) through torchdiffeq's fixed-step RK4 (step dt/substeps)."""
    k = q.shape[1] - 1
    x = torch.cat([q, p], -1)
    t = dt * torch.arange(k + 1, dtype=q.dtype)
    xs = odeint(model, x[:, 0], t, method="rk4", options=dict(step_size=dt / substeps))
    e = xs[1:] - x[:, 1:].transpose(0, 1)
    return (e * e).mean()


def loss_and_data(arm: Arm, task: Task, *, substeps: int = 1):
    dt = task.dt
    if arm.loss == "shooting":
        raise ValueError("the shooting arms are built by shooting_fit (their states are parameters)")
    if arm.loss in ("derivative", "derivative_fd"):
        dq, dp = ((task.dq_train, task.dp_train) if arm.loss == "derivative"
                  else finite_differences(task.q_train, task.p_train, dt))
        pts = [x.reshape(-1, task.dim) for x in (task.q_train, task.p_train, dq, dp)]
        return derivative_loss, tuple(pts)
    data = make_windows(task.q_train, task.p_train, arm.window)
    if arm.loss == "rollout":
        return (lambda m, q, p: rollout_loss(m, q, p, dt=dt, method=arm.method, substeps=substeps)), data
    if arm.loss == "residual":
        return (lambda m, q, p: residual_loss(m, q, p, dt=dt)), data
    if arm.loss == "node":
        return (lambda m, q, p: node_loss(m, q, p, dt=dt, substeps=substeps)), data
    raise ValueError(arm.loss)


def shooting_fit(arm: Arm, model, task: Task, *, shooting: dict | None = None) -> TrajectoryFit:
    """The TrajectoryFit of arm (e) / (e′) on the training trajectories."""
    sh = dict(SHOOTING, **(shooting or {}))
    q, p, seg = task.q_train, task.p_train, sh["segment"]
    dq, dp = task.dq_train, task.dp_train
    if seg is not None:      # the grid must divide the data: drop the few last states if it does not
        keep = 1 + (q.shape[1] - 1) // seg * seg
        q, p, dq, dp = (x[:, :keep] for x in (q, p, dq, dp))
    return TrajectoryFit(model, q, p, dt=task.dt, segment=seg,
                         derivatives=(dq, dp) if arm.derivatives else None,
                         derivative_weight=sh["derivative_weight"] if arm.derivatives else 1.0,
                         derivative_points=sh["derivative_points"] if arm.derivatives else None,
                         derivative_warmup=sh["derivative_warmup"] if arm.derivatives else 0,
                         method=arm.train_method or arm.method, substeps=arm.substeps,
                         continuity=sh["continuity"], gauss_newton=sh["gauss_newton"],
                         solve_every=sh["solve_every"] if sh["gauss_newton"] else 1)


def train(arm: Arm, task: Task, *, seed: int, steps: int, batch_size: int | None, lr: float,
          weight_decay: float, substeps: int = 1, width: int = 200, depth: int = 2,
          progress: bool = True, max_time: float | None = None, dtype=torch.float32,
          shooting: dict | None = None, lr_schedule=None, model=None, network: str = "mlp"):
    """Seeded model + fit; returns (model, fit history).  ``model``: train this module in place of
    the arm's network (the parametric probe, :mod:`experiments.hnn.parametric`).  The shooting arms fit a
    TrajectoryFit (model + node states, the states with their own lr and no weight decay) on
    batches of ``batch_size × batch_factor`` segments; the model is returned alone.
    ``lr_schedule``: fit's (None: constant lr; "cosine"), the same for every arm; ``network``:
    :func:`build_model`'s."""
    seed_everything(seed)
    model = (build_model(arm, task, width=width, depth=depth, network=network)
             if model is None else model).to(dtype)
    desc = f"{task.name}, {arm.label}, seed {seed}"
    if arm.loss == "shooting":
        sh = dict(SHOOTING, **(shooting or {}))
        tf = shooting_fit(arm, model, task.to(dtype), shooting=shooting)
        opt = tf.optimizer(lr=lr, state_lr=state_lr(sh), weight_decay=weight_decay)
        bs = None if batch_size is None else batch_size * batch_factor(arm, sh)
        hist = fit(tf, TrajectoryFit.loss, tf.segments, steps=steps, batch_size=bs,
                   optimizer=opt, seed=seed, progress=progress, desc=desc, max_time=max_time,
                   lr_schedule=lr_schedule)
        return model, hist
    loss_fn, data = loss_and_data(arm, task.to(dtype), substeps=substeps)
    hist = fit(model, loss_fn, data, steps=steps, batch_size=batch_size, lr=lr,
               weight_decay=weight_decay, seed=seed, progress=progress,
               desc=desc, max_time=max_time, lr_schedule=lr_schedule)
    return model, hist


#: dopri5's tolerance when an arm is rolled out "accurately" ((a), (c′), (f)): rtol, atol = rtol/10
EVAL_RTOL = 1e-9


def evaluation_model(model, arm: Arm, task: Task):
    """The float64 model an arm is evaluated with: a copy of the trained one, or (``correction``)
    its modified-Hamiltonian correction for the training method at h = dt."""
    model = copy.deepcopy(model).double().eval()
    if arm.correction:
        model = CorrectedHamiltonian(model, arm.train_method, task.dt / arm.substeps)
    return model


def rollout_model(model, arm: Arm, task: Task, *, substeps: int = 1):
    """(q, p) of shape (B, S+1, n) from the clean test initial states over the horizon, float64."""
    model = evaluation_model(model, arm, task)
    substeps = max(substeps, arm.substeps)
    q0, p0 = task.q_eval[:, 0], task.p_eval[:, 0]
    S = task.q_eval.shape[1] - 1
    n = task.dim
    if arm.method in ("dopri5", "rk4"):
        if arm.model == "MLPVectorField":
            f = model
        else:
            def f(t, x):
                dq, dp = model.vector_field(x[..., :n], x[..., n:], t)
                return torch.cat([dq, dp], -1)
        t = task.dt * torch.arange(S + 1, dtype=torch.float64)
        opts = (dict(rtol=EVAL_RTOL, atol=EVAL_RTOL * 0.1) if arm.method == "dopri5"
                else dict(options=dict(step_size=task.dt / substeps)))
        with torch.no_grad():
            xs = odeint(f, torch.cat([q0, p0], -1), t, method=arm.method, **opts)
        xs = xs.transpose(0, 1)
        return xs[..., :n], xs[..., n:]
    return predict(model, q0, p0, h=task.dt / substeps, steps=S * substeps,
                   method=evaluation_method(arm.method), save_every=substeps)


def truth_floor(task: Task, *, method: str = "verlet", substeps: int = 1) -> dict:
    """Energy and state MSE of the *true* H rolled out as the trajectory arms are (``method`` at
    h = dt / substeps) from the held-out initial states: what that evaluation costs a perfect
    model (the true H; an arm trained through the method can do better, by learning its modified
    Hamiltonian)."""
    H = task.energy
    q0, p0 = task.q_eval[:, 0], task.p_eval[:, 0]
    S = task.q_eval.shape[1] - 1
    q, p = predict(H, q0, p0, h=task.dt / substeps, steps=S * substeps,
                   method=method, save_every=substeps)
    return {"energy_mse": float(energy_mse(H, q, p, task.q_eval, task.p_eval)),
            "state_mse": float(state_mse(q, p, task.q_eval, task.p_eval))}


EVAL_NEWTON_ITERS = 500


def evaluation_method(method: str):
    """The integrator of an arm's evaluation: its training method, with the implicit midpoint
    solves by Newton.  A learned field can be much stiffer than the data's (the (c) arm's spring
    model had |∂X_H/∂x| ≈ 40 at data points, h|J|/2 ≈ 2), where the fixed-point iteration of
    the same midpoint map stops contracting; Newton solves the same equations.  It gets
    ``EVAL_NEWTON_ITERS`` iterations, not the default 50: on the pendulum, (c) seed 0 learned
    h|∂X_H|/2 ≈ 3.3 at the initial states (the true field: 0.1), where the first step needs ~400;
    its 5th step then stalls at residual 2e-2 even after 1000 — no midpoint step of that field
    near there, a failed rollout, which the report counts as such."""
    if method == "implicit_midpoint":
        return CotangentLiftIntegrator(MidpointMap(), solver="newton", max_iter=EVAL_NEWTON_ITERS,
                                       name="implicit_midpoint")
    return method


def failed_metrics(why: str) -> dict:
    """A failed seed's row: inf trajectory metrics (counted under "failed", not averaged)."""
    inf = float("inf")
    return {"state_mse": inf, "energy_mse": inf, "energy_drift": inf, "failed": why}


def evaluate(model, arm: Arm, task: Task, *, substeps: int = 1):
    """Metrics on the held-out initial conditions (a rollout that blows up or an implicit step
    that fails to converge is recorded as inf with the reason, not raised)."""
    t0 = time.perf_counter()
    H = task.energy
    failed = None
    try:
        q, p = rollout_model(model, arm, task, substeps=substeps)
    except (FloatingPointError, ConvergenceError, AssertionError) as err:
        failed = f"{type(err).__name__}: {err}"
    else:
        if not bool(torch.isfinite(q).all() and torch.isfinite(p).all()):   # (dopri5/rk4: no check)
            failed = "the rollout reached NaN/inf without raising"
    if failed is not None:
        out, traj = failed_metrics(failed), None
    else:
        traj = (q, p)
        out = {
            "state_mse": float(state_mse(q, p, task.q_eval, task.p_eval)),
            "energy_mse": float(energy_mse(H, q, p, task.q_eval, task.p_eval)),
            "energy_drift": float(energy_drift(H, q, p)),
        }
    if arm.model != "MLPVectorField":      # a property of H_θ: measured whether or not it rolled out
        m64 = evaluation_model(model, arm, task)
        out["eps_H"] = float(hamiltonian_error(m64, H, task.q_points, task.p_points))
        out["eps_H_rel"] = float(hamiltonian_error(m64, H, task.q_points, task.p_points, relative=True))
    out["eval_seconds"] = time.perf_counter() - t0
    return out, traj
