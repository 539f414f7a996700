r"""Adaptive time steps that keep a symplectic method's long-time behaviour.

A step size chosen by a local error estimate destroys what symmetric and symplectic methods
conserve (energy then drifts linearly, HLW VIII.1).  Three remedies, each built on the existing
integrators (the step maps are not copied: they are run on a rescaled or an extended system):

**Reversible variable steps** (:func:`adaptive_rollout`; Hairer, APNUM 25 (1997); Hairer &
Söderlind, SIAM J. Sci. Comput. 26 (2005); HLW VIII.3.2).  With a step-size density σ(q, p) > 0
(the step should be ≈ ε σ) and ρ = 1/σ, one step of fictive size ε is the palindrome

    ρ ← ρ + (ε/2) G(y),   y ← Φ_{ε/ρ}(y),   t ← t + ε/ρ,   ρ ← ρ + (ε/2) G(y),
    G(y) = −∇ log σ(y) · f(y)                  (so that dρ/dτ = G when ρ = 1/σ(y(t)), dt/dτ = 1/ρ)

i.e. Hairer–Söderlind's explicit control ρ_{n+1/2} = ρ_{n−1/2} + ε G(y_n), h_{n+1/2} = ε/ρ_{n+1/2},
with ρ carried at the nodes (``form="additive"``).  The default ``form="log"`` takes the same
half-steps on ln ρ with d ln ρ/dτ = G/ρ = G σ = −∇σ · f on the tracked manifold ρ = 1/σ:
ln ρ ← ln ρ + (ε/2)(−∇σ · f)(y) — equally symmetric, ρ stays positive by construction, and for
σ = r^{3/2} on Kepler −∇σ · f = O(1) near pericentre where G = O(r^{−3/2}) (the additive form
needs a much smaller ε there before ρ_{n+1/2} turns negative).  For a symmetric Φ (Φ_{−h} = Φ_h⁻¹) the step map on (y, ρ, t) is
symmetric: the same step with −ε inverts it, so N steps forward and N back return to the start
to round-off (tested), and the method keeps the near-conservation of energy of a fixed-step
symmetric method (no drift).  Any symmetric method of :data:`~torchgeo_int.METHODS` (verlet and
its compositions, explicit on separable systems; implicit midpoint and its compositions) runs
unchanged: Φ_{ε/ρ} of the system is Φ_ε of the system whose field is multiplied by s = 1/ρ
(every step map depends on h·f only), a per-sample factor, so each sample of a batch takes its
own step sizes and advances in its own time.  A non-symmetric method raises ValueError.

**Time transformations** (physical time t as a coordinate, its conjugate momentum p_t = −E₀):

* :class:`PoincareTransform`, K(Q, P) = g(q, p) (H(q, p, t) + p_t) with Q = (q, t), P = (p, p_t)
  (Poincaré's extended phase space; HLW VIII.2, Sundman when g = |q|): on K = 0 its flow is the
  flow of H with dt/dτ = g.  K is not separable, so the verlet of ``METHODS`` runs as the
  generalized leapfrog (implicit) and implicit midpoint as itself; any symplectic method works.
* :class:`LogHamiltonian`, Γ(Q, P) = ln(T(p) + p_t) − ln(−V(q)) for H = T + V with V < 0
  (the logarithmic Hamiltonian: Mikkola & Tanikawa, MNRAS 310 (1999); Preto & Tremaine, AJ 118
  (1999)): separable, so verlet and its compositions are explicit kick/drift maps with
  dt/dτ = 1/(T + p_t) = 1/(−V) on the energy shell.  For the two-body problem the leapfrog
  follows the exact Kepler orbit (only the time along it is in error), so the energy is
  conserved to round-off; for N bodies it regularizes close encounters (algorithmic
  regularization).

Both are ordinary systems: :func:`time_transformed_rollout` runs them through
:func:`~torchgeo_int.rollout` (every ``grad=`` mode and ``compile=`` of rollout applies).

**Dense output** (:func:`hermite`, :meth:`AdaptiveTrajectory.at`): cubic Hermite interpolation
between two consecutive nodes from the states and the vector field there (HLW II.6; error
O(h⁴) on an interval of length h for exact node data, so order 3 as an interpolant, which does
not lower the global order ≤ 4 of the methods it is meant for).  The interpolated states are
*not* on the symplectic trajectory (they are output of it); the step sequence is never changed.

Entry points: ``rollout(system, q0, p0, h=ε, steps=N, step_control=σ)`` is
:func:`adaptive_rollout` (one implementation: :class:`_VariableStep` is the step, :func:`_steps`
the loop); ``odeint(..., options=dict(adaptive="reversible", control=σ))`` runs it to t[-1]
with fictive step ``step_size`` and returns dense output at t.

Gradients with reversible variable steps (the step sizes depend on the state and are
differentiated with it): ``grad="backprop"``; ``"checkpoint"`` (segments recomputed in backward:
the step sequence is a deterministic function of a segment's start (q, p, ρ, t)); and
``"reversible"``: the map Ψ_ε on (q, p, ρ, t) is symmetric, so the backward pass reconstructs
each node by Ψ_{−ε} from the final one and takes a vector–Jacobian product of Ψ_ε there (graph
memory O(1) in the steps).  The three agree to round-off in the tests.  The odeint option takes
the same three (``options["grad"]``).  The time transformations support every mode of ``rollout`` (``"backprop"``,
``"checkpoint"``, and ``"reversible"`` with a symmetric method).

Size: one module because the three remedies share the step-size density σ, the rescaled system
they run the unchanged integrators on, and the dense output of their non-uniform nodes; split
apart, each would import the others' private pieces.
"""
from __future__ import annotations

import inspect
import math
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from ._validate import (broadcasts_to, check_finite, check_int, check_nonzero, check_own_methods,
                        check_pair, check_placement, check_real, check_scalar)
from .integrators import METHODS, TABLES, Composition, get_method
from .gradients import SegmentFunction, check_reconstruction, reverse_sweep
from .integrators.base import explicit_splitting
from .solvers import ConvergenceError, default_tol, first_order_only
from .systems import Hamiltonian, SeparableHamiltonian, System, grad_of

Tensor = torch.Tensor

__all__ = ["DKD_METHODS", "StepControl", "power_law_control", "adaptive_rollout", "AdaptiveTrajectory",
           "StepSizeCollapse", "PoincareTransform", "LogHamiltonian", "time_transformed_rollout",
           "hermite", "dense_output"]


class StepSizeCollapse(FloatingPointError):
    """The controlled step size left the admissible range (ρ ≤ 0, non-finite, below h_min, or
    too many steps to reach the end time)."""


