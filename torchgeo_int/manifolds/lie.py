r"""Left-trivialised Lie-group machinery: groups, coordinate maps τ, discretization maps on G and
their left-trivialised cotangent lifts.

Barbero-Liñán & Martín de Diego (FoCM 2022) build discretization maps from retractions (Prop 2.2);
on a Lie group G the retraction R_g(ξ) = g τ(ξ), with τ = exp or cay and ξ ∈ 𝔤 the
left-trivialised velocity (TG ≅ G × 𝔤), gives (Barbero-Liñán, Marrero & Martín de Diego,
arXiv:2401.14800)

    R_d(g, ξ) = (g τ(−αξ), g τ((1−α)ξ)),      α ∈ [0, 1];  α = ½ symmetric, α = 0 is (g, g τ(ξ)).

Its cotangent lift, written in the left trivialisations T*G ≅ G × 𝔤* and T(T*G) ≅ (G × 𝔤*) ×
(𝔤 × 𝔤*) (a tangent vector (ġ, μ̇) ↦ (V, M) = (g⁻¹ġ, μ̇)), is

    R^{T*}((ḡ, μ̄), (V, M)) = ((ḡ τ(−αV), μ₀), (ḡ τ((1−α)V), μ₁))   with
        Ad*_{τ((1−α)V)⁻¹} μ₁ − Ad*_{τ(−αV)⁻¹} μ₀ = M − ad*_V μ̄,
        (1−α) (dτᴸ_{(1−α)V})* μ₁ + α (dτᴸ_{−αV})* μ₀ = μ̄.

Derivation (checked numerically in the tests against the seed paper's coordinate formula, THEORY
§4, in a chart g = g_ref τ(θ)): in the chart centred at ḡ the map is (θ, v) ↦ (τ⁻¹(τ(θ)τ(−α dτᴸ_θ v)),
…), the chart momentum is p = (dτᴸ_θ)* μ, and D_v R at θ = 0 is (−α, 1−α); pairing the covector
equations (π₀, π₁)·DR_d = (ṗ, p) with an arbitrary δθ, the terms from the θ-dependence of dτᴸ_θ
cancel between the two sides, which leaves the two equations above.  Using dτᴿ_y = Ad_{τ(y)} dτᴸ_y
the second reads (1−α)(dτᴿ_{(1−α)V})* w + α(dτᴿ_{−αV})* u = μ̄ with u = Ad*_{τ(−αV)⁻¹}μ₀,
w = Ad*_{τ((1−α)V)⁻¹}μ₁, which is the form the code uses.

A group here is a small stateless object of batched tensor functions; points of G are tensors
(..., *point_shape), points of 𝔤 and 𝔤* tensors (..., dim).

Size: the groups (SO(3), SO(3)×R³), their τ maps and the group discretization maps share the
hat/vee and dexp machinery of ``so3``; a new group is one ``LieGroup`` subclass here.
"""
from __future__ import annotations

import torch
from torch import nn

from .._validate import check_finite
from ..maps import check_alpha
from . import so3

Tensor = torch.Tensor

__all__ = ["LieGroup", "SO3", "SO3xR3", "Tau", "SO3Tau", "SO3_EXP", "SO3_CAYLEY", "RnTau", "get_group",
           "LieGroupMap", "LieCotangentLift"]


# -- coordinate maps τ -------------------------------------------------------------------------------
class Tau:
    r"""A coordinate map τ : 𝔤 → G with τ(0) = e, Dτ(0) = Id, τ(−ξ) = τ(ξ)⁻¹, given by the
    batched operations the integrators need (never a dense Jacobian over the batch):

    ``minus_identity(ξ)`` τ(ξ) − e (so g τ(ξ) = g + g(τ(ξ) − e) keeps small steps accurate),
    ``inv(g)`` τ⁻¹, ``coad_inv(ξ, μ)`` Ad*_{τ(ξ)⁻¹} μ, ``dright(ξ)`` / ``dright_inv(ξ)`` the
    matrices of dτᴿ_ξ and its inverse, ``dright_T(ξ, μ)`` (dτᴿ_ξ)* μ, and ``split_inv(α, d)``: the
    ξ with τ(αξ) τ((1−α)ξ) = d (closed form for exp and cay, whose τ(aξ), τ(bξ) commute).
    """

    name = "tau"


