r"""A drop-in ``odeint`` with torchdiffeq's signature and semantics, plus the geometric methods.

``odeint(func, y0, t, *, rtol=1e-7, atol=1e-9, method=None, options=None, event_fn=None)``
solves dy/dt = func(t, y), y(t[0]) = y0, and returns y at every time of the 1-D, strictly
increasing or decreasing tensor ``t``, stacked along a new first dim, in the structure of ``y0``
(a tensor, or a tuple of tensors).  ``func`` receives ``t`` as a 0-d tensor of y0's dtype.

**torchdiffeq's methods** (every name in ``TORCHDIFFEQ_METHODS``, read from torchdiffeq's own
``SOLVERS`` at import: dopri5 — the default —, dopri8, bosh3, fehlberg2, adaptive_heun, euler,
midpoint, heun2, heun3, rk4, explicit_adams, implicit_adams, fixed_adams, scipy_solver, ...) are
passed to ``torchdiffeq.odeint`` unchanged, so the results, options and warnings are
torchdiffeq's (``midpoint`` is its explicit midpoint method; ours is ``implicit_midpoint``).
A name that is also geometric stays ours (:func:`delegated_names`): torchdiffeq's master
branch adds ``implicit_midpoint`` and ``implicit_euler``.

**Geometric methods** (``GEOMETRIC_METHODS``), fixed step sizes:

* *Partitioned* (Hamiltonian-type): the names of ``tgi.METHODS`` (symplectic_euler, verlet,
  yoshida4, ..., implicit_midpoint_kahan_li8).  The state is (q, p): either ``y0 = (q0, p0)``,
  with ``func(t, (q, p)) -> (dq, dp)``, or a tensor split along its last dim,
  q = y[..., :k], p = y[..., k:] with k = half the last dim (``options["split"]`` for another
  k), with ``func(t, y) -> dy``.  The field is stepped as a ``tgi.VectorFieldSystem``:
  ``options["separable"] = True`` promises that dq depends on p only and dp on q only, which
  turns on the explicit kick/drift paths (func is then called with the other half set to zero
  and that half of its output is ignored); otherwise the implicit generalized forms are used
  (e.g. the generalized leapfrog for ``verlet``).  ``options["hamiltonian"] = H`` with
  ``func=None`` steps X_H = (∂H/∂p, −∂H/∂q) of an energy ``H(q, p)`` (q, p shaped like the
  parts of y0; gradients by autograd, ``separable`` as above).
* *First-order*, eq. (1): ``explicit_euler``, ``implicit_euler``, ``implicit_midpoint``
  (``FIRST_ORDER_METHODS``) on any y0 (a tuple is flattened at this boundary).  The name
  ``implicit_midpoint`` is in both lists: the midpoint rule is the same map whether or not the
  state is partitioned, and it runs partitioned (= ``tgi.METHODS["implicit_midpoint"]``) when
  y0 is a 2-tuple or a partitioned option (split, separable, hamiltonian) is given, else as the
  first-order method on the flattened state (so y0 of any size works).
* ``method`` may also be an Integrator instance (``tgi.CotangentLiftIntegrator(...)``,
  ``FirstOrderIntegrator(...)``, a ``Composition``); ``first_order`` tells the two kinds apart.
  It is used as configured: rtol/atol and the solver options do not change it.

Steps: without ``options["step_size"]`` one step per interval of t; with ``step_size = h`` each
interval [t_i, t_{i+1}] is cut into n_i = ceil(|t_{i+1} − t_i| / h) equal steps of size ≤ h (a
ratio within round-off of an integer counts as that integer).  The outputs are the states
reached at the t_i — never interpolated, which would break the symplecticity (or the
invariants) of the outputs.  Consecutive intervals with the same step run as one
``rollout.run_loop`` (their internal times agree with t to round-off).

Adaptive geometric steps (partitioned methods; :mod:`torchgeo_int.adaptive`):
``options["adaptive"] = "reversible"`` with ``step_size = ε`` runs time-reversible variable
steps of physical size ≈ ε σ(q, p) (``options["control"]`` = σ, a callable σ(q) or σ(q, p) on
the shapes of q0, p0 returning the batch shape; default |q|^{3/2}; ``form`` "log" | "additive";
``h_min``; ``max_steps``) with a symmetric method, each sample of the batch in its own time,
until all pass t[-1]; the outputs at t are cubic Hermite dense output of those steps (not on the
symplectic trajectory, and the step sequence does not depend on t).  grad="backprop" only.
func then receives t as a tensor of the per-sample times, of the batch shape (0-d when
``batch_dims`` = 0).

Tolerances: the implicit solves (fixed point or Newton) stop per sample when the update (or
residual) d satisfies ||d||∞ ≤ tol·(1 + ||z||∞) with tol = min(rtol, atol), which implies the
torchdiffeq-style test ||d||∞ ≤ atol + rtol·||z||∞; tol is clipped below at
``tgi.default_tol(dtype)`` (5e-14 in float64, 1.3e-6 in float32) where iterations stall on
round-off.  Tensor or tupled rtol/atol use their smallest entry.  For structure preservation to
round-off pass small values (rtol=atol=0 means the round-off floor).

Options of the geometric methods (anything else raises ValueError):
    ``step_size`` (float > 0), ``split`` (int, flat y0, partitioned), ``separable`` (bool,
    partitioned), ``hamiltonian`` (callable H(q, p), partitioned), ``solver`` ("fixed_point" |
    "newton", the implicit solves of named methods), ``max_iter`` (int, their iteration cap),
    ``batch_dims`` (int, default 0: the number of leading dims of y0 — of each tuple part —
    that index independent samples; the solvers then converge, and Newton forms its Jacobian,
    per sample.  With 0 the whole state is one sample, which is right for any func but makes
    Newton's Jacobian as large as the state), ``grad`` ("backprop" — the default — |
    "checkpoint" | "reversible": how gradients are taken, below), ``compile`` (bool: the steps
    through ``torch.compile`` as in ``tgi.rollout(..., compile=True)``, with t passed to func as
    a tensor inside the graphs; the graphs are kept for the last 8 (func, options, layout of y0),
    so a loop of calls compiles once; results equal the eager ones to round-off), ``segment`` (int, steps per
    recomputed segment of grad="checkpoint"), ``reconstruction_tol`` (float, grad="reversible"),
    ``params`` (tensors to differentiate under a lean grad mode; see below).

Gradients: by backpropagation through the steps — the exact gradient of the discrete map —,
through implicit steps by the solvers' implicit-function-theorem backward.  ``t`` gets no
gradient (a ``t`` that requires grad raises under grad mode).  A ``func`` that calls
``torch.autograd.grad`` itself (HNNs; torchdiffeq issue #154) works: when grad mode is on at
the call of ``odeint``, func sees grad mode on, and inputs that require grad, also inside the
solvers' no-grad iterations.  ``event_fn`` is for torchdiffeq's methods only.

Memory-lean gradients (``options["grad"]``, :mod:`torchgeo_int.gradients`; the same modes as
``tgi.rollout(..., grad=...)``): ``"checkpoint"`` keeps only segment boundaries (⌈√n⌉ steps per
segment of each run of equal steps, or ``options["segment"]``) and recomputes each segment in
backward — the backprop gradient of the same discrete map, any geometric method;
``"reversible"`` reconstructs the states backwards with the −h step (symmetric methods of
(q, p): verlet and its compositions — explicit on a separable field, ``options["separable"] =
True`` or a separable ``options["hamiltonian"]``, else the generalized leapfrog —, implicit
midpoint and its compositions): graph memory independent of the number of steps, gradient
exact up to the round-off (and, for implicit steps, the solver tolerance) of that
reconstruction (a ``RuntimeWarning`` when the
reconstructed start is off by more than ``reconstruction_tol``).  The outputs at every t are
stored in all modes.  The lean modes differentiate y0 and the parameters of ``func`` (or of
``options["hamiltonian"]``) when it is an ``nn.Module`` or a method of one; any other tensor
that requires grad and that func uses (a closure) must be listed in ``options["params"]``
(which then replaces the module's parameters, like torchdiffeq's ``adjoint_params``), else
odeint raises ValueError rather than silently give it no gradient.  Each run of equal steps
starts a fresh FSAL/warm-start cache under a lean mode, so for time-dependent or implicit
fields the result may differ from backprop's in the last bits.  torchdiffeq's methods take no
``grad`` option (use ``odeint_adjoint`` for their memory-lean, continuous-adjoint gradients).

``odeint_adjoint`` is torchdiffeq's (continuous adjoint), for torchdiffeq's methods; with a
geometric method use ``odeint`` (with ``options["grad"]`` for memory-lean gradients).
"""
from __future__ import annotations

