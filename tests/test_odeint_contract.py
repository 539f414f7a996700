"""torchdiffeq's calling contract for the names odeint takes over (implicit_euler,
implicit_midpoint) and for every geometric method: gradients with respect to t, event_fn,
the perturb option, the step callbacks (issue 22)."""
import math
import warnings

import pytest
import torch

import torchgeo_int as tgi

DT = torch.float64
TAKEN_OVER = ("implicit_euler", "implicit_midpoint")


class _Forced(torch.nn.Module):
    """y' = -a y + sin(t): time-dependent, with a parameter."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(0.7, dtype=DT))

    def forward(self, t, y):
        return -self.a * y + torch.sin(t)


@pytest.mark.parametrize("method", TAKEN_OVER)
@pytest.mark.parametrize("step_size", [None, 0.1])
def test_gradient_wrt_t_is_the_discrete_maps(method, step_size):
    f = _Forced()
    y0 = torch.tensor([0.3, -0.2], dtype=DT, requires_grad=True)
    t = torch.tensor([0.0, 0.25, 0.52, 0.83], dtype=DT, requires_grad=True)  # ratios to h off integers
    options = None if step_size is None else dict(step_size=step_size)

    def run(y0, t):
        return tgi.odeint(f, y0, t, method=method, rtol=0, atol=0, options=options)

    assert torch.autograd.gradcheck(run, (y0, t), atol=1e-7, rtol=1e-5)


def test_gradient_wrt_t_partitioned_methods():
    """A time-dependent partitioned field (forced oscillator) through verlet's explicit path and
    the implicit midpoint's partitioned form: the time grid's derivative is exact too."""
    def field(t, y):
        q, p = y
        return p, -q + 0.3 * torch.cos(t)

    q0 = torch.tensor([0.4], dtype=DT, requires_grad=True)
    p0 = torch.tensor([0.1], dtype=DT, requires_grad=True)
    t = torch.tensor([0.0, 0.31, 0.5], dtype=DT, requires_grad=True)
    for method, options in (("verlet", dict(separable=True, step_size=0.07)),
                            ("implicit_midpoint", dict(step_size=0.07)),
                            ("yoshida4", dict(separable=True))):
        def run(q0, p0, t):
            return tgi.odeint(field, (q0, p0), t, method=method, rtol=0, atol=0, options=options)
        assert torch.autograd.gradcheck(run, (q0, p0, t), atol=1e-7, rtol=1e-5), method


def test_t_gradient_values_equal_the_detached_run():
    f = _Forced()
    y0 = torch.tensor([0.3], dtype=DT)
    t = torch.linspace(0, 1, 5, dtype=DT)
    a = tgi.odeint(f, y0, t.requires_grad_(), method="implicit_midpoint", options=dict(step_size=0.1))
    with torch.no_grad():
        b = tgi.odeint(f, y0, t, method="implicit_midpoint", options=dict(step_size=0.1))
    assert torch.allclose(a, b, atol=1e-12, rtol=0)   # (the intervals' steps differ in the last bits)


def test_t_gradient_refused_under_lean_grad_modes():
    with pytest.raises(ValueError, match="backprop"):
        tgi.odeint(_Forced(), torch.ones(1, dtype=DT), torch.linspace(0, 1, 3, dtype=DT).requires_grad_(),
                   method="implicit_midpoint", options=dict(grad="checkpoint"))


@pytest.mark.parametrize("method", TAKEN_OVER)
@pytest.mark.parametrize("reverse", [False, True])
def test_event_location_on_the_step_sequence(method, reverse):
    """y' = 1: every method is exact, so the event y = ±c is at t0 ± c to the root finder's tol."""
    sgn = -1.0 if reverse else 1.0
    y0 = torch.tensor([0.0], dtype=DT)
    t = torch.tensor([2.0, 2.0 + sgn], dtype=DT)
    c = 0.537

    def event_fn(t, y):
        return y.sum() - sgn * c

    event_t, sol = tgi.odeint(lambda t, y: torch.ones_like(y), y0, t, method=method,
                              event_fn=event_fn, atol=1e-10, options=dict(step_size=0.1))
    assert sol.shape == (2, 1)
    assert torch.equal(sol[0], y0)
    assert abs(float(event_t) - (2.0 + sgn * c)) < 1e-9
    assert abs(float(sol[1, 0]) - sgn * c) < 1e-9


def test_event_state_is_a_step_of_the_method():
    """Harmonic oscillator, verlet, event q = 0: the state at the event is one verlet step of the
    located size from the last step (not an interpolation), so its energy error is verlet's."""
    def field(t, y):
        q, p = y
        return p, -q

    q0, p0 = torch.tensor([1.0], dtype=DT), torch.tensor([0.0], dtype=DT)
    event_t, (qs, ps) = tgi.odeint(field, (q0, p0), torch.tensor([0.0, 1.0], dtype=DT), method="verlet",
                                   event_fn=lambda t, y: y[0].sum(), atol=1e-12,
                                   options=dict(separable=True, step_size=0.1))
    assert abs(float(event_t) - math.pi / 2) < 2e-3           # verlet's phase error, h = 0.1
    assert abs(float(qs[1, 0])) < 1e-10
    H = lambda q, p: 0.5 * (q * q + p * p)                      # noqa: E731
    assert abs(float(H(qs[1], ps[1]) - H(q0, p0))) < 0.1 ** 2   # verlet's energy error, not a chord's


