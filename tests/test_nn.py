"""torchgeo_int.nn: HNN modules, rollout layers, losses, training loop, metrics (float64, tiny nets)."""
import math

import pytest
import torch
from torch import nn

import torchgeo_int as tgi
from torchgeo_int.nn.layers import SymplecticRollout, SymplecticStep
from torchgeo_int.nn.losses import (derivative_loss, finite_differences, make_windows,
                                    residual_loss, rollout_loss)
from torchgeo_int.nn.metrics import (energy_drift, energy_mse, hamiltonian_error, predict,
                                     rollout_mse, state_mse)
from torchgeo_int.nn.modules import HNN, MLPVectorField, MechanicalHNN, SeparableHNN
from torchgeo_int.nn.training import TensorBatches, fit, load_checkpoint, save_checkpoint

TINY = dict(width=8, depth=2)


def _tiny(kind, dim=1):
    if kind == "hnn":
        return HNN(dim, **TINY)
    if kind == "separable":
        return SeparableHNN(dim, **TINY)
    if kind == "mechanical":
        return MechanicalHNN(dim, **TINY)
    if kind == "mechanical_const":
        return MechanicalHNN(dim, constant_mass=True, **TINY)
    raise AssertionError(kind)


def _pendulum_trajectories(B=4, T=9, h=0.2):
    """Trajectories of H = p²/2 + (1 − cos q) from yoshida8 at small steps, sampled every h."""
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: (1 - torch.cos(q)).sum(-1),
                                 kinetic_grad=lambda p: p, potential_grad=torch.sin)
    q0 = torch.linspace(-1.0, 1.0, B)[:, None]
    p0 = torch.linspace(0.5, -0.3, B)[:, None]
    with torch.no_grad():
        q, p = tgi.rollout(H, q0, p0, h=h / 8, steps=8 * (T - 1), method="yoshida8", save_every=8)
    return H, q.transpose(0, 1).contiguous(), p.transpose(0, 1).contiguous()


def _directional_check(model, loss, eps=1e-6, tol=1e-6):
    """⟨∇_θ L, v⟩ against a central difference of L along a random direction v."""
    params = [p for p in model.parameters()]
    L = loss()
    grads = torch.autograd.grad(L, params, allow_unused=True)
    v = [torch.randn_like(p) for p in params]
    analytic = sum(float((g * d).sum()) for g, d in zip(grads, v) if g is not None)
    with torch.no_grad():
        for p, d in zip(params, v):
            p.add_(eps * d)
    Lp = float(loss().detach())
    with torch.no_grad():
        for p, d in zip(params, v):
            p.sub_(2 * eps * d)
    Lm = float(loss().detach())
    with torch.no_grad():
        for p, d in zip(params, v):
            p.add_(eps * d)
    fd = (Lp - Lm) / (2 * eps)
    assert abs(analytic) > 1e-8, "degenerate check: the directional derivative vanishes"
    assert abs(analytic - fd) < tol * max(1.0, abs(fd)), (analytic, fd)


# -- gradients of every loss w.r.t. the parameters -------------------------------------------

@pytest.mark.parametrize("kind,method", [("separable", "verlet"), ("separable", "yoshida4"),
                                         ("hnn", "implicit_midpoint"), ("mechanical", "verlet")])
def test_rollout_loss_gradient_matches_finite_differences(kind, method):
    _, q, p = _pendulum_trajectories()
    qw, pw = make_windows(q, p, 3)
    model = _tiny(kind)
    _directional_check(model, lambda: rollout_loss(model, qw, pw, dt=0.2, method=method))


@pytest.mark.parametrize("R", [tgi.MidpointMap(), tgi.AlphaMap(0.3),
                               tgi.RetractionMap(lambda x, v: x + v + 0.1 * v * v, alpha=0.5)],
                         ids=["midpoint", "alpha0.3", "retraction"])
def test_residual_loss_gradient_matches_finite_differences(R):
    _, q, p = _pendulum_trajectories()
    model = _tiny("hnn")
    _directional_check(model, lambda: residual_loss(model, q, p, dt=0.2, R=R))


def test_derivative_loss_gradient_matches_finite_differences():
    H, q, p = _pendulum_trajectories()
    dq, dp = H.vector_field(q, p)
    for model in (_tiny("hnn"), _tiny("mechanical")):
        _directional_check(model, lambda: derivative_loss(model, q, p, dq, dp))


# -- losses: what they measure ---------------------------------------------------------------

class Quadratic(tgi.Hamiltonian):
    """H = a q² + b p² + c q p with learnable (a, b, c) (c = 0 and frozen: separable data)."""

    def __init__(self, a, b, c=0.0):
        super().__init__(None, time_dependent=False)
        self.a, self.b, self.c = (nn.Parameter(torch.tensor(float(x))) for x in (a, b, c))

    def hamiltonian(self, q, p, t=0.0):
        return (self.a * q * q + self.b * p * p + self.c * q * p).sum(-1)


class SeparableQuadratic(tgi.SeparableHamiltonian):
    """H = a q² + b p², learnable, as T(p) + V(q): the explicit methods apply."""

    def __init__(self, a, b):
        super().__init__(lambda p: self.b_ * (p * p).sum(-1), lambda q: self.a_ * (q * q).sum(-1))
        self.a_, self.b_ = nn.Parameter(torch.tensor(float(a))), nn.Parameter(torch.tensor(float(b)))


@pytest.mark.parametrize("R,method", [
    (tgi.MidpointMap(), "implicit_midpoint"),
    (tgi.AlphaMap(0.3), tgi.CotangentLiftIntegrator(tgi.AlphaMap(0.3))),
    (tgi.RetractionMap(lambda x, v: x + v + 0.1 * v * v, alpha=0.5),
     tgi.CotangentLiftIntegrator(tgi.RetractionMap(lambda x, v: x + v + 0.1 * v * v, alpha=0.5))),
], ids=["midpoint", "alpha0.3", "retraction"])
def test_residual_loss_vanishes_exactly_on_the_integrators_own_steps(R, method):
    """Eq. (20): data made by CotangentLiftIntegrator(R) for H have zero residual under H only."""
    H = Quadratic(0.7, 0.4, 0.2)
    q0 = torch.tensor([[0.5], [-0.3], [0.1]])
    p0 = torch.tensor([[0.0], [0.4], [-0.6]])
    with torch.no_grad():
        q, p = tgi.rollout(H, q0, p0, h=0.1, steps=6, method=method)
    q, p = q.transpose(0, 1), p.transpose(0, 1)
    with torch.no_grad():
        assert float(residual_loss(H, q, p, dt=0.1, R=R)) < 1e-24
        other = Quadratic(0.7, 0.45, 0.2)
        assert float(residual_loss(other, q, p, dt=0.1, R=R)) > 1e-6


