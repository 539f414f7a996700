r"""Differentiable implicit solves: fixed-point iteration and Newton's method.

Every implicit integrator step goes through this module.

Conventions
-----------
* A state ``z`` is a tensor or a tuple of tensors. Batch dims lead, the **last** dim holds the
  coordinates, and all tuple components share the batch shape ``z.shape[:-1]`` (a 0-d tensor is
  one sample with one coordinate). A *sample* is one index of the batch dims; samples are
  assumed independent: component ``b`` of ``fn(z)`` / ``residual(z)`` depends on ``z_b`` only.
* Per-sample convergence on the whole batch at once, measured in a mixed abs/rel max-norm

      r_b = max over components c of  ||d_c||_inf / (1 + ||z_c||_inf)     (norms over sample b)

  with d = fn(z) - z (fixed point), d = residual(z) (Newton): absolute below ~1, relative
  above. Each component is scaled by its own max-norm, because components (q, p) may differ
  in scale while the round-off of one coordinate is relative to its whole vector (a
  per-coordinate scale stalls, e.g. on large float32 adjoints). A sample is frozen
  (``torch.where``; it stops changing) once ``r_b <= tol``. Convergence and finiteness are
  checked every ``check_every`` iterations only: one host sync per check. ``fn`` is always
  evaluated on the full batch, because it may close over batch-shaped tensors (``x``, ``q_k``,
  ...), so the active samples cannot be gathered out.
* ``tol=None`` means :func:`default_tol` of the state's (least precise) dtype.
* Failure is loud: no convergence in ``max_iter`` iterations, a non-finite iterate, or a
  singular Newton Jacobian raise :class:`ConvergenceError`. A NaN is never returned.

Calling contract for ``fn`` / ``residual``
------------------------------------------
They are called with and without a graph: under ``torch.no_grad()`` during the forward solve,
and under grad mode (possibly with an input that does not require grad) for the extra
application that carries gradients. Parameters enter through the closure (modules, tensors with
``requires_grad``). A function that needs autograd inside (e.g. a Hamiltonian vector field)
should do::

    create = torch.is_grad_enabled()
    with torch.enable_grad():
        q = q if q.requires_grad else q.detach().requires_grad_()
        dH = torch.autograd.grad(H(q).sum(), q, create_graph=create)[0]

Only plain ``torch.autograd`` is used here (no ``torch.func``): ``vmap``/``jacrev`` fail on
functions that call ``torch.autograd.grad`` themselves.

``args``: the tensors ``fn`` / ``residual`` is built from besides z — an integrator step's
current state — are best passed as ``args=(q, p, ...)`` and received as ``fn(z, *args)``
rather than captured in a closure. The solver hands them over detached wherever only ∂/∂z is
needed (Newton's Jacobians, the adjoint's vector–Jacobian products) and as they are to the one
application that carries gradients. A captured tensor gives the same values and gradients, but
every one of those autograd calls walks its whole history (autograd visits all of the graph
behind a fresh leaf), which in a rollout under grad grows with the step count: each step's
solve costs O(steps so far), the rollout O(steps²) (400 implicit midpoint steps with Newton
under grad: 14.9 s captured, 1.16 s as args; ``python experiments/solver_history.py``).

Gradients
---------
``backward="implicit"`` (default). With z* = fn(z*, θ) the implicit function theorem gives
dz*/dθ = (I - J)⁻¹ ∂fn/∂θ, J = ∂fn/∂z at z*. The solve runs without a graph; then
``z = fn(z*.detach())`` is applied once with grad (its graph reaches θ and whatever ``fn``
captures) and passed through an identity ``autograd.Function`` whose backward maps the incoming
cotangent g to the solution of the adjoint equation

      u = g + Jᵀ u

by fixed-point iteration with vector-Jacobian products (same norm, freezing and failure modes;
it converges whenever the forward iteration is a contraction at z*). Memory is independent of
the number of forward iterations. The result does not depend on the initial guess, so ``z0``
receives no gradient (``None`` / zero). Higher-order gradients are not supported: a backward
with ``create_graph=True`` through the solve raises ``RuntimeError`` (rather than silently
dropping the terms through J); use ``backward="unroll"`` for those.

``backward="unroll"`` keeps the graph through every iteration (memory linear in the iteration
count; grad of grad works; ``z0`` gets its — decaying — gradient). For comparisons and tiny
problems.

Size: one module because fixed_point, newton, their implicit-function-theorem backward and
SolveOptions share the per-sample state handling (``_Struct``) and the convergence reporting.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import torch

from ._autograd import internal_leaf, reaches_other_leaves

__all__ = ["ConvergenceError", "SolveOptions", "default_tol", "fixed_point", "newton"]

_BACKWARDS = ("implicit", "unroll")
SOLVERS = ("fixed_point", "newton")
_FP_HINT = "reduce the step size h, or use solver='newton'"
_NEWTON_HINT = ("reduce the step size h, or raise max_iter (the method's options); a direct "
                "newton() call also takes damping < 1 or a better initial guess")
_ADJOINT_HINT = ("the adjoint iteration u = g + J^T u needs fn to be a contraction at the "
                 "solution; reduce the step size h, or raise backward_max_iter")
#: appended to the message of a non-finite iterate (residual NaN or inf): a field that is NaN or
#: inf at the step's states (a NaN in func, a damping or a force) gives the same symptom as a
#: step too large for the map
_NONFINITE_NOTE = ("; if the field itself is NaN or inf at these states (evaluate it there), "
                   "no step size helps: fix the field")
_MAX_HALVINGS = 5  # Newton backtracking: at most 2^-5 of the full step before accepting anyway


class ConvergenceError(RuntimeError):
    """An implicit solve failed: no convergence, a non-finite iterate, or a singular Jacobian.

    Attributes: ``iterations`` (int), ``residual`` (worst per-sample residual, float; ``nan``/
    ``inf`` for a non-finite iterate), ``tol`` (float), ``step`` (integrator step index or
    ``None``). Integrators add the step with ``raise err.with_step(k) from None``.
    """

    def __init__(self, reason, *, iterations, residual, tol, step=None, hint=_FP_HINT):
        self.reason = str(reason)
        self.iterations = int(iterations)
        self.residual = float(residual)
        self.tol = float(tol)
        self.step = None if step is None else int(step)
        self.hint = str(hint)
        super().__init__(self._message())

    def _message(self):
        at = "" if self.step is None else f"integrator step {self.step}: "
        return (f"{at}{self.reason} after {self.iterations} iterations (worst residual "
                f"{self.residual:.3e}, tolerance {self.tol:.3e}); {self.hint}"
                + ("" if math.isfinite(self.residual) else _NONFINITE_NOTE))

    def with_step(self, step) -> "ConvergenceError":
        """A copy whose message also names the integrator step index ``step``."""
        return type(self)(self.reason, iterations=self.iterations, residual=self.residual,
                          tol=self.tol, step=step, hint=self.hint)

    def __reduce__(self):  # keyword-only __init__: keep the error picklable (multiprocessing)
        return (_rebuild_error, (type(self), self.reason, self.iterations, self.residual,
                                 self.tol, self.step, self.hint))


def _rebuild_error(cls, reason, iterations, residual, tol, step, hint):
    return cls(reason, iterations=iterations, residual=residual, tol=tol, step=step, hint=hint)


@functools.lru_cache(maxsize=None)
def default_tol(dtype) -> float:
    """Default tolerance for the mixed abs/rel residual: ``max(eps**0.85, 4*eps)``.

    float64: 5.0e-14 (~220 eps, well above the round-off floor of typical maps, no wasted
    iterations); float32: 1.3e-6; float16: 3.9e-3; bfloat16: 3.1e-2. Low precisions get a few
    ulps, because an iteration in them stalls within an ulp or two of the fixed point.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"default_tol needs a floating-point torch.dtype, got {dtype!r}")
    eps = torch.finfo(dtype).eps
    return max(eps ** 0.85, 4.0 * eps)


