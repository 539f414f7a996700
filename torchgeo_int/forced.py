r"""Forced, dissipative and controlled systems: the discrete Lagrange–d'Alembert principle and the
forced cotangent-lift step, with the discrete force taken from the same discretization map.

A force F(q, z, t, u) — z = p on a Hamiltonian, v on a Lagrangian — plus a Rayleigh damping −C v
(C ⪰ 0, constant or C(q)) plus an input map G(q)·u(t) for a control u is added to the dynamics:

    Hamiltonian side   q̇ = ∂H/∂p,   ṗ = −∂H/∂q + F_tot,         F_tot = F − C ∂H/∂p + G u,
    Lagrangian side    d/dt ∂L/∂v − ∂L/∂q = F_tot(q, v, t),      F_tot = F − C v + G u.

(For the damping and the input map this is the port-Hamiltonian form ẋ = (J − R)∇H + Bu with
R = diag(0, C), B = (0, G).)

**Hamiltonian side: the forced cotangent-lift step.**  Eq. (20) of the seed paper with the force
in the tangent: (x_k; x_{k+1}) = R_d^{T*}(x̄, h(X_H + F_tot^v)(x̄)), F^v = (0, F_tot) the vertical
lift.  It is what every integrator of the library computes on :class:`ForcedSystem`, whose
``vector_field`` is X_H + F^v: the α-maps give, with the stage k as unknown,
k = (X_H + F^v)(q_k + αh k_q, p_k + (1−α)h k_p), α = ½ the forced implicit midpoint rule;
compositions (Störmer–Verlet = α = 0 then α = 1 at h/2, the tables of ``TABLES``) compose the
forced steps.  Order: the base method's (the methods are those of a first-order ODE on T*Q).
When the force does not depend on p (no damping, ``velocity_dependent=False``) and H is separable,
the forced system is separable and the kick/drift paths stay explicit.

**Lagrangian side: discrete Lagrange–d'Alembert** (Marsden & West, Acta Numerica 2001, §3.2):
δΣ L_d(q_k, q_{k+1}) + Σ [f_d^−(q_k, q_{k+1})·δq_k + f_d^+(q_k, q_{k+1})·δq_{k+1}] = 0, with the
discrete forces from the map: ∫ F·δq dt ≈ h F̄·δq̄, q̄ the base point of (q̄, w) = R_d⁻¹(q_k, q_{k+1}),
F̄ = F_tot(q̄, w/h, t + αh), so that

    DR_d(q̄, w)ᵀ (f_d^−, f_d^+) = (h F̄, 0),      i.e. for the α-family  f_d^− = (1−α) h F̄,  f_d^+ = α h F̄,

the same solve as the one that gives (D₁L_d, D₂L_d) from (h ∂L/∂q, ∂L/∂v): the forced discrete
equations are those of ``VariationalIntegrator`` with ∂L/∂q replaced by ∂L/∂q + F_tot at the base
point (:class:`ForcedVariationalIntegrator`).  Forced discrete Legendre transforms:
p_k = −D₁L_d − f_d^−,  p_{k+1} = D₂L_d + f_d^+.  For L = ½vᵀMv − V and the midpoint map both sides
give the same step (the same force written on v = M⁻¹p; tested with M = I).

**Discrete energy balance.**  With the midpoint map (α = ½) on H = ½pᵀM⁻¹p + V(q) (any M, any
force, damping and control): p̄ = (p_k + p_{k+1})/2 = M(q_{k+1} − q_k)/h, so the kinetic energy
changes by exactly (Δq/h)·Δp and

    E_{k+1} − E_k = W_k + D_k,    W_k = F̄·(q_{k+1} − q_k)   (:func:`discrete_work`),
    D_k = V(q_{k+1}) − V(q_k) − ∇V(q̄)·(q_{k+1} − q_k),

an identity of the step, so it holds as well as the step's equations are solved: to round-off
where they are linear in the unknown, to the solver's tolerance otherwise (a force nonlinear in v
on the Lagrangian side); D_k = 0 for quadratic V (and for any quadratic H with the forced
implicit midpoint), O(|Δq|³) otherwise — the energy error of the unforced
midpoint rule.  With Rayleigh damping alone W_k = −h v̄ᵀC v̄ ≤ 0: the discrete energy of a linear
system never increases.
"""
from __future__ import annotations

