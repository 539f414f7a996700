"""SO(3) maths, Lie-group discretization maps and their left-trivialised cotangent lifts."""
import pytest
import torch

from torchgeo_int.manifolds import so3
from torchgeo_int.manifolds.lie import SO3, SO3xR3, LieCotangentLift, LieGroupMap

TAUS = {"exp": (so3.exp, so3.dexp_right, so3.dexp_right_inv, so3.rotate_exp,
                so3.dexp_right_T_apply),
        "cayley": (so3.cay, so3.dcay_right, so3.dcay_right_inv, so3.rotate_cay,
                   so3.dcay_right_T_apply)}
SCALES = [0.0, 1e-5, 0.2, 0.33, 1.0, 2.5]   # 0.2 and 0.33 sit either side of the series switch


def vecs(scale, n=6):
    return scale * torch.randn(n, 3)


def test_hat_vee_cross():
    v, w = torch.randn(5, 3), torch.randn(5, 3)
    X = so3.hat(v)
    assert torch.allclose(X, -X.mT)
    assert torch.allclose((X @ w.unsqueeze(-1)).squeeze(-1), torch.linalg.cross(v, w, dim=-1))
    assert torch.equal(so3.vee(X), v)
    A = torch.randn(5, 3, 3)   # skew_vee is the covector η ↦ Σ A_ij η̂_ij
    assert torch.allclose((so3.skew_vee(A) * w).sum(-1), (A * so3.hat(w)).sum((-2, -1)))


@pytest.mark.parametrize("tau", sorted(TAUS))
@pytest.mark.parametrize("scale", SCALES)
def test_tau_is_a_rotation_and_differentials_match_autograd(tau, scale):
    f, dR, dRi, rot, dRT = TAUS[tau]
    x, d, m = vecs(scale), torch.randn(6, 3), torch.randn(6, 3)
    R = f(x)
    e, det = so3.orthogonality_error(R)
    assert e.max() < 1e-15 and det.max() < 1e-14
    # right-trivialised differential: Dτ(x)·d = (dτᴿ_x d)^ τ(x)
    D = torch.func.jvp(f, (x,), (d,))[1]
    assert torch.allclose(D @ R.mT, so3.hat((dR(x) @ d.unsqueeze(-1)).squeeze(-1)), atol=1e-14)
    # left-trivialised: dτᴸ_x = dτᴿ_{−x} = τ(x)ᵀ dτᴿ_x
    assert torch.allclose(dR(-x), R.mT @ dR(x), atol=1e-14)
    assert torch.allclose(dR(x) @ dRi(x), torch.eye(3).expand(6, 3, 3), atol=1e-13)
    assert torch.allclose(rot(x, m), (R @ m.unsqueeze(-1)).squeeze(-1), atol=1e-14)
    assert torch.allclose(dRT(x, m), (dR(x).mT @ m.unsqueeze(-1)).squeeze(-1), atol=1e-14)
    assert torch.isfinite(torch.autograd.functional.jacobian(lambda y: dRi(y).sum(), x)).all()


@pytest.mark.parametrize("scale", SCALES)
def test_inverses(scale):
    x = vecs(scale)
    assert torch.allclose(so3.cay_inv(so3.cay(x)), x, atol=1e-13)
    if scale < 1.5:  # principal branch of log: |x| < π
        assert torch.allclose(so3.log(so3.exp(x)), x, atol=1e-13)
    assert torch.allclose(so3.exp_minus_identity(x) + torch.eye(3), so3.exp(x))


@pytest.mark.parametrize("gap", [1.0, 0.5, 1e-4, 1e-7, 1e-10, 0.0])
def test_log_is_accurate_up_to_the_angle_pi(gap):
    # w = vee(g − gᵀ) = 2 sin θ n vanishes at θ = π: the quotient w / (2a(θ)) lost ε/(π − θ)
    # (and gave ξ = 0 at π); the axis from the symmetric part keeps round-off accuracy
    n = torch.randn(8, 3, generator=torch.Generator().manual_seed(1))
    n = n / n.norm(dim=-1, keepdim=True)
    xi = (torch.pi - gap) * n
    R = so3.exp(xi)
    L = so3.log(R)
    assert torch.allclose(so3.exp(L), R, atol=1e-14)
    assert torch.allclose(L.norm(dim=-1), xi.norm(dim=-1), atol=1e-14)
    if gap > 0:            # at θ = π, ±n are the same rotation
        assert torch.allclose(L, xi, atol=1e-13)
    assert torch.allclose(so3.log(torch.diag(torch.tensor([1.0, -1.0, -1.0]))).abs(),
                          torch.tensor([torch.pi, 0.0, 0.0]), atol=1e-15)


