"""odeint's adaptive option (reversible variable steps + dense output) under every grad mode:
the lean modes' gradients w.r.t. y0, func's parameters and the control's parameters equal
backprop's, and the options that do not apply to the adaptive path are refused."""
import pytest
import torch
from torch import nn

import torchgeo_int as tgi

from problems import kepler_initial  # tests/problems.py

T = torch.linspace(0.0, 3.0, 5)


class KeplerField(nn.Module):
    """func(t, (q, p)) = (p, −k q/|q|³) with k a parameter (what the lean modes differentiate)."""

    def __init__(self):
        super().__init__()
        self.k = nn.Parameter(torch.tensor(1.1))

    def forward(self, t, y):
        q, p = y
        return p, -self.k * q / q.norm(dim=-1, keepdim=True) ** 3


class FlatKeplerField(KeplerField):
    """The field of a softened Kepler potential on y = cat([q, p], -1): smooth at q = 0, where
    separable=True evaluates it (the ignored half of a singular field would backpropagate NaN
    through the cat)."""

    def forward(self, t, y):
        q, p = y[..., :2], y[..., 2:]
        r2 = (q * q).sum(-1, keepdim=True) + 0.01
        return torch.cat([p, -self.k * q / r2 ** 1.5], -1)


class PowerControl(nn.Module):
    """σ(q) = |q|^α with α a parameter: the step sizes depend on it."""

    def __init__(self):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(1.4))

    def forward(self, q):
        return q.norm(dim=-1) ** self.alpha


def _y0():
    qs, ps = zip(*[kepler_initial(e) for e in (0.5, 0.8)])
    return torch.stack(qs), torch.stack(ps)


def _grads(func, y0, grad, method="verlet", control=None, **extra):
    """(outputs, d loss / d (y0 parts, func's parameters, control's parameters))."""
    opts = dict(adaptive="reversible", step_size=0.05, separable=True, batch_dims=1, grad=grad,
                **extra)
    if control is not None:
        opts["control"] = control
    y0 = tuple(y.clone().requires_grad_() for y in y0) if isinstance(y0, tuple) else \
        y0.clone().requires_grad_()
    ys = tgi.odeint(func, y0, T, method=method, options=opts)
    outs = ys if isinstance(ys, tuple) else (ys,)
    g = torch.Generator().manual_seed(1)
    loss = sum((o * torch.randn(o.shape, generator=g)).sum() for o in outs)
    leaves = [*(y0 if isinstance(y0, tuple) else (y0,)), *func.parameters(),
              *(control.parameters() if isinstance(control, nn.Module) else ())]
    return [o.detach() for o in outs], torch.autograd.grad(loss, leaves)


def _close(a, b, rel=1e-9):
    for x, y in zip(a, b):
        assert (x - y).abs().max() <= rel * y.abs().max(), (x, y)


@pytest.mark.parametrize("grad", ["checkpoint", "reversible"])
@pytest.mark.parametrize("method", ["verlet", "yoshida4"])
def test_lean_modes_equal_backprop_for_y0_func_and_control(grad, method):
    func, control = KeplerField(), PowerControl()
    ref_out, ref = _grads(func, _y0(), "backprop", method, control)
    out, got = _grads(func, _y0(), grad, method, control)
    assert len(got) == 4 and all(bool((g != 0).any()) for g in ref)   # q0, p0, k, α all reached
    _close(out, ref_out, 1e-12)
    _close(got, ref)


@pytest.mark.parametrize("grad", ["checkpoint", "reversible"])
def test_lean_modes_on_a_flat_state_with_the_default_control(grad):
    func = FlatKeplerField()
    q0, p0 = _y0()
    y0 = torch.cat([q0, p0], -1)
    _, ref = _grads(func, y0, "backprop")
    _, got = _grads(func, y0, grad, **({"segment": 7} if grad == "checkpoint" else {}))
    _close(got, ref)


def test_a_closure_tensor_needs_params():
    k = torch.tensor(1.1, requires_grad=True)

    def func(t, y):
        q, p = y
        return p, -k * q / q.norm(dim=-1, keepdim=True) ** 3

    q0, p0 = _y0()
    opts = dict(adaptive="reversible", step_size=0.05, separable=True, batch_dims=1)
    for grad in ("checkpoint", "reversible"):
        with pytest.raises(ValueError, match="params"):
            tgi.odeint(func, (q0, p0), T, method="verlet", options={**opts, "grad": grad})
    grads = []
    for grad, extra in (("backprop", {}), ("checkpoint", {"params": [k]}),
                        ("reversible", {"params": [k]})):
        q, p = tgi.odeint(func, (q0, p0), T, method="verlet", options={**opts, "grad": grad, **extra})
        grads.append(torch.autograd.grad((q * p).sum(), k)[0])
    _close(grads[1:], [grads[0]] * 2)


def test_options_that_do_not_apply_are_refused():
    func = KeplerField()
    q0, p0 = _y0()
    opts = dict(adaptive="reversible", step_size=0.05, separable=True, batch_dims=1)
    with pytest.raises(ValueError, match="not options\\['compile'\\]"):
        tgi.odeint(func, (q0, p0), T, method="verlet", options={**opts, "compile": True})
    with pytest.raises(ValueError, match="perturb"):
        tgi.odeint(func, (q0, p0), T, method="verlet", options={**opts, "perturb": True})
    with pytest.raises(ValueError, match="gradients with respect to t"):
        tgi.odeint(func, (q0, p0), T.clone().requires_grad_(), method="verlet", options=opts)
    with pytest.raises(ValueError, match="do not apply to grad='checkpoint'"):
        tgi.odeint(func, (q0, p0), T, method="verlet",
                   options={**opts, "grad": "checkpoint", "reconstruction_tol": 1e-8})
    with pytest.raises(ValueError, match="must be one of"):
        tgi.odeint(func, (q0, p0), T, method="verlet", options={**opts, "grad": "adjoint"})
