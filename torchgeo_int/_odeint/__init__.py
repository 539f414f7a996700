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
  and that half of its output is ignored; the promise is checked the first time a func is met,
  ``state.check_separable``); otherwise the implicit generalized forms are used
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
ratio above an integer by no more than t's round-off and 10⁻³ of itself counts as that
integer: such steps exceed h by at most 0.1 %).  The outputs are the states reached at the t_i —
never interpolated, which would break the symplecticity (or the invariants) of the outputs.
Consecutive intervals with the same step run as one ``_loop.run_loop`` (their internal times
agree with t to within a few ulps of t).

Adaptive geometric steps (partitioned methods; :mod:`torchgeo_int.adaptive`):
``options["adaptive"] = "reversible"`` with ``step_size = ε`` runs time-reversible variable
steps of physical size ≈ ε σ(q, p) (``options["control"]`` = σ, a callable σ(q) or σ(q, p) on
the shapes of q0, p0 returning the batch shape; default |q|^{3/2}; ``form`` "log" | "additive";
``h_min``; ``max_steps``) with a symmetric method, each sample of the batch in its own time,
until all pass t[-1]; the outputs at t are cubic Hermite dense output of those steps (not on the
symplectic trajectory, and the step sequence does not depend on t).  Every ``grad`` mode
applies, as in ``tgi.rollout(..., step_control=σ, grad=...)`` (the parameters of a ``control``
that is an ``nn.Module`` are differentiated with func's); ``compile``, ``event_fn``,
``perturb``, ``func.callback_step`` and a ``t`` that requires grad are refused.
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
    so a loop of calls compiles once; results equal the eager ones to round-off for explicit
    methods, to about the solver's tolerance for implicit ones), ``segment`` (int, steps per
    recomputed segment of grad="checkpoint"), ``reconstruction_tol`` (float, grad="reversible"),
    ``params`` (tensors to differentiate under a lean grad mode; see below), ``perturb``
    (bool: torchdiffeq's — a field evaluated at a step's start or end sees the time one ulp
    inside the step; given at all, every step evaluates the field at its start as torchdiffeq's
    do), ``interp`` ("step" — default — | "linear" | "cubic": the state inside the step where an
    event is located), ``progress`` (bool: a tqdm bar over the steps).

