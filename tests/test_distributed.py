"""torch.distributed glue: 2 CPU processes (gloo, loopback) must reproduce one process exactly.

One spawn runs both checks (process start-up dominates the time): a few DDP training steps
through ``fit`` (derivative matching, double backward inside the loss, Adam) against
single-process ``fit`` on the global batch, and a sharded rollout against ``tgi.rollout``.
"""
import os
import socket
import time

import pytest
import torch
import torch.multiprocessing as mp

from torchgeo_int.distributed import (Objective, ShardedSampler, distributed_loader, shard_bounds,
                                      sharded_rollout, wrap)
from torchgeo_int.nn.losses import derivative_loss, rollout_loss
from torchgeo_int.nn.modules import HNN, SeparableHNN
from torchgeo_int.nn.training import TensorBatches, fit, load_checkpoint
from torchgeo_int.rollout import rollout
from torchgeo_int.systems import SeparableHamiltonian

WORLD = 2
STEPS = 4
GLOBAL_BATCH = 8
TIMEOUT_S = 90.0


def _kepler():
    return SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: -1.0 / q.norm(dim=-1),
                                kinetic_grad=lambda p: p,
                                potential_grad=lambda q: q / q.norm(dim=-1, keepdim=True) ** 3)


def _kepler_batch(B):
    g = torch.Generator().manual_seed(1)
    e = 0.1 + 0.6 * torch.rand(B, generator=g, dtype=torch.float64)
    q0 = torch.stack([1 - e, torch.zeros_like(e)], -1)
    p0 = torch.stack([torch.zeros_like(e), ((1 + e) / (1 - e)).sqrt()], -1)
    return q0, p0


def _spring_points(N=32):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(N, 1, generator=g, dtype=torch.float64)
    p = torch.randn(N, 1, generator=g, dtype=torch.float64)
    noise = 0.1 * torch.randn(N, 2, generator=g, dtype=torch.float64)
    # H = q² + p²: dq = 2p, dp = −2q, with noise so the loss stays away from zero
    return q, p, 2 * p + noise[:, :1], -2 * q + noise[:, 1:]


def _windows_loss(m, q, p):
    return rollout_loss(m, q, p, dt=0.1, layout="windows")   # (random windows: no axis looks like time)


def _hnn_windows(N=16, k=3):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(N, k + 1, 1, generator=g, dtype=torch.float64)
    p = torch.randn(N, k + 1, 1, generator=g, dtype=torch.float64)
    return q, p


def _model(cls):
    torch.manual_seed(0)
    return cls(1, width=16, depth=2, activation="tanh").double()


def _single_process(cls, loss_fn, data):
    model = _model(cls)
    hist = fit(model, loss_fn, data, steps=STEPS, batch_size=GLOBAL_BATCH, seed=5, lr=1e-2,
               progress=False)
    return model.state_dict(), hist


