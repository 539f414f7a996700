"""The declared protocols and the one registry (issue 18): equality by value of integrators and
maps, the public map protocol, one SolveOptions, every registered name reaching rollout/odeint."""
import math

import pytest
import torch

import torchgeo_int as tgi
from torchgeo_int.integrators.registry import FAMILIES, family_of, get_method
from torchgeo_int.lagrangian import Lagrangian, SecondOrderSystem
from torchgeo_int.manifolds.systems import FreeRigidBody
from torchgeo_int.solvers import SolveOptions

F64 = torch.float64


def linear(x, v):
    return x + v


# -- declared order/symmetry: equality by value ----------------------------------------------------
def test_composition_of_a_retraction_map_declares_the_alpha_map_order():
    """The bug of issue 18: a non-α map was compared by identity, so its adjoint (a new object)
    was 'another method' and the triple jump over it declared order 2, not symmetric."""
    gammas = tgi.TABLES["yoshida4"].gammas
    retr = tgi.Composition(tgi.CotangentLiftIntegrator(tgi.RetractionMap(linear, alpha=0.5)), gammas)
    alpha = tgi.Composition(tgi.CotangentLiftIntegrator(tgi.AlphaMap(0.5)), gammas)
    assert (retr.order, retr.symmetric) == (alpha.order, alpha.symmetric) == (4, True)
    # α ≠ ½ is not symmetric, whatever the retraction: no order raise
    skew = tgi.Composition(tgi.CotangentLiftIntegrator(tgi.RetractionMap(linear, alpha=0.3)), gammas)
    assert (skew.order, skew.symmetric) == (1, False)
    # the order it declares is the order it has: error ratio 2^4 on halving h (harmonic oscillator)
    H = tgi.Hamiltonian(lambda q, p: 0.5 * (q * q + p * p).sum(-1))
    q0, p0 = torch.tensor([[1.0]], dtype=F64), torch.tensor([[0.0]], dtype=F64)
    errs = []
    for n in (8, 16):
        q, p = tgi.rollout(H, q0, p0, h=1.0 / n, steps=n, method=retr)
        errs.append(math.hypot(float(q[-1, 0, 0]) - math.cos(1.0), float(p[-1, 0, 0]) + math.sin(1.0)))
    assert 2 ** 3.7 < errs[0] / errs[1] < 2 ** 4.3


def test_integrators_and_maps_compare_by_value():
    mid = tgi.CotangentLiftIntegrator(tgi.MidpointMap())
    assert mid == tgi.METHODS["implicit_midpoint"] and hash(mid) == hash(tgi.METHODS["implicit_midpoint"])
    assert tgi.METHODS["verlet"] == tgi.METHODS["verlet"].adjoint()
    assert tgi.METHODS["symplectic_euler"] != tgi.METHODS["symplectic_euler_adjoint"]
    assert tgi.METHODS["symplectic_euler"].adjoint() == tgi.METHODS["symplectic_euler_adjoint"]
    # solver settings are not the method: the same map of states
    assert tgi.CotangentLiftIntegrator(tgi.MidpointMap(), solver="newton", tol=1e-6) == mid
    r = tgi.RetractionMap(linear, 0.5)
    assert r.key() == r.adjoint().key() == tgi.RetractionMap(linear, 0.5).key()
    assert r.key() != tgi.RetractionMap(lambda x, v: x + v, 0.5).key()   # functions: by identity

    class Warped(tgi.RetractionMap):   # another map under the same retraction and α
        def _forward(self, x, v):
            y0, y1 = super()._forward(x, v)
            return y0, y1 + 0.1 * v ** 2

    assert Warped(linear, 0.5).key() != r.key()
    assert tgi.CotangentLiftIntegrator(Warped(linear, 0.5)) != tgi.CotangentLiftIntegrator(r)


def test_map_protocol_is_public():
    """What integrators need of a map: base_fraction, has_closed_inverse, unchecked forward/inverse."""
    x, v = torch.tensor([[0.3, -0.2]], dtype=F64), torch.tensor([[0.1, 0.4]], dtype=F64)
    cases = [(tgi.AlphaMap(0.3), 0.3, True), (tgi.RetractionMap(linear, 0.3), 0.3, False),
             (tgi.RetractionMap(linear, 0.3, inverse=tgi.AlphaMap(0.3).inverse), 0.3, True),
             (tgi.RetractionMap(linear, 0.3).adjoint(), 0.7, False),
             (tgi.AdjointMap(tgi.AlphaMap(0.2)), 0.8, True)]
    for R, frac, closed in cases:
        assert R.base_fraction == pytest.approx(frac) and R.has_closed_inverse == closed
        y = R.forward_unchecked(x, v)
        assert all(torch.equal(a, b) for a, b in zip(y, R(x, v)))
        back = R.inverse_unchecked(*y)
        assert torch.allclose(back[0], x) and torch.allclose(back[1], v)
    lift = tgi.CotangentLift(tgi.AlphaMap(0.25))
    assert lift.base_fraction == 0.25 and lift.has_closed_inverse
    assert lift.key() == tgi.CotangentLift(tgi.AlphaMap(0.25)).key()


