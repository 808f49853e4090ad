"""The report's noise floor for memory, measured the way speed's is (speed_noise.py): from the
runs that should be equal. Pure functions over the table's rows: no files, no MLflow.

The A/A group (speed_noise.null_group: single and the strategies that ran its very
computation here, in processes of their own) holds the same model, optimizer state and
batches, so its training peaks differ only by the noise of measuring a process's memory: on
a CPU a process's RSS moves by tens of MiB with what the allocator and the imports happened
to keep (issue 68: ddp's two ranks, alike by construction, peaked at 783 and 755 MiB). Two
measurements of that noise come from the group: its members' largest relative difference of
their busiest-device peaks (across runs), and each member's epoch-to-epoch spread of that peak
relative to it (across the epochs of one run, which compute the same). The memory floor is the
larger: three processes' peaks alone came out 9.5% apart in one quickstart and 2.3% in the
next, while the members' own epochs moved by 5 to 8% in both (docs/report.md):

- peak memory: two strategies tie when their peaks' ratio, higher over lower, is within it;
- memory balance: the imbalance (max / mean over a strategy's devices) of ranks that are alike
  moves with each device's peak, so two imbalances tie when they differ by no more than it.

On a GPU the allocator's peaks are exact: the group's agree and the floor is 0 (or nearly),
which leaves the answer as it was. Where there is no A/A group, there is no floor, and the
epoch-to-epoch spreads alone judge (answer.py), as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from pipeline.reporting.row import Row
from pipeline.reporting.speed_noise import null_group, relative_spread
from pipeline.reporting.table import busiest


@dataclass(frozen=True)
class MemoryFloor:
    """The A/A group, each member's busiest-device training peak (MiB) and the relative floor
    they give (None with fewer than two peaks)."""

    group: tuple[str, ...]
    peaks: dict[str, float]
    floor: Optional[float]
    # the members' epoch-to-epoch spread of that peak, relative to it (where measured), and
    # the group's spread across runs alone
    epochs: dict[str, float] = field(default_factory=dict)
    across: Optional[float] = None

    def to_json(self) -> dict[str, Any]:
        return {
            "group": list(self.group),
            "peaks_mib": self.peaks,
            "floor": self.floor,
            "across_runs": self.across,
            "epoch_spreads": self.epochs,
        }


def memory_floor(rows: Sequence[Row]) -> MemoryFloor:
    group, _ = null_group(rows)
    by_name = {r["strategy"]: r for r in rows}
    peaks = {n: top[1] for n in group if (top := busiest(by_name[n])) is not None}
    if len(peaks) < 2:  # no A/A group: no floor, whatever one run's epochs say
        return MemoryFloor(group, peaks, None)
    epochs = {
        n: spread / mib
        for n, mib in peaks.items()
        if (spread := by_name[n].get("peak_memory_spread_mib")) is not None and mib > 0
    }
    across = relative_spread(list(peaks.values()))
    known = [x for x in (across, *epochs.values()) if x is not None]
    return MemoryFloor(group, peaks, max(known) if known else None, epochs, across)


def within_ratio(best: float, value: float, floor: MemoryFloor) -> bool:
    """Whether peak `value` ties `best` (the better one) within the memory floor: their
    ratio, higher over lower, is no further from 1 than the floor."""
    if floor.floor is None or best <= 0 or value <= 0:
        return False
    return max(best, value) / min(best, value) - 1 <= floor.floor


def within_difference(best: float, value: float, floor: MemoryFloor) -> bool:
    """Whether imbalance `value` ties `best` within the memory floor: by their difference."""
    if floor.floor is None or best <= 0 or value <= 0:
        return False
    return abs(value - best) <= floor.floor


# how each memory objective's two figures are set against the floor
WITHIN = {"peak_memory": within_ratio, "memory_balance": within_difference}


def within(objective: str, best: float, value: float, floor: MemoryFloor) -> bool:
    """Whether `value` ties `best` (the better figure) within the memory floor: peaks by their
    ratio, imbalances by their difference."""
    return WITHIN[objective](best, value, floor)


def floor_reason(floor: MemoryFloor) -> Optional[str]:
    """The memory objectives' line: the floor, measured how; None where there is none."""
    if floor.floor is None:
        return None
    cells = ", ".join(f"{n} {mib:.0f} MiB" for n, mib in floor.peaks.items())
    names = list(floor.peaks)
    joined = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    epochs = ", ".join(f"{n} {x:.1%}" for n, x in floor.epochs.items())
    moved = f"; their epochs' peaks moved by {epochs}" if epochs else ""
    return (
        f"memory noise floor {floor.floor:.1%} (A/A: {joined}, the same computation here, "
        f"peaked at {cells}{moved}): a difference within it is a tie"
    )