def test_log_gradients_on_both_branches():
    # the two branches meet at θ = 2π/3; each is evaluated on safe inputs where it is not used
    for xi in (torch.zeros(2, 3), torch.tensor([[0.3, -0.2, 0.1], [2.5, 0.5, 0.3]])):
        xi = xi.clone().requires_grad_()
        assert torch.autograd.gradcheck(lambda x: so3.log(so3.exp(x)), (xi,))
        so3.log(so3.exp(xi)).sum().backward()
        assert torch.isfinite(xi.grad).all()


def test_cayley_identities_used_by_the_integrators():
    x, m = vecs(0.7), torch.randn(6, 3)
    # cay(x)² = cay(2x / (1 − |x|²/4)); the closed-form free-body μ̄ = 4/(4+|x|²) cay(−x) μ
    n2 = (x * x).sum(-1, keepdim=True)
    assert torch.allclose(so3.cay(x) @ so3.cay(x), so3.cay(2 * x / (1 - n2 / 4)), atol=1e-14)
    mid = 0.5 * (so3.dcay_right_T_apply(x, so3.rotate_cay(-x, m)) + so3.dcay_right_T_apply(-x, so3.rotate_cay(-x, m)))
    assert torch.allclose(mid, 4 / (4 + n2) * so3.rotate_cay(-x, m), atol=1e-14)


def test_series_branch_is_continuous():
    for fn in (so3._a, so3._b, so3._c, so3._dcoef):
        t2 = torch.tensor([so3._SMALL])
        direct = {so3._a: lambda u: torch.sin(u.sqrt()) / u.sqrt(),
                  so3._b: lambda u: (1 - torch.cos(u.sqrt())) / u,
                  so3._c: lambda u: (u.sqrt() - torch.sin(u.sqrt())) / u ** 1.5,
                  so3._dcoef: so3._d_direct}[fn](t2)
        below = fn(t2 * (1 - 1e-15))
        assert abs(float(below - direct)) < 5e-16 * max(1.0, float(direct.abs())) * 20


def test_random_rotation():
    R = so3.random_rotation(100, generator=torch.Generator().manual_seed(3))
    e, det = so3.orthogonality_error(R)
    assert e.max() < 1e-14 and det.max() < 1e-14
    assert R.mean(0).abs().max() < 0.2   # Haar: mean ≈ 0


def test_bad_input():
    with pytest.raises(ValueError, match=r"\(\.\.\., 3\)"):
        so3.hat(torch.randn(4, 2))
    with pytest.raises(ValueError, match=r"\(\.\.\., 3, 3\)"):
        so3.cay_inv(torch.randn(3, 4))
    with pytest.raises(TypeError):
        so3.exp(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="alpha"):
        LieGroupMap(SO3, "cayley", 1.5)
    with pytest.raises(ValueError, match="unknown coordinate map"):
        LieGroupMap(SO3, "quaternion")
    with pytest.raises(ValueError, match="unknown group"):
        LieGroupMap("SE3")
    with pytest.raises(ValueError, match="batch shape"):
        SO3.check_state(torch.eye(3).expand(2, 3, 3), torch.zeros(3, 3))
    with pytest.raises(ValueError, match="NaN"):
        SO3.check_state(torch.eye(3), torch.tensor([0.0, float("nan"), 0.0]))
    with pytest.raises(ValueError, match="NaN or inf"):      # NaN compares False with any tol
        so3.check_rotation(torch.full((3, 3), float("nan")))
    with pytest.raises(ValueError, match=r"SO3Tau is not one of SO\(3\)xR3's"):   # another group's Tau
        LieGroupMap(SO3xR3, SO3.tau("cayley"))


def test_check_rotation_and_rollouts_take_several_batch_dims():
    import torchgeo_int as tgi
    from torchgeo_int.manifolds.systems import FreeRigidBody
    g = so3.random_rotation(2, 3, generator=torch.Generator().manual_seed(0))
    so3.check_rotation(g)                  # its worst det was indexed along dim 0 only
    bad = g.clone()
    bad[1, 2] = bad[1, 2] @ torch.diag(torch.tensor([1.0, 1.0, -1.0]))
    with pytest.raises(ValueError, match="reflection"):
        so3.check_rotation(bad)
    mu = torch.randn(2, 3, 3, generator=torch.Generator().manual_seed(1))
    system = FreeRigidBody([1.0, 2.0, 3.5])
    gs, mus = tgi.rollout(system, g, mu, h=0.1, steps=3, method="lie_midpoint_cayley")
    one, one_mu = tgi.rollout(system, g[1, 2], mu[1, 2], h=0.1, steps=3, method="lie_midpoint_cayley")
    assert gs.shape == (4, 2, 3, 3, 3)
    assert torch.allclose(gs[:, 1, 2], one, atol=1e-14) and torch.allclose(mus[:, 1, 2], one_mu, atol=1e-14)


