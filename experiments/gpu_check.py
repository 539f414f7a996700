r"""The library's main paths on a GPU, each compared with the same computation on the CPU.

    python -m experiments.gpu_check [--device cuda] [--out results/gpu_check] [--only SUBSTRING ...]

CI has no GPU, so the test suite runs everything on the CPU; this script is the device check
(run it where ``torch.cuda.is_available()``).  Every row runs one path in float64 on the device
and on the CPU from the same inputs and parameters, and reports the largest absolute difference
of the results (states, losses, gradients), the device's wall time (first call, compiles
included) and the error if the path failed.  A row passes when it ran and the difference is at
most ``tol`` (round-off of the reduction orders: 1e-9 for rollouts of a few hundred steps,
looser for chaotic or trained quantities).  Rows:

* ``rollout``: Kepler (closed-form forces), B = 1000, 400 Verlet steps, every state kept; eager,
  ``compile=True``, and ``compile=True`` in float32 (against the CPU's float32);
* energy-defined Kepler (``SeparableHamiltonian(kinetic, potential)``, autograd forces);
* ``yoshida4`` compiled; ``implicit_midpoint`` on a non-separable H, eager and compiled;
* gradients of a rollout loss: backprop, ``grad="checkpoint"``, ``grad="reversible"``;
* ``odeint``: verlet with ``options=dict(separable=True)``, dopri5, and ``odeint_adjoint``;
* ``adaptive_rollout`` with its default Kepler step control;
* HNN: 5 Adam steps of ``SeparableHNN`` on a Verlet ``rollout_loss``, and of a
  ``TrajectoryFit`` (learned initial states, 2 shooting segments);
* ``MemoryError``: a rollout that cannot fit the device's free memory is refused before a step.

``--device`` defaults to ``cuda``; without CUDA the script refuses it with one line (exit 2)
instead of comparing the CPU with itself: ``--device cpu`` runs the rows on the CPU against the
CPU (how the test suite runs it).  ``--only`` keeps the rows whose names contain one of its
substrings (at least one row must match).

Writes ``results/gpu_check.{md,json}`` (or ``--out``); exits 1 if a row failed.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import traceback

import torch

import torchgeo_int as tgi
from torchgeo_int import nn as tnn

from experiments.bench.throughput import energy_kepler
from experiments.problems import report_paths
from experiments.rollout_sharded import initial_conditions, kepler

ROOT = pathlib.Path(__file__).resolve().parents[1]


def kepler_states(B, dtype=torch.float64):
    """Kepler orbits with eccentricities uniform in [0.1, 0.7] (the sharded rollout's)."""
    return initial_conditions(B, 0, dtype)


def nonseparable():
    # H = |p|²/2 (1 + |q|²/4) − 1/|q|: implicit midpoint needs the fixed point on both halves.
    return tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1) * (1 + 0.25 * (q * q).sum(-1))
                           - 1.0 / q.norm(dim=-1))


def _rollout(system, dtype=torch.float64, steps=400, **kw):
    def run(dev):
        q0, p0 = (x.to(dev) for x in kepler_states(1000, dtype))
        with torch.no_grad():
            return tgi.rollout(system, q0, p0, h=0.01, steps=steps, **kw)
    return run


def _grad(mode):
    def run(dev):
        q0, p0 = (x.to(dev) for x in kepler_states(64))
        q0.requires_grad_(True)
        p0.requires_grad_(True)
        q, p = tgi.rollout(kepler(), q0, p0, h=0.01, steps=200, grad=mode)
        loss = (q[-1] ** 2).sum() + (p ** 2).mean()
        gq, gp = torch.autograd.grad(loss, (q0, p0))
        return loss.detach(), gq, gp
    return run


def _field(t, y):
    q, p = y[..., :2], y[..., 2:]
    r3 = q.norm(dim=-1, keepdim=True) ** 3
    return torch.cat([p, -q / r3], -1)


