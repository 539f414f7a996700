r"""The Lagrangian side, on TQ: second-order systems, Lagrangians and discrete Lagrangians.

* :class:`SecondOrderSystem` — a SODE q̈ = M⁻¹ f(t, q, q̇) (Sect. 4 of the seed paper), stepped on
  the state (q, v) by the integrators of ``integrators/sode.py`` (Newmark, eqs. (10)/(11)).
* :class:`Lagrangian` — L(q, v[, t]) with its Legendre transform p = ∂L/∂v; as a system its state
  is (q, p), like a Hamiltonian's, so the variational integrators (Sect. 5.3) and the Hamiltonian
  ones can be run on it and compared.  :class:`MechanicalLagrangian` is L = ½vᵀMv − V(q) with
  every transform in closed form.
* :class:`DiscreteLagrangian` — L_d^h(q₀, q₁) = h·L(q̄, w/h), (q̄, w) = R_d⁻¹(q₀, q₁), for any
  discretization map R_d; :class:`ComposedDiscreteLagrangian` — L_d¹ + L_d² + … with the
  intermediate points solved for (Sect. 6).

Gradients follow ``systems.py``: autograd, keeping a graph when grad mode is on and something they
depend on requires grad (``systems.grad_of``).

Size: continuous Lagrangians, their Legendre maps and the discrete Lagrangians built on them
are one concept at two levels; the variational integrators import both, and the map a composed
discrete Lagrangian generates (``ComposedDiscreteLagrangian.generate``) is their one step.
"""
from __future__ import annotations

import math
import numbers
from typing import Callable, Sequence

import torch

from ._autograd import batch_jacobian, grad_inputs, reaches_other_leaves
from ._validate import check_pair, find_singular, singular_threshold
from .maps import AlphaMap, DiscretizationMap
from .solvers import ConvergenceError, newton
from .systems import SeparableHamiltonian, System, call_signature, check_energy, takes_time, grad_of

Tensor = torch.Tensor

__all__ = ["SecondOrderSystem", "Lagrangian", "MechanicalLagrangian", "DegenerateLagrangianError",
           "DiscreteLagrangian", "ComposedDiscreteLagrangian", "check_fractions"]


# -- mass and damping matrices ---------------------------------------------------------------------

def check_psd(C: Tensor, what: str) -> None:
    """C (..., n, n) symmetric positive semidefinite to round-off, else ValueError."""
    C = C.detach()
    scale = float(C.abs().amax()) if C.numel() else 0.0
    tol = 100 * torch.finfo(C.dtype).eps * max(scale, 1e-300) * C.shape[-1]
    if float((C - C.mT).abs().amax()) > tol:
        raise ValueError(f"{what} must be symmetric (a Rayleigh damping ½vᵀCv), got an asymmetric matrix")
    low = float(torch.linalg.eigvalsh(C.double()).amin())
    if low < -tol:
        raise ValueError(f"{what} must be positive semidefinite (a damping dissipates energy), "
                         f"got an eigenvalue {low:.3e} < 0; a negative damping pumps energy in")


def constant_damping(damping) -> "ConstantMatrix":
    """A constant Rayleigh damping C (a number, a vector: diagonal, or an (n, n) matrix),
    checked: nonnegative, or symmetric positive semidefinite (a damping dissipates energy)."""
    C = ConstantMatrix(damping, invertible=False, name="damping")
    if C.kind == "full":
        check_psd(C.M, "the damping matrix C")
    elif bool((C.M < 0).any()):
        raise ValueError(f"the damping must be nonnegative (a damping dissipates energy), got "
                         f"{C.M.tolist()}; a negative damping pumps energy in")
    return C


