"""Tiny runs and argument errors of experiments/solver_history.py, solver_memory.py,
torchdiffeq_suite.py (against a toy torchdiffeq checkout made here), rollout_sharded.py, and of the
GPU-only gpu_check.py and gpu_session.sh on a machine without CUDA (and with a stub interpreter).
Everything writes into tmp_path; no wall-clock assertions."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")


def _refused(main, argv, capsys, message):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err, err
    return err


# ----------------------------------------------------------------------------- solver_history

def test_solver_history_writes_to_out_and_refuses_empty_sizes(tmp_path, capsys):
    """--out names the folder (it wrote into ./results whatever the caller wanted); 0 steps or an
    empty batch was a traceback from deep inside rollout or torch.max."""
    from experiments import solver_history as sh
    rows, agree = sh.main(["--steps", "3", "--batch", "2", "--out", str(tmp_path / "o")])
    assert len(rows) == 4 and agree < 1e-12
    assert json.loads((tmp_path / "o" / "solver_history.json").read_text())["batch"] == 2
    assert "| newton captured |" in (tmp_path / "o" / "solver_history.md").read_text()
    for argv in (["--steps", "0"], ["--steps", "4", "-2"], ["--batch", "0"]):
        _refused(sh.main, [*argv, "--out", str(tmp_path / "x")], capsys, "expected an integer >= 1")
    assert not (tmp_path / "x").exists()


# ----------------------------------------------------------------------------- solver_memory

def test_solver_memory_tiny_run_flat_vs_linear(tmp_path):
    """The implicit backward saves the same bytes at K = 5 and 60; the unrolled one grows with
    the iterations; both give the same gradient (float64)."""
    from experiments import solver_memory
    rows = solver_memory.main(["--batch", "16", "--dim", "4", "--dtype", "float64", "--device", "cpu",
                               "--iters", "5", "60", "--out", str(tmp_path)])
    by = {(r["target_iters"], r["mode"]): r for r in rows}
    assert set(by) == {(k, m) for k in (5, 60) for m in ("implicit", "unroll")}
    assert by[5, "implicit"]["saved_fwd_unique_MiB"] == by[60, "implicit"]["saved_fwd_unique_MiB"]
    assert by[60, "unroll"]["saved_fwd_unique_MiB"] > 5 * by[5, "unroll"]["saved_fwd_unique_MiB"]
    for k in (5, 60):   # the implicit forward: the unrolled iterations and one more with graph
        assert by[k, "implicit"]["fwd_fn_calls"] == by[k, "unroll"]["fwd_fn_calls"] + 1
        assert by[k, "unroll"]["grad_rel_diff"] < 1e-8
    assert (tmp_path / "solver_memory.md").stat().st_size > 0
    assert json.loads((tmp_path / "solver_memory.json").read_text())["batch"] == 16


@pytest.mark.parametrize("argv, message", [
    (["--batch", "0"], "argument --batch: expected an integer >= 1, got 0"),   # was: batch 512
    (["--iters", "0"], "argument --iters: expected an integer >= 1, got 0"),   # ZeroDivisionError
    (["--dim", "0"], "argument --dim: expected an integer >= 1, got 0"),
    (["--threads", "-1"], "argument --threads: expected an integer >= 0, got -1"),
    (["--device", "gpu"], "argument --device: invalid choice"),
])
def test_solver_memory_refuses_bad_arguments(tmp_path, capsys, argv, message):
    from experiments import solver_memory
    _refused(solver_memory.main, ["--quick", "--iters", "3", *argv, "--out", str(tmp_path / "o")],
             capsys, message)
    assert not (tmp_path / "o").exists()


@NO_CUDA
def test_solver_memory_refuses_cuda_without_cuda(tmp_path, capsys):
    from experiments import solver_memory
    _refused(solver_memory.main, ["--device", "cuda", "--out", str(tmp_path / "o")], capsys,
             "CUDA is not available")


# ----------------------------------------------------------------------------- rollout_sharded

def test_rollout_sharded_tiny_run_one_process(tmp_path, monkeypatch):
    from experiments import rollout_sharded
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    rollout_sharded.main(["--batch", "40", "--steps", "20", "--save-every", "5", "--chunk", "10",
                          "--out", str(tmp_path / "r")])
    rep = json.loads((tmp_path / "r.json").read_text())
    res, cfg = rep["results"], rep["config"]
    assert cfg["world_size"] == 1 and cfg["batch"] == 40 and res["batch_per_rank"] == [40]
    assert res["throughput_total"] == 40 * 20 / max(res["seconds_per_rank"])
    assert 0 < res["energy_error_mean"] <= res["energy_error_max"] < 1e-2   # verlet, h = 0.01
    assert "| total | 40 |" in (tmp_path / "r.md").read_text()


def test_rollout_sharded_quick_keeps_explicit_sizes_and_dotted_out_names(tmp_path, monkeypatch):
    """--quick overrode an explicit --batch / --steps; --out run.v2 wrote run.json (with_suffix)."""
    from experiments import rollout_sharded
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    rollout_sharded.main(["--quick", "--batch", "8", "--steps", "10", "--save-every", "5",
                          "--out", str(tmp_path / "run.v2")])
    rep = json.loads((tmp_path / "run.v2.json").read_text())
    assert rep["config"]["batch"] == 8 and rep["config"]["steps"] == 10
    assert (tmp_path / "run.v2.md").exists() and not (tmp_path / "run.json").exists()
    rollout_sharded.main(["--batch", "4", "--steps", "10", "--save-every", "5",
                          "--out", str(tmp_path / "named.json")])
    assert (tmp_path / "named.json").exists() and (tmp_path / "named.md").exists()


@pytest.mark.parametrize("argv, message", [
    (["--chunk", "0"], "argument --chunk: expected an integer >= 1, got 0"),   # ZeroDivisionError
    (["--save-every", "7"], "--save-every (7) must divide --steps (100)"),       # library ValueError
    (["--steps", "50", "--save-every", "30"], "--save-every (30) must divide --steps (50)"),
    (["--method", "verlett"], "argument --method: invalid choice: 'verlett'"),
    (["--method", "rattle"], "argument --method: invalid choice: 'rattle'"),    # not a (q, p) H method
    (["--batch", "0"], "argument --batch: expected an integer >= 1, got 0"),
    (["--h", "0"], "argument --h: expected a finite nonzero step size"),
    (["--threads", "0"], "argument --threads: expected an integer >= 1, got 0"),
])
def test_rollout_sharded_refuses_bad_arguments(tmp_path, capsys, monkeypatch, argv, message):
    from experiments import rollout_sharded
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    _refused(rollout_sharded.main, ["--batch", "100", "--steps", "100", *argv,
                                    "--out", str(tmp_path / "r")], capsys, message)
    assert not (tmp_path / "r.json").exists()


def test_rollout_sharded_refuses_a_batch_smaller_than_the_processes(tmp_path, capsys, monkeypatch):
    from experiments import rollout_sharded
    monkeypatch.setenv("WORLD_SIZE", "4")   # refused before joining any process group
    _refused(rollout_sharded.main, ["--batch", "3", "--steps", "10", "--out", str(tmp_path / "r")],
             capsys, "--batch (3) is smaller than the 4 processes")


@NO_CUDA
def test_rollout_sharded_refuses_cuda_without_cuda(tmp_path, capsys, monkeypatch):
    from experiments import rollout_sharded
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    _refused(rollout_sharded.main, ["--device", "cuda", "--quick", "--out", str(tmp_path / "r")],
             capsys, "CUDA is not available")


# ----------------------------------------------------------------------------- gpu_check

@NO_CUDA
def test_gpu_check_refuses_to_pass_off_the_cpu_as_the_gpu(tmp_path, capsys):
    """Without CUDA the default device was the CPU: the 'GPU check' compared the CPU with
    itself and passed; --device cuda was a traceback from torch.cuda."""
    from experiments import gpu_check
    out = str(tmp_path / "gc")
    for argv in ([], ["--device", "cuda"], ["--device", "cuda:0"]):
        _refused(gpu_check.main, [*argv, "--only", "eager, every state", "--out", out], capsys,
                 "CUDA is not available on this machine")
    assert not (tmp_path / "gc.json").exists()


def test_gpu_check_refuses_an_only_that_matches_no_row_and_a_bad_device(tmp_path, capsys):
    """--only with a typo ran 0 rows and reported '0/0 passed', exit 0."""
    from experiments import gpu_check
    _refused(gpu_check.main, ["--device", "cpu", "--only", "eager every state", "--out",
                              str(tmp_path / "gc")], capsys, "no row's name contains")
    _refused(gpu_check.main, ["--device", "gpu0", "--out", str(tmp_path / "gc")], capsys,
             "is not a torch device")
    assert not (tmp_path / "gc.json").exists()


def test_gpu_check_writes_dotted_out_names_whole(tmp_path):
    """--out gc.v2 wrote gc.json / gc.md (with_suffix); now gc.v2.json / gc.v2.md, as
    rollout_sharded (one helper, experiments.problems.report_paths)."""
    from experiments import gpu_check
    from experiments.problems import report_paths
    assert gpu_check.main(["--device", "cpu", "--only", "MemoryError", "--out", str(tmp_path / "gc.v2")]) == 0
    assert (tmp_path / "gc.v2.json").exists() and (tmp_path / "gc.v2.md").exists()
    assert not (tmp_path / "gc.json").exists()
    assert report_paths(tmp_path / "d" / "r.json") == (tmp_path / "d" / "r.json", tmp_path / "d" / "r.md")
    assert (tmp_path / "d").is_dir()


# ----------------------------------------------------------------------------- gpu_session.sh

@NO_CUDA
def test_gpu_session_stops_at_once_without_cuda(tmp_path):
    """It ran every part against a missing GPU (each failing) and exited 0."""
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("DEVICE", None)
    proc = subprocess.run(["bash", str(ROOT / "experiments" / "gpu_session.sh"), str(tmp_path / "o")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "CUDA is not available" in proc.stderr, proc.stderr
    assert not (tmp_path / "o").exists()


STUB = """#!/bin/sh
# a stand-in interpreter: the spring DDP part "succeeds" and writes its report, the rest fail
case "$*" in
  *experiments.hnn.ddp*spring*) echo "# spring report" > results/hnn_ddp_spring_b5.md; exit 0 ;;
