r"""Composition methods, Sect. 6 of the seed paper and Hairer–Lubich–Wanner (HLW) Sect. V.3.

Φ_h = Φ^{(s)}_{γ_s h} ∘ … ∘ Φ^{(1)}_{γ_1 h}.  Composing the α = 0 and α = 1 cotangent-lift methods
at h/2 gives Störmer–Verlet (the composition of their Lagrangian submanifolds); composing a
symmetric order-2 method with Σγ = 1, Σγ³ = 0 and palindromic γ gives order 4, and the tables
below reach 6 and 8.  On separable systems a composition of kick/drift methods is run as one
merged kick/drift sequence: adjacent kicks fuse, so the last force of a step is the first of the
next (FSAL) and an s-stage Verlet composition costs s force evaluations per step.
"""
from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass

from .base import Integrator, run_splitting


@dataclass(frozen=True)
class CoefficientTable:
    """Palindromic composition coefficients of a symmetric order-2 base method."""

    name: str
    order: int
    gammas: tuple[float, ...]
    reference: str

    def __post_init__(self):
        g = self.gammas
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"a CoefficientTable's name must be a non-empty str, got {self.name!r}")
        # a symmetric method has even order (HLW Thm II.3.2); order 2 is the base method's own
        if isinstance(self.order, bool) or not isinstance(self.order, int) or self.order < 2 \
                or self.order % 2:
            raise ValueError(f"{self.name}: order must be an even int >= 2 (a palindromic "
                             f"composition is symmetric), got {self.order!r}")
        if (not isinstance(g, tuple) or not g
                or not all(isinstance(x, numbers.Real) and not isinstance(x, bool) for x in g)):
            raise TypeError(f"{self.name}: gammas must be a non-empty tuple of real numbers, "
                            f"got {g!r}")
        if not all(math.isfinite(x) for x in g):
            # NaN passes every comparison below (NaN > tol is False): reject it first
            raise ValueError(f"{self.name}: coefficients must be finite, got {g!r}")
        if abs(math.fsum(g) - 1.0) > 1e-14:
            raise ValueError(f"{self.name}: coefficients sum to {math.fsum(g)!r}, not 1")
        if any(abs(a - b) > 0.0 for a, b in zip(g, reversed(g))):
            raise ValueError(f"{self.name}: coefficients are not palindromic")
        if self.order >= 4 and abs(math.fsum(x ** 3 for x in g)) > 1e-13:
            raise ValueError(f"{self.name}: Σγ³ = {math.fsum(x ** 3 for x in g)!r} ≠ 0")
        if self.order > 4 and _CERTIFY:
            # orders 6, 8, … need more conditions than Σγ³ = 0: certified exactly on the
            # composition of Verlet over two free (random, non-commuting) generators, whose
            # series of the modified field is generic (splitting.lie_order); the tables below
            # are certified by tests/test_splitting.py (this module loads before splitting's)
            from .splitting import Splitting
            got = Splitting.composition(g, name=self.name).generic_order
            if got < self.order:
                raise ValueError(f"{self.name}: declared order {self.order}, but the coefficients "
                                 f"meet the order conditions up to order {got} only")


def _palindrome(half: list[float], tabulated_middle: float | None = None) -> tuple[float, ...]:
    """(γ₁, …, γ_m, γ₀, γ_m, …, γ₁) with the middle set to 1 − 2Σγᵢ so that Σγ = 1 exactly;
    a tabulated middle is checked against it."""
    middle = 1.0 - 2.0 * math.fsum(half)
    if tabulated_middle is not None and abs(middle - tabulated_middle) > 1e-14:
        raise ValueError(f"tabulated middle coefficient {tabulated_middle} ≠ 1 − 2Σγ = {middle}")
    return tuple(half) + (middle,) + tuple(reversed(half))


