r"""SO(3) in coordinates: hat/vee, exp (Rodrigues), Cayley, and their trivialised differentials.

Conventions (Iserles, Munthe-Kaas, Nørsett & Zanna, *Lie-group methods*, Acta Numer. 2000;
Bou-Rabee & Marsden, FoCM 9, 2009).  so(3) ≅ R³ by ``hat``: ξ̂ v = ξ × v; so(3)* ≅ R³ by the dot
product.  For a coordinate map τ : so(3) → SO(3) (τ(0) = I, Dτ(0) = Id, τ(−ξ) = τ(ξ)⁻¹):

* right-trivialised differential  Dτ(ξ)·δ = (dτᴿ_ξ δ)^ τ(ξ),
* left-trivialised differential   Dτ(ξ)·δ = τ(ξ) (dτᴸ_ξ δ)^,   dτᴸ_ξ = dτᴿ_{−ξ} = τ(ξ)ᵀ dτᴿ_ξ.

exp:     exp(ξ) = I + a ξ̂ + b ξ̂²,           a = sin θ/θ, b = (1 − cos θ)/θ², θ = |ξ|
         dexpᴿ_ξ = I + b ξ̂ + c ξ̂²,          c = (θ − sin θ)/θ³
         (dexpᴿ_ξ)⁻¹ = I − ½ξ̂ + d ξ̂²,       d = (1 − (θ/2)cot(θ/2))/θ²
Cayley:  cay(ξ) = (I − ξ̂/2)⁻¹(I + ξ̂/2) = I + s(ξ̂ + ½ξ̂²),   s = 4/(4 + θ²)
         dcayᴿ_ξ = s(I + ½ξ̂),   (dcayᴿ_ξ)⁻¹ = I − ½ξ̂ + ¼ξξᵀ,   cay⁻¹(R) = 2 vee(R − Rᵀ)/(1 + tr R)

Adjoint actions on R³: Ad_g ξ = gξ, Ad*_g μ = gᵀμ (so Ad*_{g⁻¹}μ = gμ), ad_ξ η = ξ × η,
ad*_ξ μ = μ × ξ.  Everything is batched over leading dims and differentiable (the small-angle
branches use Taylor series, selected with ``torch.where`` on a guarded argument so that neither
the value nor its gradient is ever NaN).  Functions ``*_minus_identity`` return τ(ξ) − I, computed
without cancellation, so that g τ(ξ) = g + g(τ(ξ) − I) does not round the small rotation away.
"""
from __future__ import annotations

import math

import torch

Tensor = torch.Tensor

__all__ = ["hat", "vee", "skew_vee", "exp", "exp_minus_identity", "log", "cay",
           "cay_minus_identity", "cay_inv", "rotate_exp", "rotate_cay", "dexp_right",
           "dexp_right_inv", "dcay_right", "dcay_right_inv", "orthogonality_error", "check_rotation",
           "random_rotation"]

# Below this θ² the coefficient functions use their Taylor series: the direct formulas lose
# ~ε/θ² relative accuracy to cancellation, the series (to the orders kept) are exact to < ε there.
_SMALL = 0.1


def _check_vec(x: Tensor, name: str = "xi") -> Tensor:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (..., 3)")
    if x.dim() < 1 or x.shape[-1] != 3:
        raise ValueError(f"{name} must have shape (..., 3), got {tuple(x.shape)}")
    return x


def _check_mat(g: Tensor, name: str = "g") -> Tensor:
    if not isinstance(g, torch.Tensor) or not g.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (..., 3, 3)")
    if g.dim() < 2 or g.shape[-2:] != (3, 3):
        raise ValueError(f"{name} must have shape (..., 3, 3), got {tuple(g.shape)}")
    return g


_HAT = {}


def _hat_basis(dtype, device):
    """The (3, 9) matrix L with vec(v̂) = v L (one matmul instead of nine stacked entries)."""
    key = (dtype, device)
    if key not in _HAT:
        L = torch.zeros(3, 3, 3, dtype=dtype, device=device)
        for i, j, k in [(0, 2, 1), (1, 0, 2), (2, 1, 0)]:   # v̂_{jk} = v_i, v̂_{kj} = −v_i
            L[i, j, k], L[i, k, j] = 1.0, -1.0
        _HAT[key] = L.reshape(3, 9)
    return _HAT[key]


