"""Lie-group integrators: measured orders against a tight scipy reference of the embedded
equations, and long-run conservation (group membership, Casimirs, Noether momenta, bounded
energy) for the heavy top on T*SO(3) and a spring-suspended top on T*(SO(3) × R³)."""
import numpy as np
import pytest
import torch

from test_manifolds_integrators import (free_body, heavy_top, initial, reference, rollout,
                                        spring_top)
from torchgeo_int.manifolds import so3
from torchgeo_int.manifolds.integrators import LIE_METHODS
from torchgeo_int.manifolds.systems import FreeRigidBody, HeavyTop


# -- orders ---------------------------------------------------------------------------------------------
ORDER_CASES = [(free_body, n) for n in ["lie_midpoint_cayley", "lie_midpoint_exp",
                                        "lie_yoshida4_cayley", "lie_suzuki4_cayley"]] + \
              [(heavy_top, n) for n in ["lie_euler_cayley", "lie_euler_adjoint_exp",
                                        "lie_midpoint_cayley", "lie_midpoint_exp",
                                        "lie_yoshida4_cayley", "lie_yoshida6_cayley"]] + \
              [(spring_top, n) for n in ["lie_midpoint_exp", "lie_yoshida4_cayley"]]


@pytest.mark.parametrize("make,name", ORDER_CASES,
                         ids=[f"{m.__name__}-{n}" for m, n in ORDER_CASES])
def test_measured_order(make, name):
    """Log-log slope of the error at T = 1.7 (not a period) against DOP853 of the embedded
    equations, h = T/N, N doubling; points on the round-off plateau dropped."""
    system, m = make(), LIE_METHODS[name]
    g0, mu0 = initial(system)
    T = 1.7
    gr, mr = reference(system, g0, mu0, T)
    N = {1: 32, 2: 16, 4: 8, 6: 8}[m.order]
    Ns, errs = [], []
    while len(Ns) < 4 and N <= 512:
        with torch.no_grad():
            g, mu = rollout(system, m, g0, mu0, T / N, N, save_every=N)
        err = float((g[-1] - gr).norm() + (mu[-1] - mr).norm())
        if err < 1e-11:
            break
        Ns.append(N)
        errs.append(err)
        N *= 2
    assert len(Ns) >= 3, (Ns, errs)
    slope = -np.polyfit(np.log(Ns), np.log(errs), 1)[0]
    assert abs(slope - m.order) < 0.25 * max(1, m.order / 2), (slope, errs)


# -- conservation laws ---------------------------------------------------------------------------------------
def drift_ratio(E):
    """mean |E − E₀| over the second half of a run / over the first half: ≈ 3 for a linear
    drift, ≈ 1 for the bounded, quasi-periodic O(h²) error of a symplectic method (whose
    envelope is modulated, so maxima over windows are a fragile criterion)."""
    dE = (E - E[0]).abs()
    n = len(dE)
    return dE[n // 2:].mean(0) / dE[1: n // 2].mean(0)


def bounded_energy_check(E, bound):
    assert (drift_ratio(E) < 1.5).all(), drift_ratio(E)
    assert (E - E[0]).abs().max() < bound, (E - E[0]).abs().max()


def test_drift_criterion_catches_a_non_symplectic_method():
    """Control: explicit Lie–Euler (g ← g cay(hξ), μ ← μ + h μ̇) stays on SO(3) but drifts."""
    system = heavy_top()
    g, mu = initial(system, 4)
    Es = [system.energy(g, mu)]
    with torch.no_grad():
        for _ in range(2000):
            xi, mud = system.vector_field(g, mu)
            g, mu = g @ so3.cay(0.02 * xi), mu + 0.02 * mud
            Es.append(system.energy(g, mu))
    assert (drift_ratio(torch.stack(Es)) > 2.0).all()


def test_heavy_top_energy_bounded_and_casimirs():
    system = heavy_top()
    g0, mu0 = initial(system, 4)
    with torch.no_grad():
        g, mu = rollout(system, LIE_METHODS["lie_midpoint_cayley"], g0, mu0, 0.02, 4000, save_every=4)
    e, det = so3.orthogonality_error(g)
    assert e.max() < 1e-13 and det.max() < 1e-13
    c1, c2 = system.casimirs(g, mu)
    assert (c1 - c1[0]).abs().max() < 1e-12        # Γ·μ = e₃·(gμ): discrete Noether
    assert (c2 - 1).abs().max() < 1e-13            # |Γ|² = 1: g stays on SO(3)
    bounded_energy_check(system.energy(g, mu), 1e-2)


def test_spring_top_on_so3xr3_conserves_vertical_momentum():
    system = spring_top()
    g0, mu0 = initial(system, 3)
    with torch.no_grad():
        g, mu = rollout(system, LIE_METHODS["lie_midpoint_cayley"], g0, mu0, 0.04, 1000, save_every=2)
    Lz = system.vertical_momentum(g, mu)
    assert (Lz - Lz[0]).abs().max() < 1e-11
    assert system.group.membership_error(g)[0].max() < 1e-13
    bounded_energy_check(system.energy(g, mu), 5e-2)


def test_float32():
    for system, steps in [(free_body(), 1500), (heavy_top(), 500)]:
        g0, mu0 = initial(system, 4)
        g0, mu0 = g0.float(), mu0.float()
        system.inertia = system.inertia.float()
        if isinstance(system, HeavyTop):
            system.com = system.com.float()
        with torch.no_grad():
            g, mu = rollout(system, LIE_METHODS["lie_midpoint_cayley"], g0, mu0, 0.02, steps,
                            save_every=steps)
        assert g.dtype == torch.float32 and mu.dtype == torch.float32
        assert so3.orthogonality_error(g[-1])[0].max() < 2e-5
        if isinstance(system, FreeRigidBody):
            rel = (mu[-1].norm(dim=-1) / mu0.norm(dim=-1) - 1).abs()
            assert rel.max() < 2e-5
        E = system.energy(g, mu)
        assert ((E[-1] - E[0]).abs() / E[0].abs()).max() < 1e-2
