"""Throughput: steps·trajectories per second vs batch size, ours against the eager-torch limit.

    python -m experiments.bench.throughput [--quick] [--batches 1 64 4096 65536] [--profile]

Kepler (e = 0.6, each trajectory's eccentricity perturbed by a few %), h = 0.01, float64, one
CPU thread, no autograd.  For each batch size, every configuration runs side by side in rounds
(best of ``--repeats``, more rounds — up to 30, about 0.3 s of each configuration — when the
runs are short), so the ratios compare runs of the same moment of a shared machine:

* ``hand_verlet`` / ``hand_yoshida4``: a hand-written FSAL kick–drift loop with the same
  closed-form force (torch.add with alpha: one kernel per kick and per drift) — the eager limit;
* ``verlet`` / ``yoshida4``: ``tgi.rollout(..., save_every=steps)`` (endpoints only, as the
  hand loop keeps), eager; ``+compile``: ``rollout(compile=True)`` (compiled K-step macro
  steps); ``(save all)``: every state kept (save_every = 1: compiled lookahead blocks), against
  the eager rollout that keeps every state;
* ``hand_midpoint``: implicit midpoint as a plain fixed-point loop (warm start from the last
  stage derivative, convergence checked every 4 iterations at the same tolerance), against
  ``implicit_midpoint`` (eager; and +compile: compiled vector field);
* ``torchdiffeq_rk4``: torchdiffeq's rk4 with the same number of steps (4 evaluations a step);
* only when named in ``--configs`` (the GPU table's rows): ``hand_verlet+compile``, the hand
  Verlet loop passed to ``torch.compile`` in blocks of 16 steps (the limit on a GPU; on the
  CPU it is numba's, ``bench.limits``), and ``verlet(energies)`` / ``verlet+compile(energies)``,
  Kepler given by its energies (forces by autograd).

Also counts the aten kernels per step of each eager configuration (a deterministic measure of
the per-step overhead) and, with ``--profile``, prints a cProfile of the eager rollouts at
batch 1.  Writes results/bench/throughput.{md,json,png}.
"""
from __future__ import annotations

import contextlib
import math
import time

import torch

import torchgeo_int as tgi

from ..cli import number
from . import common
from .common import pick

H = 0.01
BATCHES = [1, 64, 4096, 65536]
QUICK_BATCHES = [1, 256]


def kepler_batch(batch, dtype=torch.float64, device="cpu", e=0.6, seed=0):
    """The Kepler problem with ``batch`` trajectories of eccentricity e·(1 ± 2 %)."""
    problem = common.kepler(e, dtype=dtype, device=device)
    g = torch.Generator().manual_seed(seed)
    es = e * (1.0 + 0.04 * (torch.rand(batch, generator=g, dtype=torch.float64) - 0.5))
    es = es.to(device=device, dtype=dtype)
    q0 = torch.stack([1.0 - es, torch.zeros_like(es)], -1)
    p0 = torch.stack([torch.zeros_like(es), ((1.0 + es) / (1.0 - es)).sqrt()], -1)
    return problem.system, q0, p0


def grad_V(q):
    """∂V/∂q of Kepler (the same closed form as the system's potential_grad)."""
    return q / q.norm(dim=-1, keepdim=True) ** 3


def energy_kepler(mass=False):
    """Kepler given by its energies only: ∂T/∂p and ∂V/∂q come from autograd; with ``mass``
    T = ½|p|² is declared as ``mass=1`` (∂T/∂p = p in closed form, ∂V/∂q by autograd)."""
    V = lambda q: -1.0 / q.norm(dim=-1)  # noqa: E731
    if mass:
        return tgi.SeparableHamiltonian(None, V, mass=1.0)
    return tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), V)


def splitting_coefficients(name):
    """(kicks, drifts) of a palindromic composition of Verlet, from the coefficient table
    itself: drifts γ_i, kicks (γ_{i−1} + γ_i)/2 with γ_0 = γ_{s+1} = 0."""
    g = [1.0] if name == "verlet" else list(tgi.TABLES[name].gammas)
    kicks = [0.5 * (a + b) for a, b in zip([0.0] + g, g + [0.0])]
    return kicks, g


def hand_splitting(name):
    kicks, drifts = splitting_coefficients(name)

    def run(q, p, steps, h):
        g = grad_V(q)
        for _ in range(steps):
            for a, b in zip(kicks, drifts):
                p = torch.add(p, g, alpha=-a * h)
                q = torch.add(q, p, alpha=b * h)
                g = grad_V(q)
            p = torch.add(p, g, alpha=-kicks[-1] * h)
        return q, p
    return run


