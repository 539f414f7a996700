"""The integrator protocol: a small object that declares its properties and takes one step.

``step(system, q, p, t, h, cache) -> (q, p, cache)``: ``cache`` carries what the next step can
reuse (the last force for FSAL kick–drift methods, the last stage derivative as the warm start of
an implicit solve); pass ``None`` on the first step.  ``bind(system)`` gives a :class:`Stepper`:
``step`` and ``steps(n)`` (Φ_h^n) on that system, the one protocol every loop calls
(``torchgeo_int._loop.run_loop``) and ``compile=True`` wraps (``torchgeo_int._compile``).
"""
from __future__ import annotations

import copy

import torch

from ..solvers import ConvergenceError, SolveOptions


class Integrator:
    """What every method declares: ``order``, ``symplectic``, ``symmetric``, ``first_order``
    (integrates x' = X(x, t), called with p = None), ``steps_backward``, ``check_state`` (``None``, or
    ``(system, q0, p0) -> None`` validating an initial state the default pair check cannot, e.g.
    a Lie group element), ``options`` (the :class:`SolveOptions` of an implicit method, else
    ``None``) and ``key()``: equality by value — two integrators with equal keys are the same
    method (the same map of states; solver settings aside), which is what a composition checks
    to recognise a palindromic, symmetric sequence of stages."""

    name: str = "integrator"
    order: int = 1
    symplectic: bool = True
    symmetric: bool = False
    first_order: bool = False
    #: Whether the step code run with h < 0 inverts a step — Φ_{−h} = Φ_h⁻¹ for a symmetric
    #: method, Φ*_h⁻¹ otherwise — so ``grad="reversible"`` (which also requires symmetry) can
    #: reconstruct states by stepping back: cotangent-lift steps.
    steps_backward: bool = False
    #: Whether the step reads only the system's vector field, so that variable steps
    #: (``step_control``) may step a rescaled field s·f through it; False for methods that read
    #: a system's own structure (a Lagrangian, a force, multipliers, a group).
    field_only: bool = True
    #: The discretization map on the space of the state q (x for first-order methods), if the
    #: method is built from one: a map on a bundle then needs q of even last dim (rollout checks).
    state_map = None
    check_state = None
    options: SolveOptions | None = None

    def with_options(self, **changes) -> "Integrator":
        """The same method with its :class:`SolveOptions` changed (``solver``, ``tol``, ...);
        itself when it solves nothing."""
        if self.options is None:
            return self
        out = copy.copy(self)
        out.options = self.options.replace(**changes)
        return out

    def _options_to(self, other: "Integrator") -> "Integrator":
        """``other`` (an adjoint, say) with all of this method's :class:`SolveOptions`:
        ``check_every`` and ``fuse`` too, not only those its constructor takes."""
        other.options = self.options
        return other

    def key(self) -> tuple:
        """The method's identity by value (default: this object)."""
        return (type(self).__name__, id(self))

    def same_as(self, other) -> bool:
        return isinstance(other, Integrator) and self.key() == other.key()

    def __eq__(self, other):
        return self.same_as(other) if isinstance(other, Integrator) else NotImplemented

    def __hash__(self):
        return hash(self.key())

    def step(self, system, q, p, t: float, h: float, cache=None):
        raise NotImplementedError

    def __call__(self, system, q, p, t: float = 0.0, h: float = 0.01):
        """One step from (q, p) at time t; returns (q, p)."""
        q1, p1, _ = self.step(system, q, p, t, h)
        return q1, p1

    def adjoint(self) -> "Integrator":
        """Φ*_h = Φ_{−h}⁻¹."""
        raise NotImplementedError

    def splitting(self):
        """``(kicks, drifts)`` when the method is an explicit kick/drift sequence on separable
        systems (see ``run_splitting``), else ``None``."""
        return None

    def bind(self, system) -> "Stepper":
        """The :class:`Stepper` a rollout of ``system`` calls: the same map as :meth:`step`,
        computed by the same operations; an explicit splitting on a separable system gets a loop
        whose coefficients and system halves are looked up once (the per-step Python cost of a
        hand-written loop)."""
        split = explicit_splitting(self, system)
        return Stepper(system, self.step) if split is None else splitting_step(*split, system)

    def stages(self):
        """The method as a list of (primitive method, step fraction) — itself for a primitive."""
        return [(self, 1.0)]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, order={self.order}, "
                f"symplectic={self.symplectic}, symmetric={self.symmetric})")


