"""The drop-in odeint: torchdiffeq's methods delegated unchanged, geometric methods equal to
rollouts, exact landing on t, invariants, gradients, options and errors."""
import importlib
import math

import pytest
import scipy.linalg
import torch
import torchdiffeq

import torchgeo_int as tgi
from problems import kepler, kepler_energy, kepler_initial
from torchgeo_int.integrators.first_order import FIRST_ORDER_METHODS, FirstOrderIntegrator
from torchgeo_int._odeint import GEOMETRIC_METHODS, TORCHDIFFEQ_METHODS, odeint, odeint_adjoint


# -- torchdiffeq's test problems (re-written from its tests/problems.py) -----------------------
class Constant(torch.nn.Module):
    """ẏ = a + (y − (at + b))⁵, exact y = at + b."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(0.2))
        self.b = torch.nn.Parameter(torch.tensor(3.0))

    def forward(self, t, y):
        return self.a + (y - (self.a * t + self.b)) ** 5

    def exact(self, t):
        return (self.a * t + self.b).detach()


class Linear(torch.nn.Module):
    """ẏ = Ay with A = 2U − (U + Uᵀ) (skew), y(0) = 1, exact expm(At)·1."""

    def __init__(self, dim=10):
        super().__init__()
        U = torch.randn(dim, dim) * 0.1
        self.A = torch.nn.Parameter(2 * U - (U + U.T))

    def forward(self, t, y):
        return (self.A @ y.reshape(-1, 1)).reshape(-1)

    def exact(self, t):
        A = self.A.detach().numpy()
        return torch.stack([torch.tensor(scipy.linalg.expm(A * float(s)) @ torch.ones(len(A)).numpy())
                            for s in t])


class Sine(torch.nn.Module):
    """ẏ = 2y/t + t⁴ sin 2t − t² + 4t³ (t ≥ 1)."""

    def forward(self, t, y):
        return 2 * y / t + t ** 4 * torch.sin(2 * t) - t ** 2 + 4 * t ** 3

    def exact(self, t):
        return (-0.5 * t ** 4 * torch.cos(2 * t) + 0.5 * t ** 3 * torch.sin(2 * t)
                + 0.25 * t ** 2 * torch.cos(2 * t) - t ** 3 + 2 * t ** 4 + (math.pi - 0.25) * t ** 2)


class Exp(torch.nn.Module):
    """ẏ = λy, exact y = e^{λ(t − 1)} from t = 1."""

    def __init__(self):
        super().__init__()
        self.lam = torch.nn.Parameter(torch.tensor(-0.3))

    def forward(self, t, y):
        return self.lam * y

    def exact(self, t):
        return torch.exp(self.lam.detach() * (t - 1)).reshape(-1, 1) * torch.ones(1, 3)


PROBLEMS = {"constant": Constant, "linear": Linear, "sine": Sine, "exp": Exp}


def problem(name, reverse=False, npts=10):
    f = PROBLEMS[name]()
    t = torch.linspace(1.0, 8.0, npts)
    sol = f.exact(t)
    if reverse:
        t, sol = t.flip(0), sol.flip(0)
    return f, sol[0].clone(), t


# -- delegated methods ------------------------------------------------------------------------------
def test_torchdiffeq_method_list_is_torchdiffeq_own():
    from torchdiffeq._impl.odeint import SOLVERS

    assert set(TORCHDIFFEQ_METHODS) == set(SOLVERS) - set(GEOMETRIC_METHODS)
    assert {"dopri5", "rk4", "euler", "midpoint", "dopri8", "bosh3", "fehlberg2", "adaptive_heun",
            "heun3", "explicit_adams", "implicit_adams", "fixed_adams", "scipy_solver"} <= set(SOLVERS)
    assert not set(TORCHDIFFEQ_METHODS) & set(GEOMETRIC_METHODS)


def test_geometric_names_stay_ours_with_a_torchdiffeq_that_has_them(monkeypatch):
    """torchdiffeq's master branch adds implicit_midpoint / implicit_euler (Broyden over the whole
    batch): with such a SOLVERS those names still run ours, and its new names are delegated."""
    from torchdiffeq._impl.odeint import SOLVERS

    mod = importlib.import_module("torchgeo_int._odeint.methods")   # where the names live
    master = list(SOLVERS) + ["implicit_euler", "implicit_midpoint", "gl4", "trapezoid"]
    names = mod.delegated_names(master)
    assert {"gl4", "trapezoid"} <= set(names) and not set(names) & set(GEOMETRIC_METHODS)
    monkeypatch.setattr(mod, "TORCHDIFFEQ_METHODS", names)

    def not_torchdiffeq(*args, **kwargs):
        raise AssertionError("a geometric name was delegated to torchdiffeq")

    monkeypatch.setattr(torchdiffeq, "odeint", not_torchdiffeq)
    y0 = torch.tensor([[1.0, 0.0], [0.5, 0.2]], dtype=torch.float64)
    t = torch.linspace(0.0, 1.0, 5, dtype=torch.float64)
    skew = lambda t, y: torch.stack([y[..., 1], -y[..., 0]], -1)          # noqa: E731
    for method in ("implicit_midpoint", "implicit_euler"):
        ys = odeint(skew, y0, t, method=method, options=dict(step_size=0.05))
        assert ys.shape == (5, 2, 2) and torch.isfinite(ys).all()
    ys = odeint(skew, y0, t, method="implicit_midpoint", rtol=1e-12, atol=1e-12,
                options=dict(step_size=0.05))
    assert torch.allclose(ys.norm(dim=-1), y0.norm(dim=-1).expand(5, 2), atol=1e-11)  # the midpoint rule keeps |y|


@pytest.mark.parametrize("method", [None] + list(TORCHDIFFEQ_METHODS))
def test_delegated_methods_equal_torchdiffeq(method):
    """Bitwise the same as torchdiffeq on its own problems, forward and reversed t, tensor and
    tuple states; and accurate (so the comparison is not between two wrong answers)."""
    # Default tolerances for the default method; looser ones (passed through, and cheap for the
    # low-order adaptive methods) for the others.
    tol = {} if method is None else dict(rtol=1e-4, atol=1e-6)
    if method == "adaptive_heun":  # order 2: thousands of steps at tight tolerances
        tol = dict(rtol=1e-3, atol=1e-5)
    for name in PROBLEMS:
        for reverse in (False, True):
            f, y0, t = problem(name, reverse)
            with torch.no_grad():
                ours = odeint(f, y0, t, method=method, **tol)
                theirs = torchdiffeq.odeint(f, y0, t, method=method, **tol)
                assert torch.equal(ours, theirs), (name, reverse)
                pair = (y0, y0.clone())
                tf = lambda t, y: (f(t, y[0]), f(t, y[1]))  # noqa: E731
                ours_t = odeint(tf, pair, t, method=method, **tol)
                theirs_t = torchdiffeq.odeint(tf, pair, t, method=method, **tol)
            assert isinstance(ours_t, tuple) and len(ours_t) == 2
            assert all(torch.equal(a, b) for a, b in zip(ours_t, theirs_t))
            if method is None:
                assert (ours - f.exact(t)).abs().max() < 1e-4 * (1 + f.exact(t).abs().max())


@pytest.mark.parametrize("method", ["dopri5", "rk4"])
def test_delegated_gradients_and_options_equal_torchdiffeq(method):
    f, y0, t = problem("constant")
    y0 = y0.requires_grad_()
    opts = dict(step_size=0.1) if method == "rk4" else dict(first_step=0.01)
    g_ours = torch.autograd.grad(odeint(f, y0, t, method=method, options=opts).sum(),
                                 (y0, f.a, f.b))
    g_theirs = torch.autograd.grad(torchdiffeq.odeint(f, y0, t, method=method, options=opts).sum(),
                                   (y0, f.a, f.b))
    assert all(torch.equal(a, b) for a, b in zip(g_ours, g_theirs))
    a = odeint_adjoint(f, y0, t, method=method, options=opts)
    b = torchdiffeq.odeint_adjoint(f, y0, t, method=method, options=opts)
    assert torch.equal(a, b)
    ga = torch.autograd.grad(a.sum(), (y0, f.a))
    gb = torch.autograd.grad(b.sum(), (y0, f.a))
    assert all(torch.equal(x, y) for x, y in zip(ga, gb))


# -- geometric methods equal rollouts -----------------------------------------------------------------
def kepler_pair(t, s):
    q, p = s
    return p, -q / q.norm(dim=-1, keepdim=True) ** 3


def kepler_flat(t, y):
    q, p = y[..., :2], y[..., 2:]
    return torch.cat([p, -q / q.norm(dim=-1, keepdim=True) ** 3], -1)


@pytest.mark.parametrize("name", sorted(tgi.METHODS))
def test_partitioned_methods_equal_rollout(name):
    q0, p0 = kepler_initial(0.5)
    # Separable: y0 = (q0, p0), explicit kick/drift paths where the method has them.
    t = torch.linspace(0.0, 1.0, 6)
    with torch.no_grad():
        q, p = odeint(kepler_pair, (q0, p0), t, method=name, rtol=0, atol=0,
                      options=dict(step_size=0.05, separable=True))
        qr, pr = tgi.rollout(kepler(separable=True, analytic=True), q0, p0, h=0.05, steps=20,
                             method=name, save_every=4)
    assert q.shape == (6, 2) and p.shape == (6, 2)
    assert (q - qr).abs().max() < 1e-14 and (p - pr).abs().max() < 1e-14
    # Not separable: a flat tensor split in halves, the implicit generalized forms.
    t = torch.linspace(0.0, 0.3, 3)
    y0 = torch.cat([q0, p0])
    system = tgi.VectorFieldSystem(lambda t, q, p: kepler_pair(t, (q, p)))
    with torch.no_grad():
        y = odeint(kepler_flat, y0, t, method=name, rtol=0, atol=0, options=dict(step_size=0.05))
        qr, pr = tgi.rollout(system, q0, p0, h=0.05, steps=6, method=name, save_every=3)
    assert y.shape == (3, 4)
    assert (y - torch.cat([qr, pr], -1)).abs().max() < 1e-14


@pytest.mark.parametrize("name", sorted(FIRST_ORDER_METHODS))
def test_first_order_methods_equal_rollout(name):
    A = torch.tensor([[0.0, 1.0, -0.5], [-1.0, -0.1, 0.3], [0.5, -0.3, 0.0]])
    f = lambda t, y: y @ A.T + math.sin(t)  # noqa: E731
    y0 = torch.tensor([1.0, 0.2, -0.4])
    t = torch.linspace(0.0, 1.0, 5)
    with torch.no_grad():
        y = odeint(f, y0, t, method=name, rtol=0, atol=0, options=dict(step_size=0.05))
        yr = tgi.rollout(tgi.ODESystem(f), y0, h=0.05, steps=20, method=FIRST_ORDER_METHODS[name],
                         save_every=5)
    assert (y - yr).abs().max() < 1e-14


def test_integrator_instances_as_method():
    q0, p0 = kepler_initial(0.5)
    m = tgi.CotangentLiftIntegrator(tgi.AlphaMap(0.3))
    t = torch.linspace(0.0, 0.4, 3)
    with torch.no_grad():
        q, p = odeint(kepler_pair, (q0, p0), t, method=m, options=dict(step_size=0.05))
        qr, pr = tgi.rollout(kepler(separable=False, analytic=True), q0, p0, h=0.05, steps=8,
                             method=m, save_every=4)
    assert (q - qr).abs().max() < 1e-13 and (p - pr).abs().max() < 1e-13

    def normalize(x, v):
        return (x + v) / (x + v).norm(dim=-1, keepdim=True)

    sphere = FirstOrderIntegrator(tgi.RetractionMap(normalize, 0.5))
    x0 = torch.tensor([0.6, 0.0, 0.8])
    with torch.no_grad():
        x = odeint(lambda t, x: torch.linalg.cross(x, x / torch.tensor([1.0, 2.0, 3.0]), dim=-1),
                   x0, torch.linspace(0.0, 5.0, 11), method=sphere, options=dict(step_size=0.05))
    assert (x.norm(dim=-1) - 1).abs().max() < 1e-13 and (x[-1] - x0).abs().max() > 0.1


# -- the time grid --------------------------------------------------------------------------------------
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("case", ["verlet_pair", "implicit_midpoint_flat"])
def test_outputs_land_on_nonuniform_t(case, reverse):
    """Each interval takes ceil(|Δt|/h) equal steps: the outputs are rollouts of those counts."""
    t = torch.tensor([0.0, 0.13, 0.2, 0.55, 0.6, 0.6001])
    if reverse:
        t = 0.7 - t
    h = 0.05
    q0, p0 = kepler_initial(0.3)
    if case == "verlet_pair":
        kw = dict(method="verlet", options=dict(step_size=h, separable=True))
        system, method = kepler(separable=True, analytic=True), "verlet"
        with torch.no_grad():
            q, p = odeint(kepler_pair, (q0, p0), t, **kw)
    else:
        system, method = tgi.ODESystem(kepler_flat), FIRST_ORDER_METHODS["implicit_midpoint"]
        with torch.no_grad():
            y = odeint(kepler_flat, torch.cat([q0, p0]), t, method="implicit_midpoint", rtol=0,
                       atol=0, options=dict(step_size=h))
        q, p = y[:, :2], y[:, 2:]
    times = t.tolist()
    qi, pi = q0, p0
    for i in range(len(times) - 1):
        n = math.ceil(abs(times[i + 1] - times[i]) / h)
        hi = (times[i + 1] - times[i]) / n
        with torch.no_grad():
            if case == "verlet_pair":
                qs, ps = tgi.rollout(system, qi, pi, h=hi, steps=n, method=method, t0=times[i])
                qi, pi = qs[-1], ps[-1]
            else:
                ys = tgi.rollout(system, torch.cat([qi, pi]), h=hi, steps=n, method=method,
                                 t0=times[i])
                qi, pi = ys[-1, :2], ys[-1, 2:]
        assert (q[i + 1] - qi).abs().max() < 1e-14 and (p[i + 1] - pi).abs().max() < 1e-14


def test_step_counts_and_linspace_grids():
    calls = []

    def f(t, y):
        calls.append(float(t))
        return -y

    t = torch.tensor([0.0, 0.13, 0.2, 0.55])
    with torch.no_grad():
        odeint(f, torch.ones(2), t, method="explicit_euler", options=dict(step_size=0.05))
    assert len(calls) == 3 + 2 + 7  # ceil(0.13/0.05), ceil(0.07/0.05), ceil(0.35/0.05)
    assert calls[:3] == pytest.approx([0.0, 0.13 / 3, 0.26 / 3], abs=1e-15)
    # A linspace grid whose ratio |Δt|/h is an integer up to round-off takes that many steps.
    calls.clear()
    with torch.no_grad():
        y = odeint(f, torch.ones(2), torch.linspace(0.0, 1.0, 11), method="explicit_euler",
                   options=dict(step_size=0.01))
    assert len(calls) == 100
    assert torch.allclose(y[-1], torch.full((2,), 0.99 ** 100), rtol=1e-14, atol=0)
    # Without step_size: one step per interval.
    calls.clear()
    with torch.no_grad():
        odeint(f, torch.ones(2), t, method="explicit_euler")
    assert len(calls) == 3
    # len(t) == 1: just the initial state.
    y0 = torch.randn(3)
    out = odeint(f, y0, torch.tensor([0.5]), method="verlet", options=dict(split=1))
    assert out.shape == (1, 3) and torch.equal(out[0], y0)


# -- structure, gradients, HNN funcs ----------------------------------------------------------------
def test_implicit_midpoint_keeps_norm_where_rk4_does_not():
    U = torch.randn(5, 5)
    A = U - U.T
    f = lambda t, y: y @ A.T  # noqa: E731
    y0 = torch.randn(5)
    t = torch.linspace(0.0, 30.0, 7)
    with torch.no_grad():
        # 5 coordinates: the first-order form; (q, p) halves of a 4-vector: the partitioned one.
        y = odeint(f, y0, t, method="implicit_midpoint", rtol=1e-15, atol=1e-15,
                   options=dict(step_size=0.1))
        y_rk4 = odeint(f, y0, t, method="rk4", options=dict(step_size=0.1))
        B = A[:4, :4]
        z = odeint(lambda t, s: (s[0] @ B[:2, :2].T + s[1] @ B[:2, 2:].T,
                                 s[0] @ B[2:, :2].T + s[1] @ B[2:, 2:].T),
                   (y0[:2], y0[2:4]), t, method="implicit_midpoint", rtol=1e-15, atol=1e-15,
                   options=dict(step_size=0.1))
    assert (y.norm(dim=-1) - y0.norm()).abs().max() < 1e-11
    assert (y_rk4.norm(dim=-1) - y0.norm()).abs().max() > 1e-6
    zn = (z[0] ** 2).sum(-1) + (z[1] ** 2).sum(-1)
    assert (zn.sqrt() - y0[:4].norm()).abs().max() < 1e-11


@pytest.mark.parametrize("state", ["flat", "pair"])
def test_gradcheck_through_implicit_midpoint(state):
    t = torch.tensor([0.0, 0.3, 0.5])
    k = torch.tensor([0.8], requires_grad=True)

    def fpair(t, s, k):
        q, p = s
        return p * (1 + q ** 2), -k * torch.sin(q) - q * p ** 2

    if state == "flat":
        y0 = torch.tensor([0.4, -0.3, 0.2], requires_grad=True)  # odd: the first-order form

        def fn(y0, k):
            f = lambda t, y: torch.stack([y[1], -k[0] * torch.sin(y[0]) * y[2], y[0] - y[2]])  # noqa
            return odeint(f, y0, t, method="implicit_midpoint", options=dict(step_size=0.1))
        args = (y0, k)
    else:
        q0 = torch.tensor([0.4, -0.1], requires_grad=True)
        p0 = torch.tensor([0.3, 0.2], requires_grad=True)

        def fn(q0, p0, k):
            out = odeint(lambda t, s: fpair(t, s, k), (q0, p0), t, method="implicit_midpoint",
                         options=dict(step_size=0.1))
            return torch.cat(out, -1)
        args = (q0, p0, k)
    assert torch.autograd.gradcheck(fn, args)


class HNN(torch.nn.Module):
    """The func of torchdiffeq issue #154: it differentiates itself with autograd.grad."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def energy(self, x):
        return self.net(x)

    def forward(self, t, x):
        H = self.energy(x)
        dH = torch.autograd.grad(H, x, grad_outputs=torch.ones_like(H), create_graph=True)[0]
        return torch.cat([dH[..., 1:], -dH[..., :1]], -1)