def test_event_cubic_interp_as_torchdiffeq():
    f = _Forced()
    y0 = torch.tensor([1.0], dtype=DT)
    found = {}
    for interp in ("linear", "cubic", "step"):
        with torch.no_grad():
            event_t, sol = tgi.odeint(f, y0, torch.tensor([0.0, 1.0], dtype=DT), method="implicit_midpoint",
                                      event_fn=lambda t, y: y.sum() - 0.9, atol=1e-10,
                                      options=dict(step_size=0.05, interp=interp))
        assert abs(float(sol[1, 0]) - 0.9) < 1e-8, interp
        found[interp] = float(event_t)
    assert 0.1 < found["step"] < 0.2
    # inside one step of 0.05 the three differ by the interpolants' errors only
    assert abs(found["cubic"] - found["step"]) < 1e-5 and abs(found["linear"] - found["step"]) < 1e-3


def test_event_needs_step_size_and_backprop():
    y0 = torch.ones(1, dtype=DT)
    t = torch.tensor([0.0, 1.0], dtype=DT)
    with pytest.raises(ValueError, match="step_size"):
        tgi.odeint(lambda t, y: -y, y0, t, method="implicit_euler", event_fn=lambda t, y: y.sum() - 0.5)
    with pytest.raises(ValueError, match="len\\(t\\) == 2"):
        tgi.odeint(lambda t, y: -y, y0, torch.linspace(0, 1, 3, dtype=DT), method="implicit_euler",
                   event_fn=lambda t, y: y.sum() - 0.5, options=dict(step_size=0.1))


def test_event_gradient_flows_to_y0():
    y0 = torch.tensor([1.0], dtype=DT, requires_grad=True)
    _, sol = tgi.odeint(lambda t, y: -y, y0, torch.tensor([0.0, 5.0], dtype=DT), method="implicit_midpoint",
                        event_fn=lambda t, y: t - 0.5, options=dict(step_size=0.1))
    sol[-1].sum().backward()
    # the state at t = 0.5 of the midpoint rule is y0·((1 − h/2)/(1 + h/2))^5
    assert abs(float(y0.grad) - ((1 - 0.05) / (1 + 0.05)) ** 5) < 1e-8


def test_unknown_method_with_event_fn_is_called_unknown():
    with pytest.raises(ValueError) as err:
        tgi.odeint(lambda t, y: -y, torch.ones(1, dtype=DT), torch.tensor([0.0, 1.0], dtype=DT),
                   method="no_such_method", event_fn=lambda t, y: y.sum())
    assert "unknown method" in str(err.value) and "geometric method" not in str(err.value)


