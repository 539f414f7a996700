"""A newcomer's first hour (issue 22, non-core items): the README's training example runs and
trains correctly; a rollout's time-first output cannot be fed to the losses silently; fit's
threads default and its messages; every markdown table the demo writes renders."""
import re
import sys
from pathlib import Path

import pytest
import torch

import torchgeo_int as tgi

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _readme_block(marker: str) -> str:
    """The ```python block of the README that contains ``marker``."""
    for block in re.findall(r"```python\n(.*?)```", README, flags=re.S):
        if marker in block:
            return block
    raise AssertionError(f"no README python block contains {marker!r}")


# -- the README's "train an HNN on your trajectories" example ------------------------------------

def test_readme_train_an_hnn_example_runs_as_written_and_learns_the_force():
    code = _readme_block("# train an HNN on your trajectories")
    lines = [ln for ln in code.strip().splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(lines) <= 10, f"the example has {len(lines)} lines (≤ 10 promised)"
    scope: dict = {}
    exec(compile(code, "README example", "exec"), scope)      # the README's code, unchanged
    model, hist, q, p = scope["model"], scope["hist"], scope["q"], scope["p"]
    assert q.shape[0] > q.shape[1]              # what rollout returned: (T, B, n), time first
    first, last = sum(hist["loss"][:10]) / 10, sum(hist["loss"][-10:]) / 10
    assert last < first / 10, (first, last)
    # trained on the right axis: the learned force −∂V/∂q is the pendulum's −sin q
    qs = torch.linspace(-1.0, 1.0, 9, dtype=torch.get_default_dtype())[:, None]
    with torch.no_grad():
        f = model.to(qs.dtype).force(qs)
    assert torch.allclose(f, -torch.sin(qs), atol=0.1), (f.squeeze(), -torch.sin(qs).squeeze())


# -- the shape contract --------------------------------------------------------------------------

def _data():
    H = tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: (1 - q.cos()).sum(-1))
    g = torch.Generator().manual_seed(0)
    q, p = tgi.rollout(H, torch.randn(8, 1, generator=g), torch.randn(8, 1, generator=g),
                       h=0.1, steps=30)
    return q, p


@pytest.mark.parametrize("call", ["rollout_loss", "residual_loss", "make_windows",
                                  "finite_differences", "rollout_mse"])
def test_time_first_rollout_output_is_refused_naming_both_layouts(call):
    q, p = _data()                      # (31, 8, 1): time first
    model = tgi.nn.SeparableHNN(1, width=8)
    fns = {"rollout_loss": lambda **kw: tgi.nn.rollout_loss(model, q, p, dt=0.1, **kw),
           "residual_loss": lambda **kw: tgi.nn.residual_loss(model, q, p, dt=0.1, **kw),
           "make_windows": lambda **kw: tgi.nn.make_windows(q, p, 3, **kw),
           "finite_differences": lambda **kw: tgi.nn.finite_differences(q, p, 0.1, **kw),
           "rollout_mse": lambda **kw: tgi.nn.rollout_mse(model, q, p, dt=0.1, **kw)}
    with pytest.raises(ValueError, match=rf"{call} takes q, p sample-first, \(N, L, n\).*look "
                                         r"time-first, \(T, B, n\) as tgi.rollout returns.*"
                                         r"layout='time_first'"):
        fns[call]()
    fns[call](layout="time_first")      # said explicitly: accepted
    fns[call](layout="windows")         # the user insists: no check


def test_layout_time_first_equals_the_transposed_data():
    q, p = _data()
    model = tgi.nn.SeparableHNN(1, width=8)
    qt, pt = q.transpose(0, 1).contiguous(), p.transpose(0, 1).contiguous()
    a = tgi.nn.rollout_loss(model, q[:6], p[:6], dt=0.1, layout="time_first")
    b = tgi.nn.rollout_loss(model, qt[:, :6], pt[:, :6], dt=0.1)
    assert torch.equal(a, b)
    wa = tgi.nn.make_windows(q, p, 4, layout="time_first")
    wb = tgi.nn.make_windows(qt, pt, 4)
    assert all(torch.equal(x, y) for x, y in zip(wa, wb))
    da = tgi.nn.finite_differences(q, p, 0.1, layout="time_first")
    db = tgi.nn.finite_differences(qt, pt, 0.1)
    assert all(torch.equal(x, y.transpose(0, 1)) for x, y in zip(da, db))
    with pytest.raises(ValueError, match="layout must be one of"):
        tgi.nn.make_windows(q, p, 4, layout="time-first")


