r"""General splitting and composition methods (Sect. 6.2 of the seed; HLW Sect. II.5, III.3, V.3;
Blanes & Casas, *A Concise Introduction to Geometric Numerical Integration*, 2016).

**Splittings.**  For H = T(p) + V(q) the flows φ^T_t (drift, q ← q + t ∂T/∂p) and φ^V_t (kick,
p ← p − t ∂V/∂q) are explicit and symplectic, and so is any product

    Φ_h = φ^V_{a_s h} ∘ φ^T_{b_s h} ∘ … ∘ φ^V_{a_1 h} ∘ φ^T_{b_0 h} ∘ φ^V_{a_0 h}     (first: a_0)

(:class:`Splitting`: ``kicks`` = (a_0, …, a_s), ``drifts`` = (b_0, …, b_{s−1}); zero end kicks
allowed, e.g. drift-first tables).  It is consistent when Σa = Σb = 1 and symmetric (Φ_{−h} =
Φ_h⁻¹) when both lists are palindromes.  A step runs through the library's one kick/drift loop
(``Integrator.bind`` → ``base.splitting_step``; FSAL: a nonzero last kick's force is the next
step's first), so rollout, odeint, ``compile=True`` and every ``grad=`` mode take it as they take
``verlet``.  Non-separable systems are refused (a T + V split does not exist there).

**Order conditions, checked when a table is made.**  Φ_h = exp(h Z(h)) with Z a Lie series in the
two vector fields; order p means the series of Φ_h agrees with exp(h(A + B)) up to h^p.  We
compute both power series in h (matrix coefficients, to degree 11) for A, B two random 6 × 6
matrices.  By the Amitsur–Levitzki theorem M₆(ℝ) satisfies no polynomial identity of degree < 12,
so a Lie polynomial of degree ≤ 11 that is not zero in the free Lie algebra is not zero on
generic 6 × 6 matrices: the degree-k coefficients agree iff *every* order condition of degree k
(the BCH / Lyndon-word conditions: 2, 1, 2, 3, 6, 9, 18, 30, 56, 99 of them for k = 1…10) holds.
This certifies orders ≤ 10 (SofSpa10 needs all 226 conditions of degree ≤ 10).  Tables built for
H = T + V with T quadratic in p (Runge–Kutta–Nyström, RKN: [V,[V,[V,T]]] = 0 removes conditions)
are declared ``rkn=True``; their extra order is then measured numerically (the log₂ slope of
‖Φ_h − Φ_{h/2}²‖ = C h^{p+1} on a nonlinear 2-degree-of-freedom RKN problem).  For
near-integrable H = A + εB (Laskar–Robutel SABA/SBAB) the ε-linear part of the error is checked
exactly with ε nilpotent (dual-number block matrices): ``epsilon_order`` = q means an error
O(ε h^q + ε² h²).  A wrong table raises ``ValueError`` naming the first failing degree; NaN/inf
coefficients raise before anything else.

**Processing.**  ψ_h = π ∘ K_h ∘ π⁻¹ (:class:`ProcessedSplitting`): n steps cost n kernel steps
plus one π⁻¹ at the start and one π per *saved* state; the kernel's order can be lower than the
effective order of ψ (Blanes, Casas & Ros 2000; Blanes, Casas & Murua 2006).

**Compositions over any base** (:func:`compose`): Φ_{γ_s h} ∘ … ∘ Φ_{γ_1 h} of any integrator,
implicit ones included, with any γ (palindromic or not), its order measured when not declared;
**symplectic DIRK** (:func:`symplectic_dirk`): the seed's L^{b_1 h} ∘ … ∘ L^{b_s h} of the
midpoint map, i.e. the diagonally implicit RK method a_ij = b_j (j < i), a_ii = b_i/2 (HLW VI.4).

Size: one module because splittings, their order certificate (the Lie-series check above) and
processing are one mechanism on (kicks, drifts) coefficient lists; the published tables themselves
live apart, in ``splitting_tables.py``.
"""
from __future__ import annotations

import copy
import functools
import math
from collections.abc import Mapping

