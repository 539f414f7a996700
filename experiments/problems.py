"""Problems shared by the experiments (and the test suite): Kepler and the outer solar system;
the experiments' argparse types (a list of step counts, an int with a lower bound), the check
of ``--device cuda`` and the paths of an ``--out NAME`` report."""
from __future__ import annotations

import argparse
import json
import math
import pathlib

import torch

import torchgeo_int as tgi

DATA = pathlib.Path(__file__).resolve().parent / "data"


def kepler_initial(e, dtype=torch.float64):
    """Kepler orbit of eccentricity e started at pericentre; period 2π."""
    q0 = torch.tensor([1.0 - e, 0.0], dtype=dtype)
    p0 = torch.tensor([0.0, math.sqrt((1.0 + e) / (1.0 - e))], dtype=dtype)
    return q0, p0


def kepler_energy(q, p):
    return 0.5 * (p * p).sum(-1) - 1.0 / q.norm(dim=-1)


def kepler_system():
    """H = |p|²/2 − 1/|q| with closed-form gradients (explicit methods' fast path)."""
    return tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: -1.0 / q.norm(dim=-1),
                                    kinetic_grad=lambda p: p,
                                    potential_grad=lambda q: q / q.norm(dim=-1, keepdim=True) ** 3)


def outer_solar_system(dtype=torch.float64):
    """HLW I.2.3: (system, q0, p0, masses) with q, p of shape (6, 3); AU, solar masses, days."""
    data = json.loads((DATA / "outer_solar_system.json").read_text())
    G = data["G"]
    m = torch.tensor(data["mass"], dtype=dtype)
    q0 = torch.tensor(data["position"], dtype=dtype)
    p0 = m[:, None] * torch.tensor(data["velocity"], dtype=dtype)
    i, j = torch.triu_indices(len(m), len(m), 1)
    mm = G * m[i] * m[j]
    eye = torch.eye(len(m), dtype=dtype)

    def kinetic(p):
        return ((p * p).sum(-1) / (2 * m)).sum(-1)

    def potential(q):
        d = (q[..., i, :] - q[..., j, :]).norm(dim=-1)
        return -(mm / d).sum(-1)

    def potential_grad(q):
        # ∂V/∂q_i = Σ_j G m_i m_j (q_i − q_j)/|q_i − q_j|³, all pairs at once (6 bodies).
        diff = q[..., :, None, :] - q[..., None, :, :]
        r2 = (diff * diff).sum(-1) + eye  # the 1 on the diagonal avoids 0/0
        w = G * m[:, None] * m[None, :] * (1.0 - eye) / r2 ** 1.5
        return (w[..., None] * diff).sum(-2)

    system = tgi.SeparableHamiltonian(kinetic, potential, kinetic_grad=lambda p: p / m[:, None],
                                      potential_grad=potential_grad)
    return system, q0, p0, m


def step_counts(text: str) -> list[int]:
    """argparse type of a convergence study's ``--Ns``: at least two increasing step counts ≥ 2
    ("8,16,32"), so that an order can be fitted."""
    try:
        Ns = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if len(Ns) < 2 or min(Ns) < 2 or sorted(set(Ns)) != Ns:
        raise argparse.ArgumentTypeError(f"expected at least 2 increasing step counts ≥ 2, got {text!r}")
    return Ns


def int_at_least(minimum: int):
    """argparse type: an int ≥ ``minimum`` (a one-line error otherwise, not a traceback)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value
    return parse


def require_cuda(ap: argparse.ArgumentParser, device: str) -> None:
    """``--device cuda`` on a machine without CUDA: a one-line argparse error (exit 2)."""
    if device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available on this machine (use --device cpu)")


def report_paths(out) -> tuple[pathlib.Path, pathlib.Path]:
    """``NAME.json``, ``NAME.md`` of an ``--out NAME`` report, its folder created: the suffix is
    appended (``--out run.v2`` writes ``run.v2.json``, where ``with_suffix`` wrote ``run.json``),
    and a ``.json`` / ``.md`` given with the name is taken as the name's own."""
    out = pathlib.Path(out)
    if out.suffix in (".json", ".md"):
        out = out.with_suffix("")
    out.parent.mkdir(parents=True, exist_ok=True)
    return out.with_name(out.name + ".json"), out.with_name(out.name + ".md")