def test_midpoint_residual_is_the_implicit_midpoint_equation():
    H, q, p = _pendulum_trajectories()
    model = _tiny("hnn")
    h = 0.2
    qm, pm = (q[:, 1:] + q[:, :-1]) / 2, (p[:, 1:] + p[:, :-1]) / 2
    dq, dp = model.vector_field(qm, pm)
    expected = (((q[:, 1:] - q[:, :-1]) / h - dq) ** 2).mean() / 2 + (((p[:, 1:] - p[:, :-1]) / h - dp) ** 2).mean() / 2
    got = residual_loss(model, q, p, dt=h)
    assert torch.allclose(got, expected, rtol=1e-12)


def test_rollout_loss_vanishes_on_own_steps_and_equals_layer_error():
    H = Quadratic(0.5, 0.5)
    q0, p0 = torch.tensor([[0.4], [-0.2]]), torch.tensor([[0.1], [0.5]])
    layer = SymplecticRollout(H, "verlet", h=0.1, steps=12, save_every=3)
    with torch.no_grad():
        q, p = layer(q0, p0)
    q, p = q.transpose(0, 1), p.transpose(0, 1)
    with torch.no_grad():
        assert float(rollout_loss(H, q, p, dt=0.3, method="verlet", substeps=3)) < 1e-28
        assert float(rollout_loss(H, q, p, dt=0.3, method="verlet", substeps=1)) > 1e-8


def test_derivative_loss_zero_on_true_field_and_finite_differences_are_second_order():
    H, q, p = _pendulum_trajectories(T=17, h=0.05)
    dq, dp = H.vector_field(q, p)
    assert float(derivative_loss(H, q, p, dq, dp).detach()) < 1e-30
    e1 = (finite_differences(q, p, 0.05)[1] - dp).abs().max()
    H2, q2, p2 = _pendulum_trajectories(T=33, h=0.025)
    e2 = (finite_differences(q2, p2, 0.025)[1] - H2.vector_field(q2, p2)[1]).abs().max()
    assert 3.0 < float((e1 / e2).detach()) < 5.0        # halving the spacing divides the error by ~4


def test_make_windows_layout():
    q = torch.arange(2 * 5 * 1.0).reshape(2, 5, 1)
    qw, pw = make_windows(q, -q, 2)
    assert qw.shape == (2 * 3, 3, 1)
    assert torch.equal(qw[4, :, 0], torch.tensor([6.0, 7.0, 8.0]))   # trajectory 1, window 1
    assert torch.equal(pw, -qw)
    assert make_windows(q, q, 2, stride=2)[0].shape == (2 * 2, 3, 1)


# -- training a known H to its true coefficients ---------------------------------------------

@pytest.mark.parametrize("method", ["verlet", "implicit_midpoint"])
def test_rollout_layer_trains_quadratic_to_true_coefficients(method):
    """Data from the same method with H* = 0.8 q² + 0.3 p²: the layer's loss is zero only at
    (a, b) = (0.8, 0.3), and training from (0.5, 0.5) gets there (separable form for Verlet,
    generic form — fixed-point steps, implicit backward — for the midpoint rule)."""
    make = SeparableQuadratic if method == "verlet" else Quadratic
    true = make(0.8, 0.3)
    q0 = torch.linspace(-1, 1, 6)[:, None]
    p0 = torch.linspace(0.8, -0.5, 6)[:, None]
    steps = 5 if method == "verlet" else 3     # implicit steps cost a fixed point each
    with torch.no_grad():
        q, p = SymplecticRollout(true, method, h=0.2, steps=steps)(q0, p0)
    model = make(0.5, 0.5)
    params = [model.a_, model.b_] if method == "verlet" else [model.a, model.b]
    if method != "verlet":
        model.c.requires_grad_(False)
    layer = SymplecticRollout(model, method, h=0.2, steps=steps)

    def loss(m, q0_, p0_, qt, pt):
        qs, ps = m(q0_, p0_)                 # time first; the data are samples first
        return ((qs.transpose(0, 1) - qt) ** 2).mean() + ((ps.transpose(0, 1) - pt) ** 2).mean()

    data = (q0, p0, q.transpose(0, 1), p.transpose(0, 1))
    opt = torch.optim.Adam(params, lr=0.03)
    fit(layer, loss, data, steps=80, optimizer=opt, progress=False)
    for g in opt.param_groups:
        g["lr"] = 0.003
    fit(layer, loss, data, steps=40, optimizer=opt, progress=False)
    a, b = (float(x.detach()) for x in params)
    assert abs(a - 0.8) < 2e-3 and abs(b - 0.3) < 2e-3, (a, b)


def test_tiny_hnn_learns_pendulum_through_verlet():
    """A tiny SeparableHNN trained through Verlet windows cuts its held-out rollout error."""
    H, q, p = _pendulum_trajectories(B=6, T=11, h=0.2)
    qw, pw = make_windows(q[:4], p[:4], 2)
    torch.manual_seed(1)
    model = SeparableHNN(1, width=16, depth=2)
    before = float(rollout_mse(model, q[4:], p[4:], dt=0.2))
    fit(model, lambda m, a, b: rollout_loss(m, a, b, dt=0.2, method="verlet"), (qw, pw),
        steps=150, lr=1e-2, progress=False)
    after = float(rollout_mse(model, q[4:], p[4:], dt=0.2))
    assert after < 0.1 * before, (before, after)


# -- checkpoints -----------------------------------------------------------------------------

def _noisy_loss(m, a, b):
    # torch's global RNG inside the loss: the checkpoint must carry its state
    noise = 1e-3 * torch.randn_like(a)
    return rollout_loss(m, a + noise, b, dt=0.2, method="verlet")


def test_checkpoint_resume_is_bit_identical(tmp_path):
    _, q, p = _pendulum_trajectories(B=4, T=9)
    data = make_windows(q, p, 2)           # 28 windows, batches of 8: 3 per epoch, shuffled
    torch.manual_seed(3)
    ref = SeparableHNN(1, **TINY)
    init = {k: v.clone() for k, v in ref.state_dict().items()}
    full = fit(ref, _noisy_loss, data, steps=10, batch_size=8, seed=7, progress=False)

    ck = tmp_path / "ck.pt"
    first = SeparableHNN(1, **TINY)
    first.load_state_dict(init)
    fit(first, _noisy_loss, data, steps=4, batch_size=8, seed=7, progress=False, checkpoint=ck)
    torch.randn(100)                         # disturb the global RNG between the two runs
    second = SeparableHNN(1, **TINY)        # different init: everything comes from the file
    rest = fit(second, _noisy_loss, data, steps=10, batch_size=8, seed=7, progress=False,
               checkpoint=ck, resume=True)
    for (k, a), b in zip(ref.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), k
    assert rest["loss"] == full["loss"] and rest["step"] == 10
    blob = torch.load(ck, weights_only=True)
    assert blob["step"] == 10 and len(blob["history"]["loss"]) == 10