def test_sample_first_windows_pass_the_check_shuffled_or_not():
    q, p = _data()
    qw, pw = tgi.nn.make_windows(q, p, 5, layout="time_first")     # trajectory-major windows
    model = tgi.nn.SeparableHNN(1, width=8)
    tgi.nn.rollout_loss(model, qw, pw, dt=0.1)
    perm = torch.randperm(qw.shape[0], generator=torch.Generator().manual_seed(1))
    tgi.nn.rollout_loss(model, qw[perm], pw[perm], dt=0.1)
    tgi.nn.residual_loss(model, qw[perm[:7]], pw[perm[:7]], dt=0.1)


# -- fit: threads, labels, the loss_fn contract ---------------------------------------------------

def test_fit_uses_one_thread_for_small_batches_and_restores_the_setting():
    before = torch.get_num_threads()
    seen = []

    def loss_fn(model, q, p):
        seen.append(torch.get_num_threads())
        return model.energy(q, p).pow(2).mean()

    q = torch.randn(32, 1)
    try:
        torch.set_num_threads(2)
        tgi.nn.fit(tgi.nn.HNN(1, width=8), loss_fn, (q, q), steps=3, batch_size=8, progress=False)
        assert seen == [1, 1, 1] and torch.get_num_threads() == 2
        seen.clear()
        tgi.nn.fit(tgi.nn.HNN(1, width=8), loss_fn, (q, q), steps=2, batch_size=8, progress=False,
                   threads=None)
        assert seen == [2, 2]
        with pytest.raises(ValueError, match="threads must be"):
            tgi.nn.fit(tgi.nn.HNN(1, width=8), loss_fn, (q, q), steps=1, threads=0)
    finally:
        torch.set_num_threads(before)


def test_fit_progress_bar_has_a_human_label(capsys):
    q = torch.randn(16, 1)
    tgi.nn.fit(tgi.nn.HNN(1, width=8), lambda m, q, p: m.energy(q, p).pow(2).mean(), (q, q),
               steps=2, batch_size=8, progress=True, desc="pendulum, 5 Verlet steps, seed 0")
    err = capsys.readouterr().err
    assert "pendulum, 5 Verlet steps, seed 0" in err and "step" in err


def test_fit_loss_fn_contract_message_shows_the_batch():
    q = torch.randn(16, 1)
    with pytest.raises(TypeError, match=r"loss_fn\(model, \*batch\) must return a scalar tensor, "
                                        r"got shape \(8,\).*2 tensors of shapes \[\(8, 1\), \(8, 1\)\]"):
        tgi.nn.fit(tgi.nn.HNN(1, width=8), lambda m, q, p: m.energy(q, p), (q, q), steps=1,
                   batch_size=8, progress=False)


def test_hnn_demo_progress_labels_are_human():
    sys.path.insert(0, str(ROOT))
    from experiments.hnn import data as datasets, train as hnn_train

    task = datasets.pendulum(0)
    arm = next(a for a in hnn_train.arms(task, windows=(5,)) if a.key == "b5")
    assert "5 verlet steps" in arm.label and "b5" not in arm.label
    src = (ROOT / "experiments" / "hnn" / "train.py").read_text()
    assert 'f"{task.name}, {arm.label}, seed {seed}"' in src


# -- the demo: what it prints and writes ----------------------------------------------------------

def _table_rows(md: str):
    """Markdown tables of ``md`` as lists of rows, each row its list of cells (``\\|`` is a pipe
    inside a cell, not a cell boundary)."""
    tables, cur = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
            cur.append(cells)
        elif cur:
            tables.append(cur)
            cur = []
    return tables


def assert_tables_render(md: str) -> int:
    tables = _table_rows(md)
    for rows in tables:
        width = len(rows[0])
        assert len(rows) >= 2 and all(re.fullmatch(r"\s*:?-{3,}:?\s*", c) for c in rows[1]), rows[:2]
        assert all(len(r) == width for r in rows), [len(r) for r in rows]
    return len(tables)


def test_table_checker_catches_an_unescaped_pipe():
    bad = "| method | max |ΔH/H₀| |\n|---|---|\n| verlet | 1e-5 |\n"
    with pytest.raises(AssertionError):
        assert_tables_render(bad)
    assert assert_tables_render(bad.replace("|ΔH/H₀|", "\\|ΔH/H₀\\|")) == 1


