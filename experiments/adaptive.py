"""Adaptive geometric stepping at equal force evaluations: a hierarchical triple (an e = 0.9
inner binary with a distant third body, 10³ inner periods: a pericentre passage every period),
Kepler at e = 0.9 and 0.99 over 10³ periods, and the Pythagorean three-body problem (Burrau).

Configurations, each given the same budget of force evaluations (∇V, counted by a wrapper; for
dopri5 the evaluations of the whole field, whose cost is one ∇V each):

* ``logh_dkd``: the logarithmic Hamiltonian (Mikkola–Tanikawa / Preto–Tremaine) with the
  drift–kick–drift leapfrog, physical time as a coordinate (``tgi.time_transformed_rollout``);
  one ∇V per step; ``logh_dkd_y4``: the same with the order-4 triple jump (3 ∇V per step);
* ``reversible_dkd``: time-reversible variable steps (Hairer–Söderlind control,
  σ = r^{3/2}, resp. the inverse free-fall frequency for three bodies) with the DKD leapfrog
  (``tgi.rollout(..., step_control=σ)``); ε calibrated on a short run so that the budget covers
  the time;
* fixed-step ``verlet`` (1 ∇V per step, FSAL) and ``yoshida4`` (3 per step);
* ``dopri5`` (torchdiffeq, adaptive, error-controlled) at rtol = atol chosen so that it spends
  the budget: triple — bisected on the first 10 inner periods, then one run over the whole
  interval stopped where the budget is spent; Kepler — the tightest of 1e-4 … 1e-8 that reaches
  T within the budget; Pythagorean — bisected on the whole (short) interval.

Reported per configuration: max |ΔE/E₀| over the run; its growth, the ratio of the max over the
last tenth to the max over the first tenth of the time reached (≈ 1: bounded; ≫ 1: drift); the
slope of a least-squares line through |ΔE/E₀|(t) and slope·t/max (≈ 1: the error is a linear
trend; ≈ 0: no trend); the evaluations used and the time reached; and per study the issue's goal
(best geometric configuration against the others).
Writes results/adaptive/{energy.png, table.md, table.json} and study_<name>.{json,npz}.
``python -m experiments.adaptive`` runs the triple (its four default configurations: 6.6 min of
CPU time, 8.6 min of wall time on a shared core);
``--studies kepler 3body`` the others (~20 min each), whose saved studies are redrawn otherwise.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

import numpy as np
import torch
from tqdm import tqdm

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torchgeo_int as tgi  # noqa: E402
from experiments.cli import number  # noqa: E402
from experiments.problems import kepler_initial  # noqa: E402

OUT = ROOT / "results" / "adaptive"


class OverBudget(FloatingPointError):
    pass


# -- problems with counted force evaluations ----------------------------------------------------------
class Counted:
    """A SeparableHamiltonian whose ∇V calls are counted (per sample: a call on a batch of b
    samples is one evaluation for each)."""

    def __init__(self, kinetic, potential, kinetic_grad, potential_grad, energy):
        self.calls = 0

        def counted(q):
            self.calls += 1
            return potential_grad(q)
        self.system = tgi.SeparableHamiltonian(kinetic, potential, kinetic_grad=kinetic_grad,
                                               potential_grad=counted)
        self.potential_grad, self.energy = potential_grad, energy

    def field(self, limit=None):
        """dy/dt of y = cat(q, p) for torchdiffeq, counted the same way; past ``limit``
        evaluations it raises :class:`OverBudget` (a loose tolerance can let the orbit plunge
        into the singularity, where an error-controlled step shrinks without end)."""
        def f(t, y):
            self.calls += 1
            if limit is not None and self.calls > limit:
                raise OverBudget(f"dopri5 exceeded {limit} evaluations")
            k = y.shape[-1] // 2
            q, p = y[..., :k], y[..., k:]
            return torch.cat([self.system.kinetic_grad(p), -self.potential_grad(q)], -1)
        return f


def kepler():
    return Counted(lambda p: 0.5 * (p * p).sum(-1), lambda q: -1.0 / q.norm(dim=-1), lambda p: p,
                   lambda q: q / q.norm(dim=-1, keepdim=True) ** 3,
                   lambda q, p: 0.5 * (p * p).sum(-1) - 1.0 / q.norm(dim=-1))


MASSES = torch.tensor([3.0, 4.0, 5.0], dtype=torch.float64)   # Burrau's Pythagorean problem


def _pairs(q, i, j):
    """Positions (.., N, 2), pair differences x_i − x_j and distances of the pairs (i, j)."""
    x = q.reshape(*q.shape[:-1], -1, 2)
    d = x[..., i, :] - x[..., j, :]
    return x, d, d.norm(dim=-1)


def n_body(masses=MASSES):
    """Planar gravitational N-body problem, G = 1, q and p flattened to 2N numbers
    (p_i = m_i v_i)."""
    m = torch.as_tensor(masses, dtype=torch.float64)
    n = len(m)
    i, j = torch.triu_indices(n, n, 1)
    mm = m[i] * m[j]
    mrep = m.repeat_interleave(2)

    def potential(q):
        return -(mm / _pairs(q, i, j)[2]).sum(-1)

    def potential_grad(q):
        x, d, r = _pairs(q, i, j)
        w = (mm / r ** 3)[..., None] * d                     # ∂V/∂x_i of pair (i, j): +w, x_j: −w
        g = torch.zeros_like(x)
        g = g.index_add(-2, i, w).index_add(-2, j, -w)
        return g.reshape(q.shape)

    def kinetic(p):
        return (p * p / (2 * mrep)).sum(-1)

    return Counted(kinetic, potential, lambda p: p / mrep, potential_grad,
                   lambda q, p: kinetic(p) + potential(q))


def three_body():
    """Burrau's Pythagorean problem: masses 3, 4, 5 (:func:`three_body_initial`)."""
    return n_body(MASSES)


