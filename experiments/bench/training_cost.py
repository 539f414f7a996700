"""Training cost: time and memory of one HNN training step, by loss and integrator.

    python -m experiments.bench.training_cost [--quick] [--batch 256] [--window 8]

Pendulum, H = p²/2 + (1 − cos q), windows of ``window`` steps of dt = 0.1 from ``batch`` random
initial states (data from yoshida4 at dt/10).  Models: MLPs 2 → 64 → 64 → 1 (tanh), from
``torchgeo_int.nn`` when it is importable (else the minimal ones below, same architecture).
One training step = loss, backward, Adam step.  Configurations:

* ``derivative HNN``: derivative matching (Greydanus et al. 2019) on the window's states, X_H by
  autograd — no integrator;
* ``rollout SeparableHNN verlet``: loss on a ``window``-step Verlet rollout (explicit, FSAL);
* ``rollout HNN implicit_midpoint``: the same through implicit midpoint (fixed point per step,
  implicit-function-theorem backward);
* ``rollout HNN verlet``: generalized leapfrog (Verlet on a non-separable H: two implicit
  half-steps);
* ``neural ODE rk4 backprop`` / ``adjoint``: an MLP vector field 2 → 64 → 64 → 2 through
  torchdiffeq's rk4 at dt, by backpropagation through the solver and by ``odeint_adjoint``.

Time: best of ``--repeats`` steps after a warm-up.  Memory: bytes of tensors saved for backward
(``torch.autograd.graph.saved_tensors_hooks``; deduplicated by storage) during the forward and,
separately, during the backward (the implicit and adjoint backwards build graphs of their own);
on CUDA also ``torch.cuda.max_memory_allocated`` over the step.
Writes results/bench/training_cost.{md,json}.
"""
from __future__ import annotations

import math

import torch
from torch import nn

import torchgeo_int as tgi

from ..cli import number
from . import common

MiB = 2.0 ** 20
DT = 0.1


def pendulum():
    return tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1),
                                    lambda q: (1.0 - torch.cos(q)).sum(-1),
                                    kinetic_grad=lambda p: p, potential_grad=torch.sin)


def make_data(batch, window, device="cpu", dtype=torch.float32, seed=0):
    """Windows q, p of shape (batch, window + 1, 1) and the true derivatives at their states."""
    g = torch.Generator().manual_seed(seed)
    q0 = (2 * torch.rand(batch, 1, generator=g) - 1).to(device, torch.float64)
    p0 = (2 * torch.rand(batch, 1, generator=g) - 1).to(device, torch.float64)
    H = pendulum()
    with torch.no_grad():
        q, p = tgi.rollout(H, q0, p0, h=DT / 10, steps=10 * window, method="yoshida4", save_every=10)
    q, p = q.transpose(0, 1).to(dtype), p.transpose(0, 1).to(dtype)
    return q, p, p.clone(), -torch.sin(q)


# --- models: torchgeo_int.nn when present, else these -------------------------------------------

