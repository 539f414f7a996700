r"""Discretization maps, Sect. 2 of Barbero-Liñán & Martín de Diego (FoCM 2022).

A discretization map is R_d = (R¹, R²) : TM → M×M with

    (i)  R_d(x, 0) = (x, x)          (ii)  D_v R²(x, 0) − D_v R¹(x, 0) = Id       (Def 2.2)

so it is a local diffeomorphism near the zero section (Prop 2.1) and R_d⁻¹(x₀, x₁) exists for
nearby points.  Points are tensors ``(..., m)``: batch dims lead, coordinates are the last dim, and
every map acts on each sample independently.

Besides ``forward``/``inverse`` a map offers the linear algebra its lifts need (Sect. 3): the
Jacobian DR_d(x, v), Jacobian-vector and vector-Jacobian products, and solves with DR_d and DR_dᵀ.
The base class implements them with ``torch.func`` and batched dense solves (no Jacobian over the
batch); ``AlphaMap`` overrides them in closed form.
"""
from __future__ import annotations

import numbers
from typing import Callable

import torch
from torch import nn

from ._autograd import grad_inputs, leaves_after, reaches_other_leaves
from ._validate import check_even_last_dim, check_finite, check_pair
from .solvers import ConvergenceError, newton

Tensor = torch.Tensor


def check_alpha(alpha) -> float:
    """α as a float in [0, 1], or a clear error (the α of every map family: outside [0, 1] the base
    point leaves the segment [x₀, x₁] and the integrators lose their stability)."""
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"alpha must be a real number, got {type(alpha).__name__}")
    alpha = float(alpha)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    return alpha