# -- drift–kick–drift leapfrog ----------------------------------------------------------------------
def _dkd_methods():
    """``leapfrog_dkd`` = Φ*_{h/2} ∘ Φ_{h/2} with Φ* symplectic Euler's adjoint first: drift h/2,
    kick h, drift h/2 (position Verlet; the library's ``verlet`` is kick–drift–kick), and its
    compositions ``leapfrog_dkd_<table>`` (yoshida4, ...).  Same order, symmetry and cost (one
    force per step) as verlet; on :class:`LogHamiltonian` of a Kepler problem it follows the
    exact orbit (energy conserved to round-off, tested), which the kick–drift–kick form does not."""
    se, se_adj = METHODS["symplectic_euler"], METHODS["symplectic_euler_adjoint"]
    dkd = Composition([se_adj, se], [0.5, 0.5], order=2, name="leapfrog_dkd")
    out = {dkd.name: dkd}
    for table in TABLES.values():
        name = f"leapfrog_dkd_{table.name}"
        out[name] = Composition(dkd, table.gammas, order=table.order, name=name)
    return out


#: Drift–kick–drift leapfrog and its compositions (names accepted by this module's entry points).
DKD_METHODS = _dkd_methods()


def _method(method):
    if isinstance(method, str) and method in DKD_METHODS:
        return DKD_METHODS[method]
    return get_method(method)


# -- the step-size control ------------------------------------------------------------------------
def _n_positional(fn) -> int:
    if isinstance(fn, torch.nn.Module):   # its __call__ takes *args: the arity is forward's
        fn = fn.forward
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 2
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return 2
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


class StepControl:
    r"""A step-size density σ(q) or σ(q, p) > 0 (the step is ≈ ε σ) for :func:`adaptive_rollout`.

    ``sigma`` takes q (or q and p) of shape (*batch, *state) and returns (*batch).  When it
    takes q only, G = −∇_q log σ · ∂H/∂p needs the velocity alone (no force evaluation on a
    separable system); otherwise the full vector field is evaluated at each node.
    ``grad_log_sigma(q)`` (q-only σ) may give ∇ log σ in closed form, else autograd is used."""

    def __init__(self, sigma: Callable, *, grad_log_sigma: Callable | None = None):
        if not callable(sigma):
            raise TypeError("sigma must be callable as sigma(q) or sigma(q, p) -> (*batch) > 0")
        self.sigma = sigma
        self.uses_p = _n_positional(sigma) >= 2
        if grad_log_sigma is not None and self.uses_p:
            raise ValueError("grad_log_sigma is for a sigma(q) of q only")
        self.grad_log_sigma = grad_log_sigma

    def __call__(self, q, p):
        return self.sigma(q, p) if self.uses_p else self.sigma(q)

    def rate(self, system, q, p, t, state_dims, form):
        """What the ρ half-steps add: G(y) (``form="additive"``), or G(y) σ(y) = −∇σ · f
        (``form="log"``, added to ln ρ)."""
        G = self.G(system, q, p, t, state_dims)
        return G if form == "additive" else G * self(q, p)

    def G(self, system, q, p, t, state_dims):
        """G(y) = −∇ log σ · f(y), per sample (*batch)."""
        dims = tuple(range(-state_dims, 0))
        if not self.uses_p:
            if self.grad_log_sigma is not None:
                gq = self.grad_log_sigma(q)
            else:
                gq = grad_of(lambda q_: torch.log(self.sigma(q_)), (q,), "the step-size control sigma",
                             constant_ok=True)[0]
            v = system.velocity(p, t) if system.separable else system.vector_field(q, p, t)[0]
            return -(gq * v).sum(dims)
        gq, gp = grad_of(lambda q_, p_: torch.log(self.sigma(q_, p_)), (q, p),
                         "the step-size control sigma", constant_ok=True)
        dq, dp = system.vector_field(q, p, t)
        return -((gq * dq).sum(dims) + (gp * dp).sum(dims))


def power_law_control(alpha: float = 1.5, state_dims: int = 1) -> StepControl:
    r"""σ(q) = |q|^α, ∇ log σ = α q/|q|² (closed form): for a Kepler problem in relative
    coordinates α = 3/2 takes a fixed fraction of the local orbital time scale r^{3/2} per step
    (a fixed number of steps per pericentre passage at any eccentricity)."""
    a = check_scalar(alpha, "alpha", "exponent")   # a NaN would surface as σ's at the first step
    dims = tuple(range(-check_int(state_dims, "state_dims", 1), 0))

    def sigma(q):
        return (q * q).sum(dims) ** (0.5 * a)

    def grad_log_sigma(q):
        r2 = (q * q).sum(dims, keepdim=True)
        return a * q / r2
    return StepControl(sigma, grad_log_sigma=grad_log_sigma)


class _TimeScaled(System):
    r"""The field s·f of ``base`` with a per-sample factor s (set before each step) and the
    physical time t = t_n + s (τ − τ_n) of the integrator's internal (fictive) time τ:
    Φ_ε of this system is Φ_{sε} of ``base`` for every step map of the library."""

    def __init__(self, base: System, state_dims: int):
        super().__init__()
        self.base = base
        self.separable = base.separable
        self.force_sign = base.force_sign
        self.timed = getattr(base, "time_dependent", True)
        self.state_dims = state_dims
        self.s = self.t_n = None
        self.tau_n = 0.0

    def set(self, s, t_n, tau_n):
        # (plain attributes, set past nn.Module.__setattr__: this runs once per step)
        self.__dict__.update(s=s.reshape(*s.shape, *([1] * self.state_dims)), s_t=s, t_n=t_n,
                             tau_n=tau_n)

    def _t(self, tau):
        return self.t_n + self.s_t * (tau - self.tau_n) if self.timed else 0.0

    def velocity(self, p, t=0.0):
        return self.s * self.base.velocity(p, self._t(t))

    def force_term(self, q, t=0.0):
        return self.s * self.base.force_term(q, self._t(t))

    def force(self, q, t=0.0):
        return self.s * self.base.force(q, self._t(t))

    def vector_field(self, q, p, t=0.0):
        dq, dp = self.base.vector_field(q, p, self._t(t))
        return self.s * dq, self.s * dp


def _rescale(cache, ratio):
    """The FSAL force / warm start of the last step, for the next step's factor s.  A cache
    without a graph is a guess (an implicit step's warm start, detached by the step): it is
    rescaled without one too (a guess needs no graph).  An FSAL force that is used as a value
    keeps its graph and s's."""
    if cache is None:
        return None
    if isinstance(cache, torch.Tensor):
        return cache * (ratio if cache.requires_grad else ratio.detach())
    return type(cache)(_rescale(c, ratio) for c in cache)