import numpy as np
import torch

from .._validate import check_int
from .base import Integrator, Stepper, explicit_splitting, run_splitting, splitting_step
from .composition import Composition, merge_flows

#: Degree of the matrix series: orders ≤ MAX_DEGREE − 1 are certified (see module docstring).
MAX_DEGREE = 11
#: Relative precision granted to tabulated coefficients: an order condition of degree k holds
#: when the defect is within 10× of what moving the coefficients by this much changes.
DIGITS = 1e-11


def _finite(name, what, values):
    try:
        vals = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: {what} must be a sequence of numbers, got {values!r}") from None
    bad = [v for v in vals if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{name}: {what} must be finite, got {bad[0]} in {vals}")
    return vals


def ops_of(kicks, drifts):
    """The (kind, coefficient) sequence K(a_0) D(b_0) K(a_1) … K(a_s), first applied first."""
    ops = []
    for a, b in zip(kicks, drifts):
        ops += [("K", a), ("D", b)]
    ops.append(("K", kicks[-1]))
    return [(k, c) for k, c in ops if c != 0.0]


def inverse_ops(ops):
    """π⁻¹ of a product of flows: the flows in reverse order with negated times."""
    return [(k, -c) for k, c in reversed(ops)]


# -- order conditions in the free Lie algebra ------------------------------------------------------
def _generators(n=6, seed=2026):
    rng = np.random.default_rng(seed)
    A, B = (rng.standard_normal((n, n)) for _ in range(2))
    return {"D": A / np.linalg.norm(A, 2), "K": B / np.linalg.norm(B, 2)}


_GENS = _generators()


def _powers(X, degree):
    """X^j / j!, j = 0 … degree, stacked."""
    out = [np.eye(len(X))]
    for j in range(1, degree + 1):
        out.append(out[-1] @ X / j)
    return np.stack(out)


def _product_series(ops, gens, degree):
    """The truncated power series in h of ∏ exp(c h X) over ``ops`` (first op rightmost), as a
    (degree + 1, n, n) stack.  Multiplying by exp(c h X) is one block-Toeplitz matmul."""
    powers = {k: _powers(X, degree) for k, X in gens.items()}
    n = len(next(iter(gens.values())))
    D = degree + 1
    i, j = np.indices((D, D))
    idx = np.where(i >= j, i - j, D)          # block (i, j) = E_{i−j}, zero above the diagonal
    scale = np.arange(D, dtype=float)
    phi = np.zeros((D * n, n))
    phi[:n] = np.eye(n)
    for kind, c in ops:
        E = np.concatenate([powers[kind] * (c ** scale)[:, None, None], np.zeros((1, n, n))])
        L = E[idx].transpose(0, 2, 1, 3).reshape(D * n, D * n)
        phi = L @ phi
    return phi.reshape(D, n, n)


def _perturbed(ops, seed):
    """``ops`` with every coefficient moved by a relative DIGITS (random sign)."""
    rng = np.random.default_rng(seed)
    return [(k, c * (1.0 + DIGITS * rng.choice((-1.0, 1.0)))) for k, c in ops]


def series_defects(ops, *, gens=None, degree=MAX_DEGREE, part=None):
    """(defects, noise): per degree k = 1 … degree, ‖Φ_k − E_k‖ of the product of exp(c h X)
    over ``ops`` against exp(h ΣX), and the change of Φ_k when the coefficients move by a
    relative ``DIGITS`` (how far a table of that many correct digits may miss; also far above
    round-off).  ``part``: a slice of the matrices to compare (the ε-linear block)."""
    gens = _GENS if gens is None else gens
    part = part or (slice(None), slice(None))
    phi = _product_series(ops, gens, degree)
    exact = _powers(sum(gens.values()), degree)
    moved = [_product_series(_perturbed(ops, s), gens, degree) for s in (1, 2)]
    defects = [float(np.linalg.norm((phi[k] - exact[k])[part])) for k in range(1, degree + 1)]
    noise = [max(float(np.linalg.norm((m[k] - phi[k])[part])) for m in moved)
             for k in range(1, degree + 1)]
    return defects, noise


def _first_failure(defects, noise):
    """The first degree whose defect exceeds what the coefficients' precision explains."""
    for k, (d, e) in enumerate(zip(defects, noise), start=1):
        if d > 10.0 * e + 1e-300:
            return k
    return None


def lie_order(ops, *, degree=MAX_DEGREE) -> int:
    """The order p of the splitting ``ops`` for general (non-commuting) vector fields: every
    order condition of degree ≤ p holds, some of degree p + 1 fails (capped at degree − 1)."""
    k = _first_failure(*series_defects(ops, degree=degree))
    return degree - 1 if k is None else k - 1


def epsilon_order(ops, *, degree=21) -> int:
    """q such that the error terms linear in ε of the splitting of A + εB (drifts: A, kicks: εB)
    are O(h^{q+1}) locally, i.e. the method's error is O(ε h^q + ε² h^{…}) (Laskar–Robutel).
    Exact: ε is the nilpotent of dual-number block matrices [[X0, X1], [0, X0]]."""
    A, B = _GENS["D"], _GENS["K"]
    Z = np.zeros_like(A)
    gens = {"D": np.block([[A, Z], [Z, A]]), "K": np.block([[Z, B], [Z, Z]])}
    n = len(A)
    k = _first_failure(*series_defects(ops, gens=gens, degree=degree,
                                       part=(slice(0, n), slice(n, 2 * n))))
    return degree - 1 if k is None else k - 1


# -- numerical order (RKN tables, compositions of arbitrary integrators) -------------------------
def _rkn_problem():
    """H = |p|²/2 + V(q), 2 degrees of freedom, V with nonzero derivatives of every order (so no
    elementary differential of the RKN class vanishes identically)."""
    from ..systems import SeparableHamiltonian

    def V(q):
        q1, q2 = q[..., 0], q[..., 1]
        return 0.5 * (q * q).sum(-1) + 0.3 * torch.sin(q1 + 0.7 * q2) + 0.2 * torch.exp(0.5 * q1 - 0.3 * q2) \
            + 0.1 * q1 * q1 * q2

    def dV(q):
        q1, q2 = q[..., 0], q[..., 1]
        c, e = 0.3 * torch.cos(q1 + 0.7 * q2), 0.2 * torch.exp(0.5 * q1 - 0.3 * q2)
        return torch.stack([q1 + c + 0.5 * e + 0.2 * q1 * q2, q2 + 0.7 * c - 0.3 * e + 0.1 * q1 * q1], -1)

    return SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), V, kinetic_grad=lambda p: p,
                                potential_grad=dV)


