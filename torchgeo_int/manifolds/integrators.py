r"""Symplectic-momentum integrators on T*G and T*S².

**Lie-group integrators** (eq. (20) of the seed paper with the discretization map
R_d(g, ξ) = (g τ(−αξ), g τ((1−α)ξ)) and its left-trivialised cotangent lift, see
:mod:`torchgeo_int.manifolds.lie`; Barbero-Liñán, Marrero & Martín de Diego, arXiv:2401.14800).
The step (g_k, μ_k) ↦ (g_{k+1}, μ_{k+1}) is, with base point (ḡ, μ̄), V = hξ:

    ξ = ∂H/∂μ(ḡ, μ̄),   g_k = ḡ τ(−αV),   g_{k+1} = ḡ τ((1−α)V),
    Ad*_{τ((1−α)V)⁻¹} μ_{k+1} − Ad*_{τ(−αV)⁻¹} μ_k = −h L_ḡ*(∂H/∂g)(ḡ, μ̄),
    μ̄ = (1−α)(dτᴸ_{(1−α)V})* μ_{k+1} + α(dτᴸ_{−αV})* μ_k.

α = ½: g_k = ḡτ(−hξ/2), g_{k+1} = ḡτ(hξ/2) (symmetric, order 2).  α = 0, the map (g, gτ(ξ)):
ḡ = g_k, g_{k+1} = g_k τ(hξ), ξ = ∂H/∂μ(g_k, μ̄), μ̄ = (dτᴸ_{hξ})*μ_{k+1} and
μ_{k+1} = Ad*_{τ(hξ)}(μ_k − h L_{g_k}*∂H/∂g(g_k, μ̄)) (order 1; α = 1 is its adjoint).
On SO(3) (Ad*_{g⁻¹}μ = gμ) with u = τ(−αV)μ_k, w = u − h f:
μ_{k+1} = τ(−(1−α)V) w,  μ̄ = (1−α)(dτᴿ_{(1−α)V})ᵀ w + α(dτᴿ_{−αV})ᵀ u.

The step is the graph of :class:`~torchgeo_int.manifolds.lie.LieCotangentLift` (its
``momentum_in``/``mu_bar``/``momentum_out`` equations and its map's ``base_point``/``end_point``):
the lift is the one home of these formulas, the integrator only chooses the unknowns and solves.
The unknowns are solved by :func:`~torchgeo_int.fixed_point` (or Newton): μ̄ alone when
H = ½μᵀ𝕀⁻¹μ + U(g) (ξ = 𝕀⁻¹μ̄ then fixes ḡ = g_k τ(αhξ)), (ξ, μ̄) for a general H.  For the free
rigid body with Cayley and α = ½ the equations reduce to μ_{k+1} = cay(−hξ/2)² μ_k,
g_{k+1} = g_k cay(hξ/2)² and μ̄ = 4/(4 + |hξ/2|²) cay(−hξ/2) μ_k: a 3-vector fixed point with
no autograd.  g stays on the group to round-off (products of τ's, no re-orthonormalisation);
the left-invariance of R_d makes the spatial momentum Ad*_{g⁻¹}μ an exact discrete invariant
(discrete Noether) for left-invariant H, and since μ_{k+1} is a coadjoint image of μ_k when
f = 0, coadjoint-orbit Casimirs (|μ| on SO(3)) are exact.

**RATTLE** on T*S² (HLW VII.1.4): the Störmer–Verlet composition of the α = 0 and α = 1
cotangent-lift methods of R³ (THEORY §8) with the holonomic constraint |q| = 1 imposed by
Lagrange multipliers, both of which have closed forms on the sphere.  It is symplectic on T*S²,
symmetric, order 2, explicit, and keeps |q| = 1, q·p = 0 to round-off at every step.
"""
from __future__ import annotations

import numbers

import torch

from ..integrators import TABLES, Composition
from ..integrators.base import ImplicitIntegrator, Integrator
from ..integrators.registry import register
from ..maps import check_alpha
from .._validate import check_finite, check_pair
from ..solvers import SolveOptions
from . import so3
from .lie import LieCotangentLift, LieGroupMap, SO3Group, Tau
from .systems import HeavyTop, LieGroupSystem, SphericalPendulum

