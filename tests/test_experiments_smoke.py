"""Tiny runs of the benchmark scripts and the demo, so that they cannot rot.

Each runs its real code path at toy sizes into a temporary folder and checks what it wrote and a
property of its numbers that must hold at any size (no wall-clock assertions).
"""
import json
import math
import pathlib
import shutil
import sys
import types

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torchgeo_int as tgi  # noqa: E402
from experiments import demo, gpu_check  # noqa: E402
from experiments.bench import __main__ as bench_main  # noqa: E402
from experiments.bench import common, gpu, throughput, training_cost, work_precision  # noqa: E402
from experiments.bench import splitting_wp  # noqa: E402

QUIET = ["--no-progress", "--threads", "1"]


def _load(out, stem):
    for ext in ("md", "json"):
        assert (out / f"{stem}.{ext}").stat().st_size > 0
    return json.loads((out / f"{stem}.json").read_text())["data"]


def test_problems_match_the_shared_test_problems_and_their_references():
    from problems import kepler_initial, outer_solar_system

    k = common.kepler(0.6)
    q0, p0 = kepler_initial(0.6)
    assert torch.equal(k.q0, q0) and torch.equal(k.p0, p0)
    oss = common.outer_solar_system()
    sys_t, q0t, p0t = outer_solar_system()
    assert torch.allclose(oss.q0, q0t) and torch.allclose(oss.p0, p0t)
    assert torch.allclose(oss.energy(oss.q0, oss.p0), sys_t.energy(q0t, p0t), rtol=1e-14)
    # the analytic force is −∇V
    q = oss.q0.clone().requires_grad_()
    (g,) = torch.autograd.grad(oss.system.potential(q), q)
    assert torch.allclose(oss.system.force(oss.q0), -g, rtol=1e-12, atol=0)
    # the numpy reference and our kahan_li8 at a small step agree
    qr, pr = common.reference(k, 3.0)
    with torch.no_grad():
        q, p = tgi.rollout(k.system, k.q0, k.p0, h=3.0 / 600, steps=600, method="kahan_li8",
                           save_every=600)
    assert common.state_error(q[-1], p[-1], qr, pr) < 1e-10


def test_splitting_wp_tiny(tmp_path):
    data = splitting_wp.main(["--quick", "--problems", "outer_solar_system", "--methods", "verlet",
                              "blanes_moan4", "processed_bcm6", "--out", str(tmp_path), *QUIET])
    saved = _load(tmp_path, "splitting_wp_outer_solar_system")
    assert (tmp_path / "splitting_wp_outer_solar_system.png").exists()
    res = saved["outer_solar_system"]["results"]
    assert {"verlet", "blanes_moan4", "processed_bcm6", "wh_saba2"} <= set(res)
    for name, rows in res.items():
        ok = [r for r in rows if "energy_error" in r]
        assert ok, name
        m = splitting_wp._method(name)
        for r in ok:
            # counted force evaluations: N steps × evaluations per step, plus the first FSAL
            # force and (processed) π⁻¹ once and π at each of the 100 saved states
            assert r["evals"] >= r["N"] * splitting_wp.evaluations_per_step(m)
    # the Kepler-drift SABA_2 beats the T+V Verlet by far at equal force evaluations
    assert any("wh_saba2" in k for k in data["outer_solar_system"]["goals"])


def test_work_precision_tiny(tmp_path):
    data = work_precision.main(["--quick", "--problems", "kepler", "--methods", "verlet",
                                "implicit_midpoint", "rk4", "dopri5", "--long-time", "400",
                                "--out", str(tmp_path), *QUIET])
    saved = _load(tmp_path, "work_precision")
    assert set(saved) == {"kepler", "long_time"}
    assert (tmp_path / "work_precision_kepler.png").exists() and (tmp_path / "long_time_energy.png").exists()
    res = data["kepler"]["results"]
    assert set(res) == {"verlet", "implicit_midpoint", "rk4", "dopri5"}
    # second order: each halving of h divides verlet's error by about 4
    errs = [r["error"] for r in res["verlet"]]
    assert all(2.5 < a / b < 6 for a, b in zip(errs, errs[1:])), errs
    assert [r["evals"] for r in res["verlet"]] == [r["N"] + 1 for r in res["verlet"]]  # FSAL
    assert all(r["evals"] > r["N"] for r in res["implicit_midpoint"])    # iterations
    rows = {r["method"]: r for r in data["long_time"]["rows"]}
    assert rows["verlet"]["max_rel_energy_error"] < 1e-4


def test_throughput_tiny_hand_loops_match_ours(tmp_path):
    rows = throughput.main(["--quick", "--batches", "3", "--steps", "32", "--repeats", "1",
                            "--configs", "hand_verlet", "verlet", "hand_yoshida4", "yoshida4",
                            "torchdiffeq_rk4", "--out", str(tmp_path), *QUIET])
    _load(tmp_path, "throughput")
    by = {r["config"]: r for r in rows}
    # each against its own method's hand loop (the pair whose ratio is reported)
    assert by["verlet"]["max_diff_vs_first"] < 1e-12
    assert by["yoshida4"]["max_diff_vs_first"] < 1e-12
    assert by["torchdiffeq_rk4"]["max_diff_vs_first"] > 1e-8   # no hand loop: vs the first row
    assert all(r["throughput"] > 0 and r["kernels_per_step"] > 0 for r in rows)
    # the hand-written yoshida4 is our yoshida4, to round-off
    system, q0, p0 = throughput.kepler_batch(3)
    with torch.no_grad():
        qh, ph = throughput.hand_splitting("yoshida4")(q0, p0, 20, throughput.H)
        q, p = tgi.rollout(system, q0, p0, h=throughput.H, steps=20, method="yoshida4")
        qm, pm = throughput.hand_midpoint(q0, p0, 20, throughput.H)
        q2, p2 = tgi.rollout(system, q0, p0, h=throughput.H, steps=20, method="implicit_midpoint")
    assert (qh - q[-1]).abs().max() < 1e-13 and (ph - p[-1]).abs().max() < 1e-13
    assert (qm - q2[-1]).abs().max() < 1e-12 and (pm - p2[-1]).abs().max() < 1e-12


def test_training_cost_tiny(tmp_path):
    rows = training_cost.main(["--batch", "8", "--window", "2", "--repeats", "1", "--width", "16",
                               "--out", str(tmp_path), *QUIET])
    _load(tmp_path, "training_cost")
    by = {r["config"]: r for r in rows}
    assert len(by) == 7 and all(r["finite"] and r["ms_per_step"] > 0 for r in rows)
    # the adjoint keeps no graph in the forward; backprop through rk4 does
    assert by["neural ODE rk4 adjoint"]["saved_fwd_MiB"] < by["neural ODE rk4 backprop"]["saved_fwd_MiB"]
    # the implicit steps' backward solves build graphs of their own
    assert by["rollout HNN implicit_midpoint"]["saved_bwd_MiB"] > 0


