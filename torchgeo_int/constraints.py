r"""Holonomic constraints g(q) = 0 for any user g: RATTLE (SHAKE + the velocity projection) and the
constrained variational integrators of any discretization map, e.g. the constrained midpoint rule.

A :class:`ConstrainedSystem` is a mechanical Lagrangian L = ½vᵀMv − V(q) (constant M) restricted
to N = {q : g(q) = 0}, g : Rⁿ → Rᵐ with a full-rank Jacobian G(q) = ∂g/∂q (m × n); its phase
space is T*N = {(q, p) : g(q) = 0, G(q)M⁻¹p = 0} (the second condition, the *hidden* constraint,
says the velocity is tangent to N).

**RATTLE** (Andersen 1983; Leimkuhler & Skeel 1994; HLW VII.1.4), :class:`Rattle`:

    p_{½} = p_k − (h/2)∇V(q_k) − G(q_k)ᵀν,     q_{k+1} = q_k + h M⁻¹ p_{½},     g(q_{k+1}) = 0,
    p_{k+1} = p_{½} − (h/2)∇V(q_{k+1}) − G(q_{k+1})ᵀμ,                    G(q_{k+1}) M⁻¹ p_{k+1} = 0,

ν ∈ Rᵐ (= (h/2)λ) by a batched Newton solve of the m equations g(q_{k+1}(ν)) = 0
(:func:`torchgeo_int.newton`, differentiable by its implicit backward); μ from the linear
m × m system (G M⁻¹ Gᵀ) μ = G M⁻¹ (p_{½} − (h/2)∇V(q_{k+1})).  Without the μ-projection it is
SHAKE (Ryckaert, Ciccotti & Berendsen 1977).  Symplectic on T*N, symmetric, order 2, one force
evaluation per step (FSAL); g(q_k) = 0 to the Newton tolerance and the hidden constraint to
round-off at every step.

**Constrained variational integrators**, :class:`ConstrainedVariationalIntegrator` (Marsden &
West, Acta Numerica 2001, §3.5): the discrete Lagrangian L_d^h = h·L(R_d⁻¹/h) of any map (or a
composition of maps) on the constraint manifold, in position–momentum form with the multiplier
split between the two ends:

    p_k − G(q_k)ᵀν = −D₁L_d(q_k, q_{k+1}),   g(q_{k+1}) = 0,
    p_{k+1} = D₂L_d(q_k, q_{k+1}) − G(q_{k+1})ᵀμ,   G(q_{k+1})M⁻¹p_{k+1} = 0,

solved jointly for (q_{k+1}, ν) by Newton (the machinery of ``VariationalIntegrator``).  The
midpoint map gives the *constrained midpoint rule* (order 2, symmetric, symplectic on T*N); the
composition α = 0 then α = 1 at h/2 (Störmer–Verlet's discrete Lagrangian) gives RATTLE again —
the two constructions agree to the solver's tolerance (tested).

A Jacobian that loses rank (G M⁻¹ Gᵀ singular: dependent or degenerate constraints) raises
:class:`ConstraintRankError` (a ``ValueError``).
"""
from __future__ import annotations

from typing import Callable

import torch

from ._autograd import batch_jacobian, grad_inputs, reaches_other_leaves
from ._validate import check_finite, check_pair, find_singular
from .integrators.base import ImplicitIntegrator, Integrator
from .integrators.registry import register
from .integrators.variational import VariationalIntegrator, VelocityCache
from .lagrangian import MechanicalLagrangian
from .maps import AlphaMap, MidpointMap
from .solvers import ConvergenceError, SolveOptions, newton
from .systems import System

Tensor = torch.Tensor

__all__ = ["ConstrainedSystem", "ConstraintRankError", "Rattle", "ConstrainedVariationalIntegrator",
           "CONSTRAINED_METHODS"]


class ConstraintRankError(ValueError):
    """The constraint Jacobian G(q) has lost rank: G M⁻¹ Gᵀ is (numerically) singular."""


class ConstrainedSystem(System):
    r"""L = ½vᵀMv − V(q) restricted to g(q) = 0 (module docstring); state (q, p), p = Mv.

    ``lagrangian``: a :class:`~torchgeo_int.MechanicalLagrangian` (``Lagrangian.mechanical(V, M)``).
    ``constraint``: g(q) → (..., m), m ≥ 1 constraints (any smooth function written with torch
    ops; its Jacobian comes from autograd).
    """

    def __init__(self, lagrangian: MechanicalLagrangian, constraint: Callable[[Tensor], Tensor]):
        super().__init__()
        if not isinstance(lagrangian, MechanicalLagrangian):
            raise TypeError("ConstrainedSystem takes a MechanicalLagrangian (L = ½vᵀMv − V, "
                            f"Lagrangian.mechanical(V, M)), got {type(lagrangian).__name__}")
        if not callable(constraint):
            raise TypeError("constraint must be callable as g(q) -> (..., m)")
        M = lagrangian._mass.M
        if M is not None:   # (the multipliers solve G M⁻¹ Gᵀ μ = …: a negative mass made it
            # singular, reported as a lost constraint rank)
            low = float(M.double().min() if M.dim() < 2 else torch.linalg.eigvalsh(M.double()).min())
            if low <= 0:
                raise ValueError(f"a ConstrainedSystem needs a positive definite mass (its "
                                 f"multipliers solve G M⁻¹ Gᵀ μ = r), got {M.tolist()}")
        self.lagrangian = lagrangian
        self.g = constraint

    # -- the constraint and its derivatives ---------------------------------------------------
    def constraint(self, q: Tensor) -> Tensor:
        """g(q), (..., m)."""
        c = self.g(q)
        if not isinstance(c, torch.Tensor) or c.dim() < 1 or c.shape[:-1] != q.shape[:-1]:
            got = tuple(c.shape) if isinstance(c, torch.Tensor) else type(c).__name__
            raise ValueError(f"the constraint must return (..., m) for q of shape {tuple(q.shape)} "
                             f"(batch dims {tuple(q.shape[:-1])}, then one entry per constraint), got {got}")
        if c.shape[-1] == 0:
            raise ValueError("the constraint returned m = 0 entries: a ConstrainedSystem needs at "
                             "least one constraint (without any, step the Lagrangian itself)")
        return c

    def jacobian(self, q: Tensor) -> Tensor:
        """G(q) = ∂g/∂q, (..., m, n), by m batch-summed reverse passes; keeps a graph when grad
        mode is on and something it depends on requires grad (as ``systems.grad_of``)."""
        keep = torch.is_grad_enabled()
        with torch.enable_grad():
            x, = grad_inputs((q,), keep)
            c = self.constraint(x)
            if keep and not q.requires_grad:
                keep = reaches_other_leaves(c, (x,))
            return batch_jacobian(c, x, keep)

    def mass_solve(self, p: Tensor) -> Tensor:
        """M⁻¹p."""
        return self.lagrangian._mass.solve(p)

    def hidden(self, q: Tensor, p: Tensor) -> Tensor:
        """G(q)M⁻¹p, (..., m): zero on T*N."""
        return (self.jacobian(q) @ self.mass_solve(p).unsqueeze(-1)).squeeze(-1)

    def _gram(self, G: Tensor) -> Tensor:
        """G M⁻¹ Gᵀ, (..., m, m)."""
        return G @ self.mass_solve(G).mT

    def check_rank(self, q: Tensor, G: Tensor | None = None) -> None:
        """Raise :class:`ConstraintRankError` where G(q)M⁻¹G(q)ᵀ is numerically singular."""
        with torch.no_grad():
            G = self.jacobian(q) if G is None else G.detach()
            bad = ~torch.isfinite(G).flatten(-2).all(-1)
            if bool(bad.any()):     # NaN/inf, not a rank: the gram matrix would only say inf
                raise ValueError(f"the constraint Jacobian G(q) = ∂g/∂q is NaN or inf at "
                                 f"{int(bad.sum())} of {bad.numel()} sample(s): g or its gradient "
                                 "is not finite there (check g, and q for NaN)")
            A = self._gram(G)
            # equilibrated (unit diagonal): rows of G that are merely scaled (units, masses, a
            # constraint written as s·g) are independent; only their directions can lose rank.
            # A zero row (the gradient of g² on g = 0) gives 0/0, flagged as non-finite.
            d = A.diagonal(dim1=-2, dim2=-1).clamp_min(0).sqrt()
            A = A / (d.unsqueeze(-1) * d.unsqueeze(-2))
        m = A.shape[-1]
        found = find_singular(A, q.dtype)
        if found is not None:
            count, total, worst = found
            raise ConstraintRankError(
                f"the constraint Jacobian G(q) = ∂g/∂q has lost rank at {count} of "
                f"{total} sample(s): G M⁻¹ Gᵀ ({m}x{m}), equilibrated, has condition number {worst:.3e}; "
                "the constraints must be independent (drop a redundant one, or write g so that "
                "its gradient does not vanish on g = 0)")

    def project_momentum(self, q: Tensor, p: Tensor, G: Tensor | None = None) -> Tensor:
        """p − Gᵀμ with G M⁻¹(p − Gᵀμ) = 0: the momentum made tangent (the M⁻¹-orthogonal
        projection onto the hidden constraint)."""
        G = self.jacobian(q) if G is None else G
        r = (G @ self.mass_solve(p).unsqueeze(-1))
        mu, info = torch.linalg.solve_ex(self._gram(G), r)
        if bool((info != 0).any()) or not bool(torch.isfinite(mu).all()):
            self.check_rank(q, G)
            raise ConstraintRankError("G M⁻¹ Gᵀ is singular: the constraint Jacobian lost rank")
        return p - (G.mT @ mu).squeeze(-1)

    def check_state(self, q: Tensor, p: Tensor) -> None:
        """(q, p) on T*N to √eps (relative), full rank; else ValueError."""
        check_pair(q, p, ("q0", "p0"))
        check_finite(q, "q0")
        check_finite(p, "p0")
        if not q.numel():       # an empty batch: nothing off the constraint (as other systems)
            return
        self.check_rank(q)
        with torch.no_grad():
            tol = torch.finfo(q.dtype).eps ** 0.5
            gq = float(self.constraint(q).abs().max())
            hp = float(self.hidden(q, p).abs().max())
            # G M⁻¹p is a velocity: compared with the velocity M⁻¹p (not p: a heavy mass let a
            # clearly non-tangent p0 through)
            qs, vs = float(q.abs().max()), float(self.mass_solve(p).abs().max())
        if not (gq <= tol * (1 + qs) and hp <= tol * (1 + vs)):      # NaN fails too
            raise ValueError(f"(q0, p0) must lie on T*N: max|g(q0)| = {gq:.2e}, max|G M⁻¹ p0| = "
                             f"{hp:.2e}; start on the constraint and use project_momentum(q, p)")

    # -- the System interface -----------------------------------------------------------------
    def energy(self, q, p, t=0.0):
        return self.lagrangian.energy(q, p, t)

    def vector_field(self, q, p, t=0.0):
        raise NotImplementedError("a ConstrainedSystem is stepped by Rattle or a "
                                  "ConstrainedVariationalIntegrator (CONSTRAINED_METHODS)")


def _constrained(system) -> ConstrainedSystem:
    if not isinstance(system, ConstrainedSystem):
        own = getattr(system, "stepped_by", None)
        raise TypeError(f"constrained integrators step a ConstrainedSystem, got {type(system).__name__}"
                        + (f", which is stepped by {own}" if own else ""))
    return system


def _rank_guard(system, q, G, fn):
    """Run ``fn()``; a singular or non-converged solve is reported as a rank loss where it is one."""
    try:
        return fn()
    except ConvergenceError:
        system.check_rank(q, G)
        raise


class _ConstrainedBase(Integrator):
    symplectic = True
    field_only = False   # (its steps read the system itself: no variable steps)

    def check_state(self, system, q, p):
        _constrained(system).check_state(q, p)


class Rattle(_ConstrainedBase, ImplicitIntegrator):
    """RATTLE for a :class:`ConstrainedSystem` (module docstring): order 2, symmetric, symplectic
    on T*N.  ``tol``, ``max_iter``, ``backward`` go to the Newton solve of the multiplier ν."""

    name, order, symmetric = "rattle", 2, True

    def __init__(self, *, tol: float | None = None, max_iter: int | None = None,
                 backward: str = "implicit"):
        self.options = SolveOptions("newton", tol, max_iter, backward)

    def adjoint(self):
        return self

    def key(self):
        return ("rattle", self.options)

    def step(self, system, q, p, t, h, cache=None):
        S = _constrained(system)
        L = S.lagrangian
        gradV, G0 = (L.grad_V(q), S.jacobian(q)) if cache is None else cache
        a = p - (0.5 * h) * gradV

        # The unknown is y = h G₀M⁻¹G₀ᵀν, the correction in constraint units (ν = (h A₀)⁻¹ y,
        # A₀ = G₀M⁻¹G₀ᵀ): Newton's test |g| ≤ tol (1 + |y|) then compares lengths with lengths
        # whatever the mass (an impulse ν grows with it, and held g only to tol·|ν|).  Its start
        # is the unconstrained step's violation g(q + hM⁻¹a): one linearised (SHAKE) iteration.
        def multiplier(y, G0):
            return torch.linalg.solve_ex(S._gram(G0), y.unsqueeze(-1))[0].squeeze(-1) / h

        def residual(y, q, a, G0):   # the state goes in as the solver's args
            nu = multiplier(y, G0)
            return S.constraint(q + h * S.mass_solve(a - (G0.mT @ nu.unsqueeze(-1)).squeeze(-1)))

        with torch.no_grad():
            y0 = S.constraint((q + h * S.mass_solve(a)).detach())
        y = _rank_guard(S, q, G0, lambda: self.options.root(residual, y0, (q, a, G0)))
        nu = multiplier(y, G0)
        p_half = a - (G0.mT @ nu.unsqueeze(-1)).squeeze(-1)
        q1 = q + h * S.mass_solve(p_half)
        gradV1, G1 = L.grad_V(q1), S.jacobian(q1)
        p1 = S.project_momentum(q1, p_half - (0.5 * h) * gradV1, G1)
        return q1, p1, (gradV1, G1)


