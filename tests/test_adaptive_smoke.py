"""Tiny runs of experiments/adaptive.py (the hierarchical triple, Kepler and the Pythagorean
three-body problem at equal force evaluations), so that it cannot rot: it writes its table and
figure, every configuration spends the budget it is given, the logarithmic-Hamiltonian leapfrog
keeps the Kepler energy at round-off while fixed-step verlet at the same evaluations does not,
and on the triple the best geometric configuration beats fixed steps by ≥ 10× without a trend."""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from experiments import adaptive  # noqa: E402


def test_adaptive_experiment_tiny(tmp_path):
    # 6 periods: past the 5-period calibration window, so the long-horizon paths run too
    rows = adaptive.main(["--studies", "kepler", "3body", "--periods", "6", "--per-period", "60",
                          "--t-end", "0.5", "--budget", "300", "--out", str(tmp_path), "--no-progress"])
    assert (tmp_path / "energy.png").stat().st_size > 0
    saved = json.loads((tmp_path / "table.json").read_text())["data"]
    assert json.dumps(saved) == json.dumps(rows)   # (NaN in a failed row: compare the text)
    assert [r for r in rows if "failed" in r] == []
    assert {r["config"] for r in rows} == set(adaptive.CONFIGS)
    by = {(r["problem"], r["config"]): r for r in rows}
    for e in (0.9, 0.99):
        logh, verlet = by[(f"kepler_e{e}", "logh_dkd")], by[(f"kepler_e{e}", "verlet")]
        assert logh["evaluations"] == verlet["evaluations"] - 1 == 360   # (+1: verlet's first force)
        assert logh["max_rel_energy_error"] < 1e-12
        assert verlet["max_rel_energy_error"] > 1e3 * logh["max_rel_energy_error"]
        assert by[(f"kepler_e{e}", "reversible_dkd")]["evaluations"] == 360
    # the reversible ε is calibrated to its share of the budget over 5 periods (300 steps)
    cal = by[("kepler_e0.9", "reversible_dkd")]
    assert cal["calibration_target"] == 300 and abs(cal["calibration_steps"] - 300) <= 3
    assert by[("pythagorean_3body", "logh_dkd")]["evaluations"] == 300


def test_adaptive_reversible_calibration_reaches_its_target():
    """Two rounds of the 1/ε rule left e = 0.99 Kepler at 1335 steps for a target of 500; the
    secant calibration lands within 1 %."""
    import math

    import torch
    import torchgeo_int as tgi
    q0, p0 = (x.double() for x in adaptive.kepler_initial(0.99))
    eps, n = adaptive.reversible_eps(adaptive.kepler(), q0, p0, tgi.power_law_control(1.5),
                                     2 * math.pi * 5, 500, 0.05)
    assert abs(n / 500 - 1) <= 0.01
    with torch.no_grad():
        tr = tgi.adaptive_rollout(adaptive.kepler().system, q0, p0, eps=eps, until=2 * math.pi * 5,
                                  control=tgi.power_law_control(1.5), method="leapfrog_dkd", check_every=1)
    assert tr.steps == n


def test_adaptive_loaded_studies_keep_their_own_parameters(tmp_path):
    """A study not rerun is shown with the parameters it was run with, and configurations are
    merged into a saved study only when its parameters are the same."""
    args = ["--per-period", "60", "--out", str(tmp_path), "--no-progress"]
    adaptive.main(["--studies", "kepler", "--periods", "2", *args])
    adaptive.main(["--studies", "3body", "--t-end", "0.5", "--budget", "300", *args])
    meta = json.loads((tmp_path / "table.json").read_text())["meta"]
    assert meta["studies"]["kepler_e0.9"]["periods"] == 2 and meta["studies"]["kepler_e0.9"]["budget"] == 120
    assert meta["studies"]["pythagorean_3body"] == {"T": 0.5, "budget": 300}
    rows = adaptive.main(["--studies", "kepler", "--periods", "3", "--configs", "verlet", *args])
    kepler = [r for r in rows if r["problem"] == "kepler_e0.9"]
    assert [r["config"] for r in kepler] == ["verlet"]          # the 2-period rows are not merged
    rows = adaptive.main(["--studies", "kepler", "--periods", "3", "--configs", "logh_dkd", *args])
    assert [r["config"] for r in rows if r["problem"] == "kepler_e0.9"] == ["logh_dkd", "verlet"]


def test_adaptive_experiment_triple_tiny(tmp_path):
    rows = adaptive.main(["--studies", "triple", "--triple-periods", "4", "--triple-per-period", "200",
                          "--configs", *adaptive.CONFIGS, "--out", str(tmp_path), "--no-progress"])
    by = {r["config"]: r for r in rows}
    assert set(by) == set(adaptive.CONFIGS)
    assert by["logh_dkd"]["evaluations"] == by["verlet"]["evaluations"] - 1 == 800
    assert by["dopri5"]["evaluations"] <= 800 + 20          # one restart's start-up at most
    goal = json.loads((tmp_path / "table.json").read_text())["goals"][0]
    assert goal["best"] in adaptive.GEOMETRIC
    assert goal["ratio_verlet"] >= 10 and goal["ratio_yoshida4"] >= 10
    assert goal["best_growth"] < 3 and abs(goal["best_trend"]) < 0.5     # bounded, no trend
    assert "triple: best geometric" in (tmp_path / "table.md").read_text()


def test_adaptive_experiment_reversible_gradient_accuracy_tiny(tmp_path):
    adaptive.reversible_gradient_accuracy(tmp_path, steps_list=(40,))
    row = (tmp_path / "grad.md").read_text().splitlines()[-1].split("|")
    assert float(row[3]) < 1e-12 and float(row[4]) < 1e-10   # reconstruction, gradient
