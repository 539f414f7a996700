"""Port-Hamiltonian models (torchgeo_int.nn.dissipative) and tiny runs of the studies
experiments/dissipative.py and experiments/constraints_longtime.py."""
import json
import math
import pathlib
import sys

import pytest
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


def test_a_loss_without_control_keeps_the_models_control():
    """control=None uses the control already set (the losses leave theirs set); a model with an
    input map and no control at all is refused with the reason."""
    m = _model(n_controls=1)
    q, p = torch.randn(3, 4, 2, dtype=DT), torch.randn(3, 4, 2, dtype=DT)
    w = dict(dt=0.1, layout="windows")      # (random windows: no axis looks like time)
    with pytest.raises(ValueError, match="an input map was given but no control"):
        forced_rollout_loss(m, q, p, **w)
    u = torch.tensor([0.7], dtype=DT)
    with_u = forced_rollout_loss(m, q, p, control=u, **w)
    assert torch.equal(forced_rollout_loss(m, q, p, **w), with_u)
    assert not torch.equal(forced_rollout_loss(m, q, p, control=-u, **w), with_u)


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
    stem = "dissipative_quick_controlled_3steps_ours_midpoint_dhnn_fd_node"   # tasks, budget, arms
    saved = json.loads((tmp_path / f"{stem}.json").read_text())
    assert saved == json.loads(json.dumps(rep))
    assert "## controlled" in (tmp_path / f"{stem}.md").read_text()
    assert (tmp_path / "dissipative_quick_controlled_3steps.png").stat().st_size > 0
    assert sorted(saved["tasks"]) == ["controlled"]
    s = saved["tasks"]["controlled"]
    for arm in ("ours_midpoint", "dhnn_fd", "node"):
        assert math.isfinite(s[arm]["state_mse"][0]) and s[arm]["state_mse"][0] >= 0


def test_dissipative_study_learns_the_damping(tmp_path):
    """300 Adam steps of the forced-midpoint arm on the 4 quick damped trajectories recover
    c = 0.15 to 2e-3 (seeds 0-3: 0.1515-0.1518); the initial model has c ≈ 0.097 and 100 steps
    give 0.116, so the check needs the --steps budget to reach training and the learned damping
    to be read off the model correctly (ṗ = −C M⁻¹ p)."""
    from experiments import dissipative
    rep = dissipative.main(["--quick", "--tasks", "damped", "--steps", "300", "--arms",
                            "ours_midpoint", "--out", str(tmp_path)])
    assert rep["config"]["steps"] == 300
    c = rep["tasks"]["damped"]["ours_midpoint"]["damping"][0]
    assert abs(c - dissipative.C_TRUE) < 0.01, c
    saved = json.loads((tmp_path / "dissipative_quick_damped_300steps_ours_midpoint.json").read_text())
    assert saved["tasks"]["damped"]["ours_midpoint"]["damping"][0] == c


def test_constraints_longtime_quick(tmp_path):
    """45 steps: all of them are taken (not 10 × 4) and every tenth reports the max over its own
    states, a real nonzero energy error (sampling every 10th step left 0.0 in tenths without a
    sample)."""
    from experiments import constraints_longtime
    rep = constraints_longtime.main(["--steps", "45", "--out", str(tmp_path)])
    assert rep["steps_done"] == 45
    errs = rep["energy_err_per_tenth"]
    assert len(errs) == 10 and all(math.isfinite(e) and 1e-9 < e < 1e-1 for e in errs), errs
    assert errs[0] < min(errs[1:])              # the run starts at E_0: its first tenth is the lowest
    assert rep["max_g"] < 1e-12 and rep["max_hidden"] < 1e-12
    assert json.loads((tmp_path / "constraints_longtime.json").read_text())["max_g"] == rep["max_g"]
    nan = float("nan")
    assert math.isnan(constraints_longtime._max(1.0, nan))      # a NaN is not hidden by the max
    assert math.isnan(constraints_longtime._max(nan, 1.0))


def test_forced_losses_name_a_dtype_mismatch():
    """A float32 model with float64 windows: the library's placement error, not torch's matmul
    message from inside the network."""
    import pytest
    m = PortHamiltonianNN(1, width=8).float()
    q, p = torch.randn(3, 4, 1, dtype=DT), torch.randn(3, 4, 1, dtype=DT)
    with pytest.raises(TypeError, match="float32 but q is torch.float64"):
        forced_residual_loss(m, q, p, dt=0.1, layout="windows")   # (random windows)
    with pytest.raises(TypeError, match="float32 but q is torch.float64"):
        forced_derivative_loss(m, q, p, q, p)
    with pytest.raises(TypeError, match="float32 but q is torch.float64"):
        forced_rollout_loss(m, q, p, dt=0.1, layout="windows")
