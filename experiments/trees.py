"""Another source tree of this project, measured beside this one: the home of the before/after
benchmarks (``python -m experiments.hnn.cost --against REV``,
``experiments/bench/compare_trees.py --before REV --after REV``).

:func:`tree` names a tree — a directory holding ``torchgeo_int/`` (a worktree, a copy), or a
git revision of this repository, extracted for the duration — and :class:`Worker` runs a script
of *this* checkout in a child process with that tree first on ``sys.path``, answering one JSON
line for each JSON line it is sent.  Each script arranges its imports: ``compare_trees``
measures the other tree's ``torchgeo_int`` with this checkout's benchmarks, ``hnn/cost_worker``
takes that tree's study as well.  The two sides take turns (each blocks on the other's answer),
so on one core their timings interleave as two arms of one process do.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]          # this checkout


@contextlib.contextmanager
def tree(spec, *, needs: tuple[str, ...] = ("torchgeo_int/__init__.py",)):
    """(directory, label) of the tree ``spec`` names: a directory holding the files ``needs``
    as it is (a directory of that name wins over a revision), else a git revision of this
    repository whose ``torchgeo_int`` and ``experiments`` are extracted (``git archive``) into a
    temporary directory, removed afterwards; the label is the directory as given, or the
    revision's name and 12-digit hash."""
    path = Path(spec)
    if all((path / n).is_file() for n in needs):
        yield path.resolve(), str(spec)
        return
    git = ["git", "-C", str(ROOT)]
    what = f"a directory with {', '.join(needs)}"
    try:
        sha = subprocess.run(git + ["rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}"],
                             capture_output=True, text=True, check=True).stdout.strip()
        tar = subprocess.run(git + ["archive", "--format=tar", sha, "torchgeo_int", "experiments"],
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        raise ValueError(f"{spec!r} is neither a tree ({what}) nor a revision of {ROOT} "
                         "that has them") from None
    with tempfile.TemporaryDirectory(prefix="tree_") as tmp:
        with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
            try:
                archive.extractall(tmp, filter="data")
            except TypeError:         # Python before 3.11.4: no extraction filters (our own archive)
                archive.extractall(tmp)
        missing = [n for n in needs if not (Path(tmp) / n).is_file()]
        if missing:
            raise ValueError(f"revision {spec!r} has no {', '.join(missing)}")
        yield Path(tmp), f"{spec} ({sha[:12]})" if not sha.startswith(str(spec)) else sha[:12]


class Worker:
    """``script`` (a file of this checkout) with ``args``, run by a child process whose
    ``sys.path`` starts with ``tree`` (and whose working directory it is), one thread: send it
    JSON lines and read its answers with :meth:`ask`; :meth:`close` (or leaving a ``with``)
    sends ``null`` and waits for it.  A child that stops, answers something else or gives no
    answer within ``timeout`` seconds (then killed) is a RuntimeError carrying the end of its
    stderr."""
    #: seconds an answer may take (a measurement, compiles included); None: no limit
    timeout: float | None = 1800.0
    RUN = ("import runpy, sys; sys.path.insert(0, sys.argv[1]); sys.argv = sys.argv[2:]; "
           "runpy.run_path(sys.argv[0], run_name='__main__')")

    def __init__(self, tree: Path, script, *args: str, env: dict | None = None,
                 timeout: float | None = timeout):
        self.timeout = timeout
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, "-c", self.RUN, str(tree), str(script), *map(str, args)],
                                     cwd=tree, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True,
                                     env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _stopped(self, why: str) -> RuntimeError:
        if not self.log.closed:               # (asked again after a failure: the tail is kept)
            self.log.seek(0)
            self.tail = self.log.read()[-2000:]
        self.close()
        return RuntimeError(f"{why}; its stderr ends:\n{getattr(self, 'tail', '')}")

    def ask(self, message):
        """Send ``message`` as a JSON line; its answer, parsed."""
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):          # (ValueError: closed after a failure)
            raise self._stopped("the worker process stopped") from None
        # the line read beside, so that a child that hangs (a deadlock, a compile that never
        # ends) is an error here instead of a wait for ever
        answer = []
        reader = threading.Thread(target=lambda: answer.append(self.proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(self.timeout)
        if reader.is_alive():
            self.proc.kill()
            reader.join(1)
            # a grandchild may still hold the pipe: then the reader (a daemon) stays blocked in
            # it, and closing the pipe under it would wait for it too
            self._stuck = reader.is_alive()
            raise self._stopped(f"the worker process gave no answer in {self.timeout:g} s (killed)")
        line = answer[0] if answer else ""
        if not line:
            raise self._stopped("the worker process stopped")
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            raise self._stopped(f"the worker process answered {line[:200]!r}") from None

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("null\n")
                self.proc.stdin.close()
            except (OSError, ValueError):
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if not f.closed and not (f is self.proc.stdout and getattr(self, "_stuck", False)):
                f.close()
        if not self.log.closed:
            self.log.close()
