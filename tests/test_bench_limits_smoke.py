"""Tiny run of experiments.bench.limits (the CPU-limit benchmark), without numba.

numba is optional (the ``bench`` extra); here it is hidden, so the test runs the same everywhere:
the numba rows must be skipped with a note and every ratio taken to the torch hand loop.  Checks
what a run wrote and properties of its numbers that hold at any size (no wall-clock assertions).
"""
import argparse
import json
import pathlib
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from experiments.bench import __main__ as bench_main  # noqa: E402
from experiments.bench import limits  # noqa: E402

CONFIGS = ["torch hand loop", "rollout verlet", "rollout verlet, grad mode on",
           "energies (autograd forces)", "rollout yoshida4", "torchdiffeq rk4"]


@pytest.fixture
def no_numba(monkeypatch):
    real = limits.has
    monkeypatch.setattr(limits, "has", lambda name: False if name == "numba" else real(name))


def test_limits_quick_without_numba(tmp_path, no_numba):
    data = limits.main(["--quick", "--batches", "1", "8", "--steps", "12", "--repeats", "1",
                        "--configs", *CONFIGS, "--sections", "table", "training", "odeint",
                        "midpoint", "compute", "--out", str(tmp_path), "--no-progress",
                        "--threads", "1"])
    md = (tmp_path / "limits.md").read_text()
    assert limits.NO_NUMBA in md and "numba loop" not in md
    saved = json.loads((tmp_path / "limits.json").read_text())["data"]
    assert saved["numba"] is False
    rows = saved["table"]
    assert {(r["config"], r["batch"]) for r in rows} == {(c, b) for c in CONFIGS for b in (1, 8)}
    for r in rows:
        assert r["denominator"] == "torch hand loop" and r["steps"] == 12
        assert r["ratio"] > 0 and r["ns"] > 0 and r["rounds"] >= 1
        # every configuration returned a trajectory that no graph is attached to
        assert r["requires_grad"] is False
        if r["config"] == "torch hand loop":
            assert r["ratio"] == 1.0
        # Verlet in any form computes the hand loop's states to round-off; yoshida4 and rk4
        # differ from it by Verlet's error (12 steps of 0.01 near the pericentre: ~3e-4)
        assert r["max_diff"] < (1e-12 if "verlet" in r["config"] or "energies" in r["config"] else 1e-3)
    assert "| rollout verlet, grad mode on |" in md
    train = {r["config"]: r for r in saved["training"]["rows"]}
    assert train["derivative matching"]["vs_derivative"] == 1.0
    assert train["rollout loss, verlet"]["ms_per_step"] > 0
    assert train["rollout loss, verlet, autograd forces"]["ms_per_step"] > 0
    hnn = saved["hnn_rollouts"]
    assert {r["config"] for r in hnn} == {f"{net}{how} forces" for net in ("", "|q₁ − q₂| features, ")
                                           for how in ("closed-form", "autograd")}
    assert all(r["max_diff"] < 1e-5 for r in hnn)            # float32: the same forces
    ode = saved["odeint"]["rows"]
    assert ode["tgi.odeint verlet separable"]["max_diff"] < 1e-12   # same map, same evaluations
    mid = saved["midpoint"]["rows"]
    assert set(mid) == {"rollout implicit_midpoint", "rollout implicit_midpoint compile=True"}
    assert all(r["max_diff"] < 1e-12 for r in mid.values())
    assert data["numba"] is False
    assert "compute" not in saved       # the compute section needs the numba loops: skipped


