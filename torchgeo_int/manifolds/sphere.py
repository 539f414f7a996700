r"""The sphere Sⁿ = {x ∈ R^{n+1} : |x| = 1}: retractions, their discretization maps, and the
first-order integrator of eq. (1) that keeps trajectories on Sⁿ.

Retractions (Def 2.1; Absil, Mahony & Sepulchre, *Optimization algorithms on matrix manifolds*,
2008, Ex. 4.1.1), for x ∈ Sⁿ and v ∈ T_xSⁿ = {v : x·v = 0} (``project`` maps any v there):

    exp_x(v) = cos|v| x + sin|v| v/|v|,        log_x(y) = θ (y − (x·y)x)/sin θ,  θ = ∠(x, y)
    R_x(v)   = (x + v)/|x + v|,               R_x⁻¹(y) = y/(x·y) − x                 (projection)

and the discretization maps of Prop 2.2, R_d(x, v) = (R_x(−αv), R_x((1−α)v)), whose inverses
have closed forms: for exp, x is the point at fraction α of the geodesic from x₀ to x₁ (slerp)
and v = log_x x₁ − log_x x₀; for the projection retraction, with φ = ∠(x₀, x₁),

    |v| = s = 2 sin φ / (cos φ + sqrt(cos²φ + 4α(1−α) sin²φ))   (tan φ = s / (1 − α(1−α)s²))
    x = (1−α) n₀ x₀ + α n₁ x₁,   v = n₁x₁ − n₀x₀,   n₀ = sqrt(1 + α²s²), n₁ = sqrt(1 + (1−α)²s²).
"""
from __future__ import annotations

import torch

from ..integrators.base import ImplicitIntegrator, Stepper
from ..maps import DiscretizationMap, check_alpha
from ..solvers import SolveOptions

Tensor = torch.Tensor

__all__ = ["check_on_sphere", "project", "project_state", "exp", "log", "retract", "retract_inv", "SphereMap",
           "SphereODEIntegrator"]


def _dot(a, b):
    return (a * b).sum(-1, keepdim=True)


def _sinc(t):
    """sin t / t, smooth at 0."""
    return torch.sinc(t / torch.pi)