def test_integrator_declares_its_protocol():
    for family, table in FAMILIES.items():
        for m in table.values():
            assert isinstance(m.first_order, bool) and m.first_order == (family == "first_order")
            assert m.check_state is None or callable(m.check_state)
            assert m.options is None or isinstance(m.options, SolveOptions)
    assert tgi.METHODS["verlet"].options is None or tgi.METHODS["verlet"].solver == "fixed_point"
    class Own(tgi.Integrator):   # a user's method keeps whatever attributes it sets
        def __init__(self):
            self.solver, self.tol = "broyden", 1e-3

    assert (Own().solver, Own().tol, Own().options) == ("broyden", 1e-3, None)
    m = tgi.METHODS["implicit_midpoint_yoshida4"].with_options(solver="newton", tol=1e-12)
    assert all(s.solver == "newton" and s.tol == 1e-12 for s, _ in m.stages())
    assert m == tgi.METHODS["implicit_midpoint_yoshida4"] and m.name == "implicit_midpoint_yoshida4"


# -- one set of solver options -----------------------------------------------------------------------
def test_solve_options_solve_both_forms_with_both_solvers():
    a = torch.tensor([[0.5], [-0.25]], dtype=F64, requires_grad=True)

    def G(z, a):           # z = a cos z: fixed-point form
        return a * torch.cos(z)

    def F(z, a):           # the same equation as a residual
        return z - a * torch.cos(z)

    sols = []
    for solver in ("fixed_point", "newton"):
        opts = SolveOptions(solver, tol=1e-13)
        for z in (opts.solve(G, torch.zeros_like(a), (a,)), opts.root(F, torch.zeros_like(a), (a,))):
            assert torch.allclose(z, a * torch.cos(z), atol=1e-12, rtol=0)
            sols.append(z)
    # implicit-function-theorem gradients: dz/da = cos z / (1 + a sin z)
    z = sols[-1]
    (g,) = torch.autograd.grad(z.sum(), a)
    assert torch.allclose(g, (torch.cos(z) / (1 + a * torch.sin(z))).detach(), atol=1e-10)
    with pytest.raises(ValueError, match="solver must be one of"):
        SolveOptions("bisection")
    with pytest.raises(ValueError, match="max_iter"):
        SolveOptions(max_iter=0)
    with pytest.raises(ValueError, match="backward"):
        SolveOptions(backward="adjoint")
    with pytest.raises(ValueError, match="tol"):
        SolveOptions(tol=-1.0)


def test_every_implicit_integrator_takes_its_options_from_one_place():
    for table in FAMILIES.values():
        for m in table.values():
            for s, _ in m.stages():
                if s.options is not None:
                    assert (s.solver, s.tol, s.max_iter, s.backward) == (
                        s.options.solver, s.options.tol, s.options.max_iter, s.options.backward)
                    assert not hasattr(s, "_options")