esac
exit 3
"""


def test_gpu_session_exits_1_when_a_part_fails_and_copies_only_its_own_reports(tmp_path):
    """A failed part only showed as 'rc=3' in the log (the script exited 0), and every
    results/hnn_ddp_*.md, earlier runs' included, was copied as this session's."""
    repo = tmp_path / "repo"
    (repo / "results").mkdir(parents=True)
    stale = repo / "results" / "hnn_ddp_twobody_b5.md"
    stale.write_text("# an earlier run\n")
    os.utime(stale, (1e9, 1e9))
    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    env = dict(os.environ, PYTHON=str(stub), DEVICE="cpu", BATCHES="4")
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(ROOT / "experiments" / "gpu_session.sh"), str(out)],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    log = (out / "log.txt").read_text()
    assert "gpu_check rc=3" in log and "ddp spring float32 rc=0" in log and "bench gpu rc=3" in log
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "failed: gpu_check (rc 3); ddp pendulum float64 (rc 3)" in proc.stderr
    assert "ddp spring" not in proc.stderr
    assert (out / "hnn_ddp_spring_b5.md").exists() and not (out / "hnn_ddp_twobody_b5.md").exists()


# ----------------------------------------------------------------------------- torchdiffeq_suite

TINY_TESTS = '''
import unittest

import torch
import torchdiffeq


class TestTiny(unittest.TestCase):
    def test_decay(self):   # delegated to torchdiffeq through torchgeo_int: passes in both runs
        t = torch.linspace(0, 1, 11, dtype=torch.float64)
        for method in ("rk4", "dopri5"):
            with self.subTest(method=method):
                y = torchdiffeq.odeint(lambda t, y: -y, torch.ones(2, dtype=torch.float64), t,
                                       method=method)
                self.assertLess(float((y[-1] - torch.exp(torch.tensor(-1.0))).abs().max()), 1e-5)

    def test_whose_odeint(self):   # fails only through torchgeo_int
        self.assertTrue(torchdiffeq.odeint.__module__.startswith("torchdiffeq"))

    def test_broken(self):   # fails in both
        self.fail("broken in both runs")
'''


@pytest.fixture
def checkout(tmp_path):
    """A toy torchdiffeq checkout: the installed package and one test module of our own."""
    import torchdiffeq
    src = tmp_path / "tdq"
    shutil.copytree(pathlib.Path(torchdiffeq.__file__).parent, src / "torchdiffeq",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (src / "tests").mkdir()
    (src / "tests" / "tiny_tests.py").write_text(textwrap.dedent(TINY_TESTS))
    (src / "tests" / "problems.py").write_text("")
    return src


def test_torchdiffeq_suite_runs_a_checkout_both_ways(checkout, tmp_path):
    from experiments import torchdiffeq_suite as ts
    res = tmp_path / "res"
    ts.main(["--torchdiffeq-src", str(checkout), "--results", str(res)])
    s = json.loads((res / "torchdiffeq_suite.json").read_text())
    assert s["tests"] == ["tiny_tests"] and s["commit"] == "unknown (not a git checkout)"
    assert s["subtests"] == {"torchdiffeq": 4, "torchgeo_int": 4}
    assert s["failing"] == {"torchdiffeq": 1, "torchgeo_int": 2}
    assert list(s["failing_only_through_torchgeo_int"]) == ["tiny_tests.TestTiny.test_whose_odeint"]
    assert s["failing_through_both"] == ["tiny_tests.TestTiny.test_broken"]
    assert s["failing_only_through_torchdiffeq"] == {}
    assert "Failing only through torchgeo_int: 1" in (res / "torchdiffeq_suite.md").read_text()
    for mode in ("torchdiffeq", "torchgeo_int"):
        assert (res / f"torchdiffeq_suite.{mode}.json").exists()


@pytest.mark.parametrize("argv, message", [
    (["--tests", "tiny_test"], "--tests: no module tiny_test in"),   # was: the child's traceback
    (["--runs", "torchgeo"], "--runs: unknown torchgeo; known: torchdiffeq, torchgeo_int"),
    (["--reuse", "torchdifeq"], "--reuse: unknown torchdifeq"),       # was: silently ignored
    (["--timeout", "0"], "--timeout must be > 0 seconds"),
])
def test_torchdiffeq_suite_refuses_bad_arguments(checkout, tmp_path, capsys, argv, message):
    from experiments import torchdiffeq_suite as ts
    _refused(ts.main, ["--torchdiffeq-src", str(checkout), "--results", str(tmp_path / "res"), *argv],
             capsys, message)
    assert not (tmp_path / "res").exists()


def test_torchdiffeq_suite_without_a_run_to_make_or_reuse_is_an_error(checkout, tmp_path):
    """--runs torchgeo_int with no torchdiffeq run to reuse printed a note and exited 0."""
    from experiments import torchdiffeq_suite as ts
    with pytest.raises(SystemExit) as e:
        ts.main(["--torchdiffeq-src", str(checkout), "--results", str(tmp_path / "res"),
                 "--runs", "torchgeo_int", "--reuse", "torchdiffeq"])
    assert "no torchdiffeq run" in str(e.value.code) and "there is no" in str(e.value.code)


def test_torchdiffeq_suite_commit_is_the_checkouts_own(checkout, tmp_path):
    """A copy sitting inside another git repository was reported as that repository's HEAD."""
    from experiments import torchdiffeq_suite as ts
    if shutil.which("git") is None:
        pytest.skip("no git")
    outer = tmp_path
    git = ["git", "-C", str(outer), "-c", "user.name=t", "-c", "user.email=t@t", "-c",
           "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "outer"], check=True)
    assert ts._commit(str(checkout)) == "unknown (not a git checkout)"
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    subprocess.run([*git[:2], str(checkout), *git[3:], "commit", "-q", "--allow-empty", "-m", "own"],
                   check=True)
    own = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert ts._commit(str(checkout)) == own
