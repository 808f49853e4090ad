"""How the shared loop's arithmetic runs: dtype, autocast, loss scaling, and the kernel
switches that go with them (TF32, cuDNN autotuning); torch.compile is torch_compile.py's.

`train.precision`:
  auto  bf16 on GPUs of compute capability 8.0 or newer (native bfloat16), fp16 with loss
        scaling where a GPU is older (bf16 would be emulated there), fp32 on the CPU
        (measured: docs/performance.md).
  fp32  IEEE fp32. On CUDA TF32 is switched off for convolutions as well as matmuls (PyTorch
        allows it for cuDNN convolutions by default), so fp32 means fp32 on every GPU.
  fp64  fp64 parameters and inputs, for exact cross-strategy parity tests.
  tf32  fp32 tensors; matmuls and convolutions on TF32 tensor cores (CUDA, Ampere and newer).
  bf16  autocast to bfloat16; parameters, gradients and optimizer state stay fp32.
  fp16  autocast to float16 with dynamic loss scaling (GradScaler); CUDA only.

What cannot apply on the device falls back to fp32 and says so in `notes`, which the run
prints and records. The loop calls `autocast()` and `backward()` (with fp32 or fp64 a plain
`loss.backward()`), and steps through `scaler` where there is one (fp16).

The choice is the job's, made once from every rank's GPU (`job_capabilities`): the lowest
compute capability decides `auto` and the fallbacks for all of them. Chosen per rank, an A100
and a T4 in one job would run bf16 and fp16 with a loss scale of 65536, and DDP/FSDP would
average scaled gradients with unscaled ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Precision:
    name: str  # what actually runs, after any fallback
    dtype: torch.dtype  # parameters and inputs
    device_type: str
    autocast_dtype: Optional[torch.dtype] = None
    scaler: Optional[torch.amp.GradScaler] = None  # fp16 only
    notes: list[str] = field(default_factory=list)

    def autocast(self, cache: bool = True) -> ContextManager[object]:
        """`cache`: autocast keeps each weight's cast for the rest of the forward; off for a
        CUDA graph capture, whose replays must cast afresh (graphed_step.py)."""
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype, cache_enabled=cache)

    def backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()


Capability = tuple[int, int]  # a GPU's compute capability, (major, minor)
NATIVE_BF16 = (8, 0)  # compute capability from which a GPU has bfloat16 units (Ampere)
NAMED_RANKS = 4  # ranks a note names before it counts the rest


def auto_choice(kind: str, capability: Optional[Capability]) -> tuple[str, list[str]]:
    """What `precision: auto` runs on one device, and the note that says why where it is not
    the obvious bf16: fp32 on the CPU; bf16 on a GPU with native bfloat16; fp16 with loss
    scaling on an older GPU, where bf16 would be emulated (torch.cuda.is_bf16_supported()
    counts emulation unless asked not to)."""
    if kind != "cuda":
        return "fp32", []
    if capability is not None and capability >= NATIVE_BF16:
        return "bf16", []
    return "fp16", [
        f"precision auto: this GPU (compute capability {_cc(capability)}) has no native "
        "bfloat16; fp16 autocast with loss scaling instead"
    ]


def lowest_capability(
    capabilities: Sequence[Optional[Capability]],
) -> tuple[Optional[Capability], list[int]]:
    """The lowest of every rank's compute capability (in rank order) and the ranks whose GPU
    has it. One that CUDA could not read (None) counts as the lowest: bf16 is never assumed."""
    known = [c for c in capabilities if c is not None]
    lowest = min(known) if len(known) == len(capabilities) else None
    return lowest, [rank for rank, c in enumerate(capabilities) if c == lowest]


def job_auto_choice(
    kind: str, capabilities: Sequence[Optional[Capability]]
) -> tuple[str, list[str]]:
    """What `precision: auto` runs on every rank of a job, from every rank's compute
    capability in rank order: auto_choice for the lowest, so no rank runs bf16 beside a GPU
    without it; a job of several ranks running fp16 is told which ranks decided it."""
    lowest, ranks = lowest_capability(capabilities)
    name, notes = auto_choice(kind, lowest)
    if notes and len(capabilities) > 1:
        notes = [
            f"precision auto: {name} with loss scaling for the job: the lowest compute "
            f"capability among its GPUs is {_cc(lowest)} ({_ranks(ranks)}), which has no "
            "native bfloat16"
        ]
    return name, notes


def _cc(capability: Optional[Capability]) -> str:
    return "unknown" if capability is None else f"{capability[0]}.{capability[1]}"


def _ranks(ranks: list[int]) -> str:
    """ "rank 3", "ranks 0, 2", "ranks 0, 1, 2, 3 and 60 more" """
    named = ", ".join(map(str, ranks[:NAMED_RANKS]))
    more = f" and {len(ranks) - NAMED_RANKS} more" if len(ranks) > NAMED_RANKS else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {named}{more}"


def gpu_capability(device: torch.device) -> Optional[Capability]:
    """The GPU's compute capability; None for the CPU, or where CUDA cannot say."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return major, minor