import collections
import math
from collections.abc import Mapping

import torch
import torchdiffeq
from torchdiffeq._impl.odeint import SOLVERS as _TORCHDIFFEQ_SOLVERS

from .integrators import METHODS, Composition, CotangentLiftIntegrator, Integrator
from .integrators.first_order import FIRST_ORDER_METHODS, FirstOrderIntegrator, theta
from .gradients import not_reversible
from .rollout import GRAD_MODES, run_loop
from .solvers import default_tol
from .systems import Hamiltonian, ODESystem, VectorFieldSystem, grad_of

__all__ = ["odeint", "odeint_adjoint", "TORCHDIFFEQ_METHODS", "GEOMETRIC_METHODS",
           "PARTITIONED_METHODS", "FIRST_ORDER_METHOD_NAMES", "OPTIONS"]

PARTITIONED_METHODS: tuple[str, ...] = tuple(sorted(METHODS))
FIRST_ORDER_METHOD_NAMES: tuple[str, ...] = tuple(sorted(FIRST_ORDER_METHODS))
GEOMETRIC_METHODS: tuple[str, ...] = tuple(sorted(set(METHODS) | set(FIRST_ORDER_METHODS) | {"theta"}))


def delegated_names(solvers) -> tuple[str, ...]:
    """The names of torchdiffeq's ``SOLVERS`` that odeint passes on: all but ours.  A torchdiffeq
    built from its master branch also defines ``implicit_midpoint`` and ``implicit_euler``; the
    geometric ones keep those names (the same equations, solved per sample instead of by one
    Broyden iteration over the whole batch), so installing it changes nothing here."""
    return tuple(name for name in solvers if name not in GEOMETRIC_METHODS)