class SO3Tau(Tau):
    """A τ on SO(3) given by its ``so3`` functions: the exponential and the Cayley map differ only
    in which closed forms they call, so one class holds both (``SO3_EXP``, ``SO3_CAYLEY``)."""

    def __init__(self, name, fn, minus_identity, inv, coad_inv, dright, dright_inv, dright_T,
                 split_inv):
        self.name, self._fn = name, fn
        # plain functions as instance attributes: called without binding, as fast as so3's own
        self.minus_identity, self.inv, self.coad_inv = minus_identity, inv, coad_inv
        self.dright, self.dright_inv, self.dright_T = dright, dright_inv, dright_T
        self.split_inv = split_inv

    def __call__(self, xi):
        return self._fn(xi)


def _cay_split_inv(alpha, d):
    # cay(aξ) is a rotation by 2 atan(a|ξ|/2) about ξ; with y = cay⁻¹(d), tan(φ/2) = |y|/2 and
    # tan(atan(α s/2) + atan((1−α) s/2)) = |y|/2 is a quadratic in s = |ξ|, root
    # ξ = 2y / (1 + sqrt(1 + α(1−α)|y|²)).
    y = so3.cay_inv(d)
    q = (alpha * (1.0 - alpha)) * (y * y).sum(-1, keepdim=True)
    return 2.0 * y / (1.0 + torch.sqrt(1.0 + q))


#: τ = exp on SO(3); exp(αξ)exp((1−α)ξ) = exp(ξ), so split_inv is log.
SO3_EXP = SO3Tau("exp", so3.exp, so3.exp_minus_identity, so3.log, so3.rotate_exp,
                 so3.dexp_right, so3.dexp_right_inv, so3.dexp_right_T_apply,
                 lambda alpha, d: so3.log(d))
#: τ = cay on SO(3) (rational: the cheapest).
SO3_CAYLEY = SO3Tau("cayley", so3.cay, so3.cay_minus_identity, so3.cay_inv, so3.rotate_cay,
                    so3.dcay_right, so3.dcay_right_inv, so3.dcay_right_T_apply, _cay_split_inv)


class RnTau(Tau):
    """τ(v) = v on the abelian group (Rⁿ, +): every differential is the identity."""

    name = "identity"

    def __call__(self, v):
        return v

    def minus_identity(self, v):
        return v

    def inv(self, g):
        return g

    def coad_inv(self, v, mu):
        return mu

    def dright(self, v):
        n = v.shape[-1]
        return torch.eye(n, dtype=v.dtype, device=v.device).expand(*v.shape, n)

    dright_inv = dright

    def dright_T(self, v, mu):
        return mu

    def split_inv(self, alpha, d):
        return d


class ProductTau(Tau):
    """τ = (τ_SO3, id) on SO(3) × R³; 𝔤 = R³ ⊕ R³ = (ω, v)."""

    def __init__(self, rot: Tau):
        self.rot, self.lin = rot, RnTau()
        self.name = rot.name

    def __call__(self, xi):
        return _pack(self.rot(xi[..., :3]), xi[..., 3:])

    def minus_identity(self, xi):
        return _pack(self.rot.minus_identity(xi[..., :3]), xi[..., 3:])

    def inv(self, g):
        return torch.cat([self.rot.inv(g[..., :3]), g[..., 3]], -1)

    def coad_inv(self, xi, mu):
        return torch.cat([self.rot.coad_inv(xi[..., :3], mu[..., :3]), mu[..., 3:]], -1)

    def dright(self, xi):
        return _block_diag_identity(self.rot.dright(xi[..., :3]), xi)

    def dright_inv(self, xi):
        return _block_diag_identity(self.rot.dright_inv(xi[..., :3]), xi)

    def dright_T(self, xi, mu):
        return torch.cat([self.rot.dright_T(xi[..., :3], mu[..., :3]), mu[..., 3:]], -1)

    def split_inv(self, alpha, d):
        return torch.cat([self.rot.split_inv(alpha, d[..., :3]), d[..., 3]], -1)


def _block_diag_identity(A, xi):
    """diag(A, I₃) (..., 6, 6): a product τ's differential, identity on the R³ factor."""
    out = xi.new_zeros(*xi.shape, 6)
    out[..., :3, :3] = A
    out[..., 3:, 3:] = torch.eye(3, dtype=xi.dtype, device=xi.device)
    return out


def _pack(R, x):
    """(R, x) ∈ SO(3) × R³ as one (..., 3, 4) tensor [R | x]."""
    return torch.cat([R, x.unsqueeze(-1)], -1)


