"""Discretization maps and symplectic-momentum integrators on manifolds and Lie groups.

* :mod:`.so3`   SO(3) maths: hat/vee, exp/log (Rodrigues), Cayley, trivialised differentials.
* :mod:`.lie`   left-trivialised machinery: groups (SO(3), SO(3) × R³), coordinate maps τ,
                discretization maps R_d(g, ξ) = (g τ(−αξ), g τ((1−α)ξ)) and their cotangent lifts.
* :mod:`.sphere` the sphere Sⁿ embedded in R^{n+1}: exp and projection retractions, their
                discretization maps, and a first-order (eq. 1) integrator that stays on Sⁿ.
* :mod:`.systems` rigid body, heavy top, spring top (SO(3) × R³), a learned H on T*SO(3),
                the spherical pendulum.
* :mod:`.integrators` Lie-group cotangent-lift integrators and their compositions; RATTLE.

Data flow as in the rest of the package: so3/sphere → lie → systems → integrators.
"""
from . import so3, sphere
from .lie import SO3, SO3xR3, LieCotangentLift, LieGroup, LieGroupMap, get_group
from .systems import (FreeRigidBody, HeavyTop, LieGroupSystem, LieHamiltonian, RigidBody,
                      SO3HNN, SphericalPendulum, SpringTop)
from .integrators import LIE_METHODS, LieComposition, LieGroupIntegrator, Rattle, lie_method
from .sphere import SphereMap, SphereODEIntegrator

__all__ = [
    "so3", "sphere", "SO3", "SO3xR3", "LieGroup", "LieGroupMap", "LieCotangentLift", "get_group",
    "LieGroupSystem", "LieHamiltonian", "RigidBody", "FreeRigidBody", "HeavyTop", "SpringTop",
    "SO3HNN", "SphericalPendulum", "LieGroupIntegrator", "LieComposition", "lie_method",
    "LIE_METHODS", "Rattle", "SphereMap", "SphereODEIntegrator",
]