TORCHDIFFEQ_METHODS: tuple[str, ...] = delegated_names(_TORCHDIFFEQ_SOLVERS)

_GRAD_OPTIONS = ("grad", "segment", "reconstruction_tol", "params")
_COMMON = ("step_size", "batch_dims", "solver", "max_iter", "compile") + _GRAD_OPTIONS
_PARTITIONED_ONLY = ("split", "separable", "hamiltonian")
_ADAPTIVE = ("adaptive", "control", "h_min", "max_steps", "form")   # torchgeo_int.adaptive
OPTIONS: tuple[str, ...] = _COMMON + _PARTITIONED_ONLY + _ADAPTIVE
_CHECK_EVERY = 64  # steps between finiteness checks (one host sync each)


def _all_methods() -> str:
    return (f"torchdiffeq's: {', '.join(TORCHDIFFEQ_METHODS)}; geometric (partitioned): "
            f"{', '.join(PARTITIONED_METHODS)}; geometric (first-order, eq. (1)): "
            f"{', '.join(FIRST_ORDER_METHOD_NAMES)}, theta (options=dict(theta=θ)); or an Integrator instance")


def _is_torchdiffeq(method) -> bool:
    return method is None or (isinstance(method, str) and method in TORCHDIFFEQ_METHODS)


# -- public entry points -----------------------------------------------------------------------
def odeint(func, y0, t, *, rtol=1e-7, atol=1e-9, method=None, options=None, event_fn=None):
    """Solve dy/dt = func(t, y), y(t[0]) = y0 at the times t (see the module docstring).

    Returns a tensor ``(len(t), *y0.shape)`` or a tuple of them like ``y0``; with ``event_fn``
    (torchdiffeq's methods only) ``(event_t, solution)`` as in torchdiffeq.

    Raises ValueError for an unknown method (listing every method), an unknown option, or a bad
    ``t`` (not 1-D, not strictly monotone, not finite); ``tgi.ConvergenceError`` (naming the
    step) when an implicit step does not converge; ``FloatingPointError`` when the solution
    becomes non-finite.
    """
    if _is_torchdiffeq(method):
        if isinstance(options, Mapping) and "grad" in options:
            if options["grad"] != "backprop":
                raise ValueError(
                    f"options['grad'] = {options['grad']!r} is for the geometric methods; "
                    f"torchdiffeq's method {method or 'dopri5'!r} backpropagates through its "
                    f"steps, and its memory-lean gradients are torchdiffeq's continuous adjoint: "
                    f"use tgi.odeint_adjoint(...) (or a geometric method with this option)")
            options = {k: v for k, v in options.items() if k != "grad"}
        return torchdiffeq.odeint(func, y0, t, rtol=rtol, atol=atol, method=method,
                                  options=options, event_fn=event_fn)
    return _geometric_odeint(func, y0, t, rtol=rtol, atol=atol, method=method, options=options,
                             event_fn=event_fn)


def odeint_adjoint(func, y0, t, *, rtol=1e-7, atol=1e-9, method=None, options=None,
                   event_fn=None, adjoint_rtol=None, adjoint_atol=None, adjoint_method=None,
                   adjoint_options=None, adjoint_params=None):
    """torchdiffeq's ``odeint_adjoint`` (gradients from the continuous adjoint ODE), for
    torchdiffeq's methods.  A geometric method raises: use :func:`odeint`, whose backprop gives
    the exact gradient of the discrete (symplectic) map, and whose ``options["grad"]``
    ("checkpoint" | "reversible") gives it with little memory."""
    for name, m in (("method", method), ("adjoint_method", adjoint_method)):
        if m is None or _is_torchdiffeq(m):
            continue
        if _is_geometric_name(m) or isinstance(m, Integrator):
            raise ValueError(
                f"odeint_adjoint integrates torchdiffeq's continuous adjoint ODE and supports "
                f"torchdiffeq's methods only; for the geometric {name} {_method_name(m)!r} use "
                f"torchgeo_int.odeint (backprop gives the exact gradient of the discrete map; "
                f"options=dict(grad='checkpoint'|'reversible') for memory-lean gradients)")
        raise ValueError(f"unknown {name} {m!r}; known methods: {_all_methods()}")
    if isinstance(options, Mapping) and "grad" in options:
        raise ValueError("odeint_adjoint takes no options['grad']: its gradients are the continuous "
                         "adjoint's; options['grad'] selects the gradient mode of tgi.odeint's "
                         "geometric methods")
    return torchdiffeq.odeint_adjoint(
        func, y0, t, rtol=rtol, atol=atol, method=method, options=options, event_fn=event_fn,
        adjoint_rtol=adjoint_rtol, adjoint_atol=adjoint_atol, adjoint_method=adjoint_method,
        adjoint_options=adjoint_options, adjoint_params=adjoint_params)


def _is_geometric_name(method) -> bool:
    return isinstance(method, str) and method in GEOMETRIC_METHODS