@pytest.mark.parametrize("stop", [2, 4, 6])     # inside the first epoch, at its end, inside the second
@pytest.mark.parametrize("own_generator", [False, True])
def test_resume_with_a_shuffling_data_loader_is_bit_identical(tmp_path, stop, own_generator):
    """A DataLoader(shuffle=True) draws its order from the global RNG when its iteration starts,
    or from its own generator= (whose state the checkpoint did not keep: the resumed run saw
    other batches): the resumed epoch must see the rest of the interrupted run's order."""
    from torch.utils.data import DataLoader, TensorDataset
    _, q, p = _pendulum_trajectories(B=4, T=9)
    data = make_windows(q, p, 2)           # 28 windows, batches of 8: 4 per epoch

    def loader():
        gen = torch.Generator().manual_seed(11) if own_generator else None
        return DataLoader(TensorDataset(*data), batch_size=8, shuffle=True, generator=gen)

    def seen(log):
        return lambda m, a, b: (log.append(a[:, 0, 0].clone()), _noisy_loss(m, a, b))[1]

    torch.manual_seed(3)
    ref = SeparableHNN(1, **TINY)
    init = {k: v.clone() for k, v in ref.state_dict().items()}
    full_log, part_log = [], []
    full = fit(ref, seen(full_log), loader(), steps=10, seed=7, progress=False)
    ck = tmp_path / "ck.pt"
    first = SeparableHNN(1, **TINY)
    first.load_state_dict(init)
    fit(first, seen(part_log), loader(), steps=stop, seed=7, progress=False, checkpoint=ck)
    torch.randn(100)                         # disturb the global RNG between the two runs
    second = SeparableHNN(1, **TINY)
    rest = fit(second, seen(part_log), loader(), steps=10, seed=7, progress=False,
               checkpoint=ck, resume=True)
    assert all(torch.equal(a, b) for a, b in zip(full_log, part_log)) and len(part_log) == 10
    for (k, a), b in zip(ref.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), k
    assert rest["loss"] == full["loss"]


def test_a_checkpoint_refuses_what_it_could_not_load(tmp_path):
    import pathlib
    model = HNN(1, **TINY)
    with pytest.raises(TypeError, match=r"extra\['run_dir'\] is a PosixPath.*str\(path\)"):
        save_checkpoint(tmp_path / "c.pt", model, None, step=3,
                        extra={"run_dir": pathlib.Path(tmp_path), "ok": [1, "a", None]})
    assert not (tmp_path / "c.pt").exists()
    save_checkpoint(tmp_path / "c.pt", model, None, step=3,
                    extra={"run_dir": str(tmp_path), "ok": [1, "a", None, (2.0, torch.ones(2))]})
    assert load_checkpoint(tmp_path / "c.pt", model)["extra"]["run_dir"] == str(tmp_path)


def test_checkpoint_functions_and_resume_errors(tmp_path):
    model = HNN(1, **TINY)
    opt = torch.optim.Adam(model.parameters())
    path = save_checkpoint(tmp_path / "a" / "c.pt", model, opt, step=3, history={"loss": [1.0, 0.5]},
                           extra={"note": "x"})
    other = HNN(1, **TINY)
    state = load_checkpoint(path, other, torch.optim.Adam(other.parameters()))
    assert state == {"step": 3, "history": {"loss": [1.0, 0.5]}, "extra": {"note": "x"}}
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        fit(model, lambda m, x: m.energy(x, x).mean(), torch.zeros(4, 1), steps=1,
            resume=tmp_path / "missing.pt", progress=False)
    torch.save({"weights": torch.zeros(1)}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="not a valid torchgeo_int checkpoint"):
        load_checkpoint(tmp_path / "foreign.pt", model)
    # another optimizer class: refused before the model is touched (SGD on Adam's state failed
    # inside its step, AdamW on Adam's ran without its weight decay)
    third = HNN(1, **TINY)
    before = [w.clone() for w in third.parameters()]
    for opt in (torch.optim.SGD(third.parameters(), lr=0.1, momentum=0.9), torch.optim.AdamW(third.parameters())):
        with pytest.raises(ValueError, match=f"an optimizer of class Adam, not {type(opt).__name__}"):
            load_checkpoint(path, third, opt)
    assert all(torch.equal(a, b) for a, b in zip(before, third.parameters()))


# -- modules ---------------------------------------------------------------------------------

def test_mechanical_mass_matrix_is_positive_definite():
    torch.manual_seed(2)
    model = MechanicalHNN(3, width=16, depth=2, eps=1e-3)
    with torch.no_grad():                    # leave the benign init: random, large weights
        for prm in model.parameters():
            prm.normal_(0.0, 3.0)
    q = 5 * torch.randn(200, 3)
    M = model.mass_matrix(q).detach()
    assert torch.allclose(M, M.mT, atol=1e-12)
    eig = torch.linalg.eigvalsh(M)
    assert float(eig.min()) >= 1e-3 * (1 - 1e-9)
    p = torch.randn(200, 3)
    assert bool((model.kinetic(q, p) > 0).all())
    # X_H's velocity half is M(q)⁻¹ p
    dq, _ = model.vector_field(q, p)
    assert torch.allclose(dq, torch.linalg.solve(M, p.unsqueeze(-1)).squeeze(-1), atol=1e-10)
    # the initialisation is M ≡ (1 + ε) I
    fresh = MechanicalHNN(3, width=16, eps=1e-3)
    assert torch.allclose(fresh.mass_matrix(q), (1 + 1e-3) * torch.eye(3).expand(200, 3, 3), atol=1e-12)


def test_module_defaults_and_structure():
    m = HNN(2)
    linears = [l for l in m.net if isinstance(l, nn.Linear)]
    assert [tuple(l.weight.shape) for l in linears] == [(200, 4), (200, 200), (1, 200)]
    assert isinstance(m.net[1], nn.Tanh)
    W = linears[1].weight
    assert torch.allclose(W @ W.T, torch.eye(200), atol=1e-10)     # orthogonal init
    assert SeparableHNN(2).separable and not HNN(2).separable
    assert MechanicalHNN(2, constant_mass=True).separable and not MechanicalHNN(2).separable
    s = SeparableHNN(2, **TINY)
    q, p = torch.randn(5, 2), torch.randn(5, 2)
    assert torch.allclose(s.energy(q, p), s.kinetic(p) + s.potential(q))
    f = MLPVectorField(2, **TINY)
    dq, dp = f.vector_field(q, p)
    assert torch.equal(torch.cat([dq, dp], -1), f(0.0, torch.cat([q, p], -1)))


