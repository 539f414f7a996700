"""Named integrators (``METHODS``) and the classes that build them."""
from __future__ import annotations

from ..maps import AlphaMap
from .base import Integrator
from .composition import TABLES, CoefficientTable, Composition
from .cotangent import CotangentLiftIntegrator
from .splitting import SPLITTING_METHODS, ProcessedSplitting, Splitting


def _build_methods() -> dict[str, Integrator]:
    se = CotangentLiftIntegrator(AlphaMap(0.0), name="symplectic_euler")
    se_adj = CotangentLiftIntegrator(AlphaMap(1.0), name="symplectic_euler_adjoint")
    mid = CotangentLiftIntegrator(AlphaMap(0.5), name="implicit_midpoint")
    verlet = Composition([se, se_adj], [0.5, 0.5], order=2, name="verlet")
    methods: dict[str, Integrator] = {m.name: m for m in (se, se_adj, mid, verlet)}
    for table in TABLES.values():
        methods[table.name] = Composition(verlet, table.gammas, order=table.order, name=table.name)
        name = f"implicit_midpoint_{table.name}"
        methods[name] = Composition(mid, table.gammas, order=table.order, name=name)
    return methods


#: Every named method: ``METHODS[name].order / .symplectic / .symmetric``.
METHODS: dict[str, Integrator] = _build_methods()


def get_method(method, *, first_order: bool = False) -> Integrator:
    """An Integrator from a name or an Integrator instance: names of METHODS (Hamiltonian), or
    with ``first_order=True`` names of FIRST_ORDER_METHODS (eq. (1); ``implicit_midpoint`` is
    then the midpoint rule on x)."""
    from .first_order import FIRST_ORDER_METHODS
    from .sode import SODE_METHODS
    from .variational import VARIATIONAL_METHODS
    if isinstance(method, Integrator):
        return method
    tables = ([FIRST_ORDER_METHODS] if first_order
              else [METHODS, SPLITTING_METHODS, SODE_METHODS, VARIATIONAL_METHODS])
    for table in tables:
        if isinstance(method, str) and method in table:
            return table[method]
    table = tables[0]
    raise ValueError(f"unknown {'first-order ' if first_order else ''}method {method!r}; known methods: "
                     f"{', '.join(sorted(table))}{'' if first_order else ', ' + ', '.join(SPLITTING_METHODS)}, "
                     "or pass an Integrator "
                     "(e.g. CotangentLiftIntegrator(AlphaMap(0.3)))")


__all__ = ["METHODS", "Integrator", "CotangentLiftIntegrator", "Composition", "CoefficientTable",
           "TABLES", "get_method", "SPLITTING_METHODS", "Splitting", "ProcessedSplitting"]