import inspect
from typing import Callable

import torch
from torch import nn

from ._validate import (cannot_tell, check_finite, check_nonzero, check_pair, check_scalar, time_axis,
                        timed_call)
from .integrators.registry import register
from .integrators.variational import VariationalIntegrator
from .lagrangian import Lagrangian, SecondOrderSystem, check_psd, constant_damping
from .maps import AlphaMap
from .systems import TIME_NAMES, ODESystem, System

Tensor = torch.Tensor

__all__ = ["ForcedSystem", "ForcedVariationalIntegrator", "discrete_work", "FORCED_VARIATIONAL_METHODS"]


#: the names that make a defaulted parameter of F(q, z, t, u) one of z, t, u (else a constant)
_SLOT_NAMES = (("q",), ("z", "p", "v"), TIME_NAMES, ("u", "control"))


def _arity(fn: Callable) -> int:
    """How many of (q, z, t, u) F takes: its leading positional parameters, a parameter with a
    default counted only when named as its slot is (``F(q, z, c=0.3)`` has a constant c, not a
    time, as ``systems.takes_time`` reads ``H(q, p, omega=2.0)``); VAR_POSITIONAL takes all 4."""
    try:
        sig = inspect.signature(fn.forward if isinstance(fn, nn.Module) else fn)
    except (TypeError, ValueError):
        return 4
    params = list(sig.parameters.values())
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return 4
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    n = 0
    for p in positional:
        if p.default is not p.empty and (n >= len(_SLOT_NAMES) or p.name not in _SLOT_NAMES[n]):
            break
        n += 1
    return n