def hat(v: Tensor) -> Tensor:
    """v ↦ v̂ with v̂ w = v × w: (..., 3) → (..., 3, 3)."""
    _check_vec(v, "v")
    return (v @ _hat_basis(v.dtype, v.device)).reshape(*v.shape[:-1], 3, 3)


def vee(S: Tensor) -> Tensor:
    """Inverse of hat on skew matrices: (S₃₂, S₁₃, S₂₁)."""
    _check_mat(S, "S")
    return torch.stack([S[..., 2, 1], S[..., 0, 2], S[..., 1, 0]], -1)


def skew_vee(A: Tensor) -> Tensor:
    """vee(A − Aᵀ): the covector η ↦ Σᵢⱼ Aᵢⱼ η̂ᵢⱼ of an arbitrary 3×3 matrix A."""
    return torch.stack([A[..., 2, 1] - A[..., 1, 2], A[..., 0, 2] - A[..., 2, 0],
                        A[..., 1, 0] - A[..., 0, 1]], -1)


def _series(t2: Tensor, coeffs, direct) -> Tensor:
    """Σ cₖ (θ²)ᵏ below _SMALL, ``direct(θ²)`` above, NaN-free in value and gradient."""
    small = t2 < _SMALL
    safe = torch.where(small, torch.full_like(t2, 1.0), t2)
    ser = torch.zeros_like(t2)
    for c in reversed(coeffs):
        ser = ser * t2 + c
    return torch.where(small, ser, direct(safe))


def _fact(n):
    return float(math.factorial(n))


# a = sin θ/θ, b = (1 − cos θ)/θ², c = (θ − sin θ)/θ³ as series in θ²
_A = [(-1) ** k / _fact(2 * k + 1) for k in range(8)]
_B = [(-1) ** k / _fact(2 * k + 2) for k in range(8)]
_C = [(-1) ** k / _fact(2 * k + 3) for k in range(8)]
# d = (1 − (θ/2)cot(θ/2))/θ² = Σ_{k≥1} |B₂ₖ| θ^{2k−2}/(2k)!  (Bernoulli numbers B₂ … B₁₄)
_BERNOULLI = [1 / 6, 1 / 30, 1 / 42, 1 / 30, 5 / 66, 691 / 2730, 7 / 6]
_D = [b / _fact(2 * k + 2) for k, b in enumerate(_BERNOULLI)]


def _d_direct(t2):
    t = t2.sqrt()
    return (1.0 - 0.5 * t * torch.cos(0.5 * t) / torch.sin(0.5 * t)) / t2


def _a(t2):
    return _series(t2, _A, lambda u: torch.sin(u.sqrt()) / u.sqrt())


def _b(t2):
    # (1 − cos θ)/θ² = ½ (sin(θ/2)/(θ/2))²: no cancellation in the direct branch either
    return _series(t2, _B, lambda u: 0.5 * (torch.sin(0.5 * u.sqrt()) / (0.5 * u.sqrt())) ** 2)


def _c(t2):
    return _series(t2, _C, lambda u: (u.sqrt() - torch.sin(u.sqrt())) / (u * u.sqrt()))


def _dcoef(t2):
    return _series(t2, _D, _d_direct)


def _sq(x: Tensor) -> Tensor:
    return (x * x).sum(-1, keepdim=True)


def _poly(x: Tensor, c1: Tensor, c2: Tensor) -> Tensor:
    """c1 x̂ + c2 x̂² (c1, c2 of shape (..., 1))."""
    X = hat(x)
    return c1.unsqueeze(-1) * X + c2.unsqueeze(-1) * (X @ X)


def _eye(x: Tensor) -> Tensor:
    return torch.eye(3, dtype=x.dtype, device=x.device)


# -- exp ----------------------------------------------------------------------------------------
def exp_minus_identity(xi: Tensor) -> Tensor:
    """exp(ξ̂) − I = a ξ̂ + b ξ̂² (Rodrigues)."""
    _check_vec(xi)
    t2 = _sq(xi)
    return _poly(xi, _a(t2), _b(t2))


def exp(xi: Tensor) -> Tensor:
    """exp(ξ̂) ∈ SO(3) (Rodrigues' formula)."""
    return exp_minus_identity(xi) + _eye(xi)