class DiscretizationMap(nn.Module):
    r"""Base class: ``forward(x, v) -> (x0, x1)``, ``inverse(x0, x1) -> (x, v)``.

    Subclasses implement ``_forward`` (and ideally ``_inverse``); ``forward``/``inverse`` validate
    input, ``forward_unchecked``/``inverse_unchecked`` are the same maps without the checks (for
    integrators and lifts, whose inputs are already checked).  What integrators need besides:
    ``base_fraction`` (where the base point sits in [x₀, x₁], so where time is sampled),
    ``has_closed_inverse`` and ``key()`` (equality by value: two maps with the same key are the
    same map).
    The default inverse is a batched Newton iteration on R_d(x, v) = (x₀, x₁) started at the
    midpoint guess ((x₀ + x₁)/2, x₁ − x₀), differentiable through the solver's implicit backward.
    """

    #: True when DR_d does not depend on the base point (x, v): lifts then use closed forms.
    linear: bool = False

    # -- the map ------------------------------------------------------------------------------
    #: True for a map on a tangent/cotangent bundle, points cat([q, v|p], -1): the last dim of
    #: its inputs must then be even (checked by ``forward``/``inverse``).
    bundle: bool = False

    def forward(self, x: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self._check_points(x, v, ("x", "v"))
        return self._forward(x, v)

    def inverse(self, x0: Tensor, x1: Tensor) -> tuple[Tensor, Tensor]:
        self._check_points(x0, x1, ("x0", "x1"))
        return self._inverse(x0, x1)

    def _check_points(self, a, b, names):
        # real, finite points of one shape (a NaN reached Newton's inverse as "too far apart";
        # complex points passed here and failed deep in autograd or the solver)
        check_pair(a, b, names)
        for x, name in zip((a, b), names):
            if x.is_complex():
                raise TypeError(f"{name} must be a real floating-point tensor, got {x.dtype}")
            check_finite(x, name)
        if self.bundle:
            check_even_last_dim(a, names[0])

    def forward_unchecked(self, x: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """``forward`` without input validation."""
        return self._forward(x, v)

    def inverse_unchecked(self, x0: Tensor, x1: Tensor) -> tuple[Tensor, Tensor]:
        """``inverse`` without input validation."""
        return self._inverse(x0, x1)

    def _forward(self, x: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _inverse(self, x0: Tensor, x1: Tensor) -> tuple[Tensor, Tensor]:
        def residual(z, x0, x1):   # (x0, x1): the solver's args (see solvers' note on args)
            y0, y1 = self._forward(*z)
            return (y0 - x0, y1 - x1)

        try:
            return newton(residual, ((x0 + x1) / 2, x1 - x0), args=(x0, x1),
                          max_iter=self.newton_max_iter)
        except ConvergenceError as err:
            # the solver's own advice is about an integrator's step; here the unknown is the
            # map's (x, v) and what fails is its inverse near the pair (x0, x1)
            raise type(err)(
                f"the inverse of {type(self).__name__} (Newton from the midpoint guess): "
                f"{err.reason}", iterations=err.iterations, residual=err.residual,
                tol=err.tol, step=err.step,
                hint=(f"R_d⁻¹ is solved near the diagonal x0 = x1; these pairs are too far "
                      f"apart for {type(self).__name__} or it is not invertible there: bring "
                      "x0, x1 closer (a smaller h inside an integrator, a shorter sampling "
                      "interval for data), raise the map's newton_max_iter (now "
                      f"{self.newton_max_iter}), or give the map a closed-form _inverse")) from None

    newton_max_iter: int = 50

    # -- structure ----------------------------------------------------------------------------
    @property
    def symmetric(self) -> bool:
        """Whether R_d* = R_d (Def 2.3); the integrators built from it are then symmetric."""
        return False

    @property
    def base_fraction(self) -> float:
        """Where in [x₀, x₁] (so in [t, t + h]) the base point of R_d sits: α for the α-family
        and retraction maps (time moves like a configuration variable), the ``alpha`` attribute
        of a map that declares one, ½ otherwise."""
        return float(getattr(self, "alpha", 0.5))

    @property
    def has_closed_inverse(self) -> bool:
        """Whether R_d⁻¹ is a closed formula (twice differentiable by autograd), not a Newton solve."""
        return False

    def key(self) -> tuple:
        """Equality by value: maps with equal keys are the same map (the default: this object)."""
        return (type(self).__name__, id(self))

    def adjoint(self) -> "DiscretizationMap":
        r"""R_d* = I_M ∘ R_d ∘ (−Id_TM): (x, v) ↦ (R²(x, −v), R¹(x, −v)) (Prop 2.5)."""
        return AdjointMap(self)

    def check(self, x: Tensor) -> dict[str, float]:
        """Residuals of Def 2.2 at the points x: ``{"i": max|R_d(x,0) − (x,x)|,
        "ii": max|D_vR²(x,0) − D_vR¹(x,0) − Id|}`` (Jacobians by autograd)."""
        if x.numel() == 0:
            return {"i": 0.0, "ii": 0.0}
        zero = torch.zeros_like(x)
        y0, y1 = self(x, zero)
        res_i = torch.maximum((y0 - x).abs().max(), (y1 - x).abs().max())
        m = x.shape[-1]
        J = self.jacobian(x, zero)
        d = J[..., m:, m:] - J[..., :m, m:] - torch.eye(m, dtype=x.dtype, device=x.device)
        return {"i": float(res_i), "ii": float(d.abs().max())}

    # -- linear algebra of DR_d (used by the lifts) --------------------------------------------
    def jvp(self, x, v, dx, dv) -> tuple[Tensor, Tensor]:
        """DR_d(x, v)·(dx, dv), by the double-vjp identity J·t = ∂/∂u (Jᵀu · t) with plain
        autograd (torch.func.jvp costs ~5× more per call on CPU through its decompositions);
        differentiable when grad mode is on and something it depends on requires grad (as
        ``systems.grad_of``).  Maps with a closed form override it."""
        if torch.is_inference_mode_enabled():
            raise RuntimeError(f"the Jacobian of {type(self).__name__} (a lift's jvp) needs autograd "
                               "and cannot run under torch.inference_mode(); use torch.no_grad()")
        keep = torch.is_grad_enabled()
        with torch.enable_grad():
            xs = grad_inputs((x, v), keep)
            out = self._forward(*xs)
            if keep and not any(a.requires_grad for a in (x, v, dx, dv)):
                keep = any(reaches_other_leaves(o, xs) for o in out)
            # u ordered after the history of x, v, dx, dv: the second grad skips that history
            us = leaves_after(out, (*out, dx, dv))
            g = torch.autograd.grad(out, xs, us, create_graph=True, allow_unused=True)
            g = tuple(torch.zeros_like(a) if gi is None else gi for a, gi in zip(xs, g))
            s = (g[0] * dx).sum() + (g[1] * dv).sum()
            if not s.requires_grad:   # the map is affine in a way autograd saw as constant
                return tuple(torch.zeros_like(o) for o in out)
            d = torch.autograd.grad(s, us, create_graph=keep, allow_unused=True)
        return tuple(torch.zeros_like(o) if di is None else di for o, di in zip(out, d))

    def vjp(self, x, v, c0, c1) -> tuple[Tensor, Tensor]:
        """(c0, c1)·DR_d(x, v), i.e. DR_dᵀ (c0, c1): a covector on T(TM) from one on M×M."""
        return torch.func.vjp(self._forward, x, v)[1]((c0, c1))

    def jacobian(self, x: Tensor, v: Tensor) -> Tensor:
        """DR_d(x, v) as ``(..., 2m, 2m)``: rows (R¹, R²), columns (x, v).

        Built from 2m vector-Jacobian products of the batched map (samples are independent, so
        one product per output coordinate serves the whole batch)."""
        m = x.shape[-1]
        _, pullback = torch.func.vjp(self._forward, x, v)
        eye = torch.eye(2 * m, dtype=x.dtype, device=x.device)
        rows = []
        for i in range(2 * m):
            e = eye[i].expand(*x.shape[:-1], 2 * m)
            gx, gv = pullback((e[..., :m], e[..., m:]))
            rows.append(torch.cat([gx, gv], -1))
        return torch.stack(rows, -2)

    def solve_jvp(self, x, v, a0, a1) -> tuple[Tensor, Tensor]:
        """(dx, dv) with DR_d(x, v)·(dx, dv) = (a0, a1)."""
        m = x.shape[-1]
        sol = torch.linalg.solve(self.jacobian(x, v), torch.cat([a0, a1], -1))
        return sol[..., :m], sol[..., m:]

    def solve_vjp(self, x, v, bx, bv) -> tuple[Tensor, Tensor]:
        """(c0, c1) with (c0, c1)·DR_d(x, v) = (bx, bv)."""
        m = x.shape[-1]
        sol = torch.linalg.solve(self.jacobian(x, v).mT, torch.cat([bx, bv], -1))
        return sol[..., :m], sol[..., m:]


class AlphaMap(DiscretizationMap):
    r"""The α-family on Rⁿ (Examples 2.1):  R_d(x, v) = (x − αv, x + (1−α)v),

        R_d⁻¹(x₀, x₁) = ((1−α)x₀ + αx₁, x₁ − x₀).

    α = 0 forward Euler, α = ½ midpoint (symmetric), α = 1 backward Euler; R_d* is AlphaMap(1 − α).
    α must lie in [0, 1]: outside it the maps still satisfy Def 2.2 but the base point leaves the
    segment [x₀, x₁] and the integrators lose their stability, so we refuse them.
    """

    linear = True

    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = check_alpha(alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"

    @property
    def symmetric(self) -> bool:
        return self.alpha == 0.5

    has_closed_inverse = True

    def __init_subclass__(cls, **kwargs):
        # every closed form here (inverse, DR_d, its solves, the adjoint, the integrators' α
        # steps) is this formula's: a subclass with another map would get all of them wrong
        super().__init_subclass__(**kwargs)
        if cls._forward is not AlphaMap._forward:
            raise TypeError(f"{cls.__name__} overrides AlphaMap._forward: AlphaMap's closed forms "
                            "(inverse, Jacobian, adjoint, the α steps) are those of "
                            "(x − αv, x + (1−α)v); subclass DiscretizationMap for another map")

    def key(self) -> tuple:
        return ("alpha", self.alpha)   # the named members are the same maps

    def adjoint(self) -> "AlphaMap":
        return AlphaMap(1.0 - self.alpha)

    def _forward(self, x, v):
        a = self.alpha
        return x - a * v, x + (1.0 - a) * v

    def _inverse(self, x0, x1):
        a = self.alpha
        return (1.0 - a) * x0 + a * x1, x1 - x0

    # DR_d = [[I, −αI], [I, (1−α)I]] whatever the base point.
    def jvp(self, x, v, dx, dv):
        return self._forward(dx, dv)

    def solve_jvp(self, x, v, a0, a1):
        return self._inverse(a0, a1)

    def vjp(self, x, v, c0, c1):
        a = self.alpha
        return c0 + c1, (1.0 - a) * c1 - a * c0

    def solve_vjp(self, x, v, bx, bv):
        # c0 + c1 = bx,  −α c0 + (1−α) c1 = bv
        a = self.alpha
        return (1.0 - a) * bx - bv, bv + a * bx

    def jacobian(self, x, v):
        m = x.shape[-1]
        eye = torch.eye(m, dtype=x.dtype, device=x.device)
        a = self.alpha
        J = torch.cat([torch.cat([eye, -a * eye], 1), torch.cat([eye, (1 - a) * eye], 1)], 0)
        return J.expand(*x.shape[:-1], 2 * m, 2 * m)


class ForwardEulerMap(AlphaMap):
    """R_d(x, v) = (x, x + v): AlphaMap(0)."""

    def __init__(self):
        super().__init__(0.0)


class MidpointMap(AlphaMap):
    """R_d(x, v) = (x − v/2, x + v/2): AlphaMap(½), symmetric."""

    def __init__(self):
        super().__init__(0.5)


class BackwardEulerMap(AlphaMap):
    """R_d(x, v) = (x − v, x): AlphaMap(1)."""

    def __init__(self):
        super().__init__(1.0)


class RetractionMap(DiscretizationMap):
    r"""Discretization map from a retraction (Prop 2.2):

        R_d(x, v) = (R_x(−αv), R_x((1−α)v)),    α ∈ [0, 1],

    for any ``retraction(x, v) -> point`` with R_x(0) = x and D_vR_x(0) = Id (Def 2.1), written
    with torch ops so that torch.func can differentiate it.  Its adjoint is RetractionMap(1 − α).
    ``inverse`` is a batched, differentiable Newton solve unless a closed form
    ``inverse(x0, x1) -> (x, v)`` is given.  A closed form is checked on its first call (and the
    first after ``alpha`` or the retraction changes): on pairs (y₀, y₁) = R_d(x, v) of the map's
    image, R_d(inverse(y₀, y₁)) must give back (y₀, y₁) to √ε·(1 + max|y₀|, |y₁|), or a
    ValueError names the residual — a closed form
    written for another α, or for another retraction, fails there instead of stepping wrongly.
    The adjoint keeps a closed form: R_d*⁻¹(x₀, x₁) = (x, −w) with (x, w) = R_d⁻¹(x₁, x₀).
    """

    def __init__(self, retraction: Callable[[Tensor, Tensor], Tensor], alpha: float = 0.5,
                 inverse: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None):
        super().__init__()
        if not callable(retraction):
            raise TypeError("retraction must be callable as retraction(x, v) -> point")
        self.retraction = retraction
        self.alpha = check_alpha(alpha)
        self._closed_inverse = inverse
        self._inverse_checked = None   # (id(retraction), α) the closed form was last checked for

    def extra_repr(self) -> str:
        return f"retraction={getattr(self.retraction, '__name__', self.retraction)}, alpha={self.alpha}"

    @property
    def symmetric(self) -> bool:
        # R_d*(x, v) = (R_x(−(1−α)v), R_x(αv)) equals R_d exactly at α = ½, whatever the
        # retraction — for this map, not a subclass with its own _forward
        return self.alpha == 0.5 and self._plain()

    def _plain(self) -> bool:
        """Whether this is the map (R_x(−αv), R_x((1−α)v)) (a subclass may override _forward)."""
        return type(self)._forward is RetractionMap._forward

    @property
    def has_closed_inverse(self) -> bool:
        return self._closed_inverse is not None

    def key(self) -> tuple:
        # The same retraction (by identity: functions do not compare by value) and the same α are
        # the same map; a closed-form inverse is the inverse of that same map.
        if self._plain():
            return ("retraction", id(self.retraction), self.alpha)
        return super().key()

    def adjoint(self) -> DiscretizationMap:
        # R_d* is RetractionMap(1 − α) (Prop 2.5); a closed-form inverse of R_d gives R_d*'s
        # (Prop 2.5 again), so the adjoint keeps a closed form rather than falling back to Newton.
        if not self._plain():   # another map: Prop 2.5 generically
            return AdjointMap(self)
        inverse = None
        if self._closed_inverse is not None:
            def inverse(x0, x1, base=self._closed_inverse):
                x, w = base(x1, x0)
                return x, -w
        adj = RetractionMap(self.retraction, 1.0 - self.alpha, inverse=inverse)
        adj.newton_max_iter = self.newton_max_iter   # a raised limit holds for the adjoint too
        return adj

    def _forward(self, x, v):
        a = self.alpha
        return self._retract(x, -a * v), self._retract(x, (1.0 - a) * v)

    def _retract(self, x, v):
        y = self.retraction(x, v)
        # (a point of another shape broadcast, or reached Newton's inverse as "too far apart")
        if not isinstance(y, Tensor) or y.shape != x.shape:
            got = tuple(y.shape) if isinstance(y, Tensor) else type(y).__name__
            raise ValueError(f"the retraction {getattr(self.retraction, '__name__', self.retraction)} "
                             f"returned {got} for points x of shape {tuple(x.shape)}: R_x(v) is a "
                             "point, of x's shape")
        return y

    def _inverse(self, x0, x1):
        if self._closed_inverse is None:
            return super()._inverse(x0, x1)
        x, v = self._closed_inverse(x0, x1)
        if self._inverse_checked != (id(self.retraction), self.alpha) \
                and not torch.compiler.is_compiling():
            self._check_closed_inverse(x0, x1, x, v)
        return x, v

    def _check_closed_inverse(self, x0, x1, x, v):
        """R_d(inverse(y₀, y₁)) = (y₀, y₁) on the image pairs (y₀, y₁) = R_d(inverse(x₀, x₁)) of
        the first pairs the closed form sees (one host sync per map, not per step)."""
        for name, a in (("x", x), ("v", v)):
            if not isinstance(a, Tensor) or a.shape != x0.shape:
                raise ValueError(f"the closed-form inverse of {self!r} must return (x, v) of the "
                                 f"shape of x0, {tuple(x0.shape)}; its {name} is "
                                 f"{tuple(a.shape) if isinstance(a, Tensor) else type(a).__name__}")
        if x0.numel() == 0 or not bool(torch.isfinite(x0).all() & torch.isfinite(x1).all()):
            return   # nothing to check on (non-finite pairs are refused where they come from)
        with torch.no_grad():
            # on pairs of the map's image: (x0, x1) themselves need not lie on the manifold (an
            # implicit step's iterate off the sphere), R_d(x, v) does
            y0, y1 = self._forward(x, v)
            z0, z1 = self._forward(*self._closed_inverse(y0, y1))
            res = torch.maximum((z0 - y0).abs().max(), (z1 - y1).abs().max())
            scale = 1.0 + float(torch.maximum(y0.abs().max(), y1.abs().max()))
            tol = torch.finfo(x0.dtype).eps ** 0.5 * scale
            if not float(res) <= tol:
                raise ValueError(
                    f"the closed-form inverse given to RetractionMap (alpha={self.alpha}) is not "
                    f"the inverse of its map: R_d(inverse(y0, y1)) misses (y0, y1) = R_d(x, v) "
                    f"by {float(res):.3g} (tolerance {tol:.3g}); it must solve "
                    "(R_x(−αv), R_x((1−α)v)) = (y0, y1) for this α and this retraction")
        self._inverse_checked = (id(self.retraction), self.alpha)


class AdjointMap(DiscretizationMap):
    r"""R_d*(x, v) = (R²(x, −v), R¹(x, −v)) of any map (Prop 2.5); its inverse is
    (x₀, x₁) ↦ (x, −w) with (x, w) = R_d⁻¹(x₁, x₀)."""

    def __init__(self, base: DiscretizationMap):
        super().__init__()
        self.base = base
        self.linear, self.bundle = base.linear, base.bundle

    @property
    def symmetric(self) -> bool:
        return self.base.symmetric

    @property
    def base_fraction(self) -> float:
        return 1.0 - self.base.base_fraction

    @property
    def has_closed_inverse(self) -> bool:
        return self.base.has_closed_inverse

    def key(self) -> tuple:
        return ("adjoint", self.base.key())

    def adjoint(self) -> DiscretizationMap:
        return self.base

    def _forward(self, x, v):
        y0, y1 = self.base.forward_unchecked(x, -v)
        return y1, y0

    def _inverse(self, x0, x1):
        x, w = self.base.inverse_unchecked(x1, x0)
        return x, -w