def _generic_problem():
    """A non-separable H(q, p) with closed-form gradient (for implicit integrators)."""
    from ..systems import Hamiltonian

    def H(q, p):
        return 0.5 * (p * p).sum(-1) * (1 + 0.2 * torch.sin(q[..., 0])) + 0.5 * (q * q).sum(-1) \
            + 0.1 * q[..., 0] * p[..., 1] ** 2

    def grad(q, p):
        s, c = torch.sin(q[..., 0]), torch.cos(q[..., 0])
        pp = 0.5 * (p * p).sum(-1)
        Hq = torch.stack([0.2 * c * pp + q[..., 0] + 0.1 * p[..., 1] ** 2, q[..., 1]], -1)
        Hp = p * (1 + 0.2 * s)[..., None] + torch.stack(
            [torch.zeros_like(s), 0.2 * q[..., 0] * p[..., 1]], -1)
        return Hq, Hp

    return Hamiltonian(H, grad=grad)


def _separable_only(integrator) -> bool:
    """Whether ``integrator`` steps separable systems only: a kick–drift splitting, a processed
    one (no splitting of its own), or stages of those (a processed method measured on the
    non-separable problem was refused as "needs a separable system")."""
    if integrator.splitting() is not None or isinstance(integrator, ProcessedSplitting):
        return True
    stages = getattr(integrator, "stages", None)
    parts = [m for m, _ in stages()] if stages is not None else []
    return bool(parts) and all(m is not integrator and _separable_only(m) for m in parts)


