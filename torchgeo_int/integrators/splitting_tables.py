r"""Published splitting, composition and processed methods, each with its source.

Conventions (:mod:`.splitting`): K(c) is a kick p ← p − c h ∂V/∂q, D(c) a drift q ← q + c h ∂T/∂p;
"composition γ" is Verlet K(γ/2) D(γ) K(γ/2) composed with step fractions γ; ops are applied
first to last.  Where a paper tabulates a coefficient that consistency fixes (a middle one), the
table computes it (Σ = 1 exactly) and ``tests/test_splitting.py`` compares it with the printed
digits; every table's coefficients are compared there digit by digit with the published values.

Digits: Blanes–Moan, McLachlan (1995) S4/SS5/SS9 and SB3A as transcribed in Principia's
``integrators/methods.hpp`` and boost.odeint (which cite the papers); McLachlan–Atela, McAte8
(= SS15), Ruth3, Sofroniou–Spaletta from OrdinaryDiffEq.jl's ``symplectic_tableaus.jl``; the
processed methods from the coefficient listing accompanying Blanes, Casas & Murua (2024).

``rkn=True``: a Runge–Kutta–Nyström method, of the stated order only for T quadratic in p (every
problem of this library's benchmarks; ``Splitting.generic_order`` is its order for a general
split).  The near-integrable SABA_n / SBAB_n (Laskar & Robutel 2001) are order 2 in general and
order 2n (resp. 2n) in the terms linear in ε of H = A + εB, drifts = A (``epsilon_order``).
"""
from __future__ import annotations

import math

import numpy as np

from .splitting import ProcessedSplitting, Splitting

_C = 2.0 ** (1 / 3)


def _pal(half, middle=None):
    """(c_1, …, c_m, [middle], c_m, …, c_1) with the middle fixed by Σ = 1 (``middle=True``) or
    absent (``middle=None``: an even palindrome; its two central entries are 1/2 − Σ half
    when the last entry of ``half`` is None)."""
    half = list(half)
    if half and half[-1] is None:
        half[-1] = 0.5 - math.fsum(half[:-1])
    if middle:
        return tuple(half) + (1.0 - 2.0 * math.fsum(half),) + tuple(reversed(half))
    return tuple(half) + tuple(reversed(half))


def _gauss(n):
    x, w = np.polynomial.legendre.leggauss(n)
    return (x + 1) / 2, w / 2


def _lobatto(n):
    """n-point Gauss–Lobatto nodes and weights on [0, 1]: 0, 1 and the roots of P'_{n−1}."""
    P = np.polynomial.legendre.Legendre.basis(n - 1)
    inner = np.sort(P.deriv().roots().real)
    x = np.concatenate([[-1.0], inner, [1.0]])
    w = 2.0 / (n * (n - 1) * P(x) ** 2)
    return (x + 1) / 2, w / 2


def saba_ops(n):
    """SABA_n: drifts between the n Gauss–Legendre nodes c_i, kicks with the Gauss weights
    (Laskar & Robutel 2001, Sect. 3: the kick times and weights of SABA_n are those of Gauss
    quadrature)."""
    x, w = _gauss(n)
    ops, last = [], 0.0
    for xi, wi in zip(x, w):
        ops += [("D", float(xi - last)), ("K", float(wi))]
        last = xi
    return ops + [("D", float(1.0 - last))]


def sbab_ops(n):
    """SBAB_n: kicks at the n + 1 Gauss–Lobatto nodes with the Lobatto weights."""
    x, w = _lobatto(n + 1)
    ops = [("K", float(w[0]))]
    for i in range(1, n + 1):
        ops += [("D", float(x[i] - x[i - 1])), ("K", float(w[i]))]
    return ops


def _verlet_ops(gammas):
    ops = []
    for g in gammas:
        ops += [("K", g / 2), ("D", g), ("K", g / 2)]
    return ops


# Blanes, Casas & Murua, SIAM J. Sci. Comput. 27 (2006) 1817–1843, and Blanes (2001) via
# Blanes, Casas & Murua, Acta Numerica 33 (2024), Table 8.1 (arXiv:2401.01722): symmetric
# compositions of Verlet (kernel) with a processor π = S_{−g_1 h} ∘ … ∘ S_{−g_n h}, S = Verlet
# (S_{−g_n h} applied first; the g_i as tabulated, Σg = 0 and g_{n+1−i} = −g_i): ψ = π K π⁻¹.
# This reading is the one under which π K π⁻¹ passes the order conditions (checked at build).
def _processor(g_first_half, first_free=True):
    """−(g_1, …, g_m, −g_1, …, −g_m) with g_1 = −Σ_{i≥2} g_i (``first_free``) or the last entry
    fixed that way, as in the source."""
    g = list(g_first_half)
    if first_free:
        g[0] = -math.fsum(g[1:])
    else:
        g[-1] = -math.fsum(g[:-1])
    full = g + [-x for x in g]
    return [-x for x in full]


