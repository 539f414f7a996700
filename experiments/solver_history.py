"""Time per step of an implicit rollout under grad: the state passed to the solver as ``args``
(what the library does) vs captured in the solver's closure (what it did before).

    python experiments/solver_history.py [--quick] [--steps 100 200 400] [--batch 8] [--out results]

A non-separable ``tgi.nn.HNN`` H_θ(q, p) (4→16→1 tanh, orthogonal init, float64), implicit midpoint with
Newton's method and with fixed-point iteration, rolled out under grad from q₀ that requires
grad, then one backward.  With the state captured, every Newton Jacobian (forward) and every
adjoint iteration (backward) differentiates w.r.t. fresh leaves an output whose graph reaches
the whole rollout, which autograd then walks: step k costs O(k), the rollout O(steps²).
Passed as ``args`` the solver detaches it where only ∂/∂z is needed.  Prints a table and
writes ``<out>/solver_history.{md,json}`` (``--out``, default the repository's ``results/``).
Step counts and the batch must be ≥ 1.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import torchgeo_int as tgi
from torchgeo_int.solvers import fixed_point, newton

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:        # run as a script: the experiments package is beside it
    sys.path.insert(0, str(ROOT))
from experiments.problems import int_at_least  # noqa: E402


class CapturedMidpoint(tgi.Integrator):
    """Implicit midpoint whose stage equation captures (q, p) in a closure: the same map and
    gradients as METHODS['implicit_midpoint'], the solver's calls walking the history."""

    symmetric, order = True, 2

    def __init__(self, solver):
        self.solver, self.name = solver, f"captured_{solver}"

    def step(self, system, q, p, t, h, cache=None):
        def stage(k):
            return system.vector_field(q + 0.5 * h * k[0], p + 0.5 * h * k[1], t + 0.5 * h)

        with torch.no_grad():
            k0 = system.vector_field(q, p, t)
        if self.solver == "newton":
            k = newton(lambda k_: tuple(a - b for a, b in zip(k_, stage(k_))), k0)
        else:
            k = fixed_point(stage, k0)
        return q + h * k[0], p + h * k[1], None


def methods():
    def midpoint(solver):
        return tgi.CotangentLiftIntegrator(tgi.AlphaMap(0.5), solver=solver)
    return {f"{s} args": midpoint(s) for s in ("newton", "fixed_point")} | \
        {f"{s} captured": CapturedMidpoint(s) for s in ("newton", "fixed_point")}


def measure(method, steps, batch):
    torch.manual_seed(0)
    system = tgi.nn.HNN(2, width=16, depth=1).double()
    q0 = torch.randn(batch, 2, dtype=torch.float64, requires_grad=True)
    p0 = torch.randn(batch, 2, dtype=torch.float64)
    t0 = time.perf_counter()
    q, p = tgi.rollout(system, q0, p0, h=0.05, steps=steps, method=method, save_every=steps)
    t1 = time.perf_counter()
    ((q[-1] ** 2).sum() + (p[-1] ** 2).sum()).backward()
    t2 = time.perf_counter()
    return dict(steps=steps, forward_s=t1 - t0, backward_s=t2 - t1,
                grad_q0=q0.grad.detach().clone())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="steps 25 50")
    ap.add_argument("--steps", type=int_at_least(1), nargs="+", help="step counts (default 100 200 400)")
    ap.add_argument("--batch", type=int_at_least(1), default=8)
    ap.add_argument("--out", default=str(ROOT / "results"), help="output folder (default: results/)")
    args = ap.parse_args(argv)
    steps_list = args.steps or ([25, 50] if args.quick else [100, 200, 400])
    torch.set_num_threads(1)
    rows, grads = [], {}
    for name, method in methods().items():
        measure(method, 3, args.batch)   # warm-up: a method's first calls pay for setup
        for n in steps_list:
            r = measure(method, n, args.batch)
            grads[(name.split()[0], n, name.split()[1])] = r.pop("grad_q0")
            rows.append(dict(method=name, **r))
            print(f"{name:22s} {n:5d} steps: forward {r['forward_s']:.2f} s, "
                  f"backward {r['backward_s']:.2f} s", flush=True)
    # same map, same gradients: only the cost differs
    agree = max(float((grads[(s, n, "args")] - grads[(s, n, "captured")]).abs().max()
                      / grads[(s, n, "args")].abs().max())
                for s in ("newton", "fixed_point") for n in steps_list)
    lines = [f"Implicit midpoint under grad, batch {args.batch}, float64, one thread: seconds "
             "forward / backward (state as the solver's args vs captured in its closure)", "",
             "| method | " + " | ".join(f"{n} steps" for n in steps_list) + " |",
             "|---|" + "---|" * len(steps_list)]
    for name in methods():
        cells = [f"{r['forward_s']:.2f} / {r['backward_s']:.2f}" for r in rows if r["method"] == name]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", f"Gradients of the two forms agree to {agree:.1e} (relative)."]
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "solver_history.md").write_text(text + "\n")
    (out / "solver_history.json").write_text(json.dumps(dict(rows=rows, grad_agreement=agree,
                                                             batch=args.batch), indent=1))
    return rows, agree


if __name__ == "__main__":
    main()