def test_gpu_script_runs_on_cpu(tmp_path):
    """The GPU table's script on the CPU, with its rows that only it asks for: the hand loop
    compiled (the GPU's limit) and the energy-defined Kepler; each equals the hand loop."""
    configs = ("hand_verlet", "verlet", "hand_verlet+compile", "verlet(energies)")
    rows = gpu.main(["--batches", "4", "--steps", "32", "--repeats", "1", "--configs", *configs,
                     "--out", str(tmp_path), *QUIET])
    data = _load(tmp_path, "gpu")
    assert {(r["dtype"], r["config"]) for r in rows} == {
        (d, c) for d in ("float32", "float64") for c in configs}
    for r in rows:
        assert r["max_diff_vs_first"] < (1e-5 if r["dtype"] == "float32" else 1e-12)
    assert {"verlet(energies) / verlet", "verlet / hand_verlet"} <= {
        r["ratio"] for r in data["ratios"]}


def test_gpu_check_compares_device_and_cpu_and_reports_a_broken_path(tmp_path, monkeypatch):
    # On the CPU the "device" is the CPU: every row that runs must agree exactly.
    out = tmp_path / "gc"
    code = gpu_check.main(["--device", "cpu", "--out", str(out), "--only", "eager, every state",
                           "grad=checkpoint", "odeint verlet", "MemoryError"])
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert code == 0 and len(rows) == 4 and all(r["passed"] for r in rows)
    assert all(r["max_abs_diff"] == 0.0 for r in rows)
    assert "| rollout verlet eager, every state | yes |" in out.with_suffix(".md").read_text()

    def broken(dev):
        raise RuntimeError("Expected all tensors to be on the same device")

    def moved(dev):   # a path whose result leaves the device it was asked for
        return torch.zeros(3, device="meta")
    monkeypatch.setattr(gpu_check, "CHECKS", [("broken path", broken, 1e-9),
                                              ("moved result", moved, 1e-9)])
    code = gpu_check.main(["--device", "cpu", "--out", str(out)])
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert code == 1 and not any(r["passed"] for r in rows)
    assert "same device" in rows[0]["error"] and "not cpu" in rows[1]["error"]


def test_demo_tiny_and_without_the_hnn_part(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "experiments.hnn", None)   # import fails: a note, no crash
    demo.main(["--fraction", "0.02", "--problems", "kepler", "--out", str(tmp_path)])
    text = capsys.readouterr().out
    assert "HNN demo: skipped" in text and text.count("HNN demo") == 1
    for f in ("integrators.md", "integrators.json", "energy_error.png", "orbits.png"):
        assert (tmp_path / f).stat().st_size > 0
    rows = {r["method"]: r for r in json.loads((tmp_path / "integrators.json").read_text())
            ["problems"]["kepler"]["rows"]}
    assert set(rows) == {m for m, _ in demo.METHODS}
    # about equal force evaluations, and order 8 beats order 2 on the energy at that cost
    assert abs(rows["kahan_li8"]["evals"] - rows["verlet"]["evals"]) < 0.05 * rows["verlet"]["evals"]
    assert rows["kahan_li8"]["max_rel_energy_error"] < rows["verlet"]["max_rel_energy_error"]


def test_bench_main_runs_each_and_reports_failures(tmp_path, monkeypatch):
    calls = []

    def fake(name):
        def main(argv):
            calls.append((name, argv))
            if name.endswith("training_cost"):
                raise RuntimeError("boom")
        return types.SimpleNamespace(main=main)

    monkeypatch.setattr(bench_main.importlib, "import_module", fake)
    code = bench_main.main(["--quick", "--out", str(tmp_path), "--skip", "memory"])
    names = [n.rsplit(".", 1)[-1] for n, _ in calls]
    assert names[:3] == ["throughput", "limits", "training_cost"]   # work_precision: --all only
    assert ("gpu" in names) == torch.cuda.is_available()
    assert all("--quick" in argv and str(tmp_path) in argv for _, argv in calls)
    assert code == 1
    index = (tmp_path / "index.md").read_text()
    assert "training_cost | FAILED" in index and "[throughput.md](throughput.md)" in index
    assert "work_precision | not run" in index
    calls.clear()
    bench_main.main(["--quick", "--all", "--out", str(tmp_path), "--skip", "memory", "gpu"])
    assert [n.rsplit(".", 1)[-1] for n, _ in calls] == ["throughput", "limits", "work_precision",
                                                          "training_cost"]


def test_hnn_study_tiny_run_and_merge(tmp_path, capsys):
    """experiments.hnn.run at a toy budget: report, ratios to arm (a), figures, saved rollouts;
    --merge reruns one arm into the report (same per-seed numbers: training is seeded) and
    refuses a report of another budget.  Implicit arms are evaluated with Newton solves."""
    from experiments.hnn import run as hnn_run
    from experiments.hnn.train import evaluation_method

    args = dict(quick=True, seeds=1, steps=5, batch_size=16, out=tmp_path, progress=False)
    rep = hnn_run.run("spring", arm_keys=["a", "b1", "c"], **args)
    assert set(rep["arms"]) == {"a", "b1", "c"} and set(rep["ratios_to_a"]) == {"b1/a", "c/a"}
    for suffix in (".json", ".md", "_phase.png", "_energy.png", "_trajectories.pt"):
        assert (tmp_path / f"hnn_spring{suffix}").stat().st_size > 0
    assert "| failed |" in (tmp_path / "hnn_spring.md").read_text()
    assert all(a["summary"]["failed_seeds"] == [] for a in rep["arms"].values())
    # a failed rollout (inf) is counted, not averaged in
    assert hnn_run._mean_se([1.0, 3.0, float("inf")]) == (2.0, 1.0)
    assert hnn_run._mean_se([float("inf")]) == (None, None)
    rows = [{"seed": 0, "energy_mse": 1.0, "eps_H": 0.1}, {"seed": 1, "energy_mse": 3.0, "eps_H": 0.3},
            {"seed": 2, "energy_mse": float("inf"), "eps_H": 9.0, "failed": "ConvergenceError"}]
    s = hnn_run._summary(rows)          # every metric over the same seeds: the failed one's ε_H too
    assert s["energy_mse"]["mean"] == 2.0 and s["eps_H"]["mean"] == pytest.approx(0.2)
    assert s["failed_seeds"] == [2]
    merged = hnn_run.run("spring", arm_keys=["c"], merge=True, **args)
    assert list(merged["arms"]) == ["a", "b1", "c"]
    for key in ("a", "b1", "c"):
        assert merged["arms"][key]["per_seed"][0]["energy_mse"] == rep["arms"][key]["per_seed"][0]["energy_mse"]
    # the merge kept the earlier arms' seed-0 rollouts (it wrote over them with its own only, so
    # no merge ever redrew the figures)
    assert set(torch.load(tmp_path / "hnn_spring_trajectories.pt", weights_only=True)) == {"a", "b1", "c"}
    assert "were not redrawn" not in capsys.readouterr().out
    # an arm merged from another shooting setting keeps its own label and settings
    hnn_run.run("spring", arm_keys=["e"], **dict(args, out=tmp_path / "sh"))
    other = hnn_run.run("spring", arm_keys=["f"], merge=True, shooting=dict(segment=4, gauss_newton=0),
                        **dict(args, out=tmp_path / "sh"))
    assert "single shooting" in other["arms"]["e"]["label"] and other["arms"]["e"]["shooting"]["segment"] is None
    assert other["arms"]["f"]["shooting"]["segment"] == 4
    with pytest.raises(ValueError, match="was run with"):
        hnn_run.run("spring", arm_keys=["c"], merge=True, **dict(args, steps=6))
    with pytest.raises(ValueError, match="was run with"):   # another lr schedule: another budget
        hnn_run.run("spring", arm_keys=["c"], merge=True, lr_schedule=None, **args)
    with pytest.raises(ValueError, match="was run with"):   # another draw of the data
        hnn_run.run("spring", arm_keys=["c"], merge=True, data_seed=1, **args)
    with pytest.raises(ValueError, match="was run with"):   # another weight decay
        hnn_run.run("spring", arm_keys=["c"], merge=True, weight_decay=0.0, **args)
    with pytest.raises(ValueError, match="weight_decay must be"):
        hnn_run.run("spring", arm_keys=["a"], weight_decay=-1.0, **args)
    wd0 = hnn_run.run("spring", arm_keys=["a"], weight_decay=0.0, **dict(args, out=tmp_path / "wd0"))
    assert rep["weight_decay"] == hnn_run.CONFIG["spring"]["weight_decay"] > 0
    assert wd0["weight_decay"] == 0.0 and "weight decay 0.0" in (tmp_path / "wd0" / "hnn_spring.md").read_text()
    assert wd0["arms"]["a"]["per_seed"][0]["energy_mse"] != rep["arms"]["a"]["per_seed"][0]["energy_mse"]
    other = hnn_run.run("spring", arm_keys=["a"], data_seed=1, **dict(args, out=tmp_path / "d1"))
    assert rep["data"]["seed"] == 0 and other["data"]["seed"] == 1
    assert other["arms"]["a"]["per_seed"][0]["energy_mse"] != rep["arms"]["a"]["per_seed"][0]["energy_mse"]
    m = evaluation_method("implicit_midpoint")
    assert isinstance(m, tgi.CotangentLiftIntegrator) and m.solver == "newton" and m.alpha == 0.5
    assert m.max_iter >= 400     # a stiff learned field needed 400 Newton iterations (pendulum, (c))
    assert evaluation_method("verlet") == "verlet"


