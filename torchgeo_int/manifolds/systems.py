r"""Hamiltonian systems on T*G ≅ G × 𝔤* (left trivialisation) and on T*S² (embedded).

A :class:`LieGroupSystem` gives the Lie-group integrators, for H(g, μ[, t]):

* ``gradients(g, μ, t) -> (f, ξ)`` with f = L_g*(∂H/∂g) ∈ 𝔤* (the left-trivialised
  configuration derivative, f(η) = d/ds H(g τ(sη), μ) at s = 0) and ξ = ∂H/∂μ ∈ 𝔤;
* ``vector_field(g, μ, t) -> (ξ, μ̇)``: the left-trivialised Hamilton equations
  ġ = g ξ,  μ̇ = ad*_ξ μ − f  (Euler–Poincaré/Lie–Poisson with a potential; on SO(3)
  ġ = g ξ̂, μ̇ = μ × ξ − f);
* ``energy(g, μ, t)``.

The default gradients come from autograd of H as a function of the ambient entries of g
(f = vee(A − Aᵀ), A = gᵀ∂H/∂g on SO(3)), by ``systems.grad_of``: with a graph when grad mode is on
and H has something that requires grad (learned H).
:class:`RigidBody` systems, H = ½⟨μ, 𝕀⁻¹μ⟩ + U(g), have ξ = 𝕀⁻¹μ independent of g, which the
integrators use to halve the unknowns of the implicit step.

``separable`` (tgi's kick–drift flag) is False for every system here: the Euclidean splittings
p ← p + h F, q ← q + h v would be meaningless on a group.
"""
from __future__ import annotations

import torch
from torch import nn

from .._validate import check_real
from ..systems import SeparableHamiltonian, System, check_energy, grad_of, takes_time
from .lie import LieGroup, get_group
from .so3 import check_rotation
from .sphere import check_on_sphere

Tensor = torch.Tensor

__all__ = ["LieGroupSystem", "LieHamiltonian", "RigidBody", "FreeRigidBody", "HeavyTop",
           "SpringTop", "SO3HNN", "SphericalPendulum"]


class LieGroupSystem(System):
    """Base class of Hamiltonian systems on T*G ≅ G × 𝔤* (see module docstring)."""

    separable = False
    #: H = ½⟨μ, 𝕀⁻¹μ⟩ + U(g): ``velocity(μ)`` = 𝕀⁻¹μ and ``torque(g, t)`` = −L_g*∂U/∂g exist.
    rigid = False
    time_dependent = False
    #: what steps (g, μ) (rollout names it when given another method)
    stepped_by = "a Lie-group method (LIE_METHODS, e.g. method='lie_midpoint_cayley')"

    def __init__(self, group="SO3"):
        super().__init__()
        self.group: LieGroup = get_group(group)

    def hamiltonian(self, g: Tensor, mu: Tensor, t: float = 0.0) -> Tensor:
        raise NotImplementedError

    def energy(self, g, mu, t=0.0):
        # one value per sample, as a Hamiltonian's (a (B, 1) energy broadcasts against (B,) ones)
        return check_energy(self.hamiltonian(g, mu, t), mu, "the Hamiltonian", getattr(self, "fn", None))

    def forward(self, g, mu, t=0.0):
        return self.energy(g, mu, t)

    def gradients(self, g, mu, t=0.0) -> tuple[Tensor, Tensor]:
        """(f, ξ) = (L_g*∂H/∂g, ∂H/∂μ) by autograd of H on the ambient entries of g."""
        # (the user's H checked for one value per sample, as energy() does)
        G, xi = grad_of(lambda g_, m_: self.hamiltonian(g_, m_, t), (g, mu), "the Hamiltonian",
                        getattr(self, "fn", None))
        return self.group.left_grad(g, G), xi

    def vector_field(self, g, mu, t=0.0):
        """(ξ, μ̇): ġ = g ξ (left-trivialised velocity), μ̇ = ad*_ξ μ − f."""
        f, xi = self.gradients(g, mu, t)
        return xi, self.group.ad_star(xi, mu) - f

    def spatial_momentum(self, g, mu):
        """Ad*_{g⁻¹} μ (on SO(3): g μ), the momentum map of left translations."""
        return self.group.coad_inv(g, mu)