def _rounded(measured: float, symmetric: bool) -> int:
    """A measured order as an int; a symmetric method's order is even (HLW Thm II.3.2), and at
    orders 8–10 the float64 measurement reads low (sofspa10's γ over implicit midpoint: 9.x;
    yoshida8 as an RKN method: 7.27), so an odd reading of a symmetric one is rounded up."""
    got = int(math.floor(measured + 0.3))
    return got + 1 if symmetric and got % 2 else got


def measured_order(integrator, system=None, *, h0=0.4, floor=1e-11, points=6) -> float:
    """The order of ``integrator`` read off its local error without a reference solution:
    D(h) = Φ_h(x) − Φ_{h/2}(Φ_{h/2}(x)) = C(x)(1 − 2^{−p}) h^{p+1} + O(h^{p+2}), so
    log₂ D(h)/D(h/2) → p + 1.  Returned: the last slope − 1 before D reaches ``floor``
    (float64, 4 random states).  ``system``: default an RKN problem for explicit splittings, a
    non-separable Hamiltonian otherwise."""
    if system is None:
        system = _rkn_problem() if _separable_only(integrator) else _generic_problem()
    g = torch.Generator().manual_seed(0)
    q = 0.5 * torch.randn(4, 2, generator=g, dtype=torch.float64)
    p = 0.5 * torch.randn(4, 2, generator=g, dtype=torch.float64)
    def defect(h):
        q1, p1, _ = integrator.step(system, q, p, 0.0, h)
        qa, pa, c = integrator.step(system, q, p, 0.0, h / 2)
        q2, p2, _ = integrator.step(system, qa, pa, h / 2, h / 2, c)
        return float(torch.cat([q1 - q2, p1 - p2], -1).abs().max())

    D, h = [], h0
    with torch.no_grad():
        while h < 8 * h0 and defect(h) < 1e4 * floor:   # an accurate method: start higher
            h *= 2
        while len(D) < points:
            d = defect(h)
            if d < floor:
                break
            D.append(d)
            h /= 2
    if len(D) < 2:
        raise ValueError(f"{integrator.name}: local error below {floor} already at h = {h0}: "
                         "cannot measure the order")
    slopes = [math.log2(a / b) for a, b in zip(D, D[1:])]
    return slopes[-1] - 1.0