class _Struct:
    """The tensor-or-tuple layout of a state, and batch-wise helpers over it."""

    def __init__(self, z0):
        if isinstance(z0, torch.Tensor):
            self.is_tuple, zs = False, (z0,)
        elif isinstance(z0, tuple):
            self.is_tuple, zs = True, z0
            if not zs:
                raise ValueError("z0 is an empty tuple")
        else:
            raise TypeError(f"z0 must be a tensor or a tuple of tensors, got {type(z0).__name__}")
        for i, t in enumerate(zs):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"z0[{i}] must be a tensor, got {type(t).__name__}")
            if not t.is_floating_point():
                raise TypeError(f"z0[{i}] must be floating point, got {t.dtype}")
        self.batch = zs[0].shape[:-1]
        for i, t in enumerate(zs):
            if t.shape[:-1] != self.batch:
                raise ValueError(
                    f"tuple components must share the batch shape z.shape[:-1]: z0[0] has "
                    f"{tuple(self.batch)}, z0[{i}] has {tuple(t.shape[:-1])}")
            if t.dim() and t.shape[-1] == 0:
                raise ValueError(f"z0[{i}] has an empty last (coordinate) dimension")
            if t.device != zs[0].device:
                raise ValueError(f"z0[{i}] is on {t.device}, z0[0] on {zs[0].device}")
        self.zs = zs
        self.checked = False
        self.shapes = [t.shape for t in zs]
        self.dtypes = [t.dtype for t in zs]
        self.sizes = [t.shape[-1] if t.dim() else 1 for t in zs]
        self.device = zs[0].device
        self.dtype = max(self.dtypes, key=lambda d: torch.finfo(d).eps)

    def call(self, fn, zs, name, args=()):
        """fn(z, *args) on the user's structure; the result as a tuple, validated on the first
        call (a solve calls one fn many times; its output layout does not change between calls)."""
        out = fn(zs if self.is_tuple else zs[0], *args)
        if self.checked:
            return tuple(out) if self.is_tuple else (out,)
        if self.is_tuple:
            if not isinstance(out, (tuple, list)) or len(out) != len(self.zs):
                raise TypeError(f"{name} must return a tuple of {len(self.zs)} tensors like z0")
        else:
            if not isinstance(out, torch.Tensor):
                raise TypeError(f"{name} must return a tensor like z0, got {type(out).__name__}")
            out = (out,)
        for i, (o, shape, dtype) in enumerate(zip(out, self.shapes, self.dtypes)):
            if not isinstance(o, torch.Tensor) or o.shape != shape or o.dtype != dtype:
                got = (tuple(o.shape), o.dtype) if isinstance(o, torch.Tensor) else type(o)
                raise ValueError(f"{name} output {i} must match z0 (shape {tuple(shape)}, "
                                 f"{dtype}), got {got}")
        self.checked = True
        return tuple(out)

    def pack(self, zs):
        return tuple(zs) if self.is_tuple else zs[0]

    def where(self, done, a, b):
        """Per sample: a where done, else b."""
        return tuple(torch.where(done.unsqueeze(-1) if x.dim() else done, x, y)
                     for x, y in zip(a, b))

    def flatten(self, zs):
        return torch.cat([t.reshape(*self.batch, n) for t, n in zip(zs, self.sizes)], -1)

    def unflatten(self, x):
        parts = torch.split(x, self.sizes, -1)  # .to: cat promoted mixed-dtype components
        return tuple(p.reshape(s).to(d) for p, s, d in zip(parts, self.shapes, self.dtypes))