Tensor = torch.Tensor

__all__ = ["LieGroupIntegrator", "LieComposition", "Rattle", "lie_method", "LIE_METHODS"]

_TAUS = ("cayley", "exp")


class LieGroupIntegrator(ImplicitIntegrator):
    r"""Eq. (20) on T*G with the map R_d(g, ξ) = (g τ(−αξ), g τ((1−α)ξ)) (module docstring).

    ``tau``: ``"cayley"`` (rational, cheapest) or ``"exp"``; ``alpha`` in [0, 1] (½: symmetric,
    order 2; otherwise order 1); ``solver``: ``"fixed_point"`` or ``"newton"``; ``tol``,
    ``max_iter``, ``backward`` (``"implicit"``: exact IFT gradients), ``check_every``
    (iterations between convergence checks, one host sync each) go to the solver.  For rigid
    bodies the iteration is preconditioned to contract by O(h²) and warm-started by
    extrapolating the previous steps' solutions: typically 2–4 iterations per step.
    Steps a :class:`~torchgeo_int.manifolds.systems.LieGroupSystem`:
    ``step(system, g, mu, t, h, cache) -> (g, mu, cache)`` with g (..., *point_shape) and
    μ (..., dim) (on SO(3): (..., 3, 3) and (..., 3)).  Symplectic, and momentum-preserving for
    symmetric H.  Reference: Barbero-Liñán, Marrero & Martín de Diego, arXiv:2401.14800.
    """

    field_only = False   # (its steps read the system itself: no variable steps)

    symplectic = True

    def __init__(self, tau: str = "cayley", alpha: float = 0.5, *, solver: str = "fixed_point",
                 tol: float | None = None, max_iter: int | None = None, backward: str = "implicit",
                 check_every: int = 4, name: str | None = None):
        if isinstance(tau, Tau):
            tau = tau.name
        if tau not in _TAUS:
            raise ValueError(f"tau must be one of {_TAUS}, got {tau!r}")
        self.tau_name, self.alpha = tau, check_alpha(alpha)
        self.options = SolveOptions(solver, tol, max_iter, backward, check_every)
        self.symmetric = self.alpha == 0.5
        self.order = 2 if self.symmetric else 1
        kind = {0.5: "midpoint", 0.0: "euler", 1.0: "euler_adjoint"}.get(self.alpha,
                                                                         f"alpha{self.alpha:g}")
        self.name = name or f"lie_{kind}_{tau}"
        self._lifts = {}

    def lift(self, group) -> LieCotangentLift:
        """The cotangent lift of LieGroupMap(group, tau, α) whose equations the step solves
        (one per group, built on first use)."""
        lift = self._lifts.get(group)
        if lift is None:
            lift = self._lifts[group] = LieCotangentLift(LieGroupMap(group, self.tau_name, self.alpha))
        return lift

    @property
    def check_every(self) -> int:
        return self.options.check_every

    def _solve(self, F, z0, args):
        """z = F(z, *args); ``args`` holds the state F reads (see solvers' note on args)."""
        return self.options.solve(F, z0, args)

    def adjoint(self):
        return self._options_to(LieGroupIntegrator(self.tau_name, 1.0 - self.alpha))

    def key(self) -> tuple:
        return ("lie_group", self.tau_name, self.alpha)

    def check_state(self, system, g, mu):
        """Validate a rollout's initial state (g (..., *point_shape), μ (..., dim))."""
        _check_system(system)
        system.group.check_state(g, mu, ("g0", "mu0"))

    def step(self, system, g, mu, t, h, cache=None):
        _check_system(system)
        group = system.group
        lift = self.lift(group)
        R = lift.R
        a, tb = self.alpha, t + self.alpha * h
        if (system.rigid and isinstance(group, SO3Group) and self.tau_name == "cayley"
                and a == 0.5):
            return self._rigid_cayley_step(system, g, mu, t, h, cache)
        # (V, M) = h X_H(ḡ, μ̄) in the lift's equations: w = u − h f, f = L_ḡ*∂H/∂g at ḡ.
        if system.rigid:
            def F(mb, g, mu):
                V = h * system.velocity(mb)
                f = -system.torque(R.base_point(g, V), tb)
                u = lift.momentum_in(V, mu)
                return lift.mu_bar(V, u, u - h * f)

            mb = self._solve(_preconditioned(F, system, group, h), _guess(cache, h, mu), (g, mu))
            V = h * system.velocity(mb)
            f = -system.torque(R.base_point(g, V), tb)
            new_cache = _new_cache(cache, h, mb)
        else:
            def F(z, g, mu):
                xi, mb = z
                V = h * xi
                f, xi_new = system.gradients(R.base_point(g, V), mb, tb)
                u = lift.momentum_in(V, mu)
                return xi_new, lift.mu_bar(V, u, u - h * f)

            z0 = _guess(cache, h, None)
            if z0 is None or not isinstance(z0, tuple):
                z0 = (system.gradients(g, mu, t)[1].detach(), mu.detach())
            xi, mb = self._solve(F, z0, (g, mu))
            V = h * xi
            f, _ = system.gradients(R.base_point(g, V), mb, tb)
            new_cache = _new_cache(cache, h, (xi, mb))
        mu1 = lift.momentum_out(V, lift.momentum_in(V, mu) - h * f)
        return R.end_point(g, V), mu1, new_cache

    def _rigid_cayley_step(self, system, g, mu, t, h, cache):
        r"""α = ½, τ = cay on SO(3), H = ½μᵀ𝕀⁻¹μ + U(g).  With x = (h/2)𝕀⁻¹μ̄ every τ of the
        step is cay(±x) and shares s = 4/(4 + |x|²); with T = torque at ḡ = g_k cay(x):

            u = cay(−x) μ_k,  w = u + h T,  μ̄ = ½ s [(u + w) − (h/2) x × T],
            μ_{k+1} = cay(−x) w,  g_{k+1} = g_k cay(x)²

        (free body: T = 0, μ̄ = s cay(−x) μ_k, μ_{k+1} = cay(−x)² μ_k).  Written with few tensor
        ops: on small batches the cost of a step is the per-op overhead."""
        I = system.inertia.to(mu)
        diagonal = I.dim() == 1
        c = (0.5 * h) / I if diagonal else None
        free = system.potential is None
        heavy = isinstance(system, HeavyTop)
        gamma = system.gamma(g) if heavy else None
        tb = t + 0.5 * h

        def half(v):
            return v * c if diagonal else (0.5 * h) * system.velocity(v)

        def s_of(x):
            return (x * x).sum(-1, keepdim=True).mul_(0.25).add_(1.0).reciprocal_()

        def rot_minus(x, s, v):  # cay(−x) v = v + ½ s (x×(x×v) − 2 x×v)
            c1 = torch.linalg.cross(x, v, dim=-1)
            return torch.addcmul(v, s, torch.add(torch.linalg.cross(x, c1, dim=-1), c1,
                                                 alpha=-2.0), value=0.5)

        def half_cay(x, s):  # cay(x) − I
            X = so3.hat(x)
            return s.unsqueeze(-1) * torch.add(X, X @ X, alpha=0.5)

        def torque(x, s, g, gamma):
            if heavy:   # Γ̄ = ḡᵀe₃ = cay(−x) Γ_k: a vector rotation instead of ḡ
                return -system.mgl * torch.linalg.cross(system.com.to(mu).expand_as(gamma),
                                                        rot_minus(x, s, gamma), dim=-1)
            return system.torque(g + g @ half_cay(x, s), tb)

        def F(mb, g, mu, gamma):   # the state (g, μ, Γ) goes in as the solver's args
            x = half(mb)
            s = s_of(x)
            u = rot_minus(x, s, mu)
            if free:
                return s * u
            T = torque(x, s, g, gamma)
            return (0.5 * s) * torch.add(torch.add(u, T, alpha=h).add_(u),
                                         torch.linalg.cross(x, T, dim=-1), alpha=-0.5 * h)

        def G(mb, g, mu, gamma):  # the O(h²)-contraction preconditioner of _preconditioned, inlined
            r = F(mb, g, mu, gamma) - mb
            return torch.add(mb + r, torch.linalg.cross(mu, half(r), dim=-1))

        mb = self._solve(G, _guess(cache, h, mu), (g, mu, gamma))
        x = half(mb)
        s = s_of(x)
        w = rot_minus(x, s, mu)
        if not free:
            w = torch.add(w, torque(x, s, g, gamma), alpha=h)
        mu1 = rot_minus(x, s, w)
        K1 = half_cay(x, s)
        g1 = g + g @ torch.add(K1 @ K1, K1, alpha=2.0)
        return g1, mu1, _new_cache(cache, h, mb)


