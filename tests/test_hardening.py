"""Hostile input (issue 21, non-core items): each case gave garbage or a cryptic error before.

User functions of the wrong output shape, complex states, detaching Hamiltonians, invalid
composition tables, states off their manifold, damaged checkpoint files, a map's inverse that
does not converge.  Every test asserts the error *and* that its message names the cause.
"""
import math

import pytest
import torch

import torchgeo_int as tgi
from torchgeo_int.integrators.composition import CoefficientTable
from torchgeo_int.manifolds import so3, sphere
from torchgeo_int.maps import DiscretizationMap
from torchgeo_int.nn.training import CheckpointError, load_checkpoint, save_checkpoint
from torchgeo_int.solvers import ConvergenceError

Q0, P0 = torch.tensor([[1.0, 0.0], [0.9, 0.1]]), torch.tensor([[0.0, 1.0], [0.1, 1.1]])


def _kepler_H(q, p):
    return 0.5 * (p * p).sum(-1) - 1.0 / q.norm(dim=-1)


# -- (1) output shapes of user functions -------------------------------------------------------

def test_per_coordinate_hamiltonian_is_refused_naming_both_shapes():
    bad = tgi.Hamiltonian(lambda q, p: 0.5 * p * p - 1 / q.norm(dim=-1, keepdim=True))
    with pytest.raises(ValueError, match=r"Hamiltonian.*returned shape \(2, 2\).*input of shape "
                                         r"\(2, 2\).*shape \(2,\)"):
        tgi.rollout(bad, Q0, P0, h=0.1, steps=3, method="implicit_midpoint")
    with pytest.raises(ValueError, match=r"returned shape \(2,\).*shape \(\)"):
        bad.energy(Q0[0], P0[0])        # the (2,) energy for one sample of shape (2,)
    # fewer values than rows is one system's total (an N-body state (bodies, 3)): accepted
    total = tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum() - (1 / q.norm(dim=-1)).sum())
    q, _ = tgi.rollout(total, Q0, P0, h=0.1, steps=2, method="implicit_midpoint")
    ref, _ = tgi.rollout(tgi.Hamiltonian(_kepler_H), Q0, P0, h=0.1, steps=2, method="implicit_midpoint")
    assert torch.allclose(q, ref, atol=1e-12)
    # the correct one still runs, and a named function is named
    q, _ = tgi.rollout(tgi.Hamiltonian(_kepler_H), Q0, P0, h=0.1, steps=3, method="implicit_midpoint")
    assert q.shape == (4, 2, 2)

    def per_coordinate(q, p):
        return 0.5 * p * p

    with pytest.raises(ValueError, match="'.*per_coordinate'"):
        tgi.rollout(tgi.Hamiltonian(per_coordinate), Q0, P0, h=0.1, steps=1,
                    method="implicit_midpoint")


def test_separable_parts_and_closed_form_gradients_of_the_wrong_shape():
    T = lambda p: 0.5 * (p * p).sum(-1)  # noqa: E731
    V = lambda q: -1.0 / q.norm(dim=-1)  # noqa: E731
    # kinetic_grad wrong: the bound (halves) loop and the method path
    bad_dT = tgi.SeparableHamiltonian(T, V, kinetic_grad=lambda p: p.sum(-1, keepdim=True))
    with pytest.raises(ValueError, match=r"kinetic_grad.*returned shape \(2, 1\).*\(2, 2\)"):
        tgi.rollout(bad_dT, Q0, P0, h=0.1, steps=2)
    with pytest.raises(ValueError, match="kinetic_grad"):
        bad_dT.velocity(P0)
    bad_dV = tgi.SeparableHamiltonian(T, V, potential_grad=lambda q: q.norm(dim=-1))
    with pytest.raises(ValueError, match=r"potential_grad.*returned shape \(2,\)"):
        tgi.rollout(bad_dV, Q0, P0, h=0.1, steps=2, method="yoshida4")
    # T or V per coordinate (autograd path)
    with pytest.raises(ValueError, match="the potential"):
        tgi.rollout(tgi.SeparableHamiltonian(T, lambda q: -1.0 / q.abs()), Q0, P0, h=0.1, steps=2)
    with pytest.raises(ValueError, match="the kinetic energy"):
        tgi.SeparableHamiltonian(lambda p: 0.5 * p * p, V).energy(Q0, P0)
    # a closed-form grad= of a Hamiltonian
    bad_grad = tgi.Hamiltonian(_kepler_H, grad=lambda q, p: (q[..., :1], p))
    with pytest.raises(ValueError, match=r"dH/dq of the grad.*returned shape \(2, 1\)"):
        tgi.rollout(bad_grad, Q0, P0, h=0.1, steps=2, method="implicit_midpoint")
    # right shapes: the bound loop equals the method path (the check changes no number)
    good = tgi.SeparableHamiltonian(T, V, kinetic_grad=lambda p: p,
                                    potential_grad=lambda q: q / q.norm(dim=-1, keepdim=True) ** 3)
    a = tgi.rollout(good, Q0, P0, h=0.1, steps=5)
    b = tgi.rollout(tgi.SeparableHamiltonian(T, V), Q0, P0, h=0.1, steps=5)
    assert torch.allclose(a[0], b[0], atol=1e-13) and torch.allclose(a[1], b[1], atol=1e-13)


