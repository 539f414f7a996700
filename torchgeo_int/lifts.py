r"""Tangent and cotangent lifts of a discretization map, Sect. 3 of the seed paper.

Both lifts are discretization maps again (Props 3.2, 3.3), on TQ and T*Q respectively, whose
points are ``cat([q, v], -1)`` / ``cat([q, p], -1)``; so they nest (``TangentLift(TangentLift(R))``)
and feed the same integrators.  Every formula below is the coordinate form of THEORY.md §3–4.
"""
from __future__ import annotations

import torch

from .maps import DiscretizationMap

Tensor = torch.Tensor


def _split(x: Tensor) -> tuple[Tensor, Tensor]:
    n = x.shape[-1] // 2
    return x[..., :n], x[..., n:]


class _Lift(DiscretizationMap):
    """A lift: R_d on the base coordinates q and a linear map of DR_d on the fibre coordinates
    (v or p), points cat([q, fibre], -1).  A subclass gives the fibre parts, ``_fibres`` (forward)
    and ``_fibres_inverse``; the split and the base map are done here once."""

    def __init__(self, base: DiscretizationMap):
        super().__init__()
        if not isinstance(base, DiscretizationMap):
            raise TypeError(f"a lift takes a DiscretizationMap, got {type(base).__name__}")
        self.base = base
        self.linear = base.linear

    def _forward(self, x, xdot):
        (q, a), (qd, b) = _split(x), _split(xdot)
        y0, y1 = self.base.forward_unchecked(q, qd)
        f0, f1 = self._fibres(q, qd, a, b)
        return torch.cat([y0, f0], -1), torch.cat([y1, f1], -1)

    def _inverse(self, x0, x1):
        (q0, a0), (q1, a1) = _split(x0), _split(x1)
        q, qd = self.base.inverse_unchecked(q0, q1)
        a, b = self._fibres_inverse(q, qd, a0, a1)
        return torch.cat([q, a], -1), torch.cat([qd, b], -1)

    bundle = True   # points cat([q, v|p], -1)

    @property
    def symmetric(self) -> bool:
        return self.base.symmetric

    @property
    def base_fraction(self) -> float:
        return self.base.base_fraction

    @property
    def has_closed_inverse(self) -> bool:
        return self.base.has_closed_inverse

    def key(self) -> tuple:
        return (type(self).__name__, self.base.key())

    def adjoint(self):
        # Lifting commutes with taking adjoints (checked numerically in the tests).
        return type(self)(self.base.adjoint())


class TangentLift(_Lift):
    r"""R_d^T = T R_d ∘ κ_Q : TTQ → TQ × TQ (Sect. 3.1), with κ_Q(q, v, q̇, v̇) = (q, q̇, v, v̇):

        R_d^T((q, v), (q̇, v̇)) = ((R¹(q, q̇), DR¹(q, q̇)·(v, v̇)), (R²(q, q̇), DR²(q, q̇)·(v, v̇))),

    a Jacobian-vector product of R_d at (q, q̇) in the direction (v, v̇).  Its inverse is exact:
    (q, q̇) = R_d⁻¹(q₀, q₁), then (v, v̇) solves DR_d(q, q̇)·(v, v̇) = (v₀, v₁).
    For the α-family it is the α-family on TQ (Example 3.1).
    """

    def _fibres(self, q, qd, v, vd):
        return self.base.jvp(q, qd, v, vd)               # DR_d(q, q̇)·(v, v̇)

    def _fibres_inverse(self, q, qd, v0, v1):
        return self.base.solve_jvp(q, qd, v0, v1)        # (v, v̇)


class CotangentLift(_Lift):
    r"""R_d^{T*} = Φ⁻¹ ∘ R̂_d ∘ α_Q : TT*Q → T*Q × T*Q (Sect. 3.2), a symplectomorphism from
    (TT*Q, dq∧dṗ + dq̇∧dp) to (T*Q × T*Q, pr₂*ω_Q − pr₁*ω_Q) (Props 3.3–3.5):

        R_d^{T*}((q, p), (q̇, ṗ)) = ((R¹(q, q̇), −π₀), (R²(q, q̇), π₁)),
        where (π₀, π₁)·DR_d(q, q̇) = (ṗ, p).

    Inverse, eq. (7): (q, q̇) = R_d⁻¹(q₀, q₁), (p_q, p_v) = (−p₀, p₁)·DR_d(q, q̇); the result is
    base (q, p_v), tangent (q̇, p_q).  For the α-family the weights cross (Examples 3.2–3.3):
    ((q − αq̇, p − (1−α)ṗ), (q + (1−α)q̇, p + αṗ)).
    """

    def _fibres(self, q, qd, p, pd):
        pi0, pi1 = self.base.solve_vjp(q, qd, pd, p)
        return -pi0, pi1

    def _fibres_inverse(self, q, qd, p0, p1):
        pq, pv = self.base.vjp(q, qd, -p0, p1)
        return pv, pq                                    # base (q, p_v), tangent (q̇, p_q)
