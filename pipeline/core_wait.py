"""How long a training process waited for a CPU core: the machine's load, seen from inside
the run, so that the report can tell a faster strategy from a quieter moment (issue 51).

Linux counts, for every thread, the time it ran and the time it was ready to run but waited
in a run queue for a core (/proc/<pid>/task/<tid>/schedstat: ns on a CPU, ns waiting, time
slices). A process that waited a share w of its runnable time ran about 1 / (1 - w) times
slower than it would have with a core of its own: on this project's 2-core VM, a one-thread
loop beside two busy neighbours took 0.29 s instead of 0.18 s with w = 0.37, and
0.29 x (1 - 0.37) = 0.18. Two stages of a race that waited differently were timed on
different machines, in effect; the report widens its noise floor by that difference
(reporting/speed_noise.py). Sleeping (a collective waiting for a peer, I/O) is not a wait
here: only time spent runnable without a core is.

Elsewhere (macOS, a kernel without schedstats) nothing is measured: None, said so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

# thread id -> (ns it ran, ns it waited for a core)
Times = Mapping[str, tuple[int, int]]


def read(tasks: Path | None = None) -> Optional[Times]:
    """Every thread of this process's times so far; None where the kernel keeps none."""
    tasks = tasks or Path(f"/proc/{os.getpid()}/task")  # this process's, forked or not
    times = {}
    try:
        threads = list(tasks.iterdir())
    except OSError:
        return None
    for thread in threads:
        try:
            ran, waited, _slices = (thread / "schedstat").read_text().split()
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile, or no schedstats on this kernel
        times[thread.name] = (int(ran), int(waited))
    return times or None


def wait_share(before: Optional[Times], after: Optional[Times]) -> Optional[float]:
    """The share of the process's runnable time between two reads that it spent waiting for
    a core, over all its threads (one that started meanwhile counts from 0, one that ended
    is lost: the helpers' are short-lived and small). None where either read found nothing,
    or no thread ran."""
    if before is None or after is None:
        return None
    ran = waited = 0
    for thread, (r, w) in after.items():
        r0, w0 = before.get(thread, (0, 0))
        ran, waited = ran + r - r0, waited + w - w0
    return waited / (ran + waited) if ran + waited > 0 else None


# Beyond this share of its runnable time spent waiting for a core, a run's time is the
# machine's more than the strategy's, and the report shows its speed without ranking it
# (reporting/answer.py, "machine busy: not ranked"). Chosen from benchmarks/omp_threads.py
# (docs/performance.md "Threads per process"): a run's time is 1 / (1 - w) its own, and the
# wait's own round-to-round spread there (0.13) moves it by 0.13 / (1 - w): 26% at 0.5, the
# A/A floor's 20 to 30%; beyond, more than any floor allows (65% at 0.8).
BUSY_WAIT = 0.5


def busy(share: Optional[float]) -> bool:
    """Whether a run that waited `share` of its runnable time for a core ran on a machine
    too busy to time it; False where nothing was measured."""
    return share is not None and share > BUSY_WAIT


def others_runnable(loadavg: Path = Path("/proc/loadavg"), reads: int = 5) -> Optional[float]:
    """How many threads of other processes are runnable right now (the median of a few
    reads of the kernel's count, which includes the reader): what a launch would share the
    cores with. None where the kernel does not say (macOS)."""
    counts = []
    for _ in range(reads):
        try:
            running = int(loadavg.read_text().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return None
        counts.append(running - 1)
        os.sched_yield()  # let a thread that is runnable show up in the next read
    return float(sorted(counts)[len(counts) // 2])


def threads_per_process(cores: int, nproc: int, others: Optional[float]) -> int:
    """OpenMP threads for each of `nproc` processes on `cores` cores beside `others` runnable
    threads: the cores' even share where they are free, one thread where they are not.
    Measured (benchmarks/omp_threads.py, docs/performance.md "Threads per process"): on 2
    cores under load, two threads of one process ran a training step 1.05 to 3.4 times
    slower than one thread (OpenMP's threads spin waiting for each other while one has no
    core). Where the cores are free, two threads ran it in 0.55 to 0.72 of one thread's time
    (an idle machine, 2026-12-02): the even share there."""
    share = max(1, cores // nproc)
    if others is None:
        return share
    return max(1, min(share, int(cores - others) // nproc))
