"""Tests of torchgeo_int.solvers: fixed_point / newton, implicit (IFT) and unrolled gradients."""
import pickle

import pytest
import torch

from torchgeo_int.solvers import ConvergenceError, default_tol, fixed_point, newton

F64 = torch.float64
B, N = 7, 5


def _contraction(n=N, lip=0.5, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(n, n, generator=g, dtype=dtype)
    return lip * W / torch.linalg.matrix_norm(W, 2)


def _data(dtype=F64, seed=0, batch=B, n=N, lip=0.5):
    g = torch.Generator().manual_seed(seed + 1)
    W = _contraction(n, lip, dtype, seed).requires_grad_()
    x = torch.randn(batch, n, generator=g, dtype=dtype).requires_grad_()
    return W, x


def _tanh_map(W, x):
    return lambda z: torch.tanh(z @ W.T + x)


def _reference_loop(W, x, iters=400):
    """Plain unrolled iteration, independent of the solver."""
    z = torch.zeros_like(x)
    for _ in range(iters):
        z = torch.tanh(z @ W.T + x)
    return z


def _mixed_residual(fz, z):
    """The documented per-sample norm: ||fn(z) - z||_inf / (1 + ||z||_inf)."""
    return (fz - z).abs().amax(-1) / (1 + z.abs().amax(-1))


# ---------------------------------------------------------------- fixed point: forward

def test_fixed_point_solves_contraction():
    W, x = _data()
    fn = _tanh_map(W, x)
    z = fixed_point(fn, torch.zeros(B, N, dtype=F64))
    assert z.shape == (B, N) and z.dtype == F64
    assert _mixed_residual(fn(z), z).max() <= default_tol(F64)
    torch.testing.assert_close(z, _reference_loop(W, x), rtol=0, atol=1e-13)


def test_scalar_and_structure_preserved():
    z = fixed_point(torch.cos, torch.tensor(1.0, dtype=F64))
    assert z.shape == () and abs(z.item() - 0.7390851332151607) < 1e-13
    z0 = torch.zeros(2, 3, 4, dtype=F64)
    z = fixed_point(lambda z: 0.5 * torch.sin(z) + 1.0, z0)
    assert z.shape == z0.shape and z.dtype == z0.dtype and z.device == z0.device


def test_batched_equals_per_sample_and_freezing():
    # Sample scales differ so samples converge after different iteration counts. With a loose
    # tolerance a sample that kept iterating after convergence would move by up to ~tol: the
    # exact match below shows it is frozen and independent of the rest of the batch.
    W, x = _data(batch=B)
    x = (x.detach() * torch.logspace(-3, 0.5, B, dtype=F64)[:, None])
    for tol in (None, 1e-6):
        zb = fixed_point(_tanh_map(W.detach(), x), torch.zeros(B, N, dtype=F64), tol=tol)
        for b in range(B):
            zs = fixed_point(_tanh_map(W.detach(), x[b:b + 1]), torch.zeros(1, N, dtype=F64),
                             tol=tol)
            torch.testing.assert_close(zb[b:b + 1], zs, rtol=0, atol=1e-14)
        # a different batch composition (reordered subset) gives the same per-sample results
        idx = torch.tensor([5, 0, 3])
        zsub = fixed_point(_tanh_map(W.detach(), x[idx]), torch.zeros(3, N, dtype=F64), tol=tol)
        torch.testing.assert_close(zsub, zb[idx], rtol=0, atol=1e-14)


def test_loose_tol_shows_freezing_matters():
    # Guard for the test above: at tol=1e-6 the converged value differs from the exact fixed
    # point by more than 1e-14, so the batch/solo equality there is not vacuous.
    W, x = _data()
    fn = _tanh_map(W.detach(), x.detach())
    loose = fixed_point(fn, torch.zeros(B, N, dtype=F64), tol=1e-6)
    tight = fixed_point(fn, torch.zeros(B, N, dtype=F64))
    assert (loose - tight).abs().max() > 1e-12


def test_float32_default_tol():
    W, x = _data(dtype=torch.float32)
    fn = _tanh_map(W.detach(), x.detach())
    z = fixed_point(fn, torch.zeros(B, N, dtype=torch.float32))
    assert z.dtype == torch.float32
    assert 1e-7 < default_tol(torch.float32) < 1e-5
    assert _mixed_residual(fn(z), z).max() <= default_tol(torch.float32)
    z64 = fixed_point(_tanh_map(W.detach().double(), x.detach().double()),
                      torch.zeros(B, N, dtype=F64))
    torch.testing.assert_close(z.double(), z64, rtol=0, atol=1e-5)


def test_default_tol_values():
    assert 1e-14 < default_tol(F64) <= 1e-13
    assert 1e-7 < default_tol(torch.float32) <= 1e-5
    assert 1e-4 < default_tol(torch.float16) <= 1e-2
    assert default_tol(torch.float16) < default_tol(torch.bfloat16) <= 0.05
    with pytest.raises(TypeError):
        default_tol(torch.int64)


# ---------------------------------------------------------------- fixed point: gradients

@pytest.mark.parametrize("backward", ["implicit", "unroll"])
def test_fixed_point_gradcheck(backward):
    W, x = _data()

    def solve(W, x):
        return fixed_point(_tanh_map(W, x), torch.zeros(B, N, dtype=F64), backward=backward)

    assert torch.autograd.gradcheck(solve, (W, x))


def test_implicit_gradient_equals_long_unroll():
    W, x = _data(lip=0.8)
    wts = torch.randn(B, N, dtype=F64, generator=torch.Generator().manual_seed(3))
    ref = torch.autograd.grad((_reference_loop(W, x, 600) * wts).sum(), (W, x))
    for backward in ("implicit", "unroll"):
        z = fixed_point(_tanh_map(W, x), torch.zeros(B, N, dtype=F64), backward=backward,
                        max_iter=400)
        got = torch.autograd.grad((z * wts).sum(), (W, x))
        for g, r in zip(got, ref):
            torch.testing.assert_close(g, r, rtol=0, atol=1e-9)


def test_float32_slow_contraction_adjoint_converges():
    # rate 0.98: the adjoint u ~ g / (1 - 0.98) is large, and float32 round-off in Jᵀu scales
    # with |u|; the per-sample max-norm scale keeps the default tolerance reachable.
    g = torch.Generator().manual_seed(8)
    q, _ = torch.linalg.qr(torch.randn(32, 32, generator=g, dtype=F64))
    W = (0.98 * q).float().requires_grad_()
    x = 0.01 * torch.randn(16, 32, generator=g)
    wts = torch.randn(16, 32, generator=g).float()
    grads = []
    for backward in ("implicit", "unroll"):
        z = fixed_point(lambda z: torch.tanh(z @ W.T + x.float()),
                        torch.zeros(16, 32, dtype=torch.float32), backward=backward,
                        max_iter=2000)
        grads.append(torch.autograd.grad((z * wts).sum(), W)[0])
    assert grads[0].dtype == torch.float32
    assert (grads[0] - grads[1]).abs().max() <= 2e-3 * grads[1].abs().max()


def test_implicit_z0_gets_no_gradient_unroll_does():
    W, x = _data()
    z0 = torch.zeros(B, N, dtype=F64, requires_grad=True)
    z = fixed_point(_tanh_map(W, x), z0)
    gz0, gW = torch.autograd.grad(z.sum(), (z0, W), allow_unused=True)
    assert gz0 is None and gW is not None
    z0u = torch.full((B, N), 0.3, dtype=F64, requires_grad=True)
    zu = fixed_point(_tanh_map(W, x), z0u, backward="unroll", max_iter=3, tol=1e300)
    (g,) = torch.autograd.grad(zu.sum(), z0u)
    assert g.abs().max() > 1e-3  # three iterations: z still depends on z0


def _tuple_problem():
    g = torch.Generator().manual_seed(7)
    A = (0.4 * torch.randn(3, 2, generator=g, dtype=F64)).requires_grad_()
    C = (0.4 * torch.randn(2, 3, generator=g, dtype=F64)).requires_grad_()
    x = torch.randn(B, 3, generator=g, dtype=F64).requires_grad_()
    y = torch.randn(B, 2, generator=g, dtype=F64).requires_grad_()

    def fn(z):
        z1, z2 = z
        return torch.tanh(z2 @ A.T + x), 0.5 * torch.sin(z1 @ C.T) + y
    return fn, (A, C, x, y)


def test_tuple_state_values_and_gradients():
    fn, params = _tuple_problem()
    z0 = (torch.zeros(B, 3, dtype=F64), torch.zeros(B, 2, dtype=F64))
    z1, z2 = fixed_point(fn, z0)
    assert z1.shape == (B, 3) and z2.shape == (B, 2)
    f1, f2 = fn((z1, z2))
    assert max((f1 - z1).abs().max(), (f2 - z2).abs().max()) < 1e-13
    # reference: a long plain loop
    r = z0
    for _ in range(300):
        r = fn(r)
    loss_ref = (r[0] ** 2).sum() + r[1].sum()
    ref = torch.autograd.grad(loss_ref, params)
    got = torch.autograd.grad((z1 ** 2).sum() + z2.sum(), params)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)

    def solve(A, C, x, y):
        def f(z):
            return torch.tanh(z[1] @ A.T + x), 0.5 * torch.sin(z[0] @ C.T) + y
        return fixed_point(f, z0)
    assert torch.autograd.gradcheck(solve, params)