def _mlp(i, o, width):
    return nn.Sequential(nn.Linear(i, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                         nn.Linear(width, o))


class _HNN(tgi.Hamiltonian):
    def __init__(self, width):
        super().__init__(None, time_dependent=False)
        self.net = _mlp(2, 1, width)

    def hamiltonian(self, q, p, t=0.0):
        return self.net(torch.cat([q, p], -1)).squeeze(-1)


class _SeparableHNN(tgi.SeparableHamiltonian):
    def __init__(self, width):
        T, V = _mlp(1, 1, width), _mlp(1, 1, width)
        super().__init__(lambda p: T(p).squeeze(-1), lambda q: V(q).squeeze(-1), time_dependent=False)
        self.T, self.V = T, V


class _VectorField(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.net = _mlp(2, 2, width)

    def forward(self, t, y):
        return self.net(y)


def models(width):
    """(source, HNN, SeparableHNN, vector field) factories."""
    try:
        from torchgeo_int import nn as tnn

        return ("torchgeo_int.nn", lambda: tnn.HNN(1, width=width, depth=2),
                lambda: tnn.SeparableHNN(1, width=width, depth=2),
                lambda: tnn.MLPVectorField(1, width=width, depth=2))
    except ImportError:
        return ("benchmark MLPs", lambda: _HNN(width), lambda: _SeparableHNN(width),
                lambda: _VectorField(width))


# --- losses ---------------------------------------------------------------------------------------

def rollout_loss(model, method, q, p, compile=False):
    qs, ps = tgi.rollout(model, q[:, 0], p[:, 0], h=DT, steps=q.shape[1] - 1, method=method,
                         compile=compile)
    eq, ep = qs[1:] - q[:, 1:].transpose(0, 1), ps[1:] - p[:, 1:].transpose(0, 1)
    return 0.5 * ((eq * eq).mean() + (ep * ep).mean())


def derivative_loss(model, q, p, dq, dp):
    fq, fp = model.vector_field(q, p, 0.0)
    return 0.5 * (((fq - dq) ** 2).mean() + ((fp - dp) ** 2).mean())


def node_loss(func, q, p, adjoint):
    import torchdiffeq

    y = torch.cat([q, p], -1)                       # (N, k+1, 2)
    t = torch.arange(q.shape[1], dtype=q.dtype, device=q.device) * DT
    solve = torchdiffeq.odeint_adjoint if adjoint else torchdiffeq.odeint
    kw = dict(adjoint_params=tuple(func.parameters())) if adjoint else {}
    ys = solve(func, y[:, 0], t, method="rk4", options=dict(step_size=DT), **kw)
    e = ys[1:] - y[:, 1:].transpose(0, 1)
    return (e * e).mean()          # = ½(mean e_q² + mean e_p²), as the other losses


def configurations(width):
    source, HNN, SepHNN, VF = models(width)
    return source, {
        "derivative HNN": (HNN, lambda m, d: derivative_loss(m, d[0], d[1], d[2], d[3])),
        "derivative SeparableHNN": (SepHNN, lambda m, d: derivative_loss(m, d[0], d[1], d[2], d[3])),
        "rollout SeparableHNN verlet": (SepHNN, lambda m, d: rollout_loss(m, "verlet", d[0], d[1])),
        "rollout HNN implicit_midpoint": (HNN, lambda m, d: rollout_loss(m, "implicit_midpoint", d[0], d[1])),
        "rollout HNN verlet": (HNN, lambda m, d: rollout_loss(m, "verlet", d[0], d[1])),
        "neural ODE rk4 backprop": (VF, lambda m, d: node_loss(m, d[0], d[1], False)),
        "neural ODE rk4 adjoint": (VF, lambda m, d: node_loss(m, d[0], d[1], True)),
    }


class Saved:
    """Bytes of tensors saved for backward while active (unique storages)."""

    def __init__(self):
        self.storages = {}

    def pack(self, t):
        try:
            s = t.untyped_storage()
            self.storages[s.data_ptr()] = s.nbytes()
        except (RuntimeError, NotImplementedError):
            pass
        return t

    def __enter__(self):
        self._h = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self._h.__enter__()
        return self

    def __exit__(self, *exc):
        return self._h.__exit__(*exc)

    @property
    def MiB(self):
        return sum(self.storages.values()) / MiB


def measure(name, make, loss_fn, data, repeats, device):
    torch.manual_seed(0)
    model = make().to(device=device, dtype=data[0].dtype)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(track=False):
        opt.zero_grad(set_to_none=True)
        fwd, bwd = Saved(), Saved()
        if track:
            with fwd:
                loss = loss_fn(model, data)
            with bwd:
                loss.backward()
        else:
            loss = loss_fn(model, data)
            loss.backward()
        opt.step()
        return float(loss.detach()), fwd.MiB, bwd.MiB

    loss0, fwd_mib, bwd_mib = step(track=True)      # warm-up, and the memory measurement
    peak = None
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        common.timed(step, device=device)
        peak = (torch.cuda.max_memory_allocated(device) - base) / MiB
    _, s = common.min_time(step, repeats, device=device)
    return dict(config=name, ms_per_step=1e3 * s, saved_fwd_MiB=fwd_mib, saved_bwd_MiB=bwd_mib,
                cuda_peak_MiB=peak, loss=loss0, finite=math.isfinite(loss0))


def main(argv=None):
    ap = common.parser(__doc__)
    ap.add_argument("--batch", type=number("int", 1), default=None)
    ap.add_argument("--window", type=number("int", 1), default=None)
    ap.add_argument("--width", type=number("int", 1), default=64)
    ap.add_argument("--repeats", type=number("int", 1), default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--configs", nargs="+", default=None)
    args = ap.parse_args(argv)
    out = common.setup(args)
    batch = args.batch if args.batch is not None else (32 if args.quick else 256)
    window = args.window if args.window is not None else (4 if args.quick else 8)
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 5)
    data = make_data(batch, window, device=args.device, dtype=getattr(torch, args.dtype))
    source, confs = configurations(args.width)
    rows = []
    for name in common.progress(list(common.pick(confs, args.configs)), args=args, desc="training cost"):
        make, loss_fn = confs[name]
        rows.append(measure(name, make, loss_fn, data, repeats, args.device))
    # each row against derivative matching of the same model (a SeparableHNN has two networks,
    # twice an HNN's parameters); the neural ODE rows against the HNN's
    ms = {r["config"]: r["ms_per_step"] for r in rows}
    for r in rows:
        ref = "derivative SeparableHNN" if "SeparableHNN" in r["config"] else "derivative HNN"
        r["time_vs_derivative"] = r["ms_per_step"] / ms[ref] if ms.get(ref) else None
    cols = [("config", "configuration"), ("ms_per_step", "ms / training step"),
            ("time_vs_derivative", "× derivative matching, same model"), ("saved_fwd_MiB", "saved in forward MiB"),
            ("saved_bwd_MiB", "saved in backward MiB")]
    if any(r["cuda_peak_MiB"] is not None for r in rows):
        cols.append(("cuda_peak_MiB", "CUDA peak MiB"))
    md = common.markdown_table(rows, cols)
    setup = (f"pendulum, batch {batch} windows × {window} steps of dt = {DT}, {args.dtype}, "
             f"{args.device}, MLP width {args.width} ({source}), Adam; best of {repeats}")
    print(setup + "\n" + md)
    common.write(out, "training_cost", "Training cost per step", [("Setup", setup), ("", md)],
                 dict(setup=setup, rows=rows))
    print(f"wrote {out / 'training_cost.md'}")
    return rows


if __name__ == "__main__":
    main()