def test_rigid_body_constants_move_with_the_module():
    from torchgeo_int.manifolds.systems import FreeRigidBody, HeavyTop, SpringTop
    for system in (FreeRigidBody([1.0, 2.0, 3.5]), HeavyTop([1.0, 2.0, 3.0]), SpringTop([1.0, 2.0, 3.0])):
        moved = system.to("meta")         # buffers: .to(device) moves inertia, com, attach
        assert all(b.device.type == "meta" for b in moved.buffers())
        mu = torch.zeros(2, moved.group.dim, device="meta")
        assert moved.velocity(mu).device.type == "meta"
        assert system.state_dict() == {} or "inertia" not in system.state_dict()


GROUPS = [SO3, SO3xR3]


def point(group, n=5, scale=0.4):
    g = group.random(n, generator=torch.Generator().manual_seed(7))
    return g, scale * torch.randn(n, group.dim)


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.name)
@pytest.mark.parametrize("tau", ["exp", "cayley"])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 1.0])
def test_lie_map_definition_inverse_adjoint(group, tau, alpha):
    R = LieGroupMap(group, tau, alpha)
    g, xi = point(group)
    res = R.check(g)
    assert res["i"] < 1e-15 and res["ii"] < 1e-13
    g0, g1 = R(g, xi)
    assert group.membership_error(g0)[0].max() < 1e-14
    gb, xb = R.inverse(g0, g1)
    assert torch.allclose(gb, g, atol=1e-13) and torch.allclose(xb, xi, atol=1e-13)
    # R_d*(g, ξ) = (R²(g, −ξ), R¹(g, −ξ))
    a0, a1 = R.adjoint()(g, xi)
    b0, b1 = R(g, -xi)
    assert torch.allclose(a0, b1, atol=1e-14) and torch.allclose(a1, b0, atol=1e-14)
    assert R.symmetric == (alpha == 0.5) and R.adjoint().alpha == 1 - alpha


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.name)
@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.7])
def test_cotangent_lift_inverse(group, alpha):
    lift = LieCotangentLift(LieGroupMap(group, "exp", alpha))
    g, V = point(group)
    mu, M = torch.randn(5, group.dim), 0.3 * torch.randn(5, group.dim)
    (g0, m0), (g1, m1) = lift((g, mu), (V, M))
    (gb, mb), (Vb, Mb) = lift.inverse((g0, m0), (g1, m1))
    for a, b in [(gb, g), (mb, mu), (Vb, V), (Mb, M)]:
        assert torch.allclose(a, b, atol=1e-12)


def test_cotangent_lift_is_a_symplectomorphism_in_a_chart():
    """R^{T*} pulls pr₂*ω − pr₁*ω back to d_Tω (THEORY §4), checked with the canonical
    coordinates (θ, p) of the chart g = g_ref cay(θ), p = (dcayᴸ_θ)ᵀμ on each factor and the
    lift written in the chart's tangent coordinates."""
    lift = LieCotangentLift(LieGroupMap(SO3, "cayley", 0.5))
    gref = so3.exp(torch.tensor([0.2, -0.4, 0.3]))

    def from_chart(th, p):
        return gref @ so3.cay(th), torch.linalg.solve(so3.dcay_right(-th).mT, p)

    def to_chart(g, mu):
        th = so3.cay_inv(gref.mT @ g)
        return th, so3.dcay_right(-th).mT @ mu

    def lifted(z):
        # z = (θ, p, θ̇, ṗ) in chart coordinates of TT*Q; left-trivialise the tangent
        th, p, thd, pd = z.split(3)
        g, mu = from_chart(th, p)
        V = so3.dcay_right(-th) @ thd
        # (torch.func.jvp would detach its primals from the outer reverse-mode graph)
        mud = torch.autograd.functional.jvp(lambda a, b: from_chart(a, b)[1], (th, p), (thd, pd),
                                            create_graph=True)[1]
        (g0, m0), (g1, m1) = lift((g, mu), (V, mud))
        return torch.cat([*to_chart(g0, m0), *to_chart(g1, m1)])

    z = torch.cat([torch.tensor([0.1, 0.05, -0.1]), torch.tensor([0.3, -0.2, 0.5]),
                   torch.tensor([0.2, -0.1, 0.15]), torch.tensor([0.05, 0.1, -0.2])])
    J = torch.autograd.functional.jacobian(lifted, z)
    I, Z = torch.eye(3), torch.zeros(3, 3)
    Om = torch.cat([torch.cat([Z, I], 1), torch.cat([-I, Z], 1)])
    Om12 = torch.block_diag(-Om, Om)
    # d_Tω = dq∧dṗ + dq̇∧dp in coordinates (q, p, q̇, ṗ)
    W = torch.zeros(12, 12)
    W[0:3, 9:12], W[9:12, 0:3] = I, -I
    W[6:9, 3:6], W[3:6, 6:9] = I, -I
    assert torch.allclose(J.T @ Om12 @ J, W, atol=1e-12)