torchdiffeq's contract holds for every geometric method (:mod:`torchgeo_int._odeint.contract`):
a ``t`` that requires grad gets the exact gradient of the discrete map with respect to the time
grid (with grad="backprop", compile=False); ``event_fn`` (with ``options["step_size"]`` and
len(t) == 2, as torchdiffeq's fixed-grid solvers) steps from t[0] towards t[1] and beyond until
the event's sign changes, locates it with torchdiffeq's bisection to ``atol`` and returns
``(event_t, stack([y0, y(event_t)]))`` — y(event_t) one step of the method of the partial size
by default, so a state of the geometric map; ``func.callback_step(t0, y0, dt)`` is called before
every step; ``callback_accept_step``/``callback_reject_step`` are never (a fixed-step method
has no rejected steps) and warn, as torchdiffeq's fixed-grid solvers do.

Gradients: by backpropagation through the steps — the exact gradient of the discrete map —,
through implicit steps by the solvers' implicit-function-theorem backward; to ``t`` when it
requires grad (above).  A ``func`` that calls
``torch.autograd.grad`` itself (HNNs; torchdiffeq issue #154) works: when grad mode is on at
the call of ``odeint``, func sees grad mode on, and inputs that require grad, also inside the
solvers' no-grad iterations.

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
odeint raises ValueError rather than silently give it no gradient (before the run when the first
step uses it, else in the backward pass, which checks every recomputed step, or, with nothing else
requiring grad, by a probe step at the end of the run).  Each run of equal steps
starts a fresh FSAL/warm-start cache under a lean mode, so for time-dependent or implicit
fields the result may differ from backprop's in the last bits.  torchdiffeq's methods take no
``grad`` option (use ``odeint_adjoint`` for their memory-lean, continuous-adjoint gradients).

``odeint_adjoint`` is torchdiffeq's (continuous adjoint), for torchdiffeq's methods; with a
geometric method use ``odeint`` (with ``options["grad"]`` for memory-lean gradients).
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
import torchdiffeq

from ..adaptive import odeint_adaptive
from ..gradients import not_reversible
from ..integrators import CotangentLiftIntegrator, Integrator
from ..integrators.first_order import FirstOrderIntegrator
from ..systems import ODESystem
from .checks import (ADAPTIVE, COMMON, OPTIONS, PARTITIONED_ONLY, check_func, check_int, check_state,
                     check_step_size, check_times, parse_grad_options, solver_tol, tol_values)
from .contract import INTERPS, FirstCallCheck, TimeMap, integrate_until_event, step_callback
from .driver import hooked_step, integrate
from .methods import (FIRST_ORDER_METHOD_NAMES, GEOMETRIC_METHODS, PARTITIONED_METHODS,
                      TORCHDIFFEQ_METHODS, all_methods, configured, delegated_names,
                      is_geometric_name, is_torchdiffeq, method_name, resolve_method,
                      reversible_refusal)
from .state import (FlatState, PartitionedState, UserFunc, partitioned_system, register_module,
                    system_for)

__all__ = ["odeint", "odeint_adjoint", "TORCHDIFFEQ_METHODS", "GEOMETRIC_METHODS",
           "PARTITIONED_METHODS", "FIRST_ORDER_METHOD_NAMES", "OPTIONS"]


def odeint(func, y0, t, *, rtol=1e-7, atol=1e-9, method=None, options=None, event_fn=None):
    """Solve dy/dt = func(t, y), y(t[0]) = y0 at the times t (see the module docstring).

    Returns a tensor ``(len(t), *y0.shape)`` or a tuple of them like ``y0``; with ``event_fn``
    ``(event_t, solution)`` as in torchdiffeq.

    Raises ValueError for an unknown method (listing every method), an unknown option, a bad
    ``t`` (not 1-D, not strictly monotone, not finite), a non-finite ``y0`` or a first output
    of ``func`` whose shape is not y0's (for torchdiffeq's methods too, before they start: they
    would broadcast it, or fail with "underflow in dt"); ``tgi.ConvergenceError`` (naming the
    step) when an implicit step does not converge; ``FloatingPointError`` when the solution
    becomes non-finite.
    """
    check_func(func)
    if is_torchdiffeq(method):
        if isinstance(options, Mapping) and "grad" in options:
            if options["grad"] != "backprop":
                raise ValueError(
                    f"options['grad'] = {options['grad']!r} is for the geometric methods; "
                    f"torchdiffeq's method {method or 'dopri5'!r} backpropagates through its "
                    f"steps, and its memory-lean gradients are torchdiffeq's continuous adjoint: "
                    f"use tgi.odeint_adjoint(...) (or a geometric method with this option)")
            options = {k: v for k, v in options.items() if k != "grad"}
        if isinstance(options, Mapping) and "adaptive" in options:
            # torchdiffeq would only warn of an unexpected argument and run its own steps
            raise ValueError(
                f"options['adaptive'] = {options['adaptive']!r} is the reversible variable steps "
                f"of the geometric methods (verlet, yoshida4, implicit_midpoint, ...); "
                f"torchdiffeq's method {method or 'dopri5'!r} has its own error control (rtol, atol)")
        # torchdiffeq broadcasts a func of the wrong shape, turns an inf in t into NaN rows,
        # loops on a NaN y0 ("underflow in dt"), runs with a negative tolerance and fails on an
        # integer y0 or a zero step_size with messages that name neither: the geometric path's
        # checks first.
        check_times(t)
        tol_values(rtol, "rtol")
        tol_values(atol, "atol")
        if isinstance(options, Mapping) and "step_size" in options:
            check_step_size(options["step_size"])
        if isinstance(y0, (torch.Tensor, tuple)):
            parts = y0 if isinstance(y0, tuple) else (y0,)
            for i, c in enumerate(parts):
                what = "y0" if len(parts) == 1 else f"y0[{i}]"
                if isinstance(c, torch.Tensor) and not (c.is_floating_point() or c.is_complex()):
                    raise TypeError(f"{what} must be a floating-point (or complex) tensor, got "
                                    f"dtype {c.dtype}")
                if isinstance(c, torch.Tensor) and not bool(torch.isfinite(c).all()):
                    raise ValueError(f"{what} contains NaN or inf")
            if callable(func):
                func = FirstCallCheck(func, y0)
        return torchdiffeq.odeint(func, y0, t, rtol=rtol, atol=atol, method=method,
                                  options=options, event_fn=event_fn)
    return geometric_odeint(func, y0, t, rtol=rtol, atol=atol, method=method, options=options,
                             event_fn=event_fn)


def odeint_adjoint(func, y0, t, *, rtol=1e-7, atol=1e-9, method=None, options=None,
                   event_fn=None, adjoint_rtol=None, adjoint_atol=None, adjoint_method=None,
                   adjoint_options=None, adjoint_params=None):
    """torchdiffeq's ``odeint_adjoint`` (gradients from the continuous adjoint ODE), for
    torchdiffeq's methods.  A geometric method raises: use :func:`odeint`, whose backprop gives
    the exact gradient of the discrete (symplectic) map, and whose ``options["grad"]``
    ("checkpoint" | "reversible") gives it with little memory."""
    for name, m in (("method", method), ("adjoint_method", adjoint_method)):
        if m is None or is_torchdiffeq(m):
            continue
        if is_geometric_name(m) or isinstance(m, Integrator):
            raise ValueError(
                f"odeint_adjoint integrates torchdiffeq's continuous adjoint ODE and supports "
                f"torchdiffeq's methods only; for the geometric {name} {method_name(m)!r} use "
                f"torchgeo_int.odeint (backprop gives the exact gradient of the discrete map; "
                f"options=dict(grad='checkpoint'|'reversible') for memory-lean gradients)")
        raise ValueError(f"unknown {name} {m!r}; known methods: {all_methods()}")
    check_func(func)
    if isinstance(options, Mapping) and "grad" in options:
        raise ValueError("odeint_adjoint takes no options['grad']: its gradients are the continuous "
                         "adjoint's; options['grad'] selects the gradient mode of tgi.odeint's "
                         "geometric methods")
    return torchdiffeq.odeint_adjoint(
        func, y0, t, rtol=rtol, atol=atol, method=method, options=options, event_fn=event_fn,
        adjoint_rtol=adjoint_rtol, adjoint_atol=adjoint_atol, adjoint_method=adjoint_method,
        adjoint_options=adjoint_options, adjoint_params=adjoint_params)


def geometric_odeint(func, y0, t, *, rtol, atol, method, options, event_fn):
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise TypeError(f"options must be a dict, got {type(options).__name__}")
    kind, template = resolve_method(method, y0, options)
    allowed = OPTIONS if kind == "partitioned" else COMMON + (("theta",) if method == "theta" else ())
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        extra = ""
        if kind == "first_order" and set(unknown) & set(PARTITIONED_ONLY):
            extra = f" ({', '.join(PARTITIONED_ONLY)} apply to partitioned methods only)"
        raise ValueError(f"unknown option(s) {unknown} for method {method_name(method)!r}; "
                         f"accepted: {', '.join(allowed)}{extra}")
    stray = [k for k in ADAPTIVE[1:] if k in options]
    if stray and "adaptive" not in options:
        raise ValueError(f"option(s) {stray} configure the reversible variable steps: pass "
                         f"options['adaptive'] = 'reversible' with them (without it the steps are "
                         f"fixed, options['step_size'])")
    if isinstance(method, Integrator) and ("solver" in options or "max_iter" in options):
        raise ValueError("options 'solver'/'max_iter' configure named methods; configure the "
                         "Integrator instance itself")
    times = check_times(t)
    step_size = check_step_size(options.get("step_size"))
    batch_dims = check_int(options.get("batch_dims", 0), "batch_dims", 0)
    solver = options.get("solver")
    if solver not in (None, "fixed_point", "newton"):
        raise ValueError(f"options['solver'] must be 'fixed_point' or 'newton', got {solver!r}")
    max_iter = options.get("max_iter")
    if max_iter is not None:
        check_int(max_iter, "max_iter", 1)

    parts = y0 if isinstance(y0, tuple) else (y0,)
    if not isinstance(y0, (torch.Tensor, tuple)) or not parts:
        raise TypeError(f"y0 must be a tensor or a non-empty tuple of tensors, got {type(y0).__name__}")
    check_state(parts, "y0")
    dtype, device = parts[0].dtype, parts[0].device
    grad, grad_options = parse_grad_options(options)
    compile = options.get("compile", False)
    flags = {k: options.get(k, False) for k in ("compile", "perturb", "progress")}
    for k, v in flags.items():
        if not isinstance(v, bool):
            raise ValueError(f"options[{k!r}] must be a bool, got {v!r}")
    interp = options.get("interp", "step")
    if interp not in INTERPS:
        raise ValueError(f"options['interp'] must be one of {INTERPS}, got {interp!r}")
    if "interp" in options and event_fn is None:
        raise ValueError("options['interp'] is how an event_fn's root is located inside a step; "
                         "without event_fn the outputs are the steps' own states at every t")
    name = method_name(method)
    callback = step_callback(func, name)
    t_grad = t.requires_grad and torch.is_grad_enabled()
    hooked = {"gradients with respect to t (a t that requires grad)": t_grad,
              "event_fn": event_fn is not None, "options['perturb']": "perturb" in options,
              "func.callback_step": callback is not None}
    hooked = [k for k, v in hooked.items() if v]
    if hooked and (compile or grad != "backprop"):
        raise ValueError(f"{' and '.join(hooked)} run(s) step by step with grad='backprop' and "
                         f"compile=False; got grad={grad!r}, compile={compile} (pass t.detach() "
                         "for no gradient in t)")
    if event_fn is not None:
        if len(times) != 2:
            raise ValueError(f"event_fn needs len(t) == 2 (t[0] starts the event search, t[1] "
                             f"gives its direction, as in torchdiffeq), got len(t)={len(times)}")
        if step_size is None:
            raise ValueError(f"event_fn with the geometric method {name!r} needs "
                             "options['step_size'] (the step of the event search), as "
                             "torchdiffeq's fixed-grid solvers do")
    caller = UserFunc(func, dtype, device, grad=torch.is_grad_enabled())
    if isinstance(method, Integrator):
        integrator = template
    else:
        integrator = configured(template, solver_tol(rtol, atol, dtype), solver, max_iter)
    if t_grad and not _time_scalable(integrator):
        raise ValueError(f"gradients with respect to t need a method whose step uses h only as "
                         f"h·X (Runge–Kutta type: the named methods and their compositions); "
                         f"{name!r} is not known to be one: pass t.detach()")
    run = dict(caller=caller, t=t if t_grad else None, perturb=flags["perturb"],
               fresh="perturb" in options,
               callback=callback, progress=name if flags["progress"] else None)

    if kind == "first_order":
        if func is None:
            raise TypeError("func must be callable as func(t, y) -> dy/dt")
        if grad == "reversible":
            raise ValueError(reversible_refusal(integrator, "it is a first-order (eq. (1)) method"))
        state = FlatState(y0, batch_dims)

        def build():
            system = ODESystem(lambda tt, x: state.flatten(caller(tt, state.unflatten(x)), "func"))
            system.tensor_time = True   # func takes t as a tensor anyway (torch.compile keeps it so)
            register_module(system, "user_func", func)
            return system
        system = system_for(compile, kind, func, options, state, y0, caller, build)
        run["to_user"] = lambda x, _p: state.unflatten(x)
        if event_fn is not None:
            return _event(integrator, system, (state.x0, None), y0, t, times, step_size, event_fn,
                          atol, interp, lambda tt, x, _p: (system.vector_field(x, None, tt), None), run)
        (X,) = integrate(integrator, system, (state.x0,), times, step_size, t.dtype,
                          grad, grad_options, compile, **run)
        return state.assemble(X)

    # An explicit splitting of a separable func solves nothing per sample: the state keeps the
    # user's shapes (no reshapes around every call of func).  Not under options['adaptive'],
    # whose step sizes are per sample of the flat (*batch, n) layout (in the user's shapes a
    # q of shape (N, d) would be N samples, each with its own steps and time).
    natural = (func is not None and options.get("hamiltonian") is None
               and options.get("separable") is True and integrator.splitting() is not None
               and "adaptive" not in options)
    state = PartitionedState(y0, options.get("split"), batch_dims, natural=natural)
    system = system_for(compile, kind, func, options, state, y0, caller,
                         lambda: partitioned_system(func, caller, state, options, times[0]))
    why = not_reversible(integrator, system) if grad == "reversible" else None
    if why:
        raise ValueError(reversible_refusal(integrator, why))
    run["to_user"] = state.assemble
    if "adaptive" in options:   # reversible variable steps + dense output (torchgeo_int.adaptive)
        # The variable steps are adaptive_rollout's own loop (every grad mode of rollout), not
        # solve's: the compiled stepper and torchdiffeq's per-step hooks do not reach it.
        refused = hooked + (["options['compile']"] if compile else [])
        if refused:
            raise ValueError(f"options['adaptive'] takes grad='backprop' | 'checkpoint' | "
                             f"'reversible' but not {' or '.join(refused)}")
        # a control that is an nn.Module (or a method of one): the lean modes differentiate its
        # parameters as they do func's (odeint_adaptive wraps it in a closure)
        register_module(system, "user_control", options.get("control"))
        return state.assemble(*odeint_adaptive(integrator, system, state, times, options,
                                               step_size, grad, grad_options))
    if event_fn is not None:
        return _event(integrator, system, (state.q0, state.p0), y0, t, times, step_size, event_fn,
                      atol, interp, lambda tt, q, p: system.vector_field(q, p, tt), run)
    Q, P = integrate(integrator, system, (state.q0, state.p0), times, step_size, t.dtype,
                      grad, grad_options, compile, **run)
    return state.assemble(Q, P)


def _time_scalable(integrator) -> bool:
    """Whether the step uses h only as h·X (see ``_contract.TimeMap``): cotangent-lift and
    first-order steps and compositions of them."""
    return all(isinstance(m, (CotangentLiftIntegrator, FirstOrderIntegrator))
               for m, _ in integrator.stages())


def _event(integrator, system, states, y0, t, times, step_size, event_fn, atol, interp, field, run):
    """odeint with event_fn on a geometric method: (event_t, stack([y0, y(event_t)]))."""
    caller = run["caller"]
    if run["t"] is not None:   # the field sees t[0] + (τ − τ0): the gradient reaches t[0]
        caller.time_map = TimeMap(run["t"][0].to(caller.dtype), times[0])
    try:
        h = step_size if times[1] > times[0] else -step_size
        bound = integrator.bind(system)
        event_t, y_event = integrate_until_event(
            hooked_step(bound, run), system, states, times[0], h, event_fn,
            to_user=run["to_user"], tol=min(tol_values(atol, "atol")), interp=interp, field=field,
            trial_step=hooked_step(bound, dict(run, callback=None)))   # no callback_step for trials
    finally:
        caller.time_map = None
    if isinstance(y0, tuple):
        solution = tuple(torch.stack([a, b]) for a, b in zip(y0, y_event))
    else:
        solution = torch.stack([y0, y_event])
    return event_t.to(t.dtype).detach(), solution
