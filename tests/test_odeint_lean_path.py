"""odeint's lean path for explicit splittings of a separable func (issue 20): the state kept in
the user's shapes, one half of func's output per kick or drift, the zero half reused, t made
from a numpy scalar on the CPU — the same arithmetic as a hand-written loop, so the same bits."""
import pytest
import torch

import torchgeo_int as tgi

H = 0.01


def _grad_v(q):
    return q / (q * q).sum(-1, keepdim=True) ** 1.5


def _init(batch):
    r = 1 + 0.1 * torch.rand(batch, 1)
    return r * torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]) / r.sqrt()


def _hand(method, q, p, times, n_per, field):
    """The kick/drift sequence of ``method`` with func's calls of odeint (FSAL: one force per
    nonzero kick after the first), func on the full state, the state stored at every time."""
    kicks, drifts = tgi.METHODS[method].splitting()
    out_q, out_p = [q], [p]
    force = field(q, p)[1]
    for _ in range(len(times) - 1):
        for _ in range(n_per):
            for j, b in enumerate(drifts):
                if j > 0:
                    force = field(q, p)[1]
                p = torch.add(p, force, alpha=kicks[j] * H)
                q = torch.add(q, field(q, p)[0], alpha=b * H)
            force = field(q, p)[1]
            p = torch.add(p, force, alpha=kicks[-1] * H)
        out_q.append(q)
        out_p.append(p)
    return torch.stack(out_q), torch.stack(out_p)


@pytest.mark.parametrize("method", ["verlet", "yoshida4"])
@pytest.mark.parametrize("batch_dims", [0, 1])
def test_flat_and_tuple_states_equal_the_hand_loop_bit_for_bit(method, batch_dims):
    q0, p0 = _init(5)
    times = torch.linspace(0.0, 0.4, 5)           # 10 steps per output interval

    def flat(t, y):
        q, p = y[..., :2], y[..., 2:]
        return torch.cat([p, -_grad_v(q)], -1)

    def pair(t, y):
        q, p = y
        return p, -_grad_v(q)

    ref_q, ref_p = _hand(method, q0, p0, times, 10, lambda q, p: (p, -_grad_v(q)))
    opts = dict(separable=True, step_size=H, batch_dims=batch_dims)
    y = tgi.odeint(flat, torch.cat([q0, p0], -1), times, method=method, options=opts)
    assert y.shape == (5, 5, 4)
    assert torch.equal(y, torch.cat([ref_q, ref_p], -1))
    q, p = tgi.odeint(pair, (q0, p0), times, method=method, options=opts)
    assert torch.equal(q, ref_q) and torch.equal(p, ref_p)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_func_sees_each_time_as_a_fresh_0d_tensor_of_the_state_dtype(dtype):
    seen = []

    def flat(t, y):
        seen.append(t)
        return torch.cat([y[..., 2:], -t * y[..., :2]], -1)     # time-dependent stiffness

    y0 = torch.tensor([[1.0, 0.5, 0.0, 0.2]], dtype=dtype)
    times = torch.tensor([0.25, 0.45], dtype=dtype)
    ys = tgi.odeint(flat, y0, times, method="verlet",
                    options=dict(separable=True, step_size=0.1, split=2))
    # separable=True's check at t0 (seven calls: the field whole and each half at two points,
    # and once more whole), then verlet's two steps: kicks at the steps' ends (FSAL), drifts at
    # their midpoints
    a, b = times.tolist()
    h = (b - a) / 2
    expect = [a] * 7 + [a, a + 0.5 * h, a + h, (a + h) + 0.5 * h, (a + h) + h]
    assert [float(t) for t in seen] == [float(torch.tensor(x, dtype=dtype)) for x in expect]
    assert all(t.dim() == 0 and t.dtype == dtype and not t.requires_grad for t in seen)
    assert len({id(t) for t in seen}) == len(seen)                  # never one buffer rewritten
    assert ys.dtype == dtype and torch.equal(ys[0], y0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_times_from_the_pool_keep_their_values_across_refills(monkeypatch, dtype):
    """odeint's CPU times come from a TimePool (0-d views of one buffer, each slot written once):
    a func that keeps every t it got finds each still holding its own time after the pool has
    been refilled several times, each a distinct tensor; the states equal a hand loop's."""
    from torchgeo_int._odeint import state as st
    monkeypatch.setattr(st.TimePool, "SIZE", 8)
    seen = []

    def flat(t, y):
        seen.append(t)
        return torch.cat([y[..., 2:], -(1 + 0.1 * t) * y[..., :2]], -1)

    y0 = torch.tensor([[1.0, 0.5, 0.0, 0.2]], dtype=dtype)
    h, n = 0.05, 30
    ys = tgi.odeint(flat, y0, torch.tensor([0.0, n * h], dtype=dtype), method="verlet",
                    options=dict(separable=True, step_size=h))
    hh = float(torch.tensor(n * h, dtype=dtype)) / n     # odeint's step from t's values
    expect, q, p, t = [0.0] * 8, y0[..., :2], y0[..., 2:], 0.0   # (7: separable=True's check)
    force = lambda q, t: -(1 + 0.1 * torch.tensor(t, dtype=dtype)) * q   # noqa: E731
    for j in range(n):
        t = j * hh
        p = p + 0.5 * hh * force(q, t)
        expect.append(t + 0.5 * hh)
        q = q + hh * p
        expect.append(t + hh)
        p = p + 0.5 * hh * force(q, t + hh)
    assert len(seen) == 2 * n + 8 > 5 * st.TimePool.SIZE
    assert [float(x) for x in seen] == [float(torch.tensor(x, dtype=dtype)) for x in expect]
    assert len({id(x) for x in seen}) == len(seen)
    torch.testing.assert_close(ys[-1], torch.cat([q, p], -1), rtol=0,
                               atol=1e-14 if dtype == torch.float64 else 1e-6)


def test_the_reused_zero_half_stays_zero_and_grads_flow():
    """The unused half is one zeros tensor per shape; func sees it, autograd goes around it."""
    k = torch.tensor(1.3, requires_grad=True)
    halves = []

    def pair(t, y):
        q, p = y
        halves.append((q, p))
        return p, -k * q

    q0, p0 = _init(3)
    q, p = tgi.odeint(pair, (q0, p0), torch.tensor([0.0, 0.05]), method="verlet",
                      options=dict(separable=True, step_size=H))
    zeros = [h for qp in halves for h in qp if not bool(h.any())]
    # every call but separable=True's three of the field whole has one zero half: zero q or zero p
    assert len(zeros) == len(halves) - 3 and len({id(z) for z in zeros}) == 2
    assert all(not bool(z.any()) and not z.requires_grad for z in zeros)
    (g,) = torch.autograd.grad(p[-1].sum(), k)
    q1, p1 = tgi.odeint(pair, (q0, p0), torch.tensor([0.0, 0.05]), method="verlet",
                        options=dict(separable=True, step_size=H, grad="checkpoint", params=[k]))
    (g1,) = torch.autograd.grad(p1[-1].sum(), k)
    assert torch.equal(p1, p) and (g1 - g).abs() <= 1e-12 * g.abs()