class ForcedSystem(System):
    r"""A Hamiltonian or Lagrangian system with a force, a Rayleigh damping and a control input.

    ``system``: a Hamiltonian-like :class:`~torchgeo_int.System` on (q, p) (Hamiltonian,
    SeparableHamiltonian, an HNN) or a :class:`~torchgeo_int.Lagrangian` (state (q, p), p = ∂L/∂v).
    ``force``: ``F(q)``, ``F(q, z)``, ``F(q, z, t)`` or ``F(q, z, t, u)`` → (..., n), z = p for a
    Hamiltonian system and v for a Lagrangian one (told by the number of positional parameters;
    one with a default is a constant unless named z/p/v, t/time/tau or u/control in its place);
    ``velocity_dependent`` (default: F takes z) says whether F depends on z.
    ``damping``: C in F = −C v, v = ∂H/∂p (or the Lagrangian velocity): a number, a vector
    (diagonal), a symmetric (n, n) matrix, or a callable C(q) → (..., n, n); it must be positive
    semidefinite (checked at construction for a constant, on the first call for a callable).
    ``input_map``: G, an (n, k) tensor or a callable G(q) → (..., n, k); ``control``: u, a tensor
    (k,) or (*batch, k), or a callable u(t) returning one; F_tot gains G(q)·u(t).
    The control may be replaced between rollouts (``system.control = u``).
    """

    def __init__(self, system: System, force: Callable | None = None, *, damping=None,
                 input_map=None, control=None, velocity_dependent: bool | None = None):
        super().__init__()
        if isinstance(system, (ODESystem, SecondOrderSystem)) or getattr(system, "first_order", False):
            raise TypeError("ForcedSystem takes a Hamiltonian system or a Lagrangian on (q, p); "
                            f"got {type(system).__name__} (a SecondOrderSystem takes its force directly)")
        if not isinstance(system, System):
            raise TypeError(f"system must be a torchgeo_int System, got {type(system).__name__}")
        self.system = system
        self.lagrangian_side = isinstance(system, Lagrangian)
        if force is not None and not callable(force):
            raise TypeError("force must be callable as F(q[, z[, t[, u]]])")
        self.force_fn = force
        self._force_arity = _arity(force) if force is not None else 0
        if force is not None and not 1 <= self._force_arity <= 4:
            raise TypeError("force must be callable as F(q), F(q, z), F(q, z, t) or F(q, z, t, u)")
        self._damping_fn, self._damping_const, self._damping_checked = None, None, False
        if damping is not None:
            if callable(damping):
                self._damping_fn = damping
            else:
                self._damping_const = constant_damping(damping)
        self._input_fn, self._input_const = None, None
        if input_map is not None:
            if callable(input_map):
                self._input_fn = input_map
            else:
                if not isinstance(input_map, torch.Tensor) or input_map.dim() != 2:
                    raise ValueError("input_map must be an (n, k) tensor or a callable G(q) -> (..., n, k)")
                if not input_map.is_floating_point():
                    raise TypeError(f"input_map must be floating point, got {input_map.dtype}")
                check_finite(input_map, "input_map")
                self._input_const = input_map
        self.control = control
        if input_map is None and control is not None and self._force_arity < 4:
            raise ValueError("a control was given but nothing uses it: pass input_map=G or a "
                             "force F(q, z, t, u)")
        takes_z = self._force_arity >= 2
        self.force_velocity_dependent = takes_z if velocity_dependent is None else bool(velocity_dependent)
        self.velocity_dependent = self.force_velocity_dependent or damping is not None
        self.separable = bool(getattr(system, "separable", False)) and not self.velocity_dependent
        self.force_sign = getattr(system, "force_sign", 1.0)

    @property
    def time_dependent(self) -> bool:
        """Whether the forces depend on t: read at each use, since ``control`` may be replaced
        by a callable u(t) after construction (``PortHamiltonianNN``'s losses do)."""
        return bool(getattr(self.system, "time_dependent", False) or self._force_arity >= 3
                    or callable(self.control))

    # -- the generalized force ----------------------------------------------------------------
    def control_at(self, t: float):
        """u(t) (or None)."""
        u = self.control
        if u is None:
            return None
        u = timed_call(u, "the control u(t)", t, t) if callable(u) else u
        if not isinstance(u, torch.Tensor):
            raise TypeError(f"the control must be a tensor (k,) or (*batch, k), got {type(u).__name__}")
        return u

    def _damping_matrix(self, q):
        C = self._damping_fn(q)
        if not isinstance(C, torch.Tensor) or C.shape[-2:] != (q.shape[-1], q.shape[-1]):
            got = tuple(C.shape) if isinstance(C, torch.Tensor) else type(C).__name__
            raise ValueError(f"damping(q) must return (..., {q.shape[-1]}, {q.shape[-1]}), got {got}")
        if not self._damping_checked:
            check_psd(C, "damping(q)")
            self._damping_checked = True
        return C

    def _input(self, q, u):
        n = q.shape[-1]
        G = self._input_fn(q) if self._input_fn is not None else self._input_const
        if not isinstance(G, torch.Tensor) or G.dim() < 2 or G.shape[-2] != n:
            got = tuple(G.shape) if isinstance(G, torch.Tensor) else type(G).__name__
            raise ValueError(f"the input map must be (..., {n}, k), got {got}")
        k = G.shape[-1]
        if u is None:
            raise ValueError("an input map was given but no control: set control=u")
        if u.dim() < 1 or u.shape[-1] != k:
            raise ValueError(f"the control must have shape (k,) or (*batch, k) with k = {k} (the "
                             f"input map is {n}x{k}), got {tuple(u.shape)}")
        try:
            ok = torch.broadcast_shapes(u.shape[:-1], q.shape[:-1]) == q.shape[:-1]
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"the control's batch shape {tuple(u.shape[:-1])} does not match the "
                             f"state's {tuple(q.shape[:-1])}")
        return torch.broadcast_to((G.to(q) @ u.to(q).unsqueeze(-1)).squeeze(-1), q.shape)

    def generalized_force(self, q: Tensor, z: Tensor, v: Tensor, t: float = 0.0) -> Tensor:
        """F_tot(q, z, t) = F(q, z, t, u(t)) − C v + G(q) u(t): z is the state's second
        variable (p or v), v the velocity (∂H/∂p or v)."""
        u = self.control_at(t)
        F = None
        if self.force_fn is not None:
            args = (q, z, t, u)[:self._force_arity]
            F = (timed_call(self.force_fn, "the force F(q, z, t)", t, *args)
                 if self._force_arity >= 3 else self.force_fn(*args))
            if not isinstance(F, torch.Tensor) or F.shape != q.shape:
                got = tuple(F.shape) if isinstance(F, torch.Tensor) else type(F).__name__
                raise ValueError(f"the force must return a tensor shaped like q {tuple(q.shape)}, got {got}")
        if self._damping_const is not None:
            d = -self._damping_const.apply(v)
            F = d if F is None else F + d
        elif self._damping_fn is not None:
            d = -(self._damping_matrix(q) @ v.unsqueeze(-1)).squeeze(-1)
            F = d if F is None else F + d
        if self._input_const is not None or self._input_fn is not None:
            g = self._input(q, u)
            F = g if F is None else F + g
        elif u is not None and self._force_arity < 4:
            raise ValueError("a control is set but nothing uses it")
        return torch.zeros_like(q) if F is None else F

    # -- the System interface -----------------------------------------------------------------
    def vector_field(self, q, p, t=0.0):
        """X_H + (0, F_tot): the field every integrator of the library steps (eq. (20) with the
        force in the tangent)."""
        dq, dp = self.system.vector_field(q, p, t)
        return dq, dp + self.generalized_force(q, dq if self.lagrangian_side else p, dq, t)

    def velocity(self, p, t=0.0):
        return self.system.velocity(p, t)

    def force_term(self, q, t=0.0):
        # force = sign·force_term: adding F_tot to the force adds sign·F_tot to the term (sign ±1,
        # so a zero force leaves the term's bits unchanged).
        zero = torch.zeros_like(q)
        return self.system.force_term(q, t) + self.force_sign * self.generalized_force(q, zero, zero, t)

    def force(self, q, t=0.0):
        zero = torch.zeros_like(q)
        return self.system.force(q, t) + self.generalized_force(q, zero, zero, t)

    def energy(self, q, p, t=0.0):
        return self.system.energy(q, p, t)