# -- trajectories and dense output ------------------------------------------------------------------
def hermite(t0, t1, y0, y1, f0, f1, t):
    r"""Cubic Hermite interpolant at t of y0 = y(t0), y1 = y(t1) with slopes f0, f1 (HLW (II.6.7)):

        y(t0 + θh) ≈ (1−θ) y0 + θ y1 + θ(θ−1) [(1−2θ)(y1 − y0) + (θ−1) h f0 + θ h f1],

    exact for cubics, error O(h⁴).  t0, t1, t of shape (*batch); y, f of shape (*batch, *state)."""
    h = t1 - t0
    safe = torch.where(h == 0, torch.ones_like(h), h)
    th = torch.where(h == 0, torch.zeros_like(h), (t - t0) / safe)
    extra = y0.dim() - th.dim()
    th = th.reshape(*th.shape, *([1] * extra))
    h = h.reshape(*h.shape, *([1] * extra))
    return (1 - th) * y0 + th * y1 + th * (th - 1) * ((1 - 2 * th) * (y1 - y0)
                                                      + (th - 1) * h * f0 + th * h * f1)


def dense_output(system, t_nodes, q_nodes, p_nodes, times):
    r"""States at ``times`` by cubic Hermite interpolation (:func:`hermite`) of the nodes
    (L, *batch[, *state]) of a trajectory whose samples have their own node times ``t_nodes``
    (L, *batch), monotone in the direction of integration; the slopes are ``system``'s vector
    field at the two nodes that bracket each time (two evaluations per output time, on the batch).
    ``times``: (n,) common to all samples, or (n, *batch).  Returns (q, p) of shape
    (n, *batch, *state).  A time outside a sample's integrated interval raises ValueError."""
    L = t_nodes.shape[0]
    batch = t_nodes.shape[1:]
    for x, name in ((q_nodes, "q_nodes"), (p_nodes, "p_nodes")):
        # (nodes of another trajectory or batch failed in a reshape below)
        if x is not None and tuple(x.shape[:1 + len(batch)]) != (L, *batch):
            raise ValueError(f"{name} must have shape (L, *batch, ...) = ({L}, {tuple(batch)}, ...) "
                             f"as t_nodes {tuple(t_nodes.shape)}, got {tuple(x.shape)}")
    if not isinstance(times, torch.Tensor):
        times = torch.as_tensor(times, dtype=t_nodes.dtype, device=t_nodes.device)
    times = times.to(t_nodes.dtype)
    if times.dim() == 0:
        times = times.reshape(1)
    if times.dim() == 1:
        times = times.reshape(-1, *([1] * len(batch))).expand(-1, *batch)
    if times.shape[1:] != batch:
        raise ValueError(f"times must have shape (n,) or (n, *batch) = (n, {tuple(batch)}), got "
                         f"{tuple(times.shape)}")
    check_finite(times, "times")
    n = times.shape[0]
    T = t_nodes.detach().reshape(L, -1).T.contiguous()          # (B, L)
    X = times.detach().reshape(n, -1).T.contiguous()            # (B, n)
    sign = 1.0 if bool((T[:, -1] >= T[:, 0]).all()) else -1.0
    T, X = sign * T, sign * X
    tol = 64 * torch.finfo(T.dtype).eps * T.abs().amax(1, keepdim=True).clamp_min(1.0)
    if bool(((X < T[:, :1] - tol) | (X > T[:, -1:] + tol)).any()):
        raise ValueError("an output time lies outside the integrated interval of a sample "
                         f"(sample time spans [{T[:, 0].min().item() * sign:g}, "
                         f"{T[:, -1].min().item() * sign:g}] at the least)")
    idx = torch.searchsorted(T, X).clamp(1, L - 1)               # T[i−1] < x ≤ T[i]
    out_q, out_p = [], []
    flat_t = t_nodes.reshape(L, -1)
    cols = torch.arange(flat_t.shape[1], device=t_nodes.device)
    for k in range(n):
        i1 = idx[:, k]
        i0 = i1 - 1

        def take(Y, i):
            Yf = Y.reshape(L, flat_t.shape[1], -1)
            return Yf[i, cols].reshape(*batch, *Y.shape[1 + len(batch):])
        ta, tb = flat_t[i0, cols].reshape(batch), flat_t[i1, cols].reshape(batch)
        qa, qb, pa, pb = take(q_nodes, i0), take(q_nodes, i1), take(p_nodes, i0), take(p_nodes, i1)
        fa = system.vector_field(qa, pa, ta if getattr(system, "time_dependent", True) else 0.0)
        fb = system.vector_field(qb, pb, tb if getattr(system, "time_dependent", True) else 0.0)
        tk = times[k]
        out_q.append(hermite(ta, tb, qa, qb, fa[0], fb[0], tk))
        out_p.append(hermite(ta, tb, pa, pb, fa[1], fb[1], tk))
    return torch.stack(out_q), torch.stack(out_p)


@dataclass
class AdaptiveTrajectory:
    """Nodes of an adaptive run: ``q, p`` (L, *batch, *state), per-sample times ``t`` (L, *batch),
    ``rho`` (L, *batch) the control variable at the nodes (reversible control; None for a time
    transformation: there ``Q, P`` hold the extended state), ``system`` the physical system
    (what :meth:`at` interpolates with)."""

    q: Tensor
    p: Tensor
    t: Tensor
    system: System
    rho: Tensor | None = None
    Q: Tensor | None = None
    P: Tensor | None = None
    steps: int = 0
    save_every: int = 1

    def __iter__(self):
        """``q, p = traj``: the frames, as ``rollout`` returns them."""
        return iter((self.q, self.p))

    def at(self, times):
        """Dense output (:func:`dense_output`): (q, p) at ``times`` for every sample, shape
        (n, *batch, *state); ``times`` (n,) common to all samples or (n, *batch).  Needs the
        nodes of every step: a trajectory saved with ``save_every > 1`` is refused (its cubic
        Hermite interpolant over several steps would not have the declared order)."""
        if self.save_every != 1:
            raise ValueError(f"dense output needs the node of every step; this trajectory kept "
                             f"one state in {self.save_every} (save_every={self.save_every}): rerun "
                             "with save_every=1")
        return dense_output(self.system, self.t, self.q, self.p, times)

    def h(self):
        """The step sizes t_{n+1} − t_n, (L − 1, *batch)."""
        return self.t[1:] - self.t[:-1]


# -- reversible variable steps ----------------------------------------------------------------------
def _check_state(system, q0, p0, state_dims):
    check_own_methods(system, "variable steps (step_control)")
    check_pair(q0, p0, ("q0", "p0"))
    check_finite(q0, "q0")
    check_finite(p0, "p0")
    check_placement(system, q0)
    if isinstance(state_dims, bool) or not isinstance(state_dims, int) or not 1 <= state_dims <= q0.dim():
        raise ValueError(f"state_dims must be an int in [1, q0.dim() = {q0.dim()}], got {state_dims!r}")
    return q0.shape[:q0.dim() - state_dims]


def _start_time(t0, batch, dtype, device):
    """t0 (a number or per-sample tensor) as a (*batch) tensor, checked finite; keeps its graph."""
    t = torch.as_tensor(t0, dtype=dtype, device=device)
    if not broadcasts_to(t.shape, batch):
        raise ValueError(f"t0 must be a number or a tensor of the batch shape {tuple(batch)}, got "
                         f"shape {tuple(t.shape)}")
    check_finite(t, "t0")
    return t.expand(batch).clone()