def log(g: Tensor) -> Tensor:
    """ξ with exp(ξ̂) = g, |ξ| ≤ π (principal branch): θ = atan2(|w|/2, (tr g − 1)/2) with
    w = vee(g − gᵀ) = 2 sin θ n.  For cos θ ≥ −½, ξ = w / (2a(θ)), a = sin θ/θ (accurate near 0,
    smooth gradients).  Past it (θ > 2π/3) w → 0 as θ → π and that quotient loses ε/(π − θ) of
    accuracy, so the axis n comes from the symmetric part instead, (g + gᵀ)/2 − cos θ I =
    (1 − cos θ) n nᵀ (its column of largest diagonal, normalised; sign that of w): round-off
    accuracy up to θ = π, where ±n are the same rotation."""
    _check_mat(g)
    w = skew_vee(g)  # = 2 a(θ) ξ
    sin_t = 0.5 * w.norm(dim=-1, keepdim=True)
    cos_t = 0.5 * (g[..., 0, 0] + g[..., 1, 1] + g[..., 2, 2] - 1.0).unsqueeze(-1)
    theta = torch.atan2(sin_t, cos_t)
    far = cos_t < -0.5
    # each branch on safe inputs where it is not taken (no inf/NaN in the unused one's gradient)
    th = torch.where(far, torch.zeros_like(theta), theta)
    near_xi = 0.5 * w / _a(th * th)
    S = 0.5 * (g + g.mT) - cos_t.unsqueeze(-1) * _eye(g)
    j = S.diagonal(dim1=-2, dim2=-1).argmax(-1, keepdim=True)              # (..., 1)
    col = torch.gather(S, -1, j.unsqueeze(-2).expand(*S.shape[:-1], 1)).squeeze(-1)
    col = torch.where(far, col, torch.ones_like(col))
    n = col / col.norm(dim=-1, keepdim=True)
    n = torch.where((n * w).sum(-1, keepdim=True) < 0, -n, n)
    return torch.where(far, theta * n, near_xi)


def rotate_exp(xi: Tensor, v: Tensor) -> Tensor:
    """exp(ξ̂) v without forming the matrix."""
    t2 = _sq(xi)
    c1 = torch.linalg.cross(xi, v, dim=-1)
    return v + _a(t2) * c1 + _b(t2) * torch.linalg.cross(xi, c1, dim=-1)


def dexp_right(xi: Tensor) -> Tensor:
    """dexpᴿ_ξ = I + b ξ̂ + c ξ̂² (the 'left Jacobian' of SO(3)); dexpᴸ_ξ = dexp_right(−ξ)."""
    _check_vec(xi)
    t2 = _sq(xi)
    return _eye(xi) + _poly(xi, _b(t2), _c(t2))


def dexp_right_inv(xi: Tensor) -> Tensor:
    """(dexpᴿ_ξ)⁻¹ = I − ½ξ̂ + d ξ̂² (singular at |ξ| = 2π)."""
    _check_vec(xi)
    t2 = _sq(xi)
    return _eye(xi) + _poly(xi, torch.full_like(t2, -0.5), _dcoef(t2))


def dexp_right_T_apply(xi: Tensor, mu: Tensor) -> Tensor:
    """(dexpᴿ_ξ)ᵀ μ = μ − b ξ×μ + c ξ×(ξ×μ) without forming the matrix."""
    t2 = _sq(xi)
    c1 = torch.linalg.cross(xi, mu, dim=-1)
    return mu - _b(t2) * c1 + _c(t2) * torch.linalg.cross(xi, c1, dim=-1)


# -- Cayley ---------------------------------------------------------------------------------------
def _s(xi: Tensor) -> Tensor:
    return 4.0 / (4.0 + _sq(xi))


def cay_minus_identity(xi: Tensor) -> Tensor:
    """cay(ξ) − I = s(ξ̂ + ½ξ̂²), s = 4/(4 + |ξ|²)."""
    _check_vec(xi)
    s = _s(xi)
    return _poly(xi, s, 0.5 * s)


def cay(xi: Tensor) -> Tensor:
    """cay(ξ) = (I − ξ̂/2)⁻¹(I + ξ̂/2) ∈ SO(3), a rotation by 2 atan(|ξ|/2) about ξ."""
    return cay_minus_identity(xi) + _eye(xi)