class ConstantMatrix:
    """A constant linear operator on the coordinates: None (identity), a scalar, a vector
    (diagonal) or an (n, n) matrix.  As a mass (``invertible=True``) it is validated once (finite,
    not numerically singular) and M⁻¹ is formed once, because a constant M would otherwise be
    inverted at every step; as a damping it may be singular."""

    def __init__(self, mass, *, invertible: bool = True, name: str = "mass"):
        self.kind, self.M, self.Minv, self.scale = "identity", None, None, 1.0
        self._cast, self.name = {}, name
        if mass is None:
            return
        if isinstance(mass, bool):
            raise TypeError(f"{name} must be a number or a tensor, got a bool")
        if isinstance(mass, numbers.Real):
            # float64 whatever the default dtype: a float32 3.0⁻¹ capped float64 runs at 1e-8
            mass = torch.tensor(float(mass), dtype=torch.float64)
        if not isinstance(mass, torch.Tensor):
            raise TypeError(f"{name} must be None, a number, a vector or an (n, n) tensor, got "
                            f"{type(mass).__name__}")
        if not mass.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {mass.dtype}")
        if not bool(torch.isfinite(mass).all()):
            raise ValueError(f"{name} contains NaN or inf")
        if mass.dim() > 2 or (mass.dim() == 2 and mass.shape[0] != mass.shape[1]):
            raise ValueError(f"{name} must be a scalar, a vector (diagonal) or a square (n, n) "
                             f"matrix, got shape {tuple(mass.shape)}")
        self.kind = {0: "scalar", 1: "diag", 2: "full"}[mass.dim()]
        # max |M_ij|: the units of the momenta (variational steps divide their residuals by it;
        # all entries, not the diagonal: [[0, 1], [1, 0]] is a regular mass with a zero diagonal)
        self.scale = float(mass.detach().abs().max())
        if not invertible:
            self.M = mass      # a damping that requires grad keeps it (C is applied, not inverted)
            return
        if mass.requires_grad:
            raise ValueError(f"a constant {name} is inverted once at construction, so it cannot "
                             f"be differentiated; for a learned {name} use a module whose energy "
                             "takes it (e.g. tgi.nn.MechanicalHNN) or pass its value detached")
        self.M = mass
        if mass.dim() <= 1:
            a = mass.abs()
            if bool((a == 0).any()) or float(a.max() / a.min()) >= singular_threshold(a.numel(), mass.dtype):
                raise ValueError(f"the {name} matrix is singular: its diagonal {mass.tolist()} has "
                                 "a zero (or numerically zero) entry; q̈ = M⁻¹f needs an invertible M")
            self.Minv = 1.0 / self.M.double()   # in float64, cast to the state's dtype at use
            return
        cond = float(torch.linalg.cond(mass.detach().double()))
        if not math.isfinite(cond) or cond >= singular_threshold(mass.shape[0], mass.dtype):
            raise ValueError(f"the {name} matrix is singular (condition number {cond:.3e}); "
                             "q̈ = M⁻¹f needs an invertible M")
        if name == "mass" and float((mass - mass.mT).abs().max()) > 100 * torch.finfo(mass.dtype).eps * self.scale:
            # (½vᵀMv sees only the symmetric part: p = Mv would not be ∂L/∂v; indefinite but
            # regular masses, [[0, 1], [1, 0]], are Lagrangians too)
            raise ValueError(f"the mass matrix must be symmetric, got {mass.tolist()}")
        self.Minv = torch.linalg.inv(self.M.double())

    @property
    def n(self):
        return None if self.kind in ("identity", "scalar") else self.M.shape[0]

    def _check(self, x: Tensor):
        if self.n is not None and x.shape[-1] != self.n:
            raise ValueError(f"the {self.name} matrix is {self.n}x{self.n} but the state has "
                             f"{x.shape[-1]} coordinates (last dim of shape {tuple(x.shape)})")

    def _as(self, A, x):
        if A.dtype == x.dtype and A.device == x.device:
            return A
        if A.requires_grad:   # a learned damping: a cached cast would hold a stale graph
            return A.to(x)
        key = (id(A), x.dtype, x.device)   # cast once per dtype and device, not per step
        cast = self._cast.get(key)
        if cast is None:
            cast = self._cast[key] = A.to(x)
        return cast

    def solve(self, f: Tensor) -> Tensor:
        """M⁻¹ f, per sample (coordinates last)."""
        return self._times(self.Minv, f)

    def apply(self, v: Tensor) -> Tensor:
        """M v, per sample."""
        return self._times(self.M, v)

    def _times(self, A, x):
        """A x per sample for A = M or M⁻¹ (both of this operator's kind)."""
        if self.kind == "identity":
            return x
        self._check(x)
        A = self._as(A, x)
        return x @ A.mT if self.kind == "full" else x * A


def _check_state(q, v, names=("q", "v")):
    check_pair(q, v, names)


# -- second-order systems -------------------------------------------------------------------------
def _check_time_first(force) -> None:
    """force(t, q[, v]) takes t first: a force written force(q, v) (the order of ForcedSystem's
    F(q, z)) was read as force(t=q, q=v) and integrated another system without an error."""
    sig = call_signature(force)
    if sig is None:
        return
    first = next((p.name for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)), None)
    if first in ("q", "x", "v", "qdot", "q_dot", "dq", "z", "p"):
        names = ", ".join(sig.parameters)
        raise TypeError(f"force({names}): a SecondOrderSystem's force takes t first, force(t, q) or "
                        f"force(t, q, v) (its {first!r} would be read as t)")


