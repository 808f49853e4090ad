"""What an epoch measures beside its losses: its training seconds, the run's clock, the
machine's load over its steps (core_wait.py) and every device's memory peaks, training and
evaluation apart (memory.py). The Trainer calls it at four points of each epoch; everything
read between `started` and `trained` is the training steps' alone.

Nothing here runs inside the steps: the one wait for the device is at the end of the
training steps, where the epoch's time must include their queued kernels, and every rank's
figures travel in one collective after evaluation (`gathered`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.distributed as dist

from pipeline import core_wait, memory
from pipeline.context import DistContext


def wait_for_device(device: torch.device) -> None:
    """Block until the GPU has finished what was queued (epoch timing); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Meter:
    """One process's meter over the epochs of its run. `devices`: the local devices the run
    computes on; `wall_before`: the run's training seconds before this process (a resume's)."""

    devices: list[torch.device]
    ctx: DistContext
    wall_before: float = 0.0
    _start: float = field(default_factory=lambda: time.perf_counter())
    _t0: float = 0.0
    _cores: Optional[core_wait.Times] = None
    _waited: Optional[float] = None
    _train_peaks: list[memory.DevicePeak] = field(default_factory=list)

    def started(self) -> None:
        """An epoch's training steps begin."""
        memory.reset_peaks(self.devices)
        self._cores = core_wait.read()
        self._t0 = time.perf_counter()

    def trained(self) -> float:
        """The training steps are queued: wait for them; their seconds in this process. The
        peaks are then reset, so that evaluation's are its own."""
        wait_for_device(self.ctx.device)
        seconds = time.perf_counter() - self._t0
        self._waited = core_wait.wait_share(self._cores, core_wait.read())
        self._train_peaks = memory.read_peaks(self.devices, self.ctx)
        memory.reset_peaks(self.devices)
        return seconds

    def wall_seconds(self) -> float:
        """The run's clock: its training seconds so far, a resume's before this process's."""
        return self.wall_before + time.perf_counter() - self._start

    def gathered(self) -> tuple[dict[str, float], Optional[float]]:
        """After evaluation, on every rank (a collective): every device's peaks as the
        epoch's memory metrics, and the busiest rank's wait for a core (every step of a
        multi-process strategy waits for its slowest rank; None where a rank measured none)."""
        mine = (self._train_peaks, memory.read_peaks(self.devices, self.ctx), self._waited)
        everyone: list[Any] = [mine]
        if self.ctx.world_size > 1:
            everyone = [None] * self.ctx.world_size  # all_gather_object fills it
            dist.all_gather_object(everyone, mine)
        train, evaluation, waits = zip(*everyone)
        metrics = memory.epoch_metrics(
            memory.merge_peaks(list(train)), memory.merge_peaks(list(evaluation))
        )
        return metrics, None if None in waits else max(waits)
