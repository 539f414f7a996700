r"""Discrete variational integrators, Sects. 5.2–5.3 and 6 of the seed paper (THEORY §7–8).

For a Lagrangian L and a discretization map R_d on Q, the discrete Lagrangian
L_d^h(q₀, q₁) = h·L(R_d⁻¹(q₀, q₁)/h) (``lagrangian.DiscreteLagrangian``) generates the step
(q_k, p_k) ↦ (q_{k+1}, p_{k+1}) through the discrete Legendre transforms (position–momentum form)

    p_k = −D₁L_d(q_k, q_{k+1})   (solved for q_{k+1} by Newton),    p_{k+1} = D₂L_d(q_k, q_{k+1}),

equivalently the discrete Euler–Lagrange equations D₁L_d(q_k, q_{k+1}) + D₂L_d(q_{k−1}, q_k) = 0
(:class:`DiscreteEulerLagrange`).  By the commuting diagram (22)–(23) it equals the cotangent-lift
integrator (eq. (20)) of the same R_d for the Legendre-transformed H, so it is symplectic for every
R_d; order 2 when R_d is symmetric, else 1.

Composition (Sect. 6): the discrete Lagrangian L_d¹(q₀, q₁; c₁h) + … + L_d^s(q_{s−1}, q_s; c_s h)
with the intermediate points solved for, jointly with q_s, from p₀ = −D₁L_d¹(q₀, q₁) and the
interior discrete Euler–Lagrange equations D₂L_d^{i}(q_{i−1}, q_i) + D₁L_d^{i+1}(q_i, q_{i+1}) = 0;
α = 0 then α = 1 at h/2 is Störmer–Verlet.  That solve is
:meth:`~torchgeo_int.lagrangian.ComposedDiscreteLagrangian.generate` (the composed discrete
Lagrangian is its one home; a single map is the composition of one), called by every step here.
"""
from __future__ import annotations

import torch

from ..lagrangian import (ComposedDiscreteLagrangian, DiscreteLagrangian, Lagrangian,
                          MechanicalLagrangian, check_fractions)
from ..maps import AlphaMap, DiscretizationMap
from ..solvers import ConvergenceError, SolveOptions
from .base import ImplicitIntegrator, Integrator
from .composition import composed_order
from .registry import register

Tensor = torch.Tensor

__all__ = ["VariationalIntegrator", "DiscreteEulerLagrange", "VARIATIONAL_METHODS"]


class VelocityCache:
    """The cache a variational step hands to the next (this module's and the constrained and
    forced ones): the last discrete velocity (q_{k+1} − q_k)/h, no graph, the next solve's warm
    start; and the Lagrangian's momentum scale (``Lagrangian.momentum_scale``, taken at the
    rollout's first step: a velocity Hessian, not one a step)."""

    __slots__ = ("velocity", "scale")

    def __init__(self, velocity, scale=None):
        self.velocity, self.scale = velocity.detach(), scale


def _lagrangian(system) -> Lagrangian:
    if not isinstance(system, Lagrangian):
        raise TypeError(f"variational integrators step a Lagrangian system (state (q, p)), got "
                        f"{type(system).__name__}; build one with Lagrangian(fn) or "
                        "Lagrangian.mechanical(potential, mass)")
    return system


def _velocity_guess(L: Lagrangian, q, p, t) -> Tensor:
    """v ≈ FL⁻¹(q, p): exact for a mechanical Lagrangian, else one Newton step from v = 0."""
    with torch.no_grad():
        if isinstance(L, MechanicalLagrangian):
            return L.inverse_legendre(q, p, t)
        zero = torch.zeros_like(q)
        W = L.velocity_hessian(q, zero, t)
        v, info = torch.linalg.solve_ex(W, (p - L.legendre(q, zero, t)).unsqueeze(-1))
        v = v.squeeze(-1)
        ok = (info == 0).unsqueeze(-1) & torch.isfinite(v)
        return torch.where(ok, v, zero)  # a singular W at v = 0 is judged after the solve