def test_tuple_output_not_a_view():
    # outputs of the implicit identity may be updated in place by callers
    W, x = _data()
    z = fixed_point(_tanh_map(W, x), torch.zeros(B, N, dtype=F64))
    z.mul_(2.0)
    (g,) = torch.autograd.grad(z.sum(), W)
    assert torch.isfinite(g).all()


# ---------------------------------------------------------------- failures

def test_divergent_map_raises_with_details():
    with pytest.raises(ConvergenceError) as info:
        fixed_point(lambda z: 2 * z + 1, torch.zeros(3, 2, dtype=F64), max_iter=37)
    err = info.value
    msg = str(err)
    assert err.iterations == 37 and "37 iterations" in msg
    assert err.tol == default_tol(F64) and f"{err.tol:.3e}" in msg
    assert err.residual >= 0.5 and f"{err.residual:.3e}" in msg
    assert "newton" in msg and "step size h" in msg and err.step is None
    e2 = err.with_step(12)
    assert isinstance(e2, ConvergenceError) and e2.step == 12 and "step 12" in str(e2)
    assert (e2.iterations, e2.residual, e2.tol) == (err.iterations, err.residual, err.tol)
    e3 = pickle.loads(pickle.dumps(e2))
    assert str(e3) == str(e2) and e3.step == 12
    assert isinstance(err, RuntimeError)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_iterate_raises(bad):
    def fn(z):  # sample 1 blows up after a few iterations, the others converge
        z = 0.5 * z + 1.0
        z[1] = z[1] * bad if z[1, 0] > 1.8 else z[1]
        return z
    with pytest.raises(ConvergenceError, match="non-finite") as info:
        fixed_point(fn, torch.zeros(3, 2, dtype=F64), check_every=4)
    assert info.value.iterations == 4  # detected at the first check
    assert not (info.value.residual < float("inf"))