class ConstrainedVariationalIntegrator(VariationalIntegrator, _ConstrainedBase):
    r"""The constrained discrete Euler–Lagrange step of L_d^h = h·L(R_d⁻¹/h) on T*N (module
    docstring): ``R`` a map or a list of maps with ``fractions`` as in
    :class:`~torchgeo_int.VariationalIntegrator`; the midpoint map is the constrained midpoint
    rule, [α = 0, α = 1] at h/2 is RATTLE.  Order 2 when symmetric, else 1; symplectic on T*N."""

    variant = "constrained"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # g = 0 is imposed at the step's end point only, not at the interior points of a list of
        # maps, so a triple jump's fractions do not lift the order to 4 (measured 2.00); a
        # Composition of constrained steps does (each stage on T*N)
        self.order = min(self.order, 2 if self.symmetric else 1)

    def step(self, system, q, p, t, h, cache=None):
        S = _constrained(system)
        L = S.lagrangian
        v0 = cache.velocity if isinstance(cache, VelocityCache) else S.mass_solve(p).detach()
        G0 = S.jacobian(q)
        q1, p1 = _rank_guard(S, q, G0, lambda: self._solve(L, q, p, t, h, v0, constraint=(G0, S.constraint)))
        return q1, S.project_momentum(q1, p1), VelocityCache((q1 - q) / h)


def _build():
    methods = [Rattle(),
               ConstrainedVariationalIntegrator(MidpointMap(), name="constrained_midpoint"),
               ConstrainedVariationalIntegrator([AlphaMap(0.0), AlphaMap(1.0)], [0.5, 0.5],
                                                name="constrained_variational_verlet")]
    return {m.name: m for m in methods}


#: Named constrained methods: ``rattle``, ``constrained_midpoint``, ``constrained_variational_verlet``.
CONSTRAINED_METHODS = _build()
register("constrained", CONSTRAINED_METHODS, "a ConstrainedSystem, state (q, p) on T*N")