# -- groups ------------------------------------------------------------------------------------------
class LieGroup:
    r"""A matrix-like Lie group with the batched operations the integrators use.

    ``dim`` (of 𝔤), ``point_shape`` (of one element), ``identity``, ``compose``, ``inverse``,
    ``coad_inv(g, μ)`` = Ad*_{g⁻¹} μ (left-trivialised → spatial momentum), ``coad(g, μ)`` =
    Ad*_g μ, ``ad_star(ξ, μ)`` = ad*_ξ μ, ``left_grad(g, G)`` = L_g* of the covector whose ambient
    (matrix-entry) gradient is G, ``membership_error(g)``, ``taus`` (name → Tau).
    """

    name = "group"
    dim: int
    point_shape: tuple
    taus: dict

    def tau(self, name) -> Tau:
        if isinstance(name, Tau):
            if any(name is t for t in self.taus.values()):
                return name
            raise ValueError(f"the coordinate map {getattr(name, 'name', type(name).__name__)!r} "
                             f"of {type(name).__name__} is not one of {self.name}'s "
                             f"({', '.join(sorted(self.taus))}): pass its name or "
                             f"{self.name}'s own Tau")
        if name not in self.taus:
            raise ValueError(f"unknown coordinate map {name!r} on {self.name}; "
                             f"known: {', '.join(sorted(self.taus))}")
        return self.taus[name]

    def check_point(self, g, name="g"):
        if not isinstance(g, torch.Tensor) or not g.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor (..., {self._shape_str()}), "
                            f"got {type(g).__name__ if not isinstance(g, torch.Tensor) else g.dtype}")
        k = len(self.point_shape)
        if g.dim() < k or tuple(g.shape[-k:]) != tuple(self.point_shape):
            raise ValueError(f"{name} must be a point of {self.name}, shape (..., "
                             f"{self._shape_str()}), got {tuple(g.shape)}")
        return g.shape[:-k]

    def check_algebra(self, xi, name="xi"):
        if not isinstance(xi, torch.Tensor) or not xi.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor (..., {self.dim})")
        if xi.dim() < 1 or xi.shape[-1] != self.dim:
            raise ValueError(f"{name} must have shape (..., {self.dim}) (a point of the "
                             f"left-trivialised algebra of {self.name}), got {tuple(xi.shape)}")
        return xi.shape[:-1]

    def check_state(self, g, mu, names=("g", "mu")):
        """A point (g, μ) of T*G ≅ G × 𝔤*: shapes, one batch shape, dtype, device, finite."""
        bg = self.check_point(g, names[0])
        bm = self.check_algebra(mu, names[1])
        if bg != bm:
            raise ValueError(f"{names[0]} and {names[1]} must share the batch shape, got "
                             f"{tuple(bg)} and {tuple(bm)} ({names[0]} is (..., "
                             f"{self._shape_str()}), {names[1]} is (..., {self.dim}))")
        if g.dtype != mu.dtype:
            raise TypeError(f"{names[0]} and {names[1]} must have the same dtype, got {g.dtype} "
                            f"and {mu.dtype}")
        if g.device != mu.device:
            raise ValueError(f"{names[0]} and {names[1]} are on different devices")
        check_finite(g, names[0])
        check_finite(mu, names[1])
        self.check_member(g, names[0])

    def check_member(self, g, name="g"):
        """Refuse a g off the group (the steps keep it on the group it starts on, not on G):
        nothing to check for a group whose every point of the right shape is a member."""

    def _shape_str(self):
        return ", ".join(str(s) for s in self.point_shape)

    def right_tau(self, g, tau: Tau, xi):
        """g τ(ξ), as g + g (τ(ξ) − e)."""
        raise NotImplementedError

    def right_tau_split(self, g, tau: Tau, alpha, V):
        """g τ(αV) τ((1−α)V): the far end g₁ of a Lie step from its near end g₀ (generic form:
        two right translations; the matrix groups form the product of the τ's first)."""
        return self.right_tau(self.right_tau(g, tau, alpha * V), tau, (1.0 - alpha) * V)


def _rotation_split(R, tau: Tau, alpha, V):
    r"""R τ(αV) τ((1−α)V) on SO(3), as R + R K with K = K₁ + K₂ + K₁K₂, Kᵢ = τ(·) − e: the small
    rotation is never added to I and rounded (which would make the error of RᵀR drift)."""
    if alpha == 0.0 or alpha == 1.0:
        K = tau.minus_identity(V)
    elif alpha == 0.5:
        K1 = tau.minus_identity(0.5 * V)
        K = 2.0 * K1 + K1 @ K1
    else:
        K1, K2 = tau.minus_identity(alpha * V), tau.minus_identity((1.0 - alpha) * V)
        K = K1 + K2 + K1 @ K2
    return R + R @ K


