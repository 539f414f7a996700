r"""The three tasks of Greydanus, Dzamba & Yosinski, "Hamiltonian Neural Networks" (NeurIPS 2019),
re-implemented from their data scripts (greydanus/hamiltonian-nn: experiment-spring/data.py,
experiment-pend/data.py, and the two-body orbits of experiment-2body / experiment-orbits data.py):

* spring    H = q² + p²;  50 trajectories, 30 points on [0, 3] (t = linspace(0, 3, 30)),
            initial state a random direction scaled to radius U(0.1, 1), noise σ = 0.1 on q and p;
            the first 25 trajectories train, the last 25 test (their 50 % split by points).
* pendulum  H = 3(1 − cos q) + p²;  50 trajectories, 45 points on [0, 3], radius U(1.3, 2.3),
            σ = 0.1; 25 / 25.
* twobody   G = m = 1, two bodies on near-circular orbits: positions ±pos, pos ~ U(0.5, 1.5)²,
            circular-orbit velocity scaled by (1 + 0.05·N(0, 1)); 1000 trajectories × 50 points
            on [0, 20]; no noise; the first 20 % of the trajectories test, the rest train.
            Coordinates here: q = (x₁, y₁, x₂, y₂), p = (p_x1, p_y1, p_x2, p_y2) (m = 1: p = v).
* twobody_noisy  the same orbits with noise σ = 0.1 on every observed coordinate (as the spring
            and pendulum tasks; drawn after the orbits, so the clean orbits are the same), the
            derivative targets still the true field at the clean states; evaluated on the clean
            test orbits.

The random draws follow their order (NumPy's legacy global generator, per trajectory: direction,
radius, then the noise of q and of p), with ``seed`` in place of their seed 0.  Their derivative
targets are the true field at the *clean* states, while the states themselves are noisy: kept.
The ground truth is integrated by SciPy's DOP853 at rtol = atol = 1e-11 (spring: closed form).

Evaluation (the HNN paper's analysis notebooks roll the models out over t ∈ [0, 20]): the clean
initial states of the test trajectories, truth at t_k = k·dt, k = 0..⌈20/dt⌉.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from scipy.integrate import solve_ivp

from torchgeo_int.nn import PairDistances

HORIZON = 20.0
#: Energy MSE of the derivative-matching HNN in Greydanus et al. 2019, Table 1 (mean over their
#: test rollouts); we report our own ratios measured in the same run, not these.
PAPER_ENERGY_MSE = {"spring": 3.84e-4, "pendulum": 2.49e-2, "twobody": 3.88e-5, "twobody_noisy": None}


@dataclass
class Task:
    name: str
    dim: int
    dt: float
    separable: bool
    # observations, (B, T, n) each; derivatives are the true field at the clean states
    q_train: torch.Tensor
    p_train: torch.Tensor
    dq_train: torch.Tensor
    dp_train: torch.Tensor
    q_test: torch.Tensor
    p_test: torch.Tensor
    # evaluation: truth from the clean test initial states over the horizon, (B_eval, S + 1, n)
    q_eval: torch.Tensor
    p_eval: torch.Tensor
    # clean test states for ε_H, (N, n)
    q_points: torch.Tensor
    p_points: torch.Tensor
    energy: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(repr=False)
    meta: dict = field(default_factory=dict)

    def to(self, dtype) -> "Task":
        out = {k: (v.to(dtype) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return Task(**out)


def _t(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x), dtype=torch.float64)


def _solve(f, y0, t_eval):
    sol = solve_ivp(f, (float(t_eval[0]), float(t_eval[-1])), y0, t_eval=t_eval, method="DOP853",
                    rtol=1e-11, atol=1e-11)
    if not sol.success:
        raise RuntimeError(f"reference integration failed: {sol.message}")
    return sol.y.T


def _eval_times(dt):
    steps = math.ceil(HORIZON / dt - 1e-9)
    return dt * np.arange(steps + 1)


def _solve_many(field_fn, y0s, t_eval, exact=None):
    """Trajectories (B, T, 2) from initial states (B, 2): one stacked system (the samples are
    independent, so this is B solves at the tolerance of the hardest one)."""
    y0s = np.asarray(y0s)
    if exact is not None:
        return np.stack([exact(y0, t_eval) for y0 in y0s])
    y = _solve(lambda t, y: field_fn(y.reshape(-1, 2)).reshape(-1), y0s.reshape(-1), t_eval)
    return y.reshape(len(t_eval), -1, 2).transpose(1, 0, 2)


def _one_dof_task(name, seed, *, T, radius, field_fn, energy, separable=True, samples=50,
                  noise=0.1, exact=None):
    """Their get_dataset/get_trajectory for a one-degree-of-freedom H (spring, pendulum)."""
    rs = np.random.RandomState(seed)
    t_eval = np.linspace(0.0, 3.0, T)
    dt = float(t_eval[1] - t_eval[0])
    y0s, noises = [], []
    for _ in range(samples):          # their draw order: direction, radius, noise of q, of p
        y0 = rs.rand(2) * 2 - 1
        r = radius(rs)
        y0s.append(y0 / np.sqrt((y0 ** 2).sum()) * r)
        noises.append(np.stack([rs.randn(T) * noise, rs.randn(T) * noise], -1))
    clean = _solve_many(field_fn, y0s, t_eval, exact)                      # (B, T, 2)
    noisy = clean + np.stack(noises)
    derivs = field_fn(clean)
    half = samples // 2
    te = _eval_times(dt)
    truth = _solve_many(field_fn, y0s[half:], te, exact)
    s = lambda a: (_t(a[..., :1]), _t(a[..., 1:]))                                    # noqa: E731
    (qtr, ptr), (dqtr, dptr) = s(noisy[:half]), s(derivs[:half])
    (qte, pte), (qev, pev), (qpt, ppt) = s(noisy[half:]), s(truth), s(clean[half:].reshape(-1, 2))
    return Task(name, 1, dt, separable, qtr, ptr, dqtr, dptr, qte, pte, qev, pev, qpt, ppt, energy,
                meta=dict(seed=seed, trajectories=samples, points=T, t_span=[0.0, 3.0], noise=noise,
                          horizon=float(te[-1]), eval_steps=len(te) - 1))


def spring(seed: int = 0, noise: float = 0.1) -> Task:
    """H = q² + p²: q̇ = 2p, ṗ = −2q, a rotation at angular speed 2 (closed form); ``noise``:
    the σ of the observations (0: clean)."""
    def exact(y0, t):
        c, s = np.cos(2 * t), np.sin(2 * t)
        return np.stack([y0[0] * c + y0[1] * s, -y0[0] * s + y0[1] * c], -1)

    return _one_dof_task("spring", seed, T=30, radius=lambda rs: rs.rand() * 0.9 + 0.1,
                         field_fn=lambda y: np.stack([2 * y[..., 1], -2 * y[..., 0]], -1),
                         energy=lambda q, p: (q * q + p * p).sum(-1), exact=exact, noise=noise)


def pendulum(seed: int = 0) -> Task:
    """H = 3(1 − cos q) + p²: q̇ = 2p, ṗ = −3 sin q."""
    return _one_dof_task("pendulum", seed, T=45, radius=lambda rs: rs.rand() + 1.3,
                         field_fn=lambda y: np.stack([2 * y[..., 1], -3 * np.sin(y[..., 0])], -1),
                         energy=lambda q, p: (3 * (1 - torch.cos(q)) + p * p).sum(-1))


def twobody_energy(q, p):
    """H = ½|p|² − 1/|q₁ − q₂| (G = m = 1)."""
    r = (q[..., :2] - q[..., 2:]).norm(dim=-1)
    return 0.5 * (p * p).sum(-1) - 1.0 / r


_PAIR = PairDistances(2, 2)


def twobody_distance(q):
    """|q₁ − q₂|, shape (..., 1) (``tgi.nn.PairDistances(2, 2)``): the invariant of translations
    and rotations of the plane that the two-body potential is a function of (the "invariant"
    network's V_θ = MLP(|q₁ − q₂|))."""
    return _PAIR(q)


def twobody_state_features(x):
    """(|q₁ − q₂|, p) of x = cat[q, p], shape (..., 5): the "invariant" network's HNN input."""
    return torch.cat([twobody_distance(x[..., :4]), x[..., 4:]], -1)


def _twobody_field(y):
    """y: (..., 8) = (q, p); vectorised over any number of systems."""
    q, p = y[..., :4], y[..., 4:]
    d = q[..., :2] - q[..., 2:]
    r3 = (d * d).sum(-1, keepdims=True) ** 1.5
    a1 = -d / r3
    return np.concatenate([p, a1, -a1], -1)


def twobody(seed: int = 0, trajectories: int = 1000, T: int = 50, noise: float = 0.0) -> Task:
    """Near-circular two-body orbits (their random_config, orbit_noise 5e-2, radii [0.5, 1.5]);
    ``noise`` > 0: Gaussian noise of that σ on the observed (training and test) states, drawn
    after the orbits; the evaluation truth and the ε_H points stay clean."""
    rs = np.random.RandomState(seed)
    y0 = np.zeros((trajectories, 8))
    for i in range(trajectories):
        pos = rs.rand(2) * (1.5 - 0.5) + 0.5
        r = np.sqrt((pos ** 2).sum())
        vel = np.flipud(pos) / (2 * r ** 1.5)
        vel[0] *= -1
        vel *= 1 + 5e-2 * rs.randn()
        y0[i] = np.concatenate([pos, -pos, vel, -vel])
    t_eval = np.linspace(0.0, 20.0, T)
    # one stacked system: the step size is set by the fastest orbit, fine for all
    sol = solve_ivp(lambda t, y: _twobody_field(y.reshape(-1, 8)).reshape(-1), (0.0, 20.0),
                    y0.reshape(-1), t_eval=t_eval, method="DOP853", rtol=1e-11, atol=1e-11)
    if not sol.success:
        raise RuntimeError(f"reference integration failed: {sol.message}")
    y = sol.y.T.reshape(T, trajectories, 8).transpose(1, 0, 2)              # (B, T, 8)
    d = _twobody_field(y)
    obs = y + noise * rs.randn(*y.shape) if noise > 0 else y
    n_test = int(trajectories * 0.2)
    te, tr = slice(0, n_test), slice(n_test, None)
    q, p, dq, dp = _t(y[..., :4]), _t(y[..., 4:]), _t(d[..., :4]), _t(d[..., 4:])
    qo, po = _t(obs[..., :4]), _t(obs[..., 4:])
    dt = float(t_eval[1] - t_eval[0])
    # the horizon is their data span, so the clean test trajectories are the evaluation truth
    return Task("twobody_noisy" if noise > 0 else "twobody", 4, dt, True, qo[tr], po[tr], dq[tr],
                dp[tr], qo[te], po[te], q[te], p[te],
                q[te].reshape(-1, 4), p[te].reshape(-1, 4), twobody_energy,
                meta=dict(seed=seed, trajectories=trajectories, points=T, t_span=[0.0, 20.0],
                          noise=float(noise), horizon=20.0, eval_steps=T - 1))


def twobody_noisy(seed: int = 0, trajectories: int = 1000, T: int = 50) -> Task:
    """:func:`twobody` with σ = 0.1 observation noise."""
    return twobody(seed, trajectories, T, noise=0.1)


#: ``--network invariant`` (experiments.hnn.run): each task's features, for every arm's network
#: (HNN: of cat[q, p]; SeparableHNN: of q, for V_θ; T_θ stays an MLP of p).  The tasks of one
#: degree of freedom have no symmetry to build in.
INVARIANT_FEATURES = {name: dict(HNN=twobody_state_features, SeparableHNN=twobody_distance)
                      for name in ("twobody", "twobody_noisy")}

TASKS = {"spring": spring, "pendulum": pendulum, "twobody": twobody, "twobody_noisy": twobody_noisy}