class LieHamiltonian(LieGroupSystem):
    """H = fn(g, μ) or fn(g, μ, t) on T*G; ``grad(g, μ[, t]) -> (f, ξ)`` may give the
    left-trivialised gradients in closed form.  Or subclass and override ``hamiltonian``."""

    def __init__(self, fn=None, *, group="SO3", grad=None, time_dependent: bool | None = None):
        super().__init__(group)
        if fn is not None and not callable(fn):
            raise TypeError("fn must be callable as fn(g, mu) or fn(g, mu, t)")
        self.fn, self._grad = fn, grad
        target = fn if fn is not None else self._user_hamiltonian
        self.time_dependent = takes_time(target, 2) if time_dependent is None else time_dependent

    def _user_hamiltonian(self, g, mu):
        raise NotImplementedError("pass fn or override hamiltonian(g, mu)")

    def hamiltonian(self, g, mu, t=0.0):
        if self.fn is None:
            return self._user_hamiltonian(g, mu)
        return self.fn(g, mu, t) if self.time_dependent else self.fn(g, mu)

    def gradients(self, g, mu, t=0.0):
        if self._grad is not None:
            return self._grad(g, mu, t) if self.time_dependent else self._grad(g, mu)
        return super().gradients(g, mu, t)


def _number(x):
    """A 0-d tensor's value (the tops take numbers; float() took 0-d tensors before the checks)."""
    return x.item() if isinstance(x, torch.Tensor) and x.dim() == 0 else x


def _as_inertia(inertia, dim):
    I = torch.as_tensor(inertia, dtype=torch.get_default_dtype()) \
        if not isinstance(inertia, torch.Tensor) else inertia
    if I.shape not in ((dim,), (dim, dim)):
        raise ValueError(f"inertia must be ({dim},) principal moments or a ({dim}, {dim}) "
                         f"symmetric positive-definite matrix, got shape {tuple(I.shape)}")
    with torch.no_grad():
        if not bool(torch.isfinite(I).all()):
            raise ValueError("inertia contains NaN or inf")
        if I.dim() == 1:
            ok = bool((I > 0).all())
        else:
            ok = bool(torch.allclose(I, I.mT)) and bool((torch.linalg.eigvalsh(I) > 0).all())
        if not ok:
            raise ValueError("inertia must be positive definite (and symmetric)")
    return I


class RigidBody(LieGroupSystem):
    r"""H(g, μ) = ½ μᵀ𝕀⁻¹μ + U(g[, t]) on T*G: a rigid body (G = SO(3); 𝕀 the body inertia) or a
    rigid body with its centre of mass (G = SO(3) × R³; 𝕀 = diag(inertia, mass)).

    ``inertia``: principal moments (dim,) or an SPD (dim, dim) tensor (it may require grad, for
    parameter fitting).  ``potential(g[, t])`` (None: free body) and optionally its
    left-trivialised gradient ``potential_grad(g[, t]) -> L_g*∂U/∂g`` in closed form.
    """

    rigid = True

    #: the attribute the given inertia is registered as, and its size (None: the group's dim);
    #: a subclass that assembles ``inertia`` from it (SpringTop) names another
    inertia_attr, inertia_dim = "inertia", None

    def __init__(self, inertia, potential=None, *, potential_grad=None, group="SO3"):
        super().__init__(group)
        I = _as_inertia(inertia, self.inertia_dim or self.group.dim)
        if isinstance(I, torch.nn.Parameter):
            setattr(self, self.inertia_attr, I)
        else:   # a buffer, so system.to(device) moves it (not saved: it is the constructor's)
            self.register_buffer(self.inertia_attr, I, persistent=False)
        self.potential, self.potential_grad = potential, potential_grad
        self.time_dependent = potential is not None and takes_time(potential, 1)

    def inertia_matrix(self, dtype=None):
        I = self.inertia if self.inertia.dim() == 2 else torch.diag(self.inertia)
        return I if dtype is None else I.to(dtype)

    def velocity(self, mu, t=0.0):
        """ξ = 𝕀⁻¹μ."""
        I = self.inertia.to(mu)
        if I.dim() == 1:
            return mu / I
        return torch.linalg.solve(I, mu.unsqueeze(-1)).squeeze(-1)

    def kinetic(self, mu):
        return 0.5 * (mu * self.velocity(mu)).sum(-1)

    def _U(self, g, t):
        if self.potential is None:
            return g.new_zeros(g.shape[:-2])
        return self.potential(g, t) if self.time_dependent else self.potential(g)

    def hamiltonian(self, g, mu, t=0.0):
        return self.kinetic(mu) + self._U(g, t)

    def torque(self, g, t=0.0):
        """−L_g*∂U/∂g (zero for a free body)."""
        if self.potential is None:
            return g.new_zeros(*g.shape[:-2], self.group.dim)
        if self.potential_grad is not None:
            f = self.potential_grad(g, t) if self.time_dependent else self.potential_grad(g)
        else:
            f = self.group.left_grad(g, grad_of(lambda g_: self._U(g_, t), (g,))[0])
        return -f

    def gradients(self, g, mu, t=0.0):
        return -self.torque(g, t), self.velocity(mu)


