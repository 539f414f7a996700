#!/usr/bin/env bash
# The GPU checks as one prepared script (about 7 minutes on one H200):
#   1. experiments.gpu_check: the library's main paths on the GPU against the CPU;
#   2. the nccl path with one process (nccl refuses two ranks on one GPU): DDP training checked
#      against single-process training (float32 and float64), and a sharded rollout;
#   3. experiments.bench.gpu: the throughput table, batches 10⁴, 10⁶, 10⁷, float32 and float64.
# Every part has its own time limit, so a slow part cannot eat the others' time, and its exit
# status is logged. Usage (from the repository root, with torch and CUDA installed):
#     bash experiments/gpu_session.sh OUT_DIR
# OUT_DIR gets log.txt, gpu_check.{md,json}, sharded.{md,json}, gpu.{md,json,png} and this
# session's DDP reports hnn_ddp_*.md.  DEVICE=cpu BATCHES=4 runs the same parts on the CPU
# (gloo), small.  PYTHON picks the interpreter (default python3).  Without CUDA (and DEVICE not
# cpu) it stops at once with one line; it exits 1 when a part failed (its rc in the log).
set -u
device=${DEVICE:-cuda}
batches=${BATCHES:-10000 1000000 10000000}
out=${1:?usage: bash experiments/gpu_session.sh OUT_DIR}
py=${PYTHON:-python3}
if [ "$device" != cpu ] && ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_session.sh: CUDA is not available to $py (DEVICE=$device); run it on a GPU machine, or DEVICE=cpu BATCHES=4 for the CPU" >&2
    exit 1
fi
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
log="$out/log.txt"
failed=""
started="$out/.session_started"   # its mtime: what this session wrote is newer
touch "$started"
run() {  # run SECONDS LABEL COMMAND...: the command's output (progress bars dropped) into the log
    local limit=$1 label=$2 rc; shift 2
    echo "== $label" >>"$log"
    timeout "$limit" "$@" 2>&1 | tr '\r' '\n' | grep -v -e 'step/s' -e 'it/s' >>"$log"
    rc=${PIPESTATUS[0]}
    echo "$label rc=$rc" >>"$log"
    [ "$rc" -eq 0 ] || failed="$failed; $label (rc $rc)"
}
{ nvidia-smi -L; "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"; } >"$log" 2>&1
run 170 gpu_check "$py" -m experiments.gpu_check --device "$device" --out "$out/gpu_check"
run 100 "ddp spring float32" "$py" -m torch.distributed.run --nproc_per_node=1 -m experiments.hnn.ddp \
    --task spring --dtype float32 --quick --check --device "$device"
run 100 "ddp pendulum float64" "$py" -m torch.distributed.run --nproc_per_node=1 -m experiments.hnn.ddp \
    --task pendulum --dtype float64 --quick --check --device "$device"
# this session's reports only, not those of earlier runs left in results/
find results -maxdepth 1 -name 'hnn_ddp_*.md' -newer "$started" -exec cp {} "$out/" \; 2>/dev/null
run 60 "sharded rollout" "$py" -m torch.distributed.run --nproc_per_node=1 experiments/rollout_sharded.py \
    --device "$device" --batch 1000000 --steps 200 --out "$out/sharded"
run 330 "bench gpu" "$py" -m experiments.bench.gpu --batches $batches --device "$device" --out "$out" --no-progress
grep -e ' rc=' -e '^ok ' -e '^FAIL' -e 'passed' -e 'max |Δθ|' "$log"
rm -f "$started"
if [ -n "$failed" ]; then
    echo "gpu_session.sh: failed: ${failed#; }" >&2
    exit 1
fi