def _odeint(method, adjoint=False):
    def run(dev):
        q0, p0 = (x.to(dev) for x in kepler_states(256))
        t = torch.linspace(0, 5, 11, dtype=torch.float64, device=dev)
        if method == "verlet":
            def f(t, state):
                q, p = state
                return p, -q / q.norm(dim=-1, keepdim=True) ** 3
            q, p = tgi.odeint(f, (q0, p0), t, method="verlet",
                              options=dict(step_size=0.01, separable=True))
            return q, p
        y0 = torch.cat([q0, p0], -1)
        if adjoint:
            w = torch.tensor(1.0, dtype=torch.float64, device=dev, requires_grad=True)

            class F(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.w = torch.nn.Parameter(w.detach().clone())

                def forward(self, t, y):
                    return self.w * _field(t, y)
            f = F().to(dev)
            y = tgi.odeint_adjoint(f, y0, t, method=method, rtol=1e-9, atol=1e-10)
            (g,) = torch.autograd.grad((y[-1] ** 2).sum(), (f.w,))
            return y.detach(), g
        return tgi.odeint(_field, y0, t, method=method, rtol=1e-9, atol=1e-10)
    return run


def _adaptive(dev):
    q0, p0 = (x.to(dev) for x in kepler_states(64))
    with torch.no_grad():
        out = tgi.adaptive_rollout(kepler(), q0, p0, eps=0.01, steps=300)
    return out.q, out.p, out.t


def _hnn(dev):
    torch.manual_seed(0)
    model = tnn.SeparableHNN(2, width=64).double()
    q, p = tgi.rollout(kepler(), *kepler_states(32), h=0.05, steps=20)
    model = model.to(dev)                                     # q, p: (T, B, n)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = tnn.rollout_loss(model, q.to(dev), p.to(dev), dt=0.05, layout="time_first")
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses), torch.cat([x.detach().flatten() for x in model.parameters()])


def _shooting(dev):
    torch.manual_seed(0)
    q, p = tgi.rollout(kepler(), *kepler_states(16), h=0.05, steps=20)
    q, p = q.transpose(0, 1).contiguous(), p.transpose(0, 1).contiguous()
    q = q + 1e-3 * torch.randn_like(q)
    fit = tnn.TrajectoryFit(tnn.SeparableHNN(2, width=32).double(), q, p, dt=0.05, segment=10,
                            continuity=1.0).to(dev)
    opt = torch.optim.Adam(fit.parameters(), lr=1e-3)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = fit(torch.arange(16, device=dev))
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses), torch.cat([x.detach().flatten() for x in fit.parameters()])


def _memory(dev):
    """A rollout whose every-state output exceeds the free memory: a MemoryError, no step."""
    q0, p0 = (x.to(dev) for x in kepler_states(4))
    free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else 2 ** 50
    steps = int(2 * free / (4 * 2 * 8)) + 1
    try:
        tgi.rollout(kepler(), q0, p0, h=0.01, steps=steps)
    except MemoryError as err:
        return torch.tensor([1.0 if "save_every" in str(err) else 0.0], device=dev)
    return torch.tensor([0.0], device=dev)


CHECKS = [   # name, run(device) -> tensor or tuple of tensors (compared with run(cpu)), tolerance
    ("rollout verlet eager, every state", _rollout(kepler()), 1e-9),
    ("rollout verlet compile=True", _rollout(kepler(), compile=True), 1e-9),
    ("rollout verlet compile=True float32", _rollout(kepler(), dtype=torch.float32, compile=True), 1e-3),
    ("rollout verlet, energy-defined (autograd forces)", _rollout(energy_kepler()), 1e-9),
    ("rollout verlet, energy-defined, compile=True", _rollout(energy_kepler(), compile=True), 1e-9),
    ("rollout yoshida4 compile=True", _rollout(kepler(), method="yoshida4", compile=True), 1e-9),
    ("rollout implicit_midpoint, non-separable", _rollout(nonseparable(), method="implicit_midpoint",
                                                          steps=100), 1e-9),
    ("rollout implicit_midpoint compile=True", _rollout(nonseparable(), method="implicit_midpoint",
                                                        steps=100, compile=True), 1e-9),
    ("gradients, grad=backprop", _grad("backprop"), 1e-8),
    ("gradients, grad=checkpoint", _grad("checkpoint"), 1e-8),
    ("gradients, grad=reversible", _grad("reversible"), 1e-6),
    ("odeint verlet separable", _odeint("verlet"), 1e-9),
    ("odeint dopri5", _odeint("dopri5"), 1e-7),
    ("odeint_adjoint dopri5 (parameter gradient)", _odeint("dopri5", adjoint=True), 1e-6),
    ("adaptive_rollout (default Kepler control)", _adaptive, 1e-8),
    ("HNN SeparableHNN rollout_loss, 5 Adam steps", _hnn, 1e-8),
    ("TrajectoryFit (2 segments), 5 Adam steps", _shooting, 1e-8),
    ("MemoryError before the first step", _memory, 0.0),
]