def _method_name(method) -> str:
    return method.name if isinstance(method, Integrator) else str(method)


# -- input checks --------------------------------------------------------------------------------
def _check_times(t) -> list[float]:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"t must be a 1-D torch.Tensor of times, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"t must be a floating-point tensor, got dtype {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"t must be one-dimensional, got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError("t is empty: it must hold at least the initial time")
    if t.requires_grad and torch.is_grad_enabled():
        raise ValueError("the geometric methods give no gradient with respect to t; pass "
                         "t.detach() (torchdiffeq's own methods do differentiate in t)")
    times = t.tolist()
    if not all(math.isfinite(x) for x in times):
        raise ValueError("t contains NaN or inf")
    d = [b - a for a, b in zip(times, times[1:])]
    if d and not (all(x > 0 for x in d) or all(x < 0 for x in d)):
        raise ValueError("t must be strictly increasing or strictly decreasing")
    return times


def _check_state(ys, name):
    for i, y in enumerate(ys):
        what = name if len(ys) == 1 else f"{name}[{i}]"
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"{what} must be a tensor, got {type(y).__name__}")
        if not y.is_floating_point():
            raise TypeError(f"{what} must be a real floating-point tensor, got dtype {y.dtype}")
        if y.numel() == 0:
            raise ValueError(f"{what} is empty")
        if y.dtype != ys[0].dtype or y.device != ys[0].device:
            raise ValueError(f"the parts of {name} must share one dtype and device; {name}[0] is "
                             f"{ys[0].dtype} on {ys[0].device}, {what} {y.dtype} on {y.device}")
        if not bool(torch.isfinite(y).all()):
            raise ValueError(f"{what} contains NaN or inf")


def _check_int(value, name, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"options[{name!r}] must be an int >= {minimum}, got {value!r}")
    return value


def _check_step_size(h):
    if h is None:
        return None
    if isinstance(h, torch.Tensor) and h.numel() == 1:
        h = h.item()
    if isinstance(h, bool) or not isinstance(h, (int, float)) or not (math.isfinite(h) and h > 0):
        raise ValueError(f"options['step_size'] must be a finite number > 0, got {h!r}")
    return float(h)


def _tol_values(tol, name):
    if isinstance(tol, (tuple, list)):
        return [v for x in tol for v in _tol_values(x, name)]
    if isinstance(tol, torch.Tensor):
        vals = tol.detach().reshape(-1).tolist()
    elif isinstance(tol, (int, float)) and not isinstance(tol, bool):
        vals = [float(tol)]
    else:
        raise TypeError(f"{name} must be a number, a tensor or a tuple of them, got {type(tol).__name__}")
    if not vals or not all(math.isfinite(v) and v >= 0 for v in vals):
        raise ValueError(f"{name} must be finite and >= 0, got {tol!r}")
    return vals


def _solver_tol(rtol, atol, dtype) -> float:
    """min(rtol, atol), clipped below at the round-off floor of dtype (module docstring)."""
    return max(min(_tol_values(rtol, "rtol") + _tol_values(atol, "atol")), default_tol(dtype))


# -- the geometric path ----------------------------------------------------------------------------
def _geometric_odeint(func, y0, t, *, rtol, atol, method, options, event_fn):
    if event_fn is not None:
        raise ValueError(f"event_fn is supported by torchdiffeq's methods only, not by the "
                         f"geometric method {_method_name(method)!r}")
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise TypeError(f"options must be a dict, got {type(options).__name__}")
    kind, template = _resolve_method(method, y0, options)
    allowed = OPTIONS if kind == "partitioned" else _COMMON + (("theta",) if method == "theta" else ())
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        extra = ""
        if kind == "first_order" and set(unknown) & set(_PARTITIONED_ONLY):
            extra = f" ({', '.join(_PARTITIONED_ONLY)} apply to partitioned methods only)"
        raise ValueError(f"unknown option(s) {unknown} for method {_method_name(method)!r}; "
                         f"accepted: {', '.join(allowed)}{extra}")
    if isinstance(method, Integrator) and ("solver" in options or "max_iter" in options):
        raise ValueError("options 'solver'/'max_iter' configure named methods; configure the "
                         "Integrator instance itself")
    times = _check_times(t)
    step_size = _check_step_size(options.get("step_size"))
    batch_dims = _check_int(options.get("batch_dims", 0), "batch_dims", 0)
    solver = options.get("solver")
    if solver not in (None, "fixed_point", "newton"):
        raise ValueError(f"options['solver'] must be 'fixed_point' or 'newton', got {solver!r}")
    max_iter = options.get("max_iter")
    if max_iter is not None:
        _check_int(max_iter, "max_iter", 1)

    parts = y0 if isinstance(y0, tuple) else (y0,)
    if not isinstance(y0, (torch.Tensor, tuple)) or not parts:
        raise TypeError(f"y0 must be a tensor or a non-empty tuple of tensors, got {type(y0).__name__}")
    _check_state(parts, "y0")
    dtype, device = parts[0].dtype, parts[0].device
    grad, grad_options = _grad_options(options)
    compile = options.get("compile", False)
    if not isinstance(compile, bool):
        raise ValueError(f"options['compile'] must be a bool, got {compile!r}")
    caller = _UserFunc(func, dtype, device, grad=torch.is_grad_enabled())
    if isinstance(method, Integrator):
        integrator = template
    else:
        integrator = _configured(template, _solver_tol(rtol, atol, dtype), solver, max_iter)

    if kind == "first_order":
        if func is None:
            raise TypeError("func must be callable as func(t, y) -> dy/dt")
        if grad == "reversible":
            raise ValueError(_not_reversible(integrator, "it is a first-order (eq. (1)) method"))
        state = _FlatState(y0, batch_dims)

        def build():
            system = ODESystem(lambda tt, x: state.flatten(caller(tt, state.unflatten(x)), "func"))
            system.tensor_time = True   # func takes t as a tensor anyway (torch.compile keeps it so)
            _register_module(system, "user_func", func)
            return system
        system = _system_for(compile, kind, func, options, state, y0, caller, build)
        (X,) = _integrate(integrator, system, (state.x0,), times, step_size, t.dtype,
                          grad, grad_options, compile)
        return state.assemble(X)

    state = _PartitionedState(y0, options.get("split"), batch_dims)
    system = _system_for(compile, kind, func, options, state, y0, caller,
                         lambda: _partitioned_system(func, caller, state, options))
    why = not_reversible(integrator, system) if grad == "reversible" else None
    if why:
        raise ValueError(_not_reversible(integrator, why))
    if "adaptive" in options:   # reversible variable steps + dense output (torchgeo_int.adaptive)
        if grad != "backprop" or compile:
            raise ValueError("options['adaptive'] supports grad='backprop' without compile only")
        from .adaptive import odeint_adaptive
        return state.assemble(*odeint_adaptive(integrator, system, state, times, options, step_size))
    Q, P = _integrate(integrator, system, (state.q0, state.p0), times, step_size, t.dtype,
                      grad, grad_options, compile)
    return state.assemble(Q, P)


