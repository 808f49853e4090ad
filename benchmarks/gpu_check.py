"""`make gpu-check`: prove the GPU path and measure it, unattended, in minutes.

    python -m benchmarks.gpu_check                 # on a GPU: width 64, batch 256, 2 epochs
    python -m benchmarks.gpu_check --device cpu    # the same checks at a tiny size (CI runs it)
    python -m benchmarks.gpu_check --two-ranks fsdp   # only fsdp again with 2 ranks

Every strategy trains through the real stages (`python -m pipeline.fetch`, then `python -m
pipeline.train NAME`, each in its own processes under torchrun) in a throw-away copy of the
project with its own MLflow store, on one device with the same settings: ddp and fsdp as one
process, dp and balanced_dp with one replica, pipeline_parallel as 2 stages on the one device.
So a strategy's steady epoch over single's is what its wrapping costs. `channels_last` is off
for all of them (fsdp and pipeline stages cannot take it); on a GPU, `single` also runs at
params.yaml's defaults, the speed a user gets without flags (its step a CUDA graph:
`train.cuda_graph: auto`); every other row runs eager steps (`train.cuda_graph=none`).

The data is the real Fashion-MNIST where data/fashion-mnist/raw holds it (the fetch stage's
output), else synthetic Fashion-MNIST-shaped IDX files whose class shows as a bright band (the
device loader keeps either in GPU memory; time per step does not depend on pixel values).

Checks, each PASS or FAIL in the output and the JSON:
  stages            every stage trained: one that fails or outlives --stage-timeout (its
                    process group stopped) is left out of the rest, and says how it failed
  replicas_bf16     the project's DataParallel wrappers (dp's and balanced_dp's) compute their
                    convolutions in the autocast dtype in every replica; on a GPU with 2
                    replicas on the one GPU where torch allows it (the output says if not)
  precision_auto    `precision: auto` resolved as `auto_choice` says for this device, and each
                    run's identity records the hardware: devices, kind, count, precision, the
                    torch and CUDA versions of the torch that ran
  memory_peaks      each run's summary.json has training and evaluation peaks per device
  accuracy_is_model each strategy's reported test_acc is that of its model.pt, evaluated here
                    by a loop of this script's own
  mlflow_runs       each run its own FINISHED MLflow run in the check's experiment of the
                    temporary store, holding its test_acc, and no other run there
  null_comparison   the A/A check (issue 51): single runs again last (`single_again`, a new
                    stage from scratch), and the two runs' steady epochs give the noise floor
                    every ratio to single is read against (each row's `beyond_noise`). On the
                    CPU the repeat must compute the same (equal test accuracy, fp32); on a GPU
                    its steady epoch must lie within NULL_BOUND_GPU of the first one's, a
                    bound not yet measured on a GPU (the repeat also shows what the first
                    stage's cold start cost: `first_epoch_s` of both)
  did_not_fit       out of memory as a result (issue 50): dp, last, at a batch past the
                    device's memory (on a GPU: every training image in one batch, at a width
                    whose activations need about twice the GPU's memory; on the CPU, whose
                    host memory no test may exhaust, torch's OutOfMemoryError injected at a
                    step), exits 0 with results/dp/summary.json saying "did_not_fit", the
                    device that ran out and its peak before, and the keys that would fit it
  shared_device     ranks that share the device (issue 48): ddp, fsdp and pipeline_parallel
                    again with 2 ranks on the one device (`<name>_2ranks`; on a GPU devices
                    "0,0", the ranks over gloo; on the CPU 2 processes) against their 1-rank
                    rows: the same accuracy (within SHARED_ACC_BOUND or the A/A pair's
                    difference), a memory peak per rank, and on a GPU the run marked
                    shared-device and each rank's peak below the 1-rank run's; no ratio to
                    single is taken from a shared-device run
  shared_fp64       (a GPU's; on the CPU tests/e2e/test_parity.py) the same three strategies
                    trained 10 fp64 steps with 2 ranks on the one GPU and with 1: the same
                    weights within the parity tests' 1e-9
Measures: each run's steady epoch (its epoch 2; epoch 1 pays start-up and compilation), the
ratio to single, and MFU (FLOPs trained per second over the device's peak: the datasheet's
for known GPUs, a measured matmul peak otherwise). Writes benchmarks/results/
gpu-check-<machine>-<date>.json (or --out) and prints a table. Exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from benchmarks.bench import flops_per_image, machine, peak
from benchmarks.e2e import project_copy, project_path
from pipeline.checkpoints.identity import PER_WORLD_SIZE
from pipeline.data.device_data import normalize
from pipeline.data.fashion_mnist import DATA_DIR, FILES, load_tensors
from pipeline.data.synthetic import write_synthetic
from pipeline.files import atomic_write
from pipeline.numerics.precision import auto_choice, gpu_capability
from pipeline.reporting.speed_noise import relative_spread
from pipeline.resnet import build_model
from pipeline.results import NOT_SEPARABLE
from pipeline.strategies import NAMES
from pipeline.strategies.balanced_dp import BalancedDataParallel
from pipeline.strategies.replica_autocast import AutocastDataParallel
from pipeline.tracking.final_model import plain_model

REPO = Path(__file__).resolve().parents[1]
HARDWARE_FIELDS = ("devices", "kind", "count", "precision", "torch", "cuda")
EXPERIMENT = "gpu-check"  # every run's MLflow experiment, which mlflow_runs counts
# A stage takes well under a minute on a GPU and seconds on the CPU at SIZES; one that hangs
# (as a forked worker once did on an H200) is stopped, and the others still run
STAGE_TIMEOUT_S = 600.0
STOP_GRACE_S = 40.0  # after SIGTERM: the launcher's own grace for its workers is 30 s
NULL_ROW = "single_again"  # the A/A repeat of single, run last
# how far apart two runs of single's steady epoch may come out on one GPU for its timing to be
# trusted: a GPU's epochs are steadier than a shared CPU's; not yet measured on one
NULL_BOUND_GPU = 0.10
# the strategies of several ranks, each run again with 2 ranks on the one device (issue 48 goal
# 1): on a GPU the device named twice (devices "0,0"), the ranks over gloo; on the CPU 2 processes
SEVERAL_RANKS = ("ddp", "fsdp", "pipeline_parallel")
TWO_RANKS = "_2ranks"  # the suffix of those rows
# how far a 2-rank run's test accuracy may land from its 1-rank run's: the A/A pair's difference
# where that is larger (the run-to-run noise), else 2 points (a few test images at the CPU size)
SHARED_ACC_BOUND = 0.02
# fp64: a 2-rank run on the one GPU against the 1-rank run, as the parity tests do on the CPU
# (tests/e2e/test_parity.py): 10 optimizer steps of a global batch of 32 at width 8
FP64_PAIR = [
    "seed=0",
    "model.width=8",
    "data.limit_train=320",
    "data.limit_test=64",
    "train.batch_size=32",
    "train.epochs=1",
    "train.precision=fp64",
    "train.channels_last=false",
    "ddp.sync_bn=true",
    "fsdp.sync_bn=true",
    "pipeline_parallel.microbatches=1",
    f"mlflow.experiment={EXPERIMENT}-fp64",
]
FP64_BOUND = 1e-9  # the parity tests' bound


@dataclass(frozen=True)
class Size:
    width: int
    batch: int
    epochs: int
    train: int  # training images (synthetic data), or a limit on the real ones
    test: int
    eval_batch: int


SIZES = {
    "cuda": Size(width=64, batch=256, epochs=2, train=60_000, test=10_000, eval_batch=1024),
    # seconds per stage on 2 CPU cores; 2 epochs of 16 steps still learn the synthetic bands
    "cpu": Size(width=8, batch=32, epochs=2, train=512, test=128, eval_batch=64),
}


def one_device(name: str, device: str) -> list[str]:
    """Overrides that put strategy `name` on the one device with one process or replica."""
    per = {
        "ddp": ["ddp.nproc=1"],
        "fsdp": ["fsdp.nproc=1"],
        "pipeline_parallel": ["pipeline_parallel.stages=2", "pipeline_parallel.nproc=1"],
        # one rank: the mesh's every dimension of size 1 (on a GPU it takes the one given)
        "channel_parallel": ["channel_parallel.nproc=1"],
        "hybrid": ["hybrid.data=1", "hybrid.shard=1", "hybrid.channel=1"],
    }
    return ["devices=0" if device == "cuda" else "devices=cpu", *per.get(name, [])]


def ranks_overrides(name: str, device: str) -> list[str]:
    """Overrides that run strategy `name` as 2 ranks on the one device: on a GPU that device
    named twice, so the ranks share it; on the CPU 2 processes."""
    per = {
        "ddp": ["ddp.nproc=2"],
        "fsdp": ["fsdp.nproc=2"],
        "pipeline_parallel": ["pipeline_parallel.stages=2", "pipeline_parallel.nproc=2"],
    }
    return ["devices=0,0" if device == "cuda" else "devices=cpu", *per[name]]


def real_mirror() -> Path | None:
    raw = REPO / DATA_DIR / "raw"
    names = [name for pair in FILES.values() for name in pair]
    return raw if all((raw / name).exists() for name in names) else None


def replica_dtypes(device: torch.device, wrapper: str, ids: list[int]) -> tuple[int, list[str]]:
    """One training step of dp's (or balanced_dp's) wrapper over replicas on `ids`, under bf16
    autocast: (threads that ran convolutions, the dtypes their outputs came in)."""
    seen: list[tuple[int, str]] = []

    def record(_module: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
        seen.append((threading.get_ident(), str(output.dtype)))

    model = build_model(8, 0).to(device)
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            module.register_forward_hook(record)  # replicas share their module's hooks
    wrapped = (
        AutocastDataParallel(model, device_ids=ids)
        if wrapper == "dp"
        else BalancedDataParallel(model, 3 if len(ids) > 1 else None, device_ids=ids)
    )
    x = torch.randn(8, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (8,), device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(wrapped(x), y)
    loss.backward()
    return len({thread for thread, _ in seen}), sorted({dtype for _, dtype in seen})


def check_replicas(device: torch.device) -> dict[str, Any]:
    """replicas_bf16: 2 replicas on the one GPU where torch allows it, else 1; on the CPU
    DataParallel calls the module itself (no replicas), which is what a CPU run does."""
    details = []
    ok = True
    for wrapper in ("dp", "balanced_dp"):
        attempts = [[0, 0], [0]] if device.type == "cuda" else [[]]
        for ids in attempts:
            try:
                threads, dtypes = replica_dtypes(device, wrapper, ids)
            except Exception as err:  # noqa: BLE001 - torch's refusal is the finding
                first = (str(err).splitlines() or [""])[0]
                details.append(f"{wrapper}: torch refuses {len(ids)} replicas on one GPU ({first})")
                continue
            ok &= dtypes == ["torch.bfloat16"]
            details.append(
                f"{wrapper}: {max(len(ids), 1)} replica(s), {threads} thread(s), "
                f"conv outputs {', '.join(dtypes)}"
            )
            break
        else:
            ok = False
    return check("replicas_bf16", ok, "; ".join(details))


def check_runs(rows: dict[str, dict], expected: str, device: torch.device) -> list[dict]:
    """precision_auto, memory_peaks and accuracy_is_model over every run."""
    precision, memory, accuracy = [], [], []
    for row, found in rows.items():
        hardware, metrics = found["hardware"], found["metrics"]
        # a strategy that computes the same at any world size (ddp, fsdp with SyncBN) is
        # keyed without the device list and count: it resumes on more or fewer devices
        fields = [f for f in HARDWARE_FIELDS if found["world_size"] or f not in PER_WORLD_SIZE]
        missing = [f for f in fields if f not in hardware]
        kind_ok = device.type != "cuda" or any(
            torch.cuda.get_device_name(device) in k for k in hardware.get("kind", [])
        )
        good = (
            not missing
            and hardware.get("precision") == expected
            and hardware.get("torch") == torch.__version__
            and hardware.get("cuda") == torch.version.cuda
            and kind_ok
        )
        precision.append(
            (
                row,
                good,
                f"{row}: {hardware.get('precision')} on {hardware.get('kind')}"
                + (f" (missing {', '.join(missing)})" if missing else ""),
            )
        )
        train_peaks, eval_peaks = (
            metrics.get("peak_memory_mib"),
            metrics.get("eval_peak_memory_mib"),
        )
        # a GPU's evaluation peaks are the allocator's, apart from training's; a CPU process's
        # resident set cannot separate them, and the run says so instead of a number
        eval_ok = (
            eval_peaks == NOT_SEPARABLE
            if device.type == "cpu"
            else bool(eval_peaks) and all(v > 0 for v in eval_peaks.values())
        )
        good = bool(train_peaks) and all(v > 0 for v in train_peaks.values()) and eval_ok
        memory.append((row, good, f"{row}: train {train_peaks} eval {eval_peaks} MiB"))
        # fp32 evaluates identically; under bf16/fp16 autocast another batch size or kernel
        # can flip a near-tie, so a few test images in 10000 may differ
        bound = 1e-6 if expected == "fp32" else 2e-3
        diff = abs(metrics["test_acc"] - found["independent_test_acc"])
        accuracy.append(
            (
                row,
                diff <= bound,
                f"{row}: reported {metrics['test_acc']:.4f}, model.pt "
                f"{found['independent_test_acc']:.4f} (|diff| {diff:.1e} <= {bound:.0e})",
            )
        )
    return [
        check(
            name,
            bool(results) and all(good for _, good, _ in results),  # no run is no pass
            (f"expected {expected}; " if name == "precision_auto" else "")
            + "; ".join(text for _, _, text in results),
        )
        for name, results in (
            ("precision_auto", precision),
            ("memory_peaks", memory),
            ("accuracy_is_model", accuracy),
        )
    ]


def check_mlflow(uri: str, rows: dict[str, dict]) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    problems = []
    owner: dict[str, str] = {}  # run id -> the first row that reported it
    for row, found in rows.items():
        run_id = found["run"]["run_id"]
        run = client.get_run(run_id)
        acc = run.data.metrics.get("test_acc")
        if run_id in owner:
            problems.append(f"{row}: the run of {owner[run_id]}")
        elif experiment is None or run.info.experiment_id != experiment.experiment_id:
            where = client.get_experiment(run.info.experiment_id).name
            problems.append(f"{row}: in experiment {where!r}")
        elif (
            run.info.status != "FINISHED"
            or acc is None
            or abs(acc - found["metrics"]["test_acc"]) > 1e-9
        ):
            problems.append(f"{row}: {run.info.status}, test_acc {acc}")
        owner.setdefault(run_id, row)
    ok = bool(rows) and not problems and len(runs) == len(rows)
    return check(
        "mlflow_runs",
        ok,
        f"{len(runs)} runs in experiment {EXPERIMENT!r} for {len(rows)} stages"
        + (f"; {'; '.join(problems)}" if problems else ""),
    )


def measure(rows: dict[str, dict], size: Size, device: torch.device) -> dict[str, dict]:
    """Steady epoch, its ratio to single's (equal settings), throughput and MFU per run."""
    flops = flops_per_image(size.width)
    cache: dict = {}
    single = rows.get("single", {}).get("metrics", {}).get("steady_epoch_seconds")
    table = {}
    for row, found in rows.items():
        m = found["metrics"]
        peak_flops, source = peak(device, found["hardware"]["precision"], cache)
        table[row] = {
            "steady_epoch_s": m["steady_epoch_seconds"],
            "first_epoch_s": m["warmup_epoch_seconds"],
            # ranks that took turns on one GPU: their time is no speed, so no ratio
            "x_single": (
                m["steady_epoch_seconds"] / single
                if single and not m.get("shared_devices")
                else None
            ),
            "shared_devices": m.get("shared_devices", {}),
            "samples_per_s": m["steady_samples_per_s"],
            "mfu": flops * m["steady_samples_per_s"] / peak_flops,
            "peak_source": source,
            "precision": found["hardware"]["precision"],
            "test_acc": m["test_acc"],
            "train_peak_mib": m["peak_memory_mib"],
            "eval_peak_mib": m["eval_peak_memory_mib"],
            "stage_seconds": found["stage_seconds"],
            "identity_hardware": found["hardware"],
        }
    return table


