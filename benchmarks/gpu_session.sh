#!/usr/bin/env bash
# Every GPU measurement the open issues wait for, in turn, each under its own time limit, in
# one device call (a lent GPU has 15 minutes in all, its start included):
#
#   bash benchmarks/gpu_session.sh OUT_DIR [WHEELS_DIR] [PART]   # on the GPU machine
#   DEVICE=cpu bash benchmarks/gpu_session.sh /tmp/out '' PART     # the same steps, tiny, on a CPU
#
# PART speed (the default; issue 49, fast by default), each at params.yaml's defaults, the
# steps in the order their figures are wanted (on an H200 on 2026-11-28 the first three steps
# of the old order, choose_defaults first, ran past their limits):
# 1. quickstart: `make quick`'s run, whole (goal <= 30 s, faster than 2 CPU cores; it failed
#    there in its predict stage, fixed since: profile.flat_gathers);
# 2. peer, "default job", one cold round: our stage, the bare loop and Lightning side by side
#    with MFU (the README's table; ours at most 0.5x Lightning's wall), and our run's warm-up
#    and steady epochs (<= 3 s and <= 0.6 s);
# 3. e2e, in what is left: the default experiment, dvc.yaml's stage commands in order (fetch
#    from a local synthetic mirror, every train and predict stage, compare): its total (goal
#    <= 120 s), single's cold stage (<= 20 s) and every strategy's steady epoch; its JSON
#    keeps every command it timed if the budget cuts it short.
# PART choose: choose_defaults alone (it took 85 s cold on the H200): every strategy at world
#    size 1 in one process, eager and with its whole step captured, taking turns: which
#    `train.cuda_graph` auto should give each (the lines for speed_defaults.py's
#    MEASURED_ON_GPU) and the ratios to single.
# PART checks (issues 48, 50, 51):
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
out=${1:?usage: gpu_session.sh OUT_DIR [WHEELS_DIR] [speed|choose|checks]}
wheels=${2:-}
part=${3:-speed}
case $part in
    speed | choose | checks) ;;
    *) echo "gpu_session.sh: PART: got '$part', expected speed, choose or checks" >&2; exit 2 ;;
esac
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
    echo "=== gpu_session: $part on $device, budget $budget s, $(git log --oneline -1 2>/dev/null)"
    [ "$device" = cuda ] && nvidia-smi --query-gpu=name,driver_version,memory.total \
        --format=csv,noheader
    if [ -n "$wheels" ]; then  # what gpu-check's make target installs, for every step
        $py -m pip install -q --no-index --no-deps --upgrade --target .gpu-site "$wheels"/*.whl
        export PYTHONPATH=$PWD/.gpu-site
    fi
    $py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
    if [ "$part" = speed ]; then
        mirror=$(mktemp -d)/mirror  # outside OUT_DIR: only results come back
        tiny=()  # the CPU's trial: the same commands at a size that takes seconds
        [ "$device" = cpu ] && tiny=(--set model.width=4 train.epochs=2)
        if [ "$device" = cuda ]; then n=(60000 10000); else n=(512 256); fi
        $py -c "import sys; from pathlib import Path; from pipeline.data.synthetic import \
write_synthetic; write_synthetic(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))" \
            "$mirror" "${n[@]}"
        if [ "$device" = cuda ]; then size="default job"; else size="one epoch"; fi
        step quickstart 110 $py -m benchmarks.e2e --mirror "$mirror" --quickstart \
            --out "$out/e2e-quickstart.json"
        step peer 190 $py -m benchmarks.peer --runs 1 --warmup 0 --sizes "$size" \
            --out "$out/peer.json"
        step e2e $(($(left) - 5)) $py -m benchmarks.e2e --mirror "$mirror" "${tiny[@]}" \
            --out "$out/e2e-default.json"
    elif [ "$part" = choose ]; then
        choose=()  # the CPU's trial: a size that takes seconds
        [ "$device" = cpu ] && choose=(--set model.width=4 --limit-train 1024)
        step choose_defaults 150 $py -m benchmarks.choose_defaults "${choose[@]}" \
            --out "$out/choose-defaults.json"
    elif [ "$device" = cuda ]; then
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