@pytest.mark.parametrize("activation", ["tanh", "softplus", "sigmoid", "silu", "gelu", "elu", "sin"])
def test_closed_form_input_gradient_equals_autograds(activation):
    """MLP.input_grad equals autograd's ∇ of the output, and so do its own derivatives (what a
    loss trained through the forces differentiates): in the input and in every parameter."""
    torch.manual_seed(7)
    net = tgi.nn.MLP(3, 1, width=9, depth=3, activation=activation)
    assert net.closed_form_grad
    x = (3 * torch.randn(4, 5, 3)).requires_grad_()
    if activation == "softplus":           # both sides of torch's linear switch at βz = 20
        net[0].bias.data[:3] = torch.tensor([30.0, -30.0, 25.0])
    ref, = torch.autograd.grad(net(x).sum(), x, create_graph=True)
    g = net.input_grad(x)
    assert g.shape == x.shape
    assert torch.allclose(g, ref, rtol=1e-13, atol=1e-14)
    v = torch.randn_like(g)
    inputs = [x, *net.parameters()]
    for a, b in zip(torch.autograd.grad((g * v).sum(), inputs), torch.autograd.grad((ref * v).sum(), inputs)):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-13)



@pytest.mark.parametrize("activation", ["tanh", "softplus", "sigmoid", "silu", "gelu", "elu", "sin"])
@pytest.mark.parametrize("depth", [1, 3])
def test_closed_form_input_hessian_equals_autograds(activation, depth, monkeypatch):
    """MLP.input_grad_hessian: ∇f equal to input_grad's and ∇²f to torch.func.hessian's (exact,
    not differences), in float64 and float32, on inputs with leading batch dimensions; refused
    where input_grad is (several outputs, an activation without a closed form)."""
    torch.manual_seed(9)
    net = tgi.nn.MLP(3, 1, width=9, depth=depth, activation=activation)
    if activation == "softplus":           # both sides of torch's linear switch at βz = 20
        net[0].bias.data[:3] = torch.tensor([30.0, -30.0, 25.0])
    assert net.closed_form_hessian
    x = 3 * torch.randn(4, 5, 3)
    g, H = net.input_grad_hessian(x)
    assert g.shape == x.shape and H.shape == (4, 5, 3, 3)
    ref = torch.func.vmap(torch.func.hessian(lambda y: net(y).squeeze(-1)))(x.reshape(-1, 3)).reshape(4, 5, 3, 3)
    assert torch.allclose(g, net.input_grad(x), rtol=1e-13, atol=1e-14)
    assert torch.allclose(H, ref, rtol=1e-12, atol=1e-13)
    net32, x32 = net.float(), x.float()
    g32, H32 = net32.input_grad_hessian(x32)
    assert H32.dtype == torch.float32 and torch.allclose(H32.double(), ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="out_dim = 2"):
        tgi.nn.MLP(3, 2, width=9).input_grad_hessian(x)
    approx = tgi.nn.MLP(3, 1, width=9, activation=lambda: nn.GELU(approximate="tanh"))
    assert not approx.closed_form_hessian
    with pytest.raises(ValueError, match="closed-form second derivative.*GELU\\(approximate='tanh'\\)"):
        approx.input_grad_hessian(x)
    # an activation with a first-derivative rule and no second: named as such (not "a hook")
    monkeypatch.setitem(tgi.nn.modules.DERIVATIVES, nn.Softsign, lambda act, g, z, a: g / (1 + z.abs()) ** 2)
    soft = tgi.nn.MLP(3, 1, width=9, activation=nn.Softsign)
    assert soft.closed_form_grad and not soft.closed_form_hessian
    with pytest.raises(ValueError, match="has the activation Softsign"):
        soft.input_grad_hessian(x)

def test_hnn_modules_take_the_closed_form_forces_and_fall_back_to_autograd():
    """The HNN modules' ∇H come from MLP.input_grad (the same values as autograd of their H),
    decided when asked: a network reassigned or an activation swapped later is used as it is
    then; an activation without a closed form (GELU's tanh approximation, an in-place one) or a
    forward hook (the old weight_norm) keeps autograd's; input_grad refuses those clearly, and
    complex states get autograd's error; an HNN is freed without the cycle collector."""
    import gc
    import weakref

    torch.manual_seed(8)
    q, p = torch.randn(6, 2, requires_grad=True), torch.randn(6, 2, requires_grad=True)

    def check(model):
        ref = torch.autograd.grad(model.hamiltonian(q, p).sum(), (q, p))
        for a, b in zip(model.gradients(q, p), ref):
            assert torch.allclose(a, b, rtol=1e-13, atol=1e-15)
        halves = model.halves()
        if halves is not None:                               # the bound loops' halves too
            assert torch.allclose(halves[0](p), ref[1], rtol=1e-13, atol=1e-15)
            assert torch.allclose(halves[1](q), ref[0], rtol=1e-13, atol=1e-15)

    sep, hnn, mech = SeparableHNN(2, **TINY), HNN(2, **TINY), MechanicalHNN(2, constant_mass=True, **TINY)
    assert sep.kinetic.closed_form_grad and hnn.net.closed_form_grad
    for model in (sep, hnn, mech):
        check(model)
    approx = lambda: nn.GELU(approximate="tanh")          # noqa: E731
    for model in (SeparableHNN(2, activation=approx, **TINY), HNN(2, activation=approx, **TINY),
                  HNN(2, activation=lambda: nn.SiLU(inplace=True), **TINY)):
        assert not (model.kinetic if model.separable else model.net).closed_form_grad
        check(model)
    sep.kinetic = tgi.nn.ScalarMLP(2, **TINY)                # reassigned: the new network's ∇
    check(sep)
    hnn.net[1] = approx()                                    # swapped: autograd's ∇, no error
    check(hnn)
    hnn.net[1] = nn.Tanh()                                   # and back: the closed form again
    assert hnn.net.closed_form_grad
    check(hnn)
    with pytest.warns(FutureWarning):                        # hooks recompute the weight: autograd
        sep.potential.net[0] = nn.utils.weight_norm(sep.potential.net[0])
    assert not sep.potential.closed_form_grad
    check(sep)
    with pytest.raises(ValueError, match="forward hook"):
        sep.potential.input_grad(q)
    with pytest.raises(ValueError, match="GELU.*closed-form derivative|closed-form derivative.*GELU"):
        tgi.nn.MLP(2, 1, activation=approx, **TINY).input_grad(q)
    with pytest.raises(ValueError, match="out_dim = 2"):
        tgi.nn.MLP(2, 2, **TINY).input_grad(q)
    with pytest.raises(ValueError, match=r"inputs of shape \(\.\.\., 2\)"):
        mech.potential.input_grad(torch.randn(6, 3))
    with pytest.raises(ValueError, match="same shape"):
        HNN(2, **TINY).gradients(q, torch.randn(5, 2))
    z = torch.randn(6, 2, dtype=torch.complex128)
    for model in (SeparableHNN(2, **TINY), HNN(2, **TINY), MechanicalHNN(2, constant_mass=True, **TINY)):
        with pytest.raises(TypeError, match="complex"):
            model.gradients(z, z)
    gc.disable()
    try:
        model = HNN(2, **TINY)
        alive = weakref.ref(model)
        del model
        assert alive() is None
    finally:
        gc.enable()