# -- splittings ------------------------------------------------------------------------------------
class Splitting(Integrator):
    r"""Φ_h = K(a_s h) D(b_{s−1} h) … D(b_0 h) K(a_0 h) on a separable system (module docstring):
    ``kicks`` = (a_0, …, a_s), ``drifts`` = (b_0, …, b_{s−1}), one more kick than drifts.

    ``order``: declared (checked: :func:`lie_order`, or for ``rkn=True`` tables
    :func:`measured_order` on an RKN problem) or ``None`` (then the certified general order,
    or the measured RKN order).  ``generic_order`` is the order for any split H = A + B,
    ``epsilon_order`` the order in the ε-linear terms of A + εB (drifts A).
    """

    def __init__(self, kicks, drifts, *, order: int | None = None, name: str | None = None,
                 rkn: bool = False, reference: str = "", check: bool = True):
        name = name or "splitting"
        kicks, drifts = _finite(name, "kicks", kicks), _finite(name, "drifts", drifts)
        if len(kicks) != len(drifts) + 1 or not drifts:
            raise ValueError(f"{name}: need one more kick than drifts (kicks first and last; a "
                             f"zero kick for a drift at an end), got {len(kicks)} kicks and "
                             f"{len(drifts)} drifts")
        for what, c in (("kicks", kicks), ("drifts", drifts)):
            if abs(math.fsum(c) - 1.0) > 1e-12:
                raise ValueError(f"{name}: the {what} sum to {math.fsum(c)!r}, not 1 (consistency: "
                                 "order ≥ 1 needs Σa = Σb = 1)")
        self.kicks, self.drifts, self.name = kicks, drifts, name
        self.rkn, self.reference = bool(rkn), reference
        self.symmetric = _palindrome(kicks) and _palindrome(drifts)
        self.symplectic = True
        ops = ops_of(kicks, drifts)
        self.generic_order = lie_order(ops)
        if self.symmetric and self.generic_order % 2:
            self.generic_order -= 1   # a symmetric method has even order (HLW Thm II.3.2)
        if order is None:
            order = self.generic_order
            if rkn:
                order = max(order, _rounded(measured_order(self), self.symmetric))
        else:
            order = check_int(order, "order", 1)
            if check:
                _check_order(self, order, ops)
        self.order = order

    @functools.cached_property
    def epsilon_order(self) -> int:
        """The order in the ε-linear error terms of H = A + εB, drifts = A (:func:`epsilon_order`)."""
        return epsilon_order(self.ops())

    @property
    def evaluations(self) -> int:
        """Force evaluations per step in a chain of steps (FSAL: a last kick's force is reused
        when the step starts with a kick)."""
        n = sum(1 for a in self.kicks if a != 0.0)
        return n - 1 if (self.kicks[0] != 0.0 and self.kicks[-1] != 0.0) else n

    def splitting(self):
        return self.kicks, self.drifts

    def ops(self):
        return ops_of(self.kicks, self.drifts)

    def adjoint(self):
        return Splitting(self.kicks[::-1], self.drifts[::-1], order=self.order, rkn=self.rkn,
                         name=f"{self.name}_adjoint", check=False)

    def key(self) -> tuple:
        """Equality by value (the coefficients): so a composition over a Splitting sees that
        the adjoint of its mirror stage is the same map (symmetric, reversible)."""
        return ("splitting", self.kicks, self.drifts)

    def configured(self, tol=None, solver=None, max_iter=None):
        """odeint's solve options do not apply: an explicit method is its own configuration."""
        return self

    def step(self, system, q, p, t, h, cache=None):
        if (sp := explicit_splitting(self, system)) is None:
            raise ValueError(_NOT_SEPARABLE.format(name=self.name))
        return run_splitting(*sp, system, q, p, t, h, cache)

    @classmethod
    def from_ops(cls, ops, **kw):
        """A splitting from a sequence of ('K', a) / ('D', b), first applied first; adjacent
        flows of the same kind are merged (``composition.merge_flows``)."""
        ops = list(ops)
        for kind, _ in ops:
            if kind not in ("K", "D"):
                raise ValueError(f"operation kinds are 'K' (kick) and 'D' (drift), got {kind!r}")
        kicks, drifts = merge_flows([(k, float(c)) for k, c in ops if c != 0.0])   # zero flows: none
        return cls(kicks, drifts, **kw)

    @classmethod
    def drift_first(cls, drifts, kicks, **kw):
        """D(b_0) K(a_0) D(b_1) K(a_1) … (OrdinaryDiffEq / Laskar–Robutel ABA order); either list
        may be one longer than the other."""
        if abs(len(drifts) - len(kicks)) > 1:
            raise ValueError(f"drift_first: the lists alternate, so one may be one longer than the "
                             f"other, got {len(drifts)} drifts and {len(kicks)} kicks")
        ops = []
        for i in range(max(len(drifts), len(kicks))):
            if i < len(drifts):
                ops.append(("D", drifts[i]))
            if i < len(kicks):
                ops.append(("K", kicks[i]))
        return cls.from_ops(ops, **kw)

    @classmethod
    def composition(cls, gammas, **kw):
        """Verlet (K(h/2) D(h) K(h/2)) composed with step fractions γ: the merged table."""
        ops = []
        for g in _finite(kw.get("name", "composition"), "gammas", gammas):
            ops += [("K", g / 2), ("D", g), ("K", g / 2)]
        return cls.from_ops(ops, **kw)


_NOT_SEPARABLE = ("{name!r} is a kick/drift splitting of H = T(p) + V(q): it needs a separable "
                  "system (SeparableHamiltonian, VectorFieldSystem(..., separable=True), odeint "
                  "options['separable']=True); for a non-separable H use a composition of "
                  "implicit midpoint (implicit_midpoint_yoshida4, ..., or "
                  "splitting.compose(METHODS['implicit_midpoint'], gammas))")