_SYSTEMS: "collections.OrderedDict" = collections.OrderedDict()


def _system_for(compile, kind, func, options, state, y0, caller, build):
    """The system odeint steps: ``build()``; with ``compile`` the one an earlier call with the
    same func, options and layout of y0 built (its compiled graphs are kept per system, so a
    loop of odeint calls compiles once).  Its closures use the layout only, never y0's values."""
    if not compile:
        return build()
    parts = y0 if isinstance(y0, tuple) else (y0,)
    H = options.get("hamiltonian")
    key = (kind, id(func), id(H), options.get("separable", False), options.get("split"),
           options.get("batch_dims", 0), isinstance(y0, tuple), tuple(c.shape for c in parts),
           caller.dtype, caller.device, caller.grad)
    hit = _SYSTEMS.get(key)
    if hit is not None and hit[0] is func and hit[1] is H:
        _SYSTEMS.move_to_end(key)
        return hit[2]
    system = _SYSTEMS[key] = (func, H, build())
    while len(_SYSTEMS) > 8:   # each entry keeps its func (and compiled graphs) alive
        _SYSTEMS.popitem(last=False)
    return system[2]


def _not_reversible(integrator, why):
    return (f"options['grad'] = 'reversible' needs a symmetric method of (q, p) (verlet and its "
            f"compositions: yoshida4, suzuki4, ...; implicit midpoint and its compositions); "
            f"{integrator.name!r} cannot: {why}.  Use options['grad'] = 'checkpoint' (exact, "
            f"O(√steps) memory).")


def _grad_options(options):
    """(grad mode, its options for gradients.rollout_with_grad_mode) from odeint's options."""
    grad = options.get("grad", "backprop")
    if grad not in GRAD_MODES:
        raise ValueError(f"options['grad'] must be one of {GRAD_MODES}, got {grad!r}")
    accepted = {"backprop": (), "checkpoint": ("segment", "params"),
                "reversible": ("reconstruction_tol", "params")}[grad]
    misplaced = [k for k in _GRAD_OPTIONS[1:] if k in options and k not in accepted]
    if misplaced:
        raise ValueError(f"option(s) {misplaced} do not apply to grad={grad!r} (segment: "
                         f"'checkpoint'; reconstruction_tol: 'reversible'; params: both)")
    kw = {k: options[k] for k in accepted if k in options}
    if "segment" in kw:
        _check_int(kw["segment"], "segment", 1)
    if "reconstruction_tol" in kw:
        tol = kw["reconstruction_tol"]
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol >= 0:
            raise ValueError(f"options['reconstruction_tol'] must be a number >= 0, got {tol!r}")
        kw["reconstruction_tol"] = float(tol)
    if "params" in kw:
        params = kw["params"]
        try:
            params = None if isinstance(params, torch.Tensor) else list(params)
        except TypeError:
            params = None
        if params is None or not all(isinstance(w, torch.Tensor) for w in params):
            raise TypeError("options['params'] must be a list or tuple of tensors (or an iterable "
                            "of them, such as module.parameters())")
        kw["params"] = params
    return grad, kw