def test_vector_field_system_and_ode_system_of_the_wrong_shape():
    vf = tgi.VectorFieldSystem(lambda t, q, p: (p.sum(-1, keepdim=True), -q))
    with pytest.raises(ValueError, match=r"dq of the vector field.*returned shape \(2, 1\).*\(2, 2\)"):
        tgi.rollout(vf, Q0, P0, h=0.1, steps=2, method="implicit_midpoint")
    sep = tgi.VectorFieldSystem(lambda t, q, p: (p, -q.sum(-1)), separable=True)
    with pytest.raises(ValueError, match=r"dp of the vector field.*returned shape \(2,\)"):
        tgi.rollout(sep, Q0, P0, h=0.1, steps=2)
    ode = tgi.ODESystem(lambda t, x: x.sum(-1, keepdim=True))
    with pytest.raises(ValueError, match=r"vector field.*returned shape \(2, 1\)"):
        tgi.rollout(ode, Q0, h=0.1, steps=2, method="implicit_midpoint")


# -- (7) complex states and detaching Hamiltonians ---------------------------------------------

def test_complex_states_and_detaching_hamiltonian_say_what_is_wrong():
    H = tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1))
    qc, pc = Q0.to(torch.complex128), P0.to(torch.complex128)
    with pytest.raises(TypeError, match=r"complex states.*real coordinates.*z\.real"):
        tgi.rollout(H, qc, pc, h=0.1, steps=2, method="implicit_midpoint")
    detaching = tgi.Hamiltonian(lambda q, p: _kepler_H(q, p).detach())
    with pytest.raises(RuntimeError, match=r"does not depend on its inputs through autograd.*detach"):
        tgi.rollout(detaching, Q0, P0, h=0.1, steps=2, method="implicit_midpoint")
    item = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1),
                                    lambda q: torch.tensor(q.norm(dim=-1).tolist()))
    with pytest.raises(RuntimeError, match="the potential.*does not depend on its inputs"):
        tgi.rollout(item, Q0, P0, h=0.1, steps=2)


# -- (2) composition tables ----------------------------------------------------------------------

@pytest.mark.parametrize("args, error, match", [
    (("bad", 4, (math.nan,) * 3, "x"), ValueError, "finite"),
    (("bad", 4, (math.inf, -math.inf, math.inf), "x"), ValueError, "finite"),
    (("bad", 3, (1.0,), "x"), ValueError, "even int"),
    (("bad", 0, (1.0,), "x"), ValueError, "even int"),
    (("bad", 2, [1.0], "x"), TypeError, "tuple of real numbers"),
    (("bad", 2, (), "x"), TypeError, "non-empty tuple"),
    (("bad", 2, ("1",), "x"), TypeError, "real numbers"),
    (("", 2, (1.0,), "x"), TypeError, "name"),
])
def test_coefficient_table_rejects_invalid_coefficients(args, error, match):
    with pytest.raises(error, match=match):
        CoefficientTable(*args)


def test_coefficient_table_valid_ones_still_build():
    t = CoefficientTable("plain", 2, (0.5, 0.5), "x")
    assert tgi.Composition(tgi.get_method("verlet"), t.gammas, order=t.order).order == 2


# -- (4) states off their manifold ---------------------------------------------------------------