def test_non_finite_even_if_it_recovers_before_a_check():
    # an inf iterate that a later tanh maps back to finite values must not pass silently
    calls = []

    def fn(z):
        calls.append(1)
        return torch.full_like(z, float("inf")) if len(calls) == 3 else torch.tanh(z)
    with pytest.raises(ConvergenceError, match="non-finite"):
        fixed_point(fn, torch.ones(2, 2, dtype=F64), check_every=4)


def test_adjoint_non_convergence_raises():
    W, x = _data(lip=0.95)
    z = fixed_point(_tanh_map(W, x), torch.zeros(B, N, dtype=F64), max_iter=1000,
                    backward_max_iter=3)
    with pytest.raises(ConvergenceError, match="adjoint"):
        z.sum().backward()


def test_implicit_double_backward_raises():
    W, x = _data()
    z = fixed_point(_tanh_map(W, x), torch.zeros(B, N, dtype=F64))
    # z.sum(): the incoming cotangent is constant, the case once_differentiable would miss
    with pytest.raises(RuntimeError, match="unroll"):
        torch.autograd.grad(z.sum(), W, create_graph=True)


def test_unroll_double_backward_linear_analytic():
    a = torch.tensor(0.5, dtype=F64, requires_grad=True)
    b = torch.tensor(1.5, dtype=F64)
    z = fixed_point(lambda z: a * z + b, torch.tensor(0.0, dtype=F64), backward="unroll",
                    max_iter=200)
    (da,) = torch.autograd.grad(z, a, create_graph=True)
    (dda,) = torch.autograd.grad(da, a)
    assert abs(z.item() - 3.0) < 1e-12
    assert abs(da.item() - b.item() / (1 - 0.5) ** 2) < 1e-10
    assert abs(dda.item() - 2 * b.item() / (1 - 0.5) ** 3) < 1e-8


