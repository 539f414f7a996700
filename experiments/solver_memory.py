"""Memory and time of fixed_point's backward: implicit (IFT adjoint) vs unrolled.

Problem: z = tanh(W z + x) on a batch of B samples of dimension n, W = rho * Q with Q a random
orthogonal matrix and x small, so tanh' ~ 1 near the solution and the iteration contracts at
rate ~rho in every direction. rho = tol**(1/K) makes the solve take about K iterations: that is
how the iteration count is swept (no special solver mode). The adjoint u = g + Jᵀu contracts at
the same rate, so the implicit backward also costs ~K vector-Jacobian products, but keeps only
one application of fn alive: its memory is flat in K, the unrolled one grows linearly.

Measured per (K, mode):
* saved: bytes of tensors saved for backward during the forward (saved_tensors_hooks; sum of
  numel * element_size, and deduplicated by storage), and during the backward itself (the
  implicit mode recomputes fn(z*) once there);
* fwd / bwd wall time; fn applications in the forward, backward passes through fn (VJPs);
* on CUDA, torch.cuda.max_memory_allocated over forward + backward;
* max |grad_W(implicit) - grad_W(unroll)| / max |grad_W(unroll)| as a sanity check.

    python experiments/solver_memory.py [--quick] [--device cpu|cuda] [--batch B] [--dim n]
        [--dtype float32|float64] [--iters K ...] [--threads N]

Defaults: batch 4096 x dim 32 (--quick: 512), float32, K = 10 30 100 300 1000 (--quick:
10 100 1000), one CPU thread (--threads), the GPU when there is one. ~15 s on one CPU core,
~2 s with --quick.  Batch, dim and K must be ≥ 1; --device cuda without CUDA is refused.

Writes results/solver_memory.{md,json} (or --out DIR).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from torchgeo_int.solvers import default_tol, fixed_point

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:        # run as a script: the experiments package is beside it
    sys.path.insert(0, str(ROOT))
from experiments.problems import int_at_least, require_cuda  # noqa: E402

MiB = 2.0 ** 20


class SavedBytes:
    """Counts tensors saved for backward while active."""

    def __init__(self):
        self.total = 0
        self.storages = {}

    def pack(self, t):
        self.total += t.numel() * t.element_size()
        s = t.untyped_storage()
        self.storages[s.data_ptr()] = s.nbytes()
        return t

    @property
    def unique(self):
        return sum(self.storages.values())

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_problem(batch, dim, iters, tol, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=torch.float64))
    rho = tol ** (1.0 / iters)
    W = (rho * q).to(device, dtype).requires_grad_()
    x = (0.01 * torch.randn(batch, dim, generator=g, dtype=torch.float64)).to(device, dtype)
    wts = torch.randn(batch, dim, generator=g, dtype=torch.float64).to(device, dtype)
    return W, x, wts, rho


def run_one(batch, dim, iters, mode, device, dtype):
    tol = default_tol(dtype)
    W, x, wts, rho = make_problem(batch, dim, iters, tol, device, dtype)
    counts = {"fwd": 0, "bwd": 0}

    def count_bwd(grad):
        counts["bwd"] += 1
        return grad

    def fn(z):
        counts["fwd"] += 1
        out = torch.tanh(z @ W.T + x)
        if out.requires_grad:
            out.register_hook(count_bwd)  # fires once per backward pass through this call
        return out

    z0 = torch.zeros(batch, dim, device=device, dtype=dtype)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    fwd_saved, bwd_saved = SavedBytes(), SavedBytes()
    _sync(device)
    t0 = time.perf_counter()
    with fwd_saved.hooks():
        z = fixed_point(fn, z0, backward=mode, max_iter=4 * iters + 200)
        loss = (z * wts).sum()
    _sync(device)
    t1 = time.perf_counter()
    fwd_calls = counts["fwd"]
    with bwd_saved.hooks():
        (grad,) = torch.autograd.grad(loss, W)
    _sync(device)
    t2 = time.perf_counter()
    row = dict(target_iters=iters, rho=rho, mode=mode, fwd_fn_calls=fwd_calls,
               bwd_vjps=counts["bwd"], saved_fwd_MiB=fwd_saved.total / MiB,
               saved_fwd_unique_MiB=fwd_saved.unique / MiB, saved_bwd_MiB=bwd_saved.total / MiB,
               fwd_s=t1 - t0, bwd_s=t2 - t1)
    if device.type == "cuda":
        row["cuda_peak_MiB"] = (torch.cuda.max_memory_allocated(device) - base) / MiB
    del z, loss
    return row, grad



def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller batch, fewer sizes")
    ap.add_argument("--device", choices=["cpu", "cuda"],
                    default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int_at_least(1), default=None)
    ap.add_argument("--dim", type=int_at_least(1), default=32)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--iters", type=int_at_least(1), nargs="+", default=None,
                    help="target iteration counts K (each >= 1)")
    ap.add_argument("--threads", type=int_at_least(0), default=1,
                    help="torch CPU threads (default 1, for stable timings; 0 keeps torch's)")
    ap.add_argument("--out", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    require_cuda(ap, args.device)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if device.type == "cpu" and args.threads:
        # Intra-op threads only add OpenMP barriers at this size, and on a shared or busy
        # machine a descheduled worker makes an iteration 10-100x slower: timings go erratic.
        torch.set_num_threads(args.threads)
    batch = args.batch if args.batch is not None else (512 if args.quick else 4096)
    iters_list = args.iters or ([10, 100, 1000] if args.quick else [10, 30, 100, 300, 1000])

    for mode in ("implicit", "unroll"):  # warm-up: first-call allocator and dispatch costs
        run_one(batch, args.dim, iters_list[0], mode, device, dtype)
    rows = []
    for iters in iters_list:
        grads = {}
        for mode in ("implicit", "unroll"):
            row, grads[mode] = run_one(batch, args.dim, iters, mode, device, dtype)
            rows.append(row)
        ref = grads["unroll"].abs().max()
        diff = ((grads["implicit"] - grads["unroll"]).abs().max() / ref).item()
        for r in rows[-2:]:
            r["grad_rel_diff"] = diff

    cuda = device.type == "cuda"
    head = ["K", "mode", "fwd iters", "bwd VJPs", "saved fwd MiB", "unique MiB",
            "saved in bwd MiB", "fwd s", "bwd s"] + (["CUDA peak MiB"] if cuda else []) + \
           ["grad rel diff"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["target_iters"], r["mode"], r["fwd_fn_calls"], r["bwd_vjps"],
                 f"{r['saved_fwd_MiB']:.2f}", f"{r['saved_fwd_unique_MiB']:.2f}",
                 f"{r['saved_bwd_MiB']:.2f}", f"{r['fwd_s']:.3f}", f"{r['bwd_s']:.3f}"]
        cells += [f"{r['cuda_peak_MiB']:.1f}"] if cuda else []
        cells += [f"{r['grad_rel_diff']:.1e}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    setup = (f"z = tanh(Wz + x), batch {batch} x dim {args.dim}, {args.dtype}, {device}, "
             f"tol {default_tol(dtype):.2e}, torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads, {platform.machine()}")
    table = "\n".join(lines)
    print(setup)
    print(table)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "solver_memory.md").write_text(
        "# fixed_point backward memory: implicit vs unroll\n\n" + setup + "\n\n"
        "K: target iteration count (W = rho Q, rho = tol^(1/K)). fwd iters: fn applications in "
        "the forward (implicit: + 1 with graph). bwd VJPs: backward passes through fn. saved: "
        "tensors saved for backward (sum of numel*element_size; unique: by storage).\n\n"
        + table + "\n")
    (out / "solver_memory.json").write_text(json.dumps(
        dict(setup=setup, batch=batch, dim=args.dim, dtype=args.dtype, device=str(device),
             rows=rows), indent=2))
    print(f"wrote {out / 'solver_memory.md'} and {out / 'solver_memory.json'}")
    return rows


if __name__ == "__main__":
    main()
