r"""torchdiffeq's calling contract on odeint's geometric path (and the checks of its delegated one).

What torchdiffeq's fixed-grid solvers promise and a name ``odeint`` takes over must keep
(``implicit_euler``, ``implicit_midpoint`` at torchdiffeq's master), for every geometric method:

* **gradients with respect to t** (:class:`TimeMap`).  A Runge–Kutta-type step uses the step
  size only as h·X and the time only in the field's argument, so n steps of size h from t_a of
  the field X are n steps of a *fixed* size h₀ = float(h) of the rescaled field
  X̃(τ, y) = c·X(t_a + c(τ − τ_a), y) with c = h/h₀ (= 1 in value) from τ_a = float(t_a).  The
  steps then run with float times as always, and c and t_a — tensors built from ``t`` — carry
  the exact derivative of the discrete map with respect to the time grid (the steps' sizes
  and the times the field sees).  Every cotangent-lift, first-order and composition method has
  this form (eq. (1): h X = R_d⁻¹(x_k, x_{k+1}); the lift: h ∂H/∂(q, p)).
* **perturb** (:class:`StepHooks`): a field evaluated at the start (end) of a step sees the next
  (previous) representable time inside the step, torchdiffeq's ``Perturb.NEXT``/``PREV``, so a
  func discontinuous at the grid points sees the one-sided limit inside each step.  With the
  option given (True or False) every step also evaluates the field at its start, as
  torchdiffeq's steps do (the warm start of an implicit step is then that value, not the last
  step's stage).
* **step callbacks**: ``func.callback_step(t0, y0, dt)`` before every step, as torchdiffeq's
  fixed-grid solvers call it (y0 in the layout of the user's y0, dt > 0 for a decreasing t as
  well, the event search's trial steps not called back); a fixed-step method has no
  accepted or rejected steps, so ``callback_accept_step``/``callback_reject_step`` get
  torchdiffeq's warning (:func:`step_callback`).
* **event_fn** (:func:`integrate_until_event`): torchdiffeq's fixed-grid contract — steps of
  ``options["step_size"]`` from t[0] until the sign of ``event_fn(t, y)`` changes (a vector
  event: its components combined by torchdiffeq's ``combine_event_functions``), then
  torchdiffeq's own bisection (``find_event``, to ``atol`` in t) inside the last step, returning
  ``(event_t, stack([y0, y(event_t)]))``.  The state inside the step is, by default
  (``options["interp"] = "step"``), one step of the method itself of the partial size — so the
  state at the event is a state of the geometric map (on the manifold, symplectic), not a chord;
  ``"linear"`` and ``"cubic"`` (Hermite) are torchdiffeq's interpolants.
"""
from __future__ import annotations

import math
import warnings

import torch
from torchdiffeq._impl.event_handling import combine_event_functions, find_event

from .._validate import broadcasts_to
from ..integrators.base import Stepper

_UNSUPPORTED_CALLBACKS = ("callback_accept_step", "callback_reject_step")
INTERPS = ("step", "linear", "cubic")
MAX_EVENT_STEPS = 20000     # torchdiffeq's cap on the steps of a fixed-grid event search


def step_callback(func, method_name):
    """``func.callback_step`` (None when func has none); warns, as torchdiffeq does for its
    fixed-grid solvers, about the callbacks of accepted/rejected steps, never called here."""
    if func is None:
        return None
    unsupported = {n for n in _UNSUPPORTED_CALLBACKS if callable(getattr(func, n, None))}
    if unsupported:
        warnings.warn(f"Solver {method_name!r} does not support callbacks {sorted(unsupported)}: a "
                      "fixed-step method accepts every step and rejects none", stacklevel=4)
    cb = getattr(func, "callback_step", None)
    return cb if callable(cb) else None


class TimeMap:
    """The rescaling of one run of steps (see the module docstring): the field is called at
    t_a + c(τ − τ_a) and its output multiplied by c; ``c=None`` shifts the time only."""

    __slots__ = ("t_a", "tau_a", "c")

    def __init__(self, t_a, tau_a, c=None):
        self.t_a, self.tau_a, self.c = t_a, float(tau_a), c

    def time(self, tau):
        d = tau - self.tau_a
        return self.t_a + (d if self.c is None else self.c * d)

    def scale(self, out):
        if self.c is None:
            return out
        if isinstance(out, torch.Tensor):
            return self.c.to(out.dtype) * out
        if isinstance(out, (tuple, list)):
            return type(out)(self.scale(o) for o in out)
        return out


