r"""Small training utilities (functions, not a framework).

* :func:`seed_everything`  seed Python, NumPy and torch (call it before building the model)
* :func:`make_optimizer`   Adam / AdamW / SGD over a model's parameters
* :class:`TensorBatches`   the default data source: minibatches of tensors with a deterministic
  shuffle per epoch (permutation = f(seed, epoch)), so a resumed run sees the same batches
* :func:`save_checkpoint` / :func:`load_checkpoint`  model + optimizer + RNG + step + history,
  plain tensors and Python scalars only, loadable with ``torch.load(weights_only=True)``, with a
  SHA-256 of every tensor (and of the rest) verified on load: a damaged file is refused, never
  resumed from
* :func:`fit`              the loop: ``loss_fn(model, *batch)``, step, log, checkpoint, resume

``fit`` builds nothing it is given: pass your own optimizer and data source (e.g. a
``DataLoader`` with a ``DistributedSampler``, whose ``set_epoch`` is called every epoch) and a
wrapped model (``DistributedDataParallel``: its ``.module`` is what is checkpointed); only the
main process (rank 0, or the only one) writes checkpoints.  Data-parallel training itself is
not implemented here.

Size: one module because ``fit``'s resume is defined by what the checkpoint saves and restores
(model, optimizer, RNG streams, the batch order of :class:`TensorBatches`): the four are one
contract, read together.
"""
from __future__ import annotations

import hashlib
import math
import numbers
import os
import random
import time
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch import nn

from .._validate import check_real

Tensor = torch.Tensor
CHECKPOINT_FORMAT = "torchgeo_int.nn.checkpoint/2"
#: earlier formats without checksums: still loaded, unverified
_UNVERIFIED_FORMATS = ("torchgeo_int.nn.checkpoint/1",)


def seed_everything(seed: int) -> None:
    """Seed ``random``, NumPy (if installed) and torch (CPU and CUDA)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    random.seed(seed)
    try:
        import numpy as np
        np.random.seed(seed % 2 ** 32)
    except ImportError:  # numpy is optional here
        pass
    torch.manual_seed(seed)


def lr_factor(schedule, step: int, total: int) -> float:
    """The factor that ``fit``'s ``lr_schedule`` applies to every group's initial lr at step
    ``step`` (0-based) of ``total``: ``None`` → 1, ``"cosine"`` → ½(1 + cos(π·step/total))
    (from 1 at the first step towards 0 at the last, Loshchilov & Hutter 2017, no restarts),
    a callable → ``schedule(step, total)``."""
    if schedule is None:
        return 1.0
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * step / max(total, 1)))
    value = schedule(step, total)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or value < 0:
        raise ValueError(f"lr_schedule(step, total) must return a finite number >= 0, got {value!r} "
                         f"at step {step}")
    return float(value)


_OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


def make_optimizer(model: nn.Module, *, name: str = "adam", lr: float = 1e-3,
                   weight_decay: float = 0.0, **options) -> torch.optim.Optimizer:
    """An optimizer over ``model.parameters()`` (``name`` in adam, adamw, sgd)."""
    if name not in _OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(_OPTIMIZERS)}")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    return _OPTIMIZERS[name](params, lr=lr, weight_decay=weight_decay, **options)


def epoch_order(n: int, batch_size: int, shuffle: bool, seed: int, epoch: int) -> Tensor:
    """The sample indices of epoch ``epoch``, batch after batch (``n // batch_size`` batches of
    ``batch_size``): ``randperm(n)`` from a generator seeded with (seed, epoch), or unshuffled
    the samples in order from where the last epoch stopped, wrapping around — so a batch size
    that does not divide n still reaches every sample (n = 100, batches of 64: the last 36 were
    never seen); where it divides n every epoch is the same.  The one definition of the order,
    for :class:`TensorBatches` and ``distributed_loader``'s sampler (the same global batches)."""
    if shuffle:
        g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
        return torch.randperm(n, generator=g)
    count = n // batch_size * batch_size
    offset = int(epoch) * count % n
    return (torch.arange(count) + offset) % n