def _preconditioned(F, system, group, h):
    r"""z ↦ z + (I + A)(F(z) − z) with A r = (h/2) ad*_{𝕀⁻¹r} μ_k.

    For H = ½μᵀ𝕀⁻¹μ + U(g), F(μ̄) = μ_k + (h/2) ad*_{𝕀⁻¹μ̄} μ_k + O(h²) for every α (the α-terms
    of u and of the dτ-weights cancel at first order), so I + A ≈ (I − J_F)⁻¹: the iteration has
    the same fixed points and implicit-function gradients, but contracts by O(h²) per iteration
    instead of O(h)."""
    def G(z, g, mu):
        r = F(z, g, mu) - z
        return z + r + (0.5 * h) * group.ad_star(system.velocity(r), mu)

    return G


# Extrapolation weights through the last 1, 2, 3, 4 solutions (error O(h), O(h²), O(h³), O(h⁴)).
_EXTRAPOLATION = {1: (1.0,), 2: (2.0, -1.0), 3: (3.0, -3.0, 1.0), 4: (4.0, -6.0, 4.0, -1.0)}


def _guess(cache, h, default):
    """Warm start of μ̄ (or (ξ, μ̄)): polynomial extrapolation through the last (up to four)
    solutions taken with the same step h, or ``default``.  Stages of a composition have other
    step sizes: they reuse only the last solution (an O(h) guess)."""
    if cache is None:
        return default
    if cache[0] != h:
        return cache[1][0]
    zs = cache[1]

    def extrap(*parts):
        out = None
        for w, z in zip(_EXTRAPOLATION[len(parts)], parts):
            out = w * z if out is None else torch.add(out, z, alpha=w)
        return out

    if isinstance(zs[0], tuple):
        return tuple(extrap(*parts) for parts in zip(*zs))
    return extrap(*zs)