@pytest.mark.parametrize("method", ["implicit_midpoint", "verlet", "yoshida4"])
def test_hnn_func_calling_autograd_grad(method):
    func = HNN()
    y0 = torch.tensor([[0.5, -0.2], [0.1, 0.7]], requires_grad=True)
    t = torch.tensor([0.0, 0.2, 0.4])
    y = odeint(func, y0, t, method=method, rtol=0, atol=0, options=dict(step_size=0.1,
                                                                        batch_dims=1))
    # (The last bias does not enter the field: its gradient is None both ways.)
    params = [y0, *func.parameters()]
    g = torch.autograd.grad((y ** 2).sum(), params, allow_unused=True)
    # The same through rollout with the energy as a tgi.Hamiltonian.
    system = tgi.Hamiltonian(lambda q, p: func.energy(torch.cat([q, p], -1)).squeeze(-1))
    qr, pr = tgi.rollout(system, y0[:, :1], y0[:, 1:], h=0.1, steps=4, method=method, save_every=2)
    yr = torch.cat([qr, pr], -1)
    assert (y - yr).abs().max() < 1e-12
    gr = torch.autograd.grad((yr ** 2).sum(), params, allow_unused=True)
    assert g[-1] is None and gr[-1] is None
    for a, b in zip(g[:-1], gr[:-1]):
        assert (a - b).abs().max() < 1e-10
    # options=dict(hamiltonian=H) gives the same values.
    yh = odeint(None, y0, t, method=method, rtol=0, atol=0,
                options=dict(step_size=0.1,
                             hamiltonian=lambda q, p: func.energy(torch.cat([q, p], -1)).squeeze(-1)))
    assert (yh - yr).abs().max() < 1e-12


