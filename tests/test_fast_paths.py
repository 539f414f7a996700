"""Fast paths give the general path's numbers (issue 20).

* ``SeparableHamiltonian(None, V, mass=m)``: ∂T/∂p = p/m in closed form instead of autograd of
  T = ½ Σ p²/m — the same trajectory (bit for bit at m = 1) and the same gradients.
"""
import math

import pytest
import torch

import torchgeo_int as tgi



def V(q):
    return -1.0 / q.norm(dim=-1)


def kepler_state(batch=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    e = 0.6 * (1 + 0.04 * (torch.rand(batch, generator=g) - 0.5))
    q0 = torch.stack([1 - e, torch.zeros_like(e)], -1)
    p0 = torch.stack([torch.zeros_like(e), ((1 + e) / (1 - e)).sqrt()], -1)
    return q0, p0


@pytest.mark.parametrize("grad_mode", [False, True])
def test_unit_mass_is_the_energy_path_bit_for_bit(grad_mode):
    q0, p0 = kepler_state()
    general = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), V)
    fast = tgi.SeparableHamiltonian(None, V, mass=1.0)
    with torch.set_grad_enabled(grad_mode):
        a = tgi.rollout(general, q0, p0, h=0.01, steps=50, method="yoshida4")
        b = tgi.rollout(fast, q0, p0, h=0.01, steps=50, method="yoshida4")
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(fast.energy(q0, p0), general.energy(q0, p0))


def test_tensor_masses_match_autograd_of_the_kinetic_energy_and_its_gradients():
    # three bodies in the plane, one mass each (broadcast over the coordinates), batch of 4
    m = torch.tensor([[1.0], [1e-3], [3e-3]])
    g = torch.Generator().manual_seed(1)
    q0 = torch.randn(4, 3, 2, generator=g)
    p0 = torch.randn(4, 3, 2, generator=g) * m

    def pot(q):
        d = q[..., :, None, :] - q[..., None, :, :]
        r = ((d * d).sum(-1) + torch.eye(3)).sqrt()
        return -0.5 * ((m * m.T) * (1 - torch.eye(3)) / r).sum((-1, -2))

    general = tgi.SeparableHamiltonian(lambda p: ((p * p).sum(-1) / (2 * m[:, 0])).sum(-1), pot)
    fast = tgi.SeparableHamiltonian(None, pot, mass=m)
    assert torch.allclose(fast.energy(q0, p0), general.energy(q0, p0), rtol=1e-14, atol=0)
    assert torch.allclose(fast.velocity(p0), general.velocity(p0), rtol=1e-14, atol=0)
    x0 = (q0.clone().requires_grad_(), p0.clone().requires_grad_())
    outs = []
    for system in (general, fast):
        q, p = tgi.rollout(system, *x0, h=0.01, steps=20, method="verlet")
        loss = (q[-1] ** 2).sum() + (p[-1] ** 2).sum()
        outs.append((q, p, torch.autograd.grad(loss, x0)))
    (qa, pa, ga), (qb, pb, gb) = outs
    assert torch.allclose(qa, qb, rtol=1e-12, atol=1e-14) and torch.allclose(pa, pb, rtol=1e-12, atol=1e-14)
    for x, y in zip(ga, gb):
        assert torch.allclose(x, y, rtol=1e-10, atol=1e-12)


def test_a_learned_mass_gets_its_gradient():
    q0, p0 = kepler_state(3)
    w = torch.tensor(1.3, requires_grad=True)
    m_t = w * torch.ones(1)
    fast = tgi.SeparableHamiltonian(None, V, mass=m_t)
    general = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1) / m_t[0], V)
    grads = []
    for system in (general, fast):
        q, _ = tgi.rollout(system, q0, p0, h=0.01, steps=10)
        (gw,) = torch.autograd.grad(q[-1].sum(), w, retain_graph=True)
        grads.append(gw)
    assert torch.allclose(grads[0], grads[1], rtol=1e-12)
    assert float(grads[0]) != 0.0


@pytest.mark.parametrize("mass", [0.0, -1.0, math.inf, math.nan, True, "1",
                                  torch.tensor([1.0, 0.0]), torch.tensor([1, 2])])
def test_bad_mass_is_refused(mass):
    with pytest.raises(ValueError, match="mass"):
        tgi.SeparableHamiltonian(None, V, mass=mass)


def test_mass_and_kinetic_together_are_refused():
    with pytest.raises(ValueError, match="not both"):
        tgi.SeparableHamiltonian(lambda p: (p * p).sum(-1), V, mass=2.0)
    with pytest.raises(TypeError, match="callable"):
        tgi.SeparableHamiltonian(None, V)