def _palindrome(c):
    return all(abs(x - y) <= 1e-14 * max(1.0, abs(x)) for x, y in zip(c, reversed(c)))


def _check_order(method, order, ops):
    if order <= method.generic_order:
        return
    if method.rkn:
        got = measured_order(method)
        if got >= order - 0.3:
            return
        raise ValueError(f"{method.name}: declared order {order} (RKN), but the local error on an "
                         f"RKN test problem shrinks like h^{got + 1:.2f} (order {got:.2f}): "
                         "check the coefficients")
    k = method.generic_order + 1
    d, e = (x[k - 1] for x in series_defects(ops))
    raise ValueError(f"{method.name}: declared order {order}, but the order conditions of degree "
                     f"{k} fail (defect {d:.1e}, {d / e:.1e}× what {DIGITS:g} relative errors in "
                     f"the coefficients explain; the table has order {k - 1}). Check the "
                     "coefficients, or pass rkn=True if the table is a Runge–Kutta–Nyström method "
                     "(its order holds only for T quadratic in p)")


# -- processing ------------------------------------------------------------------------------------
class ProcessedSplitting(Integrator):
    r"""ψ_h = π ∘ K_h ∘ π⁻¹ with kernel K (a :class:`Splitting`) and processor π (a product of
    kick/drift flows, ``processor`` ops, first applied first).  ψ_h^n = π ∘ K_h^n ∘ π⁻¹: a rollout
    runs the kernel (its bound loop, FSAL) and applies π⁻¹ once and π per returned state.
    ``order`` is the effective order, checked by :func:`lie_order` on π K π⁻¹ (exact)."""

    def __init__(self, kernel: Splitting, processor, *, order: int | None = None,
                 name: str | None = None, reference: str = ""):
        if not isinstance(kernel, Splitting):
            raise TypeError("the kernel must be a Splitting")
        self.name = name or f"processed({kernel.name})"
        self.kernel, self.reference = kernel, reference
        self.processor = [(k, c) for k, c in processor if c != 0.0]
        _finite(self.name, "processor coefficients", [c for _, c in self.processor])
        if any(k not in ("K", "D") for k, _ in self.processor):
            raise ValueError("processor operation kinds are 'K' and 'D'")
        ops = inverse_ops(self.processor) + kernel.ops() + self.processor
        self.generic_order = lie_order(ops)
        self.kernel_order = kernel.generic_order
        self.symplectic = True
        # π_{−h} ≠ π_h: ψ_{−h} ∘ ψ_h ≠ id even for a symmetric kernel (its order is still even:
        # ψ is conjugate to the symmetric K)
        self.symmetric = False
        if kernel.symmetric and self.generic_order % 2:
            self.generic_order -= 1
        if order is not None:
            order = check_int(order, "order", 1)
        if order is not None and order > self.generic_order:
            k = self.generic_order + 1
            d = series_defects(ops)[0][k - 1]
            raise ValueError(f"{self.name}: declared effective order {order}, but π K π⁻¹ fails the "
                             f"order conditions of degree {k} (defect {d:.1e}): check kernel and "
                             "processor")
        self.order = self.generic_order if order is None else order
        pk, pd = merge_flows(self.processor)
        ik, idr = merge_flows(inverse_ops(self.processor))
        self._post, self._pre = (pk, pd), (ik, idr)

    @property
    def evaluations(self):
        return self.kernel.evaluations

    def key(self) -> tuple:
        """Equality by value: the kernel's coefficients and the processor."""
        return ("processed", self.kernel.key(), tuple(self.processor))

    def configured(self, tol=None, solver=None, max_iter=None):
        return self

    def _check(self, system):
        if not getattr(system, "separable", False):
            raise ValueError(_NOT_SEPARABLE.format(name=self.name))
        if getattr(system, "time_dependent", False):
            raise ValueError(f"{self.name!r}: processing needs a time-independent system (π moves "
                             "the state off the time grid)")

    def _check_autonomous(self, system, q, p, t):
        """A system that does not declare ``time_dependent`` (a VectorFieldSystem, odeint's func)
        is asked: its field at t and at another time, once a run.  A forced field lost the
        processed order silently (processed_bcm6 measured 4 on a forced Duffing)."""
        if hasattr(system, "time_dependent"):
            return
        with torch.no_grad():
            a, b = system.vector_field(q, p, t), system.vector_field(q, p, t + 0.7318)
        if not all(torch.equal(x, y) for x, y in zip(a, b)):
            raise ValueError(f"{self.name!r}: processing needs a time-independent system (π moves "
                             "the state off the time grid), and this field changes with t")

    def _continues(self, cache, q, p, h):
        """Whether ``cache`` is this method's own, for the state (q, p) it returned at step h:
        then its kernel continues from its own state (another processed method's, in a
        Composition, is not this one's kernel state: the order fell to the kernel's)."""
        return (cache is not None and isinstance(cache, tuple) and len(cache) == 7
                and cache[6] is self and cache[0] is q and cache[1] is p and cache[5] == h)

    def _through(self, table, system, q, p):
        q, p, _ = run_splitting(*table, system, q, p, 0.0, 1.0)
        return q, p

    def preprocess(self, system, q, p, h):
        """π⁻¹_h(q, p): the kernel's starting point."""
        return self._through(_scaled(self._pre, h), system, q, p)

    def postprocess(self, system, q, p, h):
        """π_h(q, p): the output from a kernel state."""
        return self._through(_scaled(self._post, h), system, q, p)

    def step(self, system, q, p, t, h, cache=None):
        """One ψ_h step; ``cache`` = (q, p returned last, kernel state, FSAL force, h): the kernel
        continues from its own state when it is handed back the state it returned."""
        self._check(system)
        if self._continues(cache, q, p, h):
            qk, pk, force = cache[2], cache[3], cache[4]
        else:
            self._check_autonomous(system, q, p, t)
            (qk, pk), force = self.preprocess(system, q, p, h), None
        qk, pk, force = run_splitting(*self.kernel.splitting(), system, qk, pk, t, h, force)
        q1, p1 = self.postprocess(system, qk, pk, h)
        return q1, p1, (q1, p1, qk, pk, force, h, self)

    def bind(self, system, kernel=None):
        """The kernel's bound stepper (``splitting_step``; ``kernel``: another stepper of it, the
        compiled one), n steps per call, with π⁻¹ / π around: a :class:`_ProcessedStepper`."""
        self._check(system)
        kernel = kernel or splitting_step(*self.kernel.splitting(), system)
        return _ProcessedStepper(self, system, kernel)

    def adjoint(self):
        """ψ*_h = ψ_{−h}⁻¹ = π_{−h} ∘ K*_h ∘ π_{−h}⁻¹: the adjoint kernel, the processor at −h."""
        return ProcessedSplitting(self.kernel.adjoint(), [(k, -c) for k, c in self.processor],
                                  order=self.order, name=f"{self.name}_adjoint")