def _detached(args):
    """``args`` with its tensors detached: what ∂/∂z needs, without their history."""
    if not isinstance(args, tuple):
        raise TypeError(f"args must be a tuple, got {type(args).__name__}")
    if not torch.is_grad_enabled():  # no graph to cut: skip the kernels (inference rollouts)
        return args
    return tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)


def identity_minus(fn):
    """(z, *args) ↦ z − fn(z, *args), per component for a tuple z: the residual of the fixed-point
    equation z = fn(z) (for :func:`newton`), or the fixed-point map z − r(z) of a residual r."""
    def g(z, *args):
        out = fn(z, *args)
        return tuple(a - b for a, b in zip(z, out)) if isinstance(z, tuple) else z - out
    return g


def _check_int(value, name):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def _check_args(backward, max_iter, check_every):
    if backward not in _BACKWARDS:
        raise ValueError(f"backward must be one of {_BACKWARDS}, got {backward!r}")
    _check_int(max_iter, "max_iter")
    _check_int(check_every, "check_every")


def _resolve_tol(tol, struct, name="tol"):
    if tol is None:
        return default_tol(struct.dtype)
    tol = float(tol)
    if not tol >= 0:
        raise ValueError(f"{name} must be >= 0, got {tol!r}")
    return tol


def _worst(r, done):
    return torch.where(done, torch.zeros_like(r), r).max().item()