def test_hnn_func_with_enable_grad_works_under_no_grad():
    """torchdiffeq's advice for issue #154 (enable_grad inside func) also runs without grad."""
    net = HNN()

    def func(t, x):
        with torch.enable_grad():
            x = x.clone().requires_grad_(True)
            H = net.energy(x)
            dH = torch.autograd.grad(H.sum(), x, create_graph=torch.is_grad_enabled())[0]
        return torch.cat([dH[..., 1:], -dH[..., :1]], -1)

    y0 = torch.tensor([0.5, -0.2])
    t = torch.tensor([0.0, 0.3])
    with torch.no_grad():
        y = odeint(func, y0, t, method="implicit_midpoint", options=dict(step_size=0.1))
    y_grad = odeint(func, y0, t, method="implicit_midpoint", options=dict(step_size=0.1))
    assert not y.requires_grad and (y - y_grad).abs().max() < 1e-12


# -- options ---------------------------------------------------------------------------------------------
def pendulum_flat(t, y):
    return torch.cat([y[..., 1:], -torch.sin(y[..., :1])], -1)


def test_options_batch_dims_separable_hamiltonian_solver():
    y0 = torch.tensor([[0.5, -0.2], [2.0, 0.7], [-1.0, 0.0]])
    t = torch.linspace(0.0, 1.0, 3)
    base = dict(step_size=0.1)
    run = lambda method, **o: odeint(pendulum_flat, y0, t, method=method, rtol=0, atol=0,  # noqa
                                     options={**base, **o})
    with torch.no_grad():
        for method in ("implicit_midpoint", "implicit_euler"):
            a = run(method)
            assert (a - run(method, batch_dims=1)).abs().max() < 1e-13
            assert (a - run(method, solver="newton")).abs().max() < 1e-13
            assert (a - run(method, solver="newton", batch_dims=1)).abs().max() < 1e-13
        # Verlet's generalized leapfrog on a separable field is Störmer–Verlet.
        v = run("verlet", separable=True)
        assert (v - run("verlet")).abs().max() < 1e-13
        H = lambda q, p: 0.5 * (p ** 2).sum(-1) - torch.cos(q).sum(-1)  # noqa: E731
        for separable in (True, False):
            yh = odeint(None, y0, t, method="verlet", rtol=0, atol=0,
                        options=dict(step_size=0.1, hamiltonian=H, separable=separable))
            assert (yh - v).abs().max() < 1e-13