def test_sphere_ode_state_off_the_sphere_is_refused_once_at_the_start():
    S = tgi.ODESystem(lambda t, x: torch.linalg.cross(torch.tensor([0.0, 0.0, 1.0]).expand_as(x),
                                                      x, dim=-1))
    method = sphere.SphereODEIntegrator()
    with pytest.raises(ValueError, match=r"x0 is not on the sphere.*1\.00e\+00.*normalise"):
        tgi.rollout(S, torch.tensor([[2.0, 0.0, 0.0]]), h=0.1, steps=3, method=method)
    x = tgi.rollout(S, torch.tensor([[0.6, 0.8, 0.0]]), h=0.1, steps=3, method=method)
    assert x.shape == (4, 1, 3)
    # the tolerance is relative to the dtype: 1e-6 off passes in float32, not in float64
    off = torch.tensor([[1.0 + 1e-6, 0.0, 0.0]])
    sphere.check_on_sphere(off.float())
    with pytest.raises(ValueError, match="not on the sphere"):
        sphere.check_on_sphere(off)


def test_so3_check_rotation_refuses_non_orthogonal_and_reflections():
    g = so3.random_rotation(4, generator=torch.Generator().manual_seed(1))
    so3.check_rotation(g)
    so3.check_rotation(g.float())
    with pytest.raises(ValueError, match=r"not a rotation matrix: max \|gᵀg − I\|"):
        so3.check_rotation(g * 1.1)
    reflected = g.clone()
    reflected[1, :, 0] *= -1
    with pytest.raises(ValueError, match=r"det -1.*reflection"):
        so3.check_rotation(reflected)
    with pytest.raises(ValueError, match="not a rotation"):      # 1e-6 is beyond √eps in float64
        so3.check_rotation(g + 1e-6)
    so3.check_rotation((g + 1e-6).float())                        # and within it in float32


# -- (6, 10) checkpoints ------------------------------------------------------------------------

def _saved(tmp_path):
    model = tgi.nn.HNN(1, width=8)
    opt = torch.optim.Adam(model.parameters())
    model.energy(torch.ones(3, 1), torch.ones(3, 1)).sum().backward()
    opt.step()
    path = save_checkpoint(tmp_path / "c.pt", model, opt, step=3, history={"loss": [1.0]})
    return model, path


def _load_fresh(path):
    other = tgi.nn.HNN(1, width=8)
    before = [p.detach().clone() for p in other.parameters()]
    try:
        return load_checkpoint(path, other, torch.optim.Adam(other.parameters()))
    except CheckpointError:    # a refused file loads nothing into the model
        assert all(torch.equal(a, b) for a, b in zip(before, other.parameters()))
        raise