class FreeRigidBody(RigidBody):
    r"""The free rigid body on T*SO(3), H = ½ μᵀ𝕀⁻¹μ (Euler's equations μ̇ = μ × 𝕀⁻¹μ, Ṙ = R ξ̂).
    Casimir |μ|, spatial momentum g μ and H are conserved."""

    def __init__(self, inertia):
        super().__init__(inertia, None, group="SO3")


class HeavyTop(RigidBody):
    r"""The heavy top on T*SO(3) (fixed point, unreduced form):

        H(g, μ) = ½ μᵀ𝕀⁻¹μ + m g₀ χ·(gᵀe₃),     L_g*∂U/∂g = m g₀ χ × Γ,  Γ = gᵀe₃,

    𝕀 the inertia about the fixed point, χ the body vector from it to the centre of mass, g₀ the
    gravitational acceleration, e₃ up.  The reduced (semidirect-product se(3)*) variables are
    (μ, Γ); their Casimirs Γ·μ = e₃·(g μ) (Noether momentum of rotations about the vertical) and
    |Γ|² = 1 are conserved, and so is H.
    """

    def __init__(self, inertia, *, mass: float = 1.0, gravity: float = 1.0, com=(0.0, 0.0, 1.0)):
        mass, gravity = _number(mass), _number(gravity)
        check_real(mass, "mass", 0.0, lo_open=True)
        check_real(gravity, "gravity", 0.0)
        self.mgl = float(mass) * float(gravity)
        chi = torch.as_tensor(com, dtype=torch.get_default_dtype())
        if chi.shape != (3,):
            raise ValueError(f"com must be a body vector of shape (3,), got {tuple(chi.shape)}")
        super().__init__(inertia, self._potential, potential_grad=self._potential_grad, group="SO3")
        self.register_buffer("com", chi, persistent=False)

    def gamma(self, g):
        """Γ = gᵀe₃: the vertical seen in the body frame."""
        return g[..., 2, :]

    def _potential(self, g):
        return self.mgl * (self.gamma(g) * self.com.to(g)).sum(-1)

    def _potential_grad(self, g):
        chi = self.com.to(g).expand(*g.shape[:-2], 3)
        return self.mgl * torch.linalg.cross(chi, self.gamma(g), dim=-1)

    def casimirs(self, g, mu):
        """(Γ·μ, |Γ|²)."""
        G = self.gamma(g)
        return (G * mu).sum(-1), (G * G).sum(-1)