PROCESSED = {
    "processed_blanes6": dict(
        order=6,
        kernel=_pal([0.513910778424374, 0.364193022833858, -0.867423280969274], middle=True),
        processor=_processor([None, -0.461165940466494, -0.074332422810238, 0.384998538774070,
                              0.375012038697862]),
        reference="Blanes, Appl. Numer. Math. 37 (2001); kernel 7 stages, processor 10 "
                  "(Blanes, Casas & Murua, Acta Numerica 33 (2024), Table 8.1, 'BLA01')"),
    "processed_bcm6": dict(
        order=6,
        kernel=_pal([0.1705768865009222157] * 4 + [-0.423366140892658048], middle=True),
        processor=_processor([None, -0.20621953139126, 0.23651387483203, 0.09086982276241,
                              0.24687306977659, -0.1]),
        reference="Blanes, Casas & Murua, SIAM J. Sci. Comput. 27 (2006); kernel 11 stages, "
                  "processor 12 (Acta Numerica 33 (2024), Table 8.1, 'BCM06')"),
    "processed_bcm8": dict(
        order=8,
        kernel=_pal([0.168, 0.168, 0.585550530805562, -0.460090457516872, 0.172863148729731,
                     0.179664539695039], middle=True),
        processor=_processor([None, -0.008488123494574411, -0.337188967354338, 0.333987768164597,
                              0.588351189003849, 0.162324207599241, -0.511744926116413,
                              0.236885952363384, 0.598212975943381, -0.543415765371656]),
        reference="Blanes, Casas & Murua, SIAM J. Sci. Comput. 27 (2006); kernel 13 stages, "
                  "processor 20 (Acta Numerica 33 (2024), Table 8.1, 'BCM06')"),
    "processed_bcm10": dict(
        order=10,
        kernel=_pal([0.121657748919383] * 5 + [-0.511318780154828, -0.172858614884985,
                                               0.123016258833066, 0.441503951671565,
                                               -0.327071324165477, 0.070952700957766],
                    middle=True),
        processor=_processor([None, 0.4727142080578221, 0.01344750613191108, -0.4637104712987078,
                              -0.3045590922565247, -0.5382945821834320, -0.1899795533199732,
                              0.1548256472553489, -0.3594148033156072, 0.3430345669677392,
                              0.5334030283695922, 0.009116042043427756]),
        reference="Blanes, Casas & Murua, SIAM J. Sci. Comput. 27 (2006); kernel 23 stages, "
                  "processor 24 (Acta Numerica 33 (2024), Table 8.1, 'BCM06')"),
}


