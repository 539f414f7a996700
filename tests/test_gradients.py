"""rollout(grad=...): checkpointed and reversible gradients equal backprop's."""
import pytest
import torch
from torch import nn

import torchgeo_int as tgi


class MLPPotential(nn.Module):
    def __init__(self, n=2, width=16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n, width), nn.Tanh(), nn.Linear(width, 1))

    def forward(self, q):
        return self.net(q).squeeze(-1) + 0.5 * (q * q).sum(-1)


def separable_hnn():
    return tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), MLPPotential())


class MLPHamiltonian(tgi.Hamiltonian):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

    def hamiltonian(self, q, p):
        z = torch.cat([q, p], -1)
        return 0.1 * self.net(z).squeeze(-1) + 0.5 * (z * z).sum(-1)


def loss_and_grads(system, method, steps, grad, save_every=1, **opts):
    q0 = (0.5 * torch.randn(8, 2, generator=torch.Generator().manual_seed(1))).requires_grad_()
    p0 = (0.5 * torch.randn(8, 2, generator=torch.Generator().manual_seed(2))).requires_grad_()
    q, p = tgi.rollout(system, q0, p0, h=0.05, steps=steps, method=method, save_every=save_every,
                       grad=grad, **opts)
    target = torch.sin(torch.arange(q.numel(), dtype=q.dtype)).reshape(q.shape)
    loss = ((q - target) ** 2).mean() + (p ** 2).mean()
    params = [w for w in system.parameters()]
    grads = torch.autograd.grad(loss, [q0, p0, *params], allow_unused=True)  # V's constant is unused
    return loss, [torch.zeros_like(w) if g is None else g for w, g in zip([q0, p0, *params], grads)]


def assert_close(ga, gb, rtol):
    for a, b in zip(ga, gb):
        assert (a - b).abs().max() <= rtol * (b.abs().max() + 1e-30), float((a - b).abs().max())


@pytest.mark.parametrize("save_every,segment", [(1, None), (7, None), (1, 33), (5, 12)])
def test_checkpoint_equals_backprop_separable(save_every, segment):
    system = separable_hnn()
    la, ga = loss_and_grads(system, "verlet", 200, "backprop", save_every)
    lb, gb = loss_and_grads(system, "verlet", 200, "checkpoint", save_every, segment=segment)
    assert torch.allclose(la, lb, rtol=0, atol=1e-14)
    assert_close(gb, ga, 1e-10)


def test_checkpoint_equals_backprop_implicit():
    system = MLPHamiltonian()
    la, ga = loss_and_grads(system, "implicit_midpoint", 20, "backprop")
    lb, gb = loss_and_grads(system, "implicit_midpoint", 20, "checkpoint", segment=6)
    assert torch.allclose(la, lb, atol=1e-13)
    assert_close(gb, ga, 1e-10)


@pytest.mark.parametrize("method", ["verlet", "yoshida4"])
@pytest.mark.parametrize("save_every", [1, 10])
def test_reversible_equals_backprop(method, save_every):
    """Documented tolerance: 1e-8 relative in float64 over 200 steps of a regular orbit."""
    system = separable_hnn()
    la, ga = loss_and_grads(system, method, 200, "backprop", save_every)
    lb, gb = loss_and_grads(system, method, 200, "reversible", save_every)
    assert torch.allclose(la, lb, atol=1e-14)
    assert_close(gb, ga, 1e-8)


def test_gradcheck_tiny_cases():
    system = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1),
                                      lambda q: (1 - torch.cos(q)).sum(-1) + 0.1 * (q ** 4).sum(-1))
    q0 = torch.tensor([[0.3, -0.4]], requires_grad=True)
    p0 = torch.tensor([[0.2, 0.1]], requires_grad=True)
    for grad, opts in [("checkpoint", dict(segment=3)), ("reversible", {})]:
        f = lambda q, p: tgi.rollout(system, q, p, h=0.1, steps=10, method="verlet", grad=grad, **opts)
        assert torch.autograd.gradcheck(f, (q0, p0))


def test_reversible_refuses_what_it_cannot_do():
    q0, p0 = torch.zeros(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match="symmetric explicit"):
        tgi.rollout(separable_hnn(), q0, p0, h=0.1, steps=3, method="symplectic_euler", grad="reversible")
    with pytest.raises(ValueError, match="symmetric explicit"):
        tgi.rollout(MLPHamiltonian(), q0, p0, h=0.1, steps=3, method="verlet", grad="reversible")
    k = torch.tensor(2.0, requires_grad=True)   # captured in a closure, not a module parameter
    system = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: k * (q * q).sum(-1))
    with pytest.raises(ValueError, match="params"):
        tgi.rollout(system, q0, p0, h=0.1, steps=3, method="verlet", grad="reversible")
    with pytest.raises(ValueError, match="params"):
        tgi.rollout(system, q0, p0, h=0.1, steps=3, method="verlet", grad="checkpoint")
    q, p = tgi.rollout(system, q0, p0, h=0.1, steps=3, method="verlet", grad="reversible", params=[k])
    (gk,) = torch.autograd.grad(q.sum(), k)
    qb, _ = tgi.rollout(system, q0, p0, h=0.1, steps=3, method="verlet")
    (gb,) = torch.autograd.grad(qb.sum(), k)
    assert torch.allclose(gk, gb, atol=1e-12)
    with pytest.raises(ValueError, match="grad must be"):
        tgi.rollout(system, q0, p0, h=0.1, steps=3, grad="adjoint")
    with pytest.raises(TypeError, match="unexpected options"):
        tgi.rollout(system, q0, p0, h=0.1, steps=3, segment=4)


def test_reversible_warns_when_reconstruction_is_off():
    system = separable_hnn()
    q0 = torch.randn(4, 2, requires_grad=True)
    p0 = torch.randn(4, 2)
    q, p = tgi.rollout(system, q0, p0, h=0.05, steps=50, grad="reversible", reconstruction_tol=0.0)
    with pytest.warns(RuntimeWarning, match="reconstruction"):
        q[-1].sum().backward()