def test_unroll_double_backward_matches_fd_of_implicit_gradient():
    W, x = _data()
    wts = torch.randn(B, N, dtype=F64, generator=torch.Generator().manual_seed(5))

    def grad_x(x_, backward, create_graph=False):
        z = fixed_point(_tanh_map(W.detach(), x_), torch.zeros(B, N, dtype=F64),
                        backward=backward)
        return torch.autograd.grad((z * wts).sum(), x_, create_graph=create_graph)[0]

    v = torch.randn(B, N, dtype=F64, generator=torch.Generator().manual_seed(6))
    xx = x.detach().requires_grad_()
    g = grad_x(xx, "unroll", create_graph=True)
    (hv,) = torch.autograd.grad((g * v).sum(), xx)  # Hessian-vector product, unrolled
    eps = 1e-5
    gp = grad_x((x.detach() + eps * v).requires_grad_(), "implicit")
    gm = grad_x((x.detach() - eps * v).requires_grad_(), "implicit")
    torch.testing.assert_close(hv, (gp - gm) / (2 * eps), rtol=0, atol=1e-7)


# ---------------------------------------------------------------- Newton

def _cubic(c):
    return lambda z: z ** 3 + z - c


def test_newton_solves_cubic_with_analytic_gradient():
    g = torch.Generator().manual_seed(11)
    c = (3 * torch.randn(B, N, generator=g, dtype=F64)).requires_grad_()
    z = newton(_cubic(c), torch.zeros(B, N, dtype=F64))
    assert (z ** 3 + z - c).abs().max() < 1e-12
    (dc,) = torch.autograd.grad(z.sum(), c)
    torch.testing.assert_close(dc, 1 / (3 * z.detach() ** 2 + 1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("backward", ["implicit", "unroll"])
def test_newton_gradcheck(backward):
    c = torch.randn(3, 2, dtype=F64, generator=torch.Generator().manual_seed(2))
    c.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda c: newton(_cubic(c), torch.zeros(3, 2, dtype=F64), backward=backward), (c,))


def test_newton_coupled_tuple_system():
    # (u, v): u^3 + u + v/2 = a, v + sin(u)/2 = b (2 unknowns per sample, two components)
    g = torch.Generator().manual_seed(4)
    a = torch.randn(B, 1, generator=g, dtype=F64).requires_grad_()
    bb = torch.randn(B, 1, generator=g, dtype=F64).requires_grad_()

    def res(z, a=a, bb=bb):
        u, v = z
        return u ** 3 + u + 0.5 * v - a, v + 0.5 * torch.sin(u) - bb
    z0 = (torch.zeros(B, 1, dtype=F64), torch.zeros(B, 1, dtype=F64))
    u, v = newton(res, z0)
    r1, r2 = res((u, v))
    assert max(r1.abs().max(), r2.abs().max()) < 1e-12
    a3, b3 = a.detach()[:3].requires_grad_(), bb.detach()[:3].requires_grad_()
    z3 = (z0[0][:3], z0[1][:3])
    assert torch.autograd.gradcheck(lambda a, bb: newton(lambda z: res(z, a, bb), z3), (a3, b3))


def test_newton_matches_fixed_point_and_per_sample():
    W, x = _data()
    fn = _tanh_map(W, x)
    zf = fixed_point(fn, torch.zeros(B, N, dtype=F64))
    zn = newton(lambda z: z - fn(z), torch.zeros(B, N, dtype=F64))
    torch.testing.assert_close(zn, zf, rtol=0, atol=1e-13)
    gf = torch.autograd.grad(zf.pow(2).sum(), (W, x))
    gn = torch.autograd.grad(zn.pow(2).sum(), (W, x))
    for a, b in zip(gf, gn):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)
    # batch-independence
    for b in (0, 4):
        zs = newton(lambda z: z - _tanh_map(W, x[b:b + 1])(z), torch.zeros(1, N, dtype=F64))
        torch.testing.assert_close(zn[b:b + 1], zs, rtol=0, atol=1e-14)