def _new_cache(cache, h, z):
    z = tuple(x.detach() for x in z) if isinstance(z, tuple) else z.detach()
    prev = cache[1][:3] if (cache is not None and cache[0] == h) else ()
    return (h, (z, *prev))


def _check_system(system):
    if not isinstance(system, LieGroupSystem):
        raise TypeError(f"Lie-group integrators step a LieGroupSystem (H(g, mu) on T*G), got "
                        f"{type(system).__name__}; for Hamiltonians on R^n use tgi.METHODS")


class LieComposition(Composition):
    """:class:`~torchgeo_int.Composition` of Lie-group steps (the triple jump, Suzuki, Yoshida,
    Kahan–Li tables over the symmetric Lie midpoint reach orders 4, 6, 8); adds
    ``check_state`` for rollouts."""

    def check_state(self, system, g, mu):
        self._stages[0][0].check_state(system, g, mu)

    def adjoint(self):
        return LieComposition([m.adjoint() for m, _ in reversed(self._stages)],
                              [c for _, c in reversed(self._stages)], order=self.order)


def lie_method(name: str = "midpoint", tau: str = "cayley", **solver_options) -> Integrator:
    """A Lie-group method by name: ``"midpoint"`` (α = ½, order 2), ``"euler"`` (α = 0, the map
    (g, g τ(ξ))), ``"euler_adjoint"`` (α = 1), or a composition table of ``tgi.TABLES``
    (``"yoshida4"``, ``"suzuki4"``, ``"yoshida6"``, ``"kahan_li6"``, ``"yoshida8"``,
    ``"kahan_li8"``) over the Lie midpoint."""
    alphas = {"midpoint": 0.5, "euler": 0.0, "euler_adjoint": 1.0}
    if name in alphas:
        return LieGroupIntegrator(tau, alphas[name], **solver_options)
    if name in TABLES:
        table = TABLES[name]
        base = LieGroupIntegrator(tau, 0.5, **solver_options)
        return LieComposition(base, table.gammas, order=table.order, name=f"lie_{name}_{tau}")
    raise ValueError(f"unknown Lie-group method {name!r}; known: {', '.join(alphas)}, "
                     f"{', '.join(TABLES)}")


