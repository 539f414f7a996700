r"""Scaling out with ``torch.distributed``: data-parallel training glue and sharded rollouts.

Training (``fit`` of :mod:`torchgeo_int.nn.training` runs unchanged under ``torchrun``):

* :func:`init_from_env`      ``init_process_group`` from torchrun's env (RANK, WORLD_SIZE,
  LOCAL_RANK, MASTER_ADDR/PORT); gloo on CPU, nccl on GPU; a no-op single process without it
* :class:`Objective` / :func:`wrap`   the loss as the model's ``forward``, wrapped in
  ``DistributedDataParallel``.  DDP synchronises gradients only through ``forward``, while the
  losses of :mod:`torchgeo_int.nn.losses` call ``model.vector_field`` / ``hamiltonian``; the
  objective makes the loss the forward.  Its ``state_dict`` is the model's, so checkpoints are
  interchangeable with single-process ones.
* :class:`ShardedSampler` / :func:`distributed_loader`   a ``DistributedSampler`` whose global
  batches are exactly those of :class:`~torchgeo_int.nn.training.TensorBatches` (same seed, same
  per-epoch permutation, ragged tail dropped); rank r gets every W-th sample of each global
  batch.  With per-rank mean losses and DDP's gradient average,
  (1/W) Σ_r (1/b) Σ_{i∈r} ∇ℓ_i = (1/B) Σ_i ∇ℓ_i: the step of single-process training on the
  global batch B = W b, up to floating-point reduction order.
* :func:`reduce_history`     the global-batch loss per step (the mean of the ranks' losses).

Rollouts:

* :func:`sharded_rollout`    split a batch of initial conditions over the ranks, roll out each
  shard with :func:`torchgeo_int.rollout`, and reduce energy-error statistics (optionally
  gather the trajectories) on rank 0.

Size: process-group set-up, the sharded sampler/loader and the sharded rollout are the
scale-out layer as one unit; they call ``rollout`` only.
"""
from __future__ import annotations

import gc
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, TensorDataset

from .nn.training import collective_device, epoch_order, is_main_process, mean_over_ranks
from .rollout import as_system, rollout

Tensor = torch.Tensor


# ----------------------------------------------------------------------------- process group

@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None      # None: a single process without a process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    return dist.get_rank() if is_initialized() else 0


def get_world_size() -> int:
    return dist.get_world_size() if is_initialized() else 1


def init_from_env(backend: str | None = None, *, device: str | None = None,
                  timeout_s: float = 300.0) -> DistInfo:
    """Join the process group described by torchrun's environment variables.

    Without ``WORLD_SIZE`` in the environment (plain ``python``) nothing is initialised and a
    single-process :class:`DistInfo` is returned, so one script serves both.  ``backend``
    defaults to nccl when CUDA is available (each process takes GPU ``LOCAL_RANK``), else gloo;
    ``device="cpu"`` forces gloo on the CPU.  ``timeout_s`` bounds every collective, so a
    crashed peer ends the others instead of hanging them."""
    if device not in (None, "cpu", "cuda"):
        raise ValueError(f"device must be None, 'cpu' or 'cuda', got {device!r}")
    use_cuda = torch.cuda.is_available() if device is None else device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' but CUDA is not available")
    if backend is None:
        backend = "nccl" if use_cuda else "gloo"
    if backend not in ("gloo", "nccl", "mpi"):
        raise ValueError(f"unknown backend {backend!r}; known: gloo, nccl, mpi")
    if backend == "nccl" and not use_cuda:
        raise ValueError("the nccl backend needs CUDA devices; use gloo on the CPU")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, dev, dist.get_backend())
    if "WORLD_SIZE" not in os.environ:
        return DistInfo(0, 1, 0, dev, None)
    for var in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise RuntimeError(f"WORLD_SIZE is set but {var} is not: launch with torchrun")
    from datetime import timedelta
    kwargs = dict(backend=backend, timeout=timedelta(seconds=timeout_s))
    if backend == "nccl":
        kwargs["device_id"] = dev
    dist.init_process_group(**kwargs)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, dev, backend)