def test_torchdiffeq_master_runs_our_side_and_says_why_not_theirs(tmp_path, capsys):
    """Without --torchdiffeq-src only our side runs and the report says how to get theirs; a
    folder without the torchdiffeq package is refused before any child starts."""
    from experiments.bench import torchdiffeq_master

    data = torchdiffeq_master.main(["--batches", "2", "--steps", "16", "--out", str(tmp_path), *QUIET])
    assert torchdiffeq_master.NOT_RUN in capsys.readouterr().err
    saved = _load(tmp_path, "torchdiffeq_master")
    assert saved["torchdiffeq_master"] is None and saved["agreement"] == []
    md = (tmp_path / "torchdiffeq_master.md").read_text()
    assert f"## torchdiffeq master\n\nNot run: {torchdiffeq_master.HOW}." in md
    assert torchdiffeq_master.NOT_RUN not in md               # (the heading names it once)
    assert (tmp_path / "torchdiffeq_master.png").stat().st_size > 0
    by = {r["method"]: r for r in data["rows"]}
    assert set(by) == {"implicit_midpoint", "verlet"} and all(r["side"] == "ours" for r in data["rows"])
    assert all(r["status"] == "ok" and r["seconds"] > 0 for r in data["rows"])
    # the implicit step iterates; verlet on a separable field calls func twice a step (kick,
    # drift), and seven times once to check separable=True: 16 steps keep that under 3 a step
    assert by["verlet"]["evals_per_step"] < 3 < by["implicit_midpoint"]["evals_per_step"]
    with pytest.raises(SystemExit, match="no torchdiffeq/__init__.py"):
        torchdiffeq_master.main(["--torchdiffeq-src", str(tmp_path), "--out", str(tmp_path), *QUIET])
    for flag, bad in [("--steps", "0"), ("--max-batch", "0"), ("--batches", "-2"), ("--h", "0"),
                      ("--cell-timeout", "-1")]:            # not a silent default, not a crash later
        with pytest.raises(SystemExit) as e:
            torchdiffeq_master.main([flag, bad, "--out", str(tmp_path), *QUIET])
        assert e.value.code == 2
    assert "must be" in capsys.readouterr().err


def test_hnn_diagnose_tiny(tmp_path, capsys):
    """experiments.hnn.diagnose: the shooting arms' training log (loss, defect, node-state error
    against the replayed clean states, ε_H, energy MSE, h·ω) on a development seed."""
    from experiments.hnn import diagnose

    diagnose.main(["--arms", "e", "--steps", "4", "--every", "2", "--schedule", "cosine",
                   "--out", str(tmp_path), "--tag", "t"])
    rep = json.loads((tmp_path / "diagnose_pendulum_t.json").read_text())
    rows = rep["arms"]["e"]["rows"]
    assert [r["step"] for r in rows] == [0, 2, 4] and rep["seed"] == rep["data_seed"] == 100
    assert 0.1 < rows[0]["node_err"] < 0.2          # the observations: σ = 0.1 on q and on p
    assert all(math.isfinite(r["eps_H"]) and r["hw_max"] > 0 for r in rows)
    assert "| step | loss | defect |" in (tmp_path / "diagnose_pendulum_t.md").read_text()
    # noise-free two-body: the observations are the clean states (node error 0 before training)
    diagnose.main(["--task", "twobody", "--trajectories", "10", "--arms", "e", "--steps", "2",
                   "--every", "2", "--batch-size", "8", "--out", str(tmp_path), "--tag", "t"])
    rows = json.loads((tmp_path / "diagnose_twobody_t.json").read_text())["arms"]["e"]["rows"]
    assert rows[0]["node_err"] < 1e-6 and all(math.isfinite(r["eps_H"]) for r in rows)
    # --oracle-states: the node states are the clean ones and stay so (nothing solved or learned)
    # for the shooting arms; a plain arm beside them runs as usual, and that is said
    capsys.readouterr()
    diagnose.main(["--task", "twobody_noisy", "--trajectories", "10", "--arms", "e,a", "--steps",
                   "2", "--every", "1", "--batch-size", "8", "--oracle-states", "--out",
                   str(tmp_path), "--tag", "o"])
    assert "arm(s) a have no node states and run as usual" in capsys.readouterr().out
    rep = json.loads((tmp_path / "diagnose_twobody_noisy_o.json").read_text())
    rows = rep["arms"]["e"]["rows"]
    assert rep["oracle_states"] and rep["oracle_arms"] == ["e"] and set(rep["arms"]) == {"e", "a"}
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert max(r["node_err"] for r in rows) < 1e-6 and rows[-1]["loss"] != rows[0]["loss"]
    # an unknown arm is named before any training
    with pytest.raises(SystemExit):
        diagnose.main(["--task", "twobody_noisy", "--trajectories", "10", "--steps", "2",
                       "--arms", "e,zz", "--out", str(tmp_path), "--tag", "x"])
    assert "unknown arm(s) zz" in capsys.readouterr().err
    assert not (tmp_path / "diagnose_twobody_noisy_x.json").exists()
    assert diagnose.spikes([3.0, 2.0, 1.0, 1.1, 1.0, 1.2, 1.3], start=0, rise=0.05) == \
        {"steps_above": 3, "max_rise": pytest.approx(0.3), "onsets": [4, 6]}