def _register_module(system, name, fn):
    """Make the user's module (fn itself, or the module a bound method belongs to) a submodule
    of the system, so the lean gradient modes find its parameters."""
    owner = fn if isinstance(fn, torch.nn.Module) else getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module) and owner is not system:
        system.add_module(name, owner)


def _resolve_method(method, y0, options):
    """('partitioned' | 'first_order', the integrator to configure)."""
    if isinstance(method, Integrator):
        return ("first_order" if getattr(method, "first_order", False) else "partitioned"), method
    if not isinstance(method, str) or method not in GEOMETRIC_METHODS:
        raise ValueError(f"unknown method {method!r}; known methods: {_all_methods()}")
    if method == "theta":
        # the θ-method (x_{k+1} − x_k)/h = X((1−θ)x_k + θx_{k+1}): eq. (1) with AlphaMap(θ)
        if "theta" not in options:
            raise ValueError("method 'theta' needs options=dict(theta=θ) with θ in [0, 1]")
        return "first_order", theta(options["theta"])
    if method in FIRST_ORDER_METHODS:
        partitioned = (isinstance(y0, tuple) and len(y0) == 2
                       or any(k in options for k in _PARTITIONED_ONLY + _ADAPTIVE))
        if not (partitioned and method in METHODS):
            return "first_order", FIRST_ORDER_METHODS[method]
    return "partitioned", METHODS[method]


_CONFIGURED: dict = {}


def _configured(integrator, tol, solver, max_iter):
    """A copy of a named integrator with the solve options of this call (cached)."""
    key = (integrator.name, id(integrator), tol, solver, max_iter)
    if key not in _CONFIGURED:
        if len(_CONFIGURED) > 256:  # a long-lived process sweeping tolerances
            _CONFIGURED.clear()
        _CONFIGURED[key] = _rebuild(integrator, tol, solver, max_iter)
    return _CONFIGURED[key]


def _rebuild(m, tol, solver, max_iter):
    if isinstance(m, (FirstOrderIntegrator, CotangentLiftIntegrator)):
        kw = dict(solver=solver or m.solver, tol=tol,
                  max_iter=m.max_iter if max_iter is None else max_iter,
                  backward=m.backward, name=m.name)
        if isinstance(m, FirstOrderIntegrator):
            return FirstOrderIntegrator(m.R, form=m.form, **kw)
        return CotangentLiftIntegrator(m.R, **kw)
    if isinstance(m, Composition):
        stages = m.stages()
        return Composition([_rebuild(s, tol, solver, max_iter) for s, _ in stages],
                           [c for _, c in stages], order=m.order, name=m.name)
    raise TypeError(f"cannot configure integrator {m!r}")


def _integrate(integrator, system, states, times, step_size, t_dtype, grad="backprop",
               grad_options=None, compile=False):
    """Run the steps over t; returns each state's trajectory at every t, (len(t), *shape).

    Under a lean grad mode each group is one ``gradients.rollout_with_grad_mode`` (its own
    checkpointed or reversible autograd node, a fresh FSAL cache); the parameters are resolved,
    and the closure check made, once.  ``compile``: the groups run as ``rollout(...,
    compile=True)`` does (:mod:`torchgeo_int._compile`)."""
    outs = [[x.unsqueeze(0)] for x in states]
    q, p = states[0], (states[1] if len(states) > 1 else None)
    cache, offset = None, 0
    groups = [(i0, m, n, times[i0], times[i0 + m], (times[i0 + m] - times[i0]) / (m * n))
              for i0, m, n in _groups(times, step_size, torch.finfo(t_dtype).eps)]
    lean = grad != "backprop"
    step = integrator.bind(system)
    if compile:
        from ._compile import compiled_rollout, compiled_step
        if lean:
            step = compiled_step(integrator, system)
    if lean:
        from .gradients import resolve_params, rollout_with_grad_mode
        grad_options = dict(grad_options or {})
        if torch.is_grad_enabled() and groups:
            _, _, _, ta, _, h = groups[0]
            grad_options["params"] = resolve_params(step, system, states, ta, h,
                                                    grad_options.get("params"))
    for i0, m, n, ta, tb, h in groups:
        if lean:
            res = rollout_with_grad_mode(grad, integrator, step, q, p, system=system,
                                         h=h, steps=m * n, t0=ta, save_every=n,
                                         check_every=_CHECK_EVERY, step_offset=offset,
                                         params_checked="params" in grad_options, **grad_options)
        elif compile:
            res = compiled_rollout(integrator, system, q, p, h=h, steps=m * n, t0=ta,
                                   save_every=n, check_every=_CHECK_EVERY, step_offset=offset)
        else:
            res, cache = run_loop(step, q, p, system=system, h=h, steps=m * n, t0=ta,
                                  save_every=n, check_every=_CHECK_EVERY, cache=cache,
                                  step_offset=offset, return_cache=True)
        offset += m * n
        res = res[:len(states)]
        for o, r in zip(outs, res):
            o.append(r[1:])
        q, p = res[0][-1], (res[1][-1] if len(states) > 1 else None)
    return tuple(torch.cat(o) for o in outs)


