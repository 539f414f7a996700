"""Port-Hamiltonian models (torchgeo_int.nn.dissipative) and tiny runs of the studies
experiments/dissipative.py and experiments/constraints_longtime.py."""
import json
import math
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torchgeo_int as tgi  # noqa: E402
from torchgeo_int.nn import (PortHamiltonianNN, forced_derivative_loss, forced_residual_loss,  # noqa: E402
                             forced_rollout_loss)

DT = torch.float64


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    return PortHamiltonianNN(2, width=16, **kw)


def test_damping_is_psd_and_dissipates():
    for damping in ("constant", "state"):
        m = _model(damping=damping)
        with torch.no_grad():
            for prm in m.parameters():
                prm.add_(0.3 * torch.randn_like(prm))
        q, p = torch.randn(50, 2, dtype=DT), torch.randn(50, 2, dtype=DT)
        C = m._damping_fn(q).detach()
        assert float(torch.linalg.eigvalsh(C).min()) > -1e-12
        assert float(m.dissipation(q, p).detach().min()) >= 0.0


def test_losses_vanish_on_the_models_own_steps():
    """Data made by the forced implicit midpoint of the model (with a control) are exact steps of
    the forced cotangent lift: the forced residual loss of the midpoint map and the rollout loss
    of the same method are zero to round-off; derivative matching on finite differences is not."""
    m = _model(n_controls=1, damping="state")
    ph = torch.rand(3, 1, dtype=DT)
    u = lambda t: torch.sin(1.3 * t + ph)
    q0, p0 = torch.randn(3, 2, dtype=DT), torch.randn(3, 2, dtype=DT)
    m.control = u
    with torch.no_grad():
        q, p = tgi.rollout(m, q0, p0, h=0.2, steps=4, method="implicit_midpoint")
    q, p = q.transpose(0, 1).contiguous(), p.transpose(0, 1).contiguous()
    assert float(forced_residual_loss(m, q, p, dt=0.2, control=u)) < 1e-20   # (solver tolerance)²
    assert float(forced_rollout_loss(m, q, p, dt=0.2, control=u, method="implicit_midpoint")) < 1e-20
    dq, dp = tgi.nn.finite_differences(q, p, 0.2)
    assert float(forced_derivative_loss(m, q, p, dq, dp, dt=0.2, control=u)) > 1e-8


def test_training_through_forced_verlet_reduces_the_loss():
    m = _model(n_controls=1)
    target = _model(seed=1, n_controls=1)
    ph = torch.rand(4, 1, dtype=DT)
    u = lambda t: 0.5 * torch.sin(t + ph)
    target.control = u
    with torch.no_grad():
        q, p = tgi.rollout(target, torch.randn(4, 2, dtype=DT), torch.randn(4, 2, dtype=DT), h=0.1,
                           steps=3, method="verlet")
    q, p = q.transpose(0, 1).contiguous(), p.transpose(0, 1).contiguous()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    losses = []
    for _ in range(4):
        loss = forced_rollout_loss(m, q, p, dt=0.1, control=u, method="verlet")
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    assert all(prm.grad is not None for prm in m.parameters())


def test_dissipative_study_quick(tmp_path):
    from experiments import dissipative
    rep = dissipative.main(["--quick", "--out", str(tmp_path), "--tasks", "controlled"])
    saved = json.loads((tmp_path / "dissipative.json").read_text())
    assert (tmp_path / "dissipative.md").stat().st_size > 0
    assert (tmp_path / "dissipative_controlled.png").stat().st_size > 0
    s = saved["tasks"]["controlled"]
    for arm in ("ours_midpoint", "dhnn_fd", "node"):
        assert math.isfinite(s[arm]["state_mse"][0]) and s[arm]["state_mse"][0] >= 0
    assert s["ours_midpoint"]["damping"][0] >= 0          # PSD by construction
    assert rep["config"]["seeds"] == 1


def test_constraints_longtime_quick(tmp_path):
    from experiments import constraints_longtime
    rep = constraints_longtime.main(["--steps", "40", "--out", str(tmp_path)])
    assert rep["steps_done"] == 40 and len(rep["energy_err_per_tenth"]) == 10
    assert rep["max_g"] < 1e-12 and rep["max_hidden"] < 1e-12
    assert json.loads((tmp_path / "constraints_longtime.json").read_text())["max_g"] == rep["max_g"]


def test_forced_losses_name_a_dtype_mismatch():
    """A float32 model with float64 windows: the library's placement error, not torch's matmul
    message from inside the network."""
    import pytest
    m = PortHamiltonianNN(1, width=8).float()
    q, p = torch.randn(3, 4, 1, dtype=DT), torch.randn(3, 4, 1, dtype=DT)
    with pytest.raises(TypeError, match="float32 but q is torch.float64"):
        forced_residual_loss(m, q, p, dt=0.1)
    with pytest.raises(TypeError, match="float32 but q is torch.float64"):
        forced_derivative_loss(m, q, p, q, p)
    with pytest.raises(TypeError, match="float32 but q is torch.float64"):
        forced_rollout_loss(m, q, p, dt=0.1)
