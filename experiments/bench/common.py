"""Shared pieces of the benchmarks and the demo: problems, references, counting, timing, output.

Problems (float64 unless asked, analytic gradients so the benchmarks time the integrators, not
autograd):

* Kepler, H = |p|²/2 − 1/|q|, q0 = (1 − e, 0), p0 = (0, √((1+e)/(1−e))), period 2π.
* The outer solar system, HLW Sect. I.2.3 (data in ``experiments/data/outer_solar_system.json``):
  H = Σ|p_i|²/(2m_i) − G Σ_{i<j} m_i m_j/|q_i − q_j|, q, p of shape (6, 3); AU, solar masses, days.

References are scipy's DOP853 at rtol = atol = 1e-13 on the same equations (numpy, independent
of torchgeo_int).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import platform
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

import torchgeo_int as tgi

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "experiments" / "data"
RESULTS = ROOT / "results"


# ----------------------------------------------------------------------------------------------
# Problems

@dataclass
class Problem:
    name: str
    system: tgi.System            # SeparableHamiltonian with analytic gradients
    q0: torch.Tensor
    p0: torch.Tensor
    energy: Callable              # energy(q, p) -> (...,)
    force_np: Callable            # numpy −∂V/∂q for the reference
    inv_mass_np: np.ndarray       # ∂T/∂p = p * inv_mass_np (broadcast)
    unit: str = ""                # time unit (for tables)

    def batch(self, n: int):
        """(q0, p0) repeated n times along a new leading dim."""
        return (self.q0.expand(n, *self.q0.shape).clone(), self.p0.expand(n, *self.p0.shape).clone())


def kepler(e: float = 0.6, dtype=torch.float64, device="cpu") -> Problem:
    q0 = torch.tensor([1.0 - e, 0.0], dtype=dtype, device=device)
    p0 = torch.tensor([0.0, math.sqrt((1.0 + e) / (1.0 - e))], dtype=dtype, device=device)

    def kinetic(p):
        return 0.5 * (p * p).sum(-1)

    def potential(q):
        return -1.0 / q.norm(dim=-1)

    def potential_grad(q):
        return q / q.norm(dim=-1, keepdim=True) ** 3

    system = tgi.SeparableHamiltonian(kinetic, potential, kinetic_grad=lambda p: p,
                                      potential_grad=potential_grad)

    def force_np(q):
        return -q / np.linalg.norm(q) ** 3

    return Problem(f"kepler_e{e:g}", system, q0, p0, lambda q, p: kinetic(p) + potential(q),
                   force_np, np.ones(1), unit="")


def load_outer_solar_system(path=None):
    """The HLW I.2.3 data: (G, masses (6,), positions (6, 3), velocities (6, 3), body names)."""
    data = json.loads(pathlib.Path(path or DATA / "outer_solar_system.json").read_text())
    return (data["G"], np.array(data["mass"]), np.array(data["position"]),
            np.array(data["velocity"]), data["bodies"])


def outer_solar_system(dtype=torch.float64, device="cpu") -> Problem:
    G, m_np, x_np, v_np, _ = load_outer_solar_system()
    n = len(m_np)
    m = torch.tensor(m_np, dtype=dtype, device=device)
    q0 = torch.tensor(x_np, dtype=dtype, device=device)
    p0 = m[:, None] * torch.tensor(v_np, dtype=dtype, device=device)
    eye = torch.eye(n, dtype=dtype, device=device)
    # G m_i m_j off the diagonal, 0 on it; the 1 added to r² on the diagonal avoids 0/0.
    gmm = G * m[:, None] * m[None, :] * (1.0 - eye)

    def kinetic(p):
        return ((p * p).sum(-1) / (2 * m)).sum(-1)

    def potential(q):
        diff = q[..., :, None, :] - q[..., None, :, :]
        r = ((diff * diff).sum(-1) + eye).sqrt()
        return -0.5 * (gmm / r).sum((-1, -2))

    def potential_grad(q):
        # ∂V/∂q_i = Σ_j G m_i m_j (q_i − q_j)/|q_i − q_j|³, all pairs at once.
        diff = q[..., :, None, :] - q[..., None, :, :]
        r2 = (diff * diff).sum(-1) + eye
        return ((gmm / (r2 * r2.sqrt()))[..., None] * diff).sum(-2)

    system = tgi.SeparableHamiltonian(kinetic, potential, kinetic_grad=lambda p: p / m[:, None],
                                      potential_grad=potential_grad)
    gmm_np = G * m_np[:, None] * m_np[None, :] * (1.0 - np.eye(n))

    def force_np(q):
        diff = q[:, None, :] - q[None, :, :]
        r2 = (diff * diff).sum(-1) + np.eye(n)
        return -((gmm_np / (r2 * np.sqrt(r2)))[..., None] * diff).sum(-2)

    return Problem("outer_solar_system", system, q0, p0, lambda q, p: kinetic(p) + potential(q),
                   force_np, 1.0 / m_np[:, None], unit="days")


PROBLEMS = {"kepler": kepler, "outer_solar_system": outer_solar_system}

_REFERENCES: dict = {}


def reference(problem: Problem, T: float, times=None):
    """(q, p) at T (or at each of ``times``) from scipy's DOP853, rtol = atol = 1e-13."""
    from scipy.integrate import solve_ivp

    key = (problem.name, float(T), None if times is None else tuple(np.asarray(times).tolist()))
    if key not in _REFERENCES:
        shape = tuple(problem.q0.shape)
        k = int(np.prod(shape))
        inv_m = problem.inv_mass_np

        def f(t, y):
            q, p = y[:k].reshape(shape), y[k:].reshape(shape)
            return np.concatenate([(p * inv_m).ravel(), problem.force_np(q).ravel()])

        y0 = np.concatenate([problem.q0.cpu().double().numpy().ravel(),
                             problem.p0.cpu().double().numpy().ravel()])
        sol = solve_ivp(f, (0.0, T), y0, method="DOP853", rtol=1e-13, atol=1e-13,
                        t_eval=None if times is None else np.asarray(times))
        y = sol.y if times is not None else sol.y[:, -1:]
        q = torch.tensor(y[:k].T.reshape(-1, *shape))
        p = torch.tensor(y[k:].T.reshape(-1, *shape))
        _REFERENCES[key] = (q, p) if times is not None else (q[0], p[0])
    return _REFERENCES[key]