def _symplectic_defect(step, q, p):
    n = q.shape[-1]
    J0 = torch.zeros(2 * n, 2 * n)
    J0[:n, n:], J0[n:, :n] = torch.eye(n), -torch.eye(n)

    def flat(x):
        q1, p1 = step(x[:n], x[n:])
        return torch.cat([q1, p1])

    J = torch.autograd.functional.jacobian(flat, torch.cat([q, p]))
    return float((J.T @ J0 @ J - J0).abs().max())


METHOD_CASES = ["verlet", "yoshida4", "symplectic_euler", "implicit_midpoint",
                "implicit_midpoint_yoshida4", tgi.CotangentLiftIntegrator(tgi.AlphaMap(0.3))]


@pytest.mark.parametrize("kind", ["hnn", "separable", "mechanical", "mechanical_const"])
@pytest.mark.parametrize("method", METHOD_CASES, ids=lambda m: m if isinstance(m, str) else "alpha0.3")
def test_modules_with_every_kind_of_method(kind, method):
    """One step of every method on every module: a symplectic map (Jᵀ J₀ J = J₀), energy nearly
    kept, parameter gradients through it."""
    torch.manual_seed(4)
    model = _tiny(kind, dim=2)
    step = SymplecticStep(model, method, h=0.05)
    q, p = torch.tensor([0.3, -0.2]), torch.tensor([0.1, 0.4])
    assert _symplectic_defect(step, q, p) < 1e-10
    q1, p1 = step(q, p)
    with torch.no_grad():
        assert abs(float(model.energy(q1, p1) - model.energy(q, p))) < 1e-2
    grads = torch.autograd.grad((q1 ** 2).sum() + p1.sum(), list(model.parameters()), allow_unused=True)
    assert any(g is not None and float(g.abs().max()) > 0 for g in grads)


def test_step_layer_equals_rollout_and_is_differentiable_in_the_state():
    model = _tiny("hnn", dim=1)
    step = SymplecticStep(model, "implicit_midpoint", h=0.3, substeps=3)
    q0, p0 = torch.tensor([[0.2]]), torch.tensor([[-0.1]])
    q1, p1 = step(q0, p0)
    qs, ps = tgi.rollout(model, q0, p0, h=0.1, steps=3, method="implicit_midpoint")
    assert torch.allclose(q1, qs[-1], atol=1e-14) and torch.allclose(p1, ps[-1], atol=1e-14)
    qg, pg = q0.clone().requires_grad_(), p0.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: step(a, b), (qg, pg))


def test_float32_training_step():
    _, q, p = _pendulum_trajectories()
    q, p = q.float(), p.float()
    qw, pw = make_windows(q, p, 2)
    model = SeparableHNN(1, **TINY).float()
    out = fit(model, lambda m, a, b: rollout_loss(m, a, b, dt=0.2, method="yoshida4"), (qw, pw),
              steps=40, lr=1e-2, progress=False)
    assert all(prm.dtype == torch.float32 for prm in model.parameters())
    assert out["loss"][-1] < 0.5 * out["loss"][0]
    hm = HNN(1, **TINY).float()
    loss = residual_loss(hm, q, p, dt=0.2) + rollout_loss(hm, qw, pw, dt=0.2, method="implicit_midpoint")
    assert loss.dtype == torch.float32 and math.isfinite(float(loss.detach()))


# -- metrics ---------------------------------------------------------------------------------

def test_metrics():
    H, q, p = _pendulum_trajectories()
    assert float(state_mse(q, p, q, p)) == 0.0
    assert float(energy_mse(H, q, p, q, p)) == 0.0
    assert float(energy_drift(H, q, p)) < 1e-10          # yoshida8 at h/8 keeps H
    shifted = tgi.Hamiltonian(lambda q_, p_: H.energy(q_, p_) + 5.0)
    assert float(hamiltonian_error(shifted, H, q, p)) < 1e-14     # a constant is invisible
    scaled = tgi.Hamiltonian(lambda q_, p_: 1.1 * H.energy(q_, p_))
    assert float(hamiltonian_error(scaled, H, q, p, relative=True)) == pytest.approx(0.1, rel=1e-9)
    qp, pp = predict(H, q[:, 0], p[:, 0], h=0.025, steps=64, method="yoshida8", save_every=8)
    assert qp.shape == q.shape and float(state_mse(qp, pp, q, p)) < 1e-20
    assert float(rollout_mse(H, q, p, dt=0.2, method="yoshida8", substeps=8)) < 1e-20
    drift = energy_drift(H, q, p, reduction="none")
    assert drift.shape == (q.shape[0],)



def test_metrics_refuse_a_square_pair_whose_time_axes_differ():
    """T == B: a rollout's (T, B, n) and the data's (B, T, n) have one shape, so the shape check
    cannot see the mix-up; state_mse and energy_mse refuse it, and take either layout when
    both sides share it."""
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: (1 - torch.cos(q)).sum(-1))
    g = torch.Generator().manual_seed(0)
    q0, p0 = torch.rand(8, 1, generator=g) * 2 - 1, torch.rand(8, 1, generator=g) * 2 - 1
    qt, pt = tgi.rollout(H, q0, p0, h=0.1, steps=7)                  # (T, B, 1), T == B == 8
    qb, pb = qt.transpose(0, 1), pt.transpose(0, 1)                   # (B, T, 1)
    for metric in (lambda *x: state_mse(*x), lambda *x: energy_mse(H, *x)):
        with pytest.raises(ValueError, match="time-first.*transpose"):
            metric(qt, pt, qb, pb)
        with pytest.raises(ValueError, match="the truth looks time-first"):
            metric(qb, pb, qt, pt)
        assert float(metric(qt, pt, qt, pt)) == float(metric(qb, pb, qb, pb)) == 0.0
    noisy = qb + 1e-3 * torch.randn(qb.shape, generator=g)
    assert float(state_mse(noisy, pb, qb, pb)) > 0

# -- bad input -------------------------------------------------------------------------------