def test_hnn_evaluate_records_a_failed_rollout(monkeypatch):
    """A rollout whose implicit step has no solution is a failed seed (inf metrics, the reason,
    no trajectory), and ε_H — a property of the learned H, not of its rollout — is still measured."""
    from experiments.hnn import data as datasets
    from experiments.hnn import train as hnn_train

    task = datasets.spring(0)
    arm = {a.key: a for a in hnn_train.arms(task)}["c"]
    model = hnn_train.build_model(arm, task, width=8, depth=1)

    def no_step(*args, **kwargs):
        raise tgi.ConvergenceError("newton: did not converge", iterations=500, residual=0.5,
                                   tol=1e-14, step=3)

    monkeypatch.setattr(hnn_train, "rollout_model", no_step)
    metrics, traj = hnn_train.evaluate(model, arm, task)
    assert traj is None and "ConvergenceError" in metrics["failed"]
    assert metrics["energy_mse"] == metrics["state_mse"] == float("inf")
    assert math.isfinite(metrics["eps_H"]) and metrics["eps_H"] > 0


def test_demo_hnn_part_is_a_fixed_budget_and_repeats(tmp_path):
    """The demo's HNN part trains every arm for the same seeded number of steps, so two runs give
    the same numbers (a wall-clock budget gave a different ratio on every machine); (g″)
    evaluates (g)'s model, not a second training; the figures are drawn."""
    from experiments.hnn import demo_hnn

    runs = [demo_hnn(steps=2, progress=False, out=tmp_path if i else None) for i in range(2)]
    names = ("trajectory_fit", "trajectory_fit_dopri5", "derivative_matching", "derivative_matching_fd")
    for name in names:
        assert runs[0][name]["steps"] == 2
        assert runs[0][name]["energy_mse"] == runs[1][name]["energy_mse"]
    r = runs[0]
    assert r["trajectory_fit"]["train_seconds"] == r["trajectory_fit_dopri5"]["train_seconds"]
    assert r["trajectory_fit"]["eps_H"] == r["trajectory_fit_dopri5"]["eps_H"]       # one model
    assert r["trajectory_fit"]["energy_mse"] != r["trajectory_fit_dopri5"]["energy_mse"]
    assert r["energy_mse_ratio"] == (r["trajectory_fit_dopri5"]["energy_mse"]
                                     / r["derivative_matching"]["energy_mse"])
    assert (tmp_path / "hnn_spring_energy.png").exists() and (tmp_path / "hnn_spring_phase.png").exists()
    with pytest.raises(ValueError, match="steps"):
        demo_hnn(steps=0)
    with pytest.raises(ValueError, match="unknown task"):
        demo_hnn(steps=1, task="spring_typo")


def test_solver_history_captured_and_args_forms_agree(tmp_path):
    """experiments/solver_history.py: the closure-capturing midpoint it times against is the
    same map with the same gradients as the library's."""
    import experiments.solver_history as sh
    rows, agree = sh.main(["--steps", "4", "--batch", "3", "--out", str(tmp_path / "results")])
    assert len(rows) == 4 and agree < 1e-12
    assert (tmp_path / "results" / "solver_history.md").stat().st_size > 0


