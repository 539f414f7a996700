"""torchdiffeq master's implicit midpoint (one Broyden solve over the whole batch) vs ours, vs batch size.

    python -m experiments.bench.torchdiffeq_master --torchdiffeq-src /tmp/torchdiffeq_master [--quick]

torchdiffeq's released version (0.2.5, the one in the venv) has no implicit method.  Its master
branch adds fixed-grid implicit Runge–Kutta methods (``implicit_euler``, ``implicit_midpoint``,
``trapezoid``, ``gl4``, ``gl6``, ``radauIIA3``, ``radauIIA5``, ``sdirk2``, ``trbdf2``); their
stage equations are solved by Broyden's method on the whole flattened state (rk_common.py,
``FixedGridFIRKODESolver._step_func``): the Jacobian approximation ``J`` is a dense
(B·n·s)×(B·n·s) matrix for B samples of n numbers and s stages, updated by an outer product and
inverted by ``torch.linalg.solve`` at every iteration — O((B·n)²) memory and O((B·n)³) time per
iteration, where a per-sample solve needs O(B·n).  Master has no symplectic method.

Measured, for a batch of B Kepler orbits (H = |p|²/2 − 1/|q|, eccentricities spread over
[0.5, 0.7], started at pericentre; y = (q, p) flat, n = 4, float64), ``--steps`` steps of
h = 0.01 (100; 10 with --quick), for B = 1, 16, 64, 256, 1024 and ×4 beyond up to
``--max-batch``, each (method, B) in a fresh child process:

* wall time of the solve (one run, no_grad) and the rise of the child's peak RSS (ru_maxrss)
  during it — torch's CPU allocations are invisible to tracemalloc; this is the approach of
  ``experiments.bench.memory``;
* field evaluations per step (Broyden iterations + 1 for master, fixed-point iterations for ours);
* for master, the size of its dense Broyden matrix, (B·n)²·8 bytes;
* the final-state difference between master's and our implicit midpoint (the same equations:
  they agree to the solvers' tolerances — master stops at ‖residual‖₂ < 1e-8 over the whole
  batch, ours per sample at ‖Δ‖∞ ≤ 1e-9·(1 + ‖z‖∞)).

Methods: (i) torchdiffeq master ``odeint(func, y0, t, method="implicit_midpoint",
options=dict(step_size=h))`` on y0 of shape (B, 4); (ii) ours,
``torchgeo_int.odeint(func, y0, t, method="implicit_midpoint", options=dict(step_size=h,
batch_dims=1))`` (per-sample fixed point); (iii) every symplectic-looking name in master's
``SOLVERS`` (none at the commit measured) vs (iv) our ``verlet`` (``separable=True``), the
explicit cost floor.  A method stops growing B after a cell that exceeds ``--cell-timeout`` s
(the child's start included) or its ``--mem-cap-gib`` of address space (RLIMIT_AS above what the
child maps at its start; reported as OOM).

The scratch install: the master branch of torchdiffeq from its repository
(github.com/rtqichen/torchdiffeq), checked out (or its ``torchdiffeq/`` package folder copied)
at a path of your choice, e.g. /tmp/torchdiffeq_master; pass that path.  It is never installed
into the venv nor committed here: only the master children put it first on ``sys.path``, and they
never import torchgeo_int (whose ``odeint`` reads torchdiffeq's SOLVERS at import, and master's
``implicit_midpoint``/``implicit_euler`` names would shadow ours); our children import the
released torchdiffeq.  Without ``--torchdiffeq-src`` only our side runs, and the report says so.
The commit is read from the checkout's git (or pass ``--torchdiffeq-commit``).

Writes results/bench/torchdiffeq_master.{md,json,png}.
"""
from __future__ import annotations

import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEM = "torchdiffeq_master"
N_STATE = 4                      # (q, p) of a planar Kepler orbit
HOW = ("pass --torchdiffeq-src PATH (a checkout of the master branch of "
       "github.com/rtqichen/torchdiffeq; never installed into the venv)")