def test_uneven_split_equals_tuple_state():
    """q ∈ R¹, p ∈ R²: options['split'] on a flat tensor equals y0 = (q0, p0)."""
    def pair(t, s):
        q, p = s
        return p[..., :1] + 0.5 * p[..., 1:] ** 2, torch.cat([-torch.sin(q), -2 * q], -1)

    def flat(t, y):
        dq, dp = pair(t, (y[..., :1], y[..., 1:]))
        return torch.cat([dq, dp], -1)

    y0 = torch.tensor([0.3, 0.1, -0.4])
    t = torch.linspace(0.0, 1.0, 4)
    with torch.no_grad():
        for method, opts in [("symplectic_euler", {}), ("verlet", dict(separable=True)),
                             ("yoshida4", {})]:
            y = odeint(flat, y0, t, method=method, options=dict(step_size=0.1, split=1, **opts))
            q, p = odeint(pair, (y0[:1], y0[1:]), t, method=method,
                          options=dict(step_size=0.1, **opts))
            assert y.shape == (4, 3) and q.shape == (4, 1) and p.shape == (4, 2)
            assert (y - torch.cat([q, p], -1)).abs().max() < 1e-15


def test_first_order_states_of_any_structure():
    """A tuple of differently shaped parts (flattened at the boundary) and a 0-d state."""
    def f(t, s):
        a, b = s
        return -b.sum(-2), a.unsqueeze(-2).expand_as(b) * 0.5

    s0 = (torch.tensor([1.0, -0.5]), torch.ones(3, 2))
    t = torch.linspace(0.0, 1.0, 6)
    with torch.no_grad():
        out = odeint(f, s0, t, method="implicit_midpoint", rtol=0, atol=0,
                     options=dict(step_size=0.05))
        flat = tgi.rollout(tgi.ODESystem(lambda t, x: torch.cat(
            [v.reshape(-1) for v in f(t, (x[:2], x[2:].reshape(3, 2)))])),
            torch.cat([s0[0], s0[1].reshape(-1)]), h=0.05, steps=20,
            method=FIRST_ORDER_METHODS["implicit_midpoint"], save_every=4)
    assert out[0].shape == (6, 2) and out[1].shape == (6, 3, 2)
    assert (torch.cat([out[0], out[1].reshape(6, -1)], -1) - flat).abs().max() < 1e-13
    y = odeint(lambda t, y: -y, torch.tensor(1.0), t, method="implicit_euler")
    assert y.shape == (6,) and torch.allclose(y[-1], torch.tensor(1.2 ** -5), rtol=1e-12)