def cleanup() -> None:
    """Leave the process group (if any).

    Drop the module :func:`wrap` returned first (``module = None``): a
    ``DistributedDataParallel`` still alive when the group is destroyed is torn down at
    interpreter exit, and with gloo that aborted a rank now and then (SIGABRT, "terminate called
    without an active exception": 5 of 77 two-rank runs of tests/test_distributed.py's worker,
    0 of 80 with the module dropped).  The collection here destroys dropped DDP objects that sit
    in reference cycles while the group still exists."""
    if is_initialized():
        gc.collect()
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- training glue

class Objective(nn.Module):
    r"""``forward(*batch) = loss_fn(model, *batch)``, the loss as a forward for DDP.

    ``state_dict`` / ``load_state_dict`` are the model's (no ``model.`` prefix), so a
    checkpoint written through ``DDP(Objective(model, ...))`` loads into the bare model.
    ``device``: batches are moved there first (data loaders yield CPU tensors)."""

    def __init__(self, model: nn.Module, loss_fn: Callable[..., Tensor], *, device=None):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if not callable(loss_fn):
            raise TypeError("loss_fn must be callable as loss_fn(model, *batch)")
        self.model = model
        self.loss_fn = loss_fn
        self.device = None if device is None else torch.device(device)

    def forward(self, *batch):
        if self.device is not None:
            batch = _to_device(batch, self.device)
        return self.loss_fn(self.model, *batch)

    def state_dict(self, *args, **kwargs):
        return self.model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)


def _call(module, *batch):
    return module(*batch)


def _to_device(batch, device):
    """The batch's tensors moved to ``device`` (data loaders yield CPU tensors)."""
    return tuple(b.to(device, non_blocking=True) if isinstance(b, Tensor) else b for b in batch)


class _OnDevice:
    """``loss_fn(model, *batch)`` with the batch's tensors moved to ``device`` first."""

    def __init__(self, loss_fn, device):
        self.loss_fn, self.device = loss_fn, device

    def __call__(self, model, *batch):
        return self.loss_fn(model, *_to_device(batch, self.device))


def wrap(model: nn.Module, loss_fn: Callable[..., Tensor], *, device=None,
         **ddp_options) -> tuple[nn.Module, Callable[..., Tensor]]:
    """``(module, loss)`` to hand to ``fit(module, loss, loader, ...)``.

    In a process group of more than one process, ``module`` is
    ``DistributedDataParallel(Objective(model, loss_fn))`` (``device_ids=[device]`` on CUDA;
    ``ddp_options`` go to DDP) and ``loss(module, *batch)`` calls it; otherwise the model is
    returned as it is, with ``loss_fn`` itself on the CPU and, on another device (``device``,
    else the model's), a loss that moves the batch there first, as DDP does.  The parameters
    are those of ``model`` (DDP broadcasts rank 0's at construction), so ``model`` is the
    trained model afterwards on every rank."""
    w = next(model.parameters(), None)
    dev = torch.device(device) if device is not None else (None if w is None else w.device)
    if get_world_size() == 1:
        # One process (torchrun with one GPU too): the model as it is, and the batches moved to
        # its device as DDP moves them; on the CPU the loss as it is.
        if dev is None or dev.type == "cpu":
            return model, loss_fn
        return model, _OnDevice(loss_fn, dev)
    if dev is None:
        raise ValueError(f"wrap: the model ({type(model).__name__}) has no parameters; "
                         "DistributedDataParallel needs at least one to train")
    obj = Objective(model, loss_fn, device=device)
    if dev.type == "cuda":
        ddp_options.setdefault("device_ids", [dev])
    return nn.parallel.DistributedDataParallel(obj, **ddp_options), _call