# ----------------------------------------------------------------------------------------------
# Counting force evaluations

class Counting(tgi.System):
    """The wrapped system, counting evaluations: one per call of ``force`` (∇V), ``velocity``
    (∂T/∂p) and ``vector_field`` (both), whatever the batch size."""

    def __init__(self, system):
        super().__init__()
        self.inner = system
        self.separable = system.separable
        self.time_dependent = getattr(system, "time_dependent", False)
        self.forces = self.velocities = self.fields = 0

    def force(self, q, t=0.0):
        self.forces += 1
        return self.inner.force(q, t)

    def velocity(self, p, t=0.0):
        self.velocities += 1
        return self.inner.velocity(p, t)

    def vector_field(self, q, p, t=0.0):
        self.fields += 1
        return self.inner.vector_field(q, p, t)

    def energy(self, q, p, t=0.0):
        return self.inner.energy(q, p, t)

    @property
    def evaluations(self) -> int:
        """Force evaluations: ∇V calls plus full-field calls (each contains one ∇V)."""
        return self.forces + self.fields


class FlatField(torch.nn.Module):
    """torchdiffeq's ``func(t, y)`` for a separable system, y = cat([q.flatten, p.flatten]) per
    batch row; counts evaluations in ``nfe``."""

    def __init__(self, system, shape):
        super().__init__()
        self.system, self.shape = system, tuple(shape)
        self.k = int(np.prod(self.shape))
        self.nfe = 0

    def flatten(self, q, p):
        lead = q.shape[:q.dim() - len(self.shape)]
        return torch.cat([q.reshape(*lead, self.k), p.reshape(*lead, self.k)], -1)

    def unflatten(self, y):
        lead = y.shape[:-1]
        return (y[..., :self.k].reshape(*lead, *self.shape), y[..., self.k:].reshape(*lead, *self.shape))

    def forward(self, t, y):
        self.nfe += 1
        q, p = self.unflatten(y)
        lead = y.shape[:-1]
        return torch.cat([self.system.velocity(p).reshape(*lead, self.k),
                          self.system.force(q).reshape(*lead, self.k)], -1)


