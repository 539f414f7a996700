"""Named integrators (``METHODS``; every family in ``registry``) and the classes that build them."""
from __future__ import annotations

from ..maps import AlphaMap
from .base import Integrator
from .composition import TABLES, CoefficientTable, Composition
from .cotangent import CotangentLiftIntegrator
from .registry import get_method, register


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
register("hamiltonian", METHODS, "a Hamiltonian system, state (q, p)")

# the other families register themselves when built (the Lie family with torchgeo_int.manifolds)
from . import first_order, sode, variational  # noqa: E402,F401
from .splitting import SPLITTING_METHODS, ProcessedSplitting, Splitting  # noqa: E402
register("splitting", SPLITTING_METHODS, "a separable Hamiltonian system, state (q, p)")


__all__ = ["METHODS", "Integrator", "CotangentLiftIntegrator", "Composition", "CoefficientTable",
           "TABLES", "get_method", "SPLITTING_METHODS", "Splitting", "ProcessedSplitting"]