def _flip_bit_in(raw: bytes, tensor: torch.Tensor) -> bytes:
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    at = raw.find(data)
    assert at >= 0 and raw.find(data, at + 1) < 0
    out = bytearray(raw)
    out[at + len(data) // 2] ^= 0x08
    return bytes(out)


def test_one_flipped_bit_in_weights_or_rng_is_refused(tmp_path):
    model, path = _saved(tmp_path)
    raw = path.read_bytes()
    assert _load_fresh(path)["step"] == 3
    bad = tmp_path / "flipped.pt"
    bad.write_bytes(_flip_bit_in(raw, next(model.parameters())))
    with pytest.raises(CheckpointError, match=r"flipped\.pt is not a valid torchgeo_int checkpoint "
                                              r"\(checksum mismatch in /model/.*damaged\)"):
        _load_fresh(bad)
    bad.write_bytes(_flip_bit_in(raw, torch.load(path, weights_only=True)["rng"]["torch"]))
    with pytest.raises(CheckpointError, match=r"checksum mismatch in /rng/torch"):
        _load_fresh(bad)


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "half_zeroed"])
def test_truncated_empty_garbage_files_give_one_clear_error_with_the_path(tmp_path, damage):
    _, path = _saved(tmp_path)
    raw = path.read_bytes()
    data = {"empty": b"", "truncated": raw[: len(raw) // 2],
            "garbage": bytes(range(256)) * 8,
            "half_zeroed": raw[: len(raw) // 2] + bytes(len(raw) - len(raw) // 2)}[damage]
    bad = tmp_path / f"{damage}.pt"
    bad.write_bytes(data)
    with pytest.raises(CheckpointError, match=rf"{damage}\.pt is not a valid torchgeo_int "
                                              r"checkpoint \(.+\)"):
        _load_fresh(bad)


def test_fit_resume_from_a_damaged_checkpoint_names_it(tmp_path):
    _, path = _saved(tmp_path)
    path.write_bytes(path.read_bytes()[:100])
    model = tgi.nn.HNN(1, width=8)
    with pytest.raises(CheckpointError, match="c.pt is not a valid torchgeo_int checkpoint"):
        tgi.nn.fit(model, lambda m, q: m.energy(q, q).mean(), torch.zeros(4, 1), steps=1,
                   resume=path, progress=False)


# -- (12) a map's inverse that does not converge -------------------------------------------------

class _SineMap(DiscretizationMap):
    """R_d(x, v) = (x, x + sin v): a valid map (Def 2.2) whose inverse exists for |x1 − x0| < 1."""

    def _forward(self, x, v):
        return x, x + torch.sin(v)


def test_map_inverse_convergence_error_advises_about_the_map_not_the_step():
    R = _SineMap()
    x, v = R.inverse(torch.zeros(2, 1), torch.full((2, 1), 0.5))
    assert torch.allclose(torch.sin(v), torch.full((2, 1), 0.5))
    with pytest.raises(ConvergenceError) as info:
        R.inverse(torch.zeros(2, 1), torch.full((2, 1), 2.0))
    msg = str(info.value)
    assert "inverse of _SineMap" in msg and "too far apart" in msg and "newton_max_iter" in msg
    assert "use solver='newton'" not in msg     # the solver's advice for integrator steps


def test_spherical_pendulum_top_conversions_refuse_states_off_their_manifold():
    pend = tgi.manifolds.SphericalPendulum()
    q = torch.tensor([[0.6, 0.0, 0.8]])
    p = torch.tensor([[0.0, 1.0, 0.0]])
    g, mu = pend.to_top_state(q, p)
    q2, p2 = pend.from_top_state(g, mu)
    assert torch.allclose(q2, q, atol=1e-14) and torch.allclose(p2, p, atol=1e-14)
    with pytest.raises(ValueError, match="q is not on the sphere"):
        pend.to_top_state(2 * q, p)
    with pytest.raises(ValueError, match="g is not a rotation matrix"):
        pend.from_top_state(1.01 * g, mu)
    flipped = g.clone()
    flipped[..., 0] *= -1
    with pytest.raises(ValueError, match="det -1"):
        pend.from_top_state(flipped, mu)


def test_lie_rollout_refuses_g0_off_so3():
    """Issue 21 (4): a rollout on SO(3) / SO(3)×R³ from a non-orthogonal g0 or a reflection is
    refused at the start (the Lie steps would keep gᵀg constant, not = I)."""
    from torchgeo_int.manifolds import FreeRigidBody
    system = FreeRigidBody(torch.tensor([1.0, 2.0, 3.5], dtype=torch.float64))
    g0 = torch.eye(3, dtype=torch.float64).expand(2, 3, 3).clone()
    mu0 = torch.tensor([[0.3, -0.2, 0.5], [0.1, 0.4, -0.3]], dtype=torch.float64)
    tgi.rollout(system, g0, mu0, h=0.1, steps=2, method="lie_midpoint_cayley")   # on the group: fine
    bent = g0.clone()
    bent[0, 0, 1] = 0.3
    with pytest.raises(ValueError, match="not a rotation matrix"):
        tgi.rollout(system, bent, mu0, h=0.1, steps=2, method="lie_midpoint_cayley")
    flipped = g0.clone()
    flipped[1, :, 0] *= -1
    with pytest.raises(ValueError, match="reflection"):
        tgi.rollout(system, flipped, mu0, h=0.1, steps=2, method="lie_midpoint_cayley")


def test_odeint_hamiltonian_option_of_per_coordinate_values_is_refused():
    """Issue 21 (1): odeint(options=dict(hamiltonian=H)) with H returning one value per
    coordinate is refused naming the option and both shapes (it integrated another system)."""
    q0 = torch.tensor([[1.0, 0.2], [0.5, -0.3]], dtype=torch.float64)
    p0 = torch.tensor([[0.0, 1.0], [0.4, 0.2]], dtype=torch.float64)
    t = torch.linspace(0.0, 0.1, 3, dtype=torch.float64)
    good = lambda q, p: 0.5 * (p * p).sum(-1) - 1 / q.norm(dim=-1)
    out = tgi.odeint(None, (q0, p0), t, method="implicit_midpoint",
                     options=dict(hamiltonian=good, batch_dims=1))
    assert out[0].shape == (3, 2, 2)
    bad = lambda q, p: 0.5 * p * p - 1 / q.norm(dim=-1, keepdim=True)
    for y0 in ((q0, p0), torch.cat([q0, p0], -1)):
        with pytest.raises(ValueError, match=r"options\['hamiltonian'\].*returned shape \(2, 2\)"):
            tgi.odeint(None, y0, t, method="implicit_midpoint",
                       options=dict(hamiltonian=bad, batch_dims=1))


def test_metrics_refuse_an_energy_of_per_coordinate_values():
    """energy_mse / energy_drift with a callable H returning one value per coordinate returned
    a number of another quantity (the mean over coordinates), hamiltonian_error a broadcast
    error; the callable's output is checked as a System's energy is."""
    g = torch.Generator().manual_seed(0)
    q, p = torch.randn(4, 6, 2, generator=g), torch.randn(4, 6, 2, generator=g)
    per_coordinate = lambda q, p: 0.5 * p * p + 0.5 * q * q          # noqa: E731
    total = lambda q, p: (0.5 * p * p + 0.5 * q * q).sum(-1)           # noqa: E731
    H = tgi.Hamiltonian(total)
    for call in (lambda E: tgi.nn.energy_mse(E, q, p, q + 0.1, p),
                 lambda E: tgi.nn.energy_drift(E, q, p, layout="windows"),
                 lambda E: tgi.nn.hamiltonian_error(E, H, q, p)):
        with pytest.raises(ValueError, match=r"H \(a lambda\) returned shape \(4, 6, 2\).*one value per sample"):
            call(per_coordinate)
        assert math.isfinite(float(call(total)))
    assert float(tgi.nn.hamiltonian_error(total, H, q, p)) == 0.0


def test_modified_hamiltonian_of_a_lagrangian_and_of_forced_systems():
    """The series took a system's forward as its H: a Lagrangian's is L(q, v), so its modified
    Hamiltonian was silently another function (its energy drifted 77x more along the method's
    own trajectory), and a ForcedSystem (a PortHamiltonianNN) failed with torch's "missing the
    required forward function".  Now a Lagrangian's energy is expanded, and forced or
    constrained systems are refused naming why."""
    V = lambda q: (1 - q.cos()).sum(-1)                                 # noqa: E731
    L = tgi.Lagrangian.mechanical(V)
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), V)
    g = torch.Generator().manual_seed(0)
    q, p = torch.randn(5, 1, generator=g), torch.randn(5, 1, generator=g)
    for method in ("verlet", "implicit_midpoint", "symplectic_euler"):
        a = tgi.nn.ModifiedHamiltonian(L, method, 0.3).energy(q, p)
        b = tgi.nn.ModifiedHamiltonian(H, method, 0.3).energy(q, p)
        assert torch.allclose(a, b, rtol=0, atol=1e-14)
    for model in (tgi.nn.PortHamiltonianNN(1, width=8), tgi.ForcedSystem(H, damping=0.1)):
        with pytest.raises(TypeError, match="for Hamiltonian flows, not a .*model.system"):
            tgi.nn.CorrectedHamiltonian(model, "verlet", 0.1)
    S = tgi.ConstrainedSystem(tgi.Lagrangian.mechanical(lambda q: q[..., 1]),
                              lambda q: 0.5 * ((q * q).sum(-1, keepdim=True) - 1))
    with pytest.raises(TypeError, match="not a ConstrainedSystem"):
        tgi.nn.ModifiedHamiltonian(S, "verlet", 0.1)


def test_trajectory_fit_method_step_control_and_series_h_checked_at_construction():
    """A misspelled TrajectoryFit method was refused only at the first loss; power_law_control
    took a NaN exponent (caught at the first step, as σ's) and any state_dims; the series'
    h refused a 0-d tensor that rollout takes.  Each is now checked where it is given."""
    q = torch.randn(3, 5, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="unknown method 'verlett'"):
        tgi.nn.TrajectoryFit(tgi.nn.SeparableHNN(1).double(), q, q, dt=0.1, method="verlett")
    with pytest.raises(ValueError, match="alpha must be a finite exponent"):
        tgi.power_law_control(float("nan"))
    with pytest.raises(ValueError, match="state_dims must be an int >= 1"):
        tgi.power_law_control(1.5, state_dims=0)
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: (1 - q.cos()).sum(-1))
    a = tgi.nn.ModifiedHamiltonian(H, "verlet", torch.tensor(0.3)).energy(q[:, 0], q[:, 1])
    b = tgi.nn.ModifiedHamiltonian(H, "verlet", 0.3).energy(q[:, 0], q[:, 1])
    assert torch.equal(a, b)
    for h, err in ((0.0, ValueError), ("0.3", TypeError), (float("inf"), ValueError)):
        with pytest.raises(err, match="h must be"):
            tgi.nn.CorrectedHamiltonian(H, "verlet", h)