class SO3Group(LieGroup):
    """SO(3): points (..., 3, 3), 𝔤 = 𝔤* = R³ (hat map, dot-product pairing)."""

    name = "SO(3)"
    dim = 3
    point_shape = (3, 3)

    def __init__(self):
        self.taus = {"exp": SO3_EXP, "cayley": SO3_CAYLEY}

    def check_member(self, g, name="g"):
        so3.check_rotation(g, name)

    def identity(self, *batch, dtype=None, device=None):
        return torch.eye(3, dtype=dtype, device=device).expand(*batch, 3, 3).clone()

    def compose(self, a, b):
        return a @ b

    def inverse(self, g):
        return g.mT

    def act(self, g, v):
        """g v for a vector v (..., 3)."""
        return (g @ v.unsqueeze(-1)).squeeze(-1)

    def coad_inv(self, g, mu):
        return self.act(g, mu)

    def coad(self, g, mu):
        return self.act(g.mT, mu)

    def ad_star(self, xi, mu):
        return torch.linalg.cross(mu, xi, dim=-1)

    def left_grad(self, g, G):
        # ⟨G, g η̂⟩_F = Σ (gᵀG)ᵢⱼ η̂ᵢⱼ
        return so3.skew_vee(g.mT @ G)

    def right_tau(self, g, tau, xi):
        return g + g @ tau.minus_identity(xi)

    def right_tau_split(self, g, tau, alpha, V):
        return _rotation_split(g, tau, alpha, V)

    def membership_error(self, g):
        return so3.orthogonality_error(g)

    def random(self, *batch, dtype=None, device=None, generator=None):
        return so3.random_rotation(*batch, dtype=dtype, device=device, generator=generator)


class SO3xR3Group(LieGroup):
    r"""The direct product SO(3) × R³: points (..., 3, 4) = [R | x], 𝔤 = 𝔤* = R⁶ = (ω, v) with
    (R, x)(R', x') = (RR', x + x').  A rigid body's attitude and centre-of-mass position; the
    translational part of every formula is the α-family of Rⁿ."""

    name = "SO(3)xR3"
    dim = 6
    point_shape = (3, 4)

    def __init__(self):
        self.taus = {"exp": ProductTau(SO3_EXP), "cayley": ProductTau(SO3_CAYLEY)}

    def check_member(self, g, name="g"):
        so3.check_rotation(g[..., :3, :3], f"the rotation block of {name}")

    def identity(self, *batch, dtype=None, device=None):
        e = torch.zeros(*batch, 3, 4, dtype=dtype, device=device)
        e[..., :3, :3] = torch.eye(3, dtype=dtype, device=device)
        return e

    def compose(self, a, b):
        return _pack(a[..., :3] @ b[..., :3], a[..., 3] + b[..., 3])

    def inverse(self, g):
        return _pack(g[..., :3].mT, -g[..., 3])

    def coad_inv(self, g, mu):
        R = g[..., :3]
        return torch.cat([(R @ mu[..., :3].unsqueeze(-1)).squeeze(-1), mu[..., 3:]], -1)

    def coad(self, g, mu):
        R = g[..., :3]
        return torch.cat([(R.mT @ mu[..., :3].unsqueeze(-1)).squeeze(-1), mu[..., 3:]], -1)

    def ad_star(self, xi, mu):
        return torch.cat([torch.linalg.cross(mu[..., :3], xi[..., :3], dim=-1),
                          torch.zeros_like(mu[..., 3:])], -1)

    def left_grad(self, g, G):
        R = g[..., :3]
        return torch.cat([so3.skew_vee(R.mT @ G[..., :3]), G[..., 3]], -1)

    def right_tau(self, g, tau, xi):
        R, x = g[..., :3], g[..., 3]
        return _pack(R + R @ tau.rot.minus_identity(xi[..., :3]), x + xi[..., 3:])

    def right_tau_split(self, g, tau, alpha, V):
        # the R³ factor is additive: x + αv + (1−α)v = x + v
        return _pack(_rotation_split(g[..., :3], tau.rot, alpha, V[..., :3]), g[..., 3] + V[..., 3:])

    def membership_error(self, g):
        return so3.orthogonality_error(g[..., :3])

    def random(self, *batch, dtype=None, device=None, generator=None):
        R = so3.random_rotation(*batch, dtype=dtype, device=device, generator=generator)
        x = torch.randn(*batch, 3, dtype=R.dtype, device=device, generator=generator)
        return _pack(R, x)


