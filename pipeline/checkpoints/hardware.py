"""What a run computes on, as its identity records it: a checkpoint from other hardware gives
other numbers (kernels, rounding, timings, memory), so it is never resumed there.

    devices     the devices the run computes on, as it names them ("cuda:0", "cuda:1"; "cpu")
    kind        per GPU used, its name and compute capability; on the CPU, the processor's
                model and the instruction set torch's kernels dispatch to (AVX2, AVX512, ...)
    count       devices computed on (processes, on the CPU)
    precision   the arithmetic that runs, after `auto` and any fallback: the job's, one for
                every rank, decided by its oldest GPU (precision.py)
    torch       torch's version, and the CUDA version it was built with

Every rank contributes its own facts and all of them are kept, so the nodes of a multi-node
job agree on one identity even where their machines differ.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipeline.context import DistContext


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_kind(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"{torch.cuda.get_device_name(index)} (compute capability {major}.{minor})"


def cpu_kind() -> str:
    return f"{cpu_model()} ({torch.backends.cpu.get_cpu_capability()})"


def local_facts(
    devices: list[str],
    precision: str,
    world_size: int,
    gpu: Callable[[int], str] = gpu_kind,
    cpu: Callable[[], str] = cpu_kind,
) -> dict[str, Any]:
    """This rank's view. `gpu`, `cpu`: how a device is described (seams for the tests)."""
    gpus = sorted({int(d[5:]) for d in devices if d.startswith("cuda:")})
    kinds = [gpu(i) for i in gpus] if gpus else [cpu()]
    return {
        "devices": list(devices),
        "kind": sorted(set(kinds)),
        "count": len(devices) if gpus else world_size,
        "precision": precision,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def merge(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """One record for the job: the first rank's, with every rank's device kinds (each GPU's
    compute capability among them). The precision is the job's; ranks that ran another would
    be a record of one rank passed off as the job's, so that is refused."""
    precisions = [facts["precision"] for facts in per_rank]
    if len(set(precisions)) > 1:
        raise RuntimeError(f"the ranks of one job run different precisions: {precisions}")
    merged = dict(per_rank[0])
    merged["kind"] = sorted({kind for facts in per_rank for kind in facts["kind"]})
    return merged


def run_hardware(ctx: DistContext, devices: list[str], precision: str) -> dict[str, Any]:
    """The job's hardware record, the same on every rank (a collective when there are
    several)."""
    mine = local_facts(devices, precision, ctx.world_size)
    if ctx.world_size == 1 or not dist.is_initialized():
        return mine
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)
    return merge(everyone)
