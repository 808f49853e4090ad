"""The answer's objectives as data: one record each, which answer.py walks without asking
which one it holds. A record says what the objective ranks (its figure and sense), how its
figures are shown (equal text is a tie), the noise it is judged against (an A/A floor, an
epoch-to-epoch spread), why a strategy has no figure, the words of its winner and of the
winner against another strategy, and the MLflow alias its pick goes under. Adding an
objective is adding a record to OBJECTIVES (tests/unit/test_answer_objectives.py shows one
ranked and rendered in every format).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

from pipeline.reporting import memory_noise
from pipeline.reporting.memory_noise import MemoryFloor
from pipeline.reporting.row import Row
from pipeline.reporting.speed_noise import SpeedFloor, floor_reason, within_floor

# the word a record's text names the devices with: "GPU", or "process" on the CPU
Device = str


def and_names(names: Sequence[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


@dataclass(frozen=True)
class Floors:
    """The noise floors the objectives are judged against: speed's and memory's A/A."""

    speed: SpeedFloor
    memory: MemoryFloor


@dataclass(frozen=True)
class Noise:
    """An objective's A/A noise floor: its bound (a fraction; None where not measured),
    whether a figure lies within it of the best, and the reason line that says how it was
    measured (None where there is no floor)."""

    bound: Callable[[Floors], Optional[float]]
    within: Callable[[Floors, float, float], bool]
    reason: Callable[[Floors], Optional[str]]


def speed_noise(objective: str) -> Noise:
    """The speed floor of one speed objective (speed_noise.FIGURES names its figure)."""
    return Noise(
        lambda f: f.speed.floor(objective),
        lambda f, best, value: within_floor(objective, best, value, f.speed),
        lambda f: floor_reason(objective, f.speed),
    )


def memory_floor_noise(within: Callable[[float, float, MemoryFloor], bool]) -> Noise:
    """The memory floor (memory_noise.py), with how two figures are set against it."""
    return Noise(
        lambda f: f.memory.floor,
        lambda f, best, value: within(best, value, f.memory),
        lambda f: memory_noise.floor_reason(f.memory),
    )


@dataclass(frozen=True)
class Objective:
    key: str
    alias: str  # the MLflow model alias of its pick: models:/<name>@<alias>
    title: Callable[[Optional[float]], str]  # (the target accuracy) -> its title
    value: Callable[[Row], Optional[float]]  # its figure; None: not measured for the row
    shown: Callable[[float], str]  # as the report shows it: equal text = a tie
    lower_is_better: bool
    describe: Callable[[Row, float, Device], str]  # "ddp 12345 samples/s"
    winner: Callable[[Row, float, Device], str]  # the winner alone: "ddp: 1600 steady ..."
    # the winner against another: (name, figure, other's name, other's figure, device);
    # None: the winner is said alone, with the next best described beside it
    ratio: Optional[Callable[[str, float, str, float, Device], str]]
    missing: Callable[[list[Row]], str]  # why these rows have no figure
    # (every row, the target) -> the reasons when no row has the figure
    nothing: Callable[[list[Row], Optional[float]], tuple[str, ...]]
    # the figure's epoch-to-epoch spread in a run: a difference within the larger of two
    # strategies' spreads is a tie; None: the precision rule alone
    spread: Optional[Callable[[Row], Optional[float]]] = None
    spread_shown: str = ""  # its format and unit in the reasons: ".0f MiB"
    spread_needs: str = "2 or more epochs"  # what measuring the spread takes
    noise: Optional[Noise] = None  # the A/A floor it is judged against
    # a speed objective (its figure a time, speed_noise.LOADS names the load over it): the
    # ranks that took turns on one GPU and the runs the machine was too busy to time are
    # shown, not ranked, and a winner with other speed options than those it is set against
    # is said to be so. The words that name the strategies it timed ("that reached it").
    timed: Optional[str] = None
    steady: bool = False  # its figure is over steady epochs: name those where warm-up stood in


def _peak(row: Row) -> Optional[float]:
    peaks = row.get("peak_memory_mib") or {}
    return max(peaks.values()) if peaks else None


def busiest_label(row: Row) -> str:
    peaks = row.get("peak_memory_mib") or {}
    return max(peaks, key=peaks.__getitem__) if peaks else "?"


def _imbalance(row: Row) -> Optional[float]:
    if len(row.get("peak_memory_mib") or {}) < 2:
        return None  # one device: nothing to balance
    return row.get("mem_imbalance")


def device_count(row: Row, device: Device) -> str:
    n = len(row.get("peak_memory_mib") or {})
    shared = row.get("shared_devices")
    if shared:
        gpus = len(shared)
        return f"{n} ranks sharing {gpus} {device}{'s' if gpus != 1 else ''}"
    return f"{n} {device}{'es' if device == 'process' else 's'}" if n != 1 else f"1 {device}"


def _no_ratio(name: str, value: float, other: str, theirs: float) -> Optional[str]:
    """Where either figure is not positive there is no ratio to speak of."""
    if value <= 0 or theirs <= 0:
        return f"{name}: {value:g} vs {other}'s {theirs:g}"
    return None


def _names(rows: list[Row]) -> str:
    return ", ".join(r["strategy"] for r in rows)


def _not_reached(rows: list[Row], target: Optional[float]) -> tuple[str, ...]:
    if target is None:
        return ("no target set (report.target_accuracy): nothing to reach",)
    top = max(rows, key=lambda r: r["test_acc"])
    return (
        f"no strategy reached test accuracy {target:g} (the highest final: "
        f"{top['strategy']} {top['test_acc']:.4f}); none recommended for it",
    )


def _no_steady(rows: list[Row]) -> str:
    # each run left out with the reason it gave (RunSummary.speed_note)
    return "no steady figure, not ranked: " + "; ".join(
        f"{r['strategy']} ({r['speed_note']})" if r.get("speed_note") else r["strategy"]
        for r in rows
    )


FASTEST_TO_TARGET = Objective(
    key="fastest_to_target",
    alias="fastest-to-target",
    title=lambda target: (
        f"Fastest to {f'test accuracy {target:g}' if target is not None else 'the target accuracy'}"
    ),
    value=lambda r: r.get("time_to_target_s"),
    shown=lambda v: f"{v:.1f}",
    lower_is_better=True,
    describe=lambda r, v, device: f"{r['strategy']} {v:.1f} s (epoch {r.get('epoch_to_target')})",
    winner=lambda r, v, device: (
        f"{r['strategy']}: reached it in {v:.1f} s of training (epoch {r['epoch_to_target']})"
    ),
    ratio=lambda name, v, other, theirs, device: (
        _no_ratio(name, v, other, theirs)
        or f"{name}: {theirs / v:.2f}x sooner than {other} ({v:.1f} vs {theirs:.1f} s)"
    ),
    missing=lambda rows: f"not reached by {_names(rows)}",
    nothing=_not_reached,
    noise=speed_noise("fastest_to_target"),
    timed="that reached it",
)

THROUGHPUT = Objective(
    key="throughput",
    alias="highest-throughput",
    title=lambda target: "Highest throughput",
    value=lambda r: r.get("steady_samples_per_s"),
    shown=lambda v: f"{v:.0f}",
    lower_is_better=False,
    describe=lambda r, v, device: f"{r['strategy']} {v:.0f} samples/s",
    winner=lambda r, v, device: f"{r['strategy']}: {v:.0f} steady samples/s",
    ratio=lambda name, v, other, theirs, device: (
        _no_ratio(name, v, other, theirs)
        or (
            f"{name}: {v / theirs:.2f}x {other}'s steady samples/s "
            f"({v:.0f} vs {theirs:.0f} samples/s)"
        )
    ),
    missing=_no_steady,
    nothing=lambda rows, target: (
        "no strategy has this figure",
        *([_no_steady(rows)] if any(r.get("speed_note") for r in rows) else []),
    ),
    spread=lambda r: r.get("steady_samples_per_s_spread"),
    spread_shown=".0f samples/s",
    spread_needs="2 or more steady epochs",
    noise=speed_noise("throughput"),
    timed="timed",
    steady=True,
)

PEAK_MEMORY = Objective(
    key="peak_memory",
    alias="least-memory",
    title=lambda target: "Lowest per-device peak memory",
    value=_peak,
    shown=lambda v: f"{v:.0f}",
    lower_is_better=True,
    describe=lambda r, v, device: f"{r['strategy']} {v:.0f} MiB ({busiest_label(r)})",
    winner=lambda r, v, device: (
        f"{r['strategy']}: {v:.0f} MiB training peak on its busiest {device} ({busiest_label(r)})"
    ),
    ratio=lambda name, v, other, theirs, device: (
        _no_ratio(name, v, other, theirs)
        or (
            f"{name}: {v / theirs:.2f}x {other}'s training peak on the busiest {device} "
            f"({v:.0f} vs {theirs:.0f} MiB)"
        )
    ),
    missing=lambda rows: f"not measured: {_names(rows)}",
    nothing=lambda rows, target: ("no strategy has this figure",),
    spread=lambda r: r.get("peak_memory_spread_mib"),
    spread_shown=".0f MiB",
    noise=memory_floor_noise(memory_noise.within_ratio),
)


def _balance_winner(row: Row, value: float, device: Device) -> str:
    cells = ", ".join(f"{k} {v:.0f}" for k, v in (row.get("peak_memory_mib") or {}).items())
    return (
        f"{row['strategy']}: its busiest {device} peaks at {value:.2f}x the mean over its "
        f"{device_count(row, device)} ({cells} MiB)"
    )


MEMORY_BALANCE = Objective(
    key="memory_balance",
    alias="most-even-memory",
    title=lambda target: "Most even memory across devices",
    value=_imbalance,
    shown=lambda v: f"{v:.2f}",
    lower_is_better=True,
    describe=lambda r, v, device: f"{r['strategy']} {v:.2f} over {device_count(r, device)}",
    winner=_balance_winner,
    ratio=None,
    missing=lambda rows: f"one device, nothing to balance: {_names(rows)}",
    nothing=lambda rows, target: ("every strategy ran on one device: nothing to balance",),
    spread=lambda r: r.get("mem_imbalance_spread"),
    spread_shown=".3f",
    noise=memory_floor_noise(memory_noise.within_difference),
)

# in the answer's order
OBJECTIVES: tuple[Objective, ...] = (FASTEST_TO_TARGET, THROUGHPUT, PEAK_MEMORY, MEMORY_BALANCE)