def _groups(times, step_size, eps):
    """Runs (first interval, number of intervals, steps per interval) of consecutive intervals
    of t that share one step size."""
    N = len(times) - 1
    dts = [times[i + 1] - times[i] for i in range(N)]
    scale = [max(abs(times[i]), abs(times[i + 1])) for i in range(N)]
    if step_size is None:
        ns = [1] * N
    else:
        # The ratio carries the round-off of t (|Δt| is good to ~eps·|t|): within it of an
        # integer it is that integer, so linspace grids take the step counts users expect.
        ns = [max(1, math.ceil(abs(d) / step_size - 16 * eps * s / step_size))
              for d, s in zip(dts, scale)]
    groups, i = [], 0
    while i < N:
        j = i + 1
        while (j < N and ns[j] == ns[i]
               and abs(dts[j] - dts[i]) <= 16 * eps * max(scale[i], scale[j])):
            j += 1
        groups.append((i, j - i, ns[i]))
        i = j
    return groups


class _UserFunc:
    """Calls func(t, y) the way torchdiffeq does: t a 0-d tensor of y's dtype, grad mode as at
    the call of odeint.  Inside the solvers' no-grad iterations of a grad-mode call the state is
    handed over as a fresh leaf that requires grad, so a func that differentiates itself with
    torch.autograd.grad (torchdiffeq issue #154) runs; its outputs are detached again."""

    def __init__(self, func, dtype, device, grad):
        self.func, self.dtype, self.device, self.grad = func, dtype, device, grad

    def __call__(self, t, y):
        if isinstance(t, torch.Tensor):   # (compiled graphs pass t as a tensor)
            tt = t.to(self.dtype)
        else:
            tt = torch.full((), t, dtype=self.dtype, device=self.device)
        if not self.grad or torch.is_grad_enabled():
            return self.func(tt, y)
        with torch.enable_grad():
            ys = y if isinstance(y, tuple) else (y,)
            ys = tuple(c.detach().requires_grad_() for c in ys)
            out = self.func(tt, ys if isinstance(y, tuple) else ys[0])
        if isinstance(out, torch.Tensor):
            return out.detach()
        if isinstance(out, (tuple, list)):
            return type(out)(o.detach() if isinstance(o, torch.Tensor) else o for o in out)
        return out


def _check_out(out, shape, what):
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{what} must return tensors like y0, got {type(out).__name__}")
    if out.shape != shape:
        raise ValueError(f"{what} returned shape {tuple(out.shape)}, expected {tuple(shape)} "
                         f"(the shape of the corresponding part of y0)")
    return out