def test_bad_data_raises_clearly():
    model = _tiny("separable")
    # trajectory-like: states change little along dim 1 (pure noise has no axis that looks like
    # time, and is refused as such before the errors below)
    q, p = (torch.randn(4, 1, 1) + 0.05 * torch.randn(4, 5, 1).cumsum(1) for _ in range(2))
    bad = q.clone()
    bad[1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match="q contains NaN"):
        rollout_loss(model, bad, p, dt=0.1)
    with pytest.raises(ValueError, match="same shape"):
        residual_loss(model, q, p[:, :4], dt=0.1)
    with pytest.raises(ValueError, match=r"\(N, L, n\)"):
        rollout_loss(model, q[0], p[0], dt=0.1)
    with pytest.raises(ValueError, match="at least 2 states"):
        residual_loss(model, q[:, :1], p[:, :1], dt=0.1)
    with pytest.raises(ValueError, match="dt must be a finite nonzero"):
        rollout_loss(model, q, p, dt=0.0)
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 1\)"):
        rollout_loss(model, torch.randn(4, 5, 2), torch.randn(4, 5, 2), dt=0.1, layout="windows")
    with pytest.raises(ValueError, match="k must be"):
        make_windows(q, p, 0)
    with pytest.raises(ValueError, match="needs at least 6 states"):
        make_windows(q, p, 5)
    with pytest.raises(TypeError, match="torch.Tensor"):
        derivative_loss(model, q, p, [0.0], p)
    with pytest.raises(ValueError, match="unknown method"):
        SymplecticStep(model, "leapfrog9", h=0.1)
    with pytest.raises(ValueError, match="step size"):
        SymplecticRollout(model, "verlet", h=0.0, steps=3)
    with pytest.raises(ValueError, match="unknown activation"):
        HNN(1, activation="relu6")
    with pytest.raises(ValueError, match="eps"):
        MechanicalHNN(1, eps=0.0)
    with pytest.raises(NotImplementedError, match="autonomous"):
        rollout_loss(tgi.Hamiltonian(lambda q_, p_, t: (p_ * p_).sum(-1) * t), q, p, dt=0.1)


def test_fit_rejects_bad_data_and_options():
    model = _tiny("hnn")
    loss = lambda m, a, b: rollout_loss(m, a, b, dt=0.1, method="implicit_midpoint")  # noqa: E731
    q, p = torch.randn(6, 3, 1), torch.randn(6, 3, 1)
    with pytest.raises(ValueError, match="same number of samples"):
        fit(model, loss, (q, p[:5]), steps=1, progress=False)
    bad = p.clone()
    bad[0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"data\[1\] contains NaN or inf"):
        fit(model, loss, (q, bad), steps=1, progress=False)
    with pytest.raises(ValueError, match="exactly one of steps"):
        fit(model, loss, (q, p), steps=1, epochs=1, progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        fit(model, loss, (q, p), steps=1, batch_size=0, progress=False)
    with pytest.raises(ValueError, match="checkpoint_every needs"):
        fit(model, loss, (q, p), steps=1, checkpoint_every=1, progress=False)
    with pytest.raises(TypeError, match="scalar tensor"):
        fit(model, lambda m, a, b: a.sum(-1), (q, p), steps=1, progress=False)
    with pytest.raises(FloatingPointError, match="non-finite at step 0"):
        fit(model, lambda m, a, b: loss(m, a, b) * float("nan"), (q, p), steps=3, progress=False)


def test_tensor_batches_are_a_function_of_seed_and_epoch():
    x = torch.arange(10.0)[:, None]
    a = TensorBatches(x, 3, seed=5)
    assert len(a) == 3
    e1 = [b[0].flatten().tolist() for b in a.epoch(1)]
    assert e1 == [b[0].flatten().tolist() for b in TensorBatches(x, 3, seed=5).epoch(1)]
    assert e1 != [b[0].flatten().tolist() for b in a.epoch(2)]
    assert [b[0].flatten().tolist() for b in a.epoch(1, start=2)] == e1[2:]
    assert sorted(sum(e1, [])) == sorted(set(sum(e1, [])))      # no repeats within an epoch
    full = TensorBatches(x)
    assert len(full) == 1 and torch.equal(next(iter(full.epoch(0)))[0], x)


def test_fit_lr_schedule_cosine_and_callable_and_resume(tmp_path):
    from torchgeo_int.nn.training import lr_factor
    assert lr_factor(None, 5, 10) == 1.0
    assert lr_factor("cosine", 0, 10) == 1.0
    assert lr_factor("cosine", 5, 10) == pytest.approx(0.5)
    assert lr_factor("cosine", 9, 10) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.9)))
    _, q, p = _pendulum_trajectories(B=4, T=9)
    data = make_windows(q, p, 2)
    seen = []

    class Spy(torch.optim.SGD):
        def step(self, closure=None):
            seen.append([g["lr"] for g in self.param_groups])
            return super().step(closure)

    torch.manual_seed(3)
    model = SeparableHNN(1, **TINY)
    opt = Spy([{"params": model.kinetic.parameters(), "lr": 0.1},
               {"params": model.potential.parameters(), "lr": 0.01}], lr=0.1)
    fit(model, _noisy_loss, data, steps=4, batch_size=8, optimizer=opt, progress=False,
        lr_schedule=lambda step, total: 1.0 / (1 + step))
    assert sum(seen, []) == pytest.approx(sum([[0.1 / k, 0.01 / k] for k in (1, 2, 3, 4)], []), rel=1e-12)
    assert [g["initial_lr"] for g in opt.param_groups] == [0.1, 0.01]
    # the schedule continues across a checkpoint (the initial lr travels with it); "cosine" runs
    # over the call's steps, so a run cut short by steps=k uses a schedule of the full length
    sched = lambda step, total: 0.5 * (1 + math.cos(math.pi * step / 8))   # noqa: E731
    runs = []
    for split in (None, 3):
        torch.manual_seed(3)
        m = SeparableHNN(1, **TINY)
        init = {k: v.clone() for k, v in m.state_dict().items()}
        ck = tmp_path / f"c{split}.pt"
        if split:
            fit(m, _noisy_loss, data, steps=split, batch_size=8, lr=1e-2, seed=7, progress=False,
                checkpoint=ck, lr_schedule=sched)
            m = SeparableHNN(1, **TINY)
        fit(m, _noisy_loss, data, steps=8, batch_size=8, lr=1e-2, seed=7, progress=False,
            checkpoint=ck, resume=bool(split), lr_schedule="cosine" if split else sched)
        runs.append(torch.cat([x.detach().reshape(-1) for x in m.parameters()]))
    assert torch.equal(runs[0], runs[1])
    # a cosine run resumed over another total would jump the lr: refused (it was taken)
    ck = tmp_path / "cos.pt"
    fit(SeparableHNN(1, **TINY), _noisy_loss, data, steps=3, batch_size=8, progress=False,
        checkpoint=ck, lr_schedule="cosine")
    fresh = SeparableHNN(1, **TINY)
    before = [w.clone() for w in fresh.parameters()]
    with pytest.raises(ValueError, match="cosine schedule over 3 steps and this run's is over 8"):
        fit(fresh, _noisy_loss, data, steps=8, batch_size=8, progress=False,
            checkpoint=ck, resume=True, lr_schedule="cosine")
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.parameters()))   # refused before loading
    model.load_state_dict(init)
    with pytest.raises(ValueError, match="lr_schedule must be None, 'cosine'"):
        fit(model, _noisy_loss, data, steps=1, progress=False, lr_schedule="linear")
    with pytest.raises(ValueError, match="must return a finite number >= 0"):
        fit(model, _noisy_loss, data, steps=1, progress=False, lr_schedule=lambda s, t: -1.0)