def _as_system(system):
    from .rollout import as_system
    return as_system(system)


class _VariableStep:
    r"""One step Ψ_ε of the reversible variable-step map on (q, p, ρ, t) (module docstring):

        ρ_{n+1/2} = ρ_n ⊕ (ε/2) G(y_n),  y_{n+1} = Φ_{ε/ρ_{n+1/2}}(y_n),  t_{n+1} = t_n + ε/ρ_{n+1/2},
        ρ_{n+1} = ρ_{n+1/2} ⊕ (ε/2) G(y_{n+1})

    (⊕: ``+`` for ``form="additive"``, ``· exp`` of G σ for ``form="log"``).  The one
    implementation that the forward loop, the checkpointed segments' recomputation, and the
    reversible mode's reconstruction (Ψ_{−ε} = Ψ_ε⁻¹) and vector–Jacobian products all call.
    G at the start node is passed in and G at the end node returned (one evaluation per step)."""

    def __init__(self, system, integrator, control, state_dims, form):
        self.system, self.control, self.state_dims, self.form = system, control, state_dims, form
        self.integrator = integrator
        self.scaled = _TimeScaled(system, state_dims)
        self.step = integrator.bind(self.scaled)
        # An explicit splitting evaluates the field at once (its bound halves read the shared
        # scaled system).  An implicit step's solver calls the field again in the backward pass
        # (the adjoint solve of its implicit gradient), long after later steps have set other
        # factors s: each of its steps gets its own shallow copy, else the adjoint uses the last
        # step's s (measured: backprop off by 3e-3 relative over 15 implicit midpoint steps).
        self.explicit = explicit_splitting(integrator, self.scaled) is not None

    def rate(self, q, p, t):
        return self.control.rate(self.system, q, p, t, self.state_dims, self.form)

    def half(self, rho, G, eps):
        return rho + 0.5 * eps * G if self.form == "additive" else rho * torch.exp(0.5 * eps * G)

    def __call__(self, q, p, rho, t, G, tau, eps, cache=None, s_old=None):
        rho_half = self.half(rho, G, eps)
        s = 1.0 / rho_half
        if s_old is not None:   # the FSAL force / warm start was computed for the last step's s
            cache = _rescale(cache, (s / s_old).reshape(*s.shape, *([1] * self.state_dims)))
        scaled = self.scaled
        if not self.explicit:
            scaled = object.__new__(_TimeScaled)
            scaled.__dict__.update(self.scaled.__dict__)
        scaled.set(s, t, tau)
        q, p, cache = self.step(scaled, q, p, tau, eps, cache)
        t = t + eps * s
        G = self.rate(q, p, t)
        return q, p, self.half(rho_half, G, eps), t, G, cache, s, rho_half


def _steps(vs, node, n, limit, *, stop, eps, until, save_every, check_every, h_min, frames,
           progress=None):
    """Steps of ``vs`` from ``node`` = (q, p, ρ, t, G, cache, s_old) at global step ``n`` up to
    step ``limit``; the nodes at global steps that are multiples of ``save_every`` are appended
    to ``frames`` as (q, p, ρ, t).  Every ``check_every`` steps and at ``limit`` the steps are
    checked (:func:`_check_steps`); with ``until`` the run ends at the first global multiple of
    ``check_every`` (or ``stop``, the run's last step) where every sample has passed it.  Returns
    (node, n, reached).  Steps are numbered globally so that a run cut into segments
    (``grad="checkpoint"``) stops where one run does."""
    q, p, rho, t, G, cache, s_old = node
    rho_min = rho_max = None
    reached, told = False, n
    while n < limit:
        try:
            q, p, rho, t, G, cache, s_old, rho_half = vs(q, p, rho, t, G, n * eps, eps, cache, s_old)
        except ConvergenceError as err:
            raise err.with_step(n) from None
        rh = rho_half.detach()
        rho_min = rh if rho_min is None else torch.minimum(rho_min, rh)
        rho_max = rh if rho_max is None else torch.maximum(rho_max, rh)
        n += 1
        if n % save_every == 0:
            frames.append((q, p, rho, t))
        if n % check_every == 0 or n == limit:
            _check_steps(rho_min, rho_max, eps, h_min, q, p, n, check_every)
            if progress is not None:
                progress.update(n - told)
                told = n
            if until is not None and (n % check_every == 0 or n == stop) and \
                    bool(((t - until) * eps >= 0).all()):
                reached = True
                break
    return (q, p, rho, t, G, cache, s_old), n, reached


def _stack(frames, x0s):
    """The frames (a list of (q, p, ρ, t)) stacked, (0, ...)-shaped when there are none."""
    if not frames:
        return tuple(x.unsqueeze(0)[:0].clone() for x in x0s)
    return tuple(torch.stack(f) for f in zip(*frames))


def _not_reached(max_steps, until, t, eps):
    return StepSizeCollapse(
        f"{max_steps} steps did not reach t = {until} (the least advanced sample is at "
        f"t = {(t.min() if eps > 0 else t.max()).item():g}): the step size collapsed; "
        "increase eps or max_steps, or check the control")


def _run_backprop(vs, x0, *, limit, until, max_steps, eps, **kw):
    """All steps in one loop (plain autograd through every step, or no graph at all)."""
    q0, p0, rho0, t0 = x0
    frames = [x0]
    node, n, reached = _steps(vs, (q0, p0, rho0, t0, vs.rate(q0, p0, t0), None, None), 0, limit,
                              stop=limit, eps=eps, until=until, frames=frames, **kw)
    if until is not None and not reached:
        raise _not_reached(max_steps, until, node[3], eps)
    if n % kw["save_every"]:
        frames.append(node[:4])
    return _stack(frames, x0), n


def _run_checkpoint(vs, x0, params, segment, *, limit, until, max_steps, eps, **kw):
    """Segments of ``segment`` steps run without a graph, each recomputed with its graph in
    backward (:class:`~torchgeo_int.gradients.SegmentFunction`).  The step sequence is a deterministic
    function of the segment's start (q, p, ρ, t): G is recomputed there and the FSAL cache
    restarts, in the forward pass and in the recomputation alike; the number of steps of each
    segment (decided by ``until`` in the forward pass) is replayed."""
    outs = [[x.unsqueeze(0)] for x in x0]
    states, done, reached = x0, 0, False
    while done < limit and not reached:
        info = {}

        def run(q, p, rho, t, done=done, end=min(done + segment, limit), info=info):
            frames = []
            replay = "n" in info
            node, n, hit = _steps(vs, (q, p, rho, t, vs.rate(q, p, t), None, None), done,
                                  info["n"] if replay else end, stop=limit, eps=eps,
                                  until=None if replay else until, frames=frames,
                                  **{**kw, "progress": None if replay else kw["progress"]})
            info.setdefault("n", n)
            info.setdefault("reached", hit)
            return (*_stack(frames, (q, p, rho, t)), *node[:4])

        out = SegmentFunction.apply(run, 4, *states, *params)
        for o, f in zip(outs, out[:4]):
            o.append(f)
        states, done, reached = out[4:], info["n"], info["reached"]
    if until is not None and not reached:
        raise _not_reached(max_steps, until, states[3], eps)
    if done % kw["save_every"]:
        for o, x in zip(outs, states):
            o.append(x.unsqueeze(0))
    return tuple(torch.cat(o) for o in outs), done