class _FlatState:
    """y0 (tensor or tuple) as x (*batch, N): the first batch_dims dims index samples."""

    def __init__(self, y0, batch_dims):
        self.is_tuple = isinstance(y0, tuple)
        parts = y0 if self.is_tuple else (y0,)
        for i, c in enumerate(parts):
            if c.dim() < batch_dims:
                raise ValueError(f"options['batch_dims'] = {batch_dims} exceeds the dims of y0 "
                                 f"part {i}, shape {tuple(c.shape)}")
        self.batch = parts[0].shape[:batch_dims]
        if any(c.shape[:batch_dims] != self.batch for c in parts):
            raise ValueError(f"the parts of y0 must share their first {batch_dims} (batch) dims, got "
                             f"{[tuple(c.shape) for c in parts]}")
        self.shapes = [c.shape for c in parts]
        self.sizes = [c.numel() // max(1, math.prod(self.batch)) for c in parts]
        self.x0 = torch.cat([c.reshape(*self.batch, n) for c, n in zip(parts, self.sizes)], -1)

    def unflatten(self, x):
        batch = x.shape[:-1]  # (*batch) inside a step, (L, *batch) for a trajectory
        lead = batch[:len(batch) - len(self.batch)]
        parts = tuple(c.reshape((*lead, *s)) for c, s in zip(torch.split(x, self.sizes, -1), self.shapes))
        return parts if self.is_tuple else parts[0]

    def flatten(self, out, what):
        if self.is_tuple:
            if not isinstance(out, (tuple, list)) or len(out) != len(self.shapes):
                raise TypeError(f"{what} must return a tuple of {len(self.shapes)} tensors like y0")
        parts = tuple(out) if self.is_tuple else (out,)
        return torch.cat([_check_out(o, s, what).reshape(*self.batch, n)
                          for o, s, n in zip(parts, self.shapes, self.sizes)], -1)

    def assemble(self, X):
        return self.unflatten(X)


class _PartitionedState:
    """(q0, p0) from a 2-tuple or the split of a tensor, each as (*batch, n)."""

    def __init__(self, y0, split, batch_dims):
        self.is_tuple = isinstance(y0, tuple)
        if self.is_tuple:
            if len(y0) != 2:
                raise ValueError(f"a partitioned method needs y0 = (q0, p0) or a tensor to split, "
                                 f"got a tuple of {len(y0)}; use a first-order method "
                                 f"({', '.join(FIRST_ORDER_METHOD_NAMES)}) for other states")
            if split is not None:
                raise ValueError("options['split'] applies to a tensor y0, not to y0 = (q0, p0)")
            q0, p0 = y0
        else:
            if y0.dim() == 0:
                raise ValueError("a partitioned method needs y0 with a last dim to split into (q, p)")
            m = y0.shape[-1]
            if split is None:
                if m % 2:
                    raise ValueError(f"y0's last dim is {m}, odd: pass options['split'] = k "
                                     f"(q = y[..., :k]) or y0 = (q0, p0)")
                split = m // 2
            if isinstance(split, bool) or not isinstance(split, int) or not 0 < split < m:
                raise ValueError(f"options['split'] must be an int in (0, {m}), got {split!r}")
            q0, p0 = y0[..., :split], y0[..., split:]
        self.split, self.y_shape = split, (None if self.is_tuple else y0.shape)
        dims = min(q0.dim(), p0.dim()) - (0 if self.is_tuple else 1)
        if batch_dims > dims:
            raise ValueError(f"options['batch_dims'] = {batch_dims} exceeds the batch dims "
                             f"available in y0 ({dims})")
        self.batch = q0.shape[:batch_dims]
        if p0.shape[:batch_dims] != self.batch:
            raise ValueError(f"q0 and p0 must share their first {batch_dims} (batch) dims, got "
                             f"{tuple(q0.shape)} and {tuple(p0.shape)}")
        self.q_shape, self.p_shape = q0.shape, p0.shape
        nb = max(1, math.prod(self.batch))
        self.nq, self.np = q0.numel() // nb, p0.numel() // nb
        self.q0, self.p0 = q0.reshape(*self.batch, self.nq), p0.reshape(*self.batch, self.np)

    def user(self, qi, pi):
        lead = qi.shape[:qi.dim() - 1 - len(self.batch)]
        return qi.reshape((*lead, *self.q_shape)), pi.reshape((*lead, *self.p_shape))

    def field(self, caller, func, t, qi, pi):
        q, p = self.user(qi, pi)
        if self.is_tuple:
            out = caller(t, (q, p))
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                raise TypeError("func must return a pair (dq, dp) for y0 = (q0, p0)")
            dq, dp = out
        else:
            dy = _check_out(caller(t, torch.cat([q, p], -1)), self.y_shape, "func")
            dq, dp = dy[..., :self.split], dy[..., self.split:]
        dq, dp = _check_out(dq, q.shape, "func"), _check_out(dp, p.shape, "func")
        return dq.reshape(qi.shape), dp.reshape(pi.shape)

    def assemble(self, Q, P):
        q, p = self.user(Q, P)
        return (q, p) if self.is_tuple else torch.cat([q, p], -1)


class _Partitioned(VectorFieldSystem):
    """The field (dq, dp) of the user's func; with separable=True each half comes from one call
    with the other half zero (q and p may differ in size, unlike VectorFieldSystem's zeros_like)."""

    tensor_time = True   # func takes t as a tensor anyway (torch.compile keeps it so)

    def __init__(self, f, separable, nq, np_):
        super().__init__(f, separable=separable)
        self.nq, self.np_ = nq, np_

    def velocity(self, p, t=0.0):
        if not self.separable:
            return super().velocity(p, t)
        return self.f(t, p.new_zeros(*p.shape[:-1], self.nq), p)[0]

    def force(self, q, t=0.0):
        if not self.separable:
            return super().force(q, t)
        return self.f(t, q, q.new_zeros(*q.shape[:-1], self.np_))[1]


class _Energy(Hamiltonian):
    """X_H of the user's H(q, p); separable: ∂H/∂p at q = 0 and ∂H/∂q at p = 0, each by
    autograd in the one variable (H's gradient in the other never enters)."""

    def __init__(self, H, state, separable):
        super().__init__(lambda qi, pi: H(*state.user(qi, pi)), time_dependent=False)
        self.separable = bool(separable)
        self.nq, self.np_ = state.nq, state.np

    def velocity(self, p, t=0.0):
        if not self.separable:
            return super().velocity(p, t)
        qz = p.new_zeros(*p.shape[:-1], self.nq)
        return grad_of(lambda p_: self.energy(qz, p_), (p,))[0]

    def force(self, q, t=0.0):
        if not self.separable:
            return super().force(q, t)
        pz = q.new_zeros(*q.shape[:-1], self.np_)
        return -grad_of(lambda q_: self.energy(q_, pz), (q,))[0]


def _partitioned_system(func, caller, state, options):
    separable = options.get("separable", False)
    if not isinstance(separable, bool):
        raise ValueError(f"options['separable'] must be a bool, got {separable!r}")
    H = options.get("hamiltonian")
    if H is not None:
        if not callable(H):
            raise TypeError("options['hamiltonian'] must be callable as H(q, p) -> energy")
        if func is not None:
            raise ValueError("with options['hamiltonian'] pass func=None: the field is X_H")
        system = _Energy(H, state, separable)
        _register_module(system, "user_hamiltonian", H)
        return system
    if func is None:
        raise TypeError("func must be callable (or pass options['hamiltonian'] with func=None)")
    system = _Partitioned(lambda t, qi, pi: state.field(caller, func, t, qi, pi), separable,
                          state.nq, state.np)
    _register_module(system, "user_func", func)
    return system
