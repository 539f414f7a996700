"""Fast paths give the general path's numbers (issue 20).

* ``SeparableHamiltonian(None, V, mass=m)``: ∂T/∂p = p/m in closed form instead of autograd of
  T = ½ Σ p²/m — the same trajectory (bit for bit at m = 1) and the same gradients.
* Grad mode on with nothing requiring grad: the preallocated outputs of no_grad (the same
  numbers, no graph); a tensor that does require grad — from the start or only later — still
  gets its gradient.  Under no_grad a bound splitting writes each saved state into its output
  row (the same numbers as the copy).  ``compile=True`` under grad mode without a graph: the
  no_grad blocks.
* odeint with an explicit splitting of a separable func keeps the user's shapes: the same
  numbers as the flat state and as rollout.
"""
import math

import pytest
import torch

import torchgeo_int as tgi
from torchgeo_int._loop import n_saved, run_loop



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


@pytest.mark.parametrize("mass", [1.0, 2.5, torch.tensor([1.0, 3.0], dtype=torch.float64)])
def test_a_system_with_mass_pickles_whole(mass):
    """mass= builds a module (T and ∂T/∂p its methods), not lambdas: torch.save(system) keeps it
    whole, with the same energies and trajectory."""
    import io

    system = tgi.SeparableHamiltonian(None, V, mass=mass)
    buf = io.BytesIO()
    torch.save(system, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    q0, p0 = kepler_state(4)
    assert torch.equal(back.energy(q0, p0), system.energy(q0, p0))
    a = tgi.rollout(system, q0, p0, h=0.01, steps=5)
    b = tgi.rollout(back, q0, p0, h=0.01, steps=5)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_mass_is_kept_as_given():
    """mass= keeps m as it was given (as the closures before it did): .to() does not round a
    float64 m, state_dict and parameters() do not list it (an nn.Parameter m is the caller's to
    optimise, once); a deep copy of a system whose m carries a graph works and shares it."""
    import copy

    m = torch.tensor([1.0 + 1e-12, 2.0], dtype=torch.float64)
    system = tgi.SeparableHamiltonian(None, V, mass=m)
    q0, p0 = kepler_state(3)
    before = system.energy(q0, p0)
    system.float().double()
    assert system.kinetic.mass is m and torch.equal(system.energy(q0, p0), before)
    assert not system.state_dict()
    w = torch.nn.Parameter(torch.tensor([1.5, 0.5], dtype=torch.float64))
    learned = tgi.SeparableHamiltonian(None, V, mass=w)
    assert list(learned.parameters()) == [] and not learned.state_dict()
    grown = torch.tensor(1.3, requires_grad=True) * torch.ones(2, dtype=torch.float64)  # a graph's m
    twin = copy.deepcopy(tgi.SeparableHamiltonian(None, V, mass=grown))
    assert twin.kinetic.mass is grown
    q, _ = tgi.rollout(twin, q0, p0, h=0.01, steps=5)
    assert q.requires_grad


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


# -- grad mode without a graph, and states written straight into the output -------------------

def closed_form_kepler():
    return tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), V, kinetic_grad=lambda p: p,
                                    potential_grad=lambda q: q / q.norm(dim=-1, keepdim=True) ** 3)


SYSTEMS = {"closed form": closed_form_kepler,
           "energies": lambda: tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), V),
           "mass=1": lambda: tgi.SeparableHamiltonian(None, V, mass=1.0),
           "non-separable": lambda: tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1) + V(q))}


@pytest.mark.parametrize("system", SYSTEMS)
@pytest.mark.parametrize("method", ["verlet", "symplectic_euler", "yoshida4", "implicit_midpoint"])
@pytest.mark.parametrize("save_every", [1, 3, 7])
def test_grad_mode_without_a_graph_gives_the_no_grad_numbers(system, method, save_every):
    """Grad mode on, nothing requires grad: the preallocated path, outputs equal to no_grad's
    bit for bit and without a graph; no_grad's direct writes (bound splittings) equal the
    step-by-step copy path bit for bit (symplectic_euler ends with a drift: p is copied)."""
    sys_ = SYSTEMS[system]()
    q0, p0 = kepler_state(4)
    kw = dict(h=0.01, steps=20, method=method, save_every=save_every)
    with torch.no_grad():
        a = tgi.rollout(sys_, q0, p0, **kw)
        integrator = tgi.integrators.get_method(method)
        step = integrator.bind(sys_)
        plain = lambda *args: step(*args)  # noqa: E731 — a bare step function: a step per call, copied
        ref = run_loop(plain, q0, p0, system=sys_, h=0.01, steps=20, t0=0.0,
                       save_every=save_every, check_every=64)
    b = tgi.rollout(sys_, q0, p0, **kw)
    assert a[0].shape == (n_saved(20, save_every), 4, 2)   # the final state always kept
    for x, y, z in zip(a, b, ref):
        assert torch.equal(x, y) and torch.equal(x, z)
        assert not y.requires_grad