class _ReversibleSteps(torch.autograd.Function):
    """``grad="reversible"`` for variable steps: forward without a graph; backward from the
    final node, reconstructing each node x_k = Ψ_{−ε}(x_{k+1}) (Ψ is symmetric, so this is the
    inverse step to round-off) and taking the vector–Jacobian product of Ψ_ε at x_k.  Graph
    memory O(1) in the number of steps."""

    @staticmethod
    def forward(ctx, spec, q0, p0, rho0, t0, *params):
        vs, kw, info = spec
        with torch.no_grad():
            frames, n = _run_backprop(vs, (q0, p0, rho0, t0), **kw)
        info["n"] = n
        ctx.spec, ctx.n, ctx.params = spec, n, params
        ctx.save_for_backward(q0, p0, rho0, t0, *(f[-1] for f in frames))
        return frames

    @staticmethod
    def backward(ctx, *gframes):
        first_order_only("grad='reversible'", "grad='backprop'")
        vs, kw, info = ctx.spec
        eps, save_every, tol = kw["eps"], kw["save_every"], info["tol"]
        if isinstance(tol, tuple):
            tol = max(tol[0], ctx.n * tol[1])
        q0, p0, rho0, t0, *x = ctx.saved_tensors
        with torch.no_grad():
            G = vs.rate(x[0], x[1], x[3])
        back = s_old = None   # the −ε steps' own FSAL chain

        def inverse(k, x):                          # x_k = Ψ_{−ε}(x_{k+1}), G its rate
            nonlocal G, back, s_old
            *x, G, back, s_old, _ = vs(*x, G, (k + 1) * eps, -eps, back, s_old)
            return x

        def forward(k, x):
            return vs(*x, vs.rate(x[0], x[1], x[3]), k * eps, eps)[:4]

        x, g, gparams = reverse_sweep(ctx.n, x, gframes, ctx.params, save_every, inverse, forward)
        check_reconstruction(x, (q0, p0), tol, f"{ctx.n} variable steps")
        return (None, *g, *gparams)