class SecondOrderSystem(System):
    r"""The SODE Γ = v ∂_q + M⁻¹ f(t, q, v) ∂_v on TQ, i.e. q̈ = M⁻¹ f(t, q, q̇) (Sect. 4).

    ``force``: ``f(t, q, v) -> (..., n)``, or ``f(t, q)`` when it does not depend on the velocity
    (told by its signature; ``velocity_dependent`` overrides — with ``False`` a three-argument f
    is called with v = 0).  ``mass``: None (identity), a scalar, a vector (diagonal) or an (n, n)
    tensor, constant; a singular one raises ``ValueError``.  ``energy(q, v)``: pass ``energy`` or
    build the system with :meth:`from_potential`.

    The integrators' state is (q, v).  When f does not depend on v the system is ``separable``
    in the sense of ``systems.py`` (``velocity(v) = v``, ``force(q) = M⁻¹f(t, q)``), so the kick/
    drift methods of ``METHODS`` run on it too (``"verlet"`` is then velocity Verlet, i.e.
    central-difference Newmark).
    """

    def __init__(self, force: Callable, mass=None, *, velocity_dependent: bool | None = None,
                 energy: Callable | None = None):
        super().__init__()
        if not callable(force):
            raise TypeError("force must be callable as force(t, q, v) or force(t, q)")
        _check_time_first(force)
        takes_v = takes_time(force, 2, defaults_count=True)  # a third positional argument is v
        if not takes_v and not takes_time(force, 1, defaults_count=True):
            raise TypeError("force must be callable as force(t, q, v) or force(t, q)")
        self.f = force
        self._takes_v = takes_v
        self.velocity_dependent = takes_v if velocity_dependent is None else bool(velocity_dependent)
        if self.velocity_dependent and not takes_v:
            raise TypeError("velocity_dependent=True needs force(t, q, v)")
        self.separable = not self.velocity_dependent
        self._mass = ConstantMatrix(mass)
        self._energy = energy

    @classmethod
    def from_potential(cls, potential: Callable, mass=None, *, damping=None,
                       potential_grad: Callable | None = None) -> "SecondOrderSystem":
        r"""M q̈ = −∇V(q) − C q̇, with energy ½q̇ᵀMq̇ + V(q) (dissipated by C).

        ``damping`` C: None, a scalar, a vector (diagonal) or an (n, n) tensor."""
        if not callable(potential):
            raise TypeError("potential must be callable as potential(q)")
        C = None if damping is None else constant_damping(damping)

        def grad_V(q):
            if potential_grad is not None:
                return potential_grad(q)
            return grad_of(potential, (q,), "the potential", potential)[0]

        if C is None:
            def force(t, q):
                return -grad_V(q)
        else:
            def force(t, q, v):
                return -grad_V(q) - C.apply(v)
        system = cls(force, mass)

        def energy(q, v, t=0.0):
            V = check_energy(potential(q), q, "the potential", potential)
            return 0.5 * (v * system._mass.apply(v)).sum(-1) + V

        system._energy = energy
        system.potential = potential
        return system

    @property
    def mass(self) -> Tensor | None:
        return self._mass.M

    def mass_solve(self, f: Tensor) -> Tensor:
        """M⁻¹ f."""
        return self._mass.solve(f)

    def mass_apply(self, v: Tensor) -> Tensor:
        """M v (the momentum of a mechanical system)."""
        return self._mass.apply(v)

    def acceleration(self, q: Tensor, v: Tensor | None = None, t: float = 0.0) -> Tensor:
        """q̈ = M⁻¹ f(t, q, v); ``v`` may be None when f does not depend on it."""
        if self._takes_v:
            if v is None:
                if self.velocity_dependent:
                    raise ValueError("this force depends on the velocity: pass v")
                v = torch.zeros_like(q)
            f = self.f(t, q, v)
        else:
            f = self.f(t, q)
        if not isinstance(f, torch.Tensor) or f.shape != q.shape:
            got = tuple(f.shape) if isinstance(f, torch.Tensor) else type(f).__name__
            raise ValueError(f"force must return a tensor shaped like q {tuple(q.shape)}, got {got}")
        return self._mass.solve(f)

    def vector_field(self, q, v, t=0.0):
        return v, self.acceleration(q, v, t)

    def velocity(self, v, t=0.0):
        return v

    def force(self, q, t=0.0):
        if self.velocity_dependent:
            return super().force(q, t)
        return self.acceleration(q, None, t)

    def energy(self, q, v, t=0.0):
        if self._energy is None:
            raise NotImplementedError("pass energy=... or build the system with from_potential")
        return self._energy(q, v, t)


# -- Lagrangians ----------------------------------------------------------------------------------
class DegenerateLagrangianError(ValueError):
    """∂²L/∂v² is singular: no Legendre transform, no (discrete) Euler–Lagrange solve."""