def cay_inv(g: Tensor) -> Tensor:
    """cay⁻¹(g) = 2 vee(g − gᵀ)/(1 + tr g) (rotations by less than π)."""
    _check_mat(g)
    tr = g[..., 0, 0] + g[..., 1, 1] + g[..., 2, 2]
    return skew_vee(g) * (2.0 / (1.0 + tr)).unsqueeze(-1)


def rotate_cay(xi: Tensor, v: Tensor) -> Tensor:
    """cay(ξ) v without forming the matrix."""
    c1 = torch.linalg.cross(xi, v, dim=-1)
    return v + _s(xi) * (c1 + 0.5 * torch.linalg.cross(xi, c1, dim=-1))


def dcay_right(xi: Tensor) -> Tensor:
    """dcayᴿ_ξ = s(I + ½ξ̂); dcayᴸ_ξ = dcay_right(−ξ)."""
    _check_vec(xi)
    s = _s(xi)
    return s.unsqueeze(-1) * (_eye(xi) + 0.5 * hat(xi))


def dcay_right_inv(xi: Tensor) -> Tensor:
    """(dcayᴿ_ξ)⁻¹ = I − ½ξ̂ + ¼ξξᵀ."""
    _check_vec(xi)
    return _eye(xi) - 0.5 * hat(xi) + 0.25 * xi.unsqueeze(-1) * xi.unsqueeze(-2)


def dcay_right_T_apply(xi: Tensor, mu: Tensor) -> Tensor:
    """(dcayᴿ_ξ)ᵀ μ = s(μ − ½ ξ×μ)."""
    return _s(xi) * (mu - 0.5 * torch.linalg.cross(xi, mu, dim=-1))


# -- checks and samples ----------------------------------------------------------------------------
def orthogonality_error(g: Tensor) -> tuple[Tensor, Tensor]:
    """(max |gᵀg − I| over the matrix entries, |det g − 1|), per sample."""
    _check_mat(g)
    e = (g.mT @ g - _eye(g)).abs().amax((-2, -1))
    return e, (torch.linalg.det(g) - 1.0).abs()


def check_rotation(g: Tensor, name: str = "g0") -> None:
    """Refuse a ``g`` (..., 3, 3) that is not a rotation, before any step: max |gᵀg − I| and
    |det g − 1| must be at most √eps of g's dtype (1.5e-8 in float64, 3.5e-4 in float32), the
    tolerance RATTLE uses for T*Sⁿ.  A non-orthogonal g0 drifts (the Lie steps keep gᵀg
    constant, not = I) and det g = −1 is a reflection, not a point of SO(3).  One host sync."""
    _check_mat(g, name)
    if g.numel() == 0:
        return
    if not bool(torch.isfinite(g).all()):
        raise ValueError(f"{name} contains NaN or inf")
    with torch.no_grad():
        orth, _ = orthogonality_error(g)
        det = torch.linalg.det(g).reshape(-1)
        e, worst_det = float(orth.max()), float(det[(det - 1.0).abs().argmax()])
    tol = torch.finfo(g.dtype).eps ** 0.5
    if e > tol:
        raise ValueError(f"{name} is not a rotation matrix: max |gᵀg − I| = {e:.2e} > {tol:.1e} "
                         f"(√eps of {g.dtype}); orthonormalise it, e.g. "
                         "torch.linalg.svd: g = U @ Vh (with det +1)")
    if abs(worst_det - 1.0) > tol:
        raise ValueError(f"{name} has det {worst_det:.6g}: a reflection, not a rotation (SO(3) "
                         "needs det = +1); flip the sign of one column")


def random_rotation(*batch, dtype=None, device=None, generator=None) -> Tensor:
    """Haar-random rotations (normalised quaternions), shape (*batch, 3, 3)."""
    dtype = dtype or torch.get_default_dtype()
    q = torch.randn(*batch, 4, dtype=dtype, device=device, generator=generator)
    q = q / q.norm(dim=-1, keepdim=True)
    w, v = q[..., :1], q[..., 1:]
    # unit quaternion (w, v) ↦ cay(2v/w) (the Cayley vector of the rotation), written without /w
    X = hat(v)
    return _eye(v) + 2.0 * w.unsqueeze(-1) * X + 2.0 * (X @ X)
