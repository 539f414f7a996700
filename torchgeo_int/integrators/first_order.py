r"""Integrators for first-order ODEs ẋ = X(t, x) from a discretization map, eq. (1) of the seed paper.

Given a discretization map R_d = (R¹, R²) on the state space M, x_{k+1} is defined by

    h X(τ(R_d⁻¹(x_k, x_{k+1}))) = R_d⁻¹(x_k, x_{k+1})                                  (1)

(τ: the base point; equality of tangent vectors at it).  Writing (x, v) = R_d⁻¹(x_k, x_{k+1}),
(1) says v = h X(x), i.e.

    R_d(x, h X(x)) = (x_k, x_{k+1})      for some base point x ∈ M,                      (1')

which is how this module solves it: one equation R¹(x, h X(x)) = x_k for the base point, then
x_{k+1} = R²(x, h X(x)).  Time moves with the base point: X is evaluated at t_k + αh (α of the
map; ½ for maps without one).

* **α-family** (``AlphaMap``, Examples 2.1): (1) is the θ-method

      (x_{k+1} − x_k)/h = X(t_k + αh, (1−α) x_k + α x_{k+1}),

  solved for the stage k = X(t_k + αh, x_k + αh k), x_{k+1} = x_k + h k (fixed point, or Newton
  with ``solver="newton"``; the last k warm-starts the next step).  α = 0 explicit Euler,
  α = 1 implicit Euler, α = ½ the implicit midpoint rule.
* **Any other map** (``RetractionMap``, lifts, user maps): a solve of (1') for the base
  point with the residual

      r(x) = R¹(x, h X(x)) − x_k + (x − R¹(x, 0)),

  by the fixed point x ← x − r(x) (r has Jacobian I + O(h), so it contracts for small h; on the
  α-family it is the usual x = x_k + αhX(x)) or, with ``solver="newton"``, by Newton.
  The last term vanishes on M (R_d(x, 0) = (x, x), Def 2.2), and identically for maps on Rⁿ, so
  the roots on M are those of (1').  It is there for maps on an embedded manifold extended to
  the ambient space, like the normalisation retraction R_x(v) = (x + v)/|x + v| of the sphere:
  R¹(·, v) is then constant along the normal direction, the ambient Jacobian of
  R¹(x, hX(x)) − x_k is singular and the ambient equation is ill-posed.  With the extra term the
  Jacobian is I + O(h) (the normal directions, lost by R¹, come back through x − x/|x|), and
  for small h every root lies on M (R¹(x, hX) − x_k is a chord of the sphere, x − x/|x| is
  normal at x/|x|: they cancel only if both vanish).  The new point x_{k+1} = R²(x, hX(x)) is
  a value of the retraction, so it lies on M to round-off whatever the solver tolerance.  X must
  be defined near M (the iterates leave it by O(tol)).
  ``form="inverse"`` solves instead for x_{k+1} the residual of (1) itself, v − hX(x) with
  (x, v) = ``R.inverse(x_k, x_{k+1})`` (same two solvers): well-posed on Rⁿ, and on a manifold
  when ``R.inverse`` is a closed form that extends off M (sphere, α = ½: x = (x₀+x₁)/|x₀+x₁|,
  v = 2(x₁−x₀)/|x₀+x₁|; a root then has |x_{k+1}| = |x_k| because v ⊥ x); |x_{k+1}| is then
  kept to the solver tolerance only.

Properties: order 1, or 2 when R_d is symmetric (Def 2.3; θ = ½, retraction maps with α = ½);
the method built from R_d* is the adjoint method.  Not symplectic in general (these integrate
arbitrary vector fields).  All of them preserve linear invariants; the implicit midpoint rule
(α = ½) is the one-stage Gauss method and preserves every quadratic invariant xᵀCx of a field
with xᵀC X(x) = 0 (Hairer–Lubich–Wanner, *Geometric Numerical Integration*, Sect. IV.2), e.g.
|x| for ẋ = Ax with A skew, or both Casimir and energy of the free rigid body.

Reference: M. Barbero-Liñán, D. Martín de Diego, "Retraction maps: a seed of geometric
integrators", Found. Comput. Math. (2022), eq. (1) and Sect. 2.
"""
from __future__ import annotations