def test_newcomer_audit_misuses_are_named():
    """Misuses an outside newcomer audit found running or failing deep inside: a non-symmetric
    mass (½vᵀMv sees only its symmetric part), a negative mass in a ConstrainedSystem (reported
    as a lost constraint rank), a negative or NaN mass / stiffness of the tops, a method name
    where a composition takes Integrators, fields that cannot take (t, x) / (t, q, p) (refused
    at the first step with Python's arity message), a step-size density returning a float."""
    M = tgi.manifolds
    cases = [
        (lambda: tgi.SecondOrderSystem(lambda t, q: -q, torch.tensor([[2.0, 1.0], [0.0, 2.0]])),
         ValueError, "mass matrix must be symmetric"),
        (lambda: tgi.ConstrainedSystem(tgi.Lagrangian.mechanical(lambda q: q[..., 1], -1.0),
                                       lambda q: (q * q).sum(-1, keepdim=True) - 1),
         ValueError, "positive definite mass"),
        (lambda: M.HeavyTop(torch.ones(3), mass=-1.0), ValueError, "mass must be a finite number > 0"),
        (lambda: M.HeavyTop(torch.ones(3), mass=float("nan")), ValueError, "mass must be a finite"),
        (lambda: M.SpringTop(torch.ones(3), stiffness=-1.0), ValueError, "stiffness must be a finite number >= 0"),
        (lambda: tgi.Composition("verlet", [0.5, 0.5]), TypeError, "methods are Integrators"),
        (lambda: tgi.ODESystem(lambda x: -x), TypeError, r"f\(t, x\) -> dx \(2 positional"),
        (lambda: tgi.VectorFieldSystem(lambda q, p: (p, -q)), TypeError, r"f\(t, q, p\)"),
        (lambda: tgi.rollout(tgi.SeparableHamiltonian(lambda p: (p * p).sum(-1) / 2, lambda q: (q * q).sum(-1) / 2),
                             torch.randn(3, 2), torch.randn(3, 2), h=0.1, steps=3,
                             step_control=lambda q, p: 1.0), TypeError, "sigma must return a tensor"),
    ]
    for call, err, match in cases:
        with pytest.raises(err, match=match):
            call()
    # an indefinite but regular, symmetric mass stays a Lagrangian (tested with its steps elsewhere)
    tgi.Lagrangian.mechanical(lambda q: (q * q).sum(-1), torch.tensor([[0.0, 1.0], [1.0, 0.0]]))