def adaptive_rollout(system, q0: Tensor, p0: Tensor, *, eps: float, control: StepControl | None = None,
                     steps: int | None = None, until: float | None = None, method="verlet",
                     t0=0.0, rho0: Tensor | None = None, save_every: int = 1, state_dims: int = 1,
                     h_min: float = 0.0, max_steps: int = 10 ** 7, form: str = "log",
                     check_every: int = 64, grad: str = "backprop", progress: bool = False,
                     **grad_options) -> AdaptiveTrajectory:
    r"""Time-reversible variable steps (module docstring): ``steps`` steps of fictive size ``eps``
    (negative: backwards), or with ``until=T`` as many as every sample needs to pass T
    (checked every ``check_every`` steps; samples that are through keep stepping until the last
    one is).  ``control``: a :class:`StepControl` or a callable σ(q) / σ(q, p) (default
    :func:`power_law_control` (1.5), for Kepler-type problems in relative coordinates).
    ``method`` must be symmetric.  ``t0``: a number or per-sample tensor (*batch); ``rho0``: the
    control variable at the start (default 1/σ(q0, p0)); pass the ``rho[-1]`` of a run to
    continue it or, with −eps, to reverse it exactly.  ``state_dims``: trailing dims of q0 that
    form one sample's state (default 1; the leading ones are the batch, each sample with its own
    step sizes).  ``form``: ``"log"`` (default; ρ's half-steps on ln ρ) or ``"additive"``
    (Hairer–Söderlind's ρ + (ε/2) G), see the module docstring.  ``rollout(system, q0, p0, h=ε,
    steps=N, step_control=σ, ...)`` is this function.

    A time-dependent system gets t as a tensor of the batch shape (*batch): each sample is at its
    own time (a fixed-step rollout passes one Python float).  Write t-dependence per sample, as
    the energy's output is (e.g. ``(q * torch.cos(t)[..., None]).sum(-1)``, not
    ``(q * torch.cos(t)).sum(-1)``, which broadcasts t against q's last axis).

    Returns an :class:`AdaptiveTrajectory`: nodes ``q, p`` (L, *batch, *state) at steps
    0, save_every, 2·save_every, ... and the final step (the frames of ``rollout``; ``q, p =
    traj`` unpacks them), each sample's own times ``t`` (L, *batch) and control ``rho``;
    ``traj.at(times)`` gives states at common times by dense output (needs ``save_every=1``).

    Gradients (``grad``, options as in ``rollout``), w.r.t. q0, p0, t0, rho0 and the parameters
    of the system (and of ``control.sigma`` when it is a module; others via ``params=[...]``);
    the step sizes depend on the state and are differentiated with it:

    * ``"backprop"``: autograd through every step, memory O(steps);
    * ``"checkpoint"`` (``segment``, default ⌈√steps⌉, or 256 with ``until``): segments without
      a graph, recomputed in backward — the step sequence is a deterministic function of each
      segment's start (q, p, ρ, t) (its FSAL cache restarts there, so the forward values differ
      from one loop's by round-off only); exact backprop gradient of the same map;
    * ``"reversible"`` (``reconstruction_tol``): the map Ψ_ε on (q, p, ρ, t) is symmetric,
      Ψ_{−ε} = Ψ_ε⁻¹, so the backward pass steps back from the final node with −ε (the same
      controls, recomputed from the state) and takes one vector–Jacobian product per step:
      graph memory O(1) (methods as for ``rollout``'s ``"reversible"``: explicit splittings on a
      separable H, implicit symmetric cotangent-lift methods); a ``RuntimeWarning`` when the
      reconstructed start is off by more than ``reconstruction_tol`` (default 1e3·machine
      epsilon relative, steps × solver tolerance for implicit steps).

    ``progress=True`` shows a tqdm bar over the steps.

    Raises ValueError for a non-symmetric method or a non-positive σ at the start,
    :class:`StepSizeCollapse` when ρ_{n+1/2} ≤ 0 or non-finite (ε too large for the control) or
    |h| < ``h_min``, or when ``until`` is not reached within ``max_steps``, and
    ``ConvergenceError`` (naming the step) when an implicit step does not converge."""
    from ._loop import progress_bar
    from .gradients import grad_mode, not_reversible, resolve_params
    system = _as_system(system)
    integrator = _method(method)
    from .constraints import ConstrainedSystem
    if isinstance(system, ConstrainedSystem):
        raise ValueError("reversible variable steps rescale the system's vector field by the step "
                         "size, which a ConstrainedSystem (stepped by Rattle or a constrained "
                         "variational method through its multipliers) does not have; use fixed "
                         "steps")
    if not getattr(integrator, "symmetric", False) or getattr(integrator, "first_order", False):
        raise ValueError(
            f"reversible step control needs a symmetric method of (q, p) (verlet, yoshida4, "
            f"suzuki4, ..., implicit_midpoint and its compositions): {integrator.name!r} is not "
            f"symmetric (its −h step does not invert it), so the variable-step map would not be "
            f"time-reversible")
    batch = _check_state(system, q0, p0, state_dims)
    bound = [m for m, _ in integrator.stages() if not getattr(m, "field_only", True)]
    if bound:
        # their steps read the system's own structure (a Lagrangian, a force, multipliers, a
        # group), which the rescaled field s·f of variable steps does not have
        raise ValueError(f"reversible variable steps (step_control) rescale the system's vector "
                         f"field, which {integrator.name!r} (its stage {bound[0].name!r}, a "
                         f"{type(bound[0]).__name__}) does not step: use a Hamiltonian method "
                         "(verlet, yoshida4, implicit_midpoint, …) or fixed steps")
    eps = check_nonzero(eps, "eps", "fictive step")
    if (steps is None) == (until is None):
        raise ValueError("pass exactly one of steps= (a number of steps) and until= (an end time)")
    if steps is not None:
        check_int(steps, "steps", 0)
    check_int(max_steps, "max_steps", 1)
    h_min = check_real(h_min, "h_min", 0.0)
    for name, val in (("save_every", save_every), ("check_every", check_every)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{name} must be an int >= 1, got {val!r}")
    if form not in ("log", "additive"):
        raise ValueError(f"form must be 'log' or 'additive', got {form!r}")
    if not isinstance(progress, bool):
        raise ValueError(f"progress must be a bool, got {progress!r}")
    mode = grad_mode(grad, **grad_options)
    control = power_law_control(1.5, state_dims) if control is None else control
    if not isinstance(control, StepControl):
        control = StepControl(control)
    dtype, device = q0.dtype, q0.device
    t = _start_time(t0, batch, dtype, device)
    if until is not None:
        until = check_scalar(until, "until", "time")   # float() took a string, detached a grad
        if not bool(((until - t) * eps > 0).all()):
            raise ValueError(f"until = {until} is not ahead of t0 in the direction of eps = {eps}")
    sigma0 = control(q0, p0)
    if not isinstance(sigma0, Tensor):
        raise TypeError(f"sigma must return a tensor of the batch shape {tuple(batch)} (one density "
                        f"per sample, written with torch operations on q, p), got "
                        f"{type(sigma0).__name__}")
    if tuple(sigma0.shape) != tuple(batch):
        raise ValueError(f"sigma returned shape {tuple(sigma0.shape)}, expected the batch shape "
                         f"{tuple(batch)}")
    if not bool((sigma0 > 0).all()) or not bool(torch.isfinite(sigma0).all()):
        raise ValueError("the step-size density sigma must be finite and > 0 at the initial state "
                         f"(min {sigma0.min().item():g})")
    if rho0 is None:
        rho = 1.0 / sigma0
    else:
        rho = torch.as_tensor(rho0, dtype=dtype, device=device)
        if not broadcasts_to(rho.shape, batch):
            raise ValueError(f"rho0 must be a number or a tensor of the batch shape {tuple(batch)}, "
                             f"got shape {tuple(rho.shape)}")
        rho = rho.expand(batch)
    if not bool((rho > 0).all()) or not bool(torch.isfinite(rho).all()):
        raise ValueError("rho0 must be finite and > 0 (it is 1/step-size density)")

    vs = _VariableStep(system, integrator, control, state_dims, form)
    limit = steps if steps is not None else max_steps
    x0 = (q0, p0, rho, t)
    bar = progress_bar(steps, f"adaptive {integrator.name}") if progress else None
    kw = dict(limit=limit, until=until, max_steps=max_steps, eps=eps, save_every=save_every,
              check_every=check_every, h_min=h_min, progress=bar)
    try:
        if mode.name == "backprop" or not torch.is_grad_enabled():
            (qs, ps, rhos, ts), n = _run_backprop(vs, x0, **kw)
        else:
            if mode.name == "reversible":
                why = not_reversible(integrator, vs.scaled)
                if why:
                    raise ValueError(f"grad='reversible' with variable steps needs a method whose "
                                     f"−ε step is computable; {integrator.name!r} cannot: {why}. "
                                     "Use grad='checkpoint'.")
            params = mode.params
            if params is None:
                params = [w for w in system.parameters() if w.requires_grad]
                if isinstance(control.sigma, torch.nn.Module):
                    params += [w for w in control.sigma.parameters() if w.requires_grad]

            def probe(system_, q, p, t_, h, cache):   # one variable step: its graph's leaves
                return vs(q, p, 1.0 / control(q, p), t_, vs.rate(q, p, t_), 0.0, h)[:3]
            # (t0 is a state, differentiated as q0 and p0 are: not a parameter to look for)
            params = resolve_params(probe, system, (q0, p0), t.detach(), eps, params)
            if mode.name == "checkpoint":
                segment = mode.segment
                if segment is None:
                    segment = math.isqrt(max(steps, 1) - 1) + 1 if steps is not None else 256
                if isinstance(segment, bool) or not isinstance(segment, int) or segment < 1:
                    raise ValueError(f"segment must be a positive int, got {segment!r}")
                (qs, ps, rhos, ts), n = _run_checkpoint(vs, x0, params, segment, **kw)
            else:
                tol = mode.reconstruction_tol
                if tol is None:
                    tol = 1e3 * torch.finfo(dtype).eps
                    if not explicit_splitting(integrator, vs.scaled):
                        # each −ε solve stops within the solver's tolerance τ: allow steps·τ
                        tau = max(m.tol if m.tol is not None else default_tol(dtype)
                                  for m, _ in integrator.stages())
                        tol = (tol, tau)   # the −ε solves: steps·τ, with the steps known in backward
                info = dict(tol=tol)
                qs, ps, rhos, ts = _ReversibleSteps.apply((vs, kw, info), *x0, *params)
                n = info["n"]
    finally:
        if bar is not None:
            bar.close()
    return AdaptiveTrajectory(qs, ps, ts, system, rho=rhos, steps=n, save_every=save_every)


def _check_steps(rho_min, rho_max, eps, h_min, q, p, n, every):
    a = (n - 1) // every * every
    if not bool(torch.isfinite(rho_min).all() & torch.isfinite(rho_max).all()) or \
            not bool((rho_min > 0).all()):
        raise StepSizeCollapse(
            f"the step-size control variable rho became non-positive or non-finite between step "
            f"{a} and step {n} (min {rho_min.min().item():g}): the step size collapsed or blew up; "
            f"reduce eps (= {eps:g}) or smooth the control")
    if h_min > 0 and abs(eps) / rho_max.max().item() < h_min:
        raise StepSizeCollapse(
            f"the step size fell to {abs(eps) / rho_max.max().item():g} < h_min = {h_min:g} between "
            f"step {a} and step {n}")
    if not bool(torch.isfinite(q).all() & torch.isfinite(p).all()):
        raise FloatingPointError(f"the rollout became non-finite between step {a} and step {n}")


# -- time transformations ----------------------------------------------------------------------------
class _Extended:
    """Extended state Q = (q flattened, t), P = (p flattened, p_t) for a base state shape."""

    def __init__(self, state_shape):
        self.shape = tuple(state_shape)
        self.n = math.prod(self.shape)

    def split(self, Q):
        return Q[..., :self.n].reshape(*Q.shape[:-1], *self.shape), Q[..., self.n]

    def join(self, x, y):
        return torch.cat([x.reshape(*x.shape[:x.dim() - len(self.shape)], self.n), y.unsqueeze(-1)], -1)


def sundman_g(alpha: float = 1.0, state_dims: int = 1):
    """g(q) = |q|^α: dt/dτ = g, small steps in t where |q| is small (α = 1: Sundman's
    transformation of the Kepler problem; α = 3/2: a fixed fraction of the local orbital time)."""
    dims = tuple(range(-state_dims, 0))
    return lambda q, p: (q * q).sum(dims) ** (0.5 * float(alpha))


class PoincareTransform(Hamiltonian):
    r"""K(Q, P) = g(q, p) (H(q, p, t) + p_t) on the extended phase space Q = (q, t), P = (p, p_t)
    (HLW VIII.2, (2.5)); with p_t = −H(q₀, p₀) (:meth:`extend`) K = 0 along the solution and
    q(τ), p(τ) follow H's flow with dt/dτ = g.  ``g(q, p)`` (or ``g(q)``; shape (*batch), > 0;
    default :func:`sundman_g` (1), g = |q|) is the time transformation; ``state_shape`` the shape of one
    sample's q in ``system``.  Gradients by autograd, so implicit (generalized) methods step it."""

    def __init__(self, system, g: Callable | None = None, *, state_shape):
        super().__init__(None, time_dependent=False)
        system = _as_system(system)
        if not hasattr(system, "energy"):
            raise TypeError("the Poincaré transformation needs a Hamiltonian system")
        self.base = system
        if g is None:
            g = sundman_g(1.0, len(tuple(state_shape)))
        if not callable(g):
            raise TypeError("g must be callable as g(q) or g(q, p) -> (*batch) > 0")
        self.g_fn = g                     # registered as a submodule when g is a module
        self.g_uses_p = _n_positional(g) >= 2   # g(q) or g(q, p), as a StepControl's sigma
        self.ext = _Extended(state_shape)
        self._base_td = getattr(system, "time_dependent", False)

    def hamiltonian(self, Q, P, t=0.0):
        q, tq = self.ext.split(Q)
        p, pt = self.ext.split(P)
        H = self.base.energy(q, p, tq) if self._base_td else self.base.energy(q, p)
        return self.g(q, p) * (H + pt)

    def g(self, q, p):
        """dt/dτ = g(q, p) (or g(q))."""
        return self.g_fn(q, p) if self.g_uses_p else self.g_fn(q)

    def dt_dtau(self, q, p):
        return self.g(q, p)


class LogHamiltonian(SeparableHamiltonian):
    r"""Γ(Q, P) = ln(T(p) + p_t) − ln(−V(q)) for a separable, time-independent H = T + V with
    V < 0 (Mikkola & Tanikawa 1999; Preto & Tremaine 1999): "kinetic" ln(T + p_t), "potential"
    −ln(−V); ∂/∂P = (∇T, 1)/(T + p_t), ∂/∂Q = (−∇V/V, 0), so verlet is the explicit
    time-transformed leapfrog with dt/dτ = 1/(T + p_t) (= 1/(−V) on K = 0), FSAL included
    (one ∇V and one V per step).  ``state_shape``: the shape of one sample's q.  V must stay
    negative (and T + p_t positive): a log of a non-positive number is NaN, which the rollout's
    finiteness check reports; :func:`time_transformed_rollout` checks V(q₀) < 0 first."""

    def __init__(self, system: SeparableHamiltonian, *, state_shape):
        if not isinstance(system, SeparableHamiltonian) or system.time_dependent:
            raise TypeError("LogHamiltonian needs a time-independent SeparableHamiltonian H = T(p) + V(q)")
        self.ext = ext = _Extended(state_shape)
        base = system

        def kinetic(P):
            p, pt = ext.split(P)
            return torch.log(base.kinetic(p) + pt)

        def potential(Q):
            q, _ = ext.split(Q)
            return -torch.log(-base.potential(q))

        def kinetic_grad(P):
            p, pt = ext.split(P)
            w = (base.kinetic(p) + pt).unsqueeze(-1)
            return ext.join(base.velocity(p), torch.ones_like(pt)) / w

        def potential_grad(Q):
            q, _ = ext.split(Q)
            U = (-base.potential(q)).reshape(*q.shape[:q.dim() - len(ext.shape)],
                                                    *([1] * len(ext.shape)))
            gV = base.force_term(q)                    # ∂V/∂q
            return ext.join(gV / U, torch.zeros_like(q[(...,) + (0,) * len(ext.shape)]))

        super().__init__(kinetic, potential, kinetic_grad=kinetic_grad, potential_grad=potential_grad,
                         time_dependent=False)
        self.base = base

    def dt_dtau(self, q, p, pt):
        return 1.0 / (self.base.kinetic(p) + pt)


def time_transformed_rollout(system, q0: Tensor, p0: Tensor, *, eps: float, steps: int | None = None,
                             until: float | None = None, transform: str = "logh",
                             g: Callable | None = None, method="leapfrog_dkd", t0=0.0,
                             save_every: int = 1, state_dims: int = 1, max_steps: int = 10 ** 7,
                             chunk: int = 1024, **rollout_options) -> AdaptiveTrajectory:
    r"""Integrate ``system`` in fictive time τ (step ``eps``) with physical time as a coordinate:
    ``transform="logh"`` (:class:`LogHamiltonian`, explicit for separable H with V < 0) or
    ``"poincare"`` (:class:`PoincareTransform` with ``g``, default g = |q|).  The extended
    start is Q₀ = (q₀, t₀), P₀ = (p₀, −H(q₀, p₀)) per sample.  ``steps`` fictive steps, or
    ``until=T``: chunks of ``chunk`` steps until every sample passes T (at most ``max_steps``).
    ``rollout_options`` go to :func:`~torchgeo_int.rollout` (grad=, compile=, check_every=).
    Returns an :class:`AdaptiveTrajectory` (its ``Q, P`` the extended nodes; ``at`` interpolates
    in physical time with H's field)."""
    from .rollout import rollout
    system = _as_system(system)
    batch = _check_state(system, q0, p0, state_dims)
    state_shape = q0.shape[q0.dim() - state_dims:]
    eps = check_nonzero(eps, "eps", "fictive step")
    if steps is not None:
        check_int(steps, "steps", 0)
    check_int(save_every, "save_every", 1)
    check_int(chunk, "chunk", 1)
    check_int(max_steps, "max_steps", 1)
    if transform == "logh":
        if g is not None:
            raise ValueError("g is the Poincaré transformation's dt/dτ; the logarithmic "
                             "Hamiltonian (transform='logh') has its own, 1/(T + p_t): pass "
                             "transform='poincare' with g")
        K = LogHamiltonian(system, state_shape=state_shape)
    elif transform == "poincare":
        K = PoincareTransform(system, g, state_shape=state_shape)
    else:
        raise ValueError(f"transform must be 'logh' or 'poincare', got {transform!r}")
    if (steps is None) == (until is None):
        raise ValueError("pass exactly one of steps= (a number of fictive steps) and until= (an end time)")
    ext = _Extended(state_shape)
    t = _start_time(t0, batch, q0.dtype, q0.device)
    # in the caller's grad mode: p_t = −H(q₀, p₀) depends on H's parameters (and on t₀ for a
    # time-dependent H), and for the logarithmic Hamiltonian they reach the flow only through it
    E0 = system.energy(q0, p0, t) if getattr(system, "time_dependent", False) else system.energy(q0, p0)
    if transform == "logh":
        V0 = system.potential(q0)
        if not bool((V0 < 0).all()):
            raise ValueError("the logarithmic Hamiltonian needs V(q) < 0 (an attractive potential "
                             "such as −Σ m_i m_j/r_ij; −V is dt/dτ's inverse on the energy shell); "
                             f"max V(q0) = {V0.max().item():g}: shift V or use transform='poincare'")
    if transform == "poincare":
        gv = K.g(q0, p0)
        if tuple(gv.shape) != tuple(batch):
            raise ValueError(f"g returned shape {tuple(gv.shape)}, expected the batch shape {tuple(batch)}")
        if not bool((gv > 0).all()) or not bool(torch.isfinite(gv).all()):
            raise ValueError(f"the time transformation g must be finite and > 0 (dt/dτ = g); "
                             f"min g(q0, p0) = {gv.min().item():g}")
    Q0, P0 = ext.join(q0, t), ext.join(p0, -E0)
    if steps is not None:
        Q, P = rollout(K, Q0, P0, h=eps, steps=steps, method=_method(method), save_every=save_every,
                       **rollout_options)
    else:
        until = check_scalar(until, "until", "time")   # float() took a string, detached a grad
        if not bool(((until - t) * eps > 0).all()):
            raise ValueError(f"until = {until} is not ahead of t0 in the direction of eps = {eps}")
        if chunk % save_every:
            raise ValueError("chunk must be a multiple of save_every")
        Qs, Ps, n = [Q0.unsqueeze(0)], [P0.unsqueeze(0)], 0
        Q, P = Q0, P0
        while True:
            if n >= max_steps:
                raise StepSizeCollapse(f"{max_steps} fictive steps did not reach t = {until}")
            Qc, Pc = rollout(K, Q, P, h=eps, steps=chunk, method=_method(method), save_every=save_every,
                             **rollout_options)
            Qs.append(Qc[1:]), Ps.append(Pc[1:])
            Q, P, n = Qc[-1], Pc[-1], n + chunk
            if bool(((ext.split(Q)[1] - until) * eps >= 0).all()):
                break
        Q, P = torch.cat(Qs), torch.cat(Ps)
        steps = n
    q, tt = ext.split(Q)
    p, _ = ext.split(P)
    d = (tt[1:] - tt[:-1]) * eps
    if d.numel() and not bool((d > 0).all()):
        raise StepSizeCollapse("physical time stopped advancing monotonically (dt/dτ ≤ 0 somewhere: "
                               "a non-positive g, or T − E ≤ 0 for the logarithmic Hamiltonian); "
                               "reduce eps or check g")
    return AdaptiveTrajectory(q, p, tt, system, Q=Q, P=P,
                              steps=steps, save_every=save_every)


# -- odeint ------------------------------------------------------------------------------------------

def odeint_adaptive(integrator, system, state, times, options, step_size, grad="backprop",
                    grad_options=None):
    """``odeint(..., options=dict(adaptive="reversible", step_size=ε, control=σ))``: reversible
    variable steps of fictive size ε from t[0] until every sample passes t[-1], then the states
    at t by dense output (t[0] is the initial state itself).  ``control``: σ(q) or σ(q, p) on the
    user's shapes (batch dims leading), or a :class:`StepControl`; default |q|^{3/2}.
    ``grad``, ``grad_options``: odeint's parsed grad options, passed to :func:`adaptive_rollout`."""
    if options["adaptive"] != "reversible":
        raise ValueError(f"options['adaptive'] must be 'reversible', got {options['adaptive']!r} "
                         "(time transformations: tgi.time_transformed_rollout)")
    if step_size is None:
        raise ValueError("options['adaptive'] = 'reversible' needs options['step_size'] = ε, the "
                         "fictive step (the physical step is ε·σ(q, p))")
    nb = len(state.batch)

    def user_q(q):
        lead = q.shape[:q.dim() - 1 - nb]
        return q.reshape(*lead, *state.q_shape)

    control = options.get("control")   # a StepControl is taken as is (on the flat (*batch, n) q, p)
    if control is None:
        control = power_law_control(1.5)
    elif not isinstance(control, StepControl):
        if not callable(control):
            raise TypeError("options['control'] must be callable as sigma(q) or sigma(q, p), or a StepControl")
        user = control
        if _n_positional(user) >= 2:
            control = StepControl(lambda q, p: user(*state.user(q, p)))
        else:
            control = StepControl(lambda q: user(user_q(q)))
    h_min = options.get("h_min", 0.0)
    form = options.get("form", "log")
    max_steps = options.get("max_steps", 10 ** 7)
    if len(times) < 2:
        return state.q0.unsqueeze(0), state.p0.unsqueeze(0)
    direction = 1.0 if times[-1] > times[0] else -1.0
    traj = adaptive_rollout(system, state.q0, state.p0, eps=direction * step_size, control=control,
                            until=times[-1], method=integrator, t0=times[0], h_min=h_min,
                            max_steps=max_steps, form=form, grad=grad,
                            progress=options.get("progress", False), **(grad_options or {}))
    tt = torch.tensor(times[1:], dtype=state.q0.dtype, device=state.q0.device)
    Q, P = traj.at(tt)
    return torch.cat([state.q0.unsqueeze(0), Q]), torch.cat([state.p0.unsqueeze(0), P])
