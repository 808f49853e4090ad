"""`make gpu-check DEVICE=cpu`: the GPU check's script at its tiny CPU size, so it cannot rot
between the rare runs on a GPU. Strategies train through the real stages; every check
must pass and every figure the GPU run reports must be there. It runs as on a GPU machine
without the pinned environment: a python that has torch and what comes with it, plus the
packages `make gpu-wheels` carries there, and nothing else."""

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.gpu_wheels import MACHINE, normalize, read_lock, select
from support import LEARNED, REPO

# single (the ratios' reference), fsdp (an identity kept at any world size) and
# pipeline_parallel (its stages in one process) take every path of the script; every
# strategy's stage itself is tested by the every_strategy runs, so three keep this cheap
RUN = ["single", "dp", "fsdp", "pipeline_parallel"]  # dp: also the did_not_fit check's
CHECKS = {
    "stages",
    "replicas_bf16",
    "precision_auto",
    "memory_peaks",
    "accuracy_is_model",
    "mlflow_runs",
    "null_comparison",
    "did_not_fit",
    "shared_device",
}


def machine_python(root: Path) -> tuple[str, str]:
    """(interpreter, PYTHONPATH) of a python like such a machine's: this one's base interpreter
    in a bare venv, seeing torch and its companions (gpu_wheels.MACHINE) and the carried
    selection, each distribution's own files linked from this environment (file by file:
    namespace directories such as mlflow/ or google/ hold other distributions' files too)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", root / "venv"], check=True)
    carried = select(read_lock((REPO / "requirements.lock").read_text()))
    site = root / "site"
    for dist in importlib.metadata.distributions():
        name = normalize(dist.metadata["Name"])
        if not (MACHINE.fullmatch(name) or name in carried):
            continue
        for file in dist.files or ():
            link = site / file
            if file.parts[0] != ".." and not link.is_symlink():  # ../bin/...: scripts
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(dist.locate_file(file))
    return str(root / "venv" / "bin" / "python"), str(site)


def gpu_check(
    *args: str, python: str = sys.executable, path: str = "", **extra: str
) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    env.update(extra)
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [python, "-m", "benchmarks.gpu_check", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, text=True, capture_output=True, timeout=900)


def test_the_cpu_run_passes_every_check_and_measures_every_strategy(tmp_path):
    python, path = machine_python(tmp_path / "machine")
    out = tmp_path / "gpu-check.json"
    # one strategy again with 2 ranks is the shared_device check's path (each costs a stage)
    args = ("--device", "cpu", "--synthetic", "--strategies", *RUN, "--two-ranks", "fsdp")
    args += ("--out", str(out))
    proc = gpu_check(*args, python=python, path=path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["finished"] is True  # rewritten after every stage, finished at the end
    assert {c["check"] for c in result["checks"] if c["ok"]} == CHECKS
    for name in CHECKS:
        assert f"gpu-check: PASS {name}:" in proc.stdout
    assert result["info"]["torch"] == torch.__version__  # which torch it used
    assert result["data"] == "synthetic (512/128 images)"
    rows = result["rows"]
    # the A/A repeat of single, last; before it the strategies of several ranks with 2
    assert set(rows) == {*RUN, "fsdp_2ranks", "single_again"}
    assert rows["fsdp_2ranks"]["shared_devices"] == {}  # 2 processes on the CPU: own cores
    assert rows["fsdp_2ranks"]["x_single"] > 0
    assert "fsdp: 2 ranks (CPU) test_acc" in proc.stdout
    assert rows["single"]["x_single"] == 1.0
    assert rows["single"]["beyond_noise"] is False  # single against itself
    assert rows["single_again"]["test_acc"] == rows["single"]["test_acc"]
    assert "A/A: single twice: steady epochs" in proc.stdout
    for name, row in rows.items():
        assert row["steady_epoch_s"] > 0 and row["samples_per_s"] > 0, name
        assert 0 < row["mfu"] < 1, name
        assert row["precision"] == "fp32", name  # precision auto on the CPU
        assert row["train_peak_mib"] and row["eval_peak_mib"], name
        # tiny_params' configuration (width 8, 512 samples, 2 epochs of 16 steps, the bands):
        # measured 1.0 for every strategy with AVX-512 and AVX2 kernels; bound 0.5, chance 0.1
        assert row["test_acc"] >= LEARNED, name
    assert f"| single | {rows['single']['steady_epoch_s']:.3f} | 1.00 |" in proc.stdout


def test_asking_for_a_gpu_where_there_is_none_is_one_line_and_exit_2():
    proc = gpu_check("--device", "cuda")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"gpu-check: --device cuda, but torch {torch.__version__} sees no GPU; expected a "
        "CUDA GPU (or DEVICE=cpu for the tiny CPU run)"
    ]


def test_a_failing_stage_costs_its_own_row_and_the_others_still_run(tmp_path):
    """On the rare GPU hour one broken stage must not hide the rest: each stage that fails
    (here every one, by a raised fault) is said with its error and left out, none of the
    checks passes on no runs, and the exit is 1 with the JSON written."""
    out = tmp_path / "gpu-check.json"
    proc = gpu_check(
        *("--device", "cpu", "--synthetic", "--strategies", "single", "pipeline_parallel"),
        *("--two-ranks", "--out", str(out)),  # none again with 2 ranks: one stage fewer
        PARALLEL_LAB_FAULT="rank=0,point=start,action=raise",
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    error = "RuntimeError: fault: rank 0 raised at the start"
    strategy_of = {"single": "single", "pipeline_parallel": "pipeline_parallel"}
    strategy_of["single_again"] = "single"  # the A/A repeat
    assert set(result["failures"]) == set(strategy_of)
    for row, text in result["failures"].items():
        command = f"python -m pipeline.train {strategy_of[row]} exited 1"
        assert text.startswith(f"{command}: ") and error in text
        assert f"gpu-check: {row}: FAILED, {command}" in proc.stdout
    passed = {c["check"] for c in result["checks"] if c["ok"]}
    assert passed == {"replicas_bf16"}  # the one check that trains no stage
    assert "gpu-check: FAIL null_comparison: single and single_again did not both train" in (
        proc.stdout
    )
    assert (
        "gpu-check: FAIL stages: 0 of 3 trained; single failed; pipeline_parallel failed; "
        "single_again failed" in proc.stdout
    )
    assert result["rows"] == {}


def test_the_shared_device_probe_runs_every_operation_with_two_ranks_on_one_device():
    """What gloo must carry where ranks share a GPU, asked of the CPU here (CUDA tensors on a
    GPU: benchmarks/gpu_session.sh)."""
    cmd = [sys.executable, "-m", "benchmarks.shared_device_probe", "--device", "cpu"]
    proc = subprocess.run(
        [*cmd, "--ranks", "2"], cwd=REPO, text=True, capture_output=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    said = [line.strip() for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert len(said) == 7 and all(": ok" in line for line in said), said
    assert "all_reduce: ok 3 (expected 3)" in proc.stdout
    assert "gradients equal on every rank: True" in proc.stdout
