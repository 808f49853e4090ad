"""When a stage reaches each phase of its start and end, for benchmarks/startup.py: with
PARALLEL_LAB_TIMELINE naming a file, each `mark` appends `<unix time> <pid> <phase>` to it
(the launcher's, and rank 0's of the workers, which inherit its environment). Without it,
a mark costs a dictionary look-up."""

from __future__ import annotations

import os
import time

ENV = "PARALLEL_LAB_TIMELINE"
# the stage's MLflow publisher, as it ends: the CPU seconds it used beside the other phases
# (at idle priority, never a training core's), the figure after this word
PUBLISHER_CPU = "MLflow publisher CPU"


def mark(phase: str, rank: int = 0) -> None:
    """Mark `phase` now, in the job's rank 0 (whose phases stand for the job's)."""
    path = os.environ.get(ENV)
    if path and rank == 0:
        with open(path, "a") as f:  # one short line, one write: lines of processes never mix
            f.write(f"{time.time():.6f} {os.getpid()} {phase}\n")