def _pair_distance(q):
    return (q[..., :2] - q[..., 2:]).norm(dim=-1, keepdim=True)


def test_networks_of_features_build_in_the_invariance_and_take_autograds_forces():
    """features=φ: the network sees φ(x) only, so an H of the invariant |q₁ − q₂| is the same at
    translated and rotated states; its forces are autograd's (the closed form is the network's
    of x, refused with features), equal and opposite on the two bodies, so Verlet keeps the total
    momentum to rounding; HNN(features=) likewise; a bad feature map or input is refused."""
    from torchgeo_int.nn.modules import ScalarMLP

    torch.manual_seed(3)
    sep = SeparableHNN(4, potential_features=_pair_distance, **TINY)
    hnn = HNN(4, features=lambda x: torch.cat([_pair_distance(x[..., :4]), x[..., 4:]], -1), **TINY)
    assert sep.potential.net.in_dim == 1 and sep.kinetic.net.in_dim == 4 and hnn.net.in_dim == 5
    assert not sep.potential.closed_form_grad and not sep.potential.closed_form_hessian
    assert sep.kinetic.closed_form_grad
    q, p = torch.randn(7, 4), torch.randn(7, 4)
    c, s = math.cos(0.7), math.sin(0.7)
    R = torch.tensor([[c, -s], [s, c]])
    moved = (q.view(7, 2, 2) @ R.T + torch.tensor([0.3, -1.2])).reshape(7, 4)
    for model in (sep, hnn):
        assert torch.allclose(model.hamiltonian(moved, p), model.hamiltonian(q, p), rtol=1e-12, atol=1e-12)
        qq, pp = q.clone().requires_grad_(), p.clone().requires_grad_()
        ref = torch.autograd.grad(model.hamiltonian(qq, pp).sum(), (qq, pp))
        for a, b in zip(model.gradients(q, p), ref):
            assert torch.allclose(a, b, rtol=1e-13, atol=1e-15)
        dV = model.gradients(q, p)[0]
        assert torch.allclose(dV[:, :2], -dV[:, 2:], rtol=1e-12, atol=1e-14)
    qs, ps = tgi.rollout(sep, q, p, h=0.05, steps=40, method="verlet")
    total = ps[..., :2] + ps[..., 2:]
    assert (total - total[0]).abs().max() < 1e-13
    with pytest.raises(ValueError, match="features"):
        sep.potential.input_grad(q)
    with pytest.raises(ValueError, match="features"):
        sep.potential.input_grad_hessian(q)
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 4\)"):
        sep.potential(torch.randn(3, 2))
    with pytest.raises(ValueError, match=r"keeping the leading dims.*\(1, 4\) it gave \(\)"):
        ScalarMLP(4, features=lambda x: x.sum())
    with pytest.raises(ValueError, match=r"it gave \(1,\) \(a reduction over the last dim.*keepdim=True"):
        SeparableHNN(4, potential_features=lambda q: (q[..., :2] - q[..., 2:]).norm(dim=-1), **TINY)
    with pytest.raises(TypeError, match="features must be a callable"):
        ScalarMLP(4, features=3)
    # float32, as users train: the same network of features, and a loss that backpropagates
    sep32 = SeparableHNN(4, potential_features=_pair_distance, **TINY).float()
    q32, p32 = q.float(), p.float()
    loss = tgi.rollout(sep32, q32, p32, h=0.05, steps=3, method="verlet")[0].square().mean()
    loss.backward()
    assert all(torch.isfinite(w.grad).all() for w in sep32.potential.parameters())


def test_feature_maps_with_parameters_are_the_models_and_are_probed_in_their_own_dtype():
    """A module φ is probed in its own dtype and in eval mode (a float32 layer under a float64
    default; a BatchNorm's running statistics untouched); a module's bound method registers its
    module, so φ's parameters are trained, saved and converted with the model; a φ that does
    not fit dim is refused naming the shapes."""
    import copy

    from torchgeo_int.nn.modules import ScalarMLP

    torch.manual_seed(4)
    lin = nn.Linear(4, 2).float()
    f32 = ScalarMLP(4, features=lin, **TINY)
    assert f32.net.in_dim == 2 and any(w is lin.weight for w in f32.parameters())
    assert f32.float()(torch.randn(3, 4, dtype=torch.float32)).shape == (3,)
    bn = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    before = bn[1].running_mean.clone()
    ScalarMLP(4, features=bn, **TINY)
    assert bn.training and torch.equal(bn[1].running_mean, before)
    enc = nn.Linear(4, 3)
    model = ScalarMLP(4, features=enc.forward, **TINY)
    assert any(w is enc.weight for w in model.parameters()) and "features_owner.weight" in model.state_dict()
    copied = copy.deepcopy(model).float()
    assert copied.features_owner.weight.dtype == torch.float32 and copied.features.__self__ is copied.features_owner
    x = torch.randn(5, 4, dtype=torch.float32)
    assert torch.allclose(copied(x), model.float()(x))
    with pytest.raises(ValueError, match=r"features must map \(\.\.\., 2\) to \(\.\.\., k\): on zeros of shape \(1, 2\) it raised"):
        SeparableHNN(2, potential_features=_pair_distance, **TINY)