_CERTIFY = False              # True once this module has loaded (see __post_init__)
_c2, _c4 = 2.0 ** (1 / 3), 4.0 ** (1 / 3)
TABLES: dict[str, CoefficientTable] = {t.name: t for t in [
    CoefficientTable("yoshida4", 4, _palindrome([1 / (2 - _c2)]),
                     "triple jump: Yoshida, Phys. Lett. A 150 (1990); Suzuki (1990); HLW (V.3.5)"),
    CoefficientTable("suzuki4", 4, _palindrome([1 / (4 - _c4)] * 2),
                     "Suzuki, Phys. Lett. A 146 (1990), 5-stage fractal; HLW (V.3.6)"),
    CoefficientTable("yoshida6", 6, _palindrome(
        [0.78451361047755726382, 0.23557321335935813368, -1.1776799841788710069], 1.3151863206839112189),
        "Yoshida (1990), Table 1, solution A (7 stages)"),
    CoefficientTable("yoshida8", 8, _palindrome(
        [0.914844246229740, 0.253693336566229, -1.44485223686048, -0.158240635368243,
         1.93813913762276, -1.96061023297549, 0.102799849391985]),
        "Yoshida (1990), Table 2, solution D (15 stages); 15 published digits"),
    CoefficientTable("kahan_li6", 6, _palindrome(
        [0.39216144400731413928, 0.33259913678935943860, -0.70624617255763935981,
         0.082213596293550800230], 0.79854399093482996340),
        "Kahan & Li, Math. Comp. 66 (1997), s9odr6a (9 stages); HLW (V.3.11)"),
    CoefficientTable("kahan_li8", 8, _palindrome(
        [0.13020248308889008088, 0.56116298177510838456, -0.38947496264484728641,
         0.15884190655515560090, -0.39590389413323757734, 0.18453964097831570709,
         0.25837438768632204729, 0.29501172360931029887], -0.60550853383003451170),
        "Kahan & Li (1997), s17odr8a (17 stages); HLW (V.3.13)"),
]}


def merge_flows(ops):
    """Fuse a list of ('K', a) / ('D', b) into alternating kicks/drifts, K first and last."""
    kicks, drifts = [0.0], []
    for kind, c in ops:
        if kind == "K":
            kicks[-1] += c
        elif drifts and kicks[-1] == 0.0:
            drifts[-1] += c          # two drifts with no kick between are one drift
        else:
            drifts.append(c)
            kicks.append(0.0)
    return tuple(kicks), tuple(drifts)


def composed_order(orders, symmetric: bool, stages_symmetric: bool, gammas) -> int:
    """What the order conditions guarantee for stages of ``orders`` at step fractions ``gammas``
    (Σγ = 1): the least stage order, made even for a symmetric composition (a symmetric method
    has even order, HLW Thm II.3.2: [Φ*_{h/2}, Φ_{h/2}] of order-1 stages is order 2), raised to
    4 for a symmetric composition of symmetric order-2 stages with Σγ³ = 0 (HLW Thm V.3.1).
    Higher orders need more conditions: declare them (certified by the tables)."""
    base = min(orders)
    if symmetric and base % 2:
        base += 1
    if symmetric and stages_symmetric and base == 2 and abs(math.fsum(g ** 3 for g in gammas)) < 1e-13:
        return 4
    return base


