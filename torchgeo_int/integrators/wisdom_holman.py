r"""Near-integrable splittings of the N-body problem: Wisdom–Holman maps and Laskar–Robutel SABA_n.

In Jacobi coordinates (q'_0 the centre of mass, q'_i the position of body i relative to the
centre of mass of bodies 0 … i−1; p' = A^{−T} p for q' = A q) the N-body Hamiltonian splits as
(Wisdom & Holman, Astron. J. 102 (1991) 1528)

    H = H_K + H_I,   H_K = |p'_0|²/(2η_n) + Σ_i [ |p'_i|²/(2m'_i) − G m_0 m_i/|q'_i| ],
                     H_I = V(q) + Σ_i G m_0 m_i/|q'_i|,

m'_i = m_i η_{i−1}/η_i, η_i = m_0 + … + m_i.  H_K is n independent Kepler problems (μ_i =
G m_0 η_i/η_{i−1}) plus a free centre of mass: its flow is exact (:func:`kepler_flow`, universal
variables with Stumpff functions, batched); H_I depends on positions only and is O(ε) = O(m_i/m_0)
(the Sun–planet parts of V cancel against the Jacobi Kepler terms).  A splitting table (kicks:
H_I, drifts: H_K) then has error O(ε h^p + ε² h^q): for Laskar–Robutel SABA_n, O(ε h^{2n} + ε² h²)
(``Splitting.epsilon_order``).  :class:`NearIntegrable` runs any :class:`~.splitting.Splitting`
this way, one force evaluation (∂H_I/∂q') per kick, FSAL across steps.
"""
from __future__ import annotations

import math

import torch

from .._validate import check_int
from ..systems import System
from .base import Integrator
from .splitting import Splitting, SPLITTING_METHODS

# Stumpff series c2(z) = Σ (−z)^k/(2k+2)!, c3(z) = Σ (−z)^k/(2k+3)!: 10 terms are exact to
# round-off for |z| ≤ 1 (the next term is < 1/22! ≈ 9e-22); the closed forms are used above.
_C2 = [(-1) ** k / math.factorial(2 * k + 2) for k in range(10)]
_C3 = [(-1) ** k / math.factorial(2 * k + 3) for k in range(10)]


def _horner(coefs, z):
    out = torch.full_like(z, coefs[-1])
    for c in reversed(coefs[:-1]):
        out = out * z + c
    return out


def stumpff(z):
    """(c2(z), c3(z)) for z ≥ 0 (elliptic orbits): series for z ≤ 1, closed forms above
    (c2 = 2 sin²(√z/2)/z, c3 = (√z − sin √z)/√z³)."""
    small = z <= 1.0
    zs = torch.where(small, torch.ones_like(z), z)
    s = zs.sqrt()
    c2 = torch.where(small, _horner(_C2, z), 2 * torch.sin(s / 2) ** 2 / zs)
    c3 = torch.where(small, _horner(_C3, z), (s - torch.sin(s)) / (zs * s))
    return c2, c3


def kepler_flow(x, v, mu, dt, iterations=8, check=True):
    r"""The exact flow of ẍ = −μ x/|x|³ over time ``dt`` (bound orbits), batched over the leading
    dims of x, v (…, 3) and mu (…): universal variable χ from Kepler's equation
    √μ dt = r0 v_r0/√μ χ² c2 + (1 − α r0) χ³ c3 + r0 χ (α = 2/r0 − v0²/μ, z = αχ²) by
    ``iterations`` Laguerre–Conway steps (n = 5; Conway, Celest. Mech. 39 (1986) 199), then the
    Lagrange f, g functions (Danby 1988, Sect. 6.9; Curtis, Orbital Mechanics, Sect. 3.7).  From
    the guess χ = √μ α dt it reaches round-off in ≤ 5 steps for e up to 0.999, any phase, dt up
    to half a period (Newton from that guess needed up to 13, at e = 0.99 from pericentre);
    ``check`` (one host sync) raises if the last step still moved χ by more than 1e-12 relative.
    Unbound orbits (α ≤ 0) are refused; with ``check=False`` they are not, and the result is
    wrong (the elliptic guess and branch are used)."""
    if check and not bool((2.0 / x.norm(dim=-1) - (v * v).sum(-1) / mu > 0).all()):
        raise ValueError("kepler_flow: an orbit is not bound (v² ≥ 2μ/r); only elliptic orbits "
                         "are supported")
    r0 = x.norm(dim=-1)
    smu = mu.sqrt()
    rv = (x * v).sum(-1)
    alpha = 2.0 / r0 - (v * v).sum(-1) / mu
    a = rv / smu
    b = 1.0 - alpha * r0
    chi = smu * alpha * dt                                  # elliptic first guess
    for _ in range(iterations):
        z = alpha * chi * chi
        c2, c3 = stumpff(z)
        chi2 = chi * chi
        F = a * chi2 * c2 + b * chi2 * chi * c3 + r0 * chi - smu * dt
        dF = a * chi * (1.0 - z * c3) + b * chi2 * c2 + r0          # = r(χ) > 0
        d2F = a * (1.0 - z * c2) + b * chi * (1.0 - z * c3)
        # Laguerre's step, n = 5: cubic near the root and convergent from far guesses where
        # Newton overshoots (eccentric orbits near pericentre); the root term is ≥ 4 r > 0 there
        root = (16.0 * dF * dF - 20.0 * F * d2F).abs().sqrt()
        step = 5.0 * F / (dF + root)
        chi = chi - step
    # converged: the last step below 1e-12 relative, or its dtype's round-off of χ (the terms of
    # F are up to a/r ~ 1/(1 − e) larger than χ's own, hence 256 ε: float32's last steps wander
    # at ~1e-6 relative however many are taken)
    info = torch.finfo(chi.dtype)
    if check and not bool((step.abs() <= max(1e-12, 256 * info.eps) * chi.abs() + info.tiny).all()):
        raise ValueError(f"kepler_flow: Kepler's equation not solved in {iterations} Laguerre steps "
                         "(dt long for the orbit, or a near-parabolic one: raise the iterations, "
                         "JacobiNBody(..., kepler_iterations=20))")
    z = alpha * chi * chi
    c2, c3 = stumpff(z)
    chi2 = chi * chi
    f = 1.0 - chi2 / r0 * c2
    g = dt - chi2 * chi * c3 / smu
    x1 = f[..., None] * x + g[..., None] * v
    r1 = x1.norm(dim=-1)
    fd = smu / (r1 * r0) * chi * (z * c3 - 1.0)
    gd = 1.0 - chi2 / r1 * c2
    return x1, fd[..., None] * x + gd[..., None] * v


