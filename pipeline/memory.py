"""Per-device peak memory of one epoch: reset, read, gather to the writer, summarize.

Each epoch is measured twice: its training steps (reset before them, read after them) and its
evaluation (reset again, read after it), kept apart: "memory/gpu_3_peak_allocated_mib" is
training's, "memory/gpu_3_eval_peak_allocated_mib" evaluation's (EVAL). The names follow MLflow's
own system metrics ("system/gpu_3_memory_usage_megabytes"): a group before the slash, then the
device as gpu_<physical id>, so the two sit side by side in the MLflow UI.

On GPUs a process reads torch.cuda.max_memory_allocated/reserved of every device it computes
on: its own under one-process-per-device strategies, all of them under DataParallel, whose
extra devices live in the one process. On the CPU the figure is the peak resident set size of
each process instead (VmHWM, which /proc/self/clear_refs resets), labelled as such, and of the
training steps only: clear_refs resets the peak to the current RSS, which during evaluation
still holds training's heap (parameters, optimizer state, the allocator's cached pages), so
evaluation's own allocations cannot be told apart from it. A CPU run records no evaluation
peak and says so (NOT_SEPARABLE) where it would show one.

Labels name the physical device, so runs on different GPUs of one machine never mix:
cuda:j -> "gpu_" + ctx.gpus[j] (CUDA_VISIBLE_DEVICES "3,5": cuda:1 is "gpu_5"), and in a job
of several nodes the node too ("node1_gpu_5"); on the CPU "cpu_" + global rank. Where ranks share
a GPU (devices: "0,0") each rank's peak is its own, the rank in its label ("gpu_0_rank1"): what
that rank would hold on a GPU of its own, which a device total would hide. The imbalance is
taken over every device of the job. Everything but `reset_peaks`/`read_peaks` is pure, so
it is tested without GPUs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import psutil
import torch

from pipeline.context import DistContext
from pipeline.results import NOT_SEPARABLE, device_metric, parse_device_metric

MIB = 2**20
PROC_STATUS = Path("/proc/self/status")
PROC_CLEAR_REFS = Path("/proc/self/clear_refs")


@dataclass(frozen=True)
class DevicePeak:
    # "gpu_3" (physical GPU id; "node1_gpu_3" in a multi-node job) or "cpu_0" (global rank of
    # a CPU process)
    label: str
    allocated_mib: float  # peak allocated by tensors; on the CPU the peak RSS of the process
    reserved_mib: Optional[float]  # peak held by the CUDA caching allocator; None on the CPU

    @property
    def kind(self) -> str:
        return "cpu" if self.reserved_mib is None else "gpu"


def physical_label(device: str, gpus: tuple[str, ...], node: int = 0, nodes: int = 1) -> str:
    """ "cuda:1" with gpus ("3", "5") -> "gpu_5": the renumbered index back to the physical id;
    in a job of several nodes, prefixed by the node ("node1_gpu_5"), since every node has a
    GPU 5 of its own."""
    label = f"gpu_{gpus[torch.device(device).index or 0]}"
    return f"node{node}_{label}" if nodes > 1 else label


def rank_label(device: str, ctx: DistContext) -> str:
    """This process's label for `device`: the physical one, and its rank where ranks share
    the GPU ("gpu_0_rank1"); DataParallel's replicas in one process share one allocator,
    whose peak is the device's."""
    label = physical_label(device, ctx.gpus, ctx.node, ctx.nodes)
    return f"{label}_rank{ctx.rank}" if ctx.shares_devices and ctx.world_size > 1 else label


def local_devices(run_devices: list[str], ctx: DistContext) -> list[torch.device]:
    """The CUDA devices this process allocates on ([] on the CPU): every device of a
    one-process run (DataParallel), else the process's own."""
    if not ctx.on_cuda:
        return []
    if ctx.world_size == 1:
        return [torch.device(d) for d in dict.fromkeys(run_devices)]
    return [ctx.device]


def reset_peaks(devices: list[torch.device]) -> None:
    for device in devices:
        torch.cuda.reset_peak_memory_stats(device)
    if not devices and PROC_CLEAR_REFS.exists():
        try:  # "5" resets VmHWM to the current RSS (Linux >= 4.0)
            PROC_CLEAR_REFS.write_text("5")
        except OSError:
            pass  # then the peak is since process start: still a true upper bound


def read_peaks(devices: list[torch.device], ctx: DistContext) -> list[DevicePeak]:
    """This process's peaks since `reset_peaks`; reads allocator counters, no device sync."""
    if devices:
        return [
            DevicePeak(
                rank_label(str(d), ctx),
                torch.cuda.max_memory_allocated(d) / MIB,
                torch.cuda.max_memory_reserved(d) / MIB,
            )
            for d in devices
        ]
    return [DevicePeak(f"cpu_{ctx.rank}", peak_rss_bytes() / MIB, None)]


def peak_rss_bytes() -> int:
    """VmHWM of this process; the current RSS (psutil) where /proc has no VmHWM."""
    try:
        match = re.search(r"VmHWM:\s+(\d+)\s+kB", PROC_STATUS.read_text())
    except OSError:
        match = None
    current: int = psutil.Process().memory_info().rss  # psutil is untyped here
    return max(int(match.group(1)) * 1024, current) if match else current