def test_demo_tables_render_and_the_hnn_line_says_win_or_loss(tmp_path, monkeypatch, capsys):
    sys.path.insert(0, str(ROOT))
    from experiments import demo
    from experiments.bench import common

    monkeypatch.setitem(sys.modules, "experiments.hnn", None)
    demo.main(["--fraction", "0.01", "--problems", "kepler", "--out", str(tmp_path)])
    md = (tmp_path / "integrators.md").read_text()
    assert assert_tables_render(md) == 1
    assert "max \\|ΔH/H₀\\|" in md and "÷ max \\|q_ref\\|" in md and "integrators.json" in md
    # every other writer built on common.markdown_table escapes its cells the same way
    t = common.markdown_table([{"a": "x|y", "b": 1.5}], [("a", "a | b"), ("b", "|c|")])
    assert assert_tables_render(t) == 1
    # the HNN verdicts: a ratio above 1 is a loss, below 1 a win, for energy and state
    res = {"trajectory_fit_dopri5": dict(energy_mse=2.0, state_mse=0.1),
           "trajectory_fit": dict(energy_mse=3.0, state_mse=0.2),
           "derivative_matching": dict(energy_mse=1.0, state_mse=0.4),
           "derivative_matching_fd": dict(energy_mse=8.0, state_mse=0.05)}
    lines = demo.hnn_summary(res)
    assert "by dopri5: energy 2, state 0.1 (by Verlet at h = dt: energy 3, state 0.2)" in lines[1]
    assert "energy 1 (trajectory fit worse, 2× higher), state 0.4 (trajectory fit " \
           "better, 4× lower)" in lines[2]
    assert "energy 8 (trajectory fit better, 4× lower), state 0.05 (trajectory fit " \
           "worse, 2× higher)" in lines[3]


def test_readme_tables_render():
    """The README's and the history files' tables: a `|` inside a code span splits a GitHub
    table cell too."""
    assert assert_tables_render(README) >= 5
    for history in ("experiments/hnn/HISTORY.md", "experiments/bench/HISTORY.md"):
        assert assert_tables_render((ROOT / history).read_text()) >= 1, history


def _readme_statement(start: str) -> str:
    """The README's statement that begins with ``start`` (up to its balanced closing bracket)."""
    i = README.index(start)
    depth, j = 0, i
    while True:
        c = README[j]
        depth += c in "([{"
        depth -= c in ")]}"
        j += 1
        if depth == 0 and c in ")]}":
            return README[i:j]


def test_readme_fragments_run_with_their_stated_inputs():
    """Two README lines failed as written: a Splitting of 3 kicks and 2 drifts cannot reach the
    order 4 it declared, and the adaptive odeint call refused a batch of states (batch_dims)."""
    scope = {"tgi": tgi, "torch": torch}
    # Forest–Ruth's shape: 4 kicks, 3 drifts
    th = 1 / (2 - 2 ** (1 / 3))
    scope.update(a0=th / 2, a1=(1 - th) / 2, a2=(1 - th) / 2, a3=th / 2, b0=th, b1=1 - 2 * th, b2=th)
    exec(_readme_statement("mine = tgi.Splitting("), scope)
    assert scope["mine"].order == 4
    # Kepler, a batch of two states, σ = |q|^{3/2}
    e = torch.tensor([0.5, 0.7], dtype=torch.float64)
    q0 = torch.stack([1 - e, torch.zeros_like(e)], -1)
    p0 = torch.stack([torch.zeros_like(e), ((1 + e) / (1 - e)).sqrt()], -1)

    def func(t, y):
        q, p = y
        return p, -q / q.norm(dim=-1, keepdim=True) ** 3

    scope.update(q0=q0, p0=p0, func=func, t=torch.linspace(0, 1, 3, dtype=torch.float64))
    exec(_readme_statement('ys = tgi.odeint(func, (q0, p0), t, method="yoshida4"'), scope)
    q, p = scope["ys"]
    assert q.shape == (3, 2, 2)
    E = 0.5 * (p * p).sum(-1) - 1 / q.norm(dim=-1)
    assert (E - E[0]).abs().max() < 1e-3
    # the tour's network of the invariant |q₁ − q₂|: the same H at a translated, rotated state
    exec(_readme_statement("pair = tgi.nn.SeparableHNN("), scope)
    pair, qq, pp = scope["pair"].double(), torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    moved = torch.cat([-qq[:, 1:2], qq[:, 0:1], -qq[:, 3:4], qq[:, 2:3]], -1) + 0.5     # a quarter turn, shifted
    assert torch.allclose(pair.hamiltonian(moved, pp), pair.hamiltonian(qq, pp), rtol=1e-12, atol=1e-12)