class TensorBatches:
    """Minibatches of tensors that share their first (sample) dim.

    Epoch e visits the samples in the order of :func:`epoch_order` (``randperm(N)`` seeded with
    (seed, e); ``shuffle=False``: in order, continuing from the last epoch), in ``len(self)``
    batches of ``batch_size`` (the ragged tail of an epoch is dropped so every step sees the same
    batch size; ``batch_size=None``: the full batch).  The order depends on (seed, epoch) only,
    so an interrupted run resumes on the same batches.
    """

    def __init__(self, tensors, batch_size: int | None = None, *, shuffle: bool = True,
                 seed: int = 0):
        if isinstance(tensors, Tensor):
            tensors = (tensors,)
        if not isinstance(tensors, (tuple, list)) or not tensors:
            raise TypeError("data must be a tensor or a non-empty tuple of tensors")
        n = None
        for i, t in enumerate(tensors):
            if not isinstance(t, Tensor):
                raise TypeError(f"data[{i}] must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() == 0:
                raise ValueError(f"data[{i}] is a 0-d tensor: the first dim must index samples")
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise ValueError(f"data[{i}] contains NaN or inf")
            if n is None:
                n = t.shape[0]
            elif t.shape[0] != n:
                raise ValueError(f"data tensors must have the same number of samples (dim 0): "
                                 f"data[0] has {n}, data[{i}] has {t.shape[0]}")
        if n == 0:
            raise ValueError("data has no samples")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
        self.tensors = tuple(tensors)
        self.n = n
        self.batch_size = n if batch_size is None else min(batch_size, n)
        self.shuffle = bool(shuffle) and self.batch_size < n
        self.seed = int(seed)

    def __len__(self) -> int:
        return self.n // self.batch_size

    def epoch(self, e: int, start: int = 0) -> Iterable[tuple[Tensor, ...]]:
        """The batches of epoch ``e`` from batch index ``start`` on."""
        bs = self.batch_size
        order = epoch_order(self.n, bs, self.shuffle, self.seed, e)
        for i in range(start, len(self)):
            idx = order[i * bs:(i + 1) * bs]
            lo = int(idx[0])
            if not self.shuffle and lo + bs <= self.n:     # in order: a view, no gather
                yield tuple(t[lo:lo + bs] for t in self.tensors)
            else:
                yield tuple(t[idx.to(t.device)] for t in self.tensors)


class _LoaderBatches:
    """A user's iterable of batches (a DataLoader …) seen through the TensorBatches interface."""

    def __init__(self, loader):
        self.loader = loader
        #: the torch RNG states at the start of the current epoch (checkpoints keep them)
        self.rng_at_epoch = None
        try:
            self._len = len(loader)
        except TypeError:
            raise TypeError("a data loader passed to fit must have a length (batches per epoch)") from None
        if self._len == 0:
            raise ValueError("the data loader yields no batches")

    def __len__(self):
        return self._len

    def generators(self):
        """The loader's own generators (``DataLoader(generator=g)``, its sampler's): a shuffling
        loader with one draws its order from it, not from the global RNG."""
        found = []
        for obj in (self.loader, getattr(self.loader, "sampler", None),
                    getattr(getattr(self.loader, "batch_sampler", None), "sampler", None)):
            g = getattr(obj, "generator", None)
            if isinstance(g, torch.Generator) and not any(g is x for x in found):
                found.append(g)
        return found

    def set_generators(self, states):
        for g, state in zip(self.generators(), states or ()):
            g.set_state(state.cpu())

    def epoch(self, e, start=0):
        """The batches of epoch ``e`` from batch ``start`` on.  A shuffling loader draws its
        order from the global RNG when its iteration starts; to skip ``start`` batches and see
        the rest of the same order (a resume), the loader starts from ``rng_at_epoch``, the
        states it started from in the interrupted run (``fit`` sets it from the checkpoint),
        and the current states come back before the first batch is yielded."""
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(e)
        now = None
        if start and self.rng_at_epoch is not None:
            now = _rng_state()
            _set_rng_state(self.rng_at_epoch)
            self.set_generators(self.rng_at_epoch.get("loader"))   # (they replay on from here)
        self.rng_at_epoch = {**_rng_state(), "loader": [g.get_state() for g in self.generators()]}
        batches = iter(self.loader)
        for _ in range(start):       # the skipped batches draw what they drew the first time
            next(batches, None)
        if now is not None:          # the next batch is fetched after the interrupted run's step
            _set_rng_state(now)
        for batch in batches:
            yield tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)


def _as_batches(data, batch_size, shuffle, seed):
    if isinstance(data, (TensorBatches, _LoaderBatches)):
        return data
    if isinstance(data, (Tensor, tuple, list)):
        return TensorBatches(data, batch_size, shuffle=shuffle, seed=seed)
    if hasattr(data, "__iter__"):
        return _LoaderBatches(data)
    raise TypeError(f"data must be tensors, a TensorBatches or a data loader, got {type(data).__name__}")