def test_pair_distances_are_the_invariants_of_euclidean_motions():
    """PairDistances(n, d): the n(n−1)/2 distances in the order of triu_indices, equal to the
    hand-written ones; unchanged by a rotation, reflection and translation of all the points; a
    potential of them keeps the total momentum and, with T = ½|p|², the angular momentum under
    Verlet (to rounding); a SeparableHNN holding it pickles whole; wrong shapes and arguments
    refused."""
    import io

    torch.manual_seed(5)
    pd = tgi.nn.PairDistances(3, 3)
    q = torch.randn(6, 9)
    x = q.view(6, 3, 3)
    hand = torch.stack([(x[:, 0] - x[:, 1]).norm(dim=-1), (x[:, 0] - x[:, 2]).norm(dim=-1),
                        (x[:, 1] - x[:, 2]).norm(dim=-1)], -1)
    assert torch.allclose(pd(q), hand, rtol=1e-15, atol=0)
    Q, _ = torch.linalg.qr(torch.randn(3, 3))                 # a rotation or a reflection
    moved = (x @ Q.T + torch.tensor([1.0, -2.0, 0.5])).reshape(6, 9)
    assert torch.allclose(pd(moved), pd(q), rtol=1e-12, atol=1e-12)
    V = tgi.nn.ScalarMLP(6, features=tgi.nn.PairDistances(3, 2), **TINY)     # three bodies in the plane
    model = tgi.SeparableHamiltonian(None, V, mass=1.0)                          # T = ½|p|²
    q0, p0 = torch.randn(4, 6), torch.randn(4, 6)
    qs, ps = tgi.rollout(model, q0, p0, h=0.02, steps=50, method="verlet")
    P = ps.view(51, 4, 3, 2).sum(2)
    L = (qs.view(51, 4, 3, 2)[..., 0] * ps.view(51, 4, 3, 2)[..., 1]
         - qs.view(51, 4, 3, 2)[..., 1] * ps.view(51, 4, 3, 2)[..., 0]).sum(-1)
    assert (P - P[0]).abs().max() < 1e-13 and (L - L[0]).abs().max() < 1e-12
    net = SeparableHNN(6, potential_features=tgi.nn.PairDistances(3, 2), **TINY)
    buf = io.BytesIO()
    torch.save(net, buf)
    buf.seek(0)
    again = torch.load(buf, weights_only=False)
    assert torch.equal(again.hamiltonian(q0, p0), net.hamiltonian(q0, p0))
    with pytest.raises(ValueError, match=r"PairDistances\(3, 2\) takes q of shape \(\.\.\., 6\)"):
        tgi.nn.PairDistances(3, 2)(torch.randn(2, 4))
    with pytest.raises(ValueError, match="bodies"):
        tgi.nn.PairDistances(1, 2)


def test_features_with_a_vjp_give_closed_form_forces():
    """A feature map with input_vjp(x, g) = J_φ(x)ᵀ g (PairDistances has one): the network's
    input gradient is J_φᵀ ∇MLP(φ) in plain tensor operations (closed_form_grad, the rollout's
    halves take it), equal to autograd's, also where two points coincide (0, as the norm's
    gradient); the training gradients through a rollout equal those of the same networks by
    autograd; HNN(features=) with a vjp likewise; an input_vjp of the wrong shape is refused."""
    from torchgeo_int.nn.modules import ScalarMLP

    torch.manual_seed(6)
    for n, d in ((2, 2), (3, 2), (4, 3)):
        pd = tgi.nn.PairDistances(n, d)
        q = torch.randn(5, 3, n * d, requires_grad=True)
        g = torch.randn(5, 3, n * (n - 1) // 2)
        ref, = torch.autograd.grad(pd(q), q, g)
        assert torch.allclose(pd.input_vjp(q, g), ref, rtol=1e-13, atol=1e-15)
    same = torch.tensor([[0.5, 1.0, 0.5, 1.0, 2.0, 0.0]], requires_grad=True)    # bodies 1, 2 coincide
    pd = tgi.nn.PairDistances(3, 2)
    ref, = torch.autograd.grad(pd(same), same, torch.ones(1, 3))
    assert torch.equal(pd.input_vjp(same, torch.ones(1, 3)), ref)

    sep = SeparableHNN(4, potential_features=tgi.nn.PairDistances(2, 2), **TINY)
    assert sep.potential.closed_form_grad and not sep.potential.closed_form_hessian
    assert sep.halves()[1] == sep.potential.input_grad
    q, p = torch.randn(6, 4), torch.randn(6, 4)
    qq = q.clone().requires_grad_()
    ref, = torch.autograd.grad(sep.potential(qq).sum(), qq)
    assert torch.allclose(sep.potential.input_grad(q), ref, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="features"):
        sep.potential.input_grad_hessian(q)
    K, V = sep.kinetic, sep.potential
    by_autograd = tgi.SeparableHamiltonian(lambda p_: K(p_), lambda q_: V(q_))
    grads = []
    for model in (sep, by_autograd):
        qs, ps = tgi.rollout(model, q, p, h=0.1, steps=5, method="verlet")
        grads.append(torch.autograd.grad(qs.square().mean() + ps.square().mean(), list(sep.parameters())))
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-14)

    pair = tgi.nn.PairDistances(2, 2)

    class Invariants(nn.Module):          # (|q₁ − q₂|, p) of cat[q, p], with its vjp
        def forward(self, x):
            return torch.cat([pair(x[..., :4]), x[..., 4:]], -1)

        def input_vjp(self, x, g):
            return torch.cat([pair.input_vjp(x[..., :4], g[..., :1]), g[..., 1:]], -1)

    hnn = HNN(4, features=Invariants(), **TINY)
    qq, pp = q.clone().requires_grad_(), p.clone().requires_grad_()
    ref = torch.autograd.grad(hnn.hamiltonian(qq, pp).sum(), (qq, pp))
    for a, b in zip(hnn.gradients(q, p), ref):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-14)

    class Wrong(nn.Module):
        def forward(self, x):
            return pair(x)

        def input_vjp(self, x, g):
            return g

    with pytest.raises(ValueError, match=r"input_vjp\(x, g\) must give .* shape \(6, 4\), got \(6, 1\)"):
        ScalarMLP(4, features=Wrong(), **TINY).input_grad(q)

    # a φ whose map is not the one its vjp differentiates keeps autograd's forces: a subclass
    # that changes forward and inherits input_vjp, a forward hook on φ (forces were off by 0.4)
    class Inverse(tgi.nn.PairDistances):
        def forward(self, q):
            return 1 / super().forward(q)

    hooked = tgi.nn.PairDistances(2, 2)
    hooked.register_forward_hook(lambda mod, args, out: out * out)
    for phi in (Inverse(2, 2), hooked):
        V = ScalarMLP(4, features=phi, **TINY)
        assert not V.closed_form_grad
        model = tgi.SeparableHamiltonian(None, V, mass=1.0)
        qq = q.clone().requires_grad_()
        ref, = torch.autograd.grad(V(qq).sum(), qq)
        assert torch.allclose(model.force_term(q), ref, rtol=1e-12, atol=1e-14)


def test_losses_refuse_empty_data():
    """N = 0 windows gave a NaN loss without an error (and TrajectoryFit failed later, in
    torch.cat); now each names the empty tensor."""
    m = SeparableHNN(1, **TINY)
    z = torch.zeros(0, 5, 1)
    for call in (lambda: tgi.nn.rollout_loss(m, z, z, dt=0.1), lambda: tgi.nn.residual_loss(m, z, z, dt=0.1),
                 lambda: tgi.nn.derivative_loss(m, z, z, z, z), lambda: tgi.nn.TrajectoryFit(m, z, z, dt=0.1)):
        with pytest.raises(ValueError, match=r"q holds no data \(shape \(0, 5, 1\)\)"):
            call()
