"""odeint against hand loops with the same func evaluations, for comparing source trees.

    python -m experiments.bench.odeint_overhead --trees before=REV after=. \
        [--rounds 3] [--repeats 5] [--grad] [--force norm|pow]

Each tree (a directory holding ``torchgeo_int``, or a git revision:
:func:`experiments.trees.tree`) runs in its own process, the trees alternating
``--rounds`` times, so a shared machine's load falls on all alike; in each process every
configuration runs odeint and its hand loop back to back ``--repeats`` times.  Prints per tree
best odeint / best hand (ms), the ratio of the bests and the median ratio of the pairs, and the
max |Δ| of the outputs (0: the same arithmetic).  Configurations: Kepler, float64, h = 0.01, one
thread; ``tgi.odeint(func, (q0, p0), t=[0, T], method="verlet", options=dict(separable=True,
step_size=h))`` (the limits row, final state) and torchdiffeq's style ``func(t, y)`` on y (B, 4)
with 101 output times, verlet and yoshida4, B = 4096 and 64; the hand loops run the same
kick/drift sequence (FSAL) calling func on the full state.  ``--grad``: grad mode on (nothing
requires grad), else ``torch.no_grad()``; ``--force``: q/‖q‖³ (``norm``, the limits' force) or
q/(q·q)^{3/2} (``pow``).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

import torch

H = 0.01


def worker(repeats, grad, force):
    import torchgeo_int as tgi
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    FORCE, GRAD, R = force, grad, repeats

    def grad_V(q):
        if FORCE == "norm":   # experiments.bench.throughput.grad_V (the limits rows)
            return q / q.norm(dim=-1, keepdim=True) ** 3
        return q / (q * q).sum(-1, keepdim=True) ** 1.5

    def flat_func(t, y):
        q, p = y[..., :2], y[..., 2:]
        return torch.cat([p, -grad_V(q)], -1)

    def tuple_func(t, y):
        q, p = y
        return p, -grad_V(q)

    def init(B):
        g = torch.Generator().manual_seed(0)
        r = 1 + 0.1 * torch.rand(B, 1, generator=g)
        return r * torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]) / r.sqrt()

    def hand_flat(method, q, p, t, n_per):
        """the same func calls as odeint's explicit splitting (FSAL), func on the full state,
        every output time stored"""
        kicks, drifts = tgi.METHODS[method].splitting()
        out = torch.empty(len(t), *q.shape[:-1], 4)
        out[0] = torch.cat([q, p], -1)
        tt = torch.zeros(())
        force = flat_func(tt, torch.cat([q, p], -1))[..., 2:]
        for i in range(1, len(t)):
            for _ in range(n_per):
                for j, b in enumerate(drifts):
                    if j > 0:
                        force = flat_func(tt, torch.cat([q, p], -1))[..., 2:]
                    p = torch.add(p, force, alpha=kicks[j] * H)
                    q = torch.add(q, flat_func(tt, torch.cat([q, p], -1))[..., :2], alpha=b * H)
                force = flat_func(tt, torch.cat([q, p], -1))[..., 2:]
                p = torch.add(p, force, alpha=kicks[-1] * H)
            out[i] = torch.cat([q, p], -1)
        return out

    def ode_flat(method, q, p, t, n_per):
        return tgi.odeint(flat_func, torch.cat([q, p], -1), t, method=method,
                          options=dict(separable=True, step_size=H))

    def hand_tuple(q, p, n):
        t = torch.zeros(())
        dp = tuple_func(t, (q, p))[1]
        for _ in range(n):
            p = torch.add(p, dp, alpha=0.5 * H)
            q = torch.add(q, tuple_func(t, (q, p))[0], alpha=H)
            dp = tuple_func(t, (q, p))[1]
            p = torch.add(p, dp, alpha=0.5 * H)
        return q, p

    def ode_tuple(q, p, n):
        t = torch.tensor([0.0, n * H])
        Q, P = tgi.odeint(tuple_func, (q, p), t, method="verlet", options=dict(separable=True, step_size=H))
        return Q[-1], P[-1]

    def timed(f):
        t0 = time.perf_counter(); out = f(); return out, time.perf_counter() - t0

    confs = {}
    for B in (4096, 64):
        q0, p0 = init(B)
        n = 400 if B == 64 else 200
        confs[f"tuple verlet B={B} {n} steps t=[0,T]"] = (lambda q0=q0, p0=p0, n=n: ode_tuple(q0, p0, n),
                                                lambda q0=q0, p0=p0, n=n: hand_tuple(q0, p0, n))
        for method in ("verlet", "yoshida4"):
            m_out = 101
            n_per = (4 if B == 64 else 1) // (1 if method == "verlet" else 2) or 1
            t = torch.linspace(0, n_per * (m_out - 1) * H, m_out)
            confs[f"flat {method} B={B} {n_per * (m_out - 1)} steps, 101 t"] = (
                lambda method=method, q0=q0, p0=p0, t=t, n_per=n_per: ode_flat(method, q0, p0, t, n_per),
                lambda method=method, q0=q0, p0=p0, t=t, n_per=n_per: hand_flat(method, q0, p0, t, n_per))
    res = {}
    torch.set_grad_enabled(GRAD)   # off: as the limits rows (no_grad)
    for name, (ode, hand) in confs.items():
        a, _ = timed(ode); b, _ = timed(hand)
        A = a if isinstance(a, torch.Tensor) else torch.cat(a, -1)
        Bv = b if isinstance(b, torch.Tensor) else torch.cat(b, -1)
        diff = float((A - Bv).abs().max())
        best = [1e9, 1e9]; ratios = []
        for r in range(R):   # alternating which goes first
            if r % 2:
                b = timed(hand)[1]; a = timed(ode)[1]
            else:
                a = timed(ode)[1]; b = timed(hand)[1]
            best[0] = min(best[0], a); best[1] = min(best[1], b); ratios.append(a / b)
        res[name] = [best[0], best[1], diff, ratios]
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", default=["this=."],
                    help="label=TREE ...: TREE a directory holding torchgeo_int, or a git revision")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--grad", action="store_true")
    ap.add_argument("--force", choices=["norm", "pow"], default="norm")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    # (checked here, not by experiments.cli: the worker runs this file from another tree)
    if args.rounds < 1 or args.repeats < 1:
        ap.error(f"--rounds and --repeats must be at least 1, got {args.rounds}, {args.repeats}")
    if args.worker:
        print(json.dumps(worker(args.repeats, args.grad, args.force)))
        return
    bad = [t for t in args.trees if "=" not in t]
    if bad:
        ap.error(f"--trees takes label=path with path a folder holding torchgeo_int (or label=REV, a "
                 f"git revision), got {bad}")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if root not in sys.path:                  # (run as a script: this checkout's experiments)
        sys.path.insert(0, root)
    from experiments import trees as source_trees
    with contextlib.ExitStack() as stack:
        trees = []
        for label, spec in (t.split("=", 1) for t in args.trees):
            try:
                trees.append((label, stack.enter_context(source_trees.tree(spec))[0]))
            except ValueError as e:
                ap.error(f"--trees {label}={spec}: {e}")
        _compare(args, trees)


def _compare(args, trees):
    """Each tree's best odeint and hand-loop times over the rounds, printed side by side."""
    best = {}
    for _ in range(args.rounds):
        for label, tree in trees:
            tree = os.path.abspath(tree)
            env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1")
            here = os.path.dirname(os.path.abspath(__file__))
            cmd = [sys.executable, os.path.join(here, "odeint_overhead.py"), "--worker",
                   "--repeats", str(args.repeats), "--force", args.force] + (["--grad"] if args.grad else [])
            out = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True,
                                 check=True).stdout
            for name, (o, h, d, rs) in json.loads(out.splitlines()[-1]).items():
                b = best.setdefault((label, name), [1e9, 1e9, d, []])
                b[0], b[1] = min(b[0], o), min(b[1], h)
                b[3].extend(rs)
    names = list(dict.fromkeys(n for _, n in best))
    print(f"{'config':38s} " + " ".join(f"{label:>40s}" for label, _ in trees))
    for n in names:
        cells = []
        for label, _ in trees:
            o, h, d, rs = best[(label, n)]
            med = sorted(rs)[len(rs) // 2]
            cells.append(f"{1e3 * o:6.0f}/{1e3 * h:5.0f}ms x{o / h:5.3f} med x{med:5.3f} d{d:.0e}")
        print(f"{n:38s} " + " ".join(f"{c:>40s}" for c in cells))


if __name__ == "__main__":
    main()