def render(result: dict) -> str:
    lines = [
        f"{result['machine']} | torch {result['info']['torch']} | {result['data']} | "
        f"{result['settings']['size']}",
        "| run | steady epoch s | x single | samples/s | MFU | test_acc | train peak MiB | "
        "eval peak MiB | stage s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def busiest(peaks: dict | str) -> str:  # a CPU's evaluation peak is words, not a number
        return peaks if isinstance(peaks, str) else f"{max(peaks.values()):.0f}"

    for row, r in result["rows"].items():
        ratio = "" if r["x_single"] is None else f"{r['x_single']:.2f}"
        lines.append(
            f"| {row} | {r['steady_epoch_s']:.3f} | {ratio} | {r['samples_per_s']:.0f} | "
            f"{100 * r['mfu']:.2f}% | {r['test_acc']:.4f} | "
            f"{busiest(r['train_peak_mib'])} | {busiest(r['eval_peak_mib'])} | "
            f"{r['stage_seconds']:.1f} |"
        )
    lines += [f"failed: {row}: {text.splitlines()[0]}" for row, text in result["failures"].items()]
    null = next((c for c in result["checks"] if c["check"] == "null_comparison"), None)
    if null is not None:
        lines.append(f"A/A: {null['detail']}")
    passed = sum(c["ok"] for c in result["checks"])
    lines.append(f"checks: {passed}/{len(result['checks'])} passed")
    return "\n".join(lines)


def independent_accuracy(
    project: Path, name: str, device: torch.device, precision: str, tensors: dict
) -> float:
    """The test accuracy of results/NAME/model.pt by this script's own evaluation loop, in the
    arithmetic the run evaluated in (its resolved precision, under autocast on a GPU)."""
    out = project / "results" / name
    model = plain_model(out).to(device)
    n = yaml.safe_load((out / "config.yaml").read_text())["data"]["limit_test"]
    images, labels = tensors["test_images"][:n], tensors["test_labels"][:n]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    correct = 0
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        for x, y in zip(images.split(1024), labels.split(1024)):
            predicted = model(normalize(x.to(device))).argmax(1).cpu()
            correct += int((predicted == y.long()).sum())
    return correct / len(labels)


def check(name: str, ok: bool, detail: str) -> dict[str, Any]:
    print(f"gpu-check: {'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    return {"check": name, "ok": ok, "detail": detail}


def pinned_torch() -> str:
    lock = (REPO / "requirements.lock").read_text().splitlines()
    return next(line.split("==")[1] for line in lock if line.startswith("torch=="))


class StageFailed(Exception):
    """A stage that exited non-zero or outlived its time: its row is left out, and said."""


def run_stage(cmd: list[str], cwd: Path, env: dict, timeout_s: float) -> float:
    """Run one stage command in a process group of its own; its wall seconds. Past
    `timeout_s` the whole group is stopped (`stop_group`), so a stage that hangs costs its
    own row, not the rest of the check."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        err = stop_group(proc)
        raise StageFailed(f"did not finish within {timeout_s:.0f} s: {err[-3000:]}") from None
    finally:
        kill_group(proc)  # whatever the stage left behind in its group
    if proc.returncode != 0:
        raise StageFailed(f"exited {proc.returncode}: {err[-3000:]}")
    return time.perf_counter() - start


def stop_group(proc: subprocess.Popen) -> str:
    """SIGTERM to the process group `proc` leads (the launcher and its workers), SIGKILL after
    STOP_GRACE_S; what it wrote to stderr."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.communicate(timeout=STOP_GRACE_S)[1]
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return proc.communicate()[1]


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def gather(project: Path, strategy: str) -> dict[str, Any]:
    """What one finished stage left on disk: its metrics, identity and MLflow run id."""
    metrics = json.loads((project / "results" / strategy / "summary.json").read_text())
    latest = json.loads((project / "checkpoints" / strategy / "latest.json").read_text())
    record = json.loads((project / "checkpoints" / strategy / "run.json").read_text())
    identity = latest["identity"]
    return {
        "metrics": metrics,
        "hardware": identity["hardware"],
        "world_size": identity["world_size"],
        "run": record,
    }


def planned_runs(
    strategies: list[str],
    device: str,
    size: Size,
    real_data: bool,
    two_ranks: tuple[str, ...] = SEVERAL_RANKS,
) -> dict[str, tuple[str, list[str]]]:
    """row -> (strategy, overrides): each strategy on the one device at `size`, then, on a
    GPU, single at params.yaml's defaults, then the strategies of several ranks with 2 ranks
    on the one device, then single again. Every run logs to EXPERIMENT and, on the real data,
    trains on `size`'s share of it."""
    placed = [f"mlflow.experiment={EXPERIMENT}"]
    if real_data:
        placed += [f"data.limit_train={size.train}", f"data.limit_test={size.test}"]
    common = [
        f"model.width={size.width}",
        f"train.batch_size={size.batch}",
        f"train.epochs={size.epochs}",
        f"train.eval_batch_size={size.eval_batch}",
        "train.channels_last=false",
        # eager for all: auto captures single's step on a GPU, and then the ratios to single
        # would no longer be what a wrapping costs (single_defaults runs auto)
        "train.cuda_graph=none",
        *placed,
    ]
    runs = {name: (name, [*one_device(name, device), *common]) for name in strategies}
    if device == "cuda" and "single" in strategies:
        # it writes results/single again, after single's own run was checked; its own MLflow
        # run (another identity: channels_last), in the same experiment
        runs["single_defaults"] = ("single", ["devices=0", f"train.epochs={size.epochs}", *placed])
    for name in two_ranks:
        if name in strategies:
            runs[name + TWO_RANKS] = (name, [*ranks_overrides(name, device), *common])
    if "single" in strategies:  # last: the A/A repeat, as far from single's run as it gets
        runs[NULL_ROW] = runs["single"]
    return runs


def check_null(rows: dict[str, dict], table: dict[str, dict], device: torch.device) -> dict:
    """null_comparison: single's repeat against single, and every row's ratio to single read
    against their difference (sets `beyond_noise` in `table`)."""
    if "single" not in rows or NULL_ROW not in rows:
        return check("null_comparison", False, f"single and {NULL_ROW} did not both train")
    first, again = table["single"], table[NULL_ROW]
    floor = relative_spread([first["steady_epoch_s"], again["steady_epoch_s"]])
    assert floor is not None  # two positive figures
    for row in table.values():
        ratio = row["x_single"]
        row["beyond_noise"] = None if ratio is None else max(ratio, 1 / ratio) - 1 > floor
    beyond = [r for r, v in table.items() if v["beyond_noise"]]
    detail = (
        f"single twice: steady epochs {first['steady_epoch_s']:.3f} and "
        f"{again['steady_epoch_s']:.3f} s (first epochs {first['first_epoch_s']:.3f} and "
        f"{again['first_epoch_s']:.3f} s): noise floor {floor:.1%}; beyond it: "
        f"{', '.join(beyond) or 'none'}"
    )
    if device.type == "cpu":  # one computation in fp32: the same model, to the last bit
        ok = first["test_acc"] == again["test_acc"]
        detail += f"; test_acc {first['test_acc']:.4f} and {again['test_acc']:.4f} (equal)"
    else:
        ok = floor <= NULL_BOUND_GPU
        detail += f" (<= {NULL_BOUND_GPU:.0%})"
    return check("null_comparison", ok, detail)


def check_shared(
    rows: dict[str, dict], device: torch.device, asked: Sequence[str]
) -> dict[str, Any]:
    """shared_device: each strategy of several ranks with 2 ranks on the one device against its
    1-rank row: both trained, to the same accuracy (SHARED_ACC_BOUND, or the A/A pair's
    difference), each rank with a memory peak of its own; on a GPU the run says its ranks
    shared the device, and each rank's peak is below the 1-rank run's (half the batch, and a
    shard or a stage of the model). A CPU process's peak holds torch itself: shown, not
    compared. `asked`: the strategies planned with 2 ranks."""
    pairs = list(asked)
    if not pairs:
        return check("shared_device", False, "no strategy of several ranks was run with 2")
    null = (
        abs(rows["single"]["metrics"]["test_acc"] - rows[NULL_ROW]["metrics"]["test_acc"])
        if "single" in rows and NULL_ROW in rows
        else 0.0
    )
    bound = max(SHARED_ACC_BOUND, null)
    ok, details = True, []
    for name in pairs:
        if name not in rows or name + TWO_RANKS not in rows:
            ok = False
            details.append(f"{name}: 1 rank and 2 ranks did not both train")
            continue
        one, two = rows[name]["metrics"], rows[name + TWO_RANKS]["metrics"]
        peaks, solo = two["peak_memory_mib"], max(one["peak_memory_mib"].values())
        shared = two.get("shared_devices", {})
        good = abs(two["test_acc"] - one["test_acc"]) <= bound
        good &= two["world_size"] == 2 and len(peaks) == 2 and all(v > 0 for v in peaks.values())
        if device.type == "cuda":
            said = any(note.startswith("shared-device") for note in two["notes"])
            good &= list(shared.values()) == [2] and said
            good &= all(v < solo for v in peaks.values())
        else:  # the CPU's processes each have cores: not shared-device
            good &= shared == {}
        ok &= good
        details.append(
            f"{name}: 2 ranks ({', '.join(f'{n} on GPU {g}' for g, n in shared.items()) or 'CPU'}"
            f") test_acc {two['test_acc']:.4f} vs 1 rank {one['test_acc']:.4f} "
            f"(|diff| <= {bound:.3f}); per-rank peaks "
            + ", ".join(f"{label} {v:.0f}" for label, v in peaks.items())
            + f" MiB vs 1 rank {solo:.0f} MiB"
        )
    return check("shared_device", ok, "; ".join(details))


def check_shared_fp64(
    project: Path, env: dict, timeout_s: float, asked: Sequence[str]
) -> dict[str, Any]:
    """shared_fp64 (a GPU's): each strategy of several ranks `asked` (as shared_device's)
    trains 10 fp64 steps with 2 ranks on the one GPU and with 1, to the same weights within
    the parity tests' bound."""
    diffs, problems = {}, []
    for name in asked:
        states = []
        for placed in (one_device(name, "cuda"), ranks_overrides(name, "cuda")):
            shutil.rmtree(project / "checkpoints" / name, ignore_errors=True)
            cmd = [sys.executable, "-m", "pipeline.train", name, *placed, *FP64_PAIR]
            try:
                run_stage(cmd, project, env, timeout_s)
            except StageFailed as err:
                problems.append(f"{name} {' '.join(placed)}: {err}")
                break
            states.append(torch.load(project / "results" / name / "model.pt"))
        if len(states) == 2:
            one, two = states
            diffs[name] = max((two[k].double() - one[k].double()).abs().max().item() for k in one)
    ok = not problems and all(d < FP64_BOUND for d in diffs.values())
    text = "; ".join(f"{n}: max |2 ranks - 1 rank| {d:.1e}" for n, d in diffs.items())
    return check(
        "shared_fp64", ok, f"{text} (< {FP64_BOUND:.0e})" + "".join(f"; {p}" for p in problems)
    )


# activation bytes per training sample at width 64 (ResNet-18 on 28x28, bf16, about half of
# fp32's 1.6 MB as MemTracker measured it on a CPU): what sizes the batch past the GPU
ACTIVATION_BYTES_W64 = 0.8e6


def oversize_width(device_bytes: int, batch: int) -> int:
    """A model width whose activations at `batch` need about twice `device_bytes`: the
    activations grow with the width, the parameters (still small there) with its square."""
    return 64 * max(2, -(-2 * device_bytes // int(ACTIVATION_BYTES_W64 * batch)))


def check_did_not_fit(
    project: Path, env: dict, device: torch.device, size: Size, timeout_s: float
) -> dict[str, Any]:
    """did_not_fit: dp at a batch past the device's memory ends as a result, not a crash."""
    overrides = [*one_device("dp", device.type), "train.epochs=1"]
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        width = oversize_width(total, size.train)
        overrides += [f"train.batch_size={size.train}", f"model.width={width}"]
        env = dict(env)
    else:  # a host out of memory takes the machine with it: torch's error, injected
        env = {**env, "PARALLEL_LAB_FAULT": "rank=0,epoch=1,step=1,action=oom,strategy=dp"}
    shutil.rmtree(project / "checkpoints" / "dp", ignore_errors=True)
    try:
        run_stage(
            [sys.executable, "-m", "pipeline.train", "dp", *overrides], project, env, timeout_s
        )
    except StageFailed as err:
        return check("did_not_fit", False, f"dp past the device's memory: {err}")
    record = json.loads((project / "results/dp/summary.json").read_text())
    if record.get("outcome") != "did_not_fit":
        return check("did_not_fit", False, f"dp past the device's memory trained: {overrides}")
    peak = record["peak_mib"].get(record["failed_on"])
    real = device.type == "cpu" or not record["error"].startswith("fault:")
    ok = real and peak is not None and peak > 0 and "train.batch_size" in record["fix"]
    return check(
        "did_not_fit",
        ok,
        f"dp at {' '.join(overrides[1:])}: ran out on {record['failed_on']} in epoch "
        f"{record['epoch']} ({record['error'][:120]}), peak {peak} MiB; {record['fix']}",
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--strategies", nargs="*", default=list(NAMES), choices=NAMES)
    parser.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/...)")
    parser.add_argument("--synthetic", action="store_true", help="even where real data is here")
    parser.add_argument(
        "--stage-timeout", type=float, default=STAGE_TIMEOUT_S, help="seconds a stage may take"
    )
    parser.add_argument(
        "--two-ranks",
        nargs="*",
        default=list(SEVERAL_RANKS),
        choices=SEVERAL_RANKS,
        help="the strategies run again with 2 ranks on the one device (shared_device)",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            f"gpu-check: --device cuda, but torch {torch.__version__} sees no GPU; expected "
            "a CUDA GPU (or DEVICE=cpu for the tiny CPU run)",
            file=sys.stderr,
        )
        sys.exit(2)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    size = SIZES[args.device]
    label, info = machine(device)
    info.update(torch_pinned=pinned_torch(), cuda=torch.version.cuda)
    info["torch_is_pinned"] = torch.__version__.split("+")[0] == info["torch_pinned"]
    print(f"gpu-check: {label}, torch {torch.__version__} (pinned {info['torch_pinned']})")
    expected, _ = auto_choice(device.type, gpu_capability(device))
    mirror = None if args.synthetic else real_mirror()
    data = "real Fashion-MNIST" if mirror else f"synthetic ({size.train}/{size.test} images)"
    runs = planned_runs(
        args.strategies, args.device, size, mirror is not None, tuple(args.two_ranks)
    )

    checks = [check_replicas(device)]
    rows: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}  # row -> how its stage failed
    out = args.out or REPO / "benchmarks" / "results" / f"gpu-check-{label}-{date.today()}.json"
    head = {
        "machine": label,
        "info": info,
        "date": date.today().isoformat(),
        "device": args.device,
        "data": data,
        "settings": {"size": size.__dict__, "runs": {k: v[1] for k, v in runs.items()}},
    }

    def save(table: dict[str, dict], finished: bool) -> dict[str, Any]:
        """The JSON as far as it got: after every stage, so that a run cut off by a device
        call's time limit still reports the stages it finished ("finished": false)."""
        result = {**head, "finished": finished, "checks": checks, "rows": table}
        result["failures"] = failures
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, json.dumps(result, indent=1) + "\n")
        return result

    with tempfile.TemporaryDirectory(prefix="parallel-lab-gpu-check-") as tmp:
        if mirror is None:
            mirror = Path(tmp) / "mirror"
            write_synthetic(mirror, size.train, size.test)
        project = project_copy(Path(tmp) / "project", mirror)
        uri = f"sqlite:///{project / 'mlflow.db'}"
        env = {**os.environ, "PYTHONPATH": project_path(project), "MLFLOW_TRACKING_URI": uri}
        if args.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        subprocess.run([sys.executable, "-m", "pipeline.fetch"], cwd=project, env=env, check=True)
        print(f"gpu-check: data: {data}", flush=True)
        tensors = load_tensors(project / DATA_DIR)
        for row, (strategy, overrides) in runs.items():
            # every row trains from scratch: a run of the same strategy before it (gathered
            # already) would otherwise be resumed, as a finished run, with nothing to train
            shutil.rmtree(project / "checkpoints" / strategy, ignore_errors=True)
            cmd = [sys.executable, "-m", "pipeline.train", strategy, *overrides]
            try:
                seconds = run_stage(cmd, project, env, args.stage_timeout)
            except StageFailed as err:
                failures[row] = f"python -m pipeline.train {strategy} {err}"
                print(f"gpu-check: {row}: FAILED, {failures[row]}", flush=True)
                continue
            found = gather(project, strategy)
            precision = found["hardware"]["precision"]
            found["independent_test_acc"] = independent_accuracy(
                project, strategy, device, precision, tensors
            )
            found["stage_seconds"] = seconds
            rows[row] = found
            print(f"gpu-check: {row}: {seconds:.1f} s", flush=True)
            save(measure(rows, size, device), finished=False)
        checks.append(
            check(
                "stages",
                not failures,
                f"{len(rows)} of {len(runs)} trained"
                + "".join(f"; {row} failed" for row in failures),
            )
        )
        checks += check_runs(rows, expected, device)
        checks.append(check_mlflow(uri, rows))
        table = measure(rows, size, device)
        checks.append(check_null(rows, table, device))
        two_ranks = [n for n in args.two_ranks if n in args.strategies]
        checks.append(check_shared(rows, device, two_ranks))
        save(table, finished=False)
        if "dp" in args.strategies:  # after mlflow_runs: its run is FAILED, by design
            checks.append(check_did_not_fit(project, env, device, size, args.stage_timeout))
            save(table, finished=False)
        if args.device == "cuda":  # the CPU's parity tests train these pairs (test_parity.py)
            checks.append(check_shared_fp64(project, env, args.stage_timeout, two_ranks))
    result = save(table, finished=True)
    print(render(result))
    print(f"gpu-check: wrote {out}")
    if not all(c["ok"] for c in checks):
        sys.exit(1)
    return result


if __name__ == "__main__":
    main()