NOT_RUN = f"torchdiffeq master: not run — {HOW}"          # the run's line on stderr
SYMPLECTIC_WORDS = ("symplectic", "verlet", "leapfrog", "yoshida", "stormer", "ruth", "forest")


# -- the problem: plain torch, so a master child needs neither torchgeo_int nor experiments.* ----
def kepler_batch(batch):
    import torch

    e = 0.6 + 0.1 * torch.linspace(-1.0, 1.0, batch, dtype=torch.float64)
    zero = torch.zeros_like(e)
    return torch.stack([1.0 - e, zero, zero, ((1.0 + e) / (1.0 - e)).sqrt()], -1)   # (B, 4)


class KeplerField:
    """func(t, y) -> dy/dt for y = (q, p) flat on the last dim; counts its calls."""

    def __init__(self):
        self.nfe = 0

    def __call__(self, t, y):
        import torch

        self.nfe += 1
        q, p = y[..., :2], y[..., 2:]
        return torch.cat([p, -q / q.norm(dim=-1, keepdim=True) ** 3], -1)


# -- one cell, in a child ---------------------------------------------------------------------
def child(spec):
    """Run one (side, method, batch) cell and return its measurements (a JSON-able dict)."""
    if spec["side"] == "master":
        sys.path.insert(0, spec["src"])   # before the first import of torchdiffeq in this process
    import torch

    torch.set_num_threads(spec["threads"])
    field = KeplerField()
    y0 = kepler_batch(spec["batch"])
    h, steps = spec["h"], spec["steps"]
    t = torch.tensor([0.0, steps * h], dtype=torch.float64)
    if spec["side"] == "master":
        import torchdiffeq
        from torchdiffeq._impl.odeint import SOLVERS

        where = pathlib.Path(torchdiffeq.__file__).resolve()
        if pathlib.Path(spec["src"]).resolve() not in where.parents:
            raise RuntimeError(f"torchdiffeq imported from {where}, not from {spec['src']}")
        if spec["method"] not in SOLVERS:
            raise RuntimeError(f"{spec['method']!r} is not in this torchdiffeq's SOLVERS "
                               f"({', '.join(SOLVERS)}): not its master branch?")

        def solve():
            return torchdiffeq.odeint(field, y0, t, method=spec["method"], options=dict(step_size=h))
    else:
        import torchgeo_int as tgi

        options = dict(step_size=h, batch_dims=1)   # per-sample solves and convergence tests
        if spec["method"] == "verlet":
            options["separable"] = True             # dq = p, dp = −q/|q|³: the explicit path

        def solve():
            return tgi.odeint(field, y0, t, method=spec["method"], options=options)

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        y = solve()
        seconds = time.perf_counter() - t0
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024     # KiB → MiB
    torch.save(y[-1].clone(), spec["final"])
    return dict(seconds=seconds, rss_mib=rss, evals_per_step=field.nfe / steps,
                not_converged=sum("did not converge" in str(w.message) for w in caught))