def perturbed(t, window):
    """t moved one ulp into the step ``window = (t_start, t_end)`` when it is an end of it."""
    a, b = window
    tv = float(t)
    if tv == a:
        toward = b
    elif tv == b:
        toward = a
    else:
        return t
    with torch.no_grad():
        moved = torch.nextafter(t, torch.full_like(t, toward))
    return t + (moved - t).detach() if t.requires_grad else moved


class StepHooks(Stepper):
    """A bound stepper with torchdiffeq's per-step hooks: the perturb window for ``caller`` (its
    ``window`` attribute) and ``callback(t0, y0, dt)`` before the step.  ``fresh``: every step
    starts without the cache (its warm start is the field at the step's start, evaluated there
    as torchdiffeq's fixed-grid steps do; the same equations, solved to the same tolerance).
    Its ``steps(n)`` is the default, n calls of its ``step``: the hooks run before every step."""

    def __init__(self, stepper, *, caller=None, perturb=False, callback=None, to_user=None,
                 fresh=False):
        super().__init__(stepper.system)
        self.stepper, self.caller, self.perturb = stepper, caller, perturb
        self.callback, self.to_user, self.fresh = callback, to_user, fresh

    def step(self, system, q, p, t, h, cache=None):
        if self.perturb:
            self.caller.window = (float(t), float(t + h))
        if self.callback is not None:
            like = q
            tm = getattr(self.caller, "time_map", None)
            t_user = tm.time(t) if tm is not None else torch.full((), t, dtype=like.dtype, device=like.device)
            # |h|: torchdiffeq integrates a decreasing t in negated time and passes a positive dt
            dt = torch.full((), abs(h), dtype=like.dtype, device=like.device)
            if tm is not None and tm.c is not None:
                dt = tm.c * dt
            self.callback(t_user, self.to_user(q, p), dt)
        try:
            return self.stepper.step(system, q, p, t, h, None if self.fresh else cache)
        finally:
            if self.perturb:
                self.caller.window = None