@pytest.mark.parametrize("method", TAKEN_OVER + ("verlet",))
@pytest.mark.parametrize("perturb", [True, False])
def test_perturb_moves_grid_evaluations_inside_the_step(method, perturb):
    ts = []

    def f(t, x):
        ts.append(t.item())
        return -x

    options = dict(step_size=0.5, perturb=perturb)
    tgi.odeint(f, torch.tensor([1.0, 2.0], dtype=DT), torch.tensor([0.0, 1.0], dtype=DT),
               method=method, options=options)
    if perturb:
        assert 0.0 not in ts and 0.5 not in ts and 1.0 not in ts
        assert min(ts) > 0.0 and max(ts) < 1.0
    else:
        assert 0.0 in ts and 0.5 in ts


def test_perturb_must_be_bool():
    with pytest.raises(ValueError, match="perturb"):
        tgi.odeint(lambda t, y: -y, torch.ones(1, dtype=DT), torch.tensor([0.0, 1.0], dtype=DT),
                   method="implicit_euler", options=dict(perturb="yes"))


@pytest.mark.parametrize("method", TAKEN_OVER + ("verlet",))
def test_callback_step_called_before_every_step(method):
    calls = []

    class F(torch.nn.Module):
        def forward(self, t, y):
            return -y

        def callback_step(self, t0, y0, dt):
            calls.append((float(t0), y0.clone(), float(dt)))

    y0 = torch.tensor([1.0, 2.0], dtype=DT)
    ys = tgi.odeint(F(), y0, torch.tensor([0.0, 1.0], dtype=DT), method=method,
                    options=dict(step_size=0.1))
    assert len(calls) == 10
    assert [c[0] for c in calls] == pytest.approx([0.1 * k for k in range(10)], abs=1e-12)
    assert all(c[2] == pytest.approx(0.1) for c in calls)
    assert torch.equal(calls[0][1], y0)
    assert ys.shape == (2, 2)


def test_callback_step_like_torchdiffeq_backwards_in_time_and_in_an_event_search():
    import torchdiffeq
    calls = {}

    def make(key):
        class F(torch.nn.Module):
            def forward(self, t, y):
                return torch.stack([y[1], -y[0]])

            def callback_step(self, t0, y0, dt):
                calls.setdefault(key, []).append((float(t0), float(dt)))
        return F()
    y0 = torch.tensor([1.0, 0.0], dtype=DT)
    t = torch.tensor([0.5, 0.0], dtype=DT)
    torchdiffeq.odeint(make("tdq"), y0, t, method="rk4", options=dict(step_size=0.25))
    tgi.odeint(make("ours"), y0, t, method="implicit_midpoint", options=dict(step_size=0.25))
    flat = lambda key: [x for c in calls[key] for x in c]       # noqa: E731
    assert flat("ours") == pytest.approx(flat("tdq")) and calls["tdq"][0][1] > 0   # dt > 0
    # an event search calls back its steps, not the bisection's trial steps
    ev = lambda t, y: y[0]                       # noqa: E731  cos t crosses 0 at π/2
    tgi.odeint(make("event"), y0, torch.tensor([0.0, 5.0], dtype=DT), method="implicit_midpoint",
               options=dict(step_size=0.5), event_fn=ev)
    assert [c[1] for c in calls["event"]] == pytest.approx([0.5] * 4)


def test_func_outputs_torchdiffeq_takes_are_taken():
    t = torch.linspace(0, 1, 3, dtype=DT)
    # a 0-d derivative of a (1,) state; a tuple part of y0's size in another shape
    a = tgi.odeint(lambda t, y: torch.cos(t), torch.zeros(1, dtype=DT), t)
    assert torch.allclose(a[:, 0], torch.sin(t), atol=1e-6)
    y0 = (torch.tensor(1.0, dtype=DT), torch.tensor([0.0], dtype=DT))
    q, p = tgi.odeint(lambda t, y: (y[1], -y[0]), y0, t)
    assert torch.allclose(q, torch.cos(t), atol=1e-6)
    with pytest.raises(ValueError, match="without event_fn"):
        tgi.odeint(lambda t, y: -y, torch.ones(1, dtype=DT), t, method="verlet",
                   options=dict(step_size=0.1, interp="cubic"))
    with pytest.raises(ValueError, match="larger shape"):      # (2,) → (2, 2) would be garbage
        tgi.odeint(lambda t, y: y[:, None] * y, torch.ones(2, dtype=DT), t)