import torch

from ..maps import AlphaMap, DiscretizationMap, RetractionMap
from ..solvers import SolveOptions
from .base import ImplicitIntegrator
from .registry import register

Tensor = torch.Tensor

_FORMS = ("base", "inverse")


def _field(system, t, x: Tensor) -> Tensor:
    """X(t, x) of a first-order system, checked against the state's shape and dtype."""
    dx = system.vector_field(x, None, t)
    if not isinstance(dx, torch.Tensor):
        raise TypeError(f"the vector field must return a tensor like x, got {type(dx).__name__}")
    if dx.shape != x.shape or dx.dtype != x.dtype:
        raise ValueError(f"the vector field must return a tensor of the state's shape and dtype "
                         f"{tuple(x.shape)}, {x.dtype}; got {tuple(dx.shape)}, {dx.dtype}")
    return dx


def _first_component(R: DiscretizationMap):
    """(x, v) ↦ R¹(x, v), without evaluating R² where the map's structure allows."""
    if isinstance(R, RetractionMap) and type(R)._forward is RetractionMap._forward:
        return lambda x, v: R.retraction(x, (-R.alpha) * v)
    return lambda x, v: R.forward_unchecked(x, v)[0]


class FirstOrderIntegrator(ImplicitIntegrator):
    r"""Eq. (1) for any DiscretizationMap ``R`` on the state space (see the module docstring).

    Args:
        R: the discretization map; ``AlphaMap(α)`` gives the θ-method with θ = α.
        solver: ``"fixed_point"`` (default) or ``"newton"`` (for stiff problems: the fixed
            point needs h·Lip(X)·α < 1 on the α-family, h small on other maps).
        tol, max_iter: passed to the solver (``None``: its defaults).
        backward: the solver's gradient mode, ``"implicit"`` (implicit-function-theorem
            gradients, memory independent of the iterations) or ``"unroll"``.
        form: for maps outside the α-family, ``"base"`` (solve eq. (1') for the base point;
            works on embedded manifolds) or ``"inverse"`` (solve eq. (1) for x_{k+1} through
            ``R.inverse``).
        name: a name for reprs and error messages.

    Protocol: ``first_order = True``; ``step(system, x, None, t, h, cache) -> (x, None, cache)``
    with a first-order ``system`` (``tgi.ODESystem``); ``cache`` is the warm start of the next
    implicit solve.  Use it through ``tgi.rollout(tgi.ODESystem(f), x0, h=..., steps=...,
    method=FirstOrderIntegrator(R))``.  Batch dims lead, coordinates are the last dim; samples
    must be independent (the solvers converge per sample).
    """

    first_order = True
    symplectic = False

    def __init__(self, R: DiscretizationMap, *, solver: str = "fixed_point", tol: float | None = None,
                 max_iter: int | None = None, backward: str = "implicit", form: str = "base",
                 name: str | None = None):
        if not isinstance(R, DiscretizationMap):
            raise TypeError(f"FirstOrderIntegrator takes a DiscretizationMap, got {type(R).__name__}")
        if form not in _FORMS:
            raise ValueError(f"form must be one of {_FORMS}, got {form!r}")
        self.R = self.state_map = R
        self.options = SolveOptions(solver, tol, max_iter, backward)
        self.form = form
        self.alpha = R.alpha if isinstance(R, AlphaMap) else None
        self.symmetric = R.symmetric
        self.order = 2 if R.symmetric else 1
        if name is None:
            name = f"theta({self.alpha:g})" if self.alpha is not None else f"first_order({R})"
        self.name = name

    def adjoint(self) -> "FirstOrderIntegrator":
        """The method of R_d* (Prop 2.5): Φ*_h = Φ_{−h}⁻¹; θ ↦ 1 − θ on the α-family."""
        return self._options_to(FirstOrderIntegrator(self.R.adjoint(), form=self.form))

    def key(self) -> tuple:
        # the α-family runs one stage form whatever ``form``; other maps run the chosen form
        return ("first_order", self.R.key(), None if self.alpha is not None else self.form)

    def step(self, system, x, p, t, h, cache=None):
        if p is not None:
            raise ValueError(f"{self.name} integrates first-order systems: call "
                             "step(system, x, None, t, h, cache)")
        if not getattr(system, "first_order", False):
            raise TypeError(f"{self.name} steps first-order systems x' = f(t, x) (tgi.ODESystem), "
                            f"got {type(system).__name__}")
        if self.alpha is not None:
            return self._alpha_step(system, x, t, h, cache)
        if self.form == "inverse":
            return self._inverse_step(system, x, t, h, cache)
        return self._base_step(system, x, t, h, cache)

    def _alpha_step(self, system, x, t, h, cache):
        a = self.alpha
        if a == 0.0:
            return x + h * _field(system, t, x), None, None
        tb = t + a * h

        # x goes in as the solver's args, not captured: its ∂/∂k calls then skip x's history;
        # so does tb, so that a compiled solve (compile=True fuses the iterations) sees the same
        # function every step (a captured float would be a constant of each step's graph)
        def stage(k, x, tb):
            return _field(system, tb, x + (a * h) * k)

        k0 = self._guess(system, x, t, cache)
        k = self.options.solve(stage, k0, (x, tb))
        # The stage derivative is the warm start of the next solve (no graph needed for a guess).
        return x + h * k, None, k.detach()

    def _guess(self, system, x, t, cache):
        if cache is not None:
            return cache
        with torch.no_grad():   # a guess: no graph
            return _field(system, t, x)

    def _solve(self, residual, z0, x):
        # The residuals below have Jacobian I + O(h), so z <- z - r(z) is a contraction for
        # small h (the α-family's own iteration, in other coordinates); Newton for stiff fields.
        # x (the state) is the solver's args: see solvers' note on args.
        return self.options.root(residual, z0, (x,))

    def _base_step(self, system, x, t, h, cache):
        a = self.R.base_fraction
        tb = t + a * h
        fwd, first = self.R.forward_unchecked, _first_component(self.R)

        def residual(z, x):
            lhs = first(z, h * _field(system, tb, z))
            return lhs - x + (z - first(z, torch.zeros_like(z)))

        z = self._solve(residual, (x + (a * h) * self._guess(system, x, t, cache)).detach(), x)
        k = _field(system, tb, z)
        return fwd(z, h * k)[1], None, k.detach()

    def _inverse_step(self, system, x, t, h, cache):
        tb = t + self.R.base_fraction * h

        def residual(x1, x):
            xb, v = self.R.inverse_unchecked(x, x1)
            return v - h * _field(system, tb, xb)

        x1 = self._solve(residual, (x + h * self._guess(system, x, t, cache)).detach(), x)
        return x1, None, ((x1 - x) / h).detach()


def theta(alpha: float, **options) -> FirstOrderIntegrator:
    r"""The θ-method (x_{k+1} − x_k)/h = X(t_k + θh, (1−θ)x_k + θx_{k+1}), θ ∈ [0, 1]:
    ``FirstOrderIntegrator(AlphaMap(theta), **options)``; order 2 for θ = ½, else 1."""
    return FirstOrderIntegrator(AlphaMap(alpha), **options)


def _build() -> dict[str, FirstOrderIntegrator]:
    return {m.name: m for m in (theta(0.0, name="explicit_euler"), theta(1.0, name="implicit_euler"),
                                theta(0.5, name="implicit_midpoint"))}


#: Named eq. (1) methods: explicit_euler (θ = 0), implicit_euler (θ = 1), implicit_midpoint (θ = ½).
FIRST_ORDER_METHODS: dict[str, FirstOrderIntegrator] = _build()
register("first_order", FIRST_ORDER_METHODS, "a first-order system x' = X(x, t), state x (p0=None)")


__all__ = ["FirstOrderIntegrator", "FIRST_ORDER_METHODS", "theta"]