def merge_peaks(per_rank: list[list[DevicePeak]]) -> list[DevicePeak]:
    """One entry per device in first-seen (rank, then cuda) order. Two processes on one GPU
    each count only their own allocations, so the device's figure is their sum."""
    merged: dict[str, DevicePeak] = {}
    for peaks in per_rank:
        for p in peaks:
            if p.label in merged:
                q = merged[p.label]
                reserved = (
                    None
                    if p.reserved_mib is None or q.reserved_mib is None
                    else q.reserved_mib + p.reserved_mib
                )
                p = DevicePeak(p.label, q.allocated_mib + p.allocated_mib, reserved)
            merged[p.label] = p
    return list(merged.values())


def imbalance(values: list[float]) -> float:
    """max / mean: 1.0 when every device holds the same, 2.0 when one holds twice the mean."""
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else 1.0


def first_share(values: list[float]) -> float:
    """Device 0's share of the total (1 / n when balanced)."""
    total = sum(values)
    return values[0] / total if total > 0 else 1.0 / len(values)


def share_key(kind: str) -> str:
    """ "gpu0_share" on GPUs, "cpu0_share" (rank 0's share of RSS) on the CPU."""
    return f"{kind}0_share"


EVAL = "eval_"  # the prefix of evaluation's figures; training's have none


def notes(device: torch.device) -> list[str]:
    """What a run's notes say of its memory figures: on the CPU, why it has no eval peak."""
    if device.type == "cuda":
        return []
    return [
        f"memory: evaluation's peak is {NOT_SEPARABLE}: a process's peak RSS during "
        "evaluation still holds training's heap, so only the training steps' peak is reported"
    ]


def epoch_metrics(
    peaks: list[DevicePeak], eval_peaks: Optional[list[DevicePeak]] = None
) -> dict[str, float]:
    """MLflow metrics of one epoch: every device's peaks over the training steps, the
    imbalance and device 0's share; the same of evaluation, prefixed EVAL, when given on GPUs
    ("memory/gpu_3_eval_peak_allocated_mib", "eval_mem_imbalance", "eval_gpu0_share"). A CPU
    evaluation peak is dropped: it is floored at training's heap (NOT_SEPARABLE)."""
    out = _phase_metrics(peaks, "")
    if eval_peaks is not None and eval_peaks[0].kind == "gpu":
        out.update(_phase_metrics(eval_peaks, EVAL))
    return out


def _phase_metrics(peaks: list[DevicePeak], prefix: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for p in peaks:
        if p.reserved_mib is None:
            out[device_metric(p.label, prefix, "rss")] = p.allocated_mib
        else:
            out[device_metric(p.label, prefix, "allocated")] = p.allocated_mib
            out[device_metric(p.label, prefix, "reserved")] = p.reserved_mib
    values = [p.allocated_mib for p in peaks]
    out[f"{prefix}mem_imbalance"] = imbalance(values)
    out[prefix + share_key(peaks[0].kind)] = first_share(values)
    return out


def run_summary(epochs: list[dict[str, float]]) -> dict[str, Any]:
    """For summary.json, from each epoch's `epoch_metrics` (which a resumed run restores): each
    device's highest peaks over the epochs, and the imbalance of those, for the training steps
    (peak_memory_mib, peak_reserved_mib, mem_imbalance, gpu0_share) and for evaluation (the
    same keys prefixed EVAL). On the CPU evaluation's peak is NOT_SEPARABLE, also where epochs
    recorded before that was known hold a figure for it. And how far the training figures
    moved between epochs (`spreads`), the noise the report's memory rankings allow for."""
    allocated: dict[str, dict[str, float]] = {"": {}, EVAL: {}}
    reserved: dict[str, dict[str, float]] = {"": {}, EVAL: {}}
    busiest: list[float] = []  # each epoch's highest training peak of any device
    for row in epochs:
        training = []
        for key, value in row.items():
            parsed = parse_device_metric(key)
            if parsed:
                label, phase, what = parsed
                into = (reserved if what == "reserved" else allocated)[phase]
                into[label] = max(into.get(label, 0.0), value)
                if phase == "" and what != "reserved":
                    training.append(value)
        if training:
            busiest.append(max(training))
    kind = "gpu" if reserved[""] or reserved[EVAL] else "cpu"
    if not allocated[""]:  # epochs recorded before memory was measured (an old checkpoint)
        kind = "none"
    # "gpu": allocated by tensors; "cpu": peak RSS per process
    out: dict[str, Any] = {"memory_kind": kind}
    for prefix in ("",) if kind == "cpu" else ("", EVAL):
        values = list(allocated[prefix].values())
        out[f"{prefix}peak_memory_mib"] = {k: round(v, 1) for k, v in allocated[prefix].items()}
        out[f"{prefix}peak_reserved_mib"] = {k: round(v, 1) for k, v in reserved[prefix].items()}
        out[f"{prefix}mem_imbalance"] = imbalance(values) if values else None
        if values:
            out[prefix + share_key(kind)] = first_share(values)
    if kind == "cpu":  # no peak, imbalance or share: the reason in the peak's place
        out[f"{EVAL}peak_memory_mib"] = NOT_SEPARABLE
        out[f"{EVAL}peak_reserved_mib"] = {}
        out[f"{EVAL}mem_imbalance"] = None
    imbalances = [row["mem_imbalance"] for row in epochs if "mem_imbalance" in row]
    return {**out, **spreads(busiest, imbalances)}


def spreads(busiest: list[float], imbalances: list[float]) -> dict[str, Optional[float]]:
    """Max - min over the epochs of the busiest device's training peak (MiB) and of the
    training imbalance; None with fewer than two epochs measured."""

    def spread(values: list[float]) -> Optional[float]:
        return round(max(values) - min(values), 4) if len(values) > 1 else None

    return {
        "peak_memory_spread_mib": spread(busiest),
        "mem_imbalance_spread": spread(imbalances),
    }