#: Named Lie-group methods: ``lie_<midpoint|euler|euler_adjoint|table>_<cayley|exp>``.
LIE_METHODS = {m.name: m for m in (lie_method(n, tau) for tau in _TAUS
                                   for n in ["midpoint", "euler", "euler_adjoint", *TABLES])}
register("lie", LIE_METHODS, "a LieGroupSystem, state (g, mu)")


class Rattle(Integrator):
    r"""RATTLE for H = |p|²/(2M) + V(q) on T*Sⁿ ⊂ R^{n+1} × R^{n+1} (|q| = r, q·p = 0):

        p_{½} = p_k + (h/2)(F(q_k) − λ q_k),   q_{k+1} = q_k + (h/M) p_{½},   |q_{k+1}| = r,
        p_{k+1} = p_{½} + (h/2)(F(q_{k+1}) − ν q_{k+1}),                        q_{k+1}·p_{k+1} = 0,

    F = −∇V.  λ is the small root of a quadratic, ν a projection: the step is explicit and the
    constraints hold to round-off at every step (no drift).  Order 2, symmetric, symplectic on
    T*Sⁿ; FSAL (one force per step).  Reference: Andersen, J. Comput. Phys. 52 (1983); HLW VII.1.4.
    """

    field_only = False   # (its steps read the system itself: no variable steps)

    name, order, symplectic, symmetric = "rattle", 2, True, True

    def adjoint(self):
        return self

    def key(self) -> tuple:
        return ("rattle",)

    def check_state(self, system, q, p):
        _check_sphere_system(system)
        check_pair(q, p, ("q0", "p0"))      # (one shape, dtype and device: mixed dtypes ran)
        if not q.is_floating_point():
            raise TypeError(f"q0 and p0 must be floating point, got {q.dtype}")
        dim = getattr(system, "space_dim", None)
        if q.dim() == 0 or (dim is not None and q.shape[-1] != dim):
            raise ValueError(f"q0 and p0 must have shape (..., {dim or 'n+1'}): points of the sphere "
                             f"in R^{dim or 'n+1'} and their momenta, got {tuple(q.shape)}")
        check_finite(q, "q0")
        check_finite(p, "p0")
        if not q.numel():
            return
        with torch.no_grad():
            r = system.radius
            err = float(((q * q).sum(-1).sqrt() - r).abs().max())
            tang = float((q * p).sum(-1).abs().max())
        scale = torch.finfo(q.dtype).eps ** 0.5
        if err > scale * r or tang > scale * (1.0 + float(p.abs().max())):
            raise ValueError(f"(q0, p0) must lie on T*S^n: | |q| - {r} | = {err:.2e}, "
                             f"|q.p| = {tang:.2e}; use sphere.project_state(q, p)")

    def step(self, system, q, p, t, h, cache=None):
        _check_sphere_system(system)
        M, r2 = system.mass_matrix, system.radius ** 2
        force = system.force(q, t) if cache is None else cache
        if isinstance(h, numbers.Real) and h == 0:     # the identity (λ below would be 0/0)
            return q, p, force
        a = p + (0.5 * h) * force
        c = h / M
        b = q + c * a
        qq, bq, bb = (q * q).sum(-1, keepdim=True), (b * q).sum(-1, keepdim=True), \
            (b * b).sum(-1, keepdim=True)
        # |b − cλq|² = r²: the root that vanishes with h, in the cancellation-free form
        disc = bq * bq - qq * (bb - r2)
        lam = (bb - r2) / (c * (bq + torch.sqrt(disc)))
        p_half = a - lam * q
        q1 = q + c * p_half
        force1 = system.force(q1, t + h)
        p1 = p_half + (0.5 * h) * force1
        p1 = p1 - ((q1 * p1).sum(-1, keepdim=True) / (q1 * q1).sum(-1, keepdim=True)) * q1
        return q1, p1, force1


def _check_sphere_system(system):
    if not isinstance(system, SphericalPendulum):
        raise TypeError(f"Rattle steps a SphericalPendulum-like system (H = |p|²/2M + V(q) on "
                        f"T*S^n, attributes mass_matrix and radius), got {type(system).__name__}")