def test_solvers_under_no_grad_and_inference_mode():
    # integrators' rollouts run under no_grad: Newton must still build its Jacobians
    g = torch.Generator().manual_seed(12)
    c = torch.randn(B, N, generator=g, dtype=F64, requires_grad=True)
    W, x = _data()
    with torch.no_grad():
        z = newton(_cubic(c), torch.zeros(B, N, dtype=F64))
        zu = newton(_cubic(c), torch.zeros(B, N, dtype=F64), backward="unroll")
        zf = fixed_point(_tanh_map(W, x), torch.zeros(B, N, dtype=F64))
        zp = newton(_grad_potential(torch.tensor(0.8, dtype=F64), c), torch.zeros(B, N, dtype=F64))
    assert not (z.requires_grad or zu.requires_grad or zf.requires_grad or zp.requires_grad)
    assert (z ** 3 + z - c).abs().max() < 1e-12 and torch.equal(z, zu)
    torch.testing.assert_close(zf, fixed_point(_tanh_map(W, x), torch.zeros(B, N, dtype=F64)),
                               rtol=0, atol=1e-13)
    with torch.inference_mode():
        zi = fixed_point(_tanh_map(W.detach(), x.detach()), torch.zeros(B, N, dtype=F64))
        with pytest.raises(RuntimeError, match="inference_mode"):
            newton(_cubic(c.detach()), torch.zeros(B, N, dtype=F64))
    torch.testing.assert_close(zi, zf, rtol=0, atol=0)


def test_newton_backtracking_and_damping():
    c = torch.tensor([0.5], dtype=F64)
    res = lambda z: torch.atan(z) - c  # noqa: E731  # full Newton from 3.0 diverges
    z = newton(res, torch.tensor([3.0], dtype=F64))
    assert abs(z.item() - torch.tan(c).item()) < 1e-13
    z = newton(_cubic(torch.tensor(2.0, dtype=F64)), torch.tensor(0.0, dtype=F64), damping=0.5,
               max_iter=200)
    assert abs(z.item() - 1.0) < 1e-13


def test_newton_singular_jacobian():
    with pytest.raises(ConvergenceError, match="singular"):
        newton(lambda z: z ** 2 + 1, torch.zeros(3, 2, dtype=F64))
    # residual that ignores one coordinate
    with pytest.raises(ConvergenceError, match="singular"):
        newton(lambda z: torch.stack([z[..., 0] - 1, torch.ones_like(z[..., 1])], -1),
               torch.zeros(4, 2, dtype=F64))


def test_newton_non_convergence_and_nan():
    with pytest.raises(ConvergenceError, match="did not converge") as info:
        newton(_cubic(torch.tensor(5.0, dtype=F64)), torch.tensor(0.0, dtype=F64), max_iter=2)
    assert info.value.iterations == 2 and "2 iterations" in str(info.value)
    with pytest.raises(ConvergenceError, match="non-finite"):
        newton(lambda z: torch.log(z) - 100.0, torch.tensor([-1.0], dtype=F64))