@pytest.mark.parametrize("method", ["verlet", "symplectic_euler"])
def test_a_captured_tensor_that_requires_grad_still_gets_its_gradient(method):
    """Nothing the caller passes requires grad, but the force uses w: from the first state that
    carries a graph on, the outputs keep it; the gradient equals the one of a rollout that
    tracks from the start (q0 requiring grad)."""
    q0, p0 = kepler_state(3)
    w = torch.tensor(1.2, requires_grad=True)
    system = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: -w / q.norm(dim=-1))
    grads = []
    for start in (q0, q0.clone().requires_grad_()):
        q, p = tgi.rollout(system, start, p0, h=0.01, steps=12, save_every=2, method=method)
        assert q.requires_grad
        grads.append(torch.autograd.grad((q ** 2).sum() + p.sum(), w)[0])
    assert torch.equal(grads[0], grads[1])


def test_a_dependence_that_appears_late_switches_to_the_graph_there():
    """A time-dependent force that reads w only from t = 0.05 on: the first states are
    constants in the buffer, the later ones keep their graph; gradient as when tracking from
    the start."""
    q0, p0 = kepler_state(3)
    w = torch.tensor(0.7, requires_grad=True)
    system = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1),
                                      lambda q, t: -(w if t >= 0.05 else 1.0) / q.norm(dim=-1))
    outs = []
    for start in (q0, q0.clone().requires_grad_()):
        q, p = tgi.rollout(system, start, p0, h=0.01, steps=12)
        outs.append((q, p, torch.autograd.grad((q ** 2).sum() + p.sum(), w)[0]))
    (qa, pa, ga), (qb, pb, gb) = outs
    assert torch.equal(qa, qb.detach()) and torch.equal(pa, pb.detach())
    assert torch.equal(ga, gb) and float(ga) != 0.0


def test_compiled_rollout_in_grad_mode_without_a_graph_runs_the_no_grad_blocks(save_every=1):
    """compile=True under grad mode, nothing requiring grad: the no_grad rollout's compiled
    blocks (the same graphs, so the same numbers bit for bit), outputs without a graph."""
    import warnings

    system = closed_form_kepler()
    q0, p0 = kepler_state(4)
    kw = dict(h=0.01, steps=32, save_every=save_every, compile=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="compile=True")   # no fallback to eager
        with torch.no_grad():
            a = tgi.rollout(system, q0, p0, **kw)
        b = tgi.rollout(system, q0, p0, **kw)
    for x, y in zip(a, b):
        assert torch.equal(x, y) and not y.requires_grad
    from torchgeo_int import _compile
    assert not _compile.needs_graph(tgi.METHODS["verlet"], system, q0, p0, 0.0, 0.01)
    assert _compile.needs_graph(tgi.METHODS["verlet"], system, q0.clone().requires_grad_(), p0, 0.0, 0.01)
    w = torch.tensor(1.0, requires_grad=True)
    learned = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: -w / q.norm(dim=-1))
    assert _compile.needs_graph(tgi.METHODS["verlet"], learned, q0, p0, 0.0, 0.01)


@pytest.mark.parametrize("method", ["verlet", "symplectic_euler_adjoint", "yoshida4"])
def test_odeint_explicit_separable_func_keeps_the_users_shapes_and_numbers(method):
    """An explicit splitting of a separable func steps (q, p) in the user's shapes (no reshapes
    around every call): the same numbers as the flat tensor state, bit for bit, and as
    rollout of the same field."""
    q0, p0 = kepler_state(4)
    shapes = []

    def func(t, y):
        q, p = y
        shapes.append((tuple(q.shape), tuple(p.shape)))
        return p, -q / q.norm(dim=-1, keepdim=True) ** 3

    def flat(t, y):
        q, p = y[..., :2], y[..., 2:]
        return torch.cat([p, -q / q.norm(dim=-1, keepdim=True) ** 3], -1)

    t = torch.linspace(0.0, 0.2, 5)
    opts = dict(separable=True, step_size=0.01)
    q, p = tgi.odeint(func, (q0, p0), t, method=method, options=opts)
    y = tgi.odeint(flat, torch.cat([q0, p0], -1), t, method=method, options=opts)
    assert torch.equal(q, y[..., :2]) and torch.equal(p, y[..., 2:])
    assert set(shapes) == {((4, 2), (4, 2))}
    system = tgi.VectorFieldSystem(lambda t, q, p: func(t, (q, p)), separable=True)
    qr, pr = tgi.rollout(system, q0, p0, h=0.01, steps=20, method=method, save_every=5)
    assert torch.equal(q, qr) and torch.equal(p, pr)
