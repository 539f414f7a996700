"""Tiny runs of experiments/rigid_body.py and experiments/newmark_orders.py into tmp_path (their
measured convergence orders), and the argument errors of experiments/constraints_longtime.py and
experiments/dissipative.py."""
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def test_rigid_body_tiny_run_measures_the_declared_orders(tmp_path):
    """Heavy top, N = 8, 16, 32 (errors above 1e-1 dropped from the fit): fitted orders 1.99, 2.00,
    3.89, 1.09, 1.01, 5.89 for declared 2, 2, 4, 1, 1, 6."""
    from experiments import rigid_body
    rep = rigid_body.main(["--long-steps", "200", "--Ns", "8,16,32", "--out", str(tmp_path)])
    out = tmp_path / "rigid_body"
    for name in ("long_run.png", "convergence.png", "table.md", "table.json"):
        assert (out / name).stat().st_size > 0
    conv = json.loads((out / "table.json").read_text())["convergence"]
    assert conv == json.loads(json.dumps(rep["convergence"]))
    assert len(conv) == 6
    for method, d in conv.items():
        assert d["N"] == [8, 16, 32]
        assert abs(d["fitted_order"] - d["declared_order"]) <= 0.3, (method, d)
    rows = rep["long_run"]
    assert {r["steps"] for r in rows} == {200, 40}
    for r in rows:                 # the Lie-group methods stay on SO(3) to round-off; RK4 does not
        if r["method"] != "rk4":
            assert r["max_orthogonality_error"] < 1e-13, r
    assert max(r["max_orthogonality_error"] for r in rows if r["method"] == "rk4") > 1e-12


NEWMARK_TINY = ["newmark_average_acceleration", "newmark_central_difference", "newmark_damped",
                "sode_midpoint", "discrete_sode_midpoint", "variational_euler",
                "variational_midpoint", "implicit_midpoint"]


def test_newmark_orders_tiny_run_measures_the_declared_orders(tmp_path):
    """N = 10, 20, 40: measured 1.93/1.97, 2.03, 1.22/1.14, 1.92/1.95, 1.92/1.95 on the (damped)
    Duffing system, 1.00, 2.00, 2.00 on the relativistic particle.  sode_explicit_euler is left
    out: it needs N ≥ 80 to fit order 1 within 0.3 (1.88 at N = 10-40, 1.40 at 20-80)."""
    from experiments import newmark_orders
    data = newmark_orders.main(["--Ns", "10,20,40", "--methods", ",".join(NEWMARK_TINY),
                                "--energy-steps", "100", "--cost-steps", "20", "--out", str(tmp_path)])
    for name in ("newmark_orders.md", "newmark_orders.json", "newmark_orders_convergence.png",
                 "newmark_orders_energy.png"):
        assert (tmp_path / name).stat().st_size > 0
    rows = json.loads((tmp_path / "newmark_orders.json").read_text())["convergence"]
    assert rows == json.loads(json.dumps(data["convergence"]))
    assert sorted({r["method"] for r in rows}) == sorted(NEWMARK_TINY)
    assert len(rows) == 13             # 5 methods × 2 Duffing problems + 3 relativistic
    for r in rows:
        assert abs(r["measured_order"] - r["declared_order"]) <= 0.3, r


def test_newmark_orders_rejects_an_unknown_method(tmp_path, capsys):
    from experiments import newmark_orders
    with pytest.raises(SystemExit):
        newmark_orders.main(["--methods", "newmark_avg", "--out", str(tmp_path / "o")])
    assert "unknown name(s) 'newmark_avg'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv, message", [
    (["--steps", "5"], "--steps must be at least 10"),
    (["--steps", "-3", "--h", "0"], "--steps must be at least 10"),
    (["--steps", "20", "--h", "0"], "--h must be a finite step size > 0"),
    (["--steps", "20", "--h", "-0.1"], "--h must be a finite step size > 0"),
])
def test_constraints_longtime_rejects_bad_sizes(tmp_path, capsys, argv, message):
    from experiments import constraints_longtime
    with pytest.raises(SystemExit) as e:
        constraints_longtime.main([*argv, "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv, message", [
    (["--tasks", "dampd"], "--tasks: unknown name(s) 'dampd'; known: damped, controlled"),
    (["--tasks", "damped,damped"], "--tasks: a name is given twice"),
    (["--arms", "ours"], "--arms: unknown name(s) 'ours'; known: ours_midpoint"),
    (["--steps", "0"], "--steps must be at least 1"),
])
def test_dissipative_rejects_bad_arguments(tmp_path, capsys, argv, message):
    from experiments import dissipative
    with pytest.raises(SystemExit) as e:
        dissipative.main(["--quick", *argv, "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_dissipative_report_names_differ_by_task_and_budget():
    from experiments.dissipative import report_stem
    a = report_stem(["damped"], 2000, ["ours_midpoint", "dhnn_fd"])
    assert a == "dissipative_damped_2000steps_ours_midpoint_dhnn_fd"
    assert len({a, report_stem(["damped"], 4000, ["ours_midpoint", "dhnn_fd"]),
                report_stem(["controlled"], 2000, ["ours_midpoint", "dhnn_fd"]),
                report_stem(["damped"], 2000, ["ours_midpoint", "dhnn_fd"], quick=True),
                report_stem(["damped"], 2000, ["ours_midpoint", "dhnn_fd"], seeds=5)}) == 5
    # the default seed count keeps the names the README quotes
    assert report_stem(["damped"], 2000, ["ours_midpoint"], seeds=3) == report_stem(["damped"], 2000, ["ours_midpoint"])
    assert report_stem(["damped"], 3, [], quick=True, seeds=1) == "dissipative_quick_damped_3steps"


def test_dissipative_report_shows_no_standard_error_of_one_seed():
    """One seed has no standard error: the report gives the mean alone, not "± nan"."""
    from experiments.dissipative import _mean_pm_se, mean_se
    assert _mean_pm_se(mean_se([0.5])) == "0.5"
    assert _mean_pm_se(mean_se([0.5, 0.7])) == "0.6 ± 0.1"
    assert _mean_pm_se(None) == "—"