def _iterate(step, z, struct, tol, max_iter, check_every, what, hint, chunk=None):
    """z <- step(z) per sample until r_b <= tol for every sample; returns (z, iterations).

    A sample's result is its first iterate with r_b <= tol.  Converged samples go on iterating
    with the batch (fn runs on the whole batch anyway, and a contraction keeps them converged);
    their results are kept aside at the check that saw them converge, so the loop between
    checks is fn alone.  ``chunk`` (z -> (the check_every-th iterate, its r_b against the one
    before)): the iterations between two checks in one call (a compiled
    :func:`fused_iterations`), used while whole stretches fit under max_iter."""
    done = kept = None   # per-sample converged mask, and the converged samples' results
    k = 0
    while k < max_iter:
        if chunk is not None and k + check_every <= max_iter:
            new, r = chunk(z)
            k += check_every
        else:
            new = step(z)
            k += 1
            if k % check_every and k != max_iter:
                z = new
                continue
            r = residual_of(new, z)
        if r.numel() == 0:   # an empty batch: no sample to converge (aminmax has no identity)
            return new, k
        active = r if done is None else torch.where(done, torch.zeros_like(r), r)
        # One host sync per check: the worst residual of the samples still iterating (NaN or
        # inf when an iterate is non-finite: aminmax propagates NaN) and the best one.
        best, worst = torch.stack(torch.aminmax(active)).tolist()
        if not (worst == worst and worst < float("inf")):
            raise ConvergenceError(f"{what}: the iterate became non-finite (NaN or inf)",
                                   iterations=k, residual=worst, tol=tol, hint=hint)
        if worst <= tol:
            return (new if done is None else struct.where(done, kept, new)), k
        if done is not None:
            kept, done = struct.where(done, kept, new), done | (r <= tol)
        elif best <= tol:
            kept, done = new, r <= tol
        z = new
    raise ConvergenceError(f"{what} did not converge", iterations=max_iter,
                           residual=worst, tol=tol, hint=hint)


def fused_iterations(fn, m, is_tuple=True):
    """(zs, *args) -> (zs_m, r_b): m applications of ``fn`` (zs, zs_m tuples of tensors; fn
    takes and returns a tuple when ``is_tuple``, else one tensor) and the per-sample residual
    of the last one, r_b = max_c ||z_m,c − z_{m−1},c||_inf / (1 + ||z_{m−1},c||_inf) — what
    :func:`fixed_point` does between two checks, as one function of tensors, for
    ``compile=True`` to compile (the ``fuse`` option of :class:`SolveOptions`)."""
    def iterations(zs, *args):
        prev = zs
        for _ in range(m):
            out = fn(zs if is_tuple else zs[0], *args)
            prev, zs = zs, (tuple(out) if is_tuple else (out,))
        return zs, residual_of(zs, prev)
    return iterations


class FixedIterations:
    """The ``fuse`` option that makes :func:`fixed_point` run exactly ``m`` iterations with no
    check and no host sync (without a graph only), for ``compile=True``'s blocks of implicit
    steps: the block is one compiled call, and the largest per-sample residual of the last
    iteration of every solve in it, kept in ``r`` (a 0-d tensor; NaN propagates), is checked
    once after the call, which is rejected (and re-run with checks) where it exceeds the
    tolerance.  Run to a fixed m ≥ the checked solve's iterations, the answer differs from that
    solve's by about tol / (1 − L), L the contraction factor of the map."""

    def __init__(self, m: int):
        self.m = _check_int(m, "m")
        self.r = None

    def record(self, r):
        r = r.amax() if r.numel() else r.new_zeros(())
        self.r = r if self.r is None else torch.maximum(self.r, r)


def residual_of(new, old, diff=True):
    """r_b = max over components c of ||new_c - old_c||_inf / (1 + ||old_c||_inf); with
    diff=False, new already is the difference."""
    r = None
    for a, z in zip(new, old):
        d, s = (a - z if diff else a).abs(), z.abs()
        if z.dim():   # (not linalg.vector_norm(ord=inf): ~40x slower on CPU in torch 2.13)
            d, s = d.amax(-1), s.amax(-1)
        e = d / (1 + s)
        r = e if r is None else torch.maximum(r, e)
    return r


def first_order_only(name, remedy="backward='unroll'"):
    """Refuse grad of grad in a backward that gives first-order gradients only (its result
    would otherwise be taken as a constant: second derivatives of zero, silently)."""
    # Grad mode is on inside a backward iff it runs with create_graph=True.
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"{name} provides first-order gradients only; a backward pass with "
            f"create_graph=True (grad of grad) through it is not supported. Use {remedy} for "
            f"higher-order gradients.")