class Stepper:
    r"""A method bound to one system — the one stepper protocol:

    * ``step(system, q, p, t, h, cache) -> (q, p, cache)`` (also the stepper's ``__call__``):
      one step Φ_h from (q, p) at t, the integrator's :meth:`Integrator.step`;
    * ``steps(q, p, t0, h, n, cache=None, *, start=0, out=None) -> (q, p, cache)``: the n-fold
      composition Φ_h^n, its steps at the times t0 + j·h, j = start … start + n − 1 (computed
      from t0, as ``run_loop`` numbers them, so the times do not depend on how a run is cut into
      calls); a :class:`ConvergenceError` names its step j.  By default n calls of ``step``;
      a subclass whose n steps cost less than n calls overrides it (a bound splitting), and
      ``compile=True`` replaces both by compiled versions (``torchgeo_int._compile``);
    * ``writes_out``: whether ``steps(..., out=(q_row, p_row))`` writes its final state into
      those tensors (a rollout's output rows: no copy afterwards);
    * ``saves(q, p, t0, h, n, cache=None, *, start=0, rows=(Q, P)) -> (q, p, cache)``: the same
      n steps with every state written, the state after step start + j + 1 into row j of Q and
      P (``run_loop`` under ``torch.no_grad()`` with ``save_every=1``: one call per stretch).
      By default ``steps(1)`` n times; ``compile=True`` writes whole compiled blocks at once.
      It returns None, having done nothing, when it cannot run without a graph (the caller
      then steps with ``steps``);
    * optionally ``long_steps(q, p, t0, h, n, cache=None, *, start=0, rows=None) ->
      (q, p, cache) | None``: the n steps in one go with no finiteness check in between, which
      ``run_loop`` offers for the whole stretch between two saves, or, every state saved, for
      the whole rollout with its rows (``rows`` as ``saves``'); None: declined, nothing done.
      Offered under grad mode too, outside a graph: it declines when the steps need one.  The
      compiled stepper's loops of blocks for small states.

    ``Stepper(system, step)`` binds a step function (``integrator.step``, or any callable with
    its signature); subclasses define ``step`` as a method instead."""

    writes_out = False

    def __init__(self, system, step=None):
        self.system = system
        if step is not None:
            self.step = step

    def step(self, system, q, p, t, h, cache=None):
        raise NotImplementedError

    def __call__(self, system, q, p, t, h, cache=None):
        return self.step(system, q, p, t, h, cache)

    def saves(self, q, p, t0, h, n, cache=None, *, start=0, rows):
        qs, ps = rows
        for j in range(n):
            if self.writes_out:
                q, p, cache = self.steps(q, p, t0, h, 1, cache, start=start + j, out=(qs[j], ps[j]))
            else:
                q, p, cache = self.steps(q, p, t0, h, 1, cache, start=start + j)
                qs[j], ps[j] = q, p
        return q, p, cache

    def steps(self, q, p, t0, h, n, cache=None, *, start=0, out=None):
        step, system = self.step, self.system
        j = start
        try:
            for j in range(start, start + n):
                q, p, cache = step(system, q, p, t0 + j * h, h, cache)
        except ConvergenceError as err:
            raise err.with_step(j) from None
        return q, p, cache


def as_stepper(step, system) -> Stepper:
    """``step`` itself when it is a :class:`Stepper`, else the step function bound to
    ``system`` (a caller's own function, e.g. a wrapper that counts calls)."""
    return step if isinstance(step, Stepper) else Stepper(system, step)


class ImplicitIntegrator(Integrator):
    """An integrator that solves equations each step: its ``options`` (a :class:`SolveOptions`)
    are the one place its solver settings live; ``solver``/``tol``/``max_iter``/``backward``
    read them (replace ``options``, or use ``with_options``, to change them)."""

    options: SolveOptions

    solver = property(lambda self: self.options.solver)
    tol = property(lambda self: self.options.tol)
    max_iter = property(lambda self: self.options.max_iter)
    backward = property(lambda self: self.options.backward)


def explicit_splitting(integrator, system):
    """``integrator.splitting()`` when ``system`` is separable — the (kicks, drifts) of the
    explicit kick/drift path — else ``None`` (the method runs its implicit form)."""
    return integrator.splitting() if getattr(system, "separable", False) else None