def _flat(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if hasattr(x, "q"):
        return [x.q, x.p]
    return [t for item in x for t in _flat(item)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda",
                    help="the device checked against the CPU (default cuda; cpu: the CPU against itself)")
    ap.add_argument("--out", default=str(ROOT / "results" / "gpu_check"),
                    help="the report's path without suffix: it writes OUT.md and OUT.json (default "
                         "results/gpu_check; unlike the benches' --out, not a folder)")
    ap.add_argument("--only", nargs="*", default=None, help="substrings of row names")
    a = ap.parse_args(argv)
    try:
        dev, cpu = torch.device(a.device), torch.device("cpu")
    except RuntimeError:
        ap.error(f"--device {a.device!r} is not a torch device (cuda, cuda:1, cpu, ...)")
    if dev.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {a.device}: CUDA is not available on this machine (torch {torch.__version__}); "
                 "this is the GPU check: run it on a GPU machine, or --device cpu to run its rows "
                 "on the CPU against the CPU")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        ap.error(f"--device {a.device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if a.only and not any(s in name for name, _, _ in CHECKS for s in a.only):
        ap.error(f"--only {' '.join(a.only)}: no row's name contains any of these; rows: "
                 + "; ".join(name for name, _, _ in CHECKS))
    print(f"device: {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else dev}, "
          f"torch {torch.__version__}", flush=True)
    rows = []
    for name, run, tol in CHECKS:
        if a.only and not any(s in name for s in a.only):
            continue
        row = dict(check=name, tol=tol)
        try:
            t0 = time.perf_counter()
            got = _flat(run(dev))
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            row["seconds"] = time.perf_counter() - t0
            if name.startswith("MemoryError"):
                ref = [torch.tensor([1.0])]
            else:
                ref = _flat(run(cpu))
            if len(got) != len(ref) or any(g.shape != r.shape for g, r in zip(got, ref)):
                raise AssertionError(f"shapes {[tuple(g.shape) for g in got]} vs "
                                     f"{[tuple(r.shape) for r in ref]}")
            if any(g.device.type != dev.type for g in got):
                raise AssertionError(f"results on {[str(g.device) for g in got]}, not {dev}")
            diff = max(float((g.detach().cpu().double() - r.detach().double()).abs().max())
                       if g.numel() else 0.0 for g, r in zip(got, ref))
            row.update(max_abs_diff=diff, passed=bool(diff <= tol))
        except Exception as err:  # report and go on: one broken path must not hide the others
            row.update(passed=False, error=f"{type(err).__name__}: {err}"[:400])
            traceback.print_exc()
        rows.append(row)
        print(f"{'ok  ' if row['passed'] else 'FAIL'} {name}: "
              + (f"diff {row['max_abs_diff']:.2e} (tol {tol:g}), {row['seconds']:.2f} s"
                 if "max_abs_diff" in row else row.get("error", "")), flush=True)
    js, md = report_paths(a.out)
    meta = dict(device=str(dev), name=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                torch=torch.__version__)
    js.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    lines = [f"GPU check on {meta['name']} (torch {meta['torch']}), each row against the CPU", "",
             "| check | passed | max abs diff | tol | seconds (first call) | error |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['check']} | {'yes' if r['passed'] else '**no**'} | "
                     f"{r.get('max_abs_diff', float('nan')):.2e} | {r['tol']:g} | "
                     f"{r.get('seconds', float('nan')):.2f} | {r.get('error', '')} |")
    md.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    failed = [r["check"] for r in rows if not r["passed"]]
    print(f"{len(rows) - len(failed)}/{len(rows)} passed" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