class ShardedSampler(DistributedSampler):
    r"""A ``DistributedSampler`` over the global batches of ``TensorBatches``.

    Epoch e: the permutation ``randperm(N, generator seeded with seed·1000003 + e)`` (in order
    when ``shuffle=False`` or the batch is the whole data), cut into ``N // batch_size`` global
    batches of ``batch_size``; this rank yields samples ``rank, rank + W, …`` of each, i.e.
    ``batch_size / W`` per batch.  ``set_epoch`` is called by ``fit`` (and DataLoader users)."""

    def __init__(self, n: int, batch_size: int | None, *, num_replicas: int | None = None,
                 rank: int | None = None, shuffle: bool = True, seed: int = 0):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int (the number of samples), got {n!r}")
        W = get_world_size() if num_replicas is None else num_replicas
        r = get_rank() if rank is None else rank
        if isinstance(W, bool) or not isinstance(W, int) or W < 1:
            raise ValueError(f"num_replicas must be a positive int, got {W!r}")
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < W:
            raise ValueError(f"rank must be an int in [0, {W}), got {r!r}")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
        bs = n if batch_size is None else min(batch_size, n)
        if bs % W:
            raise ValueError(f"the global batch size {bs} must be divisible by the number of "
                             f"processes {W} (every rank takes an equal share)")
        # DistributedSampler's own fields, for code that inspects them; __iter__ is ours
        super().__init__(range(n), num_replicas=W, rank=r, shuffle=shuffle, seed=seed,
                         drop_last=True)
        self.n, self.global_batch = n, bs
        self.local_batch = bs // W
        self.batches = n // bs
        self.shuffle = bool(shuffle) and bs < n     # as TensorBatches: no shuffle of a full batch
        self.num_samples = self.batches * self.local_batch
        self.total_size = self.num_samples * W

    def _order(self) -> Tensor:
        # the order fit's TensorBatches take
        return epoch_order(self.n, self.global_batch, self.shuffle, self.seed, self.epoch)

    def local_batches(self) -> Iterator[list[int]]:
        order = self._order()
        B, W, r = self.global_batch, self.num_replicas, self.rank
        for i in range(self.batches):
            yield order[i * B + r:(i + 1) * B:W].tolist()

    def __iter__(self):
        for b in self.local_batches():
            yield from b

    def __len__(self) -> int:
        return self.num_samples


class _ShardBatches(BatchSampler):
    """Whole local batches of a :class:`ShardedSampler` (one tensor index per batch instead of
    one ``__getitem__`` per sample); forwards ``set_epoch``."""

    def __init__(self, sampler: ShardedSampler):
        super().__init__(sampler, sampler.local_batch, drop_last=True)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self):
        return self.sampler.local_batches()

    def __len__(self) -> int:
        return self.sampler.batches


def distributed_loader(data, batch_size: int | None, *, shuffle: bool = True, seed: int = 0,
                       num_replicas: int | None = None, rank: int | None = None) -> DataLoader:
    """A ``DataLoader`` over ``data`` (a tensor or tuple of tensors sharing dim 0) yielding
    this rank's share of each global batch of ``batch_size`` (see :class:`ShardedSampler`).
    ``fit(model, loss, distributed_loader(data, B, seed=s), seed=s, ...)`` on W ranks takes the
    steps of ``fit(model, loss, data, batch_size=B, seed=s, ...)`` in one process."""
    tensors = (data,) if isinstance(data, Tensor) else data
    if not isinstance(tensors, (tuple, list)) or not tensors or not all(isinstance(t, Tensor) for t in tensors):
        raise TypeError("data must be a tensor or a non-empty tuple of tensors")
    if any(t.dim() == 0 for t in tensors):
        raise ValueError("data tensors must have a sample dim (dim 0)")
    n = tensors[0].shape[0]
    if any(t.shape[0] != n for t in tensors):
        raise ValueError(f"data tensors must share dim 0; got {[tuple(t.shape) for t in tensors]}")
    for i, t in enumerate(tensors):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"data[{i}] contains NaN or inf")
    sampler = ShardedSampler(n, batch_size, num_replicas=num_replicas, rank=rank,
                             shuffle=shuffle, seed=seed)
    # batch_size=None: each item of the (batch) sampler is one index list, fetched in one go
    return DataLoader(TensorDataset(*tensors), sampler=_ShardBatches(sampler), batch_size=None)


def reduce_history(history: dict) -> dict:
    """``fit``'s history with ``"loss"`` replaced by the global-batch loss of each step (the
    mean over ranks of the local means: equal local batches).  Collective: call on every rank."""
    if get_world_size() == 1 or not history.get("loss"):
        return history
    return {**history, "loss": mean_over_ranks(history["loss"])}


# ----------------------------------------------------------------------------- sharded rollouts