def compiled_hand_verlet(h, block=16):
    """The hand Verlet loop of ``block`` steps passed to ``torch.compile`` (inductor's defaults),
    called steps/block times: the practical limit on a GPU, where inductor fuses its steps (on
    the H200 at 10⁷ it ran below one read and one write of the state a step); on the CPU the
    limit is numba's (``bench.limits``)."""
    loop = hand_splitting("verlet")
    compiled = torch.compile(lambda q, p: loop(q, p, block, h))

    def run(q, p, steps):
        for _ in range(steps // block):
            q, p = compiled(q, p)
        return loop(q, p, steps % block, h)
    return run


def hand_midpoint(q, p, steps, h, tol=None, check_every=4, max_iter=100):
    """k = X_H(q + h/2 k_q, p + h/2 k_p) by fixed point, then (q, p) += h k."""
    tol = tol or tgi.default_tol(q.dtype)
    kq, kp = p, -grad_V(q)
    for _ in range(steps):
        for it in range(1, max_iter + 1):
            pm = torch.add(p, kp, alpha=0.5 * h)
            nq, nkp = pm, -grad_V(torch.add(q, kq, alpha=0.5 * h))
            if it % check_every == 0:
                r = torch.maximum((nq - kq).abs().amax(-1) / (1 + kq.abs().amax(-1)),
                                  (nkp - kp).abs().amax(-1) / (1 + kp.abs().amax(-1)))
                kq, kp = nq, nkp
                if bool(r.max() <= tol):
                    break
            else:
                kq, kp = nq, nkp
        else:
            raise tgi.ConvergenceError("hand_midpoint did not converge", iterations=max_iter,
                                       residual=float("nan"), tol=tol)
        q, p = torch.add(q, kq, alpha=h), torch.add(p, kp, alpha=h)
    return q, p


def configurations(system, names, device):
    """name -> (kind, callable(q0, p0, steps) -> (q, p)); kinds: 'eager', 'compiled'."""
    out = {}

    def ours(method, compile=False, save_all=False, sys=system):
        def run(q0, p0, steps):
            q, p = tgi.rollout(sys, q0, p0, h=H, steps=steps, method=method,
                               save_every=1 if save_all else steps, compile=compile)
            return q[-1], p[-1]
        return run

    for name in ("verlet", "yoshida4"):
        out[f"hand_{name}"] = ("eager", lambda q, p, n, f=hand_splitting(name): f(q, p, n, H))
        out[name] = ("eager", ours(name))
        out[f"{name}+compile"] = ("compiled", ours(name, compile=True))
    asked = set(names or ())   # the GPU table's extra rows, when asked for
    if "hand_verlet+compile" in asked:
        out["hand_verlet+compile"] = ("compiled", compiled_hand_verlet(H))
    if asked & {"verlet(energies)", "verlet+compile(energies)"}:
        energies = energy_kepler()
        out["verlet(energies)"] = ("eager", ours("verlet", sys=energies))
        out["verlet+compile(energies)"] = ("compiled", ours("verlet", compile=True, sys=energies))
    out["verlet(save all)"] = ("eager", ours("verlet", save_all=True))
    out["verlet+compile(save all)"] = ("compiled", ours("verlet", compile=True, save_all=True))
    out["hand_midpoint"] = ("eager", lambda q, p, n: hand_midpoint(q, p, n, H))
    out["implicit_midpoint"] = ("eager", ours("implicit_midpoint"))
    out["implicit_midpoint+compile"] = ("compiled", ours("implicit_midpoint", compile=True))

    def rk4(q0, p0, steps):
        (q, p), _ = common.torchdiffeq_solve(system, q0, p0, steps * H, "rk4", shape=(2,), h=H)
        return q, p
    out["torchdiffeq_rk4"] = ("eager", rk4)
    return pick(out, names)


# Ratios reported: (numerator, denominator, goal)
RATIOS = [
    ("verlet", "hand_verlet", 1.1), ("verlet+compile", "hand_verlet", 1.0),
    ("verlet+compile(save all)", "verlet(save all)", None),
    ("verlet+compile", "hand_verlet+compile", None),
    ("verlet(energies)", "verlet", 1.5), ("verlet+compile(energies)", "verlet+compile", 1.5),
    ("verlet+compile(save all)", "hand_verlet+compile", None),
    ("yoshida4", "hand_yoshida4", 1.1), ("yoshida4+compile", "hand_yoshida4", 1.0),
    ("implicit_midpoint", "hand_midpoint", 1.3), ("implicit_midpoint+compile", "hand_midpoint", None),
    ("torchdiffeq_rk4", "hand_verlet", None),
]


def hand_of(name):
    """The hand loop of a configuration's method (``yoshida4+compile`` → ``hand_yoshida4``)."""
    base = name.split("+")[0].split("(")[0]
    if base.startswith("hand_"):
        return base
    return {"verlet": "hand_verlet", "yoshida4": "hand_yoshida4",
            "implicit_midpoint": "hand_midpoint"}.get(base)


def steps_for(batch, quick):
    """Enough steps for ~0.1–0.5 s per run, at least 64 (blocks of 16 fit)."""
    work = 2e5 if quick else 2e6
    return int(max(64, min(2048 if not quick else 256, 16 * round(work / batch / 16))))


class KernelCount:
    """Counts aten kernels dispatched (each one launch; a deterministic per-step overhead)."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counter.n += 1
                return func(*args, **(kwargs or {}))

        self.n, self.mode = 0, Mode()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


def kernels_per_step(fn, q0, p0, steps=(20, 40)):
    """Kernels per step from the difference of two step counts (set-up costs cancel)."""
    counts = []
    for n in steps:
        with torch.no_grad(), KernelCount() as k:
            fn(q0, p0, n)
        counts.append(k.n)
    return (counts[1] - counts[0]) / (steps[1] - steps[0])


def measure(batch, args, device="cpu", dtype=torch.float64, names=None, repeats=None, system=None):
    """One batch size: rows of (config, seconds, throughput, compile s, kernels per step, CUDA
    peak memory).  ``system``: share one Kepler system across batch sizes (fewer compiles: the
    second batch size makes the compiled graphs shape-dynamic); default: a fresh one (static)."""
    fresh, q0, p0 = kepler_batch(batch, dtype=dtype, device=device)
    system = system or fresh
    steps = args.steps or steps_for(batch, args.quick)
    confs = configurations(system, names, device)
    repeats = repeats or args.repeats
    rows = {name: dict(config=name, batch=batch, steps=steps, kind=kind) for name, (kind, _) in confs.items()}
    finals = {}
    with torch.no_grad(), warnings_off():
        for name, (kind, fn) in confs.items():   # warm-up (and compile) outside the timings
            (q, p), s = common.timed(lambda: fn(q0, p0, steps), device=device)
            rows[name]["first_call_s"] = s
            finals[name] = (q, p)
            # against the hand loop of the same method (the pair whose ratio is reported), so a
            # disagreement within a pair shows; a method without one against the first row
            ref = finals.get(hand_of(name), next(iter(finals.values())))
            rows[name]["max_diff_vs_first"] = float(torch.maximum((q - ref[0]).abs().max(),
                                                                  (p - ref[1]).abs().max()))
            if kind == "eager" and torch.device(device).type == "cpu" and batch <= 64:
                rows[name]["kernels_per_step"] = kernels_per_step(fn, q0, p0)
            if torch.device(device).type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
                common.timed(lambda: fn(q0, p0, steps), device=device)
                rows[name]["cuda_peak_MiB"] = (torch.cuda.max_memory_allocated(device) - base) / 2 ** 20
        # Short runs (small batches: ~10 µs steps) are noisier: more rounds, ~0.3 s of each.
        shortest = min(r["first_call_s"] for r in rows.values())
        rounds = min(30, max(repeats, math.ceil(0.3 / max(shortest, 1e-3))))
        best = {name: math.inf for name in confs}
        for _ in range(rounds):
            for name, (kind, fn) in confs.items():
                _, s = common.timed(lambda: fn(q0, p0, steps), device=device)
                best[name] = min(best[name], s)
    for name, r in rows.items():
        r["seconds"] = best[name]
        r["rounds"] = rounds
        r["us_per_step"] = 1e6 * best[name] / steps
        r["throughput"] = batch * steps / best[name]
    return list(rows.values())


@contextlib.contextmanager
def warnings_off():
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="compile=True")
        yield


def ratio_rows(rows):
    by = {(r["batch"], r["config"]): r for r in rows}
    out = []
    for batch in sorted({r["batch"] for r in rows}):
        for num, den, goal in RATIOS:
            a, b = by.get((batch, num)), by.get((batch, den))
            if a and b:
                x = a["seconds"] / b["seconds"]
                out.append(dict(batch=batch, ratio=f"{num} / {den}", value=x,
                                goal=goal, meets=("—" if goal is None else ("yes" if x <= goal else "NO"))))
    return out


def profile_eager(args):
    """cProfile of 2000 eager steps at batch 1: where the Python time of a step goes."""
    import cProfile
    import io
    import pstats

    system, q0, p0 = kepler_batch(1)
    confs = configurations(system, ["verlet", "hand_verlet", "implicit_midpoint", "hand_midpoint"], "cpu")
    text = []
    for name, (_, fn) in confs.items():
        with torch.no_grad():
            fn(q0, p0, 64)
            pr = cProfile.Profile()
            pr.enable()
            fn(q0, p0, 2000 if "midpoint" not in name else 500)
            pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14)
        text.append(f"### {name}\n\n```\n{s.getvalue().strip()}\n```\n")
    return "\n".join(text)


def plot(rows, path, title):
    plt = common.plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    cmap = plt.get_cmap("tab20")
    for i, name in enumerate(dict.fromkeys(r["config"] for r in rows)):
        pts = sorted((r["batch"], r["throughput"]) for r in rows if r["config"] == name)
        style = "--" if "hand" in name else (":" if "torchdiffeq" in name else "-")
        ax.loglog(*zip(*pts), style, marker="o", ms=3, label=name, color=cmap(i % 20))
    ax.set_xlabel("batch (trajectories)")
    ax.set_ylabel("steps · trajectories / s")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


COLUMNS = [("batch", "batch"), ("config", "configuration"), ("steps", "steps"), ("rounds", "rounds"),
           ("us_per_step", "µs / step"), ("throughput", "steps·traj / s"),
           ("kernels_per_step", "kernels / step"), ("first_call_s", "first call s (compile)"),
           ("max_diff_vs_first", "max |Δ| vs its method's hand loop (else the first row)")]


def add_arguments(ap):
    ap.add_argument("--batches", type=number("int", 1), nargs="+", default=None)
    ap.add_argument("--configs", nargs="+", default=None, help="a subset of the configurations")
    ap.add_argument("--steps", type=number("int", 1), default=None, help="steps per run (default: by batch)")
    ap.add_argument("--repeats", type=number("int", 1), default=None)
    return ap


def main(argv=None):
    ap = add_arguments(common.parser(__doc__))
    ap.add_argument("--profile", action="store_true", help="cProfile the eager rollouts (batch 1)")
    args = ap.parse_args(argv)
    out = common.setup(args)
    args.repeats = args.repeats or (2 if args.quick else 7)
    batches = args.batches or (QUICK_BATCHES if args.quick else BATCHES)
    rows = []
    t0 = time.perf_counter()
    for b in common.progress(batches, args=args, desc="throughput"):
        rows += measure(b, args, names=args.configs)
    ratios = ratio_rows(rows)
    md = common.markdown_table(rows, COLUMNS)
    md_r = common.markdown_table(ratios, [("batch", "batch"), ("ratio", "time ratio"),
                                          ("value", "value"), ("goal", "goal ≤"), ("meets", "meets")])
    print(md + "\n\n" + md_r)
    sections = [("Setup", f"Kepler e = 0.6 (±2 %), h = {H}, float64, CPU, no autograd; best of "
                          f"{args.repeats} to 30 side-by-side rounds (column rounds); {time.perf_counter() - t0:.0f} s in all. "
                          "max |Δ| vs hand: max difference of the final state from the first "
                          "configuration's (hand_verlet): second-order vs fourth-order methods "
                          "differ by their error, the same method only by round-off."),
                ("Throughput", md + "\n\n![throughput](throughput.png)"), ("Ratios", md_r)]
    if args.profile:
        prof = profile_eager(args)
        print(prof)
        sections.append(("Profile (cProfile, batch 1, eager)", prof))
    plot(rows, out / "throughput.png", f"Kepler, float64, CPU ({torch.get_num_threads()} thread)")
    common.write(out, "throughput", "Throughput", sections, dict(rows=rows, ratios=ratios))
    print(f"wrote {out / 'throughput.md'}")
    return rows


if __name__ == "__main__":
    main()