def job_capabilities(mine: Optional[Capability], world_size: int) -> list[Optional[Capability]]:
    """Every rank's compute capability in rank order, on every rank: a collective where the
    job has several ranks (every rank calls it). `mine`: this rank's (gpu_capability)."""
    if world_size == 1 or not dist.is_initialized():
        return [mine]
    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, mine)
    return everyone


def build_precision(
    name: str,
    device: torch.device,
    capabilities: Optional[Sequence[Optional[Capability]]] = None,
) -> Precision:
    """The precision every rank of the job runs. `capabilities`: every rank's compute
    capability in rank order (job_capabilities), the lowest of which decides `auto` and the
    fallbacks for all; None: `device`'s alone (one process, and the seam of the tests, which
    have no GPU)."""
    kind = device.type
    if capabilities is None:
        capabilities = [gpu_capability(device)]
    notes: list[str] = []
    if name == "auto":
        name, notes = job_auto_choice(kind, capabilities)
    precision = _resolve(name, kind, lowest_capability(capabilities)[0])
    precision.notes[:0] = notes
    return precision


def _resolve(name: str, kind: str, capability: Optional[Capability]) -> Precision:
    """`capability`: the lowest of the job's GPUs, which every rank falls back for."""
    native_bf16 = capability is not None and capability >= NATIVE_BF16
    if name == "fp64":
        return Precision("fp64", torch.float64, kind)
    if name == "fp32":
        return Precision("fp32", torch.float32, kind)
    if name == "tf32":
        if kind == "cuda" and native_bf16:  # TF32 arrived with the same generation
            return Precision("tf32", torch.float32, kind)
        return fallback(
            name,
            kind,
            "TF32 needs the tensor cores of CUDA GPUs of compute capability 8.0 or newer",
        )
    if name == "bf16":
        if kind == "cuda" and not native_bf16:
            return fallback(
                name,
                kind,
                f"a GPU of the job has no native bfloat16 (compute capability {_cc(capability)})",
            )
        return Precision("bf16", torch.float32, kind, AUTOCAST["bf16"])
    if name == "fp16":
        if kind != "cuda":
            # CPU autocast accepts fp16, but without fp16 arithmetic units it is emulated (more
            # than 10x slower than fp32 on the CPUs measured), and it would need loss scaling.
            return fallback(name, kind, "fp16 autocast with loss scaling is for CUDA GPUs")
        return Precision(
            "fp16", torch.float32, kind, AUTOCAST["fp16"], scaler=torch.amp.GradScaler(kind)
        )
    raise ValueError(f"unknown precision {name!r}")


def fallback(name: str, kind: str, why: str) -> Precision:
    return Precision(
        "fp32",
        torch.float32,
        kind,
        notes=[f"precision {name} on {kind}: {why}; running fp32 instead"],
    )


def configure_backends(precision: Precision, device: torch.device) -> None:
    """Process-wide kernel switches for this precision: TF32 exactly when asked for, and cuDNN
    autotuning (every training and evaluation batch has a fixed shape, so each convolution
    is tuned once and reused). Nothing to switch on the CPU."""
    if device.type != "cuda":
        return
    tf32 = precision.name == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bfloat16 instructions (AVX-512 BF16 or AMX). Without them bf16
    is emulated: on an AVX2-only EPYC the compiled bf16 step ran 10x slower than on a Zen 4
    with AVX-512 BF16, where it was the fastest CPU setting (docs/performance.md)."""
    try:
        flags = next(
            line
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
        ).split()
    except (OSError, StopIteration):
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags
