r"""``compile=True``: a wrapper of the stepper protocol whose ``step`` and ``steps(n)`` are
compiled versions of the eager stepper's own (``integrator.bind(system)``,
:class:`~torchgeo_int.integrators.base.Stepper`), each graph compiled once.

A plain ``torch.compile(integrator.step)`` is slower than eager on CPU: ``t`` (a Python float that
changes every step) and the cache (``None`` on step 0, a tensor afterwards) are specialised, so
it recompiles, and every call pays dynamo's guards and inductor's wrapper (≈ 40–60 µs on a CPU
core: as much as a whole eager Verlet step on a small batch).  Here (:class:`CompiledStep`):

* **Explicit kick–drift methods on separable systems** (``integrator.splitting()`` and
  ``system.separable``): a graph is the eager stepper's ``steps(n)`` traced, a function of
  tensors ``(q, p, force) -> (q, p, force)`` (so the kick/drift sequence is the one of
  ``integrators/base.py``).  The FSAL force is computed eagerly before the first call,
  so the graph always receives a tensor; a time-independent system gets a constant ``t`` (it
  ignores it), a time-dependent one the float, which dynamo makes dynamic after one recompile;
  ``h`` is a float, dynamic after the first change of step size.
* **Blocks of K steps** amortise the per-call overhead (K = ``BLOCK_BUDGET // drifts per step``:
  compile time grows with the unrolled graph).  Given the rollout's plan (``steps``, ``t0``,
  ``save_every``: what ``solve`` passes under ``grad="backprop"``) two uses of the one compiled
  ``steps(n)``:

  - ``steps(n)`` (``run_loop`` asks for the n steps up to the next save or check) runs n as
    compiled K'-step blocks, K' the largest divisor of ``save_every`` up to K, each returning
    only its final state — the fastest form (only the states ``run_loop`` saves are formed); a
    stretch that K' does not divide (a check between saves, the last steps) runs its last
    ``n mod K'`` steps eagerly, so no second graph is compiled;
  - ``long_steps(n)`` (small states, ≤ ``LOOP_MAX_NUMEL`` elements: ``run_loop`` offers the
    whole stretch between two saves, its checks included, and with every state saved the whole
    rollout and its rows) runs the same blocks as compiled loops (``while_loop``; with
    inductor's C++ wrapper the loop is C++), so the call's cost — dynamo's guards and wrappers,
    25–50 µs on a CPU core, 1.6–3 µs a step over a block of 16 — is paid once per stretch, not
    per block; keeping every state, a loop carries the rows of its states and copies them at
    each block (a functional write), so one call covers ``LOOP_ROWS`` elements of them.
    ``run_loop`` checks the stretch's final state and, if it is not finite, runs the stretch
    again in checked stretches, which name the steps as before.  Kepler Verlet, 2000 steps,
    one core, loops against blocks, interleaved: final state B = 1 2.4 against 8.4 µs a step,
    B = 64 3.1 against 9.5, B = 1024 17 against 22, B = 4096 on a par (so larger states keep
    the blocks); every state B = 1 2.0 against 8.3, B = 16 2.9 against 6.7, B = 128 15
    against 17, B = 512 on a par.  Not for a time-dependent system that takes t as a float (in
    the loop t is a tensor); forces by autograd (an energy-defined system; an HNN whose
    network has no closed-form gradient, ``nn.MLP.input_grad``) are traced
    there as ``torch.func.grad`` (:func:`~torchgeo_int.systems.grad_of`), since
    ``torch.autograd.grad`` does not trace inside a ``while_loop`` (a loop that fails to
    compile is recorded in ``loop_failed``, and the blocks run);
  - ``saves(n)`` (every state saved: ``run_loop`` asks for the n steps up to the next check
    and hands over their output rows): one call computes K states (``steps(1)`` K times in one
    graph, each returned row-major) and one ``torch.stack(out=)`` writes them into K rows — no
    Python per step, which is what small batches pay (Kepler, B = 1, one core: 18 → 8.5 µs a
    step); states of at least ``INTO_MIN_NUMEL`` elements are written into their rows inside
    the graph instead (the rows are its inputs: no second copy of every state, nor K fresh
    state-sized tensors a call); the steps a stretch does not fill with blocks run eagerly;
  - ``step`` (a caller stepping one state at a time, K' = 1): one call computes K states and
    the next K − 1 calls hand them out through the cache (a ``_Block`` cursor; a caller that
    passes back another state drops the block).  The last ``steps mod K`` steps of the rollout
    run eagerly, so no second graph is compiled.  Large states (≥ ``LOOKAHEAD_MAX`` elements
    per block) take one compiled step per call instead.

  Without the plan (the lean gradient modes, whose recomputation must take the forward's
  operations) and under autograd every call is one compiled step: a block would also compile
  its K-step backward, which takes minutes on CPU.  Under grad mode with nothing requiring
  grad (:func:`needs_graph`, decided from one eager step) the planned steps run as under
  ``torch.no_grad()``.
* **Batch-innermost layout in blocks.**  A state (B, n) with a few coordinates and many
  trajectories goes into a block with the batch as its stride-1 axis (:func:`batch_inner`).
  Inductor vectorises along the stride-1 axis: on the row-major layout that is the n
  coordinates (a reduction like |q| over n = 2 runs 16-lane vectors masked to 2 lanes, a scalar
  loop over the batch); on the batch-innermost one it is the batch (Kepler, 4096 trajectories,
  final state: ≈ 1.6× faster from B ≈ 256 on, copies included).  Blocks hand their last state
  and force on in that layout, so a stretch of blocks converts once: ``steps(n)`` converts on
  the way in and makes (q, p, force) row-major again after its last block (per block, those six
  eager copies took a third of a final-state rollout's time at B = 4096: 19.6 → 12.5 ns per
  step·trajectory, ``experiments.bench.limits --sections compute``); a block that returns every
  state writes each one row-major from inside the kernel (inductor transposes in registers;
  Kepler, one idle core, every state kept: B = 4096 took 0.83–0.85 of the stacked row-major
  blocks' time, measured together with the C++ wrapper, ``CPP_WRAPPER``; ``compare_trees.py
  --rows every_state``).  Eager kernels are slower on the batch-innermost layout, so what
  leaves ``steps`` and ``saves`` is row-major.  A system that cannot take it (``q.view(...)``
  needs a contiguous q) is compiled again on the row-major layout.
* **Implicit methods solved by fixed-point iteration**: the iterations between two convergence
  checks are one compiled call (``SolveOptions.fuse``); the checked steps measure the
  iterations m a solve needs.  Without a graph, in rollouts of at least ``FIXED_MIN_STEPS``
  steps, blocks of K = ``IMPLICIT_BUDGET`` // m steps then run as one compiled call each, every
  solve in them exactly m iterations (:class:`~torchgeo_int.solvers.FixedIterations`), and one
  host sync checks the block's worst residual: a block over the tolerance is dropped and its
  steps run checked, which raises m where they need more.  A solve so runs at least the
  checked one's iterations and agrees with it to about tol / (1 − L) (L the contraction factor
  of the fixed-point map), not to round-off.
* **Everything else** (Newton-solved implicit steps, non-separable systems): the integrator's own eager step
  (its solver loop has data-dependent iteration counts and host syncs) on a proxy of the system
  whose ``vector_field`` / ``force`` / ``velocity`` are compiled, for states of at least
  ``FIELDS_MIN`` elements; smaller states run the plain eager step (each compiled evaluation
  pays the call overhead).  A warning says so.
* Autograd inside the system (X_H of a :class:`Hamiltonian` by ``torch.autograd.grad``) is traced
  (dynamo's ``trace_autograd_ops``).  If compiling fails, a warning says why and the eager
  stepper runs from then on.

Compiled graphs are kept per (integrator, system) pair, for the last ``KEEP`` pairs, and each
pair has its own code objects (dynamo's recompile limit counts per code object).  Results agree
with the eager rollout to round-off (inductor fuses and may reorder arithmetic).  Every graph
goes through the one ``torch.compile`` call, in :class:`_Compiled` (:func:`_compile`).

Size: the compiled kernels, the compiled stepper and its plan (blocks, lookahead) share one
kernel cache and one fallback policy.
"""
from __future__ import annotations

import itertools
import threading
import types
import warnings

import torch

from . import systems
from ._cache import IdentityCache
from ._loop import run_loop
from .integrators.base import Stepper, explicit_splitting
from .integrators.splitting import ProcessedSplitting
from .solvers import ConvergenceError, FixedIterations, default_tol, fused_iterations

__all__ = ["compiled_step", "compiled_rollout", "CompiledStep", "default_block"]

#: drifts (≈ force evaluations) unrolled into one compiled block.
BLOCK_BUDGET = 16
#: largest number of state elements (numel(q) × K) a lookahead block returns.
LOOKAHEAD_MAX = 2 ** 17
#: IMPLICIT_BUDGET: the fixed-point iterations unrolled into one compiled block of implicit
#: steps (K = IMPLICIT_BUDGET // m, m the iterations a solve needs); FIXED_MAX_ITER: the
#: largest m that runs in blocks (past it the steps run checked; see CompiledStep._implicit).
#: Compile time grows with the budget: Kepler implicit midpoint, B = 256,
#: m = 12, one CPU core, cold caches: 14 s for 32 (K = 2), 25 s for 48 (K = 4), at the same
#: speed within the machine's spread (3.5–4.7× the numba loop).
IMPLICIT_BUDGET = 32
FIXED_MAX_ITER = IMPLICIT_BUDGET // 2
#: shortest rollout (steps) that runs implicit steps in such blocks: the block's compilation
#: (tens of seconds) is worth it only over many steps.
FIXED_MIN_STEPS = 256
#: smallest state (numel(q)) whose implicit steps use the compiled vector field; below it the
#: call overhead outweighs the fusion (measured on CPU: 1.4× slower at batch 64, 1.2× faster at
#: 65536 Kepler trajectories) and the step runs eagerly.
FIELDS_MIN = 2 ** 15
#: smallest leading dimension (trajectories) that blocks run batch-innermost, and the largest
#: number of elements per trajectory for which they do (a wide state vectorises well as it is).
LAYOUT_MIN_BATCH = 256
LAYOUT_MAX_EVENT = 64
#: largest number of elements per trajectory whose batch-innermost states the every-state
#: blocks write row-major by a chain of ``torch.where`` (:func:`row_major_state`), into the
#: output rows at any size (``CompiledStep.saves``).  The chain costs one select per element
#: and component, so it pays for few: a compiled stand-in block writing stored states, B = 4096,
#: ns per value, transposed copy / chain (a scratch sweep, one AVX-512 core; ``python -m
#: experiments.bench.limits --sections compute`` measures 2 elements): 2 elements 1.76 / 1.01,
#: 4: 1.48 / 0.84, 8: 1.05 / 0.77, 12: 1.40 / 1.54, 16: 1.09 / 1.77.
INTERLEAVE_MAX = 8
#: largest CPU state (numel(q)) whose stretches run as compiled loops (``CompiledStep.long_steps``)
#: rather than a Python loop over compiled blocks (Kepler: on a par with the blocks at B = 4096,
#: final state, and B = 512, every state; faster below).
LOOP_MAX_NUMEL = 2048
#: smallest state (numel(q)) whose every-state blocks write their states straight into the
#: output rows (graph inputs); below it they return them and one stack copies them there,
#: since 2K more inputs cost guards and Python per call (``CompiledStep.saves``) — except
#: batch-innermost states of at most ``INTERLEAVE_MAX`` elements a trajectory, which go into
#: the rows at any size
INTO_MIN_NUMEL = 2 ** 14
#: largest number of elements (states × numel(q)) of the rows a compiled loop that keeps every
#: state carries: it writes them functionally, a copy of the rows per block, so one call
#: covers about LOOP_ROWS / numel(q) steps (Kepler, B = 1: 2048).
LOOP_ROWS = 4096
#: (integrator, system) pairs whose compiled graphs are kept.
KEEP = 16
#: seconds the first call of a compiled function (its compilation) may take; past it the step
#: runs eagerly, with a RuntimeWarning (the compilation finishes in a background thread, unused).
COMPILE_BUDGET_S = 120.0
_ids = itertools.count()


def default_block(integrator, system) -> int:
    """K of a block: ``BLOCK_BUDGET // drifts per step``; 1 when the step is not explicit."""
    split = explicit_splitting(integrator, system)
    if split is None:
        return 1
    return max(1, BLOCK_BUDGET // max(1, len(split[1])))


def inner_layout(x) -> bool:
    """Whether blocks run x batch-innermost: a tensor of at least 2 dims on the CPU (measured
    there only: inductor's GPU kernels are another story) with at least ``LAYOUT_MIN_BATCH``
    rows of at most ``LAYOUT_MAX_EVENT`` elements."""
    return (isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dim() >= 2
            and x.shape[0] >= LAYOUT_MIN_BATCH and x[0].numel() <= LAYOUT_MAX_EVENT)


def batch_inner(x):
    """x with the same shape and values, laid out with dim 0 as the stride-1 axis (see the module
    docstring), where :func:`inner_layout`; else x itself."""
    if not inner_layout(x):
        return x
    return x.movedim(0, -1).contiguous().movedim(-1, 0)


def row_major_state(x):
    """x (B, *event) row-major, inside a graph.  A batch-innermost x of at most
    ``INTERLEAVE_MAX`` elements per trajectory is stored once as it is (inductor's
    ``force_stride_order``) and interleaved from there by a chain of ``torch.where`` over its
    components: inductor emits a plain loop that reads each component contiguously and writes
    each row once.  ``contiguous()`` becomes a transposing copy through tiles of (event × 16)
    with a partial store per trajectory; and the chain on an unstored x lets inductor recompute
    the step inside the store loop, vectorised along the event's few elements (Kepler, B = 4096,
    every state compiled, in that order: ×1.6–1.8, ×2.1 and ×1.4–1.5 the numba loop).  Any
    other x, or a torch without that prim: ``contiguous()``."""
    if x.dim() < 2 or x.is_contiguous() or x.stride(0) != 1 or x[0].numel() > INTERLEAVE_MAX:
        return x.contiguous()
    try:
        from torch._inductor.inductor_prims import force_stride_order
    except ImportError:
        return x.contiguous()
    x = force_stride_order(x, x.stride())
    B, m = x.shape[0], x[0].numel()
    cols = x.movedim(0, -1).reshape(m, B)            # the components, each contiguous
    k = torch.arange(m, device=x.device)
    out = cols[m - 1].unsqueeze(-1).expand(B, m)
    for j in range(m - 2, -1, -1):
        out = torch.where(k == j, cols[j].unsqueeze(-1), out)
    return out.reshape(x.shape)


#: held while systems.TRACE_FUNC_GRAD is set (CompiledStep.step under grad mode), and while a
#: compiled vector field is traced inside Newton (which turns grad on), so that no thread's
#: trace under grad mode sees another's flag (the fused iterations and the blocks and loops
#: trace without grad, where the flag is not read)
_TRACE_LOCK = threading.RLock()


def _why(err):
    """A failed compilation's reason for a warning: the error's type and first line (for an
    exception the traced code raised, dynamo's "Observed exception", the one it observed)."""
    cause = err.__cause__ or err.__context__
    if str(err).strip().startswith("Observed exception") and cause is not None:
        err = cause
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def _flat_tensors(cache) -> bool:
    """A cache the fixed-iteration blocks can carry: None, a tensor or a tuple of tensors (the
    Lie methods' (h, (z, previous z…)) warm start is not: they run compiled step by step)."""
    return (cache is None or isinstance(cache, torch.Tensor)
            or (isinstance(cache, tuple) and all(isinstance(c, torch.Tensor) for c in cache)))


def _map(fn, x):
    """fn on x, or on each item of a tuple x (a step's cache)."""
    return tuple(fn(a) for a in x) if isinstance(x, tuple) else fn(x)


def _row_major(out):
    """The block's outputs (tensors, lists of tensors, None) made contiguous again."""
    if isinstance(out, torch.Tensor):
        return out.contiguous()
    if isinstance(out, (list, tuple)):
        return type(out)(_row_major(o) for o in out)
    return out


def _fresh(fn, tag):
    """A copy of ``fn`` with its own code object, hence its own dynamo cache."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


#: Inductor options of every graph compiled here.  ``realize_cpu_opcount_threshold``: inductor
#: inlines ("rematerialises") a pointwise intermediate into each of its readers unless it is read
#: more than ``realize_reads_threshold`` (4) times or its expression has more than this many ops
#: (CPU default 50).  An unrolled block of kick–drift steps on a force without a reduction (a
#: quadratic potential: q ↦ q) is one chain of pointwise ops in which each state is read 2–3
#: times, so nothing is stored and each step's expression inlines the previous ones: inductor's
#: code generation walks a tree that grows ≈ 3.5× per unrolled step (measured on one CPU core:
#: 0.7 s / 7.6 s / 94 s of ``Scheduler.codegen`` for 2 / 4 / 6 steps, the emitted kernel staying
#: small because CSE folds the repeats; issue 21, item 14).  A force with a reduction (|q| in
#: Kepler) stores its result, which cut the chain, hence the 3 s there.  At 10 the intermediates
#: are stored every few ops: 16 unrolled steps compile in ~5 s, and the run time of the Kepler
#: and quadratic blocks did not change measurably.  (torch < 2.13 names the one threshold for
#: every device ``realize_opcount_threshold``; an option torch does not know is an error, so
#: :func:`_inductor_options` passes the name this torch has.)
REALIZE_OPCOUNT = 10


#: Inductor's C++ wrapper (``cpp_wrapper``) for small CPU graphs: the code that allocates a
#: graph's buffers and calls its kernels is C++, not Python, which is what a small batch pays
#: per block.  Measured on an idle CPU core, Kepler Verlet, ``rollout(compile=True)``, best of
#: 15, µs a step, Python → C++ wrapper: B = 1 final state 8.2 → 7.0, every state 9.9 → 8.8;
#: B = 64, 4096, 65536 unchanged (within 5 %).  It costs compile time: 0–4 s more per graph
#: with inductor's caches warm, and the first compiled rollout of a fresh process with a cold
#: cache took 55 s against 46 s (B = 512, energy-defined Kepler, one core).  So only graphs whose
#: first call's state has at most ``CPP_WRAPPER_MAX_NUMEL`` elements get it.  Read when a graph
#: is first compiled; ``CPP_WRAPPER = False`` turns it off (``experiments.bench.limits``).
CPP_WRAPPER = True
CPP_WRAPPER_MAX_NUMEL = 256
#: inductor's pattern rewrites of the graphs compiled here (``pattern_matcher``), off: one of
#: them (torch 2.13, post-grad ``addmm``) turns ``torch.add(x, mm(u, v), alpha=a)`` into
#: ``addmm(x, u, v)`` and drops a.  A kick or drift is such an add (``torch.add(p, force,
#: alpha=a·h)``, one fused kernel eagerly) and the gradient of an MLP ends in a matrix product,
#: so every compiled SeparableHNN rollout came out wrong from its second step (0.39 after two
#: Verlet steps; implicit midpoint's fixed point did not converge; a loss through compiled steps
#: 0.70 off, with wrong gradients).  Off, the Kepler blocks and loops and the implicit-midpoint
#: blocks ran as fast as with it (side by side, 2026-12-04, CPU); writing the adds as x + (a·y)
#: in traced code instead kept the rewrite away but stored more intermediates (every-state loop
#: at B = 1: 1.3–1.8 → 2.5 µs a step).  On a GPU: not measured.
PATTERN_MATCHER = False


def _inductor_options(device_type="cpu", numel=0):
    import torch._inductor.config as config   # imported by torch.compile anyway; not at our import

    opts = {}
    # On the CPU only.  On a GPU a stored intermediate is a kernel of its own when its size
    # differs from its consumer's (|q|, one per trajectory, before a kick over the coordinates):
    # with 10 (torch < 2.13 applied it to every device) an H200 ran 2.2 Triton kernels a Kepler
    # step, 255 µs a step at B = 10⁷ in float64, where torch.compile's defaults gave a hand-written
    # 16-step loop one kernel a step, 137 µs (README, "On a GPU").
    for name in ("realize_cpu_opcount_threshold", "realize_opcount_threshold"):
        if device_type == "cpu" and hasattr(config, name):
            opts[name] = REALIZE_OPCOUNT
            break
    if not PATTERN_MATCHER:
        opts["pattern_matcher"] = False
    if device_type == "cpu" and CPP_WRAPPER and numel <= CPP_WRAPPER_MAX_NUMEL:
        opts["cpp_wrapper"] = True
    return opts


def _first_tensor(args):
    """The first tensor among args (one level into tuples and lists), or None."""
    for a in args:
        for x in (a if isinstance(a, (tuple, list)) else (a,)):
            if isinstance(x, torch.Tensor):
                return x
    return None


def _device_type(args):
    """The device type of the first tensor among args ("cpu" when there is none)."""
    x = _first_tensor(args)
    return "cpu" if x is None else x.device.type


class _Compiled:
    """``torch.compile(fn)`` per device type, made at the first call on that device with its
    inductor options (:func:`_inductor_options`, from that call's device and state size), each
    with its own code object (its own dynamo cache: a system moved from the CPU to a GPU does not
    take the CPU graphs' options); the one ``torch.compile`` call here."""

    __slots__ = ("fn", "tag", "by_device", "lock", "done")

    def __init__(self, fn, tag):
        self.fn, self.tag, self.by_device, self.lock = fn, tag, {}, threading.Lock()
        self.done = set()    # the devices whose compiled function has returned once

    def __call__(self, *args):
        dev = _device_type(args)
        if dev in self.done:
            return self.by_device[dev](*args)
        with self.lock:      # (a first call may come from the compile worker thread)
            c = self.by_device.get(dev)
            if c is None:
                x = _first_tensor(args)
                c = self.by_device[dev] = torch.compile(
                    _fresh(self.fn, f"{self.tag}_{dev}"), fullgraph=True,
                    options=_inductor_options(dev, 0 if x is None else x.numel()))
        # The first call compiles (and so may a retry after it failed: _traced's, with
        # autograd traced).  Inductor imports a torch module that warns (DeprecationWarning,
        # torch.jit.script_method) once per process: under warnings as errors that would fail
        # the compile and send the rollout to eager.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.script_method` is deprecated",
                                    category=DeprecationWarning)
            out = c(*args)
        self.done.add(dev)
        return out


def _compile(fn, tag):
    return _Compiled(fn, tag)


def _traced(call, *args):
    """``call(*args)``; if that fails, again with dynamo tracing ``torch.autograd.grad`` (X_H of a
    :class:`Hamiltonian`), which is off by default.  The flag matters only while a graph is
    traced, and a config patch costs ≈ 20 µs, so it is not set on every call."""
    try:
        return call(*args)
    except Exception:  # noqa: BLE001 — retried once with the flag; a second failure propagates
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            return call(*args)


class CompileTimeout(RuntimeError):
    """Compiling a function took longer than ``COMPILE_BUDGET_S``."""


def _budgeted(ready, fn, *args):
    """``_traced(fn, *args)``; the first call of ``fn`` (the one that compiles it) runs in a
    worker thread and is abandoned after ``COMPILE_BUDGET_S`` seconds (``CompileTimeout``):
    torch.compile cannot be interrupted, and an unrolled block can take inductor minutes (or,
    for long pointwise chains, practically forever).  ``ready``: the set of compiled functions."""
    if fn in ready:
        return _traced(fn, *args)
    box, grad_mode = {}, torch.is_grad_enabled()   # (grad mode is per thread)

    def work():
        try:
            with torch.set_grad_enabled(grad_mode):
                box["out"] = _traced(fn, *args)
        except BaseException as err:  # noqa: BLE001 — handed to the caller's thread
            box["err"] = err

    worker = threading.Thread(target=work, daemon=True, name="torchgeo_int-compile")
    worker.start()
    worker.join(COMPILE_BUDGET_S)
    if worker.is_alive():
        raise CompileTimeout(f"compiling took more than the compile budget of {COMPILE_BUDGET_S:g} s "
                             "(torchgeo_int._compile.COMPILE_BUDGET_S)")
    if "err" in box:
        raise box["err"]
    ready.add(fn)
    return box["out"]


class _Block:
    """The cursor the cache carries between the calls that hand out a lookahead block: the
    states, the index of the next one, the last one handed out (the state the next call must
    receive; anything else means the caller moved on) and the force at the final state (FSAL)."""

    __slots__ = ("qs", "ps", "n", "i", "last", "force", "carry")

    def __init__(self, qs, ps, force, carry=None):
        self.qs, self.ps, self.force = qs, ps, force
        self.n, self.i, self.last = len(qs), 0, None
        self.carry = carry    # the final (q, p) in the block's layout, for the next block

    def next(self):
        q, p = self.qs[self.i], self.ps[self.i]
        self.i += 1
        self.last = q
        return q, p, self


def _force_of(cache, q):
    """The FSAL force a cache holds for state q (None when it holds none, or another state's)."""
    if isinstance(cache, _Block):
        return cache.force if (cache.i == cache.n and q is cache.last) else None
    return cache


def into_rows(q, inner) -> bool:
    """Whether every-state blocks of state q write into the output rows inside the graph
    (``CompiledStep.saves``): states of at least ``INTO_MIN_NUMEL`` elements, and batch-innermost
    ones (``inner``: the blocks take that layout) of at most ``INTERLEAVE_MAX`` a trajectory."""
    return q.numel() >= INTO_MIN_NUMEL or (inner and inner_layout(q)
                                           and q[0].numel() <= INTERLEAVE_MAX)


def _steps(eager, q, p, force, t, h, n, keep_all, rows=()):
    """What the graphs trace: the eager stepper's n steps from (q, p, force) at t ->
    (q, p, force, qs, ps); with ``keep_all`` as ``steps(1)`` n times, qs and ps the lists of the
    n states, each row-major (``contiguous``: the output rows' layout, whatever the graph's),
    else ``steps(n)`` and empty lists; with ``rows`` (the n rows of q, then the n of p: each
    a whole input, so that the kernel computing a state stores it there) the states are
    written into them instead, and the lists are empty.  Rows are written by
    :func:`row_major_state`."""
    if not keep_all:
        return (*eager.steps(q, p, t, h, n, force), [], [])
    qs, ps = [], []
    for j in range(n):
        q, p, force = eager.steps(q, p, t, h, 1, force, start=j)
        if rows:
            rows[j].copy_(row_major_state(q))
            rows[n + j].copy_(row_major_state(p))
        else:
            qs.append(row_major_state(q))
            ps.append(row_major_state(p))
    return q, p, force, qs, ps


class _Kernels:
    """The compiled functions of one (integrator, system) pair, shared by its rollouts."""

    def __init__(self, integrator, system):
        self.integrator, self.system = integrator, system
        self.eager = integrator.bind(system)   # the stepper whose step and steps are compiled
        self.name = getattr(integrator, "name", type(integrator).__name__)
        self.time_dependent = bool(getattr(system, "time_dependent", True))
        # the solve options the kernels were built with (the fused copy and the blocks freeze them)
        self.options = getattr(integrator, "options", None)
        # A system that takes t as a 0-d tensor (odeint's, as torchdiffeq's func) gets it so in
        # the graphs: a Python float would be specialised and recompiled for every step's t.
        self.tensor_time = self.time_dependent and bool(getattr(system, "tensor_time", False))
        split = explicit_splitting(integrator, system)
        self.explicit = split is not None
        # The force is carried between calls (FSAL) only when a step starts and ends with a kick;
        # otherwise the graph computes what it needs and the cache stays None.
        self.fsal = self.explicit and split[0][0] != 0.0 and split[0][-1] != 0.0
        self.failed = None            # why compiling failed; then everything runs eagerly
        self._tag = next(_ids)
        self._blocks = {}
        self.ready = set()            # the functions whose first (compiling) call is done
        # False once a block (explicit, or implicit of fixed iterations: a pair has one kind)
        # failed on the batch-innermost layout
        self.inner = True
        self.proxy = None if self.explicit else _CompiledFields(system, self, self._tag)
        # An implicit method solved by fixed-point iteration: the same method whose iterations
        # between two convergence checks run as one compiled call (``fuse``), on the system
        # itself (the iterations are traced through its vector field).
        opts = getattr(integrator, "options", None)
        self.fused = (integrator.with_options(fuse=self.fuse)
                      if not self.explicit and opts is not None and opts.solver == "fixed_point"
                      else None)
        self.fuse_failed = None       # why a fused iteration failed to compile; then eager ones
        self._chunks = {}
        self.iterations = 0           # fused iterations run so far (the checked solves' count)
        self.fixed_m = 0              # the most iterations a checked step has needed
        self.fixed_failed = None      # why a block of implicit steps failed to compile
        self.loop_failed = None       # why the compiled loop failed; then blocks (long_steps)

    def time(self, t, like):
        """t as the graphs take it: a 0-d tensor like ``like`` for a tensor-time system."""
        if self.tensor_time and not isinstance(t, torch.Tensor):
            return torch.full((), t, dtype=like.dtype, device=like.device)
        return t

    def block(self, n, keep_all, into=False):
        """The compiled n-fold composition, (q, p, force, t, h) -> (q, p, force): the eager
        stepper's ``steps(n)`` traced; with ``keep_all`` -> (qs, ps, q, p, force), qs and ps the
        lists of the n states (``steps(1)`` n times), each row-major (``contiguous``: the layout
        of the output rows, whatever the block's), and q, p, force the last ones in the block's
        layout, for the next block; with ``into``, (q, p, force, t, h, *rows) -> (q, p, force),
        the states written into ``rows`` (``_steps``)."""
        # With grad mode on (a single step with a graph) forces by autograd are traced as
        # torch.autograd.grad, without it as torch.func.grad (systems.grad_of): two graphs,
        # kept as two functions so that each one's first compile runs under the budget
        # (_budgeted), not as a recompile of one already in ``ready``.
        graph, into = torch.is_grad_enabled(), keep_all and into
        fn = self._blocks.get((n, keep_all, graph, into))
        if fn is None:
            eager, fsal = self.eager, self.fsal

            def steps(q, p, force, t, h, *rows):
                q, p, force, qs, ps = _steps(eager, q, p, force, t, h, n, keep_all, rows)
                force = force if fsal else None
                return (qs, ps, q, p, force) if keep_all and not into else (q, p, force)

            fn = self._blocks[(n, keep_all, graph, into)] = _compile(
                steps, f"{self._tag}_{n}_{int(keep_all)}{'_into' if into else ''}"
                       f"{'_graph' if graph else ''}")
        return fn

    def run_block(self, n, keep_all, q, p, force, t, h, rows=()):
        """The compiled n-step block on (q, p, force).  A block of n > 1 steps runs in the
        batch-innermost layout when the state suits it and hands its final state and force on
        in that layout, so that a run of blocks converts once (its caller makes them row-major
        again: an eager copy between the layouts costs ≈ 5–9 ns an element, a third of a
        final-state rollout's time at B = 4096 when paid at every block); one that returns every
        state (``keep_all``) writes each row-major inside the block (inductor transposes in
        registers).  (A single step would pay the copies for one state: it keeps the row-major
        layout.)  With ``rows``, the block writes its states there (``block(into=True)``) and
        returns (q, p, force)."""
        fn = self.block(n, keep_all, into=bool(rows))
        qi = batch_inner(q) if self.inner and n > 1 else q
        if qi is not q:
            try:
                return _budgeted(self.ready, fn, qi, batch_inner(p), batch_inner(force), t, h, *rows)
            except (ConvergenceError, FloatingPointError, CompileTimeout):
                raise
            except Exception:  # noqa: BLE001 — e.g. a system that calls .view() on q: row-major
                self.inner = False
                # (q, p, force may come batch-innermost from the previous block)
                q, p, force = (x.contiguous() if isinstance(x, torch.Tensor) else x
                               for x in (q, p, force))
        return _budgeted(self.ready, fn, q, p, force, t, h, *rows)

    def loop(self, m, keep_all=False):
        """The compiled loop of m-step blocks (``torch._higher_order_ops.while_loop``):
        (n, q, p, force, t, h) -> (q, p, force) after n (a 0-d int64 tensor) blocks of the eager
        stepper's ``steps(m)``, block i at time t + i·m·h; one call for a whole stretch, so the
        call's cost (dynamo's guards and wrappers, tens of µs) is paid once, not per block; with
        inductor's C++ wrapper the loop itself runs in C++.  With ``keep_all``,
        (n, q, p, force, t, h, Q, P) -> (q, p, force, Q, P): block i also writes its m states
        (``steps(1)`` m times) into rows i·m … of Q and P, which the loop carries (a functional
        write: each block copies the buffers, so they stay short; see ``LOOP_ROWS``).
        Row-major (the small states it is used for)."""
        fn = self._blocks.get(("loop", m, keep_all))
        if fn is None:
            from torch._higher_order_ops.while_loop import while_loop   # torch >= 2.4
            eager, fsal, timed = self.eager, self.fsal, self.time_dependent

            def steps(n, q, p, force, t, h, *rows):
                def cond(i, q, p, *rest):
                    return i < n

                def body(i, q, p, *rest):
                    tb = t + (i * m).to(t.dtype) * h if timed else t
                    q, p, f, qs, ps = _steps(eager, q, p, rest[0] if fsal else None, tb, h, m,
                                             keep_all)
                    bufs = ()
                    if keep_all:
                        at = i * m + torch.arange(m, device=q.device)
                        Q, P = rest[-2:]
                        bufs = (Q.index_copy(0, at, torch.stack(qs)),
                                P.index_copy(0, at, torch.stack(ps)))
                    return (i + 1, q, p) + ((f,) if fsal else ()) + bufs

                i0 = torch.zeros((), dtype=torch.int64, device=q.device)
                out = while_loop(cond, body, (i0, q, p) + ((force,) if fsal else ()) + rows)
                return (out[1], out[2], out[3] if fsal else None) + tuple(out[len(out) - len(rows):])

            fn = self._blocks[("loop", m, keep_all)] = _compile(
                steps, f"{self._tag}_loop{m}_{int(keep_all)}")
        return fn

    def fuse(self, fn, m, is_tuple):
        """The ``fuse`` of :func:`~torchgeo_int.solvers.fixed_point`: m iterations of ``fn`` and
        their residual as one compiled call, compiled once per stage function (its code: the
        step makes a new closure each time, over the same system, coefficients and h; what
        varies — the state, t — are its args).  If compiling fails, a warning says why and the
        uncompiled iterations run from then on."""
        code = getattr(fn, "__code__", None)
        if code is None or self.fuse_failed:
            return None
        key = (code, m, is_tuple)
        compiled = self._chunks.get(key)
        if compiled is None:
            def iterations(fn, zs, *args):
                return fused_iterations(fn, m, is_tuple)(zs, *args)
            compiled = self._chunks[key] = _compile(iterations, f"fp{self._tag}_{len(self._chunks)}")

        def run(zs, *args):
            self.iterations += m
            if not self.fuse_failed:
                try:
                    return _budgeted(self.ready, compiled, fn, zs, *args)
                except Exception as err:  # noqa: BLE001 — whatever dynamo/inductor raise
                    self.fuse_failed = _why(err)
                    warnings.warn(f"compile=True: could not compile the fixed-point iterations of "
                                  f"{self.name!r} ({self.fuse_failed}); running them eagerly",
                                  RuntimeWarning, stacklevel=2)
            return fused_iterations(fn, m, is_tuple)(zs, *args)
        return run

    def implicit_block(self, K, m):
        """K implicit steps whose solves each run exactly m iterations, unchecked
        (:class:`~torchgeo_int.solvers.FixedIterations`), as one compiled call:
        (q, p, cache, t, h) -> (qs, ps, q, p, cache, r), qs and ps the K states row-major (the
        output rows' layout, as the explicit blocks), q, p and cache (the warm start of the next
        solve) the last step's in the block's layout, and r the largest residual of any solve's
        last iteration (NaN if any iterate is not finite), for the caller's one check."""
        fn = self._blocks.get(("fixed", K, m))
        if fn is None:
            fixed = FixedIterations(m)
            stepper = self.integrator.with_options(fuse=fixed).bind(self.system)

            def steps(q, p, cache, t, h):
                fixed.r = None
                qs, ps = [], []
                for j in range(K):
                    q, p, cache = stepper.steps(q, p, t, h, 1, cache, start=j)
                    qs.append(q.contiguous())
                    ps.append(p.contiguous())
                return qs, ps, q, p, cache, fixed.r

            fn = self._blocks[("fixed", K, m)] = _compile(steps, f"{self._tag}_fixed{K}_{m}")
        return fn

    def first_force(self, system, q, t, cache):
        """The force the first kick needs (None when the graph computes it itself)."""
        if not self.fsal:
            return None
        return cache if cache is not None else system.force_term(q, t)


class _CompiledFields:
    """A system whose vector field, force and velocity are compiled (implicit steps call them in
    their solver loops); every other attribute is the wrapped system's."""

    def __init__(self, system, kernels, tag):
        self._system, self._kernels = system, kernels
        self._td = time_dependent = kernels.time_dependent
        s = system
        if time_dependent:
            self._vf = _compile(lambda q, p, t: s.vector_field(q, p, t), f"vf{tag}")
            self._force = _compile(lambda q, t: s.force(q, t), f"force{tag}")
            self._force_term = _compile(lambda q, t: s.force_term(q, t), f"force_term{tag}")
            self._velocity = _compile(lambda p, t: s.velocity(p, t), f"velocity{tag}")
        else:
            self._vf = _compile(lambda q, p: s.vector_field(q, p, 0.0), f"vf{tag}")
            self._force = _compile(lambda q: s.force(q, 0.0), f"force{tag}")
            self._force_term = _compile(lambda q: s.force_term(q, 0.0), f"force_term{tag}")
            self._velocity = _compile(lambda p: s.velocity(p, 0.0), f"velocity{tag}")

    def __getattr__(self, name):
        return getattr(self._system, name)

    def vector_field(self, q, p, t=0.0):
        return _budgeted(self._kernels.ready, self._vf, q, p, *((self._kernels.time(t, q),) if self._td else ()))

    def force(self, q, t=0.0):
        return _budgeted(self._kernels.ready, self._force, q, *((self._kernels.time(t, q),) if self._td else ()))

    def force_term(self, q, t=0.0):
        return _budgeted(self._kernels.ready, self._force_term, q, *((self._kernels.time(t, q),) if self._td else ()))

    def velocity(self, p, t=0.0):
        return _budgeted(self._kernels.ready, self._velocity, p, *((self._kernels.time(t, p),) if self._td else ()))


# per (integrator, system) object pair, weakly keyed (``_cache``); each entry keeps its system
# alive: bounded
_KERNELS = IdentityCache(KEEP)


def _kernels(integrator, system) -> _Kernels:
    k = _KERNELS.get((integrator, system))
    # a system whose time dependence changed (a ForcedSystem given a control u(t) later) gets
    # kernels that pass t: the old ones were traced with t fixed; an integrator whose solve
    # options were replaced (its documented way to change them) gets kernels with the new ones
    if (k is None or k.time_dependent != bool(getattr(system, "time_dependent", True))
            or k.options != getattr(integrator, "options", None)):
        k = _KERNELS.put((integrator, system), (), _Kernels(integrator, system))
    return k


class CompiledStep(Stepper):
    """The stepper of ``integrator`` on ``system`` with ``step`` and ``steps(n)`` compiled (see
    the module docstring).

    Without ``steps`` every call is one compiled step.  With the rollout's ``steps`` and ``t0``
    explicit steps run in lookahead blocks of ``block`` steps (default :func:`default_block`),
    and with its ``save_every`` too, ``steps(n)`` in blocks that return only their final state."""

    def __init__(self, integrator, system, *, steps=None, t0=0.0, block=None, save_every=None):
        super().__init__(system)
        self.integrator = integrator
        self.kernels = _kernels(integrator, system)
        self.eager = self.kernels.eager
        given = block
        if block is None:
            block = default_block(integrator, system) if steps is not None else 1
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"block must be an int >= 1, got {block!r}")
        if block > 1 and steps is None:
            raise ValueError("blocks of steps need the rollout's step count: pass steps=")
        self.block = block if self.kernels.explicit else 1
        # implicit fixed-point steps: blocks of K with a fixed iteration count (see _implicit);
        # K the given block, else IMPLICIT_BUDGET // m
        self.fixed_blocks = (steps is not None and self.kernels.fused is not None and given != 1
                             and (given is not None or steps >= FIXED_MIN_STEPS))
        self.given_block = given
        self._checked = 1    # steps to run with checks before the next block (m measured there)
        self.n_steps, self.t0 = steps, float(t0)
        # K' of the final-state blocks: a divisor of save_every, so the saves fall between them
        self.macro = (_macro_block(self.block, save_every)
                      if save_every is not None and steps is not None and steps >= save_every else 1)
        self.graph = None   # needs_graph, decided at the first planned call under grad mode
        if not self.kernels.explicit and not self.kernels.failed:
            if self.kernels.fused is not None:
                warnings.warn(f"compile=True: {self.kernels.name!r} is implicit on this system: "
                              "its fixed-point iterations between two convergence checks run "
                              "as one compiled call; without a graph, rollouts of at least "
                              f"{FIXED_MIN_STEPS} steps run blocks of steps with a fixed "
                              "iteration count, each one compiled call and one check (not the "
                              "Lie-group methods: their warm start is not a tuple of tensors)",
                              stacklevel=3)
            else:
                warnings.warn(f"compile=True: {self.kernels.name!r} is not a kick–drift "
                              "splitting on this system (an implicit, first-order or processed "
                              "method): its steps run eagerly and only the vector field is "
                              f"compiled (for states of >= {FIELDS_MIN} elements; smaller ones "
                              "run eagerly)", stacklevel=3)

    @property
    def mode(self) -> str:
        """'blocks', 'step', 'fused' (implicit, fixed-point: compiled iterations), 'fields'
        (implicit: compiled vector field) or 'eager' (failed)."""
        k = self.kernels
        if k.failed:
            return "eager"
        if not k.explicit:
            return "fused" if k.fused is not None and not k.fuse_failed else "fields"
        return "blocks" if self.block > 1 else "step"

    def _guarded(self, run, eager, hooked=False):
        """The compiled call; if it fails and the eager step does not, compilation is turned off
        for this (integrator, system) with a warning, and the eager result returned.  Failures of
        the step itself (a ConvergenceError, bad shapes) come out of the eager step."""
        try:
            return run()
        except (ConvergenceError, FloatingPointError):
            raise
        except CompileTimeout as err:
            out = eager()
            self.kernels.failed = str(err)
            warnings.warn(f"compile=True: {self.kernels.name!r}: {err}; running it eagerly",
                          RuntimeWarning, stacklevel=4)
            return out
        except Exception as err:  # noqa: BLE001 — whatever dynamo/inductor raise; eager decides
            out = eager()
            self.kernels.failed = _why(err)
            hooks = (" (saved-tensor hooks are active — grad='checkpoint', save_on_cpu — and "
                     "torch.func.grad, which forces by autograd compile to, refuses them)"
                     if hooked else "")
            warnings.warn(f"compile=True: could not compile the step of {self.kernels.name!r} "
                          f"({self.kernels.failed}){hooks}; running it eagerly", stacklevel=4)
            return out

    def _time(self, t, like):
        return self.kernels.time(t, like) if self.kernels.time_dependent else 0.0

    def step(self, system, q, p, t, h, cache=None):
        # The hot path first: the next state of a block computed for this system.
        if type(cache) is _Block and q is cache.last and cache.i < cache.n and system is self.system:
            return cache.next()
        if system is not self.system:
            raise ValueError("this compiled step was built for another system")
        k, eager_step = self.kernels, self.eager.step
        carry = (cache.carry if type(cache) is _Block and cache.carry is not None   # (implicit)
                 and q is cache.last and p is cache.ps[cache.i - 1] else None)
        cache = _force_of(cache, q)
        eager = lambda: eager_step(system, q, p, t, h, cache)  # noqa: E731
        if k.failed:
            return eager()
        if not k.explicit:
            if k.fused is not None:     # (falls back to eager iterations itself)
                return self._implicit(system, q, p, t, h, cache, carry)
            if q.numel() < FIELDS_MIN:
                return eager()
            with _TRACE_LOCK:   # (Newton may turn grad on: no other thread's flag up while it traces)
                return self._guarded(lambda: self.integrator.step(k.proxy, q, p, t, h, cache), eager)
        n = 1 if torch.is_grad_enabled() else self.block
        if n > 1:
            if q.numel() * n > LOOKAHEAD_MAX:
                n = 1
            elif self.n_steps - round((t - self.t0) / h) < n:
                return eager()               # the tail: no second graph to compile
        force = k.first_force(system, q, t, cache)
        if n > 1:
            out = self._guarded(lambda: k.run_block(n, True, q, p, force, self._time(t, q), h), eager)
            return out if k.failed else _Block(out[0], out[1], _row_major(out[4])).next()
        # one step, under grad mode where there is one (no lookahead): forces by autograd are
        # traced as torch.func.grad here, outside saved-tensor hooks (systems.TRACE_FUNC_GRAD)
        if not torch.is_grad_enabled():
            return self._guarded(lambda: k.run_block(1, False, q, p, force, self._time(t, q), h), eager)
        with _TRACE_LOCK:    # (another thread's flag must not reach this trace: hooks are per thread)
            hooked = systems.saved_tensor_hooks_active()
            systems.TRACE_FUNC_GRAD = not hooked
            try:
                return self._guarded(lambda: k.run_block(1, False, q, p, force, self._time(t, q), h),
                                     eager, hooked=hooked)
            finally:
                systems.TRACE_FUNC_GRAD = False

    def _implicit(self, system, q, p, t, h, cache, carry=None):
        """A fixed-point implicit step.  Checked (``fused``: the iterations between two checks
        compiled, a host sync per check), which measures the iterations m the solve needs; or,
        without a graph and once m is known, a block of K steps whose solves run exactly m
        iterations each as one compiled call and one check of the block's worst residual
        (:meth:`_Kernels.implicit_block`).  A block over the tolerance (or not finite) is
        dropped and its K steps run checked, which raises m where they need more (m never
        falls, and each m compiles once).  A solve then runs at least as many iterations as
        the checked one: its answer differs from that one's by about tol / (1 − L), L the
        contraction factor of the fixed-point map (the last residual is ≤ tol).  No blocks for a
        first-order state or an empty batch."""
        k, m = self.kernels, self.kernels.fixed_m
        K = self.given_block or IMPLICIT_BUDGET // max(m, 1)
        if (self.fixed_blocks and K > 1 and self._checked <= 0 and not k.fixed_failed
                and p is not None and q.numel() and not torch.is_grad_enabled()
                and _flat_tensors(cache)
                and 0 < m <= FIXED_MAX_ITER and q.numel() * K <= LOOKAHEAD_MAX
                and self.n_steps - round((t - self.t0) / h) >= K):
            try:
                # (batch-innermost, as the explicit blocks: 2.6× faster at B = 256 Kepler; a
                # block's final state goes on to the next in that layout, its ``carry``)
                inner = batch_inner if k.inner else (lambda x: x)
                qb, pb = carry or (inner(q), inner(p))
                if not (isinstance(cache, tuple)
                        and all(c.dim() and c.stride(0) == 1 for c in cache)):
                    cache = _map(inner, cache)    # (else a block's, in its layout)
                try:
                    qs, ps, qb, pb, last, r = _budgeted(k.ready, k.implicit_block(K, m), qb,
                                                        pb, cache, self._time(t, q), h)
                except Exception:  # noqa: BLE001 — once more row-major (a system's q.view())
                    if qb.is_contiguous() and pb.is_contiguous():
                        raise
                    k.inner = False
                    qs, ps, qb, pb, last, r = _budgeted(
                        k.ready, k.implicit_block(K, m), qb.contiguous(), pb.contiguous(),
                        _row_major(cache), self._time(t, q), h)
            except Exception as err:  # noqa: BLE001 — whatever dynamo/inductor raise
                k.fixed_failed = _why(err)
                warnings.warn(f"compile=True: could not compile a block of {self.kernels.name!r} "
                              f"steps ({k.fixed_failed}); running them step by step",
                              RuntimeWarning, stacklevel=4)
            else:
                tol = self.integrator.options.tol
                if float(r) <= (default_tol(q.dtype) if tol is None else tol):   # one sync
                    return _Block(qs, ps, last, (qb, pb)).next()
                self._checked = K     # (NaN too): these K steps again, checked
        # t as the graphs take it (a 0-d tensor for a tensor-time system: a float would be a
        # constant of the fused iterations' graph, recompiled every step); a block's warm start
        # is batch-innermost, the checked graphs take it row-major
        before = k.iterations
        out = k.fused.step(system, q, p, self._time(t, q), h, _row_major(cache))
        k.fixed_m = max(m, k.iterations - before)
        self._checked -= 1
        return out

    decides_graph = True     # saves() under grad mode: None when the steps need a graph

    def _graph(self, q, p, t, h):
        """Under grad mode: whether this rollout keeps a graph (:func:`needs_graph`, decided at
        the first planned call from its state; True without a plan, ``steps``)."""
        if self.n_steps is None:
            return True
        if self.graph is None:
            self.graph = needs_graph(self.integrator, self.system, q, p, t, h)
        return self.graph

    def saves(self, q, p, t0, h, n, cache=None, *, start=0, rows):
        """Every state written: compiled blocks of K steps each return their K states, written
        into K rows by one ``torch.stack(out=)`` — no Python per step, the point at small
        batches — or, for states of at least ``INTO_MIN_NUMEL`` elements and batch-innermost
        ones of few (``INTERLEAVE_MAX``), write them into the rows inside the graph (no second
        copy of each state, the point at large batches; :func:`row_major_state`); the
        block's last state and force go on to the next block in its layout (see
        ``run_block``); the last ``n mod K`` steps run eagerly (no second graph to compile)."""
        k, K = self.kernels, self.block
        if torch.is_grad_enabled():
            if self._graph(q, p, t0 + start * h, h):
                return None
            with torch.no_grad():
                return self.saves(q, p, t0, h, n, cache, start=start, rows=rows)
        if not k.explicit and self.fixed_blocks and not k.failed and p is not None:
            return self._implicit_saves(q, p, t0, h, n, cache, start, rows)
        if K == 1 or k.failed or not k.explicit:
            return super().saves(q, p, t0, h, n, cache, start=start, rows=rows)
        qs, ps = rows
        system, force, eager = self.system, _force_of(cache, q), self.eager
        # into the rows: large states, and batch-innermost ones that row_major_state
        # interleaves (there the stacked path's extra copy costs more than the inputs: Kepler,
        # B = 1100 / 2048 / 4096, 18.4 / 15.6 / 12.3 against 17.2 / 13.9 / 10.6 ns a step·
        # trajectory)
        into = into_rows(q, k.inner)
        full, j = n - n % K, 0
        while j < full and not k.failed:     # (a block that fell back to eager: the rest eagerly)
            t = t0 + (start + j) * h
            first = k.first_force(system, q, t, force)

            rq, rp = qs[j:j + K], ps[j:j + K]

            def fallback(q=q, p=p, t=t, force=force, rq=rq, rp=rp):
                return eager.saves(q, p, t, h, K, force, rows=(rq, rp))
            if into:
                q, p, force = self._guarded(lambda: k.run_block(
                    K, True, q, p, first, self._time(t, q), h, (*rq.unbind(0), *rp.unbind(0))),
                    fallback)
            else:
                qk, pk, q, p, force = self._guarded(
                    lambda: k.run_block(K, True, q, p, first, self._time(t, q), h),
                    lambda: (None, None, *fallback()))
                if qk is not None:
                    torch.stack(qk, out=rq)
                    torch.stack(pk, out=rp)
            j += K
        if j:        # the last block's state and force row-major again, for eager steps and callers
            q, p, force = qs[j - 1], ps[j - 1], _row_major(force)
        if j < n:    # the rest eagerly: no second graph to compile
            return eager.saves(q, p, t0, h, n - j, force, start=start + j, rows=(qs[j:], ps[j:]))
        return q, p, force

    def _implicit_saves(self, q, p, t0, h, n, cache, start, rows):
        """``saves`` of fixed-point implicit steps: a block that fits in the rows is written by
        one ``torch.stack(out=)`` each for q and p, other steps one row each."""
        qs, ps = rows
        j = 0
        try:
            while j < n:
                q, p, cache = self.step(self.system, q, p, t0 + (start + j) * h, h, cache)
                if type(cache) is _Block and cache.i == 1 and cache.n <= n - j:
                    rq, rp = qs[j:j + cache.n], ps[j:j + cache.n]
                    torch.stack(cache.qs, out=rq)
                    torch.stack(cache.ps, out=rp)
                    j += cache.n
                    # the cursor at its end, at the rows (so the next step finds its warm start
                    # and the block's layout of them, its carry)
                    q, p, cache.i = rq[-1], rp[-1], cache.n
                    cache.last, cache.ps[-1] = q, p
                else:
                    qs[j], ps[j] = q, p
                    j += 1
        except ConvergenceError as err:
            raise err.with_step(start + j) from None
        return q, p, cache

    def long_steps(self, q, p, t0, h, n, cache=None, *, start=0, rows=None):
        """``steps(n)`` — or with ``rows``, ``saves(n)`` — as compiled loops
        (:meth:`_Kernels.loop`) over K'-step blocks (K-step ones when keeping every state), with
        no check in between (``run_loop`` checks the final state, and reruns the stretch checked
        if it is not finite): one loop for the final state, one per ``LOOP_ROWS`` elements of
        states kept.  None, having done nothing, where that does not apply: an empty state or
        one of more than ``LOOP_MAX_NUMEL`` elements (there a call's cost is small beside the
        arithmetic, and the blocks run batch-innermost), a state off the CPU (measured there
        only; on a GPU the loop's condition would be a host sync per block), fewer than two
        blocks, a time-dependent system that takes t as a float (in a loop t is a tensor), a
        rollout that keeps a graph, or a loop that failed to compile (then the blocks run, as
        without it; a compile that timed out: eager, as for a block)."""
        k = self.kernels
        m = self.block if rows is not None else self.macro
        if (m == 1 or n < 2 * m or not k.explicit or k.failed or k.loop_failed or p is None
                or not 0 < q.numel() <= LOOP_MAX_NUMEL or q.device.type != "cpu"
                or (k.time_dependent and not k.tensor_time)):
            return None
        if torch.is_grad_enabled():
            if self._graph(q, p, t0 + start * h, h):
                return None
            with torch.no_grad():
                return self.long_steps(q, p, t0, h, n, cache, start=start, rows=rows)
        keep = rows is not None
        # blocks per call: all of them for the final state; for every state as many as keep
        # the carried buffers within LOOP_ROWS elements (at least 2)
        per = (n // m if not keep else max(2, LOOP_ROWS // (m * q.numel())))
        force = k.first_force(self.system, q, t0 + start * h, _force_of(cache, q))
        if ("loop", m, keep) not in k._blocks:
            # one eager step first, discarded: the system's once-only output checks (a flag set
            # at the first call) run outside the loop, whose body may not change outer state
            k.eager.steps(q, p, t0, h, 1, force, start=start)
        bufs = (torch.empty((per * m, *q.shape), dtype=q.dtype, device=q.device),
                torch.empty((per * m, *p.shape), dtype=p.dtype, device=p.device)) if keep else ()
        j = 0
        while n - j >= m:
            blocks = min(per, (n - j) // m)
            t = t0 + (start + j) * h
            try:
                out = _budgeted(k.ready, k.loop(m, keep), torch.tensor(blocks, device=q.device),
                                q, p, force, self._time(t, q), h, *bufs)
            except CompileTimeout as err:
                # the abandoned compile holds dynamo's lock until it ends: a block compiled now
                # would wait for it, so eager from here on, as for a block that timed out
                k.loop_failed = k.failed = str(err)
                warnings.warn(f"compile=True: {k.name!r}: {err}; running it eagerly",
                              RuntimeWarning, stacklevel=4)
                return None if j == 0 else self._rest(q, p, t0, h, n, j, force, start, rows)
            except Exception as err:  # noqa: BLE001 — whatever dynamo/inductor raise; blocks then
                k.loop_failed = _why(err)
                return None if j == 0 else self._rest(q, p, t0, h, n, j, force, start, rows)
            q, p, force = out[:3]
            if keep:
                rows[0][j:j + blocks * m] = out[3][:blocks * m]
                rows[1][j:j + blocks * m] = out[4][:blocks * m]
            j += blocks * m
        return self._rest(q, p, t0, h, n, j, force, start, rows)

    def _rest(self, q, p, t0, h, n, j, force, start, rows):
        """The steps j … n − 1 of a ``long_steps`` call after its loops: blocks and the eager
        tail as without loops (a loop that failed midway), or just the tail (no second graph)."""
        if j < n:
            if rows is not None:
                return self.saves(q, p, t0, h, n - j, force, start=start + j,
                                  rows=(rows[0][j:], rows[1][j:]))
            return self.steps(q, p, t0, h, n - j, force, start=start + j)
        return q, p, force

    def steps(self, q, p, t0, h, n, cache=None, *, start=0, out=None):
        if n == 1 and type(cache) is _Block and q is cache.last and cache.i < cache.n:
            return cache.next()     # every state saved: the next state of a lookahead block
        if torch.is_grad_enabled():
            if not self._graph(q, p, t0 + start * h, h):
                with torch.no_grad():    # the graphs (and outputs) of a no_grad rollout
                    return self.steps(q, p, t0, h, n, cache, start=start)
        m, k = self.macro, self.kernels
        if m == 1 or k.failed or p is None or torch.is_grad_enabled():
            return super().steps(q, p, t0, h, n, cache, start=start)   # n calls of self.step
        system, force = self.system, _force_of(cache, q)
        full = n - n % m
        for j in range(start, start + full, m):
            if k.failed:     # a block fell back to eager: the rest runs eagerly too
                q, p, force = self.eager.steps(q, p, t0, h, start + full - j, force, start=j)
                break
            t = t0 + j * h
            first = k.first_force(system, q, t, force)
            eager = lambda: self.eager.steps(q, p, t, h, m, force)  # noqa: E731
            q, p, force = self._guarded(
                lambda: k.run_block(m, False, q, p, first, self._time(t, q), h), eager)
        # the blocks' layout (batch-innermost) row-major again, once for the whole stretch
        q, p, force = _row_major((q, p, force))
        if full < n:     # the rest eagerly: no second graph to compile
            q, p, force = self.eager.steps(q, p, t0, h, n - full, force, start=start + full)
        return q, p, force


def compiled_step(integrator, system, *, steps=None, t0=0.0, block=None,
                  save_every=None) -> Stepper:
    """The stepper ``compile=True`` uses; see :class:`CompiledStep`.  A processed method keeps
    its π⁻¹ and π eager around its compiled kernel, once a run and once a saved state as its
    bound stepper has them (compiled as a whole it is no splitting: it ran step by step, π
    after every step, 2.5× the force evaluations)."""
    if isinstance(integrator, ProcessedSplitting):
        kernel = CompiledStep(integrator.kernel, system, steps=steps, t0=t0, block=block,
                              save_every=save_every)
        return integrator.bind(system, kernel=kernel)
    return CompiledStep(integrator, system, steps=steps, t0=t0, block=block, save_every=save_every)


def _macro_block(K, save_every):
    """The largest divisor of save_every that is ≤ K (1: no final-state blocks)."""
    return max(d for d in range(1, min(K, save_every) + 1) if save_every % d == 0)


def compiled_rollout(integrator, system, q0, p0, *, h, steps, t0=0.0, save_every=1,
                     check_every=64, block=None, step_offset=0, progress=None):
    """``run_loop`` with the planned compiled stepper: what ``solve(..., compile=True,
    grad=Backprop())`` runs, with the block size K as a parameter.  Same outputs as
    ``run_loop(integrator.step, ...)`` up to round-off."""
    step = compiled_step(integrator, system, steps=steps, t0=t0, block=block, save_every=save_every)
    return run_loop(step, q0, p0, system=system, h=h, steps=steps, t0=t0, save_every=save_every,
                    check_every=check_every, step_offset=step_offset, progress=progress)


def needs_graph(integrator, system, q0, p0, t0, h) -> bool:
    """Whether a compiled rollout under grad mode keeps a graph: a state or a parameter of the
    system requires grad, or one eager step from (q0, p0) returns a state that does (the step
    reads a captured tensor that requires grad).  Otherwise it runs as under
    ``torch.no_grad()``: the blocks of steps, not one compiled step per call with autograd's
    bookkeeping.  (Decided from the first step: a system whose dependence on such a tensor
    starts later, by Python control flow on t, needs the eager rollout, which checks every
    saved state.)"""
    params = system.parameters() if isinstance(system, torch.nn.Module) else ()
    if any(x is not None and x.requires_grad for x in (q0, p0)) or any(w.requires_grad for w in params):
        return True
    try:
        q, p, _ = integrator.step(system, q0, p0, t0, h, None)
    except Exception:  # noqa: BLE001 — the rollout itself reports a failing step
        return True
    return any(isinstance(x, torch.Tensor) and x.requires_grad for x in (q, p))