def test_limits_training_compiled_section_compiles_both_forces(tmp_path):
    """--sections training_compiled: the training step eager and compile=True, closed-form and
    autograd forces; both compiled rows really ran compiled (no eager fallback) and their first
    loss is eager's (float32)."""
    data = limits.main(["--quick", "--repeats", "1", "--sections", "training_compiled",
                        "--out", str(tmp_path), "--no-progress", "--threads", "1"])
    rows = {r["config"]: r for r in data["training_compiled"]["rows"]}
    assert set(rows) == {f"{f}, {c}" for f in ("closed form", "autograd")
                         for c in ("eager", "compile=True")}
    assert rows["closed form, eager"]["ratio"] == 1.0
    for name, r in rows.items():
        assert r["ran"] == ("compiled" if "compile" in name else "eagerly")
        assert r["ms_per_step"] > 0 and r["first_call_s"] > 0 and r["loss_diff"] < 1e-5
    assert "Training step, eager and compiled" in (tmp_path / "limits.md").read_text()


def test_limits_autograd_rows_really_take_autograd():
    """The bench's "autograd forces" model shares the SeparableHNN's networks and parameters
    but not their closed form: its halves are autograd's, the model's are input_grad."""
    from experiments.bench.limits import autograd_forces
    from torchgeo_int.nn import SeparableHNN

    model = SeparableHNN(2, width=8)
    slow = autograd_forces(model)
    assert list(slow.parameters()) == list(model.parameters())
    assert model.halves()[0] == model.kinetic.input_grad
    assert not getattr(slow.kinetic, "closed_form_grad", False)
    q = torch.randn(3, 2)
    assert torch.allclose(slow.halves()[1](q), model.halves()[1](q), atol=1e-6)


def test_limits_compute_section_compares_every_state_with_final_state(tmp_path, monkeypatch):
    """--sections compute: every state vs final state only, numba loops and compiled rollouts in
    the same rounds.  The numba loops are replaced by the torch hand loop (numba is optional), so
    this checks the section's wiring and that all four compute the same final state."""
    real = limits.has
    monkeypatch.setattr(limits, "has", lambda name: True if name == "numba" else real(name))
    monkeypatch.setattr(limits, "numba_verlet", limits.hand_torch)
    monkeypatch.setattr(limits, "numba_verlet_final",
                        lambda q0, p0, n: tuple(x[-1:] for x in limits.hand_torch(q0, p0, n)))
    data = limits.main(["--quick", "--steps", "32", "--repeats", "1", "--sections", "compute",
                        "--out", str(tmp_path), "--no-progress", "--threads", "1"])
    rows = {r["config"]: r for r in data["compute"]}
    assert set(rows) == {"numba loop, every state", "numba loop, final state only",
                         "rollout compile=True, every state", "rollout compile=True, final state only"}
    assert rows["numba loop, every state"]["ratio"] == 1.0
    assert all(r["batch"] == 256 and r["steps"] == 32 and r["ns"] > 0 for r in rows.values())
    assert all(r["max_diff"] < 1e-12 for r in rows.values())
    floor = data["call_floor"]
    assert floor["error"] is None and floor["us"] > 0 and floor["block"] == 16
    layouts = data["store_layouts"]      # three ways to store a batch-innermost state: same rows
    assert len(layouts) == 3 and all(r["max_diff"] == 0.0 and r["ns_per_value"] > 0 for r in layouts)
    md = (tmp_path / "limits.md").read_text()
    assert "arithmetic and stores" in md and "torch.compile's own cost per call" in md
    assert "row_major_state (torch.where over the components)" in md


def test_limits_loops_are_the_hand_loop_in_scalars():
    """The loops numba jits, run as plain Python: kdk keeps every state of the torch hand loop
    (to round-off), or on two rows its last one, store copies the initial state along."""
    import numpy as np

    q0 = torch.tensor([[0.4, 0.0], [1.0, 0.1], [0.7, -0.2]], dtype=torch.float64)
    p0 = torch.tensor([[0.0, 2.0], [-0.1, 1.0], [0.3, 1.2]], dtype=torch.float64)
    n = 5
    qh, ph = limits.hand_torch(q0, p0, n)
    qs, ps = np.empty((n + 1, 3, 2)), np.empty((n + 1, 3, 2))
    limits._kdk(q0.numpy(), p0.numpy(), limits.H, n, qs, ps)
    assert np.abs(qs - qh.numpy()).max() < 1e-13 and np.abs(ps - ph.numpy()).max() < 1e-13
    q2, p2 = np.empty((2, 3, 2)), np.empty((2, 3, 2))
    limits._kdk(q0.numpy(), p0.numpy(), limits.H, n, q2, p2)
    q, p = q2[n % 2], p2[n % 2]
    assert (q == qs[-1]).all() and (p == ps[-1]).all()
    limits._store(q0.numpy(), p0.numpy(), n, qs, ps)
    assert (qs == q0.numpy()).all() and (ps == p0.numpy()).all()