class SpringTop(RigidBody):
    r"""A heavy rigid body on SO(3) × R³ hung from the origin by a spring at a body point:

        H((R, x), (Π, p)) = ½ ΠᵀJ⁻¹Π + |p|²/(2m) + m g₀ e₃·x + ½ k |x + R a|²,

    x the centre of mass, J the inertia about it, a the body vector from the centre of mass to the
    attachment point.  Attitude and translation couple through the spring.  Rotations about the
    vertical through the origin are a symmetry: e₃·(x × p + RΠ) is conserved (and H).
    """

    inertia_attr, inertia_dim = "moments", 3      # the 3 moments given; ``inertia`` assembles the 6

    def __init__(self, inertia, *, mass: float = 1.0, gravity: float = 1.0, stiffness: float = 10.0,
                 attach=(0.0, 0.0, 0.5)):
        I = _as_inertia(inertia, 3)
        if I.dim() == 2 and not bool(torch.allclose(I, torch.diag(torch.diagonal(I)))):
            raise ValueError("SpringTop takes principal moments (a diagonal inertia)")
        mass, gravity, stiffness = _number(mass), _number(gravity), _number(stiffness)
        check_real(mass, "mass", 0.0, lo_open=True)
        check_real(gravity, "gravity", 0.0)
        check_real(stiffness, "stiffness", 0.0)
        self.m, self.g0, self.k = float(mass), float(gravity), float(stiffness)
        a = torch.as_tensor(attach, dtype=torch.get_default_dtype())
        # the moments are registered as given (a Parameter stays one: fitted, it moves the body);
        # 𝕀 = diag(moments, m, m, m) is assembled at use, not once here
        super().__init__(I, self._potential, potential_grad=self._potential_grad, group="SO3xR3")
        self.register_buffer("attach", a, persistent=False)

    @property
    def inertia(self):
        """diag(moments, m, m, m) as the 6-vector the steps divide by."""
        I = self.moments if self.moments.dim() == 1 else torch.diagonal(self.moments)
        return torch.cat([I, I.new_full((3,), self.m)])

    def _potential(self, g):
        R, x = g[..., :3], g[..., 3]
        s = x + (R @ self.attach.to(g).unsqueeze(-1)).squeeze(-1)
        return self.m * self.g0 * x[..., 2] + 0.5 * self.k * (s * s).sum(-1)

    def _potential_grad(self, g):
        R, x = g[..., :3], g[..., 3]
        a = self.attach.to(g).expand(*g.shape[:-2], 3)
        s = x + (R @ a.unsqueeze(-1)).squeeze(-1)
        # d/ds ½k|x + R exp(sη̂) a|² = k s·(R(η × a)) = k η·(a × Rᵀs)
        rot = self.k * torch.linalg.cross(a, (R.mT @ s.unsqueeze(-1)).squeeze(-1), dim=-1)
        lin = self.k * s
        lin = lin + torch.stack([torch.zeros_like(x[..., 0]), torch.zeros_like(x[..., 0]),
                                 torch.full_like(x[..., 0], self.m * self.g0)], -1)
        return torch.cat([rot, lin], -1)

    def vertical_momentum(self, g, mu):
        R, x = g[..., :3], g[..., 3]
        L = torch.linalg.cross(x, mu[..., 3:], dim=-1) + (R @ mu[..., :3].unsqueeze(-1)).squeeze(-1)
        return L[..., 2]


class SO3HNN(LieHamiltonian):
    r"""A Hamiltonian neural network on T*SO(3): H(g, μ) = MLP(cat(vec g, μ)) (+ an optional
    fixed quadratic ½|μ|²·``kinetic_prior`` that keeps the learned H coercive in μ).  A plain
    ``nn.Module``: its parameters get gradients through any Lie-group rollout (the implicit steps
    differentiate H with ``create_graph`` and the solver's implicit backward)."""

    def __init__(self, hidden: int = 32, depth: int = 2, activation=nn.Tanh,
                 kinetic_prior: float = 0.0):
        super().__init__(None, group="SO3", time_dependent=False)
        if depth < 1 or hidden < 1:
            raise ValueError("depth and hidden must be >= 1")
        layers, n = [], 12
        for _ in range(depth):
            layers += [nn.Linear(n, hidden), activation()]
            n = hidden
        layers.append(nn.Linear(n, 1))
        self.net = nn.Sequential(*layers)
        self.kinetic_prior = float(kinetic_prior)

    def _user_hamiltonian(self, g, mu):
        z = torch.cat([g.flatten(-2), mu], -1)
        out = self.net(z).squeeze(-1)
        if self.kinetic_prior:
            out = out + 0.5 * self.kinetic_prior * (mu * mu).sum(-1)
        return out