class _ForcedLagrangian(Lagrangian):
    """The Lagrangian whose ∂L/∂q carries F_tot: what the discrete equations of a forced
    variational step differentiate (see module docstring).  Only ``derivatives`` enters them."""

    def __init__(self, forced: ForcedSystem):
        super().__init__(None, time_dependent=True)
        object.__setattr__(self, "_forced", forced)   # not a submodule: no cycle in the tree

    def lagrangian(self, q, v, t=0.0):
        return self._forced.system.L(q, v, t)

    def derivatives(self, q, v, t=0.0):
        Lq, Lv = self._forced.system.derivatives(q, v, t)
        return Lq + self._forced.generalized_force(q, v, v, t), Lv


class ForcedVariationalIntegrator(VariationalIntegrator):
    r"""The discrete Lagrange–d'Alembert integrator of L_d^h = h·L(R_d⁻¹/h) with the discrete
    forces f_d^± of the same map (module docstring; Marsden & West 2001, §3.2), on the state
    (q, p) of a :class:`ForcedSystem` over a :class:`~torchgeo_int.Lagrangian` (a plain
    Lagrangian runs unforced).  Same arguments, solver and order as
    :class:`~torchgeo_int.VariationalIntegrator` (2 for a symmetric map or [α, 1 − α] at h/2);
    with a zero force it computes the unforced step, bit for bit."""

    variant = "forced"

    def _equations(self, system):
        if not isinstance(system, ForcedSystem):
            return super()._equations(system)
        if not system.lagrangian_side:
            raise TypeError("ForcedVariationalIntegrator steps a ForcedSystem over a Lagrangian; "
                            "for a Hamiltonian one use any Hamiltonian method (e.g. "
                            "'implicit_midpoint', 'verlet'): they step X_H + F directly")
        view = system.__dict__.get("_lagrangian_view")
        if view is None:
            view = _ForcedLagrangian(system)
            system.__dict__["_lagrangian_view"] = view
        return system.system, view