def test_a_wider_gradient_dtype_and_a_degenerate_sode_are_named():
    """A float64 potential_grad on float32 states promoted the states (verlet) or failed inside
    the implicit solve ("fn output 0 must match z0"); a narrower one (autocast) is the state's
    once added.  A degenerate Lagrangian's .sode() raised torch's raw LinAlgError."""
    H = tgi.SeparableHamiltonian(lambda p: (p * p).sum(-1) / 2, lambda q: (q * q).sum(-1) / 2,
                                 potential_grad=lambda q: q.double())
    q0, p0 = torch.randn(2, 2, dtype=torch.float32), torch.randn(2, 2, dtype=torch.float32)
    for method in ("verlet", "implicit_midpoint"):
        with pytest.raises(TypeError, match="returned torch.float64 for an input of torch.float32"):
            tgi.rollout(H, q0, p0, h=0.1, steps=2, method=method)
    narrow = tgi.SeparableHamiltonian(lambda p: (p * p).sum(-1) / 2, lambda q: (q * q).sum(-1) / 2,
                                      potential_grad=lambda q: q.bfloat16())
    assert tgi.rollout(narrow, q0, p0, h=0.1, steps=2)[0].dtype == torch.float32
    L = tgi.Lagrangian(lambda q, v: v[..., 0] - (q * q).sum(-1))      # linear in v: degenerate
    with pytest.raises(tgi.DegenerateLagrangianError, match="sode"):
        tgi.rollout(L.sode(), torch.randn(2, 2), torch.randn(2, 2), h=0.1, steps=2, method="sode_midpoint")


