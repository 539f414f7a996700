"""torchdiffeq's own test suite run through ``torchgeo_int.odeint``: which sub-tests fail only through us.

    python -m experiments.torchdiffeq_suite --torchdiffeq-src /path/to/torchdiffeq [--tests event_tests,...]

``PATH`` is a checkout of torchdiffeq (its ``torchdiffeq/`` package and ``tests/`` folder, e.g.
its master branch); it is never installed: each run is a child process that puts ``PATH`` first
on ``sys.path`` (so ``import torchdiffeq`` — in the tests and in ``torchgeo_int`` alike — is that
checkout) and ``PATH/tests`` next (the tests import ``problems``).  Two runs of the same test
modules (``tests/*_tests.py``):

* **torchdiffeq**: the tests as they are;
* **torchgeo_int**: every test module's name ``torchdiffeq`` is replaced by a proxy of the module
  whose ``odeint`` is ``torchgeo_int.odeint`` (everything else — ``odeint_adjoint``,
  ``odeint_event`` — stays torchdiffeq's; our own ``odeint_adjoint`` refuses the geometric names
  by design).  ``torchgeo_int.odeint`` then delegates every name of the checkout's ``SOLVERS``
  except those it defines itself (``implicit_euler`` and ``implicit_midpoint`` at master), which
  run our geometric methods.

A sub-test is one ``self.subTest(...)`` (or a test without sub-tests), keyed by the test's id and
its parameters.  The report counts the sub-tests run and those failing (failure or error) in each
run, and lists those that fail through torchgeo_int but pass through torchdiffeq — the goal is
none.  Writes results/torchdiffeq_suite.{json,md}, and each run's outcomes to
results/torchdiffeq_suite.<run>.json (``--results DIR`` for another folder); ``--reuse
torchdiffeq`` takes the torchdiffeq run from there (it does not depend on torchgeo_int) when it
was made with the same checkout and tests.  ``--tests`` names must be modules of ``PATH/tests``,
``--runs`` and ``--reuse`` names among ``torchdiffeq,torchgeo_int``; a run neither made nor
reusable, or one past ``--timeout``, ends the script with a one-line error (exit 1).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODES = ("torchdiffeq", "torchgeo_int")


def _child(src: str, tests: list[str], mode: str, out: str) -> None:
    """Run the test modules in this process and write {key: "ok" | "fail: ..."} to ``out``."""
    import types
    import unittest
    import warnings

    sys.path.insert(0, str(pathlib.Path(src) / "tests"))
    sys.path.insert(0, src)
    sys.path.insert(2, str(ROOT))
    import torch
    import torchdiffeq
    assert pathlib.Path(torchdiffeq.__file__).resolve().is_relative_to(pathlib.Path(src).resolve()), \
        f"torchdiffeq imported from {torchdiffeq.__file__}, not from {src}"
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    proxy = None
    if mode == "torchgeo_int":
        import torchgeo_int
        proxy = types.ModuleType("torchdiffeq")
        proxy.__dict__.update({k: v for k, v in vars(torchdiffeq).items() if not k.startswith("__")})
        proxy.odeint = torchgeo_int.odeint

    outcomes: dict[str, str] = {}

    class Result(unittest.TestResult):
        def _key(self, test, subtest=None):
            return test.id() + ("" if subtest is None else " " + subtest._subDescription())

        def _fail(self, key, err):
            exc = err[1]
            msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            outcomes[key] = "fail: " + msg[:300]

        def addSubTest(self, test, subtest, err):
            super().addSubTest(test, subtest, err)
            if err is None:
                outcomes[self._key(test, subtest)] = "ok"
            else:
                self._fail(self._key(test, subtest), err)

        def addSuccess(self, test):
            super().addSuccess(test)
            if not any(k.startswith(test.id() + " ") for k in outcomes):
                outcomes[self._key(test)] = "ok"

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._fail(self._key(test), err)

        def addError(self, test, err):
            super().addError(test, err)
            self._fail(self._key(test), err)

    suite = unittest.TestSuite()
    for name in tests:
        module = __import__(name)
        if proxy is not None:
            module.torchdiffeq = proxy
        suite.addTests(unittest.defaultTestLoader.loadTestsFromModule(module))
    t0 = time.time()
    suite.run(Result())
    with open(out, "w") as f:
        json.dump({"outcomes": outcomes, "seconds": time.time() - t0,
                   "torchdiffeq_file": torchdiffeq.__file__}, f)


def _run(src, tests, mode, timeout):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        cmd = [sys.executable, "-m", "experiments.torchdiffeq_suite", "--child", mode,
               "--torchdiffeq-src", src, "--tests", ",".join(tests), "--out", out]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout, capture_output=True,
                                  text=True)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"torchdiffeq_suite: the {mode} run took longer than --timeout "
                             f"{timeout:g} s (stopped)") from None
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"the {mode} run failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
        with open(out) as f:
            return json.load(f)


def _commit(src):
    """The checkout's short commit; not that of a repository the folder merely sits in (a
    scratch copy inside another checkout would be reported as that checkout's HEAD)."""
    def git(*args):
        return subprocess.run(["git", "-C", src, *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        top = pathlib.Path(git("rev-parse", "--show-toplevel")).resolve()
        if top != pathlib.Path(src).resolve():
            return "unknown (not a git checkout)"
        return git("rev-parse", "--short", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def _names(ap, option, text, known):
    """The comma-separated names of ``option``, each one of ``known`` (else a one-line error)."""
    names = [n for n in text.split(",") if n]
    bad = [n for n in names if n not in known]
    if bad:
        ap.error(f"{option}: unknown {', '.join(bad)}; known: {', '.join(known)}")
    return names


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--torchdiffeq-src", required=True, help="a torchdiffeq checkout (package + tests/)")
    ap.add_argument("--tests", default=None,
                    help="comma-separated test modules of PATH/tests (default: every *_tests.py)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per run (> 0)")
    ap.add_argument("--commit", default=None, help="the checkout's commit, for the report")
    ap.add_argument("--runs", default=",".join(MODES),
                    help="which runs to make now (comma-separated; the others are reused)")
    ap.add_argument("--reuse", default="", help="runs to take from an earlier report if it matches")
    ap.add_argument("--results", default=str(ROOT / "results"), help="output folder (default results/)")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    src = str(pathlib.Path(args.torchdiffeq_src).resolve())
    if not (pathlib.Path(src) / "torchdiffeq").is_dir() or not (pathlib.Path(src) / "tests").is_dir():
        ap.error(f"{src} must hold torchdiffeq/ and tests/ (a torchdiffeq checkout)")
    available = sorted(p.stem for p in (pathlib.Path(src) / "tests").glob("*.py"))
    if args.tests:
        tests = [t.removesuffix(".py") for t in args.tests.split(",") if t]
        missing = [t for t in tests if t not in available]
        if missing or not tests:
            ap.error(f"--tests: no module {', '.join(missing) or '(none given)'} in {src}/tests; "
                     f"its *_tests modules: {', '.join(t for t in available if t.endswith('_tests'))}")
    else:
        tests = [t for t in available if t.endswith("_tests")]
        if not tests:
            ap.error(f"{src}/tests has no *_tests.py module")
    if args.child:
        _child(src, tests, args.child, args.out)
        return
    runs_now = _names(ap, "--runs", args.runs, MODES)
    reuse = _names(ap, "--reuse", args.reuse, MODES)
    if not args.timeout > 0:
        ap.error(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    res = pathlib.Path(args.results)
    res.mkdir(parents=True, exist_ok=True)
    commit = args.commit or _commit(src)
    runs = {}
    for mode in MODES:
        raw = res / f"torchdiffeq_suite.{mode}.json"
        if mode in reuse and raw.exists():
            old = json.loads(raw.read_text())
            if old.get("tests") == tests and old.get("commit") == commit and old.get("src") == src:
                runs[mode] = old
                print(f"reusing the {mode} run of {raw}", flush=True)
                continue
        if mode not in runs_now:
            why = ("it does not match this checkout and these tests" if mode in reuse and raw.exists()
                   else f"there is no {raw}" if mode in reuse else "not in --reuse")
            raise SystemExit(f"torchdiffeq_suite: no {mode} run: not in --runs, and none to reuse "
                             f"({why})")
        print(f"running torchdiffeq's tests {tests} through {mode} ...", flush=True)
        runs[mode] = dict(_run(src, tests, mode, args.timeout), tests=tests, commit=commit, src=src)
        raw.write_text(json.dumps(runs[mode]))
        n_fail = sum(v != "ok" for v in runs[mode]["outcomes"].values())
        print(f"  {len(runs[mode]['outcomes'])} sub-tests, {n_fail} failing, "
              f"{runs[mode]['seconds']:.0f} s", flush=True)
    ref, ours = runs["torchdiffeq"]["outcomes"], runs["torchgeo_int"]["outcomes"]
    fail_ref = {k for k, v in ref.items() if v != "ok"}
    fail_ours = {k for k, v in ours.items() if v != "ok"}
    only_ours = sorted(fail_ours - fail_ref)
    only_ref = sorted(fail_ref - fail_ours)
    summary = {
        "torchdiffeq_src": src, "commit": commit, "tests": tests,
        "subtests": {m: len(runs[m]["outcomes"]) for m in MODES},
        "failing": {"torchdiffeq": len(fail_ref), "torchgeo_int": len(fail_ours)},
        "failing_only_through_torchgeo_int": {k: ours[k] for k in only_ours},
        "failing_only_through_torchdiffeq": {k: ref[k] for k in only_ref},
        "failing_through_both": sorted(fail_ref & fail_ours),
        "seconds": {m: runs[m]["seconds"] for m in MODES},
    }
    (res / "torchdiffeq_suite.json").write_text(json.dumps(summary, indent=1))
    lines = [f"# torchdiffeq's tests (commit {summary['commit']}) through torchgeo_int.odeint", "",
             "| run | sub-tests | failing |", "|---|---|---|"]
    lines += [f"| {m} | {summary['subtests'][m]} | {summary['failing'][m]} |" for m in MODES]
    lines += ["", f"Failing only through torchgeo_int: {len(only_ours)}"]
    lines += [f"- `{k}`: {ours[k].replace('|', '/')}" for k in only_ours]
    lines += ["", f"Failing only through torchdiffeq: {len(only_ref)}"]
    lines += [f"- `{k}`" for k in only_ref]
    lines += ["", f"Failing through both: {len(fail_ref & fail_ours)}"]
    lines += [f"- `{k}`: {ours[k].replace('|', '/')}" for k in sorted(fail_ref & fail_ours)]
    (res / "torchdiffeq_suite.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:6 + len(MODES)]))
    print(f"failing only through torchgeo_int: {len(only_ours)}; only through torchdiffeq: "
          f"{len(only_ref)}; through both: {len(fail_ref & fail_ours)}")
    for k in only_ours[:60]:
        print("  ", k, "->", ours[k][:160])
    print(f"wrote {res / 'torchdiffeq_suite.md'} and .json")


if __name__ == "__main__":
    main()