class Lagrangian(System):
    r"""A Lagrangian L(q, v) or L(q, v, t) → (...,): pass ``fn`` or override ``lagrangian``.

    As a system its state is (q, p) with p = ∂L/∂v (the Legendre transform FL), so that
    variational integrators report (q, p) and compare with the Hamiltonian side:

        vector_field(q, p) = (v, ∂L/∂q(q, v)),   v = FL⁻¹(q, p)   (Hamilton's equations of H = p·v − L),

    with FL⁻¹ a Newton solve (closed form in :class:`MechanicalLagrangian`).  L must be regular
    (∂²L/∂v² invertible); where it is not, :class:`DegenerateLagrangianError` (a ``ValueError``)
    is raised.
    """

    def __init__(self, fn: Callable | None = None, *, time_dependent: bool | None = None):
        super().__init__()
        if fn is not None and not callable(fn):
            raise TypeError("fn must be callable as fn(q, v) or fn(q, v, t)")
        self.fn = fn
        target = fn if fn is not None else self.lagrangian
        self.time_dependent = takes_time(target, 2) if time_dependent is None else bool(time_dependent)

    @classmethod
    def mechanical(cls, potential: Callable, mass=None, *,
                   potential_grad: Callable | None = None) -> "MechanicalLagrangian":
        """L = ½vᵀMv − V(q)."""
        return MechanicalLagrangian(potential, mass, potential_grad=potential_grad)

    def lagrangian(self, q: Tensor, v: Tensor, t: float = 0.0) -> Tensor:
        if self.fn is None:
            raise NotImplementedError("pass fn or override lagrangian(q, v)")
        return self.fn(q, v, t) if self.time_dependent else self.fn(q, v)

    def L(self, q, v, t=0.0) -> Tensor:
        out = self.lagrangian(q, v, t) if self.time_dependent else self.lagrangian(q, v)
        if not isinstance(out, torch.Tensor) or out.shape != q.shape[:-1]:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"the Lagrangian must return one value per sample, shape "
                             f"{tuple(q.shape[:-1])}, got {got}")
        return out

    def forward(self, q, v, t=0.0):
        return self.L(q, v, t)

    def derivatives(self, q, v, t=0.0) -> tuple[Tensor, Tensor]:
        """(∂L/∂q, ∂L/∂v)."""
        return grad_of(lambda q_, v_: self.L(q_, v_, t), (q, v))

    def legendre(self, q, v, t=0.0) -> Tensor:
        """p = FL(q, v) = ∂L/∂v."""
        return self.derivatives(q, v, t)[1]

    def velocity_hessian(self, q, v, t=0.0) -> Tensor:
        """W = ∂²L/∂v², (..., n, n)."""
        keep = torch.is_grad_enabled()
        with torch.enable_grad():
            vv, = grad_inputs((v,), keep)
            qq = q if keep else q.detach()
            L = self.L(qq, vv, t).sum()
            if keep and not (q.requires_grad or v.requires_grad):
                keep = reaches_other_leaves(L, (vv,))
            (Lv,) = torch.autograd.grad(L, vv, create_graph=True)
            return batch_jacobian(Lv, vv, keep)

    def momentum_scale(self, q, v, t=0.0) -> Tensor:
        """A per-sample mass scale (..., 1): max |∂²L/∂v²| over its entries at (q, v), no graph.
        The variational steps divide their momentum residuals by it, so that Newton's test
        |r| ≤ tol (1 + |v|) compares velocities with velocities (a Lagrangian scaled by k, the
        same motion in other units, would otherwise leave a momentum residual of round-off
        eps·k|v| above the tolerance)."""
        with torch.no_grad():
            W = self.velocity_hessian(q.detach(), v.detach(), t)
        # all entries, not the diagonal: L = v₁v₂ − V is regular with a zero diagonal
        return W.abs().flatten(-2).amax(-1, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny)

    def check_regular(self, q, v, t=0.0) -> None:
        """Raise :class:`DegenerateLagrangianError` where ∂²L/∂v² is (numerically) singular."""
        with torch.no_grad():
            W = self.velocity_hessian(q, v, t)
        found = find_singular(W, q.dtype)
        if found is not None:
            count, total, worst = found
            raise DegenerateLagrangianError(
                f"the Lagrangian is degenerate: its velocity Hessian ∂²L/∂v² is singular at "
                f"{count} of {total} sample(s) (condition number {worst:.3e}); "
                "the Legendre transform and the discrete Euler–Lagrange equations need a regular "
                "Lagrangian")

    def inverse_legendre(self, q, p, t=0.0, v0: Tensor | None = None) -> Tensor:
        """v with ∂L/∂v(q, v) = p: Newton from ``v0`` (default 0), differentiable (IFT).  The
        residual is divided by the mass scale (:meth:`momentum_scale` at v0), so the test compares
        velocities with velocities: L and k·L give the same v."""
        _check_state(q, p, ("q", "p"))
        v0 = torch.zeros_like(p) if v0 is None else v0.detach()
        mu = self.momentum_scale(q, v0, t)

        def residual(v, q, p):   # (q, p): the solver's args (see solvers' note on args)
            return (self.legendre(q, v, t) - p) / mu

        try:
            return newton(residual, v0, args=(q, p))
        except ConvergenceError:
            self.check_regular(q, v0, t)
            raise

    def vector_field(self, q, p, t=0.0):
        v = self.inverse_legendre(q, p, t)
        return v, self.derivatives(q, v, t)[0]

    def energy(self, q, p, t=0.0):
        """H(q, p) = p·v − L(q, v), v = FL⁻¹(q, p)."""
        v = self.inverse_legendre(q, p, t)
        return (p * v).sum(-1) - self.L(q, v, t)

    def lagrangian_energy(self, q, v, t=0.0):
        """E_L(q, v) = v·∂L/∂v − L."""
        return (v * self.legendre(q, v, t)).sum(-1) - self.L(q, v, t)

    def sode(self) -> SecondOrderSystem:
        r"""The Euler–Lagrange equations as a SODE on TQ: W q̈ = ∂L/∂q − (∂²L/∂v∂q) q̇,
        W = ∂²L/∂v² (time-independent L; the step integrators of Sect. 4 then apply)."""
        if self.time_dependent:
            raise NotImplementedError("sode() needs a time-independent Lagrangian")

        def force(t, q, v):
            keep = torch.is_grad_enabled()
            with torch.enable_grad():
                qq, vv = grad_inputs((q, v), keep)
                L = self.L(qq, vv).sum()
                if keep and not (q.requires_grad or v.requires_grad):
                    keep = reaches_other_leaves(L, (qq, vv))
                Lq, Lv = torch.autograd.grad(L, (qq, vv), create_graph=True)
                # (∂²L/∂v∂q)·v = ∂/∂v (∂L/∂q · v̂) with v̂ held fixed: one reverse pass.
                mixed = torch.autograd.grad((Lq * vv.detach()).sum(), vv, create_graph=keep,
                                            retain_graph=True, allow_unused=True)[0]  # W next
                mixed = torch.zeros_like(vv) if mixed is None else mixed
                W = batch_jacobian(Lv, vv, keep)
                rhs = Lq if keep else Lq.detach()
            try:
                return torch.linalg.solve(W, (rhs - mixed).unsqueeze(-1)).squeeze(-1)
            except torch.linalg.LinAlgError as err:     # (the variational steps name it so)
                raise DegenerateLagrangianError(
                    "the Lagrangian is degenerate: its velocity Hessian ∂²L/∂v², which .sode() "
                    f"solves for the accelerations, is singular ({err}); a degenerate L has no "
                    "second-order equations") from None

        return SecondOrderSystem(force, None, velocity_dependent=True,
                                 energy=lambda q, v, t=0.0: self.lagrangian_energy(q, v))