# -- one registry --------------------------------------------------------------------------------------
def _state(family):
    gen = torch.Generator().manual_seed(0)
    q = 0.3 * torch.randn(2, 2, generator=gen, dtype=F64)
    p = 0.3 * torch.randn(2, 2, generator=gen, dtype=F64)
    if family == "hamiltonian":
        return tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1) + (1 - torch.cos(q)).sum(-1)), q, p
    if family == "splitting":
        return tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1),
                                        lambda q: (1 - torch.cos(q)).sum(-1)), q, p
    if family == "first_order":
        return tgi.ODESystem(lambda t, x: torch.stack([x[..., 1], -torch.sin(x[..., 0])], -1)), q, None
    if family == "sode":
        return SecondOrderSystem.from_potential(lambda q: (1 - torch.cos(q)).sum(-1)), q, p
    if family == "variational":
        return Lagrangian.mechanical(lambda q: (1 - torch.cos(q)).sum(-1), torch.eye(2, dtype=F64)), q, p
    if family == "forced":   # a damped pendulum over a Lagrangian
        L = Lagrangian.mechanical(lambda q: (1 - torch.cos(q)).sum(-1), torch.eye(2, dtype=F64))
        return tgi.ForcedSystem(L, damping=0.1), q, p
    if family == "constrained":   # a point on the unit circle in a constant field
        from torchgeo_int.constraints import ConstrainedSystem
        th = torch.randn(2, generator=gen, dtype=F64)
        q = torch.stack([torch.sin(th), -torch.cos(th)], -1)
        p = 0.5 * torch.stack([torch.cos(th), torch.sin(th)], -1)
        L = Lagrangian.mechanical(lambda q: q[..., 1], torch.eye(2, dtype=F64))
        return ConstrainedSystem(L, lambda q: 0.5 * ((q * q).sum(-1, keepdim=True) - 1.0)), q, p
    if family == "lie":
        system = FreeRigidBody(torch.tensor([1.0, 2.0, 3.5], dtype=F64))
        return system, system.group.random(2, generator=gen, dtype=F64), torch.randn(2, 3, generator=gen, dtype=F64)
    raise AssertionError(f"a new family {family!r}: give it a state here")


@pytest.mark.parametrize("family", ["hamiltonian", "first_order", "sode", "variational", "lie",
                                    "splitting", "forced", "constrained"])
def test_every_registered_name_reaches_rollout_and_odeint(family):
    assert set(FAMILIES) == {"hamiltonian", "first_order", "sode", "variational", "lie", "splitting",
                             "forced", "constrained"}
    system, q0, p0 = _state(family)
    for name, m in FAMILIES[family].items():
        assert get_method(name, first_order=family == "first_order") is m
        out = tgi.rollout(system, q0, p0, h=0.05, steps=2, method=name)
        out = out if isinstance(out, tuple) else (out,)
        assert all(o.shape == (3, *x.shape) and torch.isfinite(o).all()
                   for o, x in zip(out, (q0, p0)) if x is not None), name
        # odeint: (q, p) of a vector field, or x of a first-order one; the other families'
        # states are not a flat y, and odeint says where they go
        t = torch.linspace(0.0, 0.1, 3, dtype=F64)
        if family == "hamiltonian":
            y = tgi.odeint(lambda t, y: torch.cat([y[..., 2:], -torch.sin(y[..., :2])], -1),
                           torch.cat([q0, p0], -1), t, method=name)
        elif family == "splitting":   # explicit splittings of a separable field
            y = tgi.odeint(lambda t, y: torch.cat([y[..., 2:], -torch.sin(y[..., :2])], -1),
                           torch.cat([q0, p0], -1), t, method=name, options=dict(separable=True))
        elif family == "first_order":
            y = tgi.odeint(lambda t, x: torch.stack([x[..., 1], -torch.sin(x[..., 0])], -1),
                           q0, t, method=name)
        else:
            with pytest.raises(ValueError, match=f"{family}.*tgi.rollout"):
                tgi.odeint(lambda t, y: -y, q0, t, method=name)
            continue
        assert y.shape == (3, *y.shape[1:]) and torch.isfinite(y).all(), name
        assert family_of(name) in ("hamiltonian", "first_order", "splitting")


def test_one_error_lists_every_family():
    with pytest.raises(ValueError) as err:
        tgi.get_method("no_such_method")
    msg = str(err.value)
    for family, table in FAMILIES.items():
        assert family in msg and all(name in msg for name in table)