def _unwrap(model: nn.Module) -> nn.Module:
    # DistributedDataParallel / DataParallel keep the real model in .module
    return getattr(model, "module", model)


def is_main_process() -> bool:
    """Rank 0 of an initialised process group, or the only process."""
    d = torch.distributed
    return not (d.is_available() and d.is_initialized()) or d.get_rank() == 0


def collective_device() -> torch.device:
    """Where a collective's tensors live: the current GPU under nccl, else the CPU."""
    d = torch.distributed
    nccl = d.is_available() and d.is_initialized() and d.get_backend() == "nccl"
    return torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")


def mean_over_ranks(values: list) -> list:
    """Each entry's mean over the ranks of an initialised process group (a collective: every
    rank calls it), or ``values`` itself in one process: the global-batch loss of each step
    from the ranks' local means (equal local batches)."""
    d = torch.distributed
    if not (d.is_available() and d.is_initialized()) or d.get_world_size() == 1 or not values:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=collective_device())
    d.all_reduce(t)
    return (t / d.get_world_size()).tolist()


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    # RNG states are CPU byte tensors, wherever load_checkpoint's map_location put them
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def _skeleton(obj, at=""):
    """``obj`` with every tensor replaced by its path, and the (path, tensor) pairs, in an order
    fixed by the keys (sorted as str: optimizer states are keyed by int)."""
    if isinstance(obj, Tensor):
        return f"<tensor {at}>", [(at, obj)]
    if isinstance(obj, dict):
        items, found = [], []
        for k in sorted(obj, key=str):
            sk, f = _skeleton(obj[k], f"{at}/{k}")
            items.append((repr(k), sk))
            found += f
        return items, found
    if isinstance(obj, (list, tuple)):
        items, found = [], []
        for i, v in enumerate(obj):
            sk, f = _skeleton(v, f"{at}/{i}")
            items.append(sk)
            found += f
        return (type(obj).__name__, items), found
    return repr(obj), []


def _checksums(blob: dict) -> dict:
    """SHA-256 of each tensor (dtype, shape and bytes) by its path in ``blob``, and of everything
    else (keys, step, history, scalars) under ``""``."""
    skeleton, tensors = _skeleton(blob)
    out = {"": hashlib.sha256(repr(skeleton).encode()).hexdigest()}
    for at, t in tensors:
        t = t.detach().to("cpu").contiguous()
        h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        out[at] = h.hexdigest()
    return out


class CheckpointError(ValueError):
    """A file that :func:`load_checkpoint` refuses: not a checkpoint, damaged, or incomplete."""


def _invalid(path, why) -> CheckpointError:
    return CheckpointError(f"{path} is not a valid torchgeo_int checkpoint ({why})")


def _check_loadable(obj, at: str) -> None:
    """Refuses what ``torch.load(weights_only=True)`` would refuse, before the file is written
    (a written file that cannot be loaded is reported as damaged)."""
    if obj is None or isinstance(obj, (Tensor, bool, int, float, complex, str)):
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"a checkpoint's {at} keys must be str or int, got {type(k).__name__}")
            _check_loadable(v, f"{at}[{k!r}]")
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _check_loadable(v, f"{at}[{i}]")
        return
    raise TypeError(f"a checkpoint's {at} is a {type(obj).__name__}; it takes tensors, Python "
                    f"numbers, str, None and lists, tuples and dicts of those (loaded with "
                    f"weights_only=True): convert it, e.g. str(path)")