def _splittings():
    """name -> (ops, order, rkn, reference)."""
    t = {}
    t["ruth3"] = (Splitting.drift_first, dict(drifts=(1.0, -2 / 3, 2 / 3), kicks=(-1 / 24, 3 / 4, 7 / 24)),
                  3, False, "Ruth, IEEE Trans. Nucl. Sci. 30 (1983) 2669: c = (1, −2/3, 2/3), "
                            "d = (−1/24, 3/4, 7/24) (OrdinaryDiffEq.jl Ruth3, listed reversed)")
    a1 = (2 + _C + 1 / _C) / 6
    a2 = (1 - _C - 1 / _C) / 6
    t["candy_rozmus4"] = (
        Splitting.drift_first,
        dict(drifts=(0.0, 1 / (2 - _C), 1 / (1 - _C * _C), 1 / (2 - _C)), kicks=(a1, a2, a2, a1)),
        4, False, "Candy & Rozmus, J. Comput. Phys. 92 (1991) 230; Forest & Ruth, Physica D 43 "
                  "(1990) 105, eq. (4.8): the triple jump written as kicks/drifts")
    # OrdinaryDiffEq.jl lists (a, b) with a step D(b_1) K(a_1) … in its own variables; read as
    # drifts = reversed(a), kicks = reversed(b) (the reading that turns its Ruth3 into Ruth's
    # published c, d) McAte4 has RKN order 4 (measured), any other reading order ≤ 3.
    t["mclachlan_atela4"] = (
        Splitting.drift_first,
        dict(drifts=(0.128846158365384185, 0.441583023616466524, -0.085782019412973646,
                     0.515352837431122936),
             kicks=(0.334003603286321425, 0.756320000515668291, -0.224819803079420806,
                    0.134496199277431089)),
        4, True, "McLachlan & Atela, Nonlinearity 5 (1992) 541, optimal 4th-order RKN "
                 "(OrdinaryDiffEq.jl McAte4)")
    t["mclachlan4"] = (
        Splitting,
        dict(kicks=_pal([0.16913927992207204518, -0.29918620390405079951], middle=True),
             drifts=_pal([6 / 11, -1 / 22])),
        4, False, "McLachlan, SIAM J. Sci. Comput. 16 (1995) 151, method S4 (4 force "
                  "evaluations, symmetric, any split)")
    t["mclachlan_rkn4"] = (
        Splitting.drift_first,
        dict(drifts=_pal([0.40518861839525227722, -0.28714404081652408900, None]),
             kicks=_pal([-3 / 73, 17 / 59], middle=True)),
        4, True, "McLachlan (1995), RKN method SB3A with 5 force evaluations (the boost.odeint "
                 "symplectic_rkn_sb3a_mclachlan table)")
    t["mclachlan_ss5"] = (Splitting.composition, dict(gammas=_pal([0.28, 0.6254664284676700450], True)),
                          4, False, "McLachlan (1995), SS5: symmetric composition of Verlet, 5 stages")
    t["mclachlan_ss9"] = (Splitting.composition, dict(gammas=_pal(
        [0.1867, 0.55549702371247839916, 0.12946694891347535806, -0.84326562338773460855], True)),
        6, False, "McLachlan (1995), SS9: symmetric composition of Verlet, 9 stages")
    t["mclachlan8"] = (Splitting.composition, dict(gammas=_pal(
        [0.74167036435061295344822780, -0.40910082580003159399730010, 0.19075471029623837995387626,
         -0.57386247111608226665638773, 0.29906418130365592384446354, 0.33462491824529818378495798,
         0.31529309239676659663205666], True)),
        8, False, "McLachlan (1995), SS15: composition of Verlet, 15 stages (OrdinaryDiffEq.jl McAte8)")
    t["blanes_moan4"] = (
        Splitting,
        dict(kicks=_pal([0.0792036964311957, 0.353172906049774, -0.0420650803577195], True),
             drifts=_pal([0.209515106613362, -0.143851773179818, None])),
        4, False, "Blanes & Moan, J. Comput. Appl. Math. 142 (2002) 313, S6 "
                  "(6 force evaluations, any split)")
    t["blanes_moan6"] = (
        Splitting,
        dict(kicks=_pal([0.050262764400392200, 0.41351430042834400, 0.045079889794397700,
                         -0.18805485381956900, 0.54196067845078000], True),
             drifts=_pal([0.14881644790104200, -0.13238586576778400, 0.067307604692185000,
                          0.43266640257817500, None])),
        6, False, "Blanes & Moan (2002), S10 (10 force evaluations, any split)")
    t["blanes_moan_rkn4"] = (
        Splitting,
        dict(kicks=_pal([0.0829844064174052, 0.396309801498368, -0.039056304922349], True),
             drifts=_pal([0.245298957184271, 0.604872665711080, None])),
        4, True, "Blanes & Moan (2002), SRKN_6^b (6 force evaluations, RKN)")
    t["blanes_moan_rkn6"] = (
        Splitting,
        dict(kicks=_pal([0.041464998518262400, 0.19812867191806700, -0.040006192104153300,
                         0.075253984301580700, -0.011511387420687900, None]),
             drifts=_pal([0.12322977594627100, 0.29055379779955800, -0.12704921262541700,
                          -0.24633176106207500, 0.35720887279592800], True)),
        6, True, "Blanes & Moan (2002), SRKN_11^b (11 force evaluations, RKN)")
    t["sofspa10"] = (Splitting.composition, dict(gammas=_pal(
        [0.07879572252168641926390768, 0.31309610341510852776481247, 0.02791838323507806610952027,
         -0.22959284159390709415121340, 0.13096206107716486317465686, -0.26973340565451071434460973,
         0.07497334315589143566613711, 0.11199342399981020488957508, 0.36613344954622675119314812,
         -0.39910563013603589787862981, 0.10308739852747107731580277, 0.41143087395589023782070412,
         -0.00486636058313526176219566, -0.39203335370863990644808194, 0.05194250296244964703718290,
         0.05066509075992449633587434, 0.04967437063972987905456880], True)),
        10, False, "Sofroniou & Spaletta, Optim. Methods Softw. 20 (2005) 597: composition of "
                   "Verlet, 35 stages, order 10 (OrdinaryDiffEq.jl SofSpa10)")
    for n in range(1, 5):
        t[f"saba{n}"] = (Splitting.from_ops, dict(ops=saba_ops(n)), 2, False,
                         f"Laskar & Robutel, Celest. Mech. Dyn. Astr. 80 (2001) 39, SABA_{n}: "
                         f"error O(ε h^{2 * n} + ε² h²) for H = A + εB (drifts: A)")
        t[f"sbab{n}"] = (Splitting.from_ops, dict(ops=sbab_ops(n)), 2, False,
                         f"Laskar & Robutel (2001), SBAB_{n}: error O(ε h^{2 * n} + ε² h²)")
    return t


def build():
    """{name: integrator} of every table (order conditions checked here, once)."""
    out = {}
    for name, (make, kw, order, rkn, ref) in _splittings().items():
        out[name] = make(**kw, order=order, rkn=rkn, name=name, reference=ref)
    for name, spec in PROCESSED.items():
        kernel = Splitting.composition(spec["kernel"], name=f"{name}_kernel")
        out[name] = ProcessedSplitting(kernel, _verlet_ops(spec["processor"][::-1]), order=spec["order"],
                                       name=name, reference=spec["reference"])
    return out