class VariationalIntegrator(ImplicitIntegrator):
    r"""The discrete variational integrator of L_d^h = h·L(R_d⁻¹/h) (Sect. 5.3), on the state (q, p).

    ``R``: a DiscretizationMap on Q, or a sequence of them with step ``fractions`` (default equal;
    they sum to 1) for the composed discrete Lagrangian Σᵢ L_d^{(i)}(q_{i−1}, q_i; cᵢh) (Sect. 6).
    The step solves p_k = −D₁L_d(q_k, q_{k+1}) with :func:`torchgeo_int.newton` — for the discrete
    velocity (q_{k+1} − q_k)/h when R_d is an α-map, for the base point (q̄, w) of
    (q_k, q_{k+1}) = R_d(q̄, w) otherwise, so that no derivative is taken through a Newton
    inverse and no digits are lost forming (q_{k+1} − q_k)/h — then p_{k+1} = D₂L_d(q_k, q_{k+1}).
    A composition is solved jointly for all its stages, i.e. with its intermediate points.
    Symplectic; symmetric (order 2) when the stages are palindromic with adjoint maps, e.g. a
    symmetric R_d, or [α, 1 − α] at equal fractions; else order 1; order 4 for symmetric maps at
    palindromic fractions with Σcᵢ³ = 0 (the triple jump: a composition, HLW Thm V.3.1).  A degenerate Lagrangian
    (∂²L/∂v² singular) raises ``DegenerateLagrangianError`` (a ``ValueError``).
    ``tol``, ``max_iter``, ``backward`` go to the Newton solver (implicit IFT gradients by default).
    """

    field_only = False   # (its steps read the system itself: no variable steps)

    symplectic = True
    #: a subclass that changes only the discrete equations (``_equations``/``step``: forced,
    #: constrained) names itself here; it prefixes the default name and the key, and the
    #: adjoint is of the same class
    variant: str | None = None

    def __init__(self, R, fractions=None, *, tol: float | None = None, max_iter: int | None = None,
                 backward: str = "implicit", name: str | None = None):
        single = isinstance(R, DiscretizationMap)
        if not single and not isinstance(R, (list, tuple)):
            raise TypeError("R must be a DiscretizationMap or a list of them, got "
                            f"{type(R).__name__}")
        if single and fractions is not None and list(fractions) != [1.0]:
            raise ValueError("fractions are for a list of maps; a single map takes the whole step")
        self.maps, self.fractions = check_fractions([R] if single else R, fractions)
        self.symmetric = self._is_symmetric()
        # Σᵢ L_d^{(i)} with its interior points stationary generates the composition of the
        # stages' variational maps (Sect. 6), so a composition's order rule applies: symmetric
        # maps at palindromic fractions with Σc³ = 0 (the triple jump) give order 4
        self.order = composed_order([2 if R.symmetric else 1 for R in self.maps], self.symmetric,
                                    all(R.symmetric for R in self.maps), self.fractions)
        self.options = SolveOptions("newton", tol, max_iter, backward)
        label = ", ".join(f"{m}" for m in self.maps)
        default = f"variational({label}; {self.fractions})"
        self.name = name or (f"{self.variant}_{default}" if self.variant else default)

    def _is_symmetric(self) -> bool:
        pairs = list(zip(self.maps, self.fractions))
        # either way round: AlphaMap(0.7).adjoint() is AlphaMap(0.30000000000000004), while
        # AlphaMap(0.3).adjoint() is AlphaMap(0.7) exactly
        return all(c == c2 and (R.adjoint().key() == R2.key() or R2.adjoint().key() == R.key())
                   for (R, c), (R2, c2) in zip(pairs, reversed(pairs)))

    def adjoint(self) -> "VariationalIntegrator":
        return self._options_to(type(self)([R.adjoint() for R in reversed(self.maps)],
                                           list(reversed(self.fractions))))

    def key(self) -> tuple:
        key = ("variational", tuple(R.key() for R in self.maps), tuple(self.fractions))
        return key if self.variant is None else (self.variant, *key)

    def _equations(self, system):
        """(L, E): L the Lagrangian of the warm start and the regularity checks, E the one whose
        ``derivatives(q, v, t)`` enter the discrete equations — both the system here; the forced
        integrator (``torchgeo_int.forced``) adds the force to E's ∂L/∂q, the constrained one
        (``torchgeo_int.constraints``) passes a multiplier term through ``_solve``."""
        L = _lagrangian(system)
        return L, L

    def step(self, system, q, p, t, h, cache=None):
        L, E = self._equations(system)
        if isinstance(cache, VelocityCache):
            v0 = cache.velocity
        else:
            v0 = _velocity_guess(L, q, p, t)
            # Once per rollout: a potential's Hessian can make the discrete equations of a
            # degenerate L solvable (ill-conditioned), so a converged solve proves nothing.
            if not isinstance(L, MechanicalLagrangian):
                L.check_regular(q, v0, t)
        scale = cache.scale if isinstance(cache, VelocityCache) else None
        fresh = scale is None
        if fresh:
            scale = L.momentum_scale(q, v0, t)
        try:
            q1, p1 = self._solve(E, q, p, t, h, v0, scale=scale)
        except ConvergenceError:
            L.check_regular(q, v0, t)  # a degenerate L is the likelier cause: say so
            if fresh:
                raise
            # The scale is the rollout's first (a Hessian a step costs too much), and ∂²L/∂v²
            # may have grown since (L = e^q|v|²/2: the residuals' round-off passed the tolerance
            # at step 45): once more with this state's, which the rollout then keeps
            scale = L.momentum_scale(q, v0, t)
            q1, p1 = self._solve(E, q, p, t, h, v0, scale=scale)
        return q1, p1, VelocityCache((q1 - q) / h, scale)

    def discrete_lagrangian(self, L: Lagrangian) -> ComposedDiscreteLagrangian:
        """Σᵢ L_d^{(i)}(q_{i−1}, q_i; cᵢh) of L over this method's maps and fractions, in the
        base-point form its step solves (``ends=False``: any map)."""
        return ComposedDiscreteLagrangian(L, self.maps, self.fractions, ends=False)

    def _solve(self, L, q, p, t, h, v0, constraint=None, scale=None):
        """(q_{k+1}, p_{k+1}) generated by the composed discrete Lagrangian of L
        (:meth:`ComposedDiscreteLagrangian.generate`, which says what ``constraint`` and
        ``scale`` do)."""
        return self.discrete_lagrangian(L).generate(q, p, h, t, v0, self.options, constraint, scale)