class _ProcessedStepper(Stepper):
    """ψ_h^n = π_h ∘ K_h^n ∘ π_h⁻¹: the kernel stepper's ``steps(n)`` between one pre- and one
    postprocessing; the cache (as :meth:`ProcessedSplitting.step`'s) lets the next call continue
    from the kernel's own state when it is handed back the state this one returned."""

    def __init__(self, method, system, kernel):
        super().__init__(system)
        self.method, self.kernel = method, kernel

    def steps(self, q, p, t0, h, n, cache=None, *, start=0, out=None):
        if self.method._continues(cache, q, p, h):
            qk, pk, force = cache[2], cache[3], cache[4]
        else:
            self.method._check_autonomous(self.system, q, p, t0)
            (qk, pk), force = self.method.preprocess(self.system, q, p, h), None
        qk, pk, force = self.kernel.steps(qk, pk, t0, h, n, force, start=start)
        q1, p1 = self.method.postprocess(self.system, qk, pk, h)
        return q1, p1, (q1, p1, qk, pk, force, h, self.method)

    def step(self, system, q, p, t, h, cache=None):
        return self.steps(q, p, t, h, 1, cache)


def _scaled(table, h):
    kicks, drifts = table
    return tuple(a * h for a in kicks), tuple(b * h for b in drifts)


