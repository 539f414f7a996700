"""odeint's methods: the names it takes, how a name or an Integrator becomes the integrator it
runs (with the solve options of the call), and its refusals."""
from __future__ import annotations

from torchdiffeq._impl.odeint import SOLVERS as TORCHDIFFEQ_SOLVERS

from .._cache import IdentityCache
from ..integrators import METHODS, SPLITTING_METHODS, Integrator
from ..integrators.first_order import FIRST_ORDER_METHODS, theta
from ..integrators.registry import STATES, family_of
from .checks import ADAPTIVE, PARTITIONED_ONLY

PARTITIONED_METHODS: tuple[str, ...] = tuple(sorted(METHODS))
#: explicit splittings of separable systems (state (q, p) with options['separable']=True)
SPLITTING_METHOD_NAMES: tuple[str, ...] = tuple(sorted(SPLITTING_METHODS))
FIRST_ORDER_METHOD_NAMES: tuple[str, ...] = tuple(sorted(FIRST_ORDER_METHODS))
GEOMETRIC_METHODS: tuple[str, ...] = tuple(sorted(set(METHODS) | set(FIRST_ORDER_METHODS) | {"theta"}))


def delegated_names(solvers) -> tuple[str, ...]:
    """The names of torchdiffeq's ``SOLVERS`` that odeint passes on: all but ours.  A torchdiffeq
    built from its master branch also defines ``implicit_midpoint`` and ``implicit_euler``; the
    geometric ones keep those names (the same equations, solved per sample instead of by one
    Broyden iteration over the whole batch), so installing it changes nothing here."""
    return tuple(name for name in solvers if name not in GEOMETRIC_METHODS)


TORCHDIFFEQ_METHODS: tuple[str, ...] = delegated_names(TORCHDIFFEQ_SOLVERS)


def all_methods() -> str:
    return (f"torchdiffeq's: {', '.join(TORCHDIFFEQ_METHODS)}; geometric (partitioned): "
            f"{', '.join(PARTITIONED_METHODS)}; splittings (separable): {', '.join(SPLITTING_METHOD_NAMES)}; geometric (first-order, eq. (1)): "
            f"{', '.join(FIRST_ORDER_METHOD_NAMES)}, theta (options=dict(theta=θ)); or an Integrator instance")


def is_torchdiffeq(method) -> bool:
    return method is None or (isinstance(method, str) and method in TORCHDIFFEQ_METHODS)


def is_geometric_name(method) -> bool:
    return isinstance(method, str) and method in GEOMETRIC_METHODS


def method_name(method) -> str:
    return method.name if isinstance(method, Integrator) else str(method)


def resolve_method(method, y0, options):
    """('partitioned' | 'first_order', the integrator to configure)."""
    if isinstance(method, Integrator):
        return ("first_order" if method.first_order else "partitioned"), method
    if isinstance(method, str) and method not in GEOMETRIC_METHODS and method in SPLITTING_METHODS:
        return "partitioned", SPLITTING_METHODS[method]
    if not isinstance(method, str) or method not in GEOMETRIC_METHODS:
        family = family_of(method)
        if family is not None:   # a registered method odeint's state layout cannot carry
            raise ValueError(f"unknown method {method!r} for odeint: it is a {family!r} method, for "
                             f"{STATES[family]}; integrate it with tgi.rollout(system, ..., "
                             f"method={method!r}). odeint's methods: {all_methods()}")
        raise ValueError(f"unknown method {method!r}; known methods: {all_methods()}")
    if method == "theta":
        # the θ-method (x_{k+1} − x_k)/h = X((1−θ)x_k + θx_{k+1}): eq. (1) with AlphaMap(θ)
        if "theta" not in options:
            raise ValueError("method 'theta' needs options=dict(theta=θ) with θ in [0, 1]")
        try:   # the map's own message names its parameter alpha, which the caller never passed
            return "first_order", theta(options["theta"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"options['theta'] must be a number in [0, 1], got "
                             f"{options['theta']!r}") from err
    if method in FIRST_ORDER_METHODS:
        partitioned = (isinstance(y0, tuple) and len(y0) == 2
                       or any(k in options for k in PARTITIONED_ONLY + ADAPTIVE))
        if not (partitioned and method in METHODS):
            return "first_order", FIRST_ORDER_METHODS[method]
    return "partitioned", METHODS[method]


_CONFIGURED = IdentityCache(256)   # a long-lived process sweeping tolerances stays bounded


def configured(integrator, tol, solver, max_iter):
    """A copy of a named integrator with the solve options of this call (cached per integrator
    object, by weak reference: see ``_cache``)."""
    extra = (integrator.name, tol, solver, max_iter)
    out = _CONFIGURED.get((integrator,), extra)
    if out is None:
        changes = dict(tol=tol)
        if solver:
            changes["solver"] = solver
        if max_iter is not None:
            changes["max_iter"] = max_iter
        out = _CONFIGURED.put((integrator,), extra, integrator.with_options(**changes))
    return out


def reversible_refusal(integrator, why):
    return (f"options['grad'] = 'reversible' needs a symmetric method of (q, p) (verlet and its "
            f"compositions: yoshida4, suzuki4, ...; implicit midpoint and its compositions); "
            f"{integrator.name!r} cannot: {why}.  Use options['grad'] = 'checkpoint' (exact, "
            f"O(√steps) memory).")