def _worker(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    from torchgeo_int.distributed import cleanup, init_from_env, reduce_history
    info = init_from_env(device="cpu", timeout_s=60)
    assert info.world_size == WORLD and info.rank == rank and info.backend == "gloo"
    res = {}
    try:
        for key, cls, loss_fn, data in (
                ("derivative", HNN, derivative_loss, _spring_points()),
                ("rollout", SeparableHNN, _windows_loss, _hnn_windows())):
            model = _model(cls)
            module, loss = wrap(model, loss_fn)
            ckpt = os.path.join(out_dir, f"{key}.pt")
            hist = fit(module, loss, distributed_loader(data, GLOBAL_BATCH, seed=5), steps=STEPS,
                       seed=5, lr=1e-2, progress=False, checkpoint=ckpt)
            res[key] = {"params": model.state_dict(), "loss": reduce_history(hist)["loss"]}
        try:                               # DDP needs parameters: a clear error, not DDP's
            wrap(torch.nn.Identity(), lambda m, x: x.sum())
            res["no_params"] = "accepted"
        except ValueError as err:
            res["no_params"] = str(err)
        q0, p0 = _kepler_batch(11)        # 11 rows: shards of 6 and 5
        out = sharded_rollout(_kepler(), q0, p0, h=0.05, steps=40, method="yoshida4",
                              save_every=4, return_trajectories=True)
        chunked = sharded_rollout(_kepler(), q0, p0, h=0.05, steps=40, method="yoshida4",
                                  save_every=4, chunk_steps=8)
        res["rollout_stats"] = {k: out[k] for k in ("energy_error_max", "energy_error_mean",
                                                    "energy_rel_error_max", "local_batch")}
        res["chunked_stats"] = {k: chunked[k] for k in ("energy_error_max", "energy_error_mean")}
        res["q"], res["p"] = out["q"], out["p"]
    finally:
        module = loss = None   # DDP gone before its process group (see cleanup)
        cleanup()
    torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    ctx = mp.start_processes(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {WORLD} gloo processes did not finish in {TIMEOUT_S} s")
    finally:
        for proc in ctx.processes:          # every child exits, whatever happened
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
    return out, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.mark.parametrize("key", ["derivative", "rollout"])
def test_ddp_fit_equals_single_process_on_the_global_batch(two_ranks, key):
    out, ranks = two_ranks
    if key == "derivative":
        ref, ref_hist = _single_process(HNN, derivative_loss, _spring_points())
    else:
        ref, ref_hist = _single_process(SeparableHNN, _windows_loss,
                                        _hnn_windows())
    init = _model(HNN if key == "derivative" else SeparableHNN).state_dict()
    for r in range(WORLD):
        got = ranks[r][key]["params"]
        assert got.keys() == ref.keys()
        moved = max(float((ref[k] - init[k]).abs().max()) for k in ref)
        assert moved > 1e-4                 # the steps did change the parameters
        for k in ref:
            torch.testing.assert_close(got[k], ref[k], rtol=0, atol=1e-12)
        # the reduced history is the global-batch loss of each step
        torch.testing.assert_close(torch.tensor(ranks[r][key]["loss"]), torch.tensor(ref_hist["loss"]),
                                   rtol=1e-12, atol=0)
    # rank 0 alone checkpointed, and the file loads into the bare model
    files = sorted(p.name for p in out.iterdir() if p.name.startswith(key))
    assert files == [f"{key}.pt"]
    bare = _model(HNN if key == "derivative" else SeparableHNN)
    state = load_checkpoint(out / f"{key}.pt", bare)
    assert state["step"] == STEPS
    # its history is the global-batch loss (rank 0's own losses were saved, so a resumed run's
    # reduce_history averaged them with themselves)
    torch.testing.assert_close(torch.tensor(state["history"]["loss"]), torch.tensor(ref_hist["loss"]),
                               rtol=1e-12, atol=0)
    for k, v in bare.state_dict().items():
        torch.testing.assert_close(v, ref[k], rtol=0, atol=1e-12)


def test_wrap_refuses_a_model_without_parameters_clearly(two_ranks):
    _, ranks = two_ranks
    assert all("has no parameters" in ranks[r]["no_params"] for r in range(WORLD))


def test_sharded_rollout_equals_single_process(two_ranks):
    _, ranks = two_ranks
    q0, p0 = _kepler_batch(11)
    H = _kepler()
    q, p = rollout(H, q0, p0, h=0.05, steps=40, method="yoshida4", save_every=4)
    r0 = ranks[0]
    assert [ranks[r]["rollout_stats"]["local_batch"] for r in range(WORLD)] == [6, 5]
    assert ranks[1]["q"] is None and ranks[1]["p"] is None
    torch.testing.assert_close(r0["q"], q, rtol=0, atol=1e-13)
    torch.testing.assert_close(r0["p"], p, rtol=0, atol=1e-13)
    E = H.energy(q, p)
    err = (E - E[0]).abs()
    for r in range(WORLD):
        s = ranks[r]["rollout_stats"]
        assert s["energy_error_max"] == pytest.approx(float(err.max()), rel=1e-10)
        assert s["energy_error_mean"] == pytest.approx(float(err[1:].mean()), rel=1e-10)
        assert s["energy_rel_error_max"] == pytest.approx(float((err / E[0].abs()).max()), rel=1e-10)
        c = ranks[r]["chunked_stats"]
        assert c["energy_error_max"] == pytest.approx(float(err.max()), rel=1e-8)
        assert c["energy_error_mean"] == pytest.approx(float(err[1:].mean()), rel=1e-8)


# ---------------------------------------------------------------- single-process properties

def test_sampler_global_batches_are_those_of_tensor_batches():
    x = torch.arange(37.0)[:, None]
    tb = TensorBatches(x, 8, seed=4)
    for epoch in (0, 3):
        shards = []
        for r in range(4):
            s = ShardedSampler(37, 8, num_replicas=4, rank=r, seed=4)
            s.set_epoch(epoch)
            shards.append(list(s.local_batches()))
        assert len(shards[0]) == len(tb) == 4
        for i, (batch,) in enumerate(tb.epoch(epoch)):
            union = sorted(sum((shards[r][i] for r in range(4)), []))
            assert union == sorted(batch[:, 0].long().tolist())
    # without a process group the loader is the single-process one
    loader = distributed_loader(x, 8, seed=4)
    for (a,), (b,) in zip(loader, tb.epoch(0)):
        assert torch.equal(a, b)


def test_single_process_sharded_rollout_and_wrap_are_pass_through():
    q0, p0 = _kepler_batch(5)
    q, p = rollout(_kepler(), q0, p0, h=0.1, steps=10, method="verlet")
    out = sharded_rollout(_kepler(), q0, p0, h=0.1, steps=10, method="verlet", return_trajectories=True)
    assert torch.equal(out["q"], q) and torch.equal(out["p"], p)
    assert out["world_size"] == 1 and out["local_batch"] == 5 and out["throughput"] > 0
    model = _model(HNN)
    assert wrap(model, derivative_loss) == (model, derivative_loss)
    assert wrap(model, derivative_loss, device="cpu") == (model, derivative_loss)
    # one process on a GPU (torchrun --nproc_per_node=1): the CPU batches are moved to the
    # model's device, as DDP moves them with several (the meta device stands in for cuda here;
    # the GPU run met the CPU batch inside the network)
    seen = []

    def loss_fn(m, q, p, scale):
        seen.append((q.device.type, p.device.type, scale))
        return (q * p).sum() * scale
    on_meta = _model(HNN).to("meta")
    module, loss = wrap(on_meta, loss_fn)
    assert module is on_meta
    loss(module, torch.ones(3, 1), torch.ones(3, 1), 2.0)
    module, loss = wrap(model, loss_fn, device="meta")
    loss(module, torch.ones(3, 1), torch.ones(3, 1), 3.0)
    assert seen == [("meta", "meta", 2.0), ("meta", "meta", 3.0)]
    obj = Objective(model, derivative_loss)
    assert obj.state_dict().keys() == model.state_dict().keys()


def test_shard_bounds_cover_the_batch():
    for n, W in ((11, 2), (7, 3), (100, 8), (4, 4)):
        b = [shard_bounds(n, W, r) for r in range(W)]
        assert b[0][0] == 0 and b[-1][1] == n
        assert all(b[i][1] == b[i + 1][0] for i in range(W - 1))
        assert max(hi - lo for lo, hi in b) - min(hi - lo for lo, hi in b) <= 1


def test_bad_input_raises():
    with pytest.raises(ValueError, match="divisible"):
        ShardedSampler(30, 9, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="rank"):
        ShardedSampler(30, 8, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="NaN"):
        distributed_loader(torch.tensor([[1.0], [float("nan")]]), 2)
    with pytest.raises(ValueError, match="share dim 0"):
        distributed_loader((torch.zeros(4, 1), torch.zeros(3, 1)), 2)
    q0, p0 = _kepler_batch(4)
    with pytest.raises(ValueError, match="steps"):
        sharded_rollout(_kepler(), q0, p0, h=0.1, steps=0)
    with pytest.raises(ValueError, match="chunk_steps"):
        sharded_rollout(_kepler(), q0, p0, h=0.1, steps=10, save_every=2, chunk_steps=3)
    with pytest.raises(ValueError, match="return_trajectories"):
        sharded_rollout(_kepler(), q0, p0, h=0.1, steps=10, chunk_steps=5, return_trajectories=True)
    with pytest.raises(ValueError, match="batch dim"):
        sharded_rollout(_kepler(), q0, p0[:3], h=0.1, steps=10)
    with pytest.raises(ValueError, match="device"):
        from torchgeo_int.distributed import init_from_env
        init_from_env(device="tpu")