def _signed(kicks, drifts, sign):
    """The (kick, drift) pairs and the last kick, with the force sign folded into the kicks
    (sign is ±1: the products are exact, so every path takes the same alphas)."""
    return tuple((sign * a, b) for a, b in zip(kicks, drifts)), sign * kicks[-1]


def _split_steps(pairs, last, velocity, force_term, q, p, t, h, force, timed=True, out=None):
    """One step of the kick/drift sequence (see ``run_splitting``) — the only place it is
    written.  ``timed=False``: the system ignores t, its halves are called without it.
    ``out``: tensors (q, p) the step writes its final state into (a rollout's output rows: no
    copy afterwards; the same operations, so the same values)."""
    qo, po = (None, None) if out is None else out
    final = len(pairs) - 1
    for j, (a, b) in enumerate(pairs):
        if a != 0.0:
            if force is None:
                force = force_term(q, t) if timed else force_term(q)
            p = torch.add(p, force, alpha=a * h)
        q = torch.add(q, velocity(p, t + 0.5 * b * h) if timed else velocity(p), alpha=b * h,
                      out=qo if j == final else None)
        if timed:
            t = t + b * h
        force = None
    if last != 0.0:
        force = force_term(q, t) if timed else force_term(q)
        p = torch.add(p, force, alpha=last * h, out=po)
    elif po is not None:
        # the step ends with a drift: p is the last kick's.  A p with a graph is refused as
        # out= refuses it (an in-place copy would put the buffer into the graph)
        if p.requires_grad:
            raise RuntimeError("a state that requires grad is not written into an output row")
        p = po.copy_(p)
    return q, p, force


def splitting_step(kicks, drifts, system) -> Stepper:
    """``run_splitting`` bound to one system: same operations in the same order (so the same
    result, bit for bit), with ∂T/∂p and the force term fetched once (a
    :class:`SplittingStepper`); a time-independent system that has cheaper halves
    (``System.halves``) is called through them, without t."""
    pairs, last = _signed(kicks, drifts, system.force_sign)
    halves = system.halves()
    if halves is None:
        return SplittingStepper(system, pairs, last, system.velocity, system.force_term, True)
    return SplittingStepper(system, pairs, last, *halves)


class SplittingStepper(Stepper):
    """A kick/drift sequence bound to one system: ``steps`` is the loop of a hand-written
    integrator (the step times t0 + j·h, its halves called with t, or without it when
    ``timed`` is False) and writes its last state into ``out`` (see ``_split_steps``); ``step``
    is ``steps`` with n = 1.  (One class for both: a time-dependent system's stretch, odeint's
    separable funcs among them, also ends in the output rows without a copy.)"""

    writes_out = True

    def __init__(self, system, pairs, last, velocity, force_term, timed=False):
        super().__init__(system)
        self.pairs, self.last, self.velocity, self.force_term = pairs, last, velocity, force_term
        self.timed = timed

    def steps(self, q, p, t0, h, n, cache=None, *, start=0, out=None):
        pairs, last, velocity, force_term, force, timed = (self.pairs, self.last, self.velocity,
                                                           self.force_term, cache, self.timed)
        for i in range(n):
            q, p, force = _split_steps(pairs, last, velocity, force_term, q, p,
                                       t0 + (start + i) * h if timed else 0.0, h, force, timed,
                                       out if i == n - 1 else None)
        return q, p, force

    def step(self, system, q, p, t, h, cache=None):
        return self.steps(q, p, t, h, 1, cache)


def run_splitting(kicks, drifts, system, q, p, t, h, force=None):
    r"""K(a₀h) D(b₀h) K(a₁h) … D(b_{s−1}h) K(a_s h) on a separable system:
    a kick is p ← p + a h F(q, t) at the current time, a drift q ← q + b h ∂T/∂p(p, t + bh/2)
    (∂T/∂p at the drift's midpoint time, exact when T does not depend on t) that advances t.
    ``force`` is the system's ``force_term`` at (q, t) if already known (FSAL); the one at the
    final state is returned when the last kick needs it, so a chain of steps costs one force
    evaluation per nonzero kick after the first step.  A kick is one fused kernel,
    p + (force_sign · a h) force_term (no separate negation of ∂V/∂q)."""
    pairs, last = _signed(kicks, drifts, system.force_sign)
    return _split_steps(pairs, last, system.velocity, system.force_term, q, p, t, h, force)