def torchdiffeq_solve(system, q0, p0, T, method, *, shape, h=None, rtol=None, times=None):
    """Integrate with torchdiffeq: fixed step ``h`` (rk4, …) or tolerance ``rtol = atol``
    (dopri5, dopri8); ``shape`` is one trajectory's state shape (batch dims lead).  Returns
    ((q, p) at T, or at each of ``times``) and the number of evaluations of the field."""
    import torchdiffeq

    func = FlatField(system, shape)
    y0 = func.flatten(q0, p0)
    t = torch.tensor([0.0, T] if times is None else list(times), dtype=q0.dtype, device=q0.device)
    kw = dict(method=method)
    if h is not None:
        kw["options"] = dict(step_size=h)
    if rtol is not None:
        kw.update(rtol=rtol, atol=rtol)
    with torch.no_grad():
        ys = torchdiffeq.odeint(func, y0, t, **kw)
    q, p = func.unflatten(ys)
    return ((q, p) if times is not None else (q[-1], p[-1])), func.nfe


def state_error(q, p, qr, pr) -> float:
    """Max-norm of the error of (q, p) against the reference, relative to the reference's."""
    d = torch.cat([(q - qr).flatten(), (p - pr).flatten()]).abs().max()
    s = torch.cat([qr.flatten(), pr.flatten()]).abs().max()
    return float(d / s)


def position_error(q, qr) -> float:
    """Max over bodies of |q − q_ref| relative to max |q_ref| (dimensionless)."""
    return float((q - qr).norm(dim=-1).max() / qr.norm(dim=-1).max())


# ----------------------------------------------------------------------------------------------
# Timing

def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, *, device="cpu"):
    """(result, seconds) of one call, synchronised on CUDA."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def min_time(fn, repeats=3, *, device="cpu", budget=None):
    """Best of ``repeats`` calls (fewer if ``budget`` seconds are spent): the least disturbed
    run on a shared machine.  Returns (result of the last call, seconds)."""
    best, spent, out = float("inf"), 0.0, None
    for i in range(repeats):
        out, s = timed(fn, device=device)
        best, spent = min(best, s), spent + s
        if budget is not None and spent > budget and i >= 0:
            break
    return out, best


# ----------------------------------------------------------------------------------------------
# Command line and output

def pick(configs: dict, names) -> dict:
    """The configurations ``names`` (all if None), in their table order; a name that is none of
    them is refused, listing them (it would otherwise drop out of the table unnoticed, or leave
    it empty)."""
    unknown = [n for n in names or () if n not in configs]
    if unknown:
        raise ValueError(f"unknown configuration(s) {unknown}; known here: {list(configs)}")
    return {k: v for k, v in configs.items() if names is None or k in names}


def parser(doc: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc.strip().splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke-test sizes (seconds, not minutes)")
    ap.add_argument("--out", default=str(RESULTS / "bench"), help="output folder")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: stable timings on a shared machine; 0 "
                         "keeps torch's default)")
    ap.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    return ap


def setup(args) -> pathlib.Path:
    if args.threads:
        torch.set_num_threads(args.threads)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def progress(iterable, *, args=None, **kw):
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=bool(args is not None and args.no_progress), leave=False, **kw)


def machine() -> str:
    return (f"torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} CPU "
            f"thread(s)" + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""))


def fmt(x, spec=".3g") -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        return format(x, spec)
    return str(x)


def md_cell(text) -> str:
    """A markdown table cell: ``|`` escaped (``max |ΔH/H₀|`` would otherwise split the cell and
    the table would not render), newlines flattened."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """``columns``: (key, header); values formatted with :func:`fmt`; cells escaped by
    :func:`md_cell`, so every row has the header's number of cells."""
    lines = ["| " + " | ".join(md_cell(h) for _, h in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(md_cell(fmt(r.get(k))) for k, _ in columns) + " |")
    return "\n".join(lines)


def write(out: pathlib.Path, stem: str, title: str, sections: list[tuple[str, str]], data) -> None:
    """``out/stem.md`` (title, then (heading, markdown) sections) and ``out/stem.json``."""
    md = [f"# {title}", "", machine(), ""]
    for heading, body in sections:
        md += [f"## {heading}" if heading else "", "", body, ""]
    (out / f"{stem}.md").write_text("\n".join(md))
    (out / f"{stem}.json").write_text(json.dumps(dict(machine=machine(), data=data), indent=1,
                                                 default=_json_default))


def _json_default(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, pathlib.Path):
        return str(x)
    raise TypeError(type(x).__name__)


def plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot
