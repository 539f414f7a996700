r"""Second-order equations q̈ = F(t, q, q̇) on TQ, Sect. 4 of the seed paper (THEORY §5).

A SODE Γ = v ∂_q + F ∂_v is stepped on the state (q, v) with a discretization map R = (R¹, R²)
on TQ (points ``cat([q, v], -1)``) in one of two ways:

* eq. (10):  R²(q_k, v_k; h v_k, h F_k) = R¹(q_{k+1}, v_{k+1}; h v_{k+1}, h F_{k+1})
  (:class:`SODEIntegrator` with ``equation=10``; :class:`Newmark` is this with the map
  :class:`NewmarkMap`, in closed form);
* eq. (11):  h Γ(τ_TQ(R⁻¹(x_k, x_{k+1}))) = R⁻¹(x_k, x_{k+1}), solved in the forward form
  R¹(x̄, hΓ(x̄)) = x_k, x_{k+1} = R²(x̄, hΓ(x̄)) for the base point x̄ ∈ TQ (no inverse of R
  needed) (:class:`SODEIntegrator` with ``equation=11``; :class:`TangentLiftSODE` is this with
  the tangent lift of a map on Q).

:class:`DiscreteSODE` is eq. (11) with the tangent lift written as a discrete second-order
equation (q_{k−1}, q_k) ↦ q_{k+1} (Sect. 4.2).  Systems: ``lagrangian.SecondOrderSystem``
(q̈ = M⁻¹f(t, q, q̇)), or anything with ``acceleration(q, v, t)``.

Size: the second-order family (generic eq. (10)/(11), the tangent-lift α-family, Newmark,
the discrete second-order equation) shares its caches and the acceleration adapter.
"""
from __future__ import annotations

import math
import numbers

import torch

from ..lifts import TangentLift
from ..maps import AlphaMap, DiscretizationMap, ForwardEulerMap, MidpointMap
from ..solvers import SolveOptions
from .base import ImplicitIntegrator, Integrator
from .registry import register

Tensor = torch.Tensor

__all__ = ["NewmarkMap", "SODEIntegrator", "TangentLiftSODE", "Newmark", "DiscreteSODE",
           "SODE_METHODS"]


def _split(x):
    n = x.shape[-1] // 2
    return x[..., :n], x[..., n:]


def _real(x, name):
    if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x):
        raise TypeError(f"{name} must be a finite real number, got {x!r}")
    return float(x)


def _acceleration(system):
    acc = getattr(system, "acceleration", None)
    if acc is None:
        raise TypeError(f"second-order integrators step a SODE q̈ = F(t, q, q̇) on the state (q, v): "
                        f"pass a SecondOrderSystem (or Lagrangian.sode()), got {type(system).__name__}")
    return acc


def _velocity_dependent(system) -> bool:
    return bool(getattr(system, "velocity_dependent", True))


def _lifted(R: DiscretizationMap, x, xdot):
    """R_d^T(x, ẋ) of TangentLift(R) (THEORY §3)."""
    (q, v), (qd, vd) = _split(x), _split(xdot)
    y0, y1 = R.forward_unchecked(q, qd)
    dy0, dy1 = R.jvp(q, qd, v, vd)
    return torch.cat([y0, dy0], -1), torch.cat([y1, dy1], -1)


def _forward_on_tq(R: DiscretizationMap, x, xdot):
    return _lifted(R.base, x, xdot) if isinstance(R, TangentLift) else R.forward_unchecked(x, xdot)


class SODECache:
    """What a SODE step hands to the next one: the acceleration F at the new state (FSAL)."""

    __slots__ = ("acc",)

    def __init__(self, acc):
        self.acc = acc


class _StageCache:
    """Warm start of an α-family stage solve, k = (v̄, F(q̄, v̄)) (no graph: only a guess)."""

    __slots__ = ("stage",)

    def __init__(self, stage):
        self.stage = tuple(s.detach() for s in stage)


class _BaseCache(_StageCache):
    """Warm start of a forward-form eq. (11) solve: the last base point (q̄, v̄)."""


# -- the Newmark map ------------------------------------------------------------------------------
class NewmarkMap(DiscretizationMap):
    r"""The discretization map on TQ of the Newmark family (Sect. 4.1), with c = (h/2)(γ − 2β):

        R¹(q, v; q̇, v̇) = (q − q̇/2 + c v̇,  v − γ v̇),
        R²(q, v; q̇, v̇) = (q + q̇/2 + c v̇,  v + (1 − γ) v̇).

    Def 2.2 holds for every (γ, β, h); it depends on the step size h.  Its inverse is closed:
    v̇ = v₁ − v₀, v = (1−γ)v₀ + γv₁, q̇ = q₁ − q₀, q = (q₀ + q₁)/2 − c v̇.  At γ = ½, β = ¼ it is the
    tangent lift of the midpoint map (Example 3.1).  In eq. (10) it gives the Newmark method (13).
    """

    linear = True

    def __init__(self, gamma: float, beta: float, h: float):
        super().__init__()
        self.gamma, self.beta, self.h = _real(gamma, "gamma"), _real(beta, "beta"), _real(h, "h")
        self.c = 0.5 * self.h * (self.gamma - 2.0 * self.beta)

    def extra_repr(self):
        return f"gamma={self.gamma}, beta={self.beta}, h={self.h}"

    @property
    def symmetric(self) -> bool:
        return self.gamma == 0.5 and self.beta == 0.25

    def adjoint(self) -> "NewmarkMap":
        # (R²(x, −ẋ), R¹(x, −ẋ)) is the Newmark map with γ ↦ 1 − γ and c ↦ −c.
        return NewmarkMap(1.0 - self.gamma, 0.5 - self.beta, self.h)

    bundle = True   # a map on TQ: points cat([q, v], -1)

    def first(self, q, v, qd, vd):
        """R¹ on split coordinates: (q-part, v-part)."""
        return q - 0.5 * qd + self.c * vd, v - self.gamma * vd

    def second(self, q, v, qd, vd):
        """R² on split coordinates."""
        return q + 0.5 * qd + self.c * vd, v + (1.0 - self.gamma) * vd

    def _forward(self, x, xdot):
        (q, v), (qd, vd) = _split(x), _split(xdot)
        return torch.cat(self.first(q, v, qd, vd), -1), torch.cat(self.second(q, v, qd, vd), -1)

    def _inverse(self, x0, x1):
        (q0, v0), (q1, v1) = _split(x0), _split(x1)
        vd = v1 - v0
        base = torch.cat([0.5 * (q0 + q1) - self.c * vd, (1.0 - self.gamma) * v0 + self.gamma * v1], -1)
        return base, torch.cat([q1 - q0, vd], -1)

    # R is affine in (x, ẋ) jointly, so DR·(dx, dẋ) = R(dx, dẋ) and its solve is R⁻¹.
    def jvp(self, x, v, dx, dv):
        return self._forward(dx, dv)

    def solve_jvp(self, x, v, a0, a1):
        return self._inverse(a0, a1)


# -- the generic integrators of eqs. (10) and (11) -------------------------------------------------
class SODEIntegrator(ImplicitIntegrator):
    r"""Eq. (10) or eq. (11) for a discretization map ``R`` on TQ (points ``cat([q, v], -1)``).

    ``R``: a DiscretizationMap on TQ, or a callable ``h -> DiscretizationMap`` for maps that
    depend on the step size (e.g. ``lambda h: NewmarkMap(γ, β, h)``).
    ``equation=10``:  R²(x_k; hΓ(t_k, x_k)) = R¹(x_{k+1}; hΓ(t_{k+1}, x_{k+1})), a Newton solve for
    x_{k+1} started at explicit Euler; Γ at the new state is handed to the next step (FSAL).
    ``equation=11``:  the base point x̄ solves R¹(x̄; hΓ(t̄, x̄)) = x_k (Newton started at x_k),
    then x_{k+1} = R²(x̄; hΓ(t̄, x̄)); t̄ = t + αh with α the base map's (½ without one).
    ``order``/``symmetric``/``symplectic`` are declared by the caller (defaults: a symmetric map
    gives a symmetric method, hence order 2; else order 1; not symplectic).  ``tol``,
    ``max_iter``, ``backward`` go to :func:`torchgeo_int.newton`.
    """

    field_only = False   # (its steps read the system itself: no variable steps)

    def __init__(self, R, *, equation: int = 11, order: int | None = None,
                 symmetric: bool | None = None, symplectic: bool = False, tol: float | None = None,
                 max_iter: int | None = None, backward: str = "implicit", name: str | None = None,
                 solver: str = "newton"):
        if equation not in (10, 11):
            raise ValueError(f"equation must be 10 or 11 (the seed paper's), got {equation!r}")
        if not callable(R):
            raise TypeError("R must be a DiscretizationMap on TQ or a callable h -> DiscretizationMap")
        self.R, self.equation = R, equation
        self._fixed = isinstance(R, DiscretizationMap)
        sym = R.symmetric if self._fixed else False
        self.symmetric = sym if symmetric is None else bool(symmetric)
        self.order = (2 if self.symmetric else 1) if order is None else int(order)
        self.symplectic = bool(symplectic)
        self.options = SolveOptions(solver, tol, max_iter, backward)
        self.name = name or f"sode_eq{equation}({R})"

    def key(self) -> tuple:
        # a map built per step (R(h)) is known by the callable's identity only
        return ("sode", self.equation, self.R.key() if self._fixed else id(self.R))

    def map_for(self, h: float) -> DiscretizationMap:
        R = self.R if self._fixed else self.R(h)
        if not isinstance(R, DiscretizationMap):
            raise TypeError(f"R(h) must return a DiscretizationMap, got {type(R).__name__}")
        return R

    def step(self, system, q, v, t, h, cache=None):
        acc = _acceleration(system)
        R = self.map_for(h)
        if self.equation == 10:
            return self._step10(acc, R, q, v, t, h, cache)
        return self._step11(acc, R, q, v, t, h, cache)

    def _step10(self, acc, R, q, v, t, h, cache):
        a = cache.acc if isinstance(cache, SODECache) else acc(q, v, t)
        xk = torch.cat([q, v], -1)
        rhs = _forward_on_tq(R, xk, torch.cat([h * v, h * a], -1))[1]

        # What the residuals read of the current state goes in as the solver's args (not
        # captured): the solver's ∂/∂z calls then skip its history (see solvers' note on args).
        def residual(z, rhs):
            q1, v1 = z
            lhs = _forward_on_tq(R, torch.cat(z, -1), torch.cat([h * v1, h * acc(q1, v1, t + h)], -1))[0]
            return _split(lhs - rhs)

        z0 = ((q + h * v).detach(), (v + h * a).detach())
        q1, v1 = self.options.root(residual, z0, (rhs,), solver="newton")
        a1 = acc(q1, v1, t + h)
        return q1, v1, SODECache(a1)

    def _step11(self, acc, R, q, v, t, h, cache):
        tb = t + R.base_fraction * h
        xk = torch.cat([q, v], -1)

        def halves(z):
            qb, vb = z
            return _forward_on_tq(R, torch.cat(z, -1), torch.cat([h * vb, h * acc(qb, vb, tb)], -1))

        def residual(z, xk):
            return _split(halves(z)[0] - xk)

        z0 = cache.stage if isinstance(cache, _BaseCache) else (q.detach(), v.detach())
        zb = self.options.root(residual, z0, (xk,), solver="newton")
        q1, v1 = _split(halves(zb)[1])
        return q1, v1, _BaseCache(zb)


class TangentLiftSODE(SODEIntegrator):
    r"""Eq. (11) with the tangent lift R_d^T of a map R_d on Q (Sect. 3.1, 4): the base point
    (q̄, v̄) and the tangent h(v̄, F(q̄, v̄)) satisfy (q_k, v_k; q_{k+1}, v_{k+1}) = R_d^T((q̄, v̄),
    hΓ(q̄, v̄)); in particular (q_k, q_{k+1}) = R_d(q̄, h v̄).  For the α-family (Example 3.1):

        q̄ = q_k + αh v̄,  v̄ = v_k + αh F(t + αh, q̄, v̄),   q_{k+1} = q_k + h v̄,  v_{k+1} = v_k + h F(·)

    — explicit Euler at α = 0, implicit Euler at α = 1, the **midpoint rule** on TQ at α = ½
    (F at the midpoint; symplectic in (q, Mv) for F = −M⁻¹∇V).  Order 2 when R_d is symmetric,
    else 1.  The α-family is solved in stage form by ``solver`` ("fixed_point" or "newton");
    any other map by Newton on the forward form (no R_d⁻¹ needed).
    """

    def __init__(self, R: DiscretizationMap, *, solver: str = "fixed_point", tol=None,
                 max_iter=None, backward="implicit", name=None):
        if not isinstance(R, DiscretizationMap):
            raise TypeError(f"TangentLiftSODE takes a DiscretizationMap on Q, got {type(R).__name__}")
        self.base_map = R
        self.alpha = R.alpha if isinstance(R, AlphaMap) else None
        super().__init__(TangentLift(R), equation=11, symmetric=R.symmetric,
                         symplectic=self.alpha == 0.5, tol=tol, max_iter=max_iter,
                         backward=backward, name=name or f"tangent_lift_sode({R})", solver=solver)

    def adjoint(self):
        return self._options_to(TangentLiftSODE(self.base_map.adjoint()))

    def key(self) -> tuple:
        return ("tangent_lift_sode", self.base_map.key())

    def step(self, system, q, v, t, h, cache=None):
        if self.alpha is None:
            return super().step(system, q, v, t, h, cache)
        acc = _acceleration(system)
        a = self.alpha
        tb = t + a * h
        if a == 0.0:  # explicit Euler on TQ
            return q + h * v, v + h * acc(q, v, t), None

        def stage(k, q, v):  # k = (v̄, F(q̄, v̄)); (q, v) are the solver's args
            vb = v + (a * h) * k[1]
            return vb, acc(q + (a * h) * k[0], vb, tb)

        if type(cache) is _StageCache:
            k0 = cache.stage
        else:
            with torch.no_grad():
                k0 = (v.detach(), acc(q, v, t).detach())
        k = self.options.solve(stage, k0, (q, v))
        return q + h * k[0], v + h * k[1], _StageCache(k)


# -- Newmark --------------------------------------------------------------------------------------
class Newmark(SODEIntegrator):
    r"""The Newmark family (γ, β) as the seed paper builds it (Sect. 4.1): eq. (10) with
    :class:`NewmarkMap`, R²(x_k; h v_k, h a_k) = R¹(x_{k+1}; h v_{k+1}, h a_{k+1}), a = M⁻¹f.

    Solving R¹(x; h v, h a) = c for x given a is affine — v = c_v + γh a,
    q = c_q + (h/2)c_v + βh² a — so with the predictor c = R²(x_k; h v_k, h a_k) the step is the
    classical update (13)

        q_{k+1} = q_k + h v_k + (h²/2)((1−2β) a_k + 2β a_{k+1}),
        v_{k+1} = v_k + h((1−γ) a_k + γ a_{k+1}),      a_{k+1} = M⁻¹f(t_{k+1}, q_{k+1}, v_{k+1}),

    with velocity-dependent forces (damping) entering through a_{k+1} (implicit in v_{k+1} when
    γ ≠ 0).  Explicit when β = 0 and f does not depend on v (one force evaluation per step,
    FSAL); otherwise a_{k+1} is solved for (``solver``: "newton" (default) or "fixed_point").

    Order 2 if γ = ½, else 1 (γ > ½ damps high frequencies); symmetric iff γ = ½, with adjoint
    Newmark(1 − γ, ½ − γ + β); symplectic in (q, Mv) only for γ = ½, β = 0 (velocity Verlet) —
    for β ≠ 0 it preserves a non-canonical symplectic form only (Kane, Marsden, Ortiz & West,
    IJNME 49 (2000)).  Named members: average acceleration (½, ¼; the trapezoidal rule), linear
    acceleration (½, ⅙), central difference (½, 0), damped (γ > ½, β = (γ + ½)²/4).
    Reference: Newmark, J. Eng. Mech. Div. ASCE 85 (1959); seed paper eq. (13)-(14).
    """

    def __init__(self, gamma: float, beta: float, *, solver: str = "newton", tol=None,
                 max_iter=None, backward="implicit", name=None):
        gamma, beta = _real(gamma, "gamma"), _real(beta, "beta")
        self.gamma, self.beta = gamma, beta
        super().__init__(lambda h: NewmarkMap(gamma, beta, h), equation=10,
                         order=2 if gamma == 0.5 else 1, symmetric=gamma == 0.5,
                         symplectic=gamma == 0.5 and beta == 0.0, tol=tol, max_iter=max_iter,
                         backward=backward, name=name or f"newmark(gamma={gamma:g}, beta={beta:g})",
                         solver=solver)

    def is_explicit(self, system) -> bool:
        """Whether a step is explicit on ``system``: β = 0 and f independent of v (or γ = 0)."""
        return self.beta == 0.0 and (self.gamma == 0.0 or not _velocity_dependent(system))

    def adjoint(self):
        return self._options_to(Newmark(1.0 - self.gamma, 0.5 - self.gamma + self.beta))

    def key(self) -> tuple:
        """Same method (lets ``tgi.Composition`` recognise palindromic, symmetric compositions)."""
        return ("newmark", self.gamma, self.beta)

    def generic(self) -> SODEIntegrator:
        """The same method through the generic eq. (10) Newton solve on the map (a check)."""
        return SODEIntegrator(self.R, equation=10, order=self.order, symmetric=self.symmetric,
                              symplectic=self.symplectic, tol=self.tol, max_iter=self.max_iter,
                              backward=self.backward, name=f"{self.name} [generic eq. (10)]")

    def step(self, system, q, v, t, h, cache=None):
        acc = _acceleration(system)
        R = NewmarkMap(self.gamma, self.beta, h)
        a = cache.acc if isinstance(cache, SODECache) else acc(q, v, t)
        cq, cv = R.second(q, v, h * v, h * a)           # R²(x_k; h v_k, h a_k)
        qp = cq + (0.5 * h) * cv                        # = q_k + h v_k + (h²/2)(1 − 2β) a_k
        bh2, gh = self.beta * h * h, self.gamma * h
        t1 = t + h
        if self.is_explicit(system):
            a1 = acc(qp, cv, t1) if _velocity_dependent(system) else acc(qp, None, t1)
        else:
            def corrected(a_, qp, cv):   # (qp, cv): the solver's args
                return acc(qp + bh2 * a_, cv + gh * a_, t1)

            a1 = self.options.solve(corrected, a.detach(), (qp, cv))
        return qp + bh2 * a1, cv + gh * a1, SODECache(a1)


# -- the discrete second-order equation of Sect. 4.2 ----------------------------------------------
class DiscreteSODE(ImplicitIntegrator):
    r"""Eq. (11) with the tangent lift of R_d on Q, written as a discrete second-order equation
    (q_{k−1}, q_k) ↦ q_{k+1} (Sect. 4.2): the velocity v_k = DR²_d(q̄', w')·(w'/h, hF(q̄', w'/h))
    at the end of the pair (q_{k−1}, q_k) = R_d(q̄', w') must equal the velocity
    DR¹_d(q̄, w)·(w/h, hF(q̄, w/h)) at the start of (q_k, q_{k+1}) = R_d(q̄, w).  For the α-family,
    with q̄ = (1−α)q_k + αq_{k+1} and w/h = (q_{k+1} − q_k)/h:

        (q_{k+1} − 2q_k + q_{k−1})/h² = (1−α) F(q̄_{k−½}, (q_k − q_{k−1})/h) + α F(q̄_{k+½}, (q_{k+1} − q_k)/h),

    at α = ½ and F = F(q):  (q_{k+1} − 2q_k + q_{k−1})/h² = ½[F((q_{k−1}+q_k)/2) + F((q_k+q_{k+1})/2)].
    Explicit at α = 0.  Its trajectories are the positions of :class:`TangentLiftSODE` (R_d).

    Protocol: the state is the pair (q_{k−1}, q_k), so ``step(system, q_prev, q, t, h, cache) ->
    (q, q_next, cache)`` and ``rollout(system, q0, q1, method=DiscreteSODE(R))`` returns the
    sequence twice, shifted; t is the time of the first component.  :meth:`start` gives q₁ from
    (q₀, v₀); :meth:`velocity` recovers v_k.
    """

    field_only = False   # (its steps read the system itself: no variable steps)

    def __init__(self, R: DiscretizationMap, *, tol=None, max_iter=None, backward="implicit",
                 name=None):
        if not isinstance(R, DiscretizationMap):
            raise TypeError(f"DiscreteSODE takes a DiscretizationMap on Q, got {type(R).__name__}")
        self.R = R
        self.alpha = R.alpha if isinstance(R, AlphaMap) else None
        self.symmetric = R.symmetric
        self.order = 2 if R.symmetric else 1
        self.symplectic = False  # a map of Q×Q; its one-step form is TangentLiftSODE
        self.options = SolveOptions("newton", tol, max_iter, backward)
        self.name = name or f"discrete_sode({R})"
        self._a = R.base_fraction

    def key(self) -> tuple:
        return ("discrete_sode", self.R.key())

    def one_step_method(self) -> TangentLiftSODE:
        return TangentLiftSODE(self.R, solver="newton", tol=self.tol, max_iter=self.max_iter,
                               backward=self.backward)

    def start(self, system, q0, v0, t=0.0, h=0.01) -> Tensor:
        """q₁ from (q₀, v₀): one step of the equivalent one-step method."""
        return self.one_step_method().step(system, q0, v0, t, h)[0]

    def _end_velocity(self, acc, q_prev, q, t, h, pair=None):
        """v_k at the end of the pair (q_{k−1}, q_k) = R_d(q̄', w') (pair base time t + αh)."""
        qb, w = self.R.inverse(q_prev, q) if pair is None else pair
        return self.R.jvp(qb, w, w / h, h * acc(qb, w / h, t + self._a * h))[1]

    def velocity(self, system, q_prev, q, t=0.0, h=0.01) -> Tensor:
        """v_k recovered from (q_{k−1}, q_k)."""
        return self._end_velocity(_acceleration(system), q_prev, q, t, h)

    def step(self, system, q_prev, q, t, h, cache=None):
        acc = _acceleration(system)
        a, t_new = self._a, t + h + self._a * h
        if self.alpha is not None:
            old = acc((1 - a) * q_prev + a * q, (q - q_prev) / h, t + a * h)
            second = q - q_prev + (1 - a) * h * h * old  # = h v_k
            if a == 0.0:
                return q, q + second, None

            def residual(q1, q, second):   # (q, second): the solver's args
                return q1 - q - second - a * h * h * acc((1 - a) * q + a * q1, (q1 - q) / h, t_new)

            q1 = self.options.root(residual, (q + second).detach(), (q, second))
            return q, q1, None
        # The base of the old pair is the one solved for in the previous step (no R_d⁻¹ solve);
        # it keeps its graph, because v_k depends on it.
        pair = cache.pair if isinstance(cache, _PairCache) else None
        vk = self._end_velocity(acc, q_prev, q, t, h, pair)

        def residual(z, q, vk):   # (q, vk): the solver's args
            qb, w = z
            y0 = self.R.forward_unchecked(qb, w)[0]
            u0 = self.R.jvp(qb, w, w / h, h * acc(qb, w / h, t_new))[0]
            return y0 - q, u0 - vk

        w0 = (h * vk).detach()
        qb, w = self.options.root(residual, (q.detach() + a * w0, w0), (q, vk))
        return q, self.R.forward_unchecked(qb, w)[1], _PairCache((qb, w))


class _PairCache:
    """The base point (q̄, w) of the last pair (q_k, q_{k+1}) = R_d(q̄, w), with its graph."""

    __slots__ = ("pair",)

    def __init__(self, pair):
        self.pair = pair


def _build_sode_methods() -> dict[str, Integrator]:
    methods = [
        Newmark(0.5, 0.25, name="newmark_average_acceleration"),
        Newmark(0.5, 1.0 / 6.0, name="newmark_linear_acceleration"),
        Newmark(0.5, 0.0, name="newmark_central_difference"),
        Newmark(0.6, (0.6 + 0.5) ** 2 / 4.0, name="newmark_damped"),
        TangentLiftSODE(MidpointMap(), name="sode_midpoint"),
        TangentLiftSODE(ForwardEulerMap(), name="sode_explicit_euler"),
    ]
    return {m.name: m for m in methods}


#: Named second-order (state (q, v)) methods.
SODE_METHODS: dict[str, Integrator] = _build_sode_methods()
register("sode", SODE_METHODS, "a second-order system, state (q, v)")
