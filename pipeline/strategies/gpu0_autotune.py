"""`balanced_dp.gpu0_bsz: auto`: measure a few candidate values, keep the leanest fast one.

`resolve_gpu0_bsz` runs once per run, before its first step (balanced_dp's `at_start`; a
resumed run takes the value its checkpoint kept): for each
candidate (`candidates`: the even share of device 0 and 3/4, 1/2, 1/4 of it, and 0) it runs a
few forward+backward passes of a deep copy of the model as the run will train it (its dtype and
memory layout; no optimizer step, so the weights and BatchNorm statistics the run trains are
untouched), wrapped and compiled as the loop's forward is (`LoopForward`), under the run's
autocast, on a batch shaped and laid out like a training micro-batch, drawn from its own
generator (the run's random streams are untouched), timed between CUDA synchronizations, and
reads the peak allocated memory of every device.
`choose_gpu0_bsz` (pure; tested without GPUs) then keeps the candidates within 5% of the best
throughput and of those the one with the lowest peak over devices.

On the CPU or one GPU nothing is balanced: auto resolves to null (the even split) without
profiling, and a note says why. The choice and the measurements become notes, which the
writer prints and summary.json keeps (and the checkpoint, with the value, for a resume to
reuse); the first note starts `balanced_dp.gpu0_bsz_chosen=`, the MLflow param's name.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.batch_plan import BatchPlan
from pipeline.memory import MIB, peak_rss_bytes, reset_peaks
from pipeline.resnet import INPUT_SHAPE, NUM_CLASSES
from pipeline.strategies.base import LoopForward

AUTO = "auto"
CHOSEN_KEY = "balanced_dp.gpu0_bsz_chosen"
THROUGHPUT_TOLERANCE = 0.05  # "equal throughput": within 5% of the best candidate
MEMORY_TOLERANCE = 0.01  # peaks within 1% of the lowest count as a tie (then: the faster)


@dataclass(frozen=True)
class Measurement:
    gpu0_bsz: int
    samples_per_s: float  # 0 when the candidate failed
    peak_mib: tuple[float, ...]  # peak allocated per device (cuda:0 first)
    error: Optional[str] = None  # e.g. "out of memory"

    @property
    def ok(self) -> bool:
        return (
            self.error is None
            and self.samples_per_s > 0
            and math.isfinite(self.samples_per_s)
            and len(self.peak_mib) > 0
        )

    @property
    def peak(self) -> float:
        """The figure compared: the highest peak over devices (the first to run out)."""
        return max(self.peak_mib) if self.peak_mib else math.inf


def candidates(micro: int, n_devices: int) -> list[int]:
    """Device 0's even share of a micro-batch, 3/4, 1/2 and 1/4 of it, and 0, largest first,
    without repeats: 64 over 2 -> [32, 24, 16, 8, 0]; 3 over 2 -> [2, 1, 0]."""
    even = -(-micro // max(n_devices, 1))
    return sorted({even, even * 3 // 4, even // 2, even // 4, 0}, reverse=True)


def choose_gpu0_bsz(
    measurements: Sequence[Measurement],
    throughput_tolerance: float = THROUGHPUT_TOLERANCE,
    memory_tolerance: float = MEMORY_TOLERANCE,
) -> tuple[Optional[int], str]:
    """(gpu0_bsz, why) from the measurements; None (the even split) when none succeeded.

    Keep the candidates within `throughput_tolerance` of the best throughput; of those, the
    lowest peak over devices. Peaks within `memory_tolerance` of that lowest tie; a tie goes
    to the faster candidate, then to the larger gpu0_bsz (the split nearer to even).
    """
    usable = [m for m in measurements if m.ok]
    if not usable:
        tried = ", ".join(f"{m.gpu0_bsz} ({m.error or 'no measurement'})" for m in measurements)
        return None, (
            "no candidate could be measured"
            + (f": {tried}" if tried else "")
            + "; using the even split"
        )
    best = max(m.samples_per_s for m in usable)
    fast = [m for m in usable if m.samples_per_s >= (1 - throughput_tolerance) * best]
    lowest = min(m.peak for m in fast)
    tied = [m for m in fast if m.peak <= lowest * (1 + memory_tolerance)]
    pick = max(tied, key=lambda m: (m.samples_per_s, m.gpu0_bsz))
    why = (
        f"lowest peak ({pick.peak:.0f} MiB on the fullest device) of the "
        f"{len(fast)} of {len(usable)} candidates within {throughput_tolerance:.0%} of the "
        f"best throughput ({best:.0f} samples/s); it ran at {pick.samples_per_s:.0f}"
    )
    slow = [m for m in usable if m not in fast and m.peak < pick.peak]
    if slow:
        leaner = min(slow, key=lambda m: m.peak)
        why += (
            f"; gpu0_bsz {leaner.gpu0_bsz} needed less ({leaner.peak:.0f} MiB) but ran "
            f"{1 - leaner.samples_per_s / best:.0%} slower"
        )
    failed = [m for m in measurements if not m.ok]
    if failed:
        why += "; failed: " + ", ".join(
            f"{m.gpu0_bsz} ({m.error or 'no measurement'})" for m in failed
        )
    return pick.gpu0_bsz, why


def evidence(measurements: Sequence[Measurement]) -> str:
    """One line of every candidate's figures, for the record."""
    parts = []
    for m in measurements:
        if m.ok:
            per_device = "/".join(f"{p:.0f}" for p in m.peak_mib)
            parts.append(f"{m.gpu0_bsz}: {m.samples_per_s:.0f} samples/s, peak {per_device} MiB")
        else:
            parts.append(f"{m.gpu0_bsz}: {m.error or 'no measurement'}")
    return "; ".join(parts)


