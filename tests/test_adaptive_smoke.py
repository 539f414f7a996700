"""A tiny run of experiments/adaptive.py (Kepler and the Pythagorean three-body problem at equal
force evaluations), so that it cannot rot: it writes its table and figure, every configuration
spends the budget it is given, and the logarithmic-Hamiltonian leapfrog keeps the Kepler energy
at round-off while fixed-step verlet at the same evaluations does not."""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from experiments import adaptive  # noqa: E402


def test_adaptive_experiment_tiny(tmp_path):
    rows = adaptive.main(["--periods", "2", "--per-period", "60", "--t-end", "0.5",
                          "--budget", "300", "--out", str(tmp_path), "--no-progress"])
    assert (tmp_path / "energy.png").stat().st_size > 0
    saved = json.loads((tmp_path / "table.json").read_text())["data"]
    assert json.dumps(saved) == json.dumps(rows)   # (NaN in a failed row: compare the text)
    assert {r["config"] for r in rows} == {"logh_dkd", "logh_dkd_y4", "reversible_dkd", "verlet",
                                           "yoshida4", "dopri5"}
    by = {(r["problem"], r["config"]): r for r in rows}
    for e in (0.9, 0.99):
        logh, verlet = by[(f"kepler_e{e}", "logh_dkd")], by[(f"kepler_e{e}", "verlet")]
        assert logh["evaluations"] == verlet["evaluations"] - 1 == 120   # (+1: verlet's first force)
        assert logh["max_rel_energy_error"] < 1e-12
        assert verlet["max_rel_energy_error"] > 1e3 * logh["max_rel_energy_error"]
    assert by[("pythagorean_3body", "logh_dkd")]["evaluations"] == 300