def test_float32():
    q0, p0 = kepler_initial(0.5, dtype=torch.float32)
    t = torch.linspace(0.0, 3.0, 4, dtype=torch.float32)
    for method in ("verlet", "implicit_midpoint"):
        with torch.no_grad():
            q, p = odeint(kepler_pair, (q0, p0), t, method=method,
                          options=dict(step_size=0.01, separable=True))
        assert q.dtype == torch.float32 and p.dtype == torch.float32
        assert (kepler_energy(q, p) - kepler_energy(q0, p0)).abs().max() < 1e-3
    y = odeint(lambda t, y: -y, torch.ones(3, dtype=torch.float32), t, method="implicit_euler",
               options=dict(step_size=0.1))
    assert y.dtype == torch.float32
    assert torch.allclose(y[-1], torch.full((3,), 1.1 ** -30, dtype=torch.float32), rtol=1e-5)


# -- errors -------------------------------------------------------------------------------------------------
def test_unknown_method_lists_both_kinds():
    with pytest.raises(ValueError) as err:
        odeint(lambda t, y: -y, torch.ones(2), torch.linspace(0, 1, 3), method="leapfrog")
    msg = str(err.value)
    assert all(name in msg for name in TORCHDIFFEQ_METHODS + GEOMETRIC_METHODS)
    with pytest.raises(ValueError, match="odeint_adjoint"):
        odeint_adjoint(torch.nn.Linear(2, 2), torch.ones(2), torch.linspace(0, 1, 3), method="verlet")
    with pytest.raises(ValueError, match="unknown method"):
        odeint_adjoint(torch.nn.Linear(2, 2), torch.ones(2), torch.linspace(0, 1, 3), method="nope")