@pytest.mark.parametrize("name", ["callback_accept_step", "callback_reject_step"])
def test_accept_reject_callbacks_warn_like_torchdiffeq(name):
    class F(torch.nn.Module):
        def forward(self, t, y):
            return -y

    f = F()
    setattr(f, name, lambda t0, y0, dt: None)
    with pytest.warns(UserWarning, match="does not support callbacks"):
        tgi.odeint(f, torch.ones(2, dtype=DT), torch.tensor([0.0, 1.0], dtype=DT), method="implicit_euler",
                   options=dict(step_size=0.1))


def test_step_counts_and_landings_at_large_times_and_numpy_scalars():
    """At large |t| the round-off allowance (16 eps |t| / h) dropped whole steps (1000 steps of
    1e-3 on [1e6, 1e6 + 1] in float32 became one) and merged intervals of different lengths
    ([1e6, 1e6 + 1, 1e6 + 3] landed at 1e6 + 1.5); numpy scalars were refused as step sizes and
    tolerances (torchdiffeq takes them)."""
    import numpy as np
    calls = []

    def f(t, y):
        calls.append(float(t))
        return torch.ones_like(y)

    for dtype, t, h, n in ((torch.float32, [1e6, 1e6 + 1.0], 1e-3, 1000),
                           (torch.float32, [1000.0, 1000.01], 1e-4, 100),   # dt/h = 100.098
                           (torch.float64, [1e9, 1e9 + 0.01], 1e-3, 10)):
        calls.clear()
        tt = torch.tensor(t, dtype=dtype)
        y = tgi.odeint(f, torch.zeros(2, dtype=dtype), tt, method="explicit_euler", options=dict(step_size=h))
        assert len(calls) == n and float(tt[1] - tt[0]) / n <= h * 1.001
        assert float(y[-1, 0]) == pytest.approx(float(tt[1] - tt[0]), rel=1e-5)
    for dtype, t0 in ((torch.float32, 1e6), (torch.float64, 1e15)):
        tt = torch.tensor([t0, t0 + 1, t0 + 3], dtype=dtype)
        for method in ("explicit_euler", "verlet", "implicit_midpoint"):
            y = tgi.odeint(lambda t, y: torch.ones_like(y), torch.zeros(2, dtype=dtype), tt, method=method)
            assert y[:, 0].tolist() == [0.0, 1.0, 3.0], method
    y0, t = torch.ones(2, dtype=DT), torch.linspace(0, 1, 5, dtype=DT)
    a = tgi.odeint(lambda t, y: -y, y0, t, method="rk4", options=dict(step_size=np.float32(0.125)))
    b = tgi.odeint(lambda t, y: -y, y0, t, method="rk4", options=dict(step_size=0.125))
    assert torch.equal(a, b)
    tgi.odeint(lambda t, y: -y, y0, t, rtol=np.float32(1e-5), atol=np.float64(1e-6))
    tgi.odeint(lambda t, y: -y, y0, t, method="verlet", options=dict(step_size=np.int64(1) / 8, split=1))


def test_an_energy_under_inference_mode_is_named():
    H = lambda q, p: 0.5 * (p * p).sum(-1) + 0.5 * (q * q).sum(-1)   # noqa: E731
    with torch.inference_mode(), pytest.raises(RuntimeError, match=r"inference_mode\(\); use torch.no_grad"):
        tgi.odeint(None, torch.ones(2, 2, dtype=DT), torch.linspace(0, 1, 3, dtype=DT), method="verlet",
                   options=dict(hamiltonian=H, step_size=0.1))