class MechanicalLagrangian(Lagrangian):
    r"""L(q, v) = ½vᵀMv − V(q), M constant and invertible: FL(q, v) = Mv, FL⁻¹(q, p) = M⁻¹p,
    H = ½pᵀM⁻¹p + V(q) (:meth:`hamiltonian_system`), separable (the kick/drift methods of
    ``METHODS`` run on it directly)."""

    separable = True

    def __init__(self, potential: Callable, mass=None, *, potential_grad: Callable | None = None):
        if not callable(potential):
            raise TypeError("potential must be callable as potential(q)")
        super().__init__(None, time_dependent=False)
        self.potential, self.potential_grad = potential, potential_grad
        self._mass = ConstantMatrix(mass)

    def _V(self, q):
        # (one value per sample: a keepdim V broadcast ½vᵀMv − V to (B, B), mixing samples)
        return check_energy(self.potential(q), q, "the potential", self.potential)

    def lagrangian(self, q, v, t=0.0):
        return 0.5 * (v * self._mass.apply(v)).sum(-1) - self._V(q)

    def momentum_scale(self, q, v, t=0.0) -> Tensor:
        """max |M_ij|: the constant mass's scale (:meth:`Lagrangian.momentum_scale`)."""
        return q.new_full((*q.shape[:-1], 1), self._mass.scale)

    def grad_V(self, q):
        if self.potential_grad is not None:
            return self.potential_grad(q)
        return grad_of(self.potential, (q,), "the potential", self.potential)[0]

    def derivatives(self, q, v, t=0.0):
        return -self.grad_V(q), self._mass.apply(v)

    def velocity_hessian(self, q, v, t=0.0):
        n = q.shape[-1]
        eye = torch.eye(n, dtype=q.dtype, device=q.device)
        return self._mass.apply(eye).mT.expand(*q.shape[:-1], n, n)

    def inverse_legendre(self, q, p, t=0.0, v0=None):
        _check_state(q, p, ("q", "p"))
        return self._mass.solve(p)

    def velocity(self, p, t=0.0):
        return self._mass.solve(p)

    def force(self, q, t=0.0):
        return -self.grad_V(q)

    def vector_field(self, q, p, t=0.0):
        return self._mass.solve(p), -self.grad_V(q)

    def energy(self, q, p, t=0.0):
        return 0.5 * (p * self._mass.solve(p)).sum(-1) + self._V(q)

    def hamiltonian_system(self) -> SeparableHamiltonian:
        """The Legendre-transformed H = ½pᵀM⁻¹p + V(q) as a SeparableHamiltonian."""
        mass = self._mass
        return SeparableHamiltonian(lambda p: 0.5 * (p * mass.solve(p)).sum(-1), self.potential,
                                    kinetic_grad=mass.solve, potential_grad=self.potential_grad)

    def sode(self) -> SecondOrderSystem:
        return SecondOrderSystem.from_potential(self.potential, self._mass.M,
                                                potential_grad=self.potential_grad)