# -- one module per extension ------------------------------------------------------------------------
def test_a_new_table_map_and_gradient_mode_each_touch_one_module(monkeypatch):
    """README 'Architecture': a composition table is an entry of integrators/composition.TABLES,
    a map a DiscretizationMap subclass (maps.py), a gradient mode a GradMode (gradients.py);
    everything downstream takes them as they are."""
    from torchgeo_int.gradients import Backprop, GradMode
    from torchgeo_int.manifolds.integrators import lie_method

    # a table: the triple jump again under a new name (TABLES is where lie_method looks too)
    c = 2.0 ** (1 / 3)
    g1 = 1 / (2 - c)
    table = tgi.CoefficientTable("triple_jump", 4, (g1, 1 - 2 * g1, g1), "Yoshida (1990)")
    monkeypatch.setitem(tgi.TABLES, table.name, table)
    assert tgi.Composition(tgi.METHODS["verlet"], table.gammas).order == 4
    assert lie_method("triple_jump").order == 4

    # a map: only _forward; the generic inverse, lifts and integrators follow
    class Cubic(tgi.DiscretizationMap):
        def _forward(self, x, v):
            return x - 0.5 * v - 0.01 * v ** 3, x + 0.5 * v + 0.01 * v ** 3

    m = tgi.CotangentLiftIntegrator(Cubic())
    H = tgi.Hamiltonian(lambda q, p: 0.5 * (q * q + p * p).sum(-1))
    q0, p0 = torch.tensor([[1.0]], dtype=F64), torch.tensor([[0.0]], dtype=F64)
    q, p = tgi.rollout(H, q0, p0, h=0.1, steps=10, method=m)
    assert torch.isfinite(q).all() and abs(float(q[-1, 0, 0]) - math.cos(1.0)) < 1e-2

    # a gradient mode: a GradMode subclass, passed as grad=
    class Counting(GradMode):
        name = "counting"

        def __init__(self):
            self.calls = 0

        def run(self, integrator, step, q0, p0, **kw):
            def counted(*args):
                self.calls += 1
                return step(*args)
            return Backprop().run(integrator, counted, q0, p0, **kw)

    mode = Counting()
    q2, p2 = tgi.rollout(H, q0, p0, h=0.1, steps=10, method="implicit_midpoint", grad=mode)
    q1, p1 = tgi.rollout(H, q0, p0, h=0.1, steps=10, method="implicit_midpoint")
    assert mode.calls == 10 and torch.equal(q1, q2) and torch.equal(p1, p2)


def test_a_new_lie_group_touches_one_module():
    """README 'Architecture': a Lie group is one LieGroup subclass (with its τ); the public Lie
    integrator steps it unchanged.  The translations (Rⁿ, +), defined here only: every τ is the
    identity (exp and cay agree on an abelian group), Ad* and ad* are trivial, so the Lie
    midpoint rule on T*Rⁿ is the implicit midpoint rule of the canonical (q, p) = (g, μ)."""
    from torchgeo_int.manifolds.lie import LieGroup, RnTau
    from torchgeo_int.manifolds.systems import LieHamiltonian

    class Translations(LieGroup):
        name = "R^2"
        dim = 2
        point_shape = (2,)

        def __init__(self):
            self.taus = {"exp": RnTau(), "cayley": RnTau()}

        def identity(self, *batch, dtype=None, device=None):
            return torch.zeros(*batch, 2, dtype=dtype, device=device)

        def compose(self, a, b):
            return a + b

        def inverse(self, g):
            return -g

        def coad_inv(self, g, mu):
            return mu

        coad = coad_inv

        def ad_star(self, xi, mu):
            return torch.zeros_like(mu)

        def left_grad(self, g, G):
            return G

        def right_tau(self, g, tau, xi):
            return g + tau.minus_identity(xi)

    def H(g, mu):
        return 0.5 * (mu * mu).sum(-1) + (1 - torch.cos(g)).sum(-1)

    system = LieHamiltonian(H, group=Translations())
    gen = torch.Generator().manual_seed(3)
    g0, mu0 = torch.randn(3, 2, generator=gen, dtype=F64), torch.randn(3, 2, generator=gen, dtype=F64)
    g, mu = tgi.rollout(system, g0, mu0, h=0.1, steps=20, method="lie_midpoint_cayley")
    q, p = tgi.rollout(tgi.Hamiltonian(H), g0, mu0, h=0.1, steps=20, method="implicit_midpoint")
    assert torch.allclose(g, q, atol=1e-10, rtol=0) and torch.allclose(mu, p, atol=1e-10, rtol=0)
    # and a composition table over it reaches its order: the Yoshida triple jump
    e = [float((tgi.rollout(system, g0, mu0, h=1.0 / n, steps=n, method="lie_yoshida4_exp")[0][-1]
                - tgi.rollout(system, g0, mu0, h=1.0 / 64, steps=64, method="lie_yoshida4_exp")[0][-1])
               .abs().max()) for n in (4, 8)]
    assert 2 ** 3.5 < e[0] / e[1] < 2 ** 4.5


