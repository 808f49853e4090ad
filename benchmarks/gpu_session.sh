#!/usr/bin/env bash
# Every GPU measurement the open issues wait for, in turn, each under its own time limit, in
# one device call (a lent GPU has 15 minutes in all, its start included):
#
#   bash benchmarks/gpu_session.sh OUT_DIR [WHEELS_DIR]      # on the GPU machine
#   DEVICE=cpu bash benchmarks/gpu_session.sh /tmp/out       # the same steps, tiny, on a CPU
#
# 1. gpu-check (what `make gpu-check` runs): every strategy's stage, the A/A null comparison
#    (issue 51), did_not_fit (issue 50), shared_device and shared_fp64 (issue 48 goal 1); its
#    JSON is rewritten after every stage, so a cut-off run still reports what it finished;
# 2. memory_check --device cuda: the per-rank memory predicted at N = 2 and 4 against real
#    ranks sharing the GPU (issue 48 goal 2, within 5% per rank);
# 3. shared_device_probe: which collectives and wrappers gloo runs with 2 and 4 ranks on the
#    one GPU, operation by operation: what explains a shared-device stage that failed.
# A step whose limit no longer fits in BUDGET seconds is skipped and said so. The log and
# every JSON written land in OUT_DIR (at most 8 files come back from a device call).
set -u
out=${1:?usage: gpu_session.sh OUT_DIR [WHEELS_DIR]}
wheels=${2:-}
device=${DEVICE:-cuda}
budget=${BUDGET:-590}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
start=$(date +%s)
log="$out/gpu-session-log.txt"
py=python3
[ -x .venv/bin/python ] && [ "$device" = cpu ] && py=.venv/bin/python

left() { echo $((budget - ($(date +%s) - start))); }
step() {  # step NAME LIMIT_S COMMAND...: run it under LIMIT_S if that still fits
    local name=$1 limit=$2
    shift 2
    if [ "$(left)" -lt "$limit" ]; then
        echo "=== $name: skipped, $(left) s left of $budget, it needs $limit"
        return
    fi
    echo "=== $name at +$(($(date +%s) - start)) s (limit $limit s)"
    timeout -k 10 "$limit" "$@"
    echo "=== $name: exit $?"
}

{
    echo "=== gpu_session: $device, budget $budget s, $(git log --oneline -1 2>/dev/null)"
    [ "$device" = cuda ] && nvidia-smi --query-gpu=name,driver_version,memory.total \
        --format=csv,noheader
    if [ -n "$wheels" ]; then  # what gpu-check's make target installs, for every step
        $py -m pip install -q --no-index --no-deps --upgrade --target .gpu-site "$wheels"/*.whl
        export PYTHONPATH=$PWD/.gpu-site
    fi
    $py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
    if [ "$device" = cuda ]; then
        step gpu_check 470 $py -m benchmarks.gpu_check --out "$out/gpu-check.json"
        step memory_check 80 $py -m benchmarks.memory_check --device cuda --gpus 2 4 \
            --out "$out/memory-check-cuda.json"
        step probe 40 $py -m benchmarks.shared_device_probe --device cuda --ranks 2 4
    else
        step gpu_check 470 $py -m benchmarks.gpu_check --device cpu --synthetic \
            --strategies single fsdp --out "$out/gpu-check.json"
        step memory_check 80 $py -m benchmarks.memory_check --gpus 2 --set model.width=4 \
            --out "$out/memory-check-cpu.json"
        step probe 40 $py -m benchmarks.shared_device_probe --device cpu --ranks 2
    fi
    echo "=== gpu_session: done at +$(($(date +%s) - start)) s"
} 2>&1 | tee "$log"