def test_bad_options_raise():
    f, y0, t = (lambda t, y: -y), torch.ones(4), torch.linspace(0, 1, 3)
    with pytest.raises(ValueError, match="unknown option"):
        odeint(f, y0, t, method="verlet", options=dict(stepsize=0.1))
    with pytest.raises(ValueError, match="partitioned methods only"):
        odeint(f, y0, t, method="implicit_euler", options=dict(separable=True))
    with pytest.raises(ValueError, match="step_size"):
        odeint(f, y0, t, method="verlet", options=dict(step_size=-0.1))
    with pytest.raises(ValueError, match="split"):
        odeint(f, y0, t, method="verlet", options=dict(split=4))
    with pytest.raises(ValueError, match="odd"):
        odeint(f, torch.ones(3), t, method="verlet")
    with pytest.raises(ValueError, match="tuple of 3"):
        odeint(lambda t, s: s, (y0, y0, y0), t, method="verlet")
    with pytest.raises(ValueError, match="solver"):
        odeint(f, y0, t, method="implicit_midpoint", options=dict(solver="lu"))
    with pytest.raises(ValueError, match="batch_dims"):
        odeint(f, y0, t, method="implicit_midpoint", options=dict(batch_dims=2))
    with pytest.raises(ValueError, match="func=None"):
        odeint(f, y0, t, method="verlet", options=dict(hamiltonian=lambda q, p: (q * p).sum()))
    with pytest.raises(ValueError, match="event_fn"):   # (an event search needs len(t) == 2)
        odeint(f, y0, t, method="verlet", event_fn=lambda t, y: y.sum())
    with pytest.raises(ValueError, match="shape"):
        odeint(lambda t, y: y[:2], y0, t, method="implicit_midpoint")
    with pytest.raises(ValueError, match="rtol"):
        odeint(f, y0, t, method="implicit_midpoint", rtol=-1.0)