def check_on_sphere(x: Tensor, name: str = "x0", radius: float = 1.0) -> None:
    """Refuse a state off the sphere of radius ``radius``, before any step: max ||x| − r| must be
    at most √eps·r for x's dtype (RATTLE's tolerance).  The retractions renormalise every step,
    so an x0 off the sphere would be moved onto it silently, a different initial value."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 1:
        raise TypeError(f"{name} must be a floating-point tensor (..., n+1)")
    if x.numel() == 0:
        return
    with torch.no_grad():
        err = float((x.norm(dim=-1) - radius).abs().max())
    tol = torch.finfo(x.dtype).eps ** 0.5 * radius
    if not err <= tol:
        raise ValueError(f"{name} is not on the sphere |x| = {radius:g}: max ||x| − {radius:g}| = "
                         f"{err:.2e} > {tol:.1e} (√eps of {x.dtype}); normalise it, "
                         "x0 / x0.norm(dim=-1, keepdim=True)")


def project(x: Tensor, v: Tensor) -> Tensor:
    """The tangent part v − (x·v) x/|x|² of v at x."""
    return v - (_dot(x, v) / _dot(x, x)) * x


def project_state(q: Tensor, p: Tensor, radius: float = 1.0):
    """(radius q/|q|, tangent part of p): a point of T*Sⁿ from an arbitrary (q, p)."""
    q = radius * q / q.norm(dim=-1, keepdim=True)
    return q, project(q, p)


def exp(x: Tensor, v: Tensor) -> Tensor:
    """exp_x(v) = cos|v| x + sinc|v| v (v tangent at x)."""
    t = v.norm(dim=-1, keepdim=True)
    return torch.cos(t) * x + _sinc(t) * v


def log(x: Tensor, y: Tensor) -> Tensor:
    """log_x(y): the tangent v at x with exp_x(v) = y, |v| < π."""
    w = y - _dot(x, y) * x
    theta = torch.atan2(w.norm(dim=-1, keepdim=True), _dot(x, y))
    return w / _sinc(theta)


def retract(x: Tensor, v: Tensor) -> Tensor:
    """(x + v)/|x + v|: the projection retraction."""
    y = x + v
    return y / y.norm(dim=-1, keepdim=True)


def retract_inv(x: Tensor, y: Tensor) -> Tensor:
    """R_x⁻¹(y) = y/(x·y) − x (defined for x·y > 0)."""
    return y / _dot(x, y) - x


class SphereMap(DiscretizationMap):
    r"""R_d(x, v) = (R_x(−αv), R_x((1−α)v)) on Sⁿ ⊂ R^{n+1} with R = exp or the projection
    retraction (Prop 2.2), v projected onto T_xSⁿ first.  Points (..., n+1).  Closed-form
    inverse (module docstring); adjoint SphereMap(1 − α); symmetric for α = ½.
    """

    def __init__(self, alpha: float = 0.5, retraction: str = "projection"):
        super().__init__()
        if retraction not in ("exp", "projection"):
            raise ValueError(f"retraction must be 'exp' or 'projection', got {retraction!r}")
        self.alpha, self.retraction = check_alpha(alpha), retraction
        self._R = exp if retraction == "exp" else retract

    def extra_repr(self):
        return f"alpha={self.alpha}, retraction={self.retraction}"

    @property
    def symmetric(self):
        return self.alpha == 0.5

    def adjoint(self):
        return SphereMap(1.0 - self.alpha, self.retraction)

    has_closed_inverse = True

    def key(self) -> tuple:
        return ("sphere", self.alpha, self.retraction)

    def retract(self, x, v):
        """R_x(v): the retraction the map is built from (``exp`` or the projection)."""
        return self._R(x, v)

    def _forward(self, x, v):
        v = project(x, v)
        a = self.alpha
        return self._R(x, -a * v), self._R(x, (1.0 - a) * v)

    def _inverse(self, x0, x1):
        a = self.alpha
        c = _dot(x0, x1)
        sin_phi = (x1 - c * x0).norm(dim=-1, keepdim=True)
        if self.retraction == "exp":
            phi = torch.atan2(sin_phi, c)
            # slerp with the ratios sin(aφ)/sin φ = a sinc(aφ)/sinc φ (smooth at φ = 0)
            x = ((1.0 - a) * _sinc((1.0 - a) * phi) * x0 + a * _sinc(a * phi) * x1) / _sinc(phi)
            return x, log(x, x1) - log(x, x0)
        s = 2.0 * sin_phi / (c + torch.sqrt(c * c + (4.0 * a * (1.0 - a)) * sin_phi ** 2))
        n0, n1 = torch.sqrt(1.0 + (a * s) ** 2), torch.sqrt(1.0 + ((1.0 - a) * s) ** 2)
        return (1.0 - a) * n0 * x0 + a * n1 * x1, n1 * x1 - n0 * x0

    def check(self, x):
        """Def 2.2 on the tangent spaces: ``{"i": max|R_d(x, 0) − (x, x)|,
        "ii": max|(D_vR² − D_vR¹)(x, 0) − P_x|}`` with P_x the tangent projection."""
        zero = torch.zeros_like(x)
        if x.numel() == 0:                       # nothing to check (max of nothing is undefined)
            return {"i": 0.0, "ii": 0.0}
        y0, y1 = self(x, zero)
        res_i = max(float((y0 - x).abs().max()), float((y1 - x).abs().max()))
        m = x.shape[-1]
        eye = torch.eye(m, dtype=x.dtype, device=x.device)
        cols = []
        for j in range(m):
            d0, d1 = torch.func.jvp(lambda v: self._forward(x, v), (zero,), (eye[j].expand_as(x),))[1]
            cols.append(d1 - d0)
        D = torch.stack(cols, -1)
        P = eye - x.unsqueeze(-1) * x.unsqueeze(-2)
        return {"i": res_i, "ii": float((D - P).abs().max())}


class SphereODEIntegrator(ImplicitIntegrator):
    r"""Eq. (1) on Sⁿ: h X(τ(R_d⁻¹(x_k, x_{k+1}))) = R_d⁻¹(x_k, x_{k+1}) for a tangent vector field
    ẋ = X(t, x) (an :class:`~torchgeo_int.ODESystem`; X is projected onto T_xSⁿ), with a
    :class:`SphereMap`.  The unknown is w ∈ T_{x_k}Sⁿ with x_{k+1} = R_{x_k}(w), so every iterate
    and the result lie on Sⁿ (to round-off; exactly renormalised for the projection retraction).
    α = 0 is explicit, x_{k+1} = R_{x_k}(h X(x_k)); order 1, or 2 for α = ½ (symmetric).
    """

    first_order = True
    symplectic = False

    def __init__(self, R: SphereMap | None = None, *, tol=None, max_iter=None,
                 backward="implicit", name=None):
        R = SphereMap() if R is None else R
        if not isinstance(R, SphereMap):
            raise TypeError(f"SphereODEIntegrator takes a SphereMap, got {type(R).__name__}")
        self.R, self.options = R, SolveOptions("fixed_point", tol, max_iter, backward)
        self.symmetric = R.symmetric
        self.order = 2 if R.symmetric else 1
        self.name = name or f"sphere_{R.retraction}_alpha{R.alpha:g}"

    def adjoint(self):
        return SphereODEIntegrator(self.R.adjoint(), tol=self.tol, max_iter=self.max_iter,
                                   backward=self.backward)

    def key(self) -> tuple:
        return ("sphere_ode", self.R.key())

    def check_state(self, system, x, p=None):
        """Validate a rollout's initial state: x on the unit sphere (:func:`check_on_sphere`)."""
        check_on_sphere(x, "x0")

    def bind(self, system):
        """:meth:`step`, checking the first state it is given (the rollout's x0) with
        :meth:`check_state` once: one host sync per rollout, none per step."""
        checked = False

        def step(system, x, p=None, t=0.0, h=0.01, cache=None):
            nonlocal checked
            if not checked:
                self.check_state(system, x, p)
                checked = True
            return self.step(system, x, p, t, h, cache)
        return Stepper(system, step)

    def step(self, system, x, p=None, t=0.0, h=0.01, cache=None):
        if p is not None:
            raise ValueError("SphereODEIntegrator integrates first-order systems: p must be None")
        R, a = self.R, self.R.alpha

        def X(y, s):
            return project(y, system.vector_field(y, None, s))

        if a == 0.0:
            return R.retract(x, h * X(x, t)), None, None
        tb = t + a * h

        def F(w, x):   # x: the solver's args (see solvers' note on args)
            y = R.retract(x, w)
            xb, v = R.inverse_unchecked(x, y)
            return project(x, w - (v - h * X(xb, tb)))

        w0 = h * X(x, t) if cache is None else project(x, cache)
        w = self.options.solve(F, w0.detach() if cache is None else w0, (x,))
        return R.retract(x, w), None, w.detach()