class _Adjoint:
    """Everything the backward of the identity needs, besides the saved z*."""

    def __init__(self, fn, args, struct, tol, max_iter, check_every):
        self.fn, self.args, self.struct, self.tol = fn, args, struct, tol
        self.max_iter, self.check_every = max_iter, check_every

    def solve(self, z_star, g):
        """u = g + Jᵀu by fixed-point iteration, J = ∂fn/∂z at z* (``args`` detached)."""
        with torch.enable_grad():
            zs = tuple(t.detach().requires_grad_() for t in z_star)
            f = self.struct.call(self.fn, zs, "fn", self.args)
        idx = [i for i, t in enumerate(f) if t.requires_grad]
        if not idx:  # fn ignores z: J = 0
            return g
        outs = [f[i] for i in idx]

        def step(u):
            vjp = torch.autograd.grad(outs, zs, [u[i] for i in idx], retain_graph=True,
                                      allow_unused=True)
            return tuple(gi if v is None else gi + v for gi, v in zip(g, vjp))

        u, _ = _iterate(step, g, self.struct, self.tol, self.max_iter, self.check_every,
                        "fixed_point implicit backward (adjoint solve)", _ADJOINT_HINT)
        return u


class _FixedPointAdjoint(torch.autograd.Function):
    """Identity on z = fn(z*); backward returns the adjoint solution u of u = g + Jᵀu."""

    @staticmethod
    def forward(ctx, spec, n, *tensors):
        ctx.spec, ctx.n = spec, n
        ctx.save_for_backward(*tensors[n:])
        # A clone, not the input itself: outputs that alias inputs of a custom Function are
        # views and forbid later in-place updates.
        return tuple(t.clone() for t in tensors[:n])

    @staticmethod
    def backward(ctx, *grads):
        first_order_only("fixed_point(backward='implicit')")
        with torch.no_grad():
            u = ctx.spec.solve(ctx.saved_tensors, grads)
        return (None, None, *u, *(None,) * ctx.n)


def fixed_point(fn, z0, *, args=(), tol=None, max_iter=100, backward="implicit", check_every=4,
                backward_tol=None, backward_max_iter=None, fuse=None):
    """Solve z = fn(z, *args) per sample by fixed-point iteration, differentiably.

    Args:
        fn: (z, *args) -> z, same structure (tensor or tuple), shapes and dtypes as ``z0``.
            Must be a contraction near the solution for the iteration (and the adjoint) to
            converge.
        z0: initial guess; tensor or tuple of tensors (see the module conventions).
        args: tuple of what fn reads besides z (see the module's note on ``args``); its tensors
            get gradients through the solution.
        tol: per-sample tolerance on r_b = max_c ||fn(z)_c - z_c|| / (1 + ||z_c||); ``None`` ->
            :func:`default_tol`. The returned iterate is the first ``fn(z)`` with r_b <= tol.
        max_iter: at most this many applications of ``fn``.
        backward: ``"implicit"`` (IFT adjoint, memory O(1) in the iteration count; ``z0`` gets
            no gradient; first order only) or ``"unroll"`` (backprop through the iterations).
        check_every: iterations between convergence/finiteness checks (each one host sync).
        backward_tol: tolerance of the adjoint solve; defaults to ``tol``.
        backward_max_iter: iteration cap of the adjoint solve; defaults to
            ``max(2 * max_iter, 100)`` (it starts from g, not from a good guess).
        fuse: ``fuse(fn, check_every, is_tuple)`` -> a function doing what
            :func:`fused_iterations` does (a compiled one), or None; the forward iterations
            between two checks then run as one call of it (``compile=True`` sets it).  Not used
            with backward="unroll" (its iterations carry the graph).  Or a
            :class:`FixedIterations`: exactly its m iterations, unchecked, their last residual
            kept in it (``compile=True``'s blocks of steps; without a graph only).

    Returns:
        z* with the structure, shapes, dtype and device of ``z0``. In implicit mode with grad
        enabled this is one more application ``fn(z*)``, the one that carries the graph.

    Raises:
        ConvergenceError: no convergence (forward or adjoint), or a non-finite iterate.
        ValueError, TypeError: bad arguments or an ``fn`` output that does not match ``z0``.
    """
    struct = _Struct(z0)
    _check_args(backward, max_iter, check_every)
    local = _detached(args)

    def f(zs, a=local):
        return struct.call(fn, zs, "fn", a)

    if isinstance(fuse, FixedIterations):   # (traced: no tolerance, no host sync)
        if torch.is_grad_enabled():
            raise RuntimeError("fixed_point: FixedIterations runs without a graph only")
        z, r = fused_iterations(f, fuse.m)(struct.zs)
        fuse.record(r)
        return struct.pack(z)
    tol = _resolve_tol(tol, struct)
    btol = tol if backward_tol is None else _resolve_tol(backward_tol, struct, "backward_tol")
    bmax = (max(2 * max_iter, 100) if backward_max_iter is None
            else _check_int(backward_max_iter, "backward_max_iter"))
    if backward == "unroll":
        z, _ = _iterate(functools.partial(f, a=args), struct.zs, struct, tol, max_iter,
                        check_every, "fixed_point", _FP_HINT)
        return struct.pack(z)
    chunk = None
    if fuse is not None and check_every > 1:
        fused = fuse(fn, check_every, struct.is_tuple)
        if fused is not None:
            chunk = lambda zs: fused(zs, *local)  # noqa: E731
    with torch.no_grad():
        z_star, _ = _iterate(f, tuple(t.detach() for t in struct.zs), struct, tol, max_iter,
                             check_every, "fixed_point", _FP_HINT, chunk)
    if not torch.is_grad_enabled():
        return struct.pack(z_star)
    z = f(z_star, args)  # the one application with a graph to args and what fn captures
    if not any(t.requires_grad for t in z):
        return struct.pack(z)
    spec = _Adjoint(fn, local, struct, btol, bmax, check_every)
    return struct.pack(_FixedPointAdjoint.apply(spec, len(z), *z, *z_star))