def test_dense_output_nodes_and_trajectory_fit_loss_misuse_are_named():
    """dense_output given nodes of another batch failed in a reshape; tf.loss(index) (fit's
    loss_fn called on an instance) failed with "'Tensor' object is not callable"."""
    H = tgi.SeparableHamiltonian(lambda p: (p * p).sum(-1) / 2, lambda q: (q * q).sum(-1) / 2)
    t = torch.linspace(0, 1, 5)[:, None].expand(5, 3)
    q = torch.randn(5, 3, 2)
    with pytest.raises(ValueError, match=r"q_nodes must have shape \(L, \*batch, \.\.\.\)"):
        tgi.dense_output(H, t, q[:, :2], q, torch.tensor([0.5]))
    model = tgi.nn.SeparableHNN(1, width=8)
    data = torch.randn(4, 5, 1).cumsum(1) * 0.1
    tf = tgi.nn.TrajectoryFit(model, data, data, dt=0.1)
    with pytest.raises(TypeError, match=r"call tf\(index\)"):
        tf.loss(torch.arange(2))
    assert torch.isfinite(tf.loss(tf, torch.arange(2)))


def test_the_audit_refusals_leave_valid_use_alone():
    """What an outside review of the audit's refusals found them refusing, or missing: a verlet
    copy named like a constrained method steps variable steps, a composition of variational
    stages does not (it failed naming _TimeScaled); fit's loss on a wrapped TrajectoryFit; the
    tops' 0-d tensor parameters; odeint's func returning a wider dtype (torchdiffeq takes it); a
    module whose __call__ takes (t, x); a forced loss on a model without a control attribute."""
    import copy
    from torchgeo_int.integrators import Composition

    H = tgi.SeparableHamiltonian(lambda p: (p * p).sum(-1) / 2, lambda q: (q * q).sum(-1) / 2)
    q0, p0 = torch.randn(3, 2), torch.randn(3, 2)
    renamed = copy.copy(tgi.METHODS["verlet"])
    renamed.name = "rattle"
    tgi.rollout(H, q0, p0, h=0.1, steps=3, method=renamed, step_control=tgi.power_law_control(1.0))
    L = tgi.Lagrangian.mechanical(lambda q: (q * q).sum(-1))
    vm = tgi.VARIATIONAL_METHODS["variational_midpoint"] if hasattr(tgi, "VARIATIONAL_METHODS") \
        else tgi.integrators.get_method("variational_midpoint")
    with pytest.raises(ValueError, match="its stage 'variational_midpoint'"):
        tgi.adaptive_rollout(L, q0, p0, eps=0.1, steps=3, method=Composition(vm, tgi.TABLES["yoshida4"].gammas),
                             control=tgi.power_law_control(1.0))
    data = torch.randn(4, 5, 1).cumsum(1) * 0.1
    tf = tgi.nn.TrajectoryFit(tgi.nn.SeparableHNN(1, width=8), data, data, dt=0.1)
    tgi.nn.fit(torch.nn.DataParallel(tf), tgi.nn.TrajectoryFit.loss, tf.segments, steps=1, progress=False)
    M = tgi.manifolds
    M.HeavyTop(torch.ones(3), mass=torch.tensor(2.0), gravity=torch.tensor(9.81))
    M.SpringTop(torch.ones(3), stiffness=torch.tensor(3.0))
    y = tgi.odeint(lambda t, y: (-y).double(), torch.ones(2, 2), torch.linspace(0, 1, 3), method="verlet",
                   options=dict(split=1))
    assert bool(torch.isfinite(y).all())

    class Field(torch.nn.Module):
        def forward(self, x):
            return -x

        def __call__(self, t, x):
            return self.forward(x)
    tgi.ODESystem(Field())
    model = tgi.nn.PortHamiltonianNN(1, n_controls=1)
    del model.control
    tgi.nn.forced_residual_loss(model, data, data, dt=0.1, control=torch.ones(1))