def test_newton_double_backward():
    c = torch.tensor([0.7, -2.0], dtype=F64, requires_grad=True)
    z = newton(_cubic(c), torch.zeros(2, dtype=F64), backward="unroll")
    (d,) = torch.autograd.grad(z.sum(), c, create_graph=True)
    (dd,) = torch.autograd.grad(d.sum(), c)
    zz = z.detach()
    torch.testing.assert_close(d.detach(), 1 / (3 * zz ** 2 + 1), rtol=0, atol=1e-12)
    torch.testing.assert_close(dd, -6 * zz / (3 * zz ** 2 + 1) ** 3, rtol=0, atol=1e-10)
    zi = newton(_cubic(c), torch.zeros(2, dtype=F64))
    with pytest.raises(RuntimeError, match="unroll"):
        torch.autograd.grad(zi.sum(), c, create_graph=True)


# ---------------------------------------------------------------- autograd inside fn

def _grad_potential(a, c):
    """z -> ∇V(z) - c with V(z) = a Σ log cosh z + |z|²/2, by torch.autograd.grad inside."""
    def grad_v(z):
        create = torch.is_grad_enabled()
        with torch.enable_grad():
            zz = z if z.requires_grad else z.detach().requires_grad_()
            v = (a * torch.log(torch.cosh(zz)) + 0.5 * zz ** 2).sum()
            (dv,) = torch.autograd.grad(v, zz, create_graph=create)
        return dv - c
    return grad_v


def test_autograd_inside_fn_fixed_point_and_newton():
    g = torch.Generator().manual_seed(9)
    a = torch.tensor(0.8, dtype=F64, requires_grad=True)
    c = torch.randn(B, 3, generator=g, dtype=F64).requires_grad_()
    r = _grad_potential(a, c)
    z0 = torch.zeros(B, 3, dtype=F64)
    # z = z - 0.5 (∇V(z) - c) is a contraction: ∇²V ∈ [1, 1 + a]
    zf = fixed_point(lambda z: z - 0.5 * r(z), z0)
    zn = newton(r, z0)
    # exact: a tanh z + z = c per coordinate; IFT derivatives
    zs = zn.detach()
    torch.testing.assert_close(a.detach() * torch.tanh(zs) + zs, c.detach(), rtol=0, atol=1e-13)
    torch.testing.assert_close(zf, zn, rtol=0, atol=1e-13)
    den = a.detach() / torch.cosh(zs) ** 2 + 1
    for z in (zf, zn):
        da, dc = torch.autograd.grad(z.sum(), (a, c))
        torch.testing.assert_close(dc, 1 / den, rtol=0, atol=1e-11)
        torch.testing.assert_close(da, (-torch.tanh(zs) / den).sum(), rtol=0, atol=1e-10)
    c2, z2 = c.detach()[:2].requires_grad_(), z0[:2]
    for backward in ("implicit", "unroll"):
        assert torch.autograd.gradcheck(
            lambda a, c: fixed_point(lambda z: z - 0.5 * _grad_potential(a, c)(z), z2,
                                     backward=backward), (a, c2))
        assert torch.autograd.gradcheck(
            lambda a, c: newton(_grad_potential(a, c), z2, backward=backward), (a, c2))


# ---------------------------------------------------------------- arguments

def test_bad_arguments():
    z0 = torch.zeros(3, 2, dtype=F64)
    ident = lambda z: 0.5 * z  # noqa: E731
    with pytest.raises(ValueError, match="implicit.*unroll"):
        fixed_point(ident, z0, backward="adjoint")
    with pytest.raises(ValueError, match="implicit.*unroll"):
        newton(ident, z0, backward="foo")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_iter"):
            fixed_point(ident, z0, max_iter=bad)
    with pytest.raises(ValueError, match="check_every"):
        fixed_point(ident, z0, check_every=0)
    with pytest.raises(ValueError, match="tol"):
        fixed_point(ident, z0, tol=-1.0)
    with pytest.raises(TypeError, match="tensor"):
        fixed_point(ident, [z0])
    with pytest.raises(TypeError, match="tensor"):
        fixed_point(ident, 1.0)
    with pytest.raises(TypeError, match="floating"):
        fixed_point(ident, torch.zeros(3, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="batch shape"):
        fixed_point(lambda z: z, (z0, torch.zeros(4, 1, dtype=F64)))
    with pytest.raises(ValueError, match="shape"):
        fixed_point(lambda z: z[..., :1], z0)
    with pytest.raises(TypeError, match="tuple"):
        fixed_point(lambda z: z[0], (z0, z0))
    for d in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="damping"):
            newton(ident, z0, damping=d)