@dataclass(frozen=True)
class Probe:
    """What each candidate is timed on: a micro-batch of `micro` random images, `passes`
    timed forward+backward passes after `warmup` untimed ones (which also compile).
    `devices`: the CUDA devices (cuda:0 first, where the model lives); empty on the CPU, where
    the one figure is the process's peak RSS (only the tests profile there)."""

    micro: int
    devices: Sequence[torch.device]
    passes: int = 3
    warmup: int = 1


def measure(
    model: nn.Module,
    wrap: Callable[[nn.Module, int], nn.Module],
    probe: Probe,
    options: Sequence[int],
    loop: LoopForward,
) -> list[Measurement]:
    """Time the probe's passes of `wrap(copy, gpu0_bsz)`, prepared as the loop runs its
    forward, per candidate, and read each device's peak allocated memory. Out-of-memory
    marks a candidate as failed instead of ending the run.
    """
    micro, devices, passes, warmup = probe.micro, probe.devices, probe.passes, probe.warmup
    first = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    copied = copy.deepcopy(model).train()
    gen = torch.Generator().manual_seed(0)  # its own stream: the run's RNG stays untouched
    x = torch.randn(micro, *INPUT_SHAPE, generator=gen).to(first, dtype)
    y = torch.randint(0, NUM_CLASSES, (micro,), generator=gen).to(first)
    if loop.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)

    def step(forward: Callable[[torch.Tensor], torch.Tensor]) -> None:
        loop.new_graph_step()
        with loop.autocast():
            logits = forward(x)
            loss = F.cross_entropy(logits.float(), y.to(logits.device))
        loss.backward()
        copied.zero_grad(set_to_none=True)  # as the training loop does after each step

    def synchronize() -> None:
        for device in devices:
            torch.cuda.synchronize(device)

    results = []
    for gpu0_bsz in options:
        forward, error = loop.prepare(wrap(copied, gpu0_bsz)), None
        try:
            for _ in range(warmup):
                step(forward)
            synchronize()
            reset_peaks(list(devices))
            t0 = time.perf_counter()
            for _ in range(passes):
                step(forward)
            synchronize()
            seconds = max(time.perf_counter() - t0, 1e-9)
            if devices:
                peaks = tuple(torch.cuda.max_memory_allocated(d) / MIB for d in devices)
            else:
                peaks = (peak_rss_bytes() / MIB,)
            results.append(Measurement(gpu0_bsz, micro * passes / seconds, peaks))
        except torch.cuda.OutOfMemoryError:
            error = "out of memory"
        del forward
        if error is not None:  # outside the handler: its traceback no longer pins tensors
            results.append(Measurement(gpu0_bsz, 0.0, (), error))
        copied.zero_grad(set_to_none=True)
        if devices:
            torch.cuda.empty_cache()
    return results  # the caller empties the cache once the copy and its batch are gone


def resolve_gpu0_bsz(
    model: nn.Module,
    plan: BatchPlan,
    n_gpus: int,
    on_cuda: bool,
    wrap: Callable[[nn.Module, int], nn.Module],
    loop: LoopForward,
) -> tuple[Optional[int], list[str]]:
    """`auto` -> (GPU 0's samples per forward, notes). Profiles only with two or more GPUs.
    The notes give the choice as balanced_dp.gpu0_bsz means it: per optimizer step, i.e.
    times the plan's grad_accum forwards of a step."""
    micro, accum = plan.micro, plan.grad_accum
    if not on_cuda or n_gpus < 2:
        where = "on the CPU" if not on_cuda else "on one GPU"
        return None, [
            f"{CHOSEN_KEY}=null: balanced_dp.gpu0_bsz=auto {where} resolves to the "
            f"even split, without profiling (there is nothing to balance)"
        ]
    devices = [torch.device("cuda", i) for i in range(n_gpus)]
    options = candidates(micro, n_gpus)
    measurements = measure(model, wrap, Probe(micro, devices), options, loop)
    torch.cuda.empty_cache()  # what the profiling held is free again
    choice, why = choose_gpu0_bsz(measurements)
    shown = "null" if choice is None else str(choice * accum)
    per_forward = "" if accum == 1 or choice is None else f" ({choice} per forward)"
    return choice, [
        f"{CHOSEN_KEY}={shown}{per_forward}: balanced_dp.gpu0_bsz=auto picked it from "
        f"{', '.join(map(str, options))} per forward, for the micro-batch of {micro}: {why}",
        f"balanced_dp.gpu0_bsz=auto measurements: {evidence(measurements)}",
    ]