# -- discrete Lagrangians -------------------------------------------------------------------------
class DiscreteLagrangian:
    r"""L_d^h(q₀, q₁) = h·L(q̄, w/h),  (q̄, w) = R_d⁻¹(q₀, q₁)  (Sect. 5.3; THEORY §7).

    R_d⁻¹ returns a base point and a velocity part: only the velocity part is divided by h.
    Its partial derivatives come from the chain rule at the base point, DR_d(q̄, w)ᵀ(D₁L_d, D₂L_d)
    = (h ∂L/∂q, ∂L/∂v) — the cotangent-lift solve of ``maps.py``, so no derivative is taken
    through a Newton inverse.  For R_d in the α-family and L = ½vᵀMv − V it is the classical
    L_d = h[½((q₁−q₀)/h)ᵀM((q₁−q₀)/h) − V((1−α)q₀ + αq₁)].
    Time: L is evaluated at t + αh (α of R_d, ½ for a map without one).
    """

    def __init__(self, L: Lagrangian, R: DiscretizationMap):
        if not isinstance(L, Lagrangian):
            raise TypeError(f"a discrete Lagrangian needs a Lagrangian, got {type(L).__name__}")
        if not isinstance(R, DiscretizationMap):
            raise TypeError(f"a discrete Lagrangian needs a DiscretizationMap, got {type(R).__name__}")
        self.L, self.R = L, R
        self.alpha = R.base_fraction

    def __call__(self, q0: Tensor, q1: Tensor, h: float, t: float = 0.0) -> Tensor:
        qb, w = self.R.inverse(q0, q1)
        return h * self.L.L(qb, w / h, t + self.alpha * h)

    def at_base(self, qb: Tensor, w: Tensor, h: float, t: float = 0.0, *, ends: bool = True):
        """(q₀, q₁, D₁L_d, D₂L_d) for the pair (q₀, q₁) = R_d(q̄, w) (the ends are None when
        ``ends=False``)."""
        Lq, Lv = self.L.derivatives(qb, w / h, t + self.alpha * h)
        D1, D2 = self.R.solve_vjp(qb, w, h * Lq, Lv)
        q0, q1 = self.R.forward_unchecked(qb, w) if ends else (None, None)
        return q0, q1, D1, D2

    def derivatives(self, q0: Tensor, q1: Tensor, h: float, t: float = 0.0) -> tuple[Tensor, Tensor]:
        """(D₁L_d(q₀, q₁), D₂L_d(q₀, q₁))."""
        qb, w = self.R.inverse(q0, q1)
        return self.at_base(qb, w, h, t)[2:]

    def momenta(self, q0, q1, h, t=0.0) -> tuple[Tensor, Tensor]:
        """Discrete Legendre transforms (p₀, p₁) = (−D₁L_d(q₀, q₁), D₂L_d(q₀, q₁))."""
        D1, D2 = self.derivatives(q0, q1, h, t)
        return -D1, D2

    def euler_lagrange(self, q_prev, q, q_next, h, t=0.0) -> Tensor:
        """D₁L_d(q_k, q_{k+1}) + D₂L_d(q_{k−1}, q_k); t is the time of q_{k−1}."""
        return self.derivatives(q, q_next, h, t + h)[0] + self.derivatives(q_prev, q, h, t)[1]