def test_fused_iterations_are_the_plain_ones():
    """fixed_point(fuse=...): the iterations between two checks as one call of
    fused_iterations (what compile=True compiles) give the same iterate, bit for bit, and the
    same errors as the plain loop — tensor and tuple states, a stretch cut by max_iter."""
    from torchgeo_int.solvers import fused_iterations
    torch.manual_seed(0)
    A = 0.3 * torch.randn(5, 3, 3, dtype=torch.float64)
    b = torch.randn(5, 3, dtype=torch.float64)
    fn = lambda z, A, b: torch.tanh((A @ z.unsqueeze(-1)).squeeze(-1)) + b  # noqa: E731
    calls = []

    def fuse(f, m, is_tuple):
        calls.append((m, is_tuple))
        return fused_iterations(f, m, is_tuple)
    for max_iter in (100, 6):
        kw = dict(args=(A, b), check_every=4, max_iter=max_iter)
        try:
            plain = fixed_point(fn, torch.zeros(5, 3, dtype=torch.float64), **kw)
        except ConvergenceError as err:
            with pytest.raises(ConvergenceError) as fused_err:
                fixed_point(fn, torch.zeros(5, 3, dtype=torch.float64), fuse=fuse, **kw)
            assert fused_err.value.iterations == err.iterations == max_iter
            continue
        fused = fixed_point(fn, torch.zeros(5, 3, dtype=torch.float64), fuse=fuse, **kw)
        assert torch.equal(plain, fused)
    pair = lambda z, A, b: (torch.tanh(z[1]) * 0.5 + b, torch.sin(z[0]) * 0.5)  # noqa: E731
    z0 = (torch.zeros(5, 3, dtype=torch.float64), torch.zeros(5, 3, dtype=torch.float64))
    plain = fixed_point(pair, z0, args=(A, b))
    fused = fixed_point(pair, z0, args=(A, b), fuse=fuse)
    assert all(torch.equal(x, y) for x, y in zip(plain, fused))
    assert calls == [(4, False), (4, False), (4, True)]


def test_fixed_iterations_run_exactly_m_and_record_the_residual():
    """fixed_point(fuse=FixedIterations(m)) (compile=True's blocks of implicit steps): exactly m
    iterations with no check, the largest per-sample residual of the last one kept (the max over
    every solve since ``r`` was cleared; NaN kept); refused under grad mode (no adjoint)."""
    from torchgeo_int.solvers import FixedIterations, residual_of
    torch.manual_seed(0)
    A = 0.3 * torch.randn(5, 3, 3, dtype=torch.float64)
    b = torch.randn(5, 3, dtype=torch.float64)
    fn = lambda z, A, b: torch.tanh((A @ z.unsqueeze(-1)).squeeze(-1)) + b  # noqa: E731
    fixed, z = FixedIterations(3), torch.zeros(5, 3, dtype=torch.float64)
    with torch.no_grad():
        out = fixed_point(fn, z, args=(A, b), fuse=fixed)
        zs = [z]
        for _ in range(3):
            zs.append(fn(zs[-1], A, b))
        assert torch.equal(out, zs[3])
        assert fixed.r == residual_of((zs[3],), (zs[2],)).max() and fixed.r > default_tol(torch.float64)
        first = fixed.r
        fixed_point(fn, zs[3], args=(A, b), fuse=fixed)        # a second solve: the max of both
        assert fixed.r == first
        fixed_point(fn, torch.full_like(z, float("nan")), args=(A, b), fuse=fixed)
        assert fixed.r.isnan()
    with pytest.raises(RuntimeError, match="without a graph"):
        fixed_point(fn, z, args=(A, b), fuse=FixedIterations(3))
    with pytest.raises(ValueError, match="m must be"):
        FixedIterations(0)