class JacobiNBody(System):
    r"""The N-body problem H = Σ|p_i|²/(2m_i) − G Σ_{i<j} m_i m_j/|q_i − q_j| in Jacobi
    coordinates (q', p') of shape (…, N, 3), body 0 the central one (module docstring).
    ``potential_grad(q)``: ∂V/∂q in the original coordinates, closed form (optional)."""

    separable = False

    def __init__(self, masses, G, potential_grad=None, *, kepler_iterations: int = 8):
        super().__init__()
        # Laguerre steps of each Kepler drift (kepler_flow): ≤ 5 reach round-off up to e = 0.999
        # and half a period; more only for orbits nearer parabolic
        self.kepler_iterations = check_int(kepler_iterations, "kepler_iterations", 1)
        m = torch.as_tensor(masses, dtype=torch.float64)
        if m.dim() != 1 or len(m) < 2 or not bool((m > 0).all() & torch.isfinite(m).all()):
            raise ValueError("masses: a 1-D tensor of at least 2 positive, finite masses")
        if isinstance(G, bool) or not isinstance(G, (int, float)) or not 0 < float(G) < math.inf:
            raise ValueError(f"G must be a positive, finite number, got {G!r}")
        n = len(m)
        eta = torch.cumsum(m, 0)
        A = torch.zeros(n, n, dtype=m.dtype)
        A[0] = m / eta[-1]
        for i in range(1, n):
            A[i, :i] = -m[:i] / eta[i - 1]
            A[i, i] = 1.0
        self.G, self.n = float(G), n
        i, j = torch.triu_indices(n, n, 1)
        # buffers, so that .to(dtype/device) moves every constant; states of another dtype or
        # device cast them at use (_c)
        for name, value in (("m", m), ("eta", eta), ("A", A), ("Ainv", torch.linalg.inv(A)),
                            ("mprime", torch.cat([eta[-1:], m[1:] * eta[:-1] / eta[1:]])),  # m'_0 = η_n
                            ("mu", self.G * m[0] * eta[1:] / eta[:-1]),                      # μ_i, i ≥ 1
                            ("direct", self.G * m[0] * m[1:]),                               # G m_0 m_i
                            ("_mm", self.G * m[i] * m[j]), ("_i", i), ("_j", j)):
            self.register_buffer(name, value, persistent=False)
        self._potential_grad = potential_grad

    @staticmethod
    def _c(buf, x):
        """A constant in the dtype and on the device of the state x."""
        if buf.device != x.device or (buf.is_floating_point() and buf.dtype != x.dtype):
            return buf.to(device=x.device, dtype=x.dtype if buf.is_floating_point() else buf.dtype)
        return buf

    def check_bodies(self, q, name="q"):
        """q of shape (…, N, d) for this system's N bodies, or a clear error."""
        if not isinstance(q, torch.Tensor) or q.dim() < 2 or q.shape[-2] != self.n:
            shape = tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__
            raise ValueError(f"{name} must have shape (..., {self.n}, d) for this system's "
                             f"{self.n} bodies, got {shape}")

    # coordinates
    def to_jacobi(self, q, p):
        self.check_bodies(q), self.check_bodies(p, "p")
        return self._c(self.A, q) @ q, self._c(self.Ainv, p).T @ p

    def from_jacobi(self, qj, pj):
        self.check_bodies(qj, "qj"), self.check_bodies(pj, "pj")
        return self._c(self.Ainv, qj) @ qj, self._c(self.A, pj).T @ pj

    def potential(self, q):
        i, j = self._c(self._i, q), self._c(self._j, q)
        return -(self._c(self._mm, q) / (q[..., i, :] - q[..., j, :]).norm(dim=-1)).sum(-1)

    def _dV(self, q):
        if self._potential_grad is not None:
            return self._potential_grad(q)
        diff = q[..., :, None, :] - q[..., None, :, :]
        n = q.shape[-2]
        eye = torch.eye(n, dtype=q.dtype, device=q.device)
        r2 = (diff * diff).sum(-1) + eye
        m = self._c(self.m, q)
        w = self.G * m[:, None] * m[None, :] * (1.0 - eye) / r2 ** 1.5
        return (w[..., None] * diff).sum(-2)

    def energy(self, qj, pj, t=0.0):
        q, p = self.from_jacobi(qj, pj)
        return ((p * p).sum(-1) / (2 * self._c(self.m, p))).sum(-1) + self.potential(q)

    def interaction_grad(self, qj):
        """∂H_I/∂q' = A^{−T} ∂V/∂q − Σ_i G m_0 m_i q'_i/|q'_i|³ (the kick's force term)."""
        Ainv = self._c(self.Ainv, qj)
        g = Ainv.T @ self._dV(Ainv @ qj)
        r = qj[..., 1:, :]
        d = -self._c(self.direct, qj)[:, None] * r / r.norm(dim=-1, keepdim=True) ** 3
        return g + torch.cat([torch.zeros_like(g[..., :1, :]), d], -2)

    def kepler_drift(self, qj, pj, dt):
        """The exact flow of H_K over dt: free centre of mass, Kepler orbits of the others."""
        mprime, mu = self._c(self.mprime, pj), self._c(self.mu, pj)
        v = pj / mprime[:, None]
        x0 = qj[..., :1, :] + dt * v[..., :1, :]
        x1, v1 = kepler_flow(qj[..., 1:, :], v[..., 1:, :], mu.expand(qj.shape[:-2] + mu.shape), dt,
                             iterations=self.kepler_iterations)
        return torch.cat([x0, x1], -2), torch.cat([pj[..., :1, :], v1 * mprime[1:, None]], -2)

    def vector_field(self, qj, pj, t=0.0):
        raise NotImplementedError("JacobiNBody is stepped by NearIntegrable (Kepler drifts and "
                                  "interaction kicks), not by a vector-field method")