def save_checkpoint(path, model: nn.Module, optimizer: torch.optim.Optimizer | None, *, step: int,
                    history: dict | None = None, extra: dict | None = None) -> Path:
    """Write model, optimizer, torch RNG states, step and history to ``path`` (atomically: a
    temporary file renamed over the old one, so an interrupted save leaves the last good one).
    Every entry is a tensor, a Python scalar/str or a container of those, so the file loads with
    ``torch.load(path, weights_only=True)``; ``"checksums"`` holds the SHA-256 of every tensor
    and of the rest, which :func:`load_checkpoint` verifies."""
    _check_loadable(extra or {}, "extra")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {
        "format": CHECKPOINT_FORMAT,
        "step": int(step),
        "model": _unwrap(model).state_dict(),
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "optimizer_class": None if optimizer is None else type(optimizer).__qualname__,
        "rng": _rng_state(),
        "history": {k: [float(v) for v in vals] for k, vals in (history or {}).items()},
        "extra": extra or {},
    }
    blob["checksums"] = _checksums(blob)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(blob, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                    map_location="cpu", restore_rng: bool = True, check=None) -> dict:
    """Load a :func:`save_checkpoint` file into ``model`` (and ``optimizer``) with
    ``weights_only=True``; restores the torch RNG states unless ``restore_rng=False``.
    Returns ``{"step", "history", "extra"}``.  ``check(extra)``: called once the file is
    verified, before anything is loaded (it raises to refuse the checkpoint).

    A file that is empty, truncated, not a checkpoint, or whose tensors or metadata do not match
    the checksums written with them (a flipped bit) raises :class:`CheckpointError` (a
    ``ValueError``) "<path> is not a valid torchgeo_int checkpoint (<why>)" before anything is
    loaded into the model."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        blob = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:   # empty/truncated/garbage files fail in many ways inside torch.load
        why = str(err).strip().splitlines()[0][:200] if str(err).strip() else "no message"
        raise _invalid(path, f"torch.load failed: {type(err).__name__}: {why}") from err
    if not isinstance(blob, dict) or blob.get("format") not in (CHECKPOINT_FORMAT,
                                                                *_UNVERIFIED_FORMATS):
        found = blob.get("format") if isinstance(blob, dict) else type(blob).__name__
        raise _invalid(path, f"format {found!r}, expected {CHECKPOINT_FORMAT!r}")
    missing = [k for k in ("step", "model", "optimizer", "rng", "history", "extra") if k not in blob]
    if missing:
        raise _invalid(path, f"missing entries {missing}")
    if blob["format"] == CHECKPOINT_FORMAT:
        stored = blob.pop("checksums", None)
        if not isinstance(stored, dict):
            raise _invalid(path, "no checksums")
        now = _checksums(blob)
        bad = sorted(k for k in set(stored) | set(now) if stored.get(k) != now.get(k))
        if bad:
            where = ", ".join(k or "metadata" for k in bad[:3]) + (" …" if len(bad) > 3 else "")
            raise _invalid(path, f"checksum mismatch in {where}: the file is damaged")
    if check is not None:
        check(blob["extra"])
    if optimizer is not None:
        if blob["optimizer"] is None:
            raise ValueError(f"{path} holds no optimizer state")
        # before anything is loaded: another optimizer's state failed inside its step (SGD on
        # Adam's: KeyError 'momentum') or ran with the wrong settings (AdamW on Adam's)
        saved, this = blob.get("optimizer_class"), type(optimizer).__qualname__
        if saved is not None and saved != this:
            raise ValueError(f"{path} holds the state of an optimizer of class {saved}, not "
                             f"{this}: resume with the optimizer the checkpoint was written with")
    _unwrap(model).load_state_dict(blob["model"])
    if optimizer is not None:
        optimizer.load_state_dict(blob["optimizer"])
    if restore_rng:
        try:
            _set_rng_state(blob["rng"])
        except (RuntimeError, TypeError, KeyError, ValueError) as err:
            raise _invalid(path, f"its RNG state is damaged: {err}") from err
    return {"step": blob["step"], "history": blob["history"], "extra": blob["extra"]}


def _same_schedule(lr_schedule, total):
    """A :func:`load_checkpoint` check: a cosine-scheduled checkpoint resumed over another total
    is refused (the cosine's factor at a step depends on the total: the lr would jump)."""
    def check(extra):
        written = extra.get("total")
        if (lr_schedule == "cosine" and extra.get("lr_schedule") == "cosine"
                and written is not None and written != total):
            raise ValueError(f"the checkpoint was written by a cosine schedule over {written} "
                             f"steps and this run's is over {total}: resume with the same steps= "
                             "(or epochs=)")
    return check


def _progress_bar(total, initial, desc, enabled):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is an optional dependency: train without a bar
        return None
    return tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True,
                leave=False)


#: ``threads="auto"``: batches of at most this many numbers train with one intra-op thread
SMALL_BATCH = 1 << 16


def _batch_numel(batch) -> int:
    return sum(x.numel() for x in batch if isinstance(x, Tensor))


