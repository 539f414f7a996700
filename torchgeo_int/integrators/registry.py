"""The one registry of named methods: every family registers its table here, ``get_method``
looks a name up in all of them, and an unknown name gets one error listing them all.

Families (name → table, registered by the module that builds it): ``hamiltonian`` (METHODS,
state (q, p) of a Hamiltonian), ``first_order`` (FIRST_ORDER_METHODS, x' = X(x, t), p = None),
``sode`` (SODE_METHODS, state (q, v) of a second-order system), ``variational``
(VARIATIONAL_METHODS, state (q, p) of a Lagrangian), ``lie`` (LIE_METHODS, state (g, μ) of a
Lie-group system), ``splitting`` (SPLITTING_METHODS, a separable Hamiltonian), ``forced``
(FORCED_VARIATIONAL_METHODS, state (q, p) of a ForcedSystem over a Lagrangian; ``torchgeo_int.forced``)
and ``constrained`` (CONSTRAINED_METHODS: ``rattle``, ``constrained_midpoint``,
``constrained_variational_verlet``, state (q, p) on T*N of a ConstrainedSystem;
``torchgeo_int.constraints``).  A new family is one ``register`` call in the module that builds it.

Not here: methods that need constructor arguments for a name to mean anything — the RATTLE of
T*Sⁿ (``manifolds.integrators.Rattle``, which takes its sphere from the system but has no table),
``VariationalIntegrator(R, fractions)`` / ``ForcedVariationalIntegrator`` /
``ConstrainedVariationalIntegrator`` over a user's map, ``LieGroupIntegrator(tau, alpha)`` at a
general α: their named instances are in the families above, the rest is built from the class.
"""
from __future__ import annotations

from .base import Integrator

#: family → {name → Integrator}, in lookup order.
FAMILIES: dict[str, dict[str, Integrator]] = {}

#: What each family integrates (for error messages).
STATES: dict[str, str] = {}


def register(family: str, methods: dict[str, Integrator], state: str) -> None:
    """Add a family of named methods (``state``: what its rollouts take, for messages)."""
    if family in FAMILIES and FAMILIES[family] is not methods:
        raise ValueError(f"method family {family!r} is already registered")
    for name, m in methods.items():
        if not isinstance(m, Integrator):
            raise TypeError(f"{family}[{name!r}] is not an Integrator: {type(m).__name__}")
    FAMILIES[family] = methods
    STATES[family] = state


def family_of(name) -> str | None:
    """The first family holding ``name``, first-order names looked up last (a shared name,
    ``implicit_midpoint``, is the Hamiltonian method unless ``first_order`` is asked for)."""
    # by registration order, except the first-order family, which would shadow shared names
    for family, table in sorted(FAMILIES.items(), key=lambda kv: kv[0] == "first_order"):
        if isinstance(name, str) and name in table:
            return family
    return None


def known_methods() -> str:
    """Every registered name, by family (the text of the unknown-method errors)."""
    return "; ".join(f"{family} ({STATES[family]}): {', '.join(sorted(table))}"
                     for family, table in FAMILIES.items())


def get_method(method, *, first_order: bool = False) -> Integrator:
    """An Integrator from a name of any registered family or an Integrator instance; with
    ``first_order=True`` a name is looked up among the first-order (eq. (1)) methods only
    (``implicit_midpoint`` is then the midpoint rule on x)."""
    if isinstance(method, Integrator):
        return method
    if isinstance(method, str):
        families = ["first_order"] if first_order else [f for f in FAMILIES if f != "first_order"]
        for family in families:
            if method in FAMILIES.get(family, {}):
                return FAMILIES[family][method]
    raise ValueError(f"unknown {'first-order ' if first_order else ''}method {method!r}; known "
                     f"methods: {known_methods()}; or pass an Integrator "
                     "(e.g. CotangentLiftIntegrator(AlphaMap(0.3)))")


__all__ = ["FAMILIES", "register", "get_method", "family_of", "known_methods"]
