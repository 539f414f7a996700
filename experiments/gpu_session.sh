#!/usr/bin/env bash
# The GPU checks as one prepared script (about 7 minutes on one H200):
#   1. experiments.gpu_check: the library's main paths on the GPU against the CPU;
#   2. the nccl path with one process (nccl refuses two ranks on one GPU): DDP training checked
#      against single-process training (float32 and float64), and a sharded rollout;
#   3. experiments.bench.gpu: the throughput table, batches 10⁴, 10⁶, 10⁷, float32 and float64.
# Every part has its own time limit, so a slow part cannot eat the others' time, and its exit
# status is logged. Usage (from the repository root, with torch and CUDA installed):
#     bash experiments/gpu_session.sh OUT_DIR
# OUT_DIR gets log.txt, gpu_check.{md,json}, sharded.{md,json}, gpu.{md,json,png} and the DDP
# reports hnn_ddp_*.md.  DEVICE=cpu BATCHES=4 runs the same parts on the CPU (gloo), small.
set -u
device=${DEVICE:-cuda}
batches=${BATCHES:-10000 1000000 10000000}
out=${1:?usage: bash experiments/gpu_session.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
log="$out/log.txt"
py=${PYTHON:-python3}
run() {  # run SECONDS LABEL COMMAND...: the command's output (progress bars dropped) into the log
    local limit=$1 label=$2; shift 2
    echo "== $label" >>"$log"
    timeout "$limit" "$@" 2>&1 | tr '\r' '\n' | grep -v -e 'step/s' -e 'it/s' >>"$log"
    echo "$label rc=${PIPESTATUS[0]}" >>"$log"
}
{ nvidia-smi -L; "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"; } >"$log" 2>&1
run 170 gpu_check "$py" -m experiments.gpu_check --device "$device" --out "$out/gpu_check"
run 100 "ddp spring float32" "$py" -m torch.distributed.run --nproc_per_node=1 -m experiments.hnn.ddp \
    --task spring --dtype float32 --quick --check --device "$device"
run 100 "ddp pendulum float64" "$py" -m torch.distributed.run --nproc_per_node=1 -m experiments.hnn.ddp \
    --task pendulum --dtype float64 --quick --check --device "$device"
cp results/hnn_ddp_*.md "$out/" 2>/dev/null
run 60 "sharded rollout" "$py" -m torch.distributed.run --nproc_per_node=1 experiments/rollout_sharded.py \
    --device "$device" --batch 1000000 --steps 200 --out "$out/sharded"
run 330 "bench gpu" "$py" -m experiments.bench.gpu --batches $batches --device "$device" --out "$out" --no-progress
grep -e ' rc=' -e '^ok ' -e '^FAIL' -e 'passed' -e 'max |Δθ|' "$log"