SO3 = SO3Group()
SO3xR3 = SO3xR3Group()
_GROUPS = {"SO3": SO3, "SO(3)": SO3, "SO3xR3": SO3xR3, "SO(3)xR3": SO3xR3}


def get_group(group) -> LieGroup:
    if isinstance(group, LieGroup):
        return group
    if group in _GROUPS:
        return _GROUPS[group]
    raise ValueError(f"unknown group {group!r}; known: SO3, SO3xR3, or a LieGroup instance")


# -- discretization maps on G -----------------------------------------------------------------------
class LieGroupMap(nn.Module):
    r"""R_d(g, ξ) = (g τ(−αξ), g τ((1−α)ξ)) on G, ξ ∈ 𝔤 left-trivialised (Prop 2.2 of the seed
    paper with the retraction R_g(ξ) = g τ(ξ)).  Inverse in closed form: ξ = split_inv(α, g₀⁻¹g₁),
    g = g₀ τ(αξ).  R_d* is LieGroupMap(1 − α); α = ½ is symmetric.

    Not a :class:`~torchgeo_int.DiscretizationMap` subclass: a point (g, ξ) of TG ≅ G × 𝔤 is a
    pair of tensors of different shapes ((..., 3, 3) and (..., 3) on SO(3)).
    """

    def __init__(self, group="SO3", tau="cayley", alpha: float = 0.5):
        super().__init__()
        self.group = get_group(group)
        self.tau = self.group.tau(tau)
        self.alpha = check_alpha(alpha)

    def extra_repr(self):
        return f"group={self.group.name}, tau={self.tau.name}, alpha={self.alpha}"

    @property
    def symmetric(self) -> bool:
        return self.alpha == 0.5

    def adjoint(self) -> "LieGroupMap":
        """R_d*(g, ξ) = (R²(g, −ξ), R¹(g, −ξ)) = LieGroupMap(1 − α)."""
        return LieGroupMap(self.group, self.tau, 1.0 - self.alpha)

    def forward(self, g, xi):
        bg, bx = self.group.check_point(g), self.group.check_algebra(xi)
        if bg != bx:
            raise ValueError(f"g and xi must share the batch shape, got {tuple(bg)} and {tuple(bx)}")
        a = self.alpha
        return (self.group.right_tau(g, self.tau, -a * xi),
                self.group.right_tau(g, self.tau, (1.0 - a) * xi))

    def inverse(self, g0, g1):
        self.group.check_point(g0, "g0")
        self.group.check_point(g1, "g1")
        d = self.group.compose(self.group.inverse(g0), g1)
        xi = self.tau.split_inv(self.alpha, d)
        return self.base_point(g0, xi), xi

    # The pieces of R_d written from the near end g₀ (what an integrator knows); unchecked.
    def base_point(self, g0, xi):
        """ḡ = g₀ τ(αξ), the base point of (g₀, ·) = R_d(ḡ, ξ)."""
        return self.group.right_tau(g0, self.tau, self.alpha * xi)

    def end_point(self, g0, xi):
        """g₁ = g₀ τ(αξ) τ((1−α)ξ) = R²_d(ḡ, ξ) (see ``LieGroup.right_tau_split``)."""
        return self.group.right_tau_split(g0, self.tau, self.alpha, xi)

    def check(self, g) -> dict:
        """Residuals of Def 2.2 at g in left-trivialised form: ``{"i": max|R_d(g, 0) − (g, g)|,
        "ii": max|D_ξ(τ⁻¹(g⁻¹R²)) − D_ξ(τ⁻¹(g⁻¹R¹)) − Id|}`` at ξ = 0 (Jacobians by autograd)."""
        zero = g.new_zeros(*self.group.check_point(g), self.group.dim)
        if g.numel() == 0:                       # nothing to check (max of nothing is undefined)
            return {"i": 0.0, "ii": 0.0}
        g0, g1 = self(g, zero)
        res_i = max(float((g0 - g).abs().max()), float((g1 - g).abs().max()))
        ginv = self.group.inverse(g)

        def local(xi):
            y0, y1 = self(g, xi)
            return (self.tau.inv(self.group.compose(ginv, y1))
                    - self.tau.inv(self.group.compose(ginv, y0)))

        n = self.group.dim
        eye = torch.eye(n, dtype=g.dtype, device=g.device)
        # One JVP per basis direction serves the whole batch (samples are independent).
        cols = [torch.func.jvp(local, (zero,), (eye[j].expand_as(zero),))[1] for j in range(n)]
        J = torch.stack(cols, -1)
        return {"i": res_i, "ii": float((J - eye).abs().max())}