def check_fractions(maps, fractions):
    """(maps, fractions) checked: DiscretizationMaps, one finite nonzero fraction each, summing to
    1 (``None``: equal fractions)."""
    maps = list(maps)
    if not maps:
        raise ValueError("need at least one discretization map")
    for R in maps:
        if not isinstance(R, DiscretizationMap):
            raise TypeError(f"expected DiscretizationMaps, got {type(R).__name__}")
    fractions = [1.0 / len(maps)] * len(maps) if fractions is None else [float(c) for c in fractions]
    if len(fractions) != len(maps):
        raise ValueError(f"need one step fraction per map: {len(maps)} maps, {len(fractions)} fractions")
    if not all(math.isfinite(c) and c != 0.0 for c in fractions):
        raise ValueError(f"step fractions must be finite and nonzero, got {fractions}")
    if abs(math.fsum(fractions) - 1.0) > 1e-12:
        raise ValueError(f"step fractions must sum to 1, got {math.fsum(fractions)!r}")
    return maps, fractions


class ComposedDiscreteLagrangian:
    r"""L_d(q₀, q_s) = Σᵢ L_d^{(i)}(q_{i−1}, q_i; cᵢh), the interior points q₁ … q_{s−1} solved
    for from the interior discrete Euler–Lagrange equations
    D₂L_d^{(i)}(q_{i−1}, q_i) + D₁L_d^{(i+1)}(q_i, q_{i+1}) = 0 (Sect. 6: the composition of the
    Lagrangian submanifolds; α = 0 then α = 1 at h/2 generates Störmer–Verlet).
    By stationarity (envelope theorem) D₁L_d = D₁L_d^{(1)}(q₀, q₁), D₂L_d = D₂L_d^{(s)}(q_{s−1}, q_s).

    Two ways in.  From the end points (``__call__``, ``interior``, ``derivatives``, ``momenta``):
    the maps need a closed-form inverse (the interior solve differentiates D L_d^{(i)} again).
    From (q₀, p₀) (:meth:`generate`, the map (q₀, p₀) ↦ (q_s, p_s) that L_d generates, which is
    the step of :class:`~torchgeo_int.VariationalIntegrator`): every stage is written at its base
    point, so any map will do; ``ends=False`` builds it for that use without asking for closed-form
    inverses (the end-point methods then raise if a map lacks one).
    """

    def __init__(self, L: Lagrangian, maps: Sequence[DiscretizationMap], fractions=None, *,
                 ends: bool = True):
        maps, fractions = check_fractions(maps, fractions)
        self.ends = all(R.has_closed_inverse for R in maps)   # the end-point form is available
        if ends and not self.ends:
            raise ValueError("ComposedDiscreteLagrangian needs maps with a closed-form inverse "
                             "(AlphaMap, RetractionMap(..., inverse=...))")
        self.maps = maps
        self.terms = [DiscreteLagrangian(L, R) for R in maps]
        self.fractions = fractions
        self.starts = [math.fsum(fractions[:i]) for i in range(len(fractions))]

    def _need_ends(self):
        if not self.ends:
            raise ValueError("the end-point form of a ComposedDiscreteLagrangian needs maps with a "
                             "closed-form inverse (this one was built with ends=False, for generate)")

    def interior(self, q0, qs, h, t=0.0, guess=None) -> list[Tensor]:
        """The stationary interior points [q₁, …, q_{s−1}] for the end points (q₀, q_s)."""
        self._need_ends()
        check_pair(q0, qs, ("q0", "qs"))
        s = len(self.terms)
        if s == 1:
            return []
        c, a = self.fractions, self.starts
        # D₂ + D₁ are momenta, the unknowns positions: divided by μ/h (μ the mass scale) the
        # residual is in position units, so L and k·L give the same points
        mu = self.terms[0].L.momentum_scale(q0, (qs - q0) / h, t) / abs(h)

        def residual(z, q0, qs):   # (q0, qs): the solver's args (see solvers' note on args)
            pts = [q0, *z, qs]
            out = []
            for i in range(1, s):
                D2 = self.terms[i - 1].derivatives(pts[i - 1], pts[i], c[i - 1] * h, t + a[i - 1] * h)[1]
                D1 = self.terms[i].derivatives(pts[i], pts[i + 1], c[i] * h, t + a[i] * h)[0]
                out.append((D2 + D1) / mu)
            return tuple(out)

        if guess is None:
            guess = tuple((q0 + a[i] * (qs - q0)).detach() for i in range(1, s))
        return list(newton(residual, tuple(guess), args=(q0, qs)))

    def __call__(self, q0, qs, h, t=0.0) -> Tensor:
        pts = [q0, *self.interior(q0, qs, h, t), qs]
        return sum(term(pts[i], pts[i + 1], c * h, t + a * h)
                   for i, (term, c, a) in enumerate(zip(self.terms, self.fractions, self.starts)))

    def derivatives(self, q0, qs, h, t=0.0) -> tuple[Tensor, Tensor]:
        pts = [q0, *self.interior(q0, qs, h, t), qs]
        c, a = self.fractions, self.starts
        D1 = self.terms[0].derivatives(pts[0], pts[1], c[0] * h, t)[0]
        D2 = self.terms[-1].derivatives(pts[-2], pts[-1], c[-1] * h, t + a[-1] * h)[1]
        return D1, D2

    def momenta(self, q0, qs, h, t=0.0) -> tuple[Tensor, Tensor]:
        D1, D2 = self.derivatives(q0, qs, h, t)
        return -D1, D2

    # -- from (q₀, p₀): the generated map, in base-point unknowns --------------------------------
    def generate(self, q0, p0, h, t, v0, options, constraint=None, scale=None) -> tuple[Tensor, Tensor]:
        r"""(q_s, p_s) with p₀ = −D₁L_d(q₀, q_s), p_s = D₂L_d(q₀, q_s): the discrete Legendre
        transforms solved jointly with the interior equations, by ``options`` (a
        :class:`~torchgeo_int.solvers.SolveOptions`; its ``root``), from the velocity guess v0.

        Stage i covers [t + aᵢh, t + (aᵢ + cᵢ)h] with the pair (q_{i−1}, q_i) = R_i(q̄ᵢ, wᵢ).
        Unknowns: for an α-map the discrete velocity uᵢ = (q_i − q_{i−1})/(cᵢh), so that
        q̄ᵢ = q_{i−1} + αcᵢh uᵢ and wᵢ = cᵢh uᵢ; for any other map the base point (q̄ᵢ, wᵢ) itself,
        with the extra equation R¹ᵢ(q̄ᵢ, wᵢ) = q_{i−1}.  Either way L_d's derivatives are taken at
        the base point, never through (q_i − q_{i−1})/h (which loses digits in float32) nor
        through a Newton inverse.

        ``constraint = (G₀, g)`` (holonomic constraints, ``torchgeo_int.constraints``): one more
        unknown, the multiplier ν (..., m); p₀ becomes p₀ − G₀ᵀν in the first equation and
        g(q_s) = 0 joins the system.

        The momentum equations are divided by the mass scale μ (velocity units, as the unknowns)
        and the multiplier taken as ν = μ ν′, so Newton's tolerance does not depend on the units:
        ``scale`` = μ (..., 1), which the variational steps compute once a rollout
        (:meth:`Lagrangian.momentum_scale`) and carry in their cache; None: computed here."""
        maps, c = self.maps, self.fractions
        mu = self.terms[0].L.momentum_scale(q0, v0, t) if scale is None else scale

        def residual(z, q, p, *G):   # (q, p[, G₀]): the solver's args (solvers' note on args)
            if G:
                z, nu = z[:-1], z[-1]
                p = p - mu * (G[0].mT @ nu.unsqueeze(-1)).squeeze(-1)
            st = self._stages(self._unflat(z), q, h, t)
            res, prev_D2 = [], p  # p₀ + D₁L_d¹ = 0, then D₂L_d^{i−1} + D₁L_dⁱ = 0
            for i, (_, D1, D2, extra) in enumerate(st):
                res.append((prev_D2 + D1 if i else p + D1) / mu)
                if extra is not None:
                    res.append(extra)
                prev_D2 = D2
            if G:
                res.append(constraint[1](st[-1][0]))
            return tuple(res)

        z0, start = [], q0.detach()
        for i, R in enumerate(maps):
            w = c[i] * h * v0
            if isinstance(R, AlphaMap):
                z0.append(v0)
            else:
                z0 += [(start + R.base_fraction * w).detach(), w.detach()]
            start = start + w
        args = (q0, p0)
        if constraint is not None:
            z0.append(q0.new_zeros(constraint[0].shape[:-1]))
            args = (q0, p0, constraint[0])
        z = options.root(residual, tuple(z0), args)
        if constraint is not None:
            z = z[:-1]
        st = self._stages(self._unflat(z), q0, h, t)
        return st[-1][0], st[-1][2]

    def _stages(self, z, q0, h, t):
        """Per stage: (end point, D₁L_d, D₂L_d, extra residual or None)."""
        c, a = self.fractions, self.starts
        out, start = [], q0
        for i, (term, R) in enumerate(zip(self.terms, self.maps)):
            hs, ts = c[i] * h, t + a[i] * h
            if isinstance(R, AlphaMap):
                w = hs * z[i]
                qb, y0, end = start + R.alpha * w, None, start + w
            else:
                qb, w = z[i]
                y0, end = R.forward_unchecked(qb, w)
            _, _, D1, D2 = term.at_base(qb, w, hs, ts, ends=False)
            out.append((end, D1, D2, None if y0 is None else y0 - start))
            start = end
        return out

    def _unflat(self, z):
        """The flat tuple of unknowns, regrouped per stage (α-map: u; other: (q̄, w))."""
        out, j = [], 0
        for R in self.maps:
            if isinstance(R, AlphaMap):
                out.append(z[j])
                j += 1
            else:
                out.append((z[j], z[j + 1]))
                j += 2
        return out