# -- no private names across modules ---------------------------------------------------------------
def test_no_private_name_is_imported_across_modules():
    """A helper shared by two modules is public (documented) in its one home: no module of the
    package imports another's ``_name`` (private submodules such as ``_validate`` are fine, they
    are modules; ``from torch ...`` and other packages are not looked at)."""
    import ast
    import pathlib

    root = pathlib.Path(tgi.__file__).parent
    bad = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        pkg = path.parent
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level == 0 and not (node.module or "").startswith("torchgeo_int"):
                continue
            if node.level:
                base = pkg
                for _ in range(node.level - 1):
                    base = base.parent
                target = base.joinpath(*(node.module or "").split(".")) if node.module else base
            else:
                target = root.parent.joinpath(*node.module.split("."))
            for alias in node.names:
                name = alias.name
                if not name.startswith("_") or name.startswith("__"):
                    continue
                if (target / f"{name}.py").exists() or (target / name / "__init__.py").exists():
                    continue   # a private submodule, imported as a module
                bad.append(f"{path.relative_to(root)}:{node.lineno} imports {name} from "
                           f"{'.' * node.level}{node.module or ''}")
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


# -- identity caches: weakly keyed, never stale ------------------------------------------------------
def test_identity_caches_never_return_a_dead_objects_entry():
    """odeint's configured methods and systems and the compiled kernels are cached per object;
    CPython reuses a freed object's id at once, so a loop that creates and drops functions and
    integrators would find the dead one's entry under a bare id() key.  Each new object must get
    its own entry, and a collected object's entry must go."""
    import gc
    import types

    from torchgeo_int._cache import IdentityCache
    from torchgeo_int._compile import _kernels
    from torchgeo_int._odeint.methods import configured
    from torchgeo_int._odeint.state import system_for

    cache = IdentityCache(4)
    for i in range(50):
        def f(x, i=i):
            return x + i
        assert cache.get((f,), "k") is None        # a new function: never an old entry
        cache.put((f,), "k", i)
        assert cache.get((f,), "k") == i
        del f
        gc.collect()
        assert len(cache) == 0                     # its entry went with it

    caller = types.SimpleNamespace(dtype=F64, device=torch.device("cpu"), grad="backprop")
    y0 = torch.zeros(3, dtype=F64)
    for i in range(30):
        func = (lambda i: lambda t, y: y * i)(i)
        got = system_for(True, "first_order", func, {}, None, y0, caller, lambda i=i: ("built", i))
        assert got == ("built", i)
        assert system_for(True, "first_order", func, {}, None, y0, caller, lambda: "rebuilt") == got
        del func

    for i in range(30):   # the same name, another map each time
        m = tgi.CotangentLiftIntegrator(tgi.AlphaMap(0.1 + 0.02 * i), name="same_name")
        c = configured(m, 1e-9, None, None)
        assert c.key() == m.key() and c.tol == 1e-9
        del m, c

    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: 0.5 * (q * q).sum(-1))
    for i in range(30):
        m = tgi.Composition(tgi.METHODS["verlet"], [0.5, 0.5], name=f"half{i}")
        k = _kernels(m, H)
        assert k.integrator is m and k.system is H
        del m, k


def test_the_lie_step_is_the_graph_of_the_lie_cotangent_lift():
    """What 'built on LieCotangentLift' means: a step (g₀, μ₀) ↦ (g₁, μ₁) of the Lie integrator,
    read back through the lift's inverse, is (ḡ, μ̄), (V, M) = h X_H(ḡ, μ̄) (eq. (20))."""
    from torchgeo_int.manifolds.integrators import LieGroupIntegrator
    from torchgeo_int.manifolds.lie import SO3xR3
    from torchgeo_int.manifolds.systems import LieHamiltonian

    def H(g, mu):   # not a rigid body: ξ depends on g, the (ξ, μ̄) path of the step
        R, x = g[..., :3], g[..., 3]
        return 0.5 * (mu * mu).sum(-1) * (1.0 + 0.1 * R[..., 2, 2]) + 0.5 * (x * x).sum(-1)

    system = LieHamiltonian(H, group=SO3xR3)
    gen = torch.Generator().manual_seed(5)
    g0 = SO3xR3.random(3, generator=gen, dtype=F64)
    mu0 = 0.5 * torch.randn(3, 6, generator=gen, dtype=F64)
    h = 0.1
    for alpha in (0.5, 0.3, 0.0):
        m = LieGroupIntegrator("exp", alpha, tol=1e-14)
        g1, mu1, _ = m.step(system, g0, mu0, 0.0, h)
        (gb, mb), (V, M) = m.lift(SO3xR3).inverse((g0, mu0), (g1, mu1))
        xi, mudot = system.vector_field(gb, mb)
        assert torch.allclose(V, h * xi, atol=1e-11, rtol=0), alpha
        assert torch.allclose(M, h * mudot, atol=1e-11, rtol=0), alpha