class Composition(Integrator):
    """Φ_{γ_s h} ∘ … ∘ Φ_{γ_1 h} of integrators ``methods`` (one method or a list, applied first
    to last) with step fractions ``gammas``.

    ``order`` defaults to what the order conditions guarantee: the base order if Σγ = 1, raised
    to 4 for a palindromic composition of symmetric order-2 methods with Σγ³ = 0 (HLW Thm V.3.1).
    """

    def __init__(self, methods, gammas, *, order: int | None = None, name: str | None = None):
        gammas = tuple(float(g) for g in gammas)
        methods = list(methods) if isinstance(methods, (list, tuple)) else [methods] * len(gammas)
        if len(methods) != len(gammas) or not gammas:
            raise ValueError("need one step fraction per method (and at least one)")
        for m in methods:
            if not isinstance(m, Integrator):
                raise TypeError(f"a composition's methods are Integrators (e.g. "
                                f"tgi.METHODS['verlet']), got {type(m).__name__} {m!r}"[:300])
        if not all(math.isfinite(g) for g in gammas):     # NaN passes the sum test below
            raise ValueError(f"step fractions must be finite, got {gammas}")
        if abs(math.fsum(gammas) - 1.0) > 1e-12:
            raise ValueError(f"step fractions must sum to 1 (consistency), got {math.fsum(gammas)!r}")
        self.methods, self.gammas = methods, gammas
        # Flatten nested compositions once, so a step is a flat loop over primitive steps.
        self._stages = [(m, g * c) for m, g in zip(methods, gammas) for m, c in m.stages()]
        self.symplectic = all(m.symplectic for m in methods)
        self.first_order = all(m.first_order for m in methods)
        self.symmetric = self._is_symmetric()
        self.name = name or f"composition({', '.join(m.name for m in methods)})"
        self._split = self._merged_splitting()
        guaranteed = composed_order([m.order for m in methods], self.symmetric,
                                    all(m.symmetric for m in methods), gammas)
        if order is None:
            order = guaranteed
        else:
            if isinstance(order, bool) or not isinstance(order, numbers.Integral) or order < 1:
                raise ValueError(f"{self.name}: order must be an int >= 1, got {order!r}")
            order = int(order)
            if order > guaranteed and _CERTIFY:
                got = self._certified_order(guaranteed)
                if got < order:
                    raise ValueError(
                        f"{self.name}: declared order {order}, but its stages and step fractions "
                        f"meet the order conditions up to order {got} only (certified on the "
                        f"merged kick/drift sequence, or for one symmetric order-2 method on its "
                        f"fractions; other stages: what Σγ = 1 and Σγ³ = 0 guarantee)")
        self.order = order
        # the stages' check of an initial state (T*N of a constrained step, a group element of a
        # Lie-group step): the first stage takes the rollout's q0, p0, the others its outputs
        checks = [m.check_state for m, _ in self._stages if m.check_state is not None]
        if checks:
            self.check_state = checks[0]

    def _certified_order(self, guaranteed: int) -> int:
        """The order the order conditions certify: of the merged kick/drift sequence for general
        split fields (:func:`splitting.lie_order`); for one symmetric order-2 method without one
        (implicit midpoint, …), of its step fractions, whose order conditions are the same for
        every symmetric order-2 method (HLW Sect. V.3.2), certified on Verlet's; else
        ``guaranteed``."""
        if self._split is not None:
            return max(guaranteed, _generic_order(tuple(self._split[0]), tuple(self._split[1])))
        first = self._stages[0][0]
        if first.symmetric and first.order == 2 and all(m.same_as(first) for m, _ in self._stages):
            return max(guaranteed, _fractions_order(tuple(c for _, c in self._stages)))
        return guaranteed

    def _is_symmetric(self) -> bool:
        s = len(self._stages)
        for (m, c), (m2, c2) in zip(self._stages, reversed(self._stages)):
            if abs(c - c2) > 1e-15 or not m.adjoint().same_as(m2):
                return False
        return s > 0

    def _merged_splitting(self):
        ops = []
        for m, c in self._stages:
            sp = m.splitting()
            if sp is None:
                return None
            kicks, drifts = sp
            for a, b in zip(kicks, drifts):
                ops += [("K", a * c), ("D", b * c)]
            ops.append(("K", kicks[-1] * c))
        return merge_flows(ops)

    def splitting(self):
        return self._split

    def key(self) -> tuple:
        return ("composition", tuple((m.key(), c) for m, c in self._stages))

    def stages(self):
        return list(self._stages)

    def with_options(self, **changes):
        stages = self.stages()
        return type(self)([m.with_options(**changes) for m, _ in stages], [c for _, c in stages],
                          order=self.order, name=self.name)

    def adjoint(self):
        return Composition([m.adjoint() for m, _ in reversed(self._stages)],
                           [c for _, c in reversed(self._stages)], order=self.order)

    def step(self, system, q, p, t, h, cache=None):
        if system.separable and self._split is not None:
            return run_splitting(*self._split, system, q, p, t, h, cache)
        for m, c in self._stages:
            q, p, cache = m.step(system, q, p, t, c * h, cache)
            t = t + c * h
        return q, p, cache


@functools.lru_cache(maxsize=256)
def _generic_order(kicks: tuple, drifts: tuple) -> int:
    from .splitting import Splitting      # (splitting imports this module)
    return Splitting(kicks, drifts).generic_order


@functools.lru_cache(maxsize=256)
def _fractions_order(gammas: tuple) -> int:
    from .splitting import Splitting
    return Splitting.composition(gammas).generic_order


_CERTIFY = True   # tables made from here on (a user's) are certified at construction