class LieCotangentLift(nn.Module):
    r"""The left-trivialised cotangent lift of a :class:`LieGroupMap` (module docstring):
    a map T(T*G) → T*G × T*G, ((ḡ, μ̄), (V, M)) ↦ ((g₀, μ₀), (g₁, μ₁)), and its inverse in closed
    form.  With (V, M) = h X_H(ḡ, μ̄) = h(∂H/∂μ, ad*_{∂H/∂μ} μ̄ − L_ḡ*∂H/∂g) its graph is the Lie-group
    integrator of eq. (20) (see :class:`~torchgeo_int.manifolds.integrators.LieGroupIntegrator`).
    """

    def __init__(self, R: LieGroupMap):
        super().__init__()
        if not isinstance(R, LieGroupMap):
            raise TypeError(f"LieCotangentLift takes a LieGroupMap, got {type(R).__name__}")
        self.R = R
        # plain attributes (R is a submodule, found through nn.Module.__getattr__): the
        # integrator calls the equations below inside its solver iteration
        self.tau, self.alpha = R.tau, R.alpha

    @property
    def symmetric(self):
        return self.R.symmetric

    def forward(self, base, tangent):
        (g, mu), (V, M) = base, tangent
        G, tau, a = self.R.group, self.R.tau, self.R.alpha
        G.check_state(g, mu, ("g", "mu"))
        G.check_state(g, V, ("g", "V"))
        G.check_state(g, M, ("g", "M"))
        c = M - G.ad_star(V, mu)                          # w − u
        A, B = tau.dright((1.0 - a) * V), tau.dright(-a * V)
        K = (1.0 - a) * A.mT + a * B.mT
        u = torch.linalg.solve(K, (mu - (1.0 - a) * (A.mT @ c.unsqueeze(-1)).squeeze(-1))
                               .unsqueeze(-1)).squeeze(-1)
        w = u + c
        g0, g1 = self.R(g, V)
        mu0 = tau.coad_inv(a * V, u)                      # Ad*_{τ(−αV)} u
        return (g0, mu0), (g1, self.momentum_out(V, w))

    def inverse(self, first, second):
        (g0, mu0), (g1, mu1) = first, second
        G, tau, a = self.R.group, self.R.tau, self.R.alpha
        G.check_state(g0, mu0, ("g0", "mu0"))
        G.check_state(g1, mu1, ("g1", "mu1"))
        g, V = self.R.inverse(g0, g1)
        u = self.momentum_in(V, mu0)
        w = tau.coad_inv((1.0 - a) * V, mu1)              # Ad*_{τ((1−α)V)⁻¹} μ₁
        mu = self.mu_bar(V, u, w)
        M = w - u + G.ad_star(V, mu)
        return (g, mu), (V, M)

    # The lift's equations in the variables u, w (module docstring); unchecked.  The Lie-group
    # integrator solves them with (V, M) = h X_H(ḡ, μ̄) from the near end (g₀, μ₀).
    def momentum_in(self, V, mu0):
        """u = Ad*_{τ(−αV)⁻¹} μ₀."""
        return self.tau.coad_inv(-self.alpha * V, mu0)

    def momentum_out(self, V, w):
        """μ₁ = Ad*_{τ((1−α)V)} w (w = u + M − ad*_V μ̄)."""
        return self.tau.coad_inv(-(1.0 - self.alpha) * V, w)

    def mu_bar(self, V, u, w):
        """μ̄ = (1−α)(dτᴿ_{(1−α)V})* w + α(dτᴿ_{−αV})* u (the second lift equation); one
        differential when α ∈ {0, 1}."""
        tau, a = self.tau, self.alpha
        if a == 0.0:
            return tau.dright_T(V, w)
        if a == 1.0:
            return tau.dright_T(-V, u)
        return (1.0 - a) * tau.dright_T((1.0 - a) * V, w) + a * tau.dright_T(-a * V, u)