def _limit_address_space(cap_gib):
    # The cap is above what the child already maps (torch's import), so it bounds the cell itself.
    size_kib = next(int(line.split()[1]) for line in open("/proc/self/status")
                    if line.startswith("VmSize:"))
    cap = size_kib * 1024 + int(cap_gib * 2 ** 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def run_cell(spec, timeout, cap_gib):
    """One cell in a fresh process (its start counts against ``timeout``): its dict, or one with
    status '> timeout s' / 'OOM'."""
    cmd = [sys.executable, "-m", f"experiments.bench.{STEM}", "--child", json.dumps(spec),
           "--mem-cap-gib", str(cap_gib)]
    env = dict(os.environ, OMP_NUM_THREADS=str(spec["threads"]),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    row = dict(side=spec["side"], method=spec["method"], batch=spec["batch"], seconds=None,
               rss_mib=None, evals_per_step=None, not_converged=None, status="ok")
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(row, status=f"> {timeout:g} s")
    lines = res.stdout.strip().splitlines()
    if res.returncode == 0 and lines:
        return dict(row, **json.loads(lines[-1]))
    if any(w in res.stderr for w in ("can't allocate memory", "MemoryError", "out of memory")) \
            or res.returncode in (-9, 137):
        return dict(row, status=f"OOM (> {cap_gib:g} GiB)")
    raise RuntimeError(f"{STEM} child {spec['side']} {spec['method']} B={spec['batch']} failed "
                       f"({res.returncode}):\n" + "\n".join(res.stderr.strip().splitlines()[-8:]))


def master_probe(src, threads):
    """(SOLVERS names, release version string) of the torchdiffeq at ``src``, from a child."""
    code = (f"import sys; sys.path.insert(0, {str(src)!r}); import json, torchdiffeq; "
            "from torchdiffeq._impl.odeint import SOLVERS; "
            "print(json.dumps([torchdiffeq.__file__, sorted(SOLVERS), torchdiffeq.__version__]))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                         env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    if res.returncode != 0:
        raise SystemExit(f"--torchdiffeq-src {src}: torchdiffeq does not import from there:\n"
                         + "\n".join(res.stderr.strip().splitlines()[-5:]))
    where, names, version = json.loads(res.stdout.strip().splitlines()[-1])
    if pathlib.Path(src).resolve() not in pathlib.Path(where).resolve().parents:
        raise SystemExit(f"--torchdiffeq-src {src}: torchdiffeq was imported from {where} instead")
    if "implicit_midpoint" not in names:
        raise SystemExit(f"--torchdiffeq-src {src}: its SOLVERS has no 'implicit_midpoint' "
                         f"({', '.join(names)}) — not torchdiffeq's master branch?")
    return names, version


def git_commit(src):
    """HEAD of ``src`` when it is the top of a git checkout (not a folder inside another repo)."""
    try:
        res = subprocess.run(["git", "-C", str(src), "rev-parse", "--show-toplevel", "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = res.stdout.split()
    if res.returncode != 0 or len(lines) != 2 or pathlib.Path(lines[0]).resolve() != pathlib.Path(src).resolve():
        return None
    return lines[1]


# -- the parent ---------------------------------------------------------------------------------
def batches(max_batch, given=None):
    if given:
        return sorted(given)
    out = [1, 16, 64, 256, 1024]
    while out[-1] * 4 <= max_batch:
        out.append(out[-1] * 4)
    return [b for b in out if b <= max_batch]


def _cell(r):
    if r["status"] != "ok":
        return r["status"]
    return f"{r['seconds']:.3g} s / {r['rss_mib']:.0f} MiB / {r['evals_per_step']:.1f}"


def report(data):
    rows, Bs = data["rows"], data["batches"]
    configs = list(dict.fromkeys((r["side"], r["method"]) for r in rows))
    label = {("master", m): f"torchdiffeq master `{m}`" for s, m in configs if s == "master"}
    label.update({("ours", m): f"torchgeo_int `{m}`" for s, m in configs if s == "ours"})
    lines = ["| method | " + " | ".join(f"B = {b}" for b in Bs) + " |", "|---|" + "---|" * len(Bs)]
    for c in configs:
        cells = []
        for b in Bs:
            r = next((r for r in rows if (r["side"], r["method"]) == c and r["batch"] == b), None)
            cells.append("—" if r is None else _cell(r))
        lines.append(f"| {label[c]} | " + " | ".join(cells) + " |")
    if any(s == "master" for s, _ in configs):
        lines.append("| master's dense Broyden J, (B·n)²·8 B | "
                     + " | ".join(f"{(b * N_STATE) ** 2 * 8 / 2 ** 20:.3g} MiB" for b in Bs) + " |")
    table = "\n".join(lines)
    head = (f"Kepler, B orbits (n = {N_STATE} numbers each), float64, {data['steps']} steps of "
            f"h = {data['h']:g}, each cell a fresh child process; per cell: wall time / peak RSS "
            f"rise / field evaluations per step (— : not run, B beyond the last cell that fitted "
            f"in {data['cell_timeout']:g} s and {data['mem_cap_gib']:g} GiB).  Timings on a shared "
            f"machine, one run each.")
    sections = [("Setup", head), ("Time, memory, evaluations", table)]
    m = data["torchdiffeq_master"]
    if m is None:
        sections.append(("torchdiffeq master", f"Not run: {HOW}."))     # (the heading names it)
    else:
        diffs = "\n".join(f"| {d['batch']} | {d['max_abs_diff']:.2e} |" for d in data["agreement"])
        sym = (", ".join(m["symplectic"]) if m["symplectic"] else
               "none: no name in its SOLVERS is a symplectic method (checked for "
               + ", ".join(SYMPLECTIC_WORDS) + ")")
        sections += [
            ("torchdiffeq master", f"Source: `{m['src']}`; commit(s): {m['commit']}; version string "
             f"{m['version']!r}.  Its SOLVERS: {', '.join(m['solvers'])}.\n\nSymplectic methods "
             f"of master: {sym}."),
            ("Same equations, same answer", "max |y_master − y_ours| of the final states, "
             "implicit midpoint:\n\n| B | max abs diff |\n|---|---|\n" + diffs)]
        unconverged = [r for r in rows if r["side"] == "master" and r["not_converged"]]
        if unconverged:
            sections.append(("Warnings", "master's 'Functional iteration did not converge': "
                             + ", ".join(f"B = {r['batch']}: {r['not_converged']} steps"
                                         for r in unconverged)))
    return sections


def plot(data, path):
    from . import common

    plt = common.plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    configs = list(dict.fromkeys((r["side"], r["method"]) for r in data["rows"]))
    for side, method in configs:
        rs = [r for r in data["rows"] if (r["side"], r["method"]) == (side, method) and r["status"] == "ok"]
        name = ("torchdiffeq master " if side == "master" else "torchgeo_int ") + method
        style = "s-" if side == "master" else "o-"
        line, = axes[0].loglog([r["batch"] for r in rs], [r["seconds"] for r in rs], style, label=name)
        axes[1].loglog([r["batch"] for r in rs], [max(r["rss_mib"], 0.1) for r in rs], style, label=name)
        for r in data["rows"]:    # the cell that hit the time limit: an x at the limit
            if (r["side"], r["method"]) == (side, method) and r["status"].startswith(">"):
                axes[0].loglog([r["batch"]], [data["cell_timeout"]], "x", color=line.get_color(), ms=10)
    tried = [r["batch"] for r in data["rows"] if r["side"] == "master"]
    if tried:   # up to the first B master did not reach, so the line does not squash the plot
        Bs = [b for b in data["batches"] if b <= 4 * max(tried)]
        axes[1].loglog(Bs, [(b * N_STATE) ** 2 * 8 / 2 ** 20 for b in Bs], "k:",
                       label="master's dense (B·n)² float64 Broyden matrix")
    for ax, ylabel in zip(axes, ["wall time [s]", "peak RSS rise [MiB]"]):
        ax.set_xlabel("batch size B")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title(f"x: the cell ran past {data['cell_timeout']:g} s", fontsize=9)
    fig.suptitle(f"implicit midpoint, Kepler, {data['steps']} steps, float64, one CPU thread")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def child_main(argv):
    """``--child SPEC``: one cell.  Parsed before anything imports torchdiffeq (common.py imports
    torchgeo_int, which imports the released one), so a master child gets master's."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--child", required=True)
    ap.add_argument("--mem-cap-gib", type=float, default=4.0)
    args = ap.parse_args(argv)
    if args.mem_cap_gib > 0:
        _limit_address_space(args.mem_cap_gib)
    print(json.dumps(child(json.loads(args.child))))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--child" in argv:
        return child_main(argv)
    from ..cli import number
    from . import common

    ap = common.parser(__doc__)
    ap.add_argument("--torchdiffeq-src", default=None,
                    help="folder holding torchdiffeq master's torchdiffeq/ package (not installed)")
    ap.add_argument("--torchdiffeq-commit", default=None, help="recorded commit (default: git's)")
    positive = number("real", 0.0, lo_open=True)
    ap.add_argument("--steps", type=number("int", 1), default=None, help="steps per solve (100; --quick 10)")
    ap.add_argument("--h", type=positive, default=0.01)
    ap.add_argument("--batches", type=number("int", 1), nargs="+", default=None, help="instead of the default list")
    ap.add_argument("--max-batch", type=number("int", 1), default=None, help="largest B (2**20; --quick 2**14)")
    ap.add_argument("--cell-timeout", type=positive, default=60.0, help="seconds per cell (default 60)")
    ap.add_argument("--mem-cap-gib", type=positive, default=4.0, help="address space per cell (default 4)")
    args = ap.parse_args(argv)
    out = common.setup(args)
    steps = args.steps if args.steps is not None else (10 if args.quick else 100)
    Bs = batches(args.max_batch if args.max_batch is not None else (2 ** 14 if args.quick else 2 ** 20),
                 args.batches)
    master = None
    if args.torchdiffeq_src is None:
        print(NOT_RUN, file=sys.stderr)
    else:
        src = pathlib.Path(args.torchdiffeq_src).resolve()
        if not (src / "torchdiffeq" / "__init__.py").is_file():
            raise SystemExit(f"--torchdiffeq-src {src}: no torchdiffeq/__init__.py there (pass the "
                             "folder that holds the torchdiffeq package of the master branch)")
        names, version = master_probe(src, args.threads or 1)
        master = dict(src=str(src), solvers=names, version=version,
                      commit=args.torchdiffeq_commit or git_commit(src) or "unknown (not a git checkout)",
                      symplectic=[n for n in names if any(w in n.lower() for w in SYMPLECTIC_WORDS)])
    configs = ([] if master is None else
               [("master", "implicit_midpoint")] + [("master", n) for n in master["symplectic"]])
    configs += [("ours", "implicit_midpoint"), ("ours", "verlet")]

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        jobs = common.progress(configs, args=args, desc=STEM)
        for side, method in jobs:
            for b in Bs:
                spec = dict(side=side, method=method, batch=b, steps=steps, h=args.h,
                            threads=args.threads or 1, final=f"{tmp}/{side}_{method}_{b}.pt",
                            src=None if master is None else master["src"])
                r = run_cell(spec, args.cell_timeout, args.mem_cap_gib)
                rows.append(r)
                print(f"{side:6s} {method:18s} B={b:<8d} {_cell(r)}", flush=True)
                if r["status"] != "ok":
                    break          # larger B only costs more: stop this method here
        agreement = []
        if master is not None:
            import torch

            for r in rows:
                theirs = pathlib.Path(tmp, f"master_implicit_midpoint_{r['batch']}.pt")
                ours = pathlib.Path(tmp, f"ours_implicit_midpoint_{r['batch']}.pt")
                if r["side"] == "ours" and r["method"] == "implicit_midpoint" and theirs.exists() \
                        and ours.exists():
                    d = (torch.load(theirs) - torch.load(ours)).abs().max().item()
                    agreement.append(dict(batch=r["batch"], max_abs_diff=d))
    data = dict(steps=steps, h=args.h, batches=Bs, cell_timeout=args.cell_timeout,
                mem_cap_gib=args.mem_cap_gib, torchdiffeq_master=master, rows=rows,
                agreement=agreement)
    sections = report(data)
    common.write(out, STEM, "torchdiffeq master's implicit midpoint vs torchgeo_int's, vs batch size",
                 sections, data)
    plot(data, out / f"{STEM}.png")
    print((out / f"{STEM}.md").read_text())
    return data


if __name__ == "__main__":
    main()