def test_bad_t_and_y0_raise():
    f, y0 = (lambda t, y: -y), torch.ones(4)
    with pytest.raises(ValueError, match="one-dimensional"):
        odeint(f, y0, torch.zeros(2, 3), method="verlet")
    with pytest.raises(ValueError, match="strictly increasing or strictly decreasing"):
        odeint(f, y0, torch.tensor([0.0, 0.5, 0.3]), method="verlet")
    with pytest.raises(ValueError, match="strictly"):
        odeint(f, y0, torch.tensor([0.0, 0.5, 0.5]), method="implicit_midpoint")
    with pytest.raises(ValueError, match="NaN"):
        odeint(f, y0, torch.tensor([0.0, float("nan")]), method="verlet")
    with pytest.raises(TypeError, match="t must be"):
        odeint(f, y0, [0.0, 1.0], method="verlet")
    with pytest.raises(ValueError, match="t.detach"):   # t's gradient needs backprop
        odeint(f, y0, torch.tensor([0.0, 1.0], requires_grad=True), method="verlet",
               options=dict(grad="checkpoint"))
    with pytest.raises(ValueError, match="NaN or inf"):
        odeint(f, torch.tensor([1.0, float("inf")]), torch.tensor([0.0, 1.0]), method="verlet")
    with pytest.raises(TypeError, match="floating"):
        odeint(f, torch.ones(4, dtype=torch.int64), torch.tensor([0.0, 1.0]), method="verlet")