class SphericalPendulum(SeparableHamiltonian):
    r"""The spherical pendulum on T*S², embedded: q ∈ S² ⊂ R³ (unit vector to the bob), p ∈ T_qS²,

        H(q, p) = |p|²/(2 m ℓ²) + m g₀ ℓ q₃    (q₃ up; the stable rest point is q = −e₃).

    Integrate it with :class:`~torchgeo_int.manifolds.integrators.Rattle` (the constraint |q| = 1,
    q·p = 0 is kept exactly).  The vertical angular momentum (q × p)₃ is conserved.  The methods
    of R³ (``verlet``, …) would step H without the constraint (a falling particle, not this
    pendulum): they are refused (``stepped_by``)."""

    stepped_by = ("the sphere's RATTLE, method=tgi.manifolds.Rattle() (it keeps |q| = 1 and "
                  "q·p = 0, which the methods of R³ drop)")

    def __init__(self, mass: float = 1.0, length: float = 1.0, gravity: float = 1.0):
        self.M = float(mass) * float(length) ** 2
        self.c = float(mass) * float(gravity) * float(length)
        if not (self.M > 0 and self.c >= 0):
            raise ValueError("mass and length must be > 0, gravity >= 0")
        M, c = self.M, self.c

        def grad_V(q):
            z = torch.zeros_like(q[..., :1])
            return torch.cat([z, z, torch.full_like(q[..., :1], c)], -1)

        super().__init__(lambda p: 0.5 * (p * p).sum(-1) / M, lambda q: c * q[..., 2],
                         kinetic_grad=lambda p: p / M, potential_grad=grad_V)
        self.mass_matrix = M   # T = |p|²/(2M): RATTLE's multipliers have closed forms
        self.radius = 1.0
        self.space_dim = 3     # (q₃ is up: points of S² ⊂ R³)

    # -- the same system through the action of SO(3) on S² --------------------------------------
    def as_top(self) -> "HeavyTop":
        r"""The symmetric heavy top 𝕀 = M·Id, χ = e₃, m g₀ = c whose axis q = g e₃ moves as this
        pendulum when μ₃ = 0: T*S² is the reduced space T*SO(3)//SO(2) at zero momentum of the
        rotations about the body axis.  The Lie-group integrators are equivariant under that
        right action, so they conserve μ₃ exactly and descend to symplectic maps of T*S²."""
        return HeavyTop(torch.full((3,), self.M), mass=1.0, gravity=self.c, com=(0.0, 0.0, 1.0))

    def to_top_state(self, q, p):
        """(g, μ) with g e₃ = q and μ = gᵀ(q × p) (so μ₃ = 0), for unit q and p ⊥ q (a q off
        the sphere is refused: g would not be a rotation)."""
        check_on_sphere(q, "q")
        e = torch.zeros_like(q)
        # a first axis ⊥ q from the coordinate axis least aligned with q
        idx = q.abs().argmin(-1, keepdim=True)
        e.scatter_(-1, idx, 1.0)
        a = e - (e * q).sum(-1, keepdim=True) * q
        a = a / a.norm(dim=-1, keepdim=True)
        b = torch.linalg.cross(q, a, dim=-1)
        g = torch.stack([a, b, q], -1)
        mu = (g.mT @ torch.linalg.cross(q, p, dim=-1).unsqueeze(-1)).squeeze(-1)
        return g, mu

    def from_top_state(self, g, mu):
        """(q, p) = (g e₃, (g μ) × q), for g a rotation (:func:`~.so3.check_rotation`)."""
        check_rotation(g, "g")
        q = g[..., :, 2]
        return q, torch.linalg.cross((g @ mu.unsqueeze(-1)).squeeze(-1), q, dim=-1)