def test_hnn_study_shooting_arms_tiny(tmp_path, monkeypatch, capsys):
    """The arms (e), (e′), (f) at a toy budget, on noisy two-body and spring: (f) reuses (e)'s
    trained model (same training seconds, same ε_H of the uncorrected model is not asserted: it
    is corrected), the shooting settings are in the report, ε_H is reported for every
    Hamiltonian arm, and compare_rankings reads two reports."""
    from experiments.hnn import data as hnn_data
    from experiments.hnn import run as hnn_run
    from experiments.hnn import train as hnn_train

    def small(make):
        def task(seed=0, **kw):
            t = make(seed, **kw)
            t.q_eval, t.p_eval = t.q_eval[:2, :9], t.p_eval[:2, :9]      # 2 ICs, 8 steps
            t.q_points, t.p_points = t.q_points[:20], t.p_points[:20]
            return t
        return task

    monkeypatch.setitem(hnn_data.TASKS, "spring", small(hnn_data.spring))
    monkeypatch.setitem(hnn_data.TASKS, "twobody_noisy", small(hnn_data.twobody_noisy))
    monkeypatch.setattr(hnn_train, "EVAL_RTOL", 1e-5)
    args = dict(quick=True, seeds=1, steps=2, batch_size=8, out=tmp_path, progress=False)
    keys = ["a", "b5", "e", "e4", "g", "f", "f_v"]
    rep = hnn_run.run("spring", arm_keys=keys, shooting=dict(segment=4, continuity=0.5, derivative_weight=0.5),
                      **args)
    arms = rep["arms"]
    assert set(arms) == set(keys)
    assert rep["shooting"]["segment"] == 4 and rep["shooting"]["continuity"] == 0.5
    assert rep["shooting"]["derivative_weight"] == 0.5 and "derivative matching" in arms["g"]["label"]
    assert arms["g"]["per_seed"][0]["final_loss"] != arms["e"]["per_seed"][0]["final_loss"]   # (g) sees the derivatives
    e, f = arms["e"]["per_seed"][0], arms["f"]["per_seed"][0]
    assert e["train_seconds"] == f["train_seconds"] == arms["f_v"]["per_seed"][0]["train_seconds"]
    assert e["eps_H"] != f["eps_H"]                 # (f) is evaluated on the corrected H
    assert all("eps_H" in a["per_seed"][0] for a in arms.values())
    assert "yoshida4" in arms["e4"]["label"] and "Arms by energy mse" in (tmp_path / "hnn_spring.md").read_text()
    batches, fit = [], hnn_train.fit

    def spy(*a, **k):
        batches.append(k["batch_size"])
        return fit(*a, **k)
    monkeypatch.setattr(hnn_train, "fit", spy)
    fits = []

    class Recorded(hnn_train.TrajectoryFit):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            fits.append((self.solve_every, self.derivative_points, self.derivative_warmup))
    monkeypatch.setattr(hnn_train, "TrajectoryFit", Recorded)
    noisy = hnn_run.run("twobody_noisy", arm_keys=["a", "e", "f", "e4"], **args)
    assert noisy["data"]["noise"] == 0.1 and noisy["shooting"]["segment"] == 1
    # (a), then (e)'s segments, then (e′)'s: its own batch factor (yoshida4's step costs 3 Verlet stages)
    assert noisy["shooting"]["gauss_newton"] == 1 and batches == [8, 8 * 7, 8 * 3]
    assert "3 × the batch" in noisy["arms"]["e4"]["label"] and "the batch" not in noisy["arms"]["e"]["label"]
    batches.clear()
    same = hnn_run.run("twobody_noisy", arm_keys=["e4"], shooting=dict(batch_factor2=7), **args)
    assert batches == [8 * 7] and "the batch" not in same["arms"]["e4"]["label"]
    batches.clear()
    # full batch (spring's and the pendulum's full runs): no batch factor applies, none is named
    monkeypatch.setitem(hnn_run.CONFIG["spring"]["quick"], "batch", None)
    whole = hnn_run.run("spring", arm_keys=["e4"], shooting=dict(batch_factor2=3),
                        **dict(args, batch_size=None, out=tmp_path / "whole"))
    assert batches == [None] and "the batch" not in whole["arms"]["e4"]["label"]
    batches.clear()
    fewer = hnn_run.run("twobody_noisy", arm_keys=["g", "g_ode"],
                        shooting=dict(derivative_points=20, derivative_warmup=3), **args)
    assert batches == [8 * 7] and fits[-1] == (8, 20, 3)    # (g″) evaluates (g)'s model: one training
    assert fewer["shooting"]["derivative_points"] == 20 and fewer["shooting"]["derivative_warmup"] == 3
    assert fewer["arms"]["g_ode"]["per_seed"][0]["train_seconds"] == fewer["arms"]["g"]["per_seed"][0]["train_seconds"]
    assert fewer["arms"]["g_ode"]["per_seed"][0]["state_mse"] != fewer["arms"]["g"]["per_seed"][0]["state_mse"]
    again = hnn_run.run("spring", from_partial=True, **args)     # a stopped run's seeds, no training
    assert again["arms"]["e"]["per_seed"] == arms["e"]["per_seed"] and again["shooting"] == rep["shooting"]
    cmp = hnn_run.compare_rankings(rep, rep)
    assert cmp["same"] and cmp["quick"] == hnn_run.ranking(rep)
    import copy
    swapped = copy.deepcopy(rep)                  # the two best arms' energies exchanged
    best, second = cmp["quick"][:2]
    sb, ss = (swapped["arms"][k]["summary"]["energy_mse"] for k in (best, second))
    sb["mean"], ss["mean"] = ss["mean"], sb["mean"]
    cmp2 = hnn_run.compare_rankings(rep, swapped)
    assert not cmp2["same"] and cmp2["full"][:2] == [second, best]
    hnn_run.main(["--table", str(tmp_path)])                      # the README's cross-task tables
    table = capsys.readouterr().out
    assert "| energy mse | spring | twobody_noisy |" in table and "(×" in table
    # the noisy task's observations are the clean orbits plus noise; evaluation stays clean
    clean, obs = hnn_data.twobody(0, trajectories=10), hnn_data.twobody_noisy(0, trajectories=10)
    assert torch.equal(clean.q_eval, obs.q_eval)
    assert 0.05 < float((obs.q_train - clean.q_train).std()) < 0.15
    # a seed whose training raises is a failed seed of that arm (and of the arms reusing its
    # model), not a failed run; a NaN metric without an error is counted as failed too
    real_train = hnn_run.train

    def failing(arm, *a, **k):
        if arm.key == "e":
            raise FloatingPointError("the loss became non-finite at step 1")
        return real_train(arm, *a, **k)
    monkeypatch.setattr(hnn_run, "train", failing)
    broken = hnn_run.run("spring", arm_keys=["a", "e", "f"], **args)
    assert [broken["arms"][k]["summary"]["failed_seeds"] for k in ("a", "e", "f")] == [[], [0], [0]]
    assert "training: FloatingPointError" in broken["arms"]["f"]["per_seed"][0]["failed"]
    monkeypatch.setattr(hnn_run, "train", real_train)
    real_rollout = hnn_train.rollout_model
    monkeypatch.setattr(hnn_train, "rollout_model",
                        lambda *a, **k: tuple(x * float("nan") for x in real_rollout(*a, **k)))
    nan = hnn_run.run("spring", arm_keys=["a"], **args)
    assert nan["arms"]["a"]["summary"]["failed_seeds"] == [0]
    monkeypatch.setattr(hnn_train, "rollout_model", real_rollout)


def test_hnn_study_invariant_network_tiny(tmp_path, monkeypatch, capsys):
    """--network invariant: every arm's network on the two-body tasks' |q₁ − q₂| (the HNN of
    (|q₁ − q₂|, p), V_θ of |q₁ − q₂|, T_θ of p), recorded in the report and its markdown; a task
    without invariants, an arm whose network takes none, an unknown name, and a --merge or
    --from-partial across networks are refused before any training."""
    from experiments.hnn import data as hnn_data
    from experiments.hnn import run as hnn_run
    from experiments.hnn import train as hnn_train

    def small(seed=0, **kw):
        t = hnn_data.twobody_noisy(seed, trajectories=10)
        t.q_eval, t.p_eval = t.q_eval[:2, :9], t.p_eval[:2, :9]
        t.q_points, t.p_points = t.q_points[:20], t.p_points[:20]
        return t
    monkeypatch.setitem(hnn_data.TASKS, "twobody_noisy", small)
    monkeypatch.setattr(hnn_train, "EVAL_RTOL", 1e-5)
    built, real_build = [], hnn_train.build_model

    def spy(arm, task, **k):
        model = real_build(arm, task, **k)
        built.append((arm.key, model))
        return model
    monkeypatch.setattr(hnn_train, "build_model", spy)
    args = dict(quick=True, seeds=1, steps=2, batch_size=8, out=tmp_path, progress=False)
    rep = hnn_run.run("twobody_noisy", arm_keys=["a", "e"], network="invariant", **args)
    assert rep["network"] == "invariant"
    models = dict(built)
    assert models["a"].net.in_dim == 5 and models["e"].potential.net.in_dim == 1
    assert models["e"].kinetic.net.in_dim == 4
    assert "|q₁ − q₂|" in (tmp_path / "hnn_twobody_noisy_invariant.md").read_text()
    assert all(math.isfinite(a["per_seed"][0]["energy_mse"]) for a in rep["arms"].values())
    # the MLPs' study in the same dir: its own files beside the invariant one's
    plain = hnn_run.run("twobody_noisy", arm_keys=["a"], **args)
    assert plain["network"] == "mlp" and built[-1][1].net.in_dim == 8
    assert "|q₁ − q₂|" not in (tmp_path / "hnn_twobody_noisy.md").read_text()
    assert json.loads((tmp_path / "hnn_twobody_noisy_invariant.json").read_text())["network"] == "invariant"
    hnn_run.main(["--table", str(tmp_path)])
    assert "| twobody_noisy | twobody_noisy (invariant network) |" in capsys.readouterr().out
    with pytest.raises(SystemExit):        # --compare across networks: different models
        hnn_run.main(["--compare", str(tmp_path / "hnn_twobody_noisy_invariant.json"),
                      str(tmp_path / "hnn_twobody_noisy.json")])
    assert "different networks ('invariant' and 'mlp')" in capsys.readouterr().err
    # without --arms: every arm whose network takes the features ((d)'s field does not)
    keys = [a.key for a in hnn_train.arms(hnn_data.TASKS["twobody_noisy"]())]
    monkeypatch.setattr(hnn_run, "train", lambda *a, **k: "training: skipped")   # the arms, not their training
    default = hnn_run.run("twobody_noisy", network="invariant", **dict(args, out=tmp_path / "all"))
    assert "d" in keys and list(default["arms"]) == [k for k in keys if k != "d"]
    monkeypatch.undo()
    monkeypatch.setitem(hnn_data.TASKS, "twobody_noisy", small)
    monkeypatch.setattr(hnn_train, "build_model", spy)
    n = len(built)
    (tmp_path / "mlp0").mkdir()             # an invariant report under the MLPs' name: refused by its network
    shutil.copy(tmp_path / "hnn_twobody_noisy_invariant.json", tmp_path / "mlp0" / "hnn_twobody_noisy.json")
    with pytest.raises(ValueError, match="was run with"):
        hnn_run.run("twobody_noisy", arm_keys=["b1"], merge=True, **dict(args, out=tmp_path / "mlp0"))
    with pytest.raises(ValueError, match="task 'spring' has no invariant features"):
        hnn_run.run("spring", arm_keys=["a"], network="invariant", **args)
    with pytest.raises(ValueError, match="arm d trains a MLPVectorField"):
        hnn_run.run("twobody_noisy", arm_keys=["a", "d"], network="invariant", **args)
    with pytest.raises(ValueError, match="network must be one of"):
        hnn_run.run("twobody_noisy", arm_keys=["a"], network="cnn", **args)
    # a partial of the invariant study: reported by its network, refused by the MLPs'
    stem = tmp_path / "hnn_twobody_noisy"
    stem.with_name(stem.name + "_invariant_partial.json").rename(stem.with_name(stem.name + "_partial.json"))
    with pytest.raises(ValueError, match="that run used the network 'invariant'"):
        hnn_run.run("twobody_noisy", from_partial=True, **args)
    stem.with_name(stem.name + "_partial.json").rename(stem.with_name(stem.name + "_invariant_partial.json"))
    again = hnn_run.run("twobody_noisy", from_partial=True, network="invariant", **args)
    assert list(again["arms"]) == ["a", "e"] and again["network"] == "invariant"
    assert len(built) == n                    # refused before any training built its model
    for bad, why in ((["--task", "spring"], "task 'spring' has no invariant features"),
                     (["--task", "twobody_noisy", "--arms", "a,d"], "arm d trains a MLPVectorField")):
        with pytest.raises(SystemExit):       # usage errors, not tracebacks
            hnn_run.main(bad + ["--network", "invariant", "--quick", "--out", str(tmp_path / "x")])
        assert why in capsys.readouterr().err
    with pytest.raises(SystemExit):
        hnn_run.main(["--task", "twobody_noisy", "--network", "cnn"])
    assert "invalid choice: 'cnn'" in capsys.readouterr().err