class NearIntegrable(Integrator):
    r"""A splitting table run on H = H_K + H_I of a :class:`JacobiNBody`: drifts are exact Kepler
    flows, kicks p' ← p' − a h ∂H_I/∂q' (one force evaluation each; a last kick's force is the
    next step's first, FSAL).  ``NearIntegrable("saba3")`` is Laskar–Robutel SABA_3 with error
    O(ε h^6 + ε² h²); ``NearIntegrable("verlet")``-like ``Splitting((0.5, 0.5), (1.0,))`` is the
    Wisdom–Holman map."""

    symplectic = True

    def __init__(self, table, name: str | None = None):
        if isinstance(table, str):
            if table == "verlet":
                table = Splitting((0.5, 0.5), (1.0,), name="verlet")
            elif table in SPLITTING_METHODS:
                table = SPLITTING_METHODS[table]
            else:
                raise ValueError(f"unknown splitting {table!r} for NearIntegrable; known: "
                                 f"{', '.join(['verlet', *sorted(SPLITTING_METHODS)])}")
        if not isinstance(table, Splitting):
            raise TypeError("NearIntegrable takes a Splitting (or the name of one)")
        self.table = table
        self.name = name or f"wh_{table.name}"
        self.order, self.symmetric = table.generic_order, table.symmetric
        self.epsilon_order = table.epsilon_order
        self.evaluations = table.evaluations

    def step(self, system, q, p, t, h, cache=None):
        if not isinstance(system, JacobiNBody):
            raise TypeError(f"{self.name!r} steps a JacobiNBody (Kepler drifts): got "
                            f"{type(system).__name__}")
        system.check_bodies(q)
        kicks, drifts = self.table.kicks, self.table.drifts
        force = cache
        for a, b in zip(kicks, drifts):
            if a != 0.0:
                if force is None:
                    force = system.interaction_grad(q)
                p = torch.add(p, force, alpha=-a * h)
            q, p = system.kepler_drift(q, p, b * h)
            force = None
        if kicks[-1] != 0.0:
            force = system.interaction_grad(q)
            p = torch.add(p, force, alpha=-kicks[-1] * h)
        return q, p, force

    def adjoint(self):
        return NearIntegrable(self.table.adjoint(), name=f"{self.name}_adjoint")