class _FirstOrderOnly(torch.autograd.Function):
    """Identity whose backward refuses create_graph=True (newton's implicit output is only
    first-order correct: its J and z* are detached)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        first_order_only("newton(backward='implicit')")
        return g


def _jacobian(r, x, create_graph):
    """Per-sample Jacobians ∂r/∂x, shape (*batch, n, n), from n batch-summed reverse passes.

    Row i of every sample's Jacobian is grad(r[..., i].sum(), x): exact because samples are
    independent, and free of torch.func (which fails on r that call autograd.grad).
    """
    n = r.shape[-1]
    if not r.requires_grad:  # r ignores x
        return r.new_zeros(*r.shape, n)
    rows = []
    with torch.enable_grad():  # the row selection must be recorded even inside no_grad callers
        for i in range(n):
            (g,) = torch.autograd.grad(r[..., i].sum(), x, retain_graph=True,
                                       create_graph=create_graph, allow_unused=True)
            rows.append(torch.zeros_like(x) if g is None else g)
    return torch.stack(rows, -2)


def _solve(J, r):
    """J⁻¹ r per sample and a per-sample 'singular' flag (zero pivot or non-finite result)."""
    sol, info = torch.linalg.solve_ex(J, r.unsqueeze(-1))
    sol = sol.squeeze(-1)
    return sol, (info != 0) | ~torch.isfinite(sol).all(-1)


def newton(residual, z0, *, args=(), tol=None, max_iter=50, damping=1.0, backward="implicit",
           check_every=1):
    """Solve residual(z, *args) = 0 per sample by (damped, backtracking) Newton iteration.

    The state is flattened per sample to one vector of size n (sum of the components' last
    dims); Jacobians are per sample, (*batch, n, n), from n reverse passes over the whole batch,
    so residual(z)_b must depend on z_b only. Step: z <- z - damping * J⁻¹ r. A sample whose
    max |r| grew (or became non-finite) retries from its previous point with half the step, up
    to 5 times, then accepts; this costs no extra host syncs.

    Convergence per sample: max over components c of ||r_c(z)||_inf / (1 + ||z_c||_inf) <= tol
    (for r = z - fn(z) this is the criterion of :func:`fixed_point`), or the same measure of
    the Newton correction J⁻¹r (z's distance to the root) <= tol, for a residual whose
    round-off ε·‖J‖ keeps it above tol (a stiff step); the returned z is at least one Newton
    step past it.

    Args:
        residual: (z, *args) -> r with the structure, shapes and dtypes of ``z0``.
        z0, args, tol, check_every: as in :func:`fixed_point`.
        max_iter: at most this many Newton steps.
        damping: step scale in (0, 1].
        backward: ``"implicit"``: returns ``z* - J⁻¹ residual(z*)`` computed with grad (J at z*,
            detached): the value is z* up to one Newton correction, the derivative w.r.t. what
            ``residual`` captures is the IFT one, -J⁻¹ ∂r/∂θ; ``z0`` gets no gradient, and grad
            of grad raises. ``"unroll"``: the graph is kept through every iteration (Jacobians
            with create_graph), grad of grad works.

    Works under ``torch.no_grad()`` (the Jacobians enable grad locally), not under
    ``torch.inference_mode()`` (RuntimeError).

    Raises:
        ConvergenceError: no convergence, a non-finite iterate, or a singular Jacobian.
        ValueError, TypeError: bad arguments or a residual output that does not match ``z0``.
    """
    struct = _Struct(z0)
    _check_args(backward, max_iter, check_every)
    if torch.is_inference_mode_enabled():
        raise RuntimeError("newton needs autograd for its Jacobians and cannot run under "
                           "torch.inference_mode(); use torch.no_grad() instead")
    if not 0.0 < float(damping) <= 1.0:
        raise ValueError(f"damping must be in (0, 1], got {damping!r}")
    tol = _resolve_tol(tol, struct)
    track = backward == "unroll" and torch.is_grad_enabled()

    def res(x, a):
        return struct.flatten(struct.call(residual, struct.unflatten(x), "residual", a))

    if track and not any(isinstance(t, torch.Tensor) and t.requires_grad
                         for t in (*struct.zs, *args)):
        # unroll only where something is differentiated: z0, args, or what the residual
        # captures (a parameter); else the start, made a leaf for the Jacobians, would be the
        # one thing the result "requires grad" of (a fixed system rolled out under grad mode
        # built a graph over every step, and the lean modes counted it as a closure tensor)
        with torch.enable_grad():
            xl = struct.flatten(tuple(t.detach() for t in struct.zs)).requires_grad_()
            track = reaches_other_leaves(res(xl, args), (xl,))
    local = args if track else _detached(args)
    res_local = functools.partial(res, a=local)

    def fail(reason, k, worst):
        return ConvergenceError(f"newton: {reason}", iterations=k, residual=worst, tol=tol,
                                hint=_NEWTON_HINT)

    x = struct.flatten(struct.zs if track else tuple(t.detach() for t in struct.zs))
    batch, kw = struct.batch, dict(dtype=torch.bool, device=struct.device)
    done, nonfinite, singular, small = (torch.zeros(batch, **kw) for _ in range(4))
    x_prev, step = x, torch.zeros_like(x)
    nr_prev = torch.full(batch, float("inf"), dtype=x.dtype, device=x.device)
    halvings = torch.full(batch, _MAX_HALVINGS, dtype=torch.int64, device=x.device)
    for k in range(max_iter + 1):
        with torch.enable_grad():
            if track:
                if not x.requires_grad:
                    # the start (a guess, nothing to differentiate) as a leaf for the Jacobian;
                    # marked, so the lean modes' closure check does not take it for a closure
                    x = internal_leaf(x)
                xl = x
            else:
                xl = x.detach().requires_grad_()
            r = res_local(xl)
        rd = r.detach()
        nr = rd.abs().amax(-1)
        rel = residual_of(struct.unflatten(rd), struct.unflatten(x.detach()), diff=False)
        active = ~done
        reject = active & (halvings < _MAX_HALVINGS) & ~(nr <= nr_prev)  # NaN counts as growth
        nonfinite = nonfinite | (active & ~reject & ~torch.isfinite(rel))
        if k % check_every == 0 or k == max_iter:
            done = done | (rel <= tol) | small
            active = ~done
            reject = reject & active
            stats = torch.stack([done.all(), (nonfinite & active).any(),
                                 (singular & active).any()]).tolist()
            if stats[1]:
                raise fail("the iterate became non-finite (NaN or inf)", k,
                           _worst(torch.where(nonfinite, float("nan"), rel), done))
            if stats[2]:
                raise fail(f"the Jacobian is singular for {int((singular & active).sum())} "
                           f"sample(s)", k, _worst(rel, done))
            if stats[0]:
                break
            if k == max_iter:
                raise fail("did not converge", k, _worst(rel, done))
        J = _jacobian(r, xl, create_graph=track)
        if not track:
            r = r.detach()
        accept = active & ~reject
        delta, sing = _solve(J, r)
        sing = sing & accept & torch.isfinite(rel)
        singular = singular | sing
        delta = torch.where(sing.unsqueeze(-1), torch.zeros_like(delta), delta)
        # converged in x: Newton's correction, the iterate's distance to the root, within tol.
        # The residual alone can stall above tol at round-off ε·‖J‖ (a stiff implicit step:
        # average-acceleration Newmark at hω ≳ 50 failed with the residual at 3·tol)
        small = small | (accept & ~sing & (residual_of(struct.unflatten(delta.detach()),
                                                       struct.unflatten(x.detach()), diff=False) <= tol))
        a = accept.unsqueeze(-1)
        x_base = torch.where(a, x, x_prev)
        step = torch.where(a, damping * delta, 0.5 * step)
        x_prev, nr_prev = x_base, torch.where(accept, nr, nr_prev)
        halvings = torch.where(accept, torch.zeros_like(halvings), halvings + 1)
        x = torch.where(active.unsqueeze(-1), x_base - step, x)

    if track or backward == "unroll" or not torch.is_grad_enabled():
        return struct.pack(struct.unflatten(x))
    x_star = x.detach()
    r_theta = res(x_star, args)  # graph to args and what residual captures (not to x_star)
    if not r_theta.requires_grad:
        return struct.pack(struct.unflatten(x_star))
    delta, sing = _solve(_jacobian(r, xl, create_graph=False).detach(), r_theta)
    if bool(sing.any()):
        raise fail("the Jacobian is singular at the solution", k, _worst(rel, ~sing))
    return struct.pack(struct.unflatten(_FirstOrderOnly.apply(x_star - delta)))


@dataclasses.dataclass(frozen=True)
class SolveOptions:
    """How an implicit integrator solves its step equations: the one home of the solver choice.

    ``solver``: ``"fixed_point"`` or ``"newton"``; ``tol``/``max_iter``/``check_every`` go to the
    solver (``None``: its defaults); ``backward``: its gradient mode (``"implicit"``: exact
    implicit-function-theorem gradients, memory independent of the iterations; ``"unroll"``).
    Every implicit integrator holds one and calls :meth:`solve` (fixed-point form z = G(z)) or
    :meth:`root` (residual form F(z) = 0); either form runs under either solver.
    """

    solver: str = "fixed_point"
    tol: float | None = None
    max_iter: int | None = None
    backward: str = "implicit"
    check_every: int | None = None
    #: how ``compile=True`` fuses the fixed-point iterations between checks (see fixed_point)
    fuse: object = None

    def __post_init__(self):
        if self.solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {self.solver!r}")
        if self.backward not in _BACKWARDS:
            raise ValueError(f"backward must be one of {_BACKWARDS}, got {self.backward!r}")
        if self.tol is not None and not float(self.tol) >= 0.0:
            raise ValueError(f"tol must be None or >= 0, got {self.tol!r}")
        for name in ("max_iter", "check_every"):
            value = getattr(self, name)
            if value is not None:
                _check_int(value, name)

    def replace(self, **changes) -> "SolveOptions":
        return dataclasses.replace(self, **changes)

    def kwargs(self, solver: str | None = None) -> dict:
        """The keyword arguments of :func:`fixed_point` / :func:`newton` (unset ones omitted;
        ``check_every`` is the fixed-point iteration's: Newton checks every iteration)."""
        out = dict(tol=self.tol, backward=self.backward)
        if self.max_iter is not None:
            out["max_iter"] = self.max_iter
        if (solver or self.solver) == "fixed_point":
            if self.check_every is not None:
                out["check_every"] = self.check_every
            if self.fuse is not None:
                out["fuse"] = self.fuse
        return out

    def solve(self, G, z0, args=(), *, hint: str | None = None):
        """z with z = G(z, *args): fixed-point iteration on G, or Newton on z − G(z).  ``hint``
        replaces the advice of a fixed-point ConvergenceError (say how to get Newton)."""
        if self.solver == "newton":
            return newton(identity_minus(G), z0, args=args, **self.kwargs("newton"))
        try:
            return fixed_point(G, z0, args=args, **self.kwargs())
        except ConvergenceError as err:
            if hint is None:
                raise
            raise ConvergenceError(err.reason, iterations=err.iterations, residual=err.residual,
                                   tol=err.tol, hint=hint) from None

    def root(self, F, z0, args=(), *, solver: str | None = None):
        """z with F(z, *args) = 0: Newton on F, or fixed-point iteration on z − F(z); ``solver``
        overrides the chosen one (forms that only Newton solves)."""
        solver = solver or self.solver
        if solver == "newton":
            return newton(F, z0, args=args, **self.kwargs(solver))
        return fixed_point(identity_minus(F), z0, args=args, **self.kwargs(solver))