def test_nonconvergence_and_blow_up_are_loud():
    f = lambda t, y: -300.0 * y  # noqa: E731
    t = torch.tensor([0.0, 0.5])
    with pytest.raises(tgi.ConvergenceError, match="integrator step 0"):
        odeint(f, torch.ones(2), t, method="implicit_euler", options=dict(step_size=0.1))
    y = odeint(f, torch.ones(2), t, method="implicit_euler",
               options=dict(step_size=0.1, solver="newton"))
    assert torch.allclose(y[-1], torch.full((2,), 31.0 ** -5), rtol=1e-12, atol=0)
    with pytest.raises(FloatingPointError, match="non-finite"):
        odeint(lambda t, y: y ** 2, torch.ones(2), torch.tensor([0.0, 3.0]),
               method="explicit_euler", options=dict(step_size=0.1))


def test_theta_method_by_name():
    """method='theta' with options theta=θ is eq. (1) with AlphaMap(θ): one step of the θ-formula."""
    A = torch.tensor([[0.0, 1.0], [-2.0, -0.3]])
    y0 = torch.tensor([1.0, 0.5])
    t = torch.tensor([0.0, 0.1])
    for th in (0.0, 0.3, 1.0):
        y1 = tgi.odeint(lambda t, y: y @ A.T, y0, t, method="theta", options=dict(theta=th), rtol=0, atol=0)[-1]
        # (y1 − y0)/h = A((1−θ)y0 + θy1)  ⇔  (I − θhA) y1 = (I + (1−θ)hA) y0
        h, I = 0.1, torch.eye(2)
        exact = torch.linalg.solve(I - th * h * A, (I + (1 - th) * h * A) @ y0)
        assert torch.allclose(y1, exact, atol=1e-13)
    with pytest.raises(ValueError, match="theta"):
        tgi.odeint(lambda t, y: y, y0, t, method="theta")