def shard_bounds(n: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank's contiguous shard of n items (the first n % W ranks get one more)."""
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def sharded_rollout(system, q0: Tensor, p0: Tensor | None = None, *, h: float, steps: int,
                    method="verlet", t0: float = 0.0, save_every: int = 1, energy=None,
                    chunk_steps: int | None = None, return_trajectories: bool = False,
                    device=None, **rollout_options) -> dict:
    r"""Roll out a batch of initial conditions ``q0, p0`` of shape ``(B, ...)`` split over the
    ranks of the process group (rank r takes the contiguous rows :func:`shard_bounds`), each
    shard by :func:`torchgeo_int.rollout` with the given options.  Every rank passes the same
    global ``q0, p0`` (or tensors with the same first dim; only its rows are read).

    Energy error e_{b,t} = |H(x_{b,t}) − H(x_{b,0})| at the saved states (``energy(q, p)``, default
    ``system.energy``; for a first-order system, ``p0=None``, pass ``energy(x)`` or none):
    ``energy_error_max`` = max_{b,t} e, ``energy_error_mean`` = mean_{b,t≥1} e, and
    ``energy_rel_error_max`` = max e / |H(x_{b,0})| over the samples with H(x_{b,0}) ≠ 0,
    reduced over all ranks.
    ``chunk_steps``: roll out that many steps per call (the last state starts the next call), so
    memory is bounded for huge batches; the states are the same as one long call (up to the
    first force of each chunk, recomputed from the same state).  ``return_trajectories``
    gathers the ``(L, B, ...)`` trajectories on rank 0 (``None`` elsewhere; needs
    ``chunk_steps=None``), L the frames of ``rollout``: steps 0, save_every, … and the final one.

    Returns on every rank ``{"energy_error_max", "energy_error_mean", "energy_rel_error_max",
    "batch", "local_batch", "steps", "seconds" (this rank's rollout), "seconds_per_rank",
    "batch_per_rank", "throughput" (this rank, sample-steps/s), "throughput_per_rank",
    "throughput_total" (B·steps / the slowest rank's seconds), "world_size", "q", "p"}``
    (``q, p`` only with ``return_trajectories``, on rank 0; the x trajectory in ``q`` for a
    first-order system)."""
    if not isinstance(q0, Tensor) or q0.dim() < 1:
        raise ValueError("q0 must be a tensor with a leading batch dim (B, ...)")
    if p0 is not None and (not isinstance(p0, Tensor) or p0.shape[:1] != q0.shape[:1]):
        raise ValueError(f"p0 must be a tensor with the batch dim of q0 {tuple(q0.shape[:1])}, "
                         f"got {None if not isinstance(p0, Tensor) else tuple(p0.shape)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if isinstance(save_every, bool) or not isinstance(save_every, int) or save_every < 1:
        raise ValueError(f"save_every must be an int >= 1, got {save_every!r}")
    if chunk_steps is not None:
        if isinstance(chunk_steps, bool) or not isinstance(chunk_steps, int) or chunk_steps < 1:
            raise ValueError(f"chunk_steps must be an int >= 1 or None, got {chunk_steps!r}")
        if chunk_steps % save_every:
            raise ValueError(f"chunk_steps ({chunk_steps}) must be a multiple of save_every ({save_every})")
        if return_trajectories:
            raise ValueError("return_trajectories needs chunk_steps=None (one trajectory per rank)")
        if steps % save_every:
            raise ValueError(f"with chunk_steps, steps ({steps}) must be a multiple of save_every "
                             f"({save_every}): each chunk starts from the last saved state")
    system = as_system(system)
    W, r = get_world_size(), get_rank()
    B = q0.shape[0]
    if B < W:
        raise ValueError(f"batch of {B} initial conditions is smaller than the {W} processes")
    lo, hi = shard_bounds(B, W, r)
    q, p = q0[lo:hi], None if p0 is None else p0[lo:hi]
    if device is not None:
        q = q.to(device)
        p = None if p is None else p.to(device)
    if energy is None and p0 is not None:
        energy = system.energy
    first_order = p0 is None

    def H(qs, ps):
        return energy(qs) if first_order else energy(qs, ps)

    sync = (lambda: torch.cuda.synchronize(q.device)) if q.device.type == "cuda" else (lambda: None)
    e_max = e_sum = rel_max = None
    count = 0
    trajectories = None
    H0 = None
    sync()
    start = time.perf_counter()
    done, t = 0, float(t0)
    chunk = steps if chunk_steps is None else chunk_steps
    while done < steps:
        k = min(chunk, steps - done)
        out = rollout(system, q, p, h=h, steps=k, method=method, t0=t, save_every=save_every,
                      **rollout_options)
        qs, ps = (out, None) if first_order else out
        if return_trajectories:
            trajectories = (qs, ps)
        if energy is not None:
            Hs = H(qs, ps).detach()                 # (k//save_every + 1, b)
            if H0 is None:
                H0 = Hs[0]
            e = (Hs - H0).abs()
            # the chunk's first state is the previous chunk's last: counted once
            e_new = e[1:] if e.shape[0] > 1 else e[:0]
            # a sample with H(x₀) = 0 (a pendulum at rest) has no relative error: left out of
            # the max (it made the whole batch's NaN); its absolute error is in energy_error_max
            rel = torch.where(H0 != 0, e / H0.abs(), torch.zeros_like(e))
            e_max = e.max() if e_max is None else torch.maximum(e_max, e.max())
            rel_max = rel.max() if rel_max is None else torch.maximum(rel_max, rel.max())
            e_sum = e_new.sum() if e_sum is None else e_sum + e_new.sum()
            count += e_new.numel()
        q = qs[-1].detach()
        p = None if first_order else ps[-1].detach()
        done += k
        t = float(t0) + done * h
    sync()
    seconds = time.perf_counter() - start

    # reductions: statistics on every rank, timings and sizes gathered everywhere (small)
    cdev = collective_device()
    stats = torch.tensor([math.nan if e_max is None else float(e_max),
                          math.nan if rel_max is None else float(rel_max)], dtype=torch.float64, device=cdev)
    sums = torch.tensor([0.0 if e_sum is None else float(e_sum), float(count)], dtype=torch.float64, device=cdev)
    per = torch.zeros(W, 2, dtype=torch.float64, device=cdev)
    per[r, 0], per[r, 1] = seconds, float(hi - lo)
    if W > 1:
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        dist.all_reduce(sums)
        dist.all_reduce(per)
    per = per.cpu()
    secs, sizes = per[:, 0].tolist(), [int(s) for s in per[:, 1].tolist()]
    res = {
        "energy_error_max": float(stats[0]) if energy is not None else None,
        "energy_error_mean": float(sums[0] / sums[1]) if energy is not None and sums[1] > 0 else None,
        "energy_rel_error_max": float(stats[1]) if energy is not None else None,
        "batch": B, "local_batch": hi - lo, "steps": steps, "world_size": W, "rank": r,
        "seconds": seconds, "seconds_per_rank": secs, "batch_per_rank": sizes,
        "throughput": (hi - lo) * steps / seconds,
        "throughput_per_rank": [b * steps / s for b, s in zip(sizes, secs)],
        "throughput_total": B * steps / max(secs),
    }
    if return_trajectories:
        res["q"], res["p"] = _gather_rows(trajectories, sizes, cdev, first_order)
    return res


def _gather_rows(traj, sizes, cdev, first_order):
    """Concatenate the ranks' (T, b_r, ...) trajectories along dim 1 on rank 0 (padded to the
    largest shard, since collectives move equal shapes)."""
    parts = [traj[0]] if first_order else list(traj)
    W = len(sizes)
    if W == 1:
        return (parts[0].detach(), None) if first_order else tuple(x.detach() for x in parts)
    out = []
    m = max(sizes)
    for x in parts:
        x = x.detach()
        pad = torch.zeros((x.shape[0], m) + x.shape[2:], dtype=x.dtype, device=cdev)
        pad[:, :x.shape[1]] = x.to(cdev)
        bufs = [torch.empty_like(pad) for _ in range(W)] if get_rank() == 0 else None
        dist.gather(pad, bufs, dst=0)
        if get_rank() == 0:
            out.append(torch.cat([b[:, :s] for b, s in zip(bufs, sizes)], 1).to(x.device))
        else:
            out.append(None)
    return (out[0], None) if first_order else tuple(out)


__all__ = ["DistInfo", "init_from_env", "cleanup", "get_rank", "get_world_size", "is_main_process",
           "Objective", "wrap", "ShardedSampler", "distributed_loader", "reduce_history",
           "shard_bounds", "sharded_rollout"]