def test_hnn_truth_floor_is_verlets_error(monkeypatch, capsys):
    """The true H rolled out by Verlet at h = dt: an energy error of second order in h (its
    squared error falls 16x at half the step), printed per task by --floor."""
    from experiments.hnn import data as hnn_data
    from experiments.hnn import run as hnn_run
    from experiments.hnn.train import truth_floor
    task = hnn_data.spring(0)
    f1, f2 = truth_floor(task), truth_floor(task, substeps=2)
    assert 14 < f1["energy_mse"] / f2["energy_mse"] < 18 and f1["state_mse"] > f2["state_mse"]
    monkeypatch.setattr(hnn_run, "CONFIG", {"spring": hnn_run.CONFIG["spring"]})
    hnn_run.main(["--floor"])
    assert f"| spring | {task.dt:.4g} | {f1['energy_mse']:.3g} |" in capsys.readouterr().out


def test_hnn_cost_tiny(tmp_path, monkeypatch, capsys):
    """The cost benchmark times the arms as the study builds them, side by side, and reports
    each against the first; unknown arms are a usage error."""
    from experiments.hnn import cost as hnn_cost
    rep = hnn_cost.measure("spring", ["b5", "e", "g"], batch_size=8, rounds=2, steps=1, warmup=1)
    arms = rep["arms"]
    assert list(arms) == ["b5", "e", "g"] and arms["b5"]["ratio"] == 1.0
    assert all(a["ms_per_step"] > 0 for a in arms.values()) and rep["shooting"]["gauss_newton"] == 1
    hnn_cost.main(["--task", "spring", "--arms", "a,b1", "--batch-size", "8", "--rounds", "1",
                   "--steps", "1", "--out", str(tmp_path)])
    assert "| (a)" in capsys.readouterr().out and (tmp_path / "hnn_cost_spring.json").exists()
    with pytest.raises(SystemExit):
        hnn_cost.main(["--task", "spring", "--arms", "b5,zz"])
    # --solve-every: the shooting arms' solve cycle, named in the table's header
    hnn_cost.main(["--task", "spring", "--arms", "b5,e", "--batch-size", "8", "--rounds", "1",
                   "--steps", "1", "--solve-every", "4", "--out", str(tmp_path)])
    assert "each node solved at one visit in 4" in capsys.readouterr().out
    assert json.loads((tmp_path / "hnn_cost_spring.json").read_text())["shooting"]["solve_every"] == 4
    with pytest.raises(SystemExit):
        hnn_cost.main(["--task", "spring", "--arms", "b5,e", "--solve-every", "0"])
    # --batch-factor2: (e′)'s segments per sample, the others' unchanged; 0 is refused
    sizes = []
    from torchgeo_int.nn.shooting import TrajectoryFit
    forward = TrajectoryFit.forward

    def spy(self, index=None, *a):
        sizes.append(len(index))
        return forward(self, index, *a)
    monkeypatch.setattr(TrajectoryFit, "forward", spy)
    rep = hnn_cost.measure("twobody", ["e", "e4"], batch_size=4, rounds=1, steps=1, warmup=0,
                           shooting=dict(batch_factor2=2))
    assert sizes == [4 * 7, 4 * 2] and rep["shooting"]["batch_factor2"] == 2
    with pytest.raises(SystemExit):
        hnn_cost.main(["--task", "spring", "--arms", "b5,e4", "--batch-factor2", "0"])
    assert "batch_factor2 must be an int >= 1" in capsys.readouterr().err
    # --network invariant: the study's networks of |q₁ − q₂|, its own report; refused where it
    # does not apply, and with --against (that tree's study has the MLPs only)
    timed, real_build = [], hnn_cost.build_model
    monkeypatch.setattr(hnn_cost, "build_model", lambda *a, **k: timed.append(real_build(*a, **k)) or timed[-1])
    hnn_cost.main(["--task", "twobody", "--arms", "b5,e", "--batch-size", "4", "--rounds", "1",
                   "--steps", "1", "--network", "invariant", "--out", str(tmp_path)])
    assert len(timed) >= 2 and all(m.potential.net.in_dim == 1 for m in timed)
    assert "network invariant" in capsys.readouterr().out
    assert json.loads((tmp_path / "hnn_cost_twobody_invariant.json").read_text())["network"] == "invariant"
    for bad, why in ((["--task", "spring", "--arms", "b5"], "has no invariant features"),
                     (["--task", "twobody", "--arms", "b5", "--against", "HEAD"], "MLPs")):
        with pytest.raises(SystemExit):
            hnn_cost.main(bad + ["--network", "invariant"])
        assert why in capsys.readouterr().err


