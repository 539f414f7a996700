"""2·10⁴ steps of the free rigid body (Cayley, α = ½: the closed-form path, two preconditioned
fixed-point iterations per step at h = 0.005): g stays on SO(3), the Casimir |μ| and the spatial angular
momentum g μ are conserved to round-off, and the energy error does not drift."""
import torch

from test_manifolds_conservation import drift_ratio
from test_manifolds_integrators import free_body, initial, rollout
from torchgeo_int.manifolds import so3
from torchgeo_int.manifolds.integrators import LieGroupIntegrator

# 2·10⁴ steps (100 time units): the suite's budget; the round-off
# bounds below are those of 10⁵ steps, so a drift of 1 ulp per step would still fail them.
STEPS, H = 20_000, 0.005


def test_free_rigid_body_long_run():
    system = free_body()
    g0, mu0 = initial(system, 4)
    # check_every=2: at h = 0.005 the preconditioned iteration converges in 2 from the
    # cubic-extrapolated warm start, so one convergence check (one host sync) per step suffices
    m = LieGroupIntegrator("cayley", 0.5, check_every=2)
    with torch.no_grad():
        g, mu = rollout(system, m, g0, mu0, H, STEPS, save_every=100)
    assert g.shape == (STEPS // 100 + 1, 4, 3, 3)
    orth, det = so3.orthogonality_error(g)
    # Each step rounds g's entries (ε/2): a random walk with std ≈ 0.4 ε √N ≈ 6e-15 at
    # N = 2·10⁴, so 1e-13 is ~16σ; a bias of 1 ulp per step (drift) would reach ~4e-12.
    assert orth.max() < 1e-13 and det.max() < 1e-13, (orth.max(), det.max())
    rel = (mu.norm(dim=-1) / mu0.norm(dim=-1) - 1).abs()
    assert rel.max() < 1e-13, rel.max()
    L = system.spatial_momentum(g, mu)
    assert ((L - L[0]).norm(dim=-1) / L[0].norm(dim=-1)).max() < 1e-13
    E = system.energy(g, mu)
    assert (drift_ratio(E) < 1.5).all(), drift_ratio(E)
    assert ((E - E[0]).abs() / E[0]).max() < 1e-4     # O(h²)
