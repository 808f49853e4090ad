"""A stop signal (SIGTERM: `docker stop`, the elastic agent passing one on; SIGINT: Ctrl-C)
turned into a step every rank stops at, in time: the agent kills its workers 30 s after it
passed the signal on.

One process stops at its next step. Several must agree on the step, so they vote: an
all-reduce of [SIGTERM seen, seconds a step took since the last vote] at step boundaries
all ranks pick alike. A vote at every step would make every rank wait for the slowest at
every boundary (on GPUs a host-side barrier in a loop that otherwise never waits), and a
vote every fixed number of steps comes too late where steps are slow (width 64 on a CPU:
seconds each). So the ranks vote by time: the first vote after the first step, then again
after as many steps as fit in VOTE_EVERY_S at the slowest rank's step time, and at most
VOTE_EVERY_STEPS apart (`steps_to_next_vote`). Every rank computes the next vote from the
same reduced numbers, so they all call the all-reduce at the same steps (a vote decided by
each rank's own clock would deadlock). The vote is a CPU tensor over a gloo group, and the
clocks are host clocks: no GPU sync.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from types import FrameType

import torch
import torch.distributed as dist

# The most wall time between two votes, at the step time measured since the last one: far
# inside torchrun's 30 s grace, which must also hold the checkpoint and the exit.
VOTE_EVERY_S = 1.0
# The most steps between two votes, where steps are fast (a GPU's milliseconds): a step time
# that grows after a vote is caught within this many steps; 16 cost nothing on a GPU.
VOTE_EVERY_STEPS = 16
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def steps_to_next_vote(
    step_seconds: float, bound_s: float = VOTE_EVERY_S, most: int = VOTE_EVERY_STEPS
) -> int:
    """How many steps the ranks take before their next vote, given the slowest rank's
    seconds a step since the last one: as many as fit in `bound_s`, at least 1, at most
    `most`."""
    if step_seconds * most <= bound_s:  # also a clock that did not move (0)
        return most
    return max(1, math.floor(bound_s / step_seconds))


def all_reduce_max(group: dist.ProcessGroup | None) -> Callable[[torch.Tensor], None]:
    def reduce(vote: torch.Tensor) -> None:
        dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=group)

    return reduce


class StopRequest:
    """Whether the ranks agree to stop before a step; `flag` is this process's own SIGTERM.
    `clock` and `reduce` are seams for tests (host seconds; the in-place MAX over ranks)."""

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        world_size: int = 1,
        clock: Callable[[], float] = time.perf_counter,
        reduce: Callable[[torch.Tensor], None] | None = None,
    ):
        self.flag = False
        self.signum: int | None = None  # the stop signal that set `flag`
        self.world_size, self.clock = world_size, clock
        self.reduce = reduce if reduce is not None else all_reduce_max(group)
        self.boundaries = 0  # step boundaries passed: steps this process ran
        self.next_vote = 1  # the first vote after the first step, which it times
        self.last_vote: tuple[float, int] | None = None  # (clock, boundaries) at the last
        # SIGINT too: Ctrl-C at a terminal reaches the workers themselves (they share the
        # launcher's process group), and the agent passes on the SIGINT it got
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._handler)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.flag, self.signum = True, signum

    def agreed(self) -> bool:
        """Called before every step, by every rank alike: stop here?"""
        if self.world_size == 1:
            return self.flag
        boundary = self.boundaries
        self.boundaries += 1
        if self.last_vote is None:  # the run's first step starts the clock
            self.last_vote = (self.clock(), boundary)
        if boundary < self.next_vote:
            return False
        now = self.clock()
        since, at = self.last_vote
        step_seconds = (now - since) / (boundary - at)
        vote = torch.tensor([float(self.flag), step_seconds], dtype=torch.float64)
        self.reduce(vote)
        stop, slowest = vote.tolist()
        self.last_vote = (now, boundary)
        self.next_vote = boundary + steps_to_next_vote(slowest)
        return bool(stop > 0)