def fit(model: nn.Module, loss_fn: Callable[..., Tensor], data, *, steps: int | None = None,
        epochs: int | None = None, lr: float = 1e-3, weight_decay: float = 0.0,
        optimizer: torch.optim.Optimizer | None = None, batch_size: int | None = None,
        shuffle: bool = True, seed: int = 0, grad_clip: float | None = None,
        progress: bool = True, desc: str = "training", log_every: int = 10,
        checkpoint=None, checkpoint_every: int | None = None, resume=False,
        max_time: float | None = None, threads="auto", lr_schedule=None) -> dict:
    r"""Minimise ``loss_fn(model, *batch)`` by gradient steps; returns
    ``{"loss": [per-step losses], "step": steps done in total, "seconds": wall time of this call,
    "stopped": "steps" | "time"}``.

    ``data``: a tensor or tuple of tensors sharing dim 0 (batched by :class:`TensorBatches` with
    ``batch_size``, ``shuffle``, ``seed``), a :class:`TensorBatches`, or any data loader with a
    length.  Budget: ``steps`` gradient steps, or ``epochs`` passes; ``max_time`` (seconds) stops
    early.  ``optimizer`` defaults to Adam(lr, weight_decay).  ``seed`` seeds the batch order
    and torch's global RNG (for randomness inside ``loss_fn``) at the start of a fresh run.

    ``checkpoint``: a path written every ``checkpoint_every`` steps and at the end.
    ``resume=True`` continues from ``checkpoint`` if the file exists (else starts fresh);
    ``resume=<path>`` continues from that file (which must exist).  Resuming restores model,
    optimizer, RNG, step and loss history: k steps, save, load, N − k steps gives bit-for-bit the
    parameters of N uninterrupted steps (same data, deterministic kernels; a shuffling data
    loader resumes its interrupted epoch's order: the checkpoint keeps the RNG states the epoch
    started from).
    The loss is synced to the host every ``log_every`` steps only; a non-finite loss raises
    ``FloatingPointError`` naming the steps.  ``progress``: a tqdm bar labelled ``desc`` (steps,
    and the last logged loss).

    ``threads``: torch's intra-op CPU threads during the call, restored on return.  ``"auto"``
    (the default) uses one thread when the first batch holds at most ``SMALL_BATCH`` (65536)
    numbers — HNN-sized batches gain nothing from OpenMP threads, and on a machine shared with
    other jobs their spin-waits made training through rollouts many times slower — and leaves torch's
    setting otherwise; an int sets it; ``None`` leaves it alone.

    ``lr_schedule``: ``None`` (constant learning rates), ``"cosine"`` (every parameter group's
    lr decays as ½(1 + cos(π·step/total)) from its initial value, towards 0 at the last step), or
    a callable ``(step, total) -> factor``; the group's initial lr is kept in its
    ``"initial_lr"`` entry (saved with the optimizer, so a resumed run continues the schedule;
    ``"cosine"`` spans this call's ``total`` steps, so resume with the same ``steps=``).
    Full-batch Adam at a constant lr can end in a transient loss spike (the loss floor is flat
    and Adam's step lr/√v̂ grows as the gradients shrink); a decaying lr ends at a settled
    iterate.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(model, *batch) -> scalar tensor")
    if (steps is None) == (epochs is None):
        raise ValueError("give exactly one of steps= and epochs=")
    for name, v in (("steps", steps), ("epochs", epochs)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
    if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1:
        raise ValueError(f"log_every must be an int >= 1, got {log_every!r}")
    if checkpoint_every is not None and checkpoint is None:
        raise ValueError("checkpoint_every needs checkpoint=<path>")
    if grad_clip is not None:
        # 0 never trains, a negative norm flips the gradient (ascent), NaN poisons the step
        grad_clip = check_real(grad_clip, "grad_clip", 0.0, lo_open=True)
    if max_time is not None and not (max_time > 0):
        raise ValueError(f"max_time must be positive seconds, got {max_time!r}")
    if not (threads is None or threads == "auto"
            or (isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1)):
        raise ValueError(f"threads must be 'auto', None or an int >= 1, got {threads!r}")

    if not (lr_schedule is None or lr_schedule == "cosine" or callable(lr_schedule)):
        raise ValueError(f"lr_schedule must be None, 'cosine' or a callable (step, total) -> factor, "
                         f"got {lr_schedule!r}")
    batches = _as_batches(data, batch_size, shuffle, seed)
    per_epoch = len(batches)
    total = steps if steps is not None else epochs * per_epoch
    opt = optimizer if optimizer is not None else make_optimizer(model, lr=lr, weight_decay=weight_decay)

    start, losses = 0, []
    source = None
    if resume is True:
        if checkpoint is None:
            raise ValueError("resume=True needs checkpoint=<path>")
        source = Path(checkpoint) if Path(checkpoint).is_file() else None
    elif resume:
        source = Path(resume)
        if not source.is_file():
            raise FileNotFoundError(f"no checkpoint at {resume} (fit's resume=)")
    if source is not None:
        state = load_checkpoint(source, model, opt, check=_same_schedule(lr_schedule, total))
        start, losses = state["step"], list(state["history"].get("loss", []))
        if isinstance(batches, _LoaderBatches):
            batches.rng_at_epoch = state["extra"].get("rng_at_epoch")
            # a resume at an epoch's start goes on from the generators' states at the save
            batches.set_generators(state["extra"].get("loader_generators"))
    else:
        torch.manual_seed(seed)

    def save(at):
        if checkpoint is None:
            return
        # every rank calls it; under DDP the checkpoint keeps the global-batch losses (rank 0's
        # own were saved, and a resumed run's reduce_history averaged them with themselves)
        history = {"loss": mean_over_ranks(losses)}
        if is_main_process():
            extra = {"seed": seed, "total": total,
                     "lr_schedule": lr_schedule if lr_schedule in (None, "cosine") else "callable"}
            if getattr(batches, "rng_at_epoch", None) is not None:   # a loader's (see its epoch)
                extra["rng_at_epoch"] = batches.rng_at_epoch
                extra["loader_generators"] = [g.get_state() for g in batches.generators()]
            save_checkpoint(checkpoint, model, opt, step=at, history=history, extra=extra)

    bar = _progress_bar(total, min(start, total), desc, progress)
    pending: list[Tensor] = []

    def flush(at):
        if not pending:
            return
        vals = torch.stack(pending).tolist()
        first = at - len(pending)
        pending.clear()
        bad = [first + i for i, v in enumerate(vals) if not math.isfinite(v)]
        losses.extend(vals)
        if bad:
            raise FloatingPointError(f"the loss became non-finite at step {bad[0]} "
                                     f"(steps {first}..{at - 1} checked); lower lr or check the data")
        if bar is not None:
            bar.update(len(vals))
            bar.set_postfix(loss=f"{vals[-1]:.3e}")

    t0 = time.perf_counter()
    step, stopped = start, "steps"
    model.train()
    threads_before = torch.get_num_threads()
    try:
        epoch, pos = divmod(step, per_epoch)
        while step < total and stopped == "steps":
            for batch in batches.epoch(epoch, pos):
                if threads is not None and step == start:
                    small = threads == "auto" and _batch_numel(batch) <= SMALL_BATCH
                    if small or isinstance(threads, int):
                        torch.set_num_threads(1 if small else threads)
                loss = loss_fn(model, *batch)
                if not isinstance(loss, Tensor) or loss.dim() != 0:
                    got = (f"shape {tuple(loss.shape)}" if isinstance(loss, Tensor)
                           else type(loss).__name__)
                    raise TypeError(f"loss_fn(model, *batch) must return a scalar tensor, got "
                                    f"{got} (batch: {len(batch)} tensors of shapes "
                                    f"{[tuple(x.shape) for x in batch]})")
                opt.zero_grad(set_to_none=True)
                try:
                    loss.backward()
                except RuntimeError as err:  # a NaN loss also breaks implicit (adjoint) solves
                    if not bool(torch.isfinite(loss.detach())):
                        raise FloatingPointError(f"the loss became non-finite at step {step}; "
                                                 "lower lr or check the data") from err
                    raise
                if grad_clip is not None:
                    nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
                if lr_schedule is not None:
                    factor = lr_factor(lr_schedule, step, total)
                    for group in opt.param_groups:
                        group.setdefault("initial_lr", group["lr"])
                        group["lr"] = group["initial_lr"] * factor
                opt.step()
                pending.append(loss.detach())
                step += 1
                if step % log_every == 0 or step == total:
                    flush(step)
                if checkpoint_every is not None and step % checkpoint_every == 0:
                    flush(step)
                    save(step)
                if max_time is not None and time.perf_counter() - t0 > max_time:
                    stopped = "time"
                if step >= total or stopped != "steps":
                    break
            epoch, pos = epoch + 1, 0
        flush(step)
        save(step)
    finally:
        torch.set_num_threads(threads_before)
        if bar is not None:
            bar.close()
    return {"loss": losses, "step": step, "seconds": time.perf_counter() - t0, "stopped": stopped}


__all__ = ["fit", "lr_factor", "seed_everything", "make_optimizer", "TensorBatches", "save_checkpoint",
           "load_checkpoint", "CheckpointError", "is_main_process", "mean_over_ranks"]