def integrate_until_event(step, system, states, t0, h, event_fn, *, to_user, tol, interp,
                          field=None, max_steps=MAX_EVENT_STEPS, trial_step=None):
    """Steps of size h from (t0, states) until ``event_fn`` changes sign; returns
    ``(event_t, y_event)`` with y_event in the user's layout (``to_user(q, p)``).

    ``states`` is ``(q, p)`` (p None for a first-order state); ``field(t, q, p)`` gives the
    vector field as a tuple like the states (for ``interp="cubic"``).  The root is located in
    s ∈ [0, |h|] from the last step's start, with torchdiffeq's ``find_event`` (bisection to
    ``tol``); times are t_k + sign(h)·s.  No gradient flows to event_t (as in torchdiffeq's
    fixed-grid solvers); y_event carries the gradients of the states.  ``trial_step`` (default
    ``step``) takes the partial steps of the root search (``interp="step"``): they are not steps
    of the solution, so odeint passes it without the ``callback_step`` hook."""
    trial_step = step if trial_step is None else trial_step
    if interp not in INTERPS:
        raise ValueError(f"options['interp'] must be one of {INTERPS}, got {interp!r}")
    q, p = states
    sign, H = (1.0 if h > 0 else -1.0), abs(h)
    like = q
    tt = lambda t: torch.full((), t, dtype=like.dtype, device=like.device)  # noqa: E731
    g = combine_event_functions(event_fn, tt(t0), to_user(q, p))
    with torch.no_grad():
        sign0 = torch.sign(g(tt(t0), to_user(q, p)))
    cache = None
    for k in range(max_steps):
        tk = t0 + k * h
        q1, p1, cache1 = step(system, q, p, tk, h, cache)
        finite = all(bool(torch.isfinite(x).all()) for x in (q1, p1) if x is not None)
        if not finite:
            raise FloatingPointError(f"the solution became non-finite in step {k} (t = {tk:g}) "
                                     "while searching for the event; reduce step_size or check func")
        with torch.no_grad():
            sign1 = torch.sign(g(tt(tk + h), to_user(q1, p1)))
        if bool(sign1 != sign0):
            break
        q, p, cache = q1, p1, cache1
    else:
        raise RuntimeError(f"Reached maximum number of iterations {max_steps}: event_fn did not "
                           f"change sign in {max_steps} steps of {h:g} from t = {t0:g}")

    qa, pa, qb, pb, ca = q, p, q1, p1, cache
    if interp == "cubic":
        fa, fb = field(tk, qa, pa), field(tk + h, qb, pb)

    def inside(s):
        """The state at t_k + sign·s, s a 0-d tensor in [0, |h|], in the user's layout."""
        u = float(s) / H
        if interp == "step":
            if u == 0.0:
                return to_user(qa, pa)
            if u == 1.0:
                return to_user(qb, pb)
            qs, ps, _ = trial_step(system, qa, pa, tk, sign * float(s), ca)
            return to_user(qs, ps)
        if interp == "linear":
            mix = [a + u * (b - a) if a is not None else None for a, b in ((qa, qb), (pa, pb))]
            return to_user(*mix)
        h00, h10 = (1 + 2 * u) * (1 - u) ** 2, u * (1 - u) ** 2
        h01, h11 = u * u * (3 - 2 * u), u * u * (u - 1)
        mix = [None if a is None else h00 * a + h10 * h * fa_ + h01 * b + h11 * h * fb_
               for a, b, fa_, fb_ in zip((qa, pa), (qb, pb), fa, fb)]
        return to_user(*mix)

    ev = lambda s, y: g(tt(tk) + sign * s, y)  # noqa: E731
    s_event, y_event = find_event(inside, sign0, tt(0.0), tt(H), ev, float(tol))
    return tt(tk) + sign * s_event.detach(), y_event


class FirstCallCheck:
    """The user's func for torchdiffeq's methods, with its first output checked against y0
    (shape, and finite) — torchdiffeq itself broadcasts a wrong shape or loops on NaN.  Every
    other attribute (torchdiffeq's callbacks) is the func's own."""

    def __init__(self, func, y0):
        self.func = func
        parts = y0 if isinstance(y0, tuple) else (y0,)
        self.shapes, self.is_tuple, self.checked = [c.shape for c in parts], isinstance(y0, tuple), False

    def __getattr__(self, name):
        if name == "func":
            raise AttributeError(name)
        return getattr(self.func, name)

    def __call__(self, t, y):
        out = self.func(t, y)
        if not self.checked:
            self._check(out)
            self.checked = True
        return out

    def _check(self, out):
        if self.is_tuple:
            if not isinstance(out, (tuple, list)) or len(out) != len(self.shapes):
                raise TypeError(f"func must return a tuple of {len(self.shapes)} tensors like y0, "
                                f"got {type(out).__name__}")
            parts = out
        else:
            parts = (out,)
        for i, (o, s) in enumerate(zip(parts, self.shapes)):
            what = "func" if not self.is_tuple else f"func's output {i}"
            if not isinstance(o, torch.Tensor):
                raise TypeError(f"{what} must return tensors like y0, got {type(o).__name__}")
            # what torchdiffeq takes correctly: a tensor that differs from y0's shape by
            # singleton dims only (a 0-d derivative of a (1,) state), a tuple part of y0's size
            # (it is flattened); refused: one that broadcasts to another size (a (1,) derivative
            # of a (2,) state: euler would broadcast it, dopri5 fail) or would enlarge the state
            ok = o.numel() == math.prod(s) and (self.is_tuple or broadcasts_to(o.shape, s))
            if not ok:
                raise ValueError(f"{what} returned shape {tuple(o.shape)}, expected {tuple(s)} "
                                 "(the shape of y0): torchdiffeq would broadcast it silently or "
                                 "fail (a larger shape, or another size)")
            if not bool(torch.isfinite(o).all()):
                raise ValueError(f"{what} returned NaN or inf at the initial (t, y0): the solve "
                                 "cannot start")