def three_body_initial():
    """At rest at (1, 3), (−2, −1), (1, −1)."""
    q0 = torch.tensor([1.0, 3.0, -2.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    return q0, torch.zeros(6, dtype=torch.float64)


def free_fall_control(masses):
    """σ = S^{−1/2}, S = Σ_pairs (m_i + m_j)/r_ij³: the inverse free-fall frequency as the
    step-size density (σ = r^{3/2}/√M for one pair, the Kepler control), with ∇ log σ =
    −∇S/(2S) in closed form (∂r_ij^{−3}/∂x_i = −3 r_ij^{−5} (x_i − x_j))."""
    m = torch.as_tensor(masses, dtype=torch.float64)
    n = len(m)
    i, j = torch.triu_indices(n, n, 1)
    msum = m[i] + m[j]

    def sigma(q):
        return (msum / _pairs(q, i, j)[2] ** 3).sum(-1) ** -0.5

    def grad_log_sigma(q):
        x, d, r = _pairs(q, i, j)
        S = (msum / r ** 3).sum(-1)
        w = (-3 * msum / r ** 5)[..., None] * d
        gS = torch.zeros_like(x).index_add(-2, i, w).index_add(-2, j, -w).reshape(q.shape)
        return -0.5 * gS / S[..., None]
    return tgi.StepControl(sigma, grad_log_sigma=grad_log_sigma)


three_body_sigma = free_fall_control(MASSES).sigma

#: The hierarchical triple: an inner binary of masses 0.5 + 0.5 (a = 1, period 2π) at e = 0.9
#: and a third body of mass 0.5 on a circular outer orbit of radius 8 about the binary's centre
#: of mass (period ≈ 2π·8^{3/2}/√1.5 ≈ 116: 18 inner periods).  Coplanar, prograde.
TRIPLE_MASSES = torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64)


def triple_initial(e_in=0.9, a_out=8.0, masses=TRIPLE_MASSES):
    """The inner binary at apocentre (separation a(1 + e) along x, relative speed
    √(M(1 − e)/(a(1 + e)))) and the third body on the circular orbit of the two-body problem
    (binary mass, m₃) at radius a_out along y; everything in the centre-of-mass frame."""
    m1, m2, m3 = (float(x) for x in masses)
    M_in = m1 + m2
    r = 1.0 + e_in
    v = math.sqrt(M_in * (1.0 - e_in) / r)
    x1, x2 = -m2 / M_in * r, m1 / M_in * r
    v1, v2 = -m2 / M_in * v, m1 / M_in * v                   # along y
    V = math.sqrt((M_in + m3) / a_out)                         # relative circular speed (outer)
    Mt = M_in + m3
    # binary c.o.m. at −m3/Mt·a_out ŷ moving +m3/Mt·V x̂ ... (prograde: counter-clockwise)
    Yb, Y3 = -m3 / Mt * a_out, M_in / Mt * a_out
    Vb, V3 = m3 / Mt * V, -M_in / Mt * V
    pos = torch.tensor([[x1, Yb], [x2, Yb], [0.0, Y3]], dtype=torch.float64)
    vel = torch.tensor([[Vb, v1], [Vb, v2], [V3, 0.0]], dtype=torch.float64)
    m = torch.as_tensor(masses, dtype=torch.float64)[:, None]
    return pos.reshape(-1), (m * vel).reshape(-1)


# -- the runs -----------------------------------------------------------------------------------------
def stats(t, dE, E0):
    """max |ΔE/E₀|; its growth (max over the last tenth / max over the first tenth of the time
    reached); the slope of the least-squares line through |ΔE/E₀|(t) (per unit time) and the
    trend it makes over the run relative to the max, slope·(t_end − t_0)/max: ≈ 1 for a linear
    drift (the error is the trend), ≈ 0 for a bounded error (no trend)."""
    rel = np.abs(dE / abs(E0))
    t0, T = t[0], t[-1]
    first = rel[t <= t0 + 0.1 * (T - t0)].max()
    last = rel[t >= t0 + 0.9 * (T - t0)].max()
    fin = np.isfinite(rel)
    slope = float(np.polyfit(t[fin], rel[fin], 1)[0]) if fin.sum() > 2 else float("nan")
    mx = float(rel.max())
    return mx, float(last / max(first, 1e-300)), slope, slope * float(T - t0) / max(mx, 1e-300)


def run_logh(prob, q0, p0, eps, steps, method):
    prob.calls = 0
    with torch.no_grad():
        tr = tgi.time_transformed_rollout(prob.system, q0, p0, eps=eps, steps=steps, method=method)
    return tr.t, tr.q, tr.p


def run_reversible(prob, q0, p0, eps, steps, control):
    prob.calls = 0
    with torch.no_grad():
        tr = tgi.rollout(prob.system, q0, p0, h=eps, steps=steps, step_control=control,
                         method="leapfrog_dkd")
    return tr.t, tr.q, tr.p


def run_fixed(prob, q0, p0, h, steps, method):
    prob.calls = 0
    with torch.no_grad():
        q, p = tgi.rollout(prob.system, q0, p0, h=h, steps=steps, method=method)
    t = h * torch.arange(steps + 1, dtype=q.dtype)
    return t.reshape(-1, *([1] * (q.dim() - 2))).expand(q.shape[:-1]), q, p


def run_dopri5(prob, q0, p0, T, tol, n_out, limit=None):
    prob.calls = 0
    t = torch.linspace(0.0, T, n_out, dtype=q0.dtype)
    y0 = torch.cat([q0, p0], -1)
    with torch.no_grad():
        y = tgi.odeint(prob.field(limit), y0, t, method="dopri5", rtol=tol, atol=tol)
    k = q0.shape[-1]
    return t, y[..., :k], y[..., k:]


def run_dopri5_budget(prob, q0, p0, T, tol, n_out, budget, chunks=100):
    """dopri5 at ``tol`` over [0, T] in ``chunks`` consecutive calls (each restart costs its
    initial-step evaluations, counted) until ``budget`` evaluations are spent: what it reaches
    with the budget (at a loose tolerance the Kepler orbit decays and each period costs more)."""
    edges = torch.linspace(0.0, T, chunks + 1, dtype=q0.dtype)
    per = max(2, n_out // chunks)
    ts, qs, ps = [edges[:1]], [q0[None]], [p0[None]]
    y0, used, k = torch.cat([q0, p0], -1), 0, q0.shape[-1]
    for a, b in zip(edges[:-1], edges[1:]):
        if used >= budget:
            break
        prob.calls = 0
        t = torch.linspace(float(a), float(b), per, dtype=q0.dtype)
        try:
            with torch.no_grad():
                y = tgi.odeint(prob.field(3 * budget), y0, t, method="dopri5", rtol=tol, atol=tol)
        except (FloatingPointError, AssertionError):   # over budget; torchdiffeq's "underflow in dt"
            used += prob.calls
            break
        used += prob.calls
        ts.append(t[1:]), qs.append(y[1:, :k]), ps.append(y[1:, k:])
        y0 = y[-1]
    prob.calls = used
    return torch.cat(ts), torch.cat(qs), torch.cat(ps)


def dopri5_tolerance(prob, q0, p0, T_cal, target, lo=-14.0, hi=-1.0, iters=9):
    """rtol = atol whose evaluations over [0, T_cal] are closest to ``target`` (bisection in log)."""
    best = None
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        try:
            # past 3× the target the tolerance is too tight: stop there, the count is not needed
            run_dopri5(prob, q0, p0, T_cal, 10 ** mid, 2, limit=int(3 * target))
            n = prob.calls
        except OverBudget:
            n = float("inf")
        except Exception:   # an underflowing step at a loose tolerance: tighten
            n = 0
        if best is None or abs(math.log(max(n, 1) / target)) < abs(math.log(max(best[1], 1) / target)):
            best = (mid, n)
        if n > target:
            lo = mid
        else:
            hi = mid
    return 10 ** best[0]


def reversible_eps(prob, q0, p0, control, T_cal, target_steps, eps_cal, rtol=0.01, rounds=12):
    """(ε, steps) for which adaptive_rollout needs ``target_steps`` steps over [0, T_cal], to
    ``rtol``: secant steps on log(steps) against log ε (steps ∝ 1/ε only asymptotically; two
    rounds of that rule left e = 0.99 Kepler at 1335 steps for a target of 500).  Returns the
    last ε run and its count, so the caller can report how close the calibration came."""
    def steps(eps):
        with torch.no_grad():
            return tgi.adaptive_rollout(prob.system, q0, p0, eps=eps, until=T_cal, control=control,
                                        method="leapfrog_dkd", check_every=1).steps

    x0, n0 = math.log(eps_cal), steps(eps_cal)
    best = (x0, n0)
    x1 = x0 + math.log(n0 / target_steps)             # the 1/ε rule's first guess
    for _ in range(rounds):
        n1 = steps(math.exp(x1))
        if abs(math.log(n1 / target_steps)) < abs(math.log(best[1] / target_steps)):
            best = (x1, n1)
        if abs(n1 / target_steps - 1) <= rtol:
            break
        slope = (math.log(n1) - math.log(n0)) / (x1 - x0) if x1 != x0 and n1 != n0 else -1.0
        slope = min(slope, -0.1)                      # steps fall as ε grows: keep the step sane
        x0, n0, x1 = x1, n1, x1 + (math.log(target_steps) - math.log(n1)) / slope
    return math.exp(best[0]), best[1]


CONFIGS = ["logh_dkd", "logh_dkd_y4", "reversible_dkd", "verlet", "yoshida4", "dopri5"]
GEOMETRIC = ["logh_dkd", "logh_dkd_y4", "reversible_dkd"]
#: What the triple runs by default (~7 min of CPU time on one core): its best geometric
#: configuration (the best of the three in every calibrated run we made; ``--configs logh_dkd
#: reversible_dkd`` adds the other two to the saved study, ~6 min more) and the references.
TRIPLE_CONFIGS = ["logh_dkd_y4", "verlet", "yoshida4", "dopri5"]
LABELS = {"logh_dkd": "log-Hamiltonian DKD leapfrog", "logh_dkd_y4": "log-Hamiltonian DKD yoshida4",
          "reversible_dkd": "reversible variable steps (DKD)", "verlet": "fixed-step verlet",
          "yoshida4": "fixed-step yoshida4", "dopri5": "dopri5 (torchdiffeq), equal evaluations"}


def study(name, prob, q0, p0, T, budget, control, logh_eps_per_eval, T_cal, progress,
          configs=CONFIGS, out=None, title=None, dopri5="auto", params=None, panel=None):
    """The configurations on one problem at ``budget`` force evaluations over [0, T]; with
    ``out`` the study is saved there (study_<name>.json/.npz, with ``params``: the problem's own
    parameters, and ``panel``: its figure title) and, when ``configs`` is a subset, the other
    configurations are taken from the saved study of the same parameters."""
    params = dict(T=T, budget=budget, **(params or {}))
    E0 = float(prob.energy(q0, p0))
    rows, curves = [], {}
    if out is not None and set(configs) != set(CONFIGS) and (out / f"study_{name}.json").exists():
        try:
            rows, curves, _ = _load_study(out, name, params)
        except ValueError:   # saved with other parameters: not comparable, start afresh
            rows, curves = [], {}
        rows = [r for r in rows if r["config"] not in configs]
        curves = {k: v for k, v in curves.items() if k not in configs}
    bar = tqdm(configs, desc=title or name, disable=not progress, leave=False)
    for cfg in bar:
        bar.set_description(f"{title or name}: {LABELS[cfg]}")
        t0 = time.perf_counter()
        try:
            t, q, p, extra = run_config(cfg, prob, q0, p0, T, budget, control, logh_eps_per_eval,
                                        T_cal, dopri5)
        except FloatingPointError as err:   # StepSizeCollapse included: reported, not hidden
            rows.append(dict(problem=name, config=cfg, evaluations=prob.calls, t_end=float("nan"),
                             max_rel_energy_error=float("inf"),
                             growth_last_over_first_tenth=float("nan"), failed=str(err)[:200]))
            continue
        wall = time.perf_counter() - t0
        dE = prob.energy(q, p) - E0
        ok = torch.isfinite(dE)
        if not bool(ok.all()):   # a blow-up: count it as an O(1) error from there on
            dE = torch.where(ok, dE, torch.full_like(dE, float("inf")))
        tt, dd = t.numpy(), dE.numpy()
        mx, growth, slope, trend = stats(tt, dd, E0)
        rows.append(dict(problem=name, config=cfg, evaluations=prob.calls, t_end=float(tt[-1]),
                         max_rel_energy_error=mx, growth_last_over_first_tenth=growth,
                         slope_per_time=slope, trend_over_max=trend, wall_s=round(wall, 2), **extra))
        curves[cfg] = (tt, np.abs(dd) / abs(E0))
    order = {c: i for i, c in enumerate(CONFIGS)}
    rows.sort(key=lambda r: order[r["config"]])
    if out is not None:
        (out / f"study_{name}.json").write_text(json.dumps(dict(params=params, panel=panel, rows=rows)))
        np.savez(out / f"study_{name}.npz", **{f"{k}_{i}": v[i] for k, v in curves.items() for i in (0, 1)})
    return rows, curves


def _load_study(out, name, params=None):
    """(rows, curves, meta) of a saved study; ``params``: refuse one saved with other parameters
    (sizes, eccentricity, …), whose rows cannot be merged with these."""
    meta = json.loads((out / f"study_{name}.json").read_text())
    if "params" not in meta:
        raise ValueError(f"the saved study {name} predates the saved parameters; rerun it")
    if params is not None and meta["params"] != json.loads(json.dumps(params)):
        raise ValueError(f"the saved study {name} has parameters {meta['params']}, not {params}; "
                         "rerun all configurations")
    z = np.load(out / f"study_{name}.npz")
    curves = {r["config"]: (z[f"{r['config']}_0"], z[f"{r['config']}_1"])
              for r in meta["rows"] if f"{r['config']}_0" in z}
    return meta["rows"], curves, meta


def run_config(cfg, prob, q0, p0, T, budget, control, logh_eps_per_eval, T_cal, dopri5="auto"):
    extra = {}
    if cfg == "logh_dkd":
        t, q, p = run_logh(prob, q0, p0, logh_eps_per_eval, budget, "leapfrog_dkd")
    elif cfg == "logh_dkd_y4":
        t, q, p = run_logh(prob, q0, p0, 3 * logh_eps_per_eval, budget // 3,
                           "leapfrog_dkd_yoshida4")
    elif cfg == "reversible_dkd":
        target = budget * T_cal / T
        eps, n_cal = reversible_eps(prob, q0, p0, control, T_cal, target, 0.05)
        t, q, p = run_reversible(prob, q0, p0, eps, budget, control)
        extra = dict(eps=eps, calibration_steps=n_cal, calibration_target=round(target, 1))
    elif cfg == "verlet":
        t, q, p = run_fixed(prob, q0, p0, T / budget, budget, "verlet")
    elif cfg == "yoshida4":
        t, q, p = run_fixed(prob, q0, p0, 3 * T / budget, budget // 3, "yoshida4")
    elif dopri5 == "calibrate":
        # rtol = atol bisected so that [0, T_cal] costs its share of the budget, then one run
        # over [0, T] stopped where the budget is spent (it reports the evaluations it used)
        tol = dopri5_tolerance(prob, q0, p0, T_cal, budget * T_cal / T, -12.0, -3.0, 8)
        t, q, p = run_dopri5_budget(prob, q0, p0, T, tol, min(budget, 20000), budget)
        extra = dict(tol=tol)
    else:
        if T_cal == T:   # tolerance bisected on the whole interval: one run
            tol = dopri5_tolerance(prob, q0, p0, T, budget, -12.0, -6.0, 5)
            t, q, p = run_dopri5(prob, q0, p0, T, tol, min(budget, 20000), limit=3 * budget)
        else:
            # A tolerance calibrated on a short run loses the eccentric orbit over 10³ periods
            # and then needs far fewer evaluations than the budget (the orbit escapes): sweep
            # tolerances, each run stopped where the budget is spent, and keep the tightest one
            # that still reaches T (else the one that gets farthest).
            best = None
            for tol in (1e-4, 1e-5, 1e-6, 1e-7, 1e-8):
                t, q, p = run_dopri5_budget(prob, q0, p0, T, tol, min(budget, 20000), budget)
                key = (float(t[-1]) >= T * (1 - 1e-12), float(t[-1]), -tol)
                if best is None or key > best[0]:
                    best = (key, (t, q, p), tol, prob.calls)
            _, (t, q, p), tol, prob.calls = best
        extra = dict(tol=tol)
    return t, q, p, extra


def envelope(t, y, bins=2000):
    """Max of y in equal bins of t (what a plot of 10⁵ points shows anyway)."""
    edges = np.linspace(t[0], t[-1], bins + 1)
    idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
    out = np.full(bins, np.nan)
    np.fmax.at(out, idx, np.where(np.isfinite(y), y, 1e3))
    keep = np.isfinite(out)
    return 0.5 * (edges[:-1] + edges[1:])[keep], out[keep]


def reversible_gradient_accuracy(out, steps_list=(1000, 10000), e=0.9, eps=0.05):
    """``grad="reversible"`` with variable steps against ``grad="checkpoint"`` (exact backprop
    of the same map) on Kepler at e = 0.9 (σ = r^{3/2}, verlet, ε = 0.05): the relative error
    of the reconstructed start after N steps forward and N back (what the reversible backward
    pass steps through) and the relative difference of the gradients of q_N·1 + t_N w.r.t. q₀."""
    import warnings
    H = kepler().system
    q0, p0 = kepler_initial(e)
    ctl = tgi.power_law_control(1.5)
    lines = ["| steps | t reached | reconstruction error (relative) | reversible vs checkpoint gradient (relative) |",
             "|---|---|---|---|"]
    for n in steps_list:
        with torch.no_grad():
            fw = tgi.rollout(H, q0, p0, h=eps, steps=n, step_control=ctl)
            bw = tgi.rollout(H, fw.q[-1], fw.p[-1], h=-eps, steps=n, step_control=ctl,
                             rho0=fw.rho[-1], t0=fw.t[-1])
        scale = float(torch.maximum(q0.abs().max(), p0.abs().max())) + 1.0
        rec = max(float((bw.q[-1] - q0).abs().max()), float((bw.p[-1] - p0).abs().max())) / scale
        g = {}
        for mode in ("checkpoint", "reversible"):
            q = q0.clone().requires_grad_()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)   # the reversible mode's, expected
                tr = tgi.rollout(H, q, p0, h=eps, steps=n, step_control=ctl, grad=mode)
                g[mode] = torch.autograd.grad(tr.q[-1].sum() + tr.t[-1], q)[0]
        diff = float((g["reversible"] - g["checkpoint"]).abs().max() / g["checkpoint"].abs().max())
        lines.append(f"| {n} | {float(fw.t[-1]):.1f} | {rec:.2e} | {diff:.2e} |")
    (out / "grad.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def goal(rows):
    """The issue's goal on one study: the best geometric configuration (least max |ΔE/E₀|)
    against fixed-step verlet and yoshida4 and dopri5 at the same evaluations."""
    by = {r["config"]: r for r in rows if "failed" not in r}
    geo = [by[c] for c in GEOMETRIC if c in by]
    if not geo:
        return None
    best = min(geo, key=lambda r: r["max_rel_energy_error"])
    out = dict(problem=best["problem"], best=best["config"], best_max=best["max_rel_energy_error"],
               best_growth=best["growth_last_over_first_tenth"], best_trend=best["trend_over_max"])
    for c in ("verlet", "yoshida4", "dopri5"):
        if c in by:
            out[f"ratio_{c}"] = by[c]["max_rel_energy_error"] / best["max_rel_energy_error"]
    if "dopri5" in by:
        out["dopri5_growth"] = by["dopri5"]["growth_last_over_first_tenth"]
        out["dopri5_trend"] = by["dopri5"]["trend_over_max"]
    return out


def goal_line(g):
    parts = [f"{g['problem']}: best geometric = {g['best']} (max |ΔE/E₀| {g['best_max']:.2e}, "
             f"last/first tenth {g['best_growth']:.3g}, trend/max {g['best_trend']:.2g})"]
    for c in ("verlet", "yoshida4", "dopri5"):
        if f"ratio_{c}" in g:
            parts.append(f"{c} {g[f'ratio_{c}']:.3g}× larger")
    if "dopri5_growth" in g:
        parts.append(f"dopri5 last/first tenth {g['dopri5_growth']:.3g}, trend/max "
                     f"{g['dopri5_trend']:.2g}")
    return "; ".join(parts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--studies", nargs="*", default=["triple"],
                    choices=["triple", "kepler", "3body", "grad"],
                    help="rerun these (default: the hierarchical triple, ~7 min on one core; "
                         "kepler and 3body took ~20 min each); the others come from the saved "
                         "studies in --out (none: only redraw the table and figure); grad: "
                         "the accuracy of grad='reversible' with variable steps (seconds)")
    ap.add_argument("--triple-periods", type=number("int", 1), default=1000, help="triple: inner periods (2π each)")
    ap.add_argument("--triple-per-period", type=int, default=400,
                    help="triple: ∇V evaluations per inner period")
    ap.add_argument("--triple-e", type=float, default=0.9, help="triple: inner eccentricity")
    ap.add_argument("--triple-a-out", type=float, default=8.0, help="triple: outer orbit radius")
    ap.add_argument("--periods", type=number("int", 1), default=1000, help="Kepler: periods")
    ap.add_argument("--per-period", type=int, default=100, help="Kepler: ∇V evaluations per period")
    ap.add_argument("--t-end", type=float, default=20.0, help="Pythagorean three-body end time")
    ap.add_argument("--budget", type=number("int", 1), default=60000, help="Pythagorean three-body ∇V evaluations")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--configs", nargs="+", default=None, choices=CONFIGS,
                    help="rerun these (default: all; for the triple " + " ".join(TRIPLE_CONFIGS)
                         + "); the others come from the saved studies in --out")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float64)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    progress = not args.no_progress

    rows, panels, goals = [], {}, []
    if "grad" in args.studies:
        reversible_gradient_accuracy(out)

    studies = {}

    def add(name, title, run):
        """Run a study (``run()``, which saves it) or load its saved rows, with the parameters and
        title it was run with (not this command line's); add its rows, panel and goal line."""
        if run is not None:
            r, c = run()
            params = json.loads((out / f"study_{name}.json").read_text())["params"]
        elif (out / f"study_{name}.json").exists():
            try:
                r, c, saved = _load_study(out, name)
            except ValueError as err:
                print(f"skipped: {err}")
                return
            params, title = saved["params"], saved["panel"] or name
        else:
            return
        studies[name] = params
        rows.extend(r)
        panels[title] = c
        g = goal(r)
        if g is not None:
            goals.append(g)

    # -- the hierarchical triple: an e = 0.9 inner binary, a distant third body ------------------
    tp, tper = args.triple_periods, args.triple_per_period
    T3, budget3 = 2 * math.pi * tp, tp * tper
    title3 = (f"hierarchical triple, inner e = {args.triple_e:g}, {tp} inner periods, {budget3} ∇V")
    params3 = dict(e=args.triple_e, a_out=args.triple_a_out, periods=tp, per_period=tper)

    def run_triple():
        masses = TRIPLE_MASSES
        prob = n_body(masses)
        q0, p0 = triple_initial(args.triple_e, args.triple_a_out, masses)
        T_cal = min(T3, 2 * math.pi * 10)
        # logH: dt/dτ = 1/(−V); ε from a calibration run over T_cal (budget·T_cal/T steps there)
        with torch.no_grad():
            cal = tgi.time_transformed_rollout(prob.system, q0, p0, eps=0.05, until=T_cal, chunk=64)
        n_cal = int(np.searchsorted(cal.t.numpy(), T_cal))
        eps_logh = 0.05 * n_cal / (budget3 * T_cal / T3)
        return study("triple", prob, q0, p0, T3, budget3, free_fall_control(masses), eps_logh, T_cal,
                     progress, args.configs or TRIPLE_CONFIGS, out, title="triple",
                     dopri5="calibrate", params=params3, panel=title3)
    add("triple", title3, run_triple if "triple" in args.studies else None)

    # -- Kepler, e = 0.9 and 0.99 ------------------------------------------------------------------
    T = 2 * math.pi * args.periods
    budget = args.periods * args.per_period
    for e in (0.9, 0.99):
        name = f"kepler_e{e}"
        params_k = dict(e=e, periods=args.periods, per_period=args.per_period)
        title_k = f"Kepler e = {e}, {args.periods} periods, {budget} ∇V"

        def run_kepler(e=e, name=name, params_k=params_k, title_k=title_k):
            q0, p0 = kepler_initial(e)
            # logH: dt/dτ = r, one period is τ = 2π at every e: ε = 2π / (evaluations per period)
            return study(name, kepler(), q0, p0, T, budget, tgi.power_law_control(1.5),
                         2 * math.pi / args.per_period, min(T, 2 * math.pi * 5), progress,
                         args.configs or CONFIGS, out, title=f"Kepler e = {e}", params=params_k,
                         panel=title_k)
        add(name, title_k, run_kepler if "kepler" in args.studies else None)

    # -- Burrau's Pythagorean problem --------------------------------------------------------------
    def run_3body():
        prob = three_body()
        q0, p0 = three_body_initial()
        # logH: ε from a calibration over the whole interval (the close encounters take most steps)
        with torch.no_grad():
            cal = tgi.time_transformed_rollout(prob.system, q0, p0, eps=0.05, until=args.t_end,
                                               chunk=64)
        eps_logh = 0.05 * (cal.t.shape[0] - 1) / args.budget
        return study("pythagorean_3body", prob, q0, p0, args.t_end, args.budget,
                     free_fall_control(MASSES), eps_logh, args.t_end, progress,
                     args.configs or CONFIGS, out, title="Pythagorean three-body", panel=title_b)
    title_b = f"Pythagorean three-body, t ≤ {args.t_end:g}, {args.budget} ∇V"
    add("pythagorean_3body", title_b, run_3body if "3body" in args.studies else None)

    if not panels:   # (only the grad study, or nothing saved)
        return rows
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(6 * max(1, len(panels)), 4.2),
                             squeeze=False)
    axes = axes[0]
    styles = {"logh_dkd": ("C0", "-"), "logh_dkd_y4": ("C1", "-"), "reversible_dkd": ("C2", "-"),
              "verlet": ("C3", "--"), "yoshida4": ("C4", "--"), "dopri5": ("k", ":")}
    for ax, (title, curves) in zip(axes, panels.items()):
        for cfg, (tt, yy) in curves.items():
            xe, ye = envelope(tt, yy)
            col, ls = styles[cfg]
            ax.semilogy(xe, np.maximum(ye, 1e-17), color=col, ls=ls, label=cfg, lw=1.2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("t")
        ax.set_ylim(1e-17, 1e7)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("|ΔE / E₀| (max per bin)")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "energy.png", dpi=110)
    plt.close(fig)

    lines = ["| problem | configuration | ∇V evaluations | t reached | max abs(ΔE/E₀) | growth "
             "(last/first tenth) | linear fit: slope per unit t | slope·t / max |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['problem']} | {r['config']} | {r['evaluations']} | — | failed: "
                         f"{r['failed'][:90]} | — | — | — |")
            continue
        slope = r.get("slope_per_time", float("nan"))
        trend = r.get("trend_over_max", float("nan"))
        lines.append(f"| {r['problem']} | {r['config']} | {r['evaluations']} | {r['t_end']:.1f} | "
                     f"{r['max_rel_energy_error']:.2e} | {r['growth_last_over_first_tenth']:.3g} | "
                     f"{slope:.2e} | {trend:.2g} |")
    lines += [""] + [f"* {goal_line(g)}" for g in goals]
    # each study's own parameters (a loaded one's are those it was run with, not this command's)
    meta = dict(studies=studies, torch=torch.__version__, date=time.strftime("%Y-%m-%d"))
    (out / "table.md").write_text("\n".join(lines) + "\n")
    (out / "table.json").write_text(json.dumps(dict(meta=meta, data=rows, goals=goals), indent=1))
    print("\n".join(lines))
    return rows


if __name__ == "__main__":
    main()