def test_limits_pivot_puts_the_limit_in_ns_and_the_rest_as_ratios():
    rows = [dict(config="numba loop", batch=1, ns=18.0, ratio=1.0, denominator="numba loop"),
            dict(config="rollout verlet", batch=1, ns=1800.0, ratio=100.0, denominator="numba loop"),
            dict(config="numba loop", batch=64, ns=3.3, ratio=1.0, denominator="numba loop")]
    md = limits.pivot(rows).splitlines()
    assert md[0] == "| configuration | B = 1 | B = 64 |"
    assert md[2] == "| numba loop | 18 ns | 3.3 ns |"
    assert md[3] == "| rollout verlet | ×100 | — |"


def test_limits_is_a_registered_benchmark():
    assert "limits" in bench_main.BENCHES
    assert bench_main._available("limits")[0]


def test_steps_are_capped_and_at_least_the_minimum():
    assert limits.steps_for(1, False) == limits.MAX_STEPS
    assert limits.steps_for(65536, False) == limits.WORK // 65536
    assert limits.steps_for(2 ** 30, False) == limits.MIN_STEPS
    assert limits.steps_for(1, True) == limits.MIN_STEPS


def test_limits_call_floor_is_one_compiled_call(monkeypatch):
    """The compute section's floor: µs per call of a compiled one-op function, compiled with the
    library's inductor options (so with the C++ wrapper where compile=True uses it)."""
    seen = []
    real = limits._compile._inductor_options
    monkeypatch.setattr(limits._compile, "_inductor_options",
                        lambda dev="cpu", numel=0: seen.append((dev, numel)) or real(dev, numel))
    us, err = limits._call_floor(type("Args", (), {"quick": True})(), calls=20)
    assert seen == [("cpu", 2)] and err is None and 0 < us < 1e5
    # a compile that fails is reported, not raised (the section still writes its table)
    monkeypatch.setattr(limits._compile, "_inductor_options",
                        lambda dev="cpu", numel=0: {"no_such_inductor_option": True})
    us, err = limits._call_floor(type("Args", (), {"quick": True})(), calls=20)
    assert us != us and err


def test_limits_small_rows_time_the_compiled_loop(monkeypatch):
    """The small section's final-state row runs the compiled loop (its failure would be an error
    in the row, not a silent fallback to blocks), and says which way it ran."""
    monkeypatch.setattr(limits, "SMALL_ROWS", [(True, False, True), (True, False, True, True)])
    rows = []
    limits._small_rows(argparse.Namespace(quick=True), 32, rows)
    for row, system in zip(rows, ("closed form", "energies")):   # energies: loops too
        assert row["how"] == "compiled loops" and row["states"] == "final"
        assert row["system"] == system
        assert row["error"] is None and row["us_per_step"] > 0 and row["first_call_s"] > 0
    assert len(rows) == 2


def test_cold_first_call_runs_a_fresh_process_and_reports_its_failure(monkeypatch):
    """The small section's first calls run after earlier compiles in the same process (the
    table's), so torch.compile's start-up was not in them (1.3–2.2 s against 13–15 s cold): the
    user's first call is timed in a fresh process with an empty inductor cache."""
    s, err = limits.cold_first_call(16)
    assert err is None and s > 0
    monkeypatch.setattr(limits, "H", "not_a_step")      # the child fails: reported, not raised
    s, err = limits.cold_first_call(16)
    assert s != s and err.startswith("exit 1") and "NameError" in err