# -- compositions over any integrator; symplectic DIRK --------------------------------------------
def compose(base, gammas, *, order: int | None = None, name: str | None = None,
            system=None) -> Composition:
    """Φ_{γ_s h} ∘ … ∘ Φ_{γ_1 h} of ``base`` (any Integrator, implicit ones included, or a list
    of them) with any step fractions γ (Σγ = 1; palindromic or not).  The order is measured
    (:func:`measured_order`; on ``system`` if given) and a declared ``order`` is checked
    against it; a composition of explicit splittings is certified exactly instead."""
    from .registry import get_method     # (the registry imports this module)
    gammas = _finite(name or "composition", "gammas", gammas)
    base = ([get_method(b) if isinstance(b, str) else b for b in base] if isinstance(base, (list, tuple))
            else get_method(base) if isinstance(base, str) else base)     # a name, as rollout takes
    comp = Composition(base, gammas, order=1, name=name)
    split = comp.splitting()
    if split is not None:
        got = Splitting(*split, name=comp.name).generic_order
    else:
        got = _rounded(measured_order(comp, system), comp.symmetric)
    if order is not None and order > got:
        raise ValueError(f"{comp.name}: declared order {order}, measured {got}: check the step "
                         "fractions (order conditions of compositions: HLW Sect. III.3)")
    comp.order = got if order is None else int(order)
    comp.measured_order = got
    return comp


class SymplecticDIRK(Composition):
    r"""The symplectic diagonally implicit RK method with weights b: L^{b_s h} ∘ … ∘ L^{b_1 h}
    of the implicit midpoint rule (seed Sect. 6.2; HLW Thm VI.4.4), Butcher tableau
    a_ij = b_j (j < i), a_ii = b_i/2, c_i = Σ_{j<i} b_j + b_i/2.  Implicit on every system."""

    def __init__(self, b, *, order: int | None = None, name: str | None = None, midpoint=None):
        from ..maps import AlphaMap
        from .cotangent import CotangentLiftIntegrator
        b = _finite(name or "dirk", "b", b)
        mid = midpoint or CotangentLiftIntegrator(AlphaMap(0.5), name="implicit_midpoint")
        super().__init__(mid, b, order=1, name=name or f"dirk{len(b)}")
        self.b = b
        got = _rounded(measured_order(self), self.symmetric)
        if order is not None and order > got:
            raise ValueError(f"{self.name}: declared order {order}, measured {got}")
        self.order = got if order is None else int(order)

    def with_options(self, **changes):
        """The same method with every midpoint stage's solve options changed (its order is
        the same: not measured again)."""
        new = copy.copy(self)
        new.methods = [m.with_options(**changes) for m in self.methods]
        new._stages = [(m.with_options(**changes), c) for m, c in self._stages]
        return new

    def butcher(self):
        """(A, b, c) of the equivalent Runge–Kutta method."""
        s, b = len(self.b), self.b
        A = [[b[j] if j < i else (b[i] / 2 if j == i else 0.0) for j in range(s)] for i in range(s)]
        return A, list(b), [sum(row) for row in A]


class _Registry(Mapping):
    """The named tables of :mod:`.splitting_tables`, built (order conditions checked) on first use."""

    def __init__(self):
        self._methods = None

    def _load(self):
        if self._methods is None:
            from .splitting_tables import build
            self._methods = build()
        return self._methods

    def __getitem__(self, name):
        return self._load()[name]

    def __iter__(self):
        return iter(self._load())

    def __len__(self):
        return len(self._load())


#: Named splittings for separable systems: ``method="blanes_moan6"`` in rollout and odeint.
SPLITTING_METHODS = _Registry()


__all__ = ["SPLITTING_METHODS", "Splitting", "ProcessedSplitting", "SymplecticDIRK", "compose", "lie_order",
           "epsilon_order", "measured_order", "series_defects"]
