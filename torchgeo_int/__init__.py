"""torchgeo_int: geometric integrators for PyTorch, built from discretization maps.

Data flows one way: maps → lifts → integrators → solve (one path) → rollout/odeint → nn
(README, section Architecture).
"""
from .maps import (AdjointMap, AlphaMap, BackwardEulerMap, DiscretizationMap, ForwardEulerMap,
                   MidpointMap, RetractionMap)
from .lifts import CotangentLift, TangentLift
from .solvers import ConvergenceError, default_tol, fixed_point, newton
from .systems import Hamiltonian, ODESystem, SeparableHamiltonian, System, VectorFieldSystem
from .integrators import (METHODS, TABLES, CoefficientTable, Composition, CotangentLiftIntegrator,
                          Integrator, get_method)
from .integrators.first_order import FIRST_ORDER_METHODS, FirstOrderIntegrator, theta
from .integrators.splitting import (SPLITTING_METHODS, ProcessedSplitting, Splitting, SymplecticDIRK,
                                    compose)
from .integrators.sode import SODE_METHODS, DiscreteSODE, Newmark, NewmarkMap, TangentLiftSODE
from .integrators.variational import VARIATIONAL_METHODS, DiscreteEulerLagrange, VariationalIntegrator
from .lagrangian import (ComposedDiscreteLagrangian, DegenerateLagrangianError, DiscreteLagrangian,
                         Lagrangian, MechanicalLagrangian, SecondOrderSystem)
from .rollout import rollout
from .forced import (FORCED_VARIATIONAL_METHODS, ForcedSystem, ForcedVariationalIntegrator,
                     discrete_work)
from ._odeint import odeint, odeint_adjoint
from .constraints import (CONSTRAINED_METHODS, ConstrainedSystem, ConstrainedVariationalIntegrator,
                          ConstraintRankError, Rattle)
from .adaptive import (AdaptiveTrajectory, LogHamiltonian, PoincareTransform, StepControl,
                       StepSizeCollapse, adaptive_rollout, dense_output, power_law_control,
                       time_transformed_rollout)
from . import distributed, manifolds, nn

__version__ = "0.1.0"

__all__ = [
    "DiscretizationMap", "AlphaMap", "ForwardEulerMap", "MidpointMap", "BackwardEulerMap",
    "RetractionMap", "AdjointMap", "TangentLift", "CotangentLift",
    "fixed_point", "newton", "ConvergenceError", "default_tol",
    "System", "Hamiltonian", "SeparableHamiltonian", "VectorFieldSystem", "ODESystem",
    "Integrator", "CotangentLiftIntegrator", "Composition", "CoefficientTable", "TABLES",
    "METHODS", "get_method", "rollout", "nn", "distributed", "manifolds",
    "SODE_METHODS", "DiscreteSODE", "Newmark", "NewmarkMap", "TangentLiftSODE",
    "VARIATIONAL_METHODS", "DiscreteEulerLagrange", "VariationalIntegrator",
    "DiscreteLagrangian", "ComposedDiscreteLagrangian", "DegenerateLagrangianError", "Lagrangian", "MechanicalLagrangian", "SecondOrderSystem",
    "FirstOrderIntegrator", "FIRST_ORDER_METHODS", "theta", "odeint", "odeint_adjoint",
    "ForcedSystem", "ForcedVariationalIntegrator", "FORCED_VARIATIONAL_METHODS", "discrete_work",
    "ConstrainedSystem", "ConstraintRankError", "Rattle", "ConstrainedVariationalIntegrator",
    "CONSTRAINED_METHODS",
    "SPLITTING_METHODS", "Splitting", "ProcessedSplitting", "SymplecticDIRK", "compose",
    "adaptive_rollout", "time_transformed_rollout", "StepControl", "power_law_control",
    "PoincareTransform", "LogHamiltonian", "AdaptiveTrajectory", "StepSizeCollapse", "dense_output",
]