def discrete_work(system: ForcedSystem, q: Tensor, p: Tensor, *, h: float, t0: float = 0.0,
                  alpha: float = 0.5, layout: str | None = None) -> Tensor:
    r"""W_k = F̄·(q_{k+1} − q_k) along a trajectory ``q, p`` of shape (K+1, ..., n) stepped with
    step h from t0 by an α-map method: F̄ = F_tot at the base point q̄ = (1−α)q_k + αq_{k+1},
    t_k + αh, with z̄ = αp_k + (1−α)p_{k+1} (the cotangent lift's crossed weights) and v̄ = ∂H/∂p
    there on a Hamiltonian system, z̄ = v̄ = (q_{k+1} − q_k)/h on a Lagrangian one.
    Returns (K, ...).  For α = ½ and H = ½pᵀM⁻¹p + V: E_{k+1} − E_k = W_k + D_k exactly (module
    docstring).  ``layout=None`` refuses (K+1, B, n) data that look sample-first — changing much
    less along dim 1 than along dim 0, (B, K+1, n) trajectories, whose "work" would be taken
    between trajectories, and data where neither axis changes 4× less than the other and dim 1
    no more than dim 0 (asking which); ``layout="time_first"`` skips that check (an ensemble of
    nearby trajectories)."""
    if not isinstance(system, ForcedSystem):
        raise TypeError(f"discrete_work takes a ForcedSystem, got {type(system).__name__}")
    AlphaMap(alpha)
    check_pair(q, p, ("q", "p"))
    if q.dim() < 2:
        raise ValueError(f"q, p must be trajectories (K+1, ..., n), got shape {tuple(q.shape)}")
    h, t0 = check_nonzero(h, "h", "step size"), check_scalar(t0, "t0", "time")
    if layout not in (None, "time_first"):
        raise ValueError(f"layout must be None or 'time_first', got {layout!r}")
    if layout is None and q.dim() == 3 and min(q.shape[:2]) >= 2:
        axis, d0, d1 = time_axis(q, p)
        if axis == 1:
            raise ValueError(
                f"discrete_work takes trajectories time-first, (K+1, B, n) as tgi.rollout returns "
                f"them. These, of shape {tuple(q.shape)}, look sample-first, (B, K+1, n): "
                f"neighbours along dim 1 differ by {d1:.2e} on average, along dim 0 by {d0:.2e}. "
                "Transpose them (q.transpose(0, 1)), or pass layout='time_first' if they are "
                "time-first.")
        if axis is None and d1 <= d0:
            raise cannot_tell("discrete_work", q.shape, d0, d1,
                              "layout='time_first' if they are (K+1, B, n) as tgi.rollout returns "
                              "them; (B, K+1, n) trajectories: transpose(0, 1) them.")
    q0, q1, p0, p1 = q[:-1], q[1:], p[:-1], p[1:]
    if q0.shape[0] == 0:
        return q.new_zeros(q.shape[1:-1]).unsqueeze(0)[:0]
    qb = (1.0 - alpha) * q0 + alpha * q1
    if system.lagrangian_side:
        zb = vb = (q1 - q0) / h
    else:
        zb = alpha * p0 + (1.0 - alpha) * p1
        vb = None
    out = []
    for k in range(q0.shape[0]):   # the force may depend on t through a Python-float control
        tkb = t0 + (k + alpha) * h     # in Python floats, as the integrator's step times are
        v = vb[k] if vb is not None else system.system.vector_field(qb[k], zb[k], tkb)[0]
        F = system.generalized_force(qb[k], zb[k], v, tkb)
        out.append((F * (q1[k] - q0[k])).sum(-1))
    return torch.stack(out)


def _build_methods():
    methods = [
        ForcedVariationalIntegrator(AlphaMap(0.5), name="forced_variational_midpoint"),
        ForcedVariationalIntegrator([AlphaMap(0.0), AlphaMap(1.0)], [0.5, 0.5],
                                    name="forced_variational_verlet"),
        ForcedVariationalIntegrator(AlphaMap(0.0), name="forced_variational_euler"),
    ]
    return {m.name: m for m in methods}


#: Named forced variational methods (state (q, p) of a ForcedSystem over a Lagrangian).
FORCED_VARIATIONAL_METHODS = _build_methods()
register("forced", FORCED_VARIATIONAL_METHODS, "a ForcedSystem over a Lagrangian, state (q, p)")
