r"""Hamiltonian integrators from cotangent lifts, eq. (20) and Sect. 5.1 of the seed paper.

Given H and a discretization map R_d on Q, the step (q_k, p_k) ↦ (q_{k+1}, p_{k+1}) is defined by

    (q_k, p_k; q_{k+1}, p_{k+1}) = R_d^{T*}((q, p), h X_H(q, p))     for some base point (q, p),

and is symplectic for every R_d (Prop 5.1).  For the α-family, with the stage derivative
k = X_H(q, p) as unknown (THEORY §6):

    k = X_H(q_k + αh k_q, p_k + (1−α)h k_p),    q_{k+1} = q_k + h k_q,   p_{k+1} = p_k + h k_p,

a fixed point (or Newton) solve; α = 0 is symplectic Euler (H at (q_k, p_{k+1})), α = 1 its adjoint,
α = ½ the implicit midpoint rule.  On a separable H, α = 0 and α = 1 are explicit (kick–drift and
drift–kick).  For any other map the step is a Newton solve for (q_{k+1}, p_{k+1}) on the residual
of the inverse form, eq. (7):  tangent − h X_H(base) = 0, (base, tangent) = (R_d^{T*})⁻¹(x_k, x_{k+1}).
Time enters as an extra configuration variable moved by the α-map: H is evaluated at t + αh.
Order 1, or 2 when R_d is symmetric.
"""
from __future__ import annotations

import torch

from ..lifts import CotangentLift
from ..maps import AlphaMap, DiscretizationMap
from ..solvers import SolveOptions
from .base import ImplicitIntegrator, explicit_splitting, run_splitting

_NEWTON_HINT = ("the fixed-point iteration needs h·|∂X_H| small enough to contract: reduce h, or "
                "solve the same equations by Newton: method=tgi.CotangentLiftIntegrator("
                "tgi.AlphaMap({a}), solver='newton') (odeint: options['solver'] = 'newton')")


class CotangentLiftIntegrator(ImplicitIntegrator):
    """Eq. (20) for any DiscretizationMap ``R`` on Q.

    ``solver``: ``"fixed_point"`` (default for the α-family) or ``"newton"`` (always used for
    other maps); ``tol``/``max_iter`` go to the solver; ``backward`` is the solver's gradient mode
    (``"implicit"``: exact implicit-function-theorem gradients, memory independent of iterations).
    """

    steps_backward = True

    def __init__(self, R: DiscretizationMap, *, solver: str = "fixed_point", tol: float | None = None,
                 max_iter: int | None = None, backward: str = "implicit", name: str | None = None):
        if not isinstance(R, DiscretizationMap):
            raise TypeError(f"CotangentLiftIntegrator takes a DiscretizationMap, got {type(R).__name__}")
        self.R = self.state_map = R
        self.options = SolveOptions(solver, tol, max_iter, backward)
        self.alpha = R.alpha if isinstance(R, AlphaMap) else None
        self.symmetric = R.symmetric
        self.order = 2 if R.symmetric else 1
        self.name = name or f"cotangent_lift({R})"
        self._lift = None if self.alpha is not None else CotangentLift(R)

    def adjoint(self):
        return self._options_to(CotangentLiftIntegrator(self.R.adjoint()))

    def splitting(self):
        if self.alpha == 0.0:
            return (1.0, 0.0), (1.0,)          # kick h, then drift h
        if self.alpha == 1.0:
            return (0.0, 1.0), (1.0,)          # drift h, then kick h
        return None

    def key(self) -> tuple:
        return ("cotangent_lift", self.R.key())

    def step(self, system, q, p, t, h, cache=None):
        if (sp := explicit_splitting(self, system)) is not None:
            return run_splitting(*sp, system, q, p, t, h)
        if self.alpha is not None:
            return self._alpha_step(system, q, p, t, h, cache)
        return self._generic_step(system, q, p, t, h)

    def _alpha_step(self, system, q, p, t, h, cache):
        a = self.alpha
        tb = t + a * h

        # (q, p) go in as the solver's args, not captured: its ∂/∂k calls then skip their
        # history; so does tb, so that a compiled solve (compile=True fuses the iterations)
        # sees the same function every step
        def stage(k, q, p, tb):   # fused adds: one kernel each
            return system.vector_field(torch.add(q, k[0], alpha=a * h),
                                       torch.add(p, k[1], alpha=(1.0 - a) * h), tb)

        if cache is not None:
            k0 = cache
        else:
            with torch.no_grad():   # a guess: no graph
                k0 = system.vector_field(q, p, t)
        # Without contraction (h·|∂X_H| too large, e.g. a stiff learned field: it stalls or blows
        # up) the error says how to get Newton's method on the same equations.
        k = self.options.solve(stage, k0, (q, p, tb), hint=_NEWTON_HINT.format(a=self.alpha))
        # The stage derivative is the warm start of the next solve (no graph needed for a guess).
        return torch.add(q, k[0], alpha=h), torch.add(p, k[1], alpha=h), tuple(x.detach() for x in k)

    def _generic_step(self, system, q, p, t, h):
        xk = torch.cat([q, p], -1)
        n = q.shape[-1]
        tb = t + self.R.base_fraction * h

        def residual(z, xk):
            base, tangent = self._lift.inverse_unchecked(xk, torch.cat(z, -1))
            dq, dp = system.vector_field(base[..., :n], base[..., n:], tb)
            return tangent[..., :n] - h * dq, tangent[..., n:] - h * dp

        with torch.no_grad():   # the explicit Euler guess: no graph
            dq, dp = system.vector_field(q, p, t)
            z0 = (q + h * dq, p + h * dp)
        q1, p1 = self.options.root(residual, z0, (xk,), solver="newton")
        return q1, p1, None