def test_hnn_cost_against_another_tree(tmp_path, capsys):
    """--against: the same arms as another tree builds them, timed in a child process that takes
    turns with this one (that tree's packages, not this one's); a git revision is extracted;
    arms built differently there and settings that tree does not know are said; an unknown
    revision, a broken tree and a tree without the arm are clear errors."""
    from experiments import trees
    from experiments.hnn import cost as hnn_cost
    small = dict(batch_size=8, rounds=2, steps=1, warmup=1)
    hnn_cost.main(["--task", "spring", "--arms", "b5,e", "--batch-size", "8", "--rounds", "2", "--steps", "1",
                   "--against", "HEAD", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    rep = json.loads((tmp_path / "hnn_cost_spring_against.json").read_text())
    assert not (tmp_path / "hnn_cost_spring.json").exists()          # a plain run's report is not overwritten
    head, them = rep["against"]["tree"], rep["against"]["arms"]
    assert head.startswith("HEAD (") and len(head) == len("HEAD ()") + 12 and f"| this tree / {head} |" in out
    assert list(them) == ["b5", "e"] and rep["against"]["ignored"] == []
    for k in them:
        assert them[k]["ms_per_step"] > 0 and them[k]["label"] == rep["arms"][k]["label"]
        assert them[k]["this_over_that"] == pytest.approx(rep["arms"][k]["ms_per_step"] / them[k]["ms_per_step"])
    assert them["e"]["ratio"] == pytest.approx(them["e"]["ms_per_step"] / them["b5"]["ms_per_step"])
    # a revision from before (e′)'s own batch factor: the override is ignored there, and said so
    old = hnn_cost.measure("spring", ["b5"], against="8b6f7bf", shooting=dict(batch_factor2=2), **small)
    assert old["against"]["ignored"] == ["batch_factor2"]
    assert "has no setting batch_factor2" in hnn_cost.markdown(old)
    with pytest.raises(ValueError, match="unknown shooting settings"):
        hnn_cost.measure("spring", ["b5"], shooting=dict(segmnt=2), **small)
    with pytest.raises(SystemExit):
        hnn_cost.main(["--task", "spring", "--arms", "b5", "--against", "no-such-revision"])
    assert "neither a tree" in capsys.readouterr().err
    broken = tmp_path / "broken"               # a tree whose study cannot be imported
    (broken / "torchgeo_int").mkdir(parents=True)
    (broken / "torchgeo_int" / "__init__.py").write_text("")
    (broken / "experiments" / "hnn").mkdir(parents=True)
    for f in ("experiments/__init__.py", "experiments/hnn/__init__.py"):
        (broken / f).write_text("")
    (broken / "experiments/hnn/cost.py").write_text("raise ImportError('this tree is broken')\n")
    with pytest.raises(RuntimeError, match="this tree is broken"):
        hnn_cost.measure("spring", ["b5"], against=str(broken), **small)
    older = tmp_path / "older"      # a tree whose study labels (e) otherwise, has no (g), and prints
    for d in ("torchgeo_int", "experiments"):
        shutil.copytree(trees.ROOT / d, older / d, ignore=shutil.ignore_patterns("__pycache__"))
    with open(older / "experiments/hnn/train.py", "a") as f:
        f.write("\nimport dataclasses\n_all_arms = arms\n\n\ndef arms(*a, **k):\n"
                "    return [dataclasses.replace(x, label='(e) as it was') if x.key == 'e' else x\n"
                "            for x in _all_arms(*a, **k) if x.key != 'g']\n")
    with open(older / "experiments/hnn/run.py", "a") as f:
        f.write("\nprint('drawing the data')\n")           # on stdout: must not break the protocol
    diff = hnn_cost.measure("spring", ["b5", "e"], against=str(older), **small)
    assert diff["against"]["arms"]["e"]["label"] == "(e) as it was"
    assert "* (e) is built differently there: (e) as it was" in hnn_cost.markdown(diff)
    with pytest.raises(ValueError, match=r"arms \['g'\] are not in that tree's study"):
        hnn_cost.measure("spring", ["b5", "g"], against=str(older), **small)


def test_hnn_parametric_probe_tiny(tmp_path, monkeypatch, capsys):
    """experiments.hnn.parametric: each family holds its task's true H (at the true coefficients,
    up to a constant), derivative matching's closed form recovers them from exact data, and a toy
    run reports every arm for every data seed with paired ratios to (a)."""
    from experiments.hnn import data as hnn_data
    from experiments.hnn import parametric
    from experiments.hnn import run as hnn_run
    from experiments.hnn import train as hnn_train
    from torchgeo_int.nn.metrics import hamiltonian_error

    for name in ("spring", "pendulum", "twobody"):
        task = hnn_data.TASKS[name](0, **({"trajectories": 10} if name == "twobody" else {}))
        model = parametric.parametric_model(name).double()
        b, a = parametric.FAMILIES[name][2]
        with torch.no_grad():
            model.kinetic.c.fill_(b)
            model.potential.c.fill_(a)
        assert float(hamiltonian_error(model, task.energy, task.q_points, task.p_points)) < 1e-12
    exact = hnn_data.twobody(0, trajectories=10)          # noise-free: the inputs are the clean states
    assert parametric.closed_form_derivative_matching("twobody", exact) == pytest.approx((1.0, 1.0), abs=1e-9)
    noisy = hnn_data.spring(0)                             # noisy inputs: both coefficients attenuated
    assert all(0.8 < c < 0.99 for c in parametric.closed_form_derivative_matching("spring", noisy))

    def small(seed=0, make=hnn_data.spring):
        t = make(seed)
        t.q_eval, t.p_eval = t.q_eval[:2, :9], t.p_eval[:2, :9]
        t.q_points, t.p_points = t.q_points[:20], t.p_points[:20]
        return t
    monkeypatch.setitem(hnn_data.TASKS, "spring", small)
    monkeypatch.setattr(hnn_train, "EVAL_RTOL", 1e-5)
    monkeypatch.setitem(hnn_run.CONFIG["spring"], "full", dict(steps=3, batch=None, seeds=1))
    rep = parametric.run(["spring"], data_seeds=2, out=tmp_path, progress=False)
    t = rep["tasks"]["spring"]
    assert set(t["per_seed"]) == set(parametric.ARMS)
    assert all([r["data_seed"] for r in rows] == [0, 1] for rows in t["per_seed"].values())
    e, f = t["per_seed"]["e"][0], t["per_seed"]["f"][0]
    assert (e["b"], e["a"]) == (f["b"], f["a"]) and e["eps_H"] != f["eps_H"]   # (f) reuses (e), corrected
    assert len(t["derivative_matching_check"]) == 2
    ratio, lo, hi = parametric.paired_ratio(t["per_seed"]["e"], t["per_seed"]["a"], "energy_mse")
    assert lo <= ratio <= hi
    md = (tmp_path / "hnn_parametric.md").read_text()
    assert "## spring" in md and "| f_v |" in md and "closed-form" in md
    assert (tmp_path / "hnn_parametric.png").stat().st_size > 0
    (tmp_path / "hnn_parametric.png").unlink()
    parametric.main(["--replot", "--out", str(tmp_path)])
    assert (tmp_path / "hnn_parametric.png").stat().st_size > 0
    monkeypatch.setitem(hnn_run.CONFIG["pendulum"], "full", dict(steps=2, batch=None, seeds=1))
    monkeypatch.setitem(hnn_data.TASKS, "pendulum", lambda seed=0: small(seed, make=hnn_data.pendulum))
    both = parametric.run(["pendulum"], data_seeds=2, out=tmp_path, progress=False, merge=True)
    assert list(both["tasks"]) == ["spring", "pendulum"]
    assert both["tasks"]["spring"] == json.loads(json.dumps(t))        # kept as written
    with pytest.raises(ValueError, match="data seeds"):
        parametric.run(["pendulum"], data_seeds=1, out=tmp_path, progress=False, merge=True)
    # one arm rerun into a task of the report: its rows replaced, the task's other arms kept
    one = parametric.run(["spring"], data_seeds=2, out=tmp_path, progress=False, merge=True, arms=["g"],
                         shooting={"derivative_warmup": 2})
    s = one["tasks"]["spring"]
    assert set(s["per_seed"]) == set(parametric.ARMS) and one["arms"] == list(parametric.ARMS)
    # each arm's settings as it was trained: the rerun arm's new ones, the kept arms' earlier ones
    assert s["arm_shooting"]["g"]["derivative_warmup"] == 2 and s["arm_shooting"]["e"] == t["shooting"]
    untimed = lambda rows: [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in rows]  # noqa: E731
    assert s["per_seed"]["e"] == t["per_seed"]["e"]                            # kept
    assert untimed(s["per_seed"]["a"]) == untimed(t["per_seed"]["a"])          # rerun, seeded: the same fit
    assert "| g |" in (tmp_path / "hnn_parametric.md").read_text()
    with pytest.raises(ValueError, match=r"unknown arm\(s\) \['h'\]"):
        parametric.run(["spring"], data_seeds=2, out=tmp_path, progress=False, arms=["h"])
    warm = parametric.run(["spring"], data_seeds=1, out=tmp_path / "warm", progress=False, arms=["g"],
                          shooting={"derivative_warmup": 5})       # over run.SHOOTING, in the report
    assert warm["tasks"]["spring"]["shooting"] == dict(parametric.SHOOTING["spring"], derivative_warmup=5)
    # clean data: (e) through Verlet learns Verlet's exact coefficients, whose correction is H
    summary, rows = parametric.shape_scan([0], steps=300, lr=0.05, out=tmp_path, noise=0.0)
    assert abs(rows[0]["shape_offset"]) < 1e-4 and rows[0]["eps_H_corrected"] < 0.02 * rows[0]["eps_H"]
    assert summary["correction_raises_eps_H"] == 0 and (tmp_path / "hnn_parametric_shape.json").exists()
    for argv, message in ((["--replot", "--out", str(tmp_path / "none")], "no report"),
                          (["--shape-scan", "3"], "FIRST:STOP"),
                          (["--data-seeds", "0"], "argument --data-seeds: must be an int >= 1, got 0"),
                          (["--steps", "0"], "argument --steps: must be an int >= 1, got 0"),
                          (["--lr", "nan"], "argument --lr: must be a finite number > 0"),
                          (["--lr", "0"], "argument --lr: must be a finite number > 0"),
                          (["--noise", "-0.1"], "argument --noise: must be a finite number >= 0"),
                          (["--derivative-warmup", "-1"], "argument --derivative-warmup: must be an int >= 0")):
        with pytest.raises(SystemExit):
            parametric.main(argv)
        assert message in capsys.readouterr().err
    # the study's numeric options: argparse's usage error before anything trains, no traceback
    for argv, message in ((["--data-seed", "-1"], "argument --data-seed: must be an int >= 0, got -1"),
                          (["--weight-decay", "-1"], "argument --weight-decay: must be a finite number >= 0"),
                          (["--weight-decay", "nan"], "argument --weight-decay: must be a finite number >= 0"),
                          (["--seeds", "0"], "argument --seeds: must be an int >= 1, got 0"),
                          (["--state-lr", "0"], "argument --state-lr: must be a finite number > 0"),
                          (["--segment", "x"], "argument --segment: invalid int value: 'x'")):
        with pytest.raises(SystemExit):
            hnn_run.main(["--task", "spring"] + argv)
        assert message in capsys.readouterr().err


def test_compare_trees_runs_two_revisions_side_by_side(tmp_path, monkeypatch, capsys):
    """compare_trees: a git revision and a directory, each measured in its own worker process
    (experiments.trees), rows and a memory cell for each; a name that is neither is a usage error."""
    from experiments.bench import compare_trees
    from experiments.trees import ROOT
    monkeypatch.setattr(compare_trees, "QUICK_ROWS", [("verlet", 4, 8)])
    out = tmp_path / "cmp.md"
    compare_trees.main(["--before", "HEAD", "--after", str(ROOT), "--quick", "--memory-steps", "5",
                        "--memory-batch", "4", "--out", str(out)])
    text = out.read_text()
    assert "| verlet | 4 | 8 |" in text and "| backprop |" in text and text.strip() in capsys.readouterr().out
    assert "before: HEAD (" in text and f"after: {ROOT}" in text           # the revision's hash named
    with pytest.raises(SystemExit):
        compare_trees.main(["--before", "no-such-revision", "--after", str(ROOT)])
    assert "--before: 'no-such-revision' is neither a tree" in capsys.readouterr().err


def test_a_tree_worker_that_stops_or_garbles_is_an_error_with_its_stderr(tmp_path):
    """experiments.trees.Worker: answers come back parsed; a child that answers something else,
    or stops, is a RuntimeError carrying its stderr, asked once or again; closing twice is fine."""
    from experiments.trees import Worker
    script = tmp_path / "toy.py"
    script.write_text("import json, sys\n"
                      "for line in sys.stdin:\n"
                      "    m = json.loads(line)\n"
                      "    if m is None: break\n"
                      "    if m == 'garble': print('not json', flush=True)\n"
                      "    elif m == 'die': sys.exit('dying on request')\n"
                      "    else: print(json.dumps([m, sys.argv[1:]]), flush=True)\n")
    with Worker(tmp_path, script, "x", 2) as w:
        assert w.ask(3) == [3, ["x", "2"]]
        with pytest.raises(RuntimeError, match="answered 'not json"):
            w.ask("garble")
    w = Worker(tmp_path, script)
    for _ in range(2):                         # the second ask: the same error, not a closed file's
        with pytest.raises(RuntimeError, match="stopped; its stderr ends:\n.*dying on request"):
            w.ask("die")
    w.close()
    hang = tmp_path / "hang.py"
    hang.write_text("import sys, time\nsys.stderr.write('hanging\\n'); sys.stderr.flush()\n"
                    "sys.stdin.readline(); time.sleep(60)\n")
    w = Worker(tmp_path, hang, timeout=0.5)
    with pytest.raises(RuntimeError, match="no answer in 0.5 s .killed.; its stderr ends:\n.*hanging"):
        w.ask(1)
    assert w.proc.poll() is not None           # killed, not left running
    w.close()