class DiscreteEulerLagrange(ImplicitIntegrator):
    r"""The discrete Euler–Lagrange equations D₁L_d(q_k, q_{k+1}) + D₂L_d(q_{k−1}, q_k) = 0
    solved for q_{k+1} (Newton), L_d^h = h·L(R_d⁻¹/h) (Sect. 5.3): it is the variational
    integrator with p_k = D₂L_d(q_{k−1}, q_k) eliminated.

    Protocol: the state is the pair (q_{k−1}, q_k): ``step(system, q_prev, q, t, h, cache) ->
    (q, q_next, cache)``, t the time of q_{k−1}; ``rollout(L, q0, q1, method=...)`` works.
    :meth:`start` gives q₁ from (q₀, p₀), :meth:`momentum` recovers p_k.
    """

    field_only = False   # (its steps read the system itself: no variable steps)

    symplectic = True

    def __init__(self, R: DiscretizationMap, *, tol=None, max_iter=None, backward="implicit",
                 name=None):
        self.vi = VariationalIntegrator(R, tol=tol, max_iter=max_iter, backward=backward)
        self.R, self.options = R, self.vi.options
        self.order, self.symmetric = self.vi.order, self.vi.symmetric
        self.name = name or f"discrete_euler_lagrange({R})"

    def key(self) -> tuple:
        return ("discrete_euler_lagrange", self.vi.key())

    def start(self, system, q0, p0, t=0.0, h=0.01) -> Tensor:
        """q₁ from (q₀, p₀): one variational step."""
        return self.vi.step(system, q0, p0, t, h)[0]

    def momentum(self, system, q_prev, q, t=0.0, h=0.01) -> Tensor:
        """p_k = D₂L_d(q_{k−1}, q_k); t is the time of q_{k−1}."""
        return DiscreteLagrangian(_lagrangian(system), self.R).derivatives(q_prev, q, h, t)[1]

    def step(self, system, q_prev, q, t, h, cache=None):
        pk = self.momentum(system, q_prev, q, t, h)
        if not isinstance(cache, VelocityCache):
            L, v = _lagrangian(system), (q - q_prev) / h
            if not isinstance(L, MechanicalLagrangian):
                L.check_regular(q, v, t + h)
            cache = VelocityCache(v)
        q1, _, cache = self.vi.step(system, q, pk, t + h, h, cache)
        return q, q1, cache


def _build_variational_methods() -> dict[str, Integrator]:
    methods = [
        VariationalIntegrator(AlphaMap(0.0), name="variational_euler"),
        VariationalIntegrator(AlphaMap(1.0), name="variational_euler_adjoint"),
        VariationalIntegrator(AlphaMap(0.5), name="variational_midpoint"),
        VariationalIntegrator([AlphaMap(0.0), AlphaMap(1.0)], [0.5, 0.5], name="variational_verlet"),
    ]
    return {m.name: m for m in methods}


#: Named variational methods (state (q, p) of a Lagrangian system).
VARIATIONAL_METHODS: dict[str, Integrator] = _build_variational_methods()
register("variational", VARIATIONAL_METHODS, "a Lagrangian, state (q, p)")
