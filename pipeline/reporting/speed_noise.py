"""The report's noise floor for speed: an A/A comparison built into every experiment. Pure
functions over the table's rows (table.comparison_rows): no files, no MLflow.

Some strategies run `single`'s very computation at its cost on some hardware: on one device
DataParallel (`dp`, and `balanced_dp`, whose split has nothing to split) calls the model
directly, in one process, with the same batch (their losses equal single's to the last
digit on a CPU). Their speed can then differ from single's only by chance: the machine's
noise between processes (20 to 30% on a busy 2-core VM, where within a run the epochs agree
to a few percent), the order they ran in, what else ran beside them. So their measured
difference is the run-to-run noise floor for speed: a throughput or time-to-target
difference between any two strategies is called real only beyond it (answer.py), and the
null group itself is always a tie, whatever order the strategies ran in.

On a GPU the DataParallel wrapper itself costs a little time (scatter and gather around one
device: 1 to 3% on an H200), which lands in the floor too: it can only call more ties, never
a win that is not there.

The A/A group runs back to back in some orders, and then sees none of the load that came and
went while the other strategies ran (a neighbour's job, a second test worker: on a busy 2-core
CI machine ddp, one process like single, once came out 1.24x single in one order and tied in
the other). So every run also measures the machine's load over its epochs, from inside: the
share of its runnable time its busiest rank spent waiting for a CPU core (core_wait.py). Two
runs that waited w1 and w2 ran (1 - w1) / (1 - w2) apart by load alone; the largest such
ratio between the strategies is the load floor, which widens the A/A floor (`widened`): a
speed difference is called real only beyond both together.

A run that waited more than core_wait.BUSY_WAIT of its runnable time ran on a machine too busy
to time it (`machine_busy`): its figure is shown, but it is ranked in no speed objective, and
neither its figure nor its wait goes into the floors the others are judged against.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from pipeline.core_wait import BUSY_WAIT, busy
from pipeline.reporting.row import Row
from pipeline.reporting.table import BASELINE

# the strategies that, on one device, run single's computation in one process: DataParallel
# calls the module itself when it has one device (torch's data_parallel.py), and
# balanced_dp's share for device 0 is then the whole batch
SAME_AS_SINGLE_ON_ONE_DEVICE = ("dp", "balanced_dp")
# the speed objectives the floor applies to, and each one's figure (a row key) and sense
FIGURES: dict[str, tuple[Literal["steady_samples_per_s", "time_to_target_s"], bool]] = {
    "throughput": ("steady_samples_per_s", False),  # (key, lower is better)
    "fastest_to_target": ("time_to_target_s", True),
}
# the load over the epochs each objective's figure is taken over (table.comparison_rows)
LOADS: dict[str, Literal["steady_core_wait", "core_wait"]] = {
    "throughput": "steady_core_wait",
    "fastest_to_target": "core_wait",
}
# each figure as the floor's reason line shows the A/A group's
SHOWN: dict[str, Callable[[float], str]] = {
    "throughput": lambda v: f"{v:.0f} samples/s",
    "fastest_to_target": lambda v: f"{v:.1f} s",
}


@dataclass(frozen=True)
class SpeedFloor:
    """The A/A group (single and the strategies that ran its computation at its cost here),
    each speed objective's floor (the group's largest relative difference widened by the
    load floor: `widened`, a fraction; None where neither was measured) and what it came
    from."""

    group: tuple[str, ...]
    floors: dict[str, Optional[float]]
    figures: dict[str, dict[str, float]]
    why_none: str = ""  # where there is no group: why, in words
    # each objective's A/A spread alone, its load floor (`load_floor`) and every strategy's
    # core-wait share it came from
    aa: dict[str, Optional[float]] = field(default_factory=dict)
    load: dict[str, Optional[float]] = field(default_factory=dict)
    waits: dict[str, dict[str, float]] = field(default_factory=dict)

    def floor(self, objective: str) -> Optional[float]:
        return self.floors.get(objective)

    def to_json(self) -> dict[str, Any]:
        return {
            "group": list(self.group),
            "floors": self.floors,
            "figures": self.figures,
            "why_none": self.why_none or None,
            "aa": self.aa,
            "load": self.load,
            "core_waits": self.waits,
        }


def null_group(rows: Sequence[Row]) -> tuple[tuple[str, ...], str]:
    """(the strategies that ran single's computation at single's cost here, single first,
    then as SAME_AS_SINGLE_ON_ONE_DEVICE lists them; why there are fewer than two, or "")."""
    base = next((r for r in rows if r["strategy"] == BASELINE), None)
    if base is None:
        # not run, or out of device memory (listed apart: did_not_fit.py)
        return (), f"{BASELINE}: no run compared, so no A/A pair to measure the noise with"

    def same_as_base(row: Row) -> bool:
        return (
            row["strategy"] in SAME_AS_SINGLE_ON_ONE_DEVICE
            and row["world_size"] == 1
            and len(row["devices"]) == 1
            and row["devices"] == base["devices"]
            and row["batch_split"] == base["batch_split"]
            and row.get("speed_features") == base.get("speed_features")
        )

    members = {r["strategy"] for r in rows if same_as_base(r)}
    # in one order whatever order the stages ran in: the same words for the same finding
    group = (BASELINE, *(n for n in SAME_AS_SINGLE_ON_ONE_DEVICE if n in members))
    if len(group) > 1:
        return group, ""
    partners = " or ".join(SAME_AS_SINGLE_ON_ONE_DEVICE)
    ran = [r for r in rows if r["strategy"] in SAME_AS_SINGLE_ON_ONE_DEVICE]
    if not ran:
        return group, f"neither {partners} ran beside {BASELINE}: no A/A pair"
    return group, (
        f"{partners} ran on other devices or settings than {BASELINE} (on several GPUs they "
        "split the batch): no strategy here repeats single's computation, so no A/A pair"
    )


def relative_spread(values: Sequence[float]) -> Optional[float]:
    """max / min - 1 of positive figures: how far apart the same computation's runs came
    out, as a fraction; None with fewer than two."""
    if len(values) < 2 or min(values) <= 0:
        return None
    return max(values) / min(values) - 1


def load_floor(waits: Sequence[float]) -> Optional[float]:
    """How far apart the machine's load alone set runs that waited `waits` (shares of their
    runnable time spent without a core): the largest ratio of the time they had a core, as
    a fraction; None with fewer than two."""
    return relative_spread([1 - w for w in waits])


def widened(aa: Optional[float], load: Optional[float]) -> Optional[float]:
    """The floor: the A/A ratio times the load's, less 1 (a difference the two together can
    make: the A/A group shares its load when it runs back to back, so its spread is the
    noise left at equal load); either alone where the other was not measured."""
    if aa is None or load is None:
        return aa if load is None else load
    return (1 + aa) * (1 + load) - 1


def machine_busy(row: Row, objective: str) -> Optional[float]:
    """The core-wait share over the epochs `objective`'s figure is taken over, where it is
    beyond core_wait.BUSY_WAIT (the machine too busy to time the run); None where it is not,
    or was not measured."""
    wait = row.get(LOADS[objective])
    return wait if busy(wait) else None


def busy_words(row: Row, objective: str) -> str:
    """Why a busy run is not ranked, in a few words."""
    wait = row.get(LOADS[objective]) or 0.0
    return (
        f"{row['strategy']} waited {wait:.0%} of its runnable time for a CPU core (beyond "
        f"{BUSY_WAIT:.0%}, its time is the machine's more than the strategy's)"
    )


def speed_floor(rows: Sequence[Row]) -> SpeedFloor:
    """Each speed objective's floor: the A/A group's spread widened by the load floor over
    every strategy with the figure, leaving out the runs the machine was too busy to time
    (`machine_busy`): they are ranked in nothing, so their noise sets no floor."""
    group, why = null_group(rows)
    by_name = {r["strategy"]: r for r in rows}
    floors, aa, load = {}, {}, {}
    figures: dict[str, dict[str, float]] = {}
    waits: dict[str, dict[str, float]] = {}
    for objective, (key, _) in FIGURES.items():
        measured = {
            n: value
            for n in group
            if (value := by_name[n].get(key)) is not None
            and machine_busy(by_name[n], objective) is None
        }
        figures[objective] = measured
        aa[objective] = relative_spread(list(measured.values()))
        timed = [r for r in rows if r.get(key) is not None and machine_busy(r, objective) is None]
        waits[objective] = {
            r["strategy"]: wait for r in timed if (wait := r.get(LOADS[objective])) is not None
        }
        load[objective] = load_floor(list(waits[objective].values()))
        floors[objective] = widened(aa[objective], load[objective])
    return SpeedFloor(group, floors, figures, why, aa, load, waits)


def within_floor(objective: str, best: float, value: float, floor: SpeedFloor) -> bool:
    """Whether `value` lies within the noise floor of `best` (the better figure): their
    ratio, better over worse, is no further from 1 than the A/A group's own."""
    bound = floor.floor(objective)
    if bound is None or best <= 0 or value <= 0:
        return False
    ratio = value / best if FIGURES[objective][1] else best / value
    return ratio - 1 <= bound


def speedup_within_noise(row: Row, base: Optional[Row], floor: SpeedFloor) -> Optional[bool]:
    """Whether `row`'s speedup over single (`base`) lies within the throughput floor: the
    table then says so beside it. None where there is no floor or no figure to judge."""
    if base is None or floor.floor("throughput") is None or row is base:
        return None
    if machine_busy(row, "throughput") is not None or machine_busy(base, "throughput") is not None:
        return None  # the table says the machine was busy instead
    mine, theirs = row.get("steady_samples_per_s"), base.get("steady_samples_per_s")
    if mine is None or theirs is None:
        return None
    return within_floor("throughput", max(mine, theirs), min(mine, theirs), floor)


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _cells(figures: dict[str, float], shown: Callable[[float], str]) -> str:
    return ", ".join(f"{name} {shown(v)}" for name, v in figures.items())


def _load_words(objective: str, floor: SpeedFloor) -> Optional[str]:
    """The load floor in words: how long the strategies waited for a core, how far apart
    that alone set them; None where it was not measured."""
    bound, waits = floor.load.get(objective), floor.waits.get(objective, {})
    if bound is None:
        return None
    low, high = min(waits.values()), max(waits.values())
    return (
        f"the machine's load: the strategies waited {low:.0%} to {high:.0%} of their runnable "
        f"time for a CPU core, {bound:.1%} apart by that alone"
    )


def floor_reason(objective: str, floor: SpeedFloor) -> Optional[str]:
    """The answer's line for an objective: the floor it was judged against, measured how."""
    bound = floor.floor(objective)
    if bound is None:
        return None
    parts = []
    if floor.aa.get(objective) is not None:
        figures = floor.figures[objective]
        parts.append(
            f"A/A: {_and(list(figures))}, the same computation here: "
            f"{_cells(figures, SHOWN[objective])}"
        )
    load = _load_words(objective, floor)
    if load is not None:
        parts.append(load)
    return f"noise floor {bound:.1%} ({'; '.join(parts)}): a difference within it is a tie"


def floor_text(floor: SpeedFloor) -> str:
    """How speed noise was measured, for the report's noise paragraph."""
    load = _load_words("throughput", floor)
    load_text = (
        f" Beside it, {load}, which widens the floor (each run counts it from inside, "
        "Linux's schedstat: a run that waited a share w of its time ran about 1 / (1 - w) "
        "times slower)."
        if load
        else ""
    )
    if len(floor.group) < 2:
        return (
            f"Speed noise: {floor.why_none}; speed differences are tested against the "
            "epoch-to-epoch spread alone, which does not see the noise between processes "
            "(20 to 30% on a busy machine). On one device or a CPU, run dp beside single for "
            f"an A/A floor.{load_text}"
        )
    parts = []
    for objective, label in (("throughput", "steady samples/s"), ("fastest_to_target", "time")):
        bound = floor.aa.get(objective)
        if bound is not None:
            parts.append(f"{bound:.1%} in {label}")
    measured = "; ".join(parts) if parts else "not measured (fewer than two have the figures)"
    return (
        f"Speed noise: {_and(list(floor.group))} run the same computation at the same cost "
        f"here (an A/A check), so their difference is the run-to-run noise floor: "
        f"{measured}.{load_text} A throughput or time-to-target difference is called real "
        "only beyond it, and beyond the larger epoch-to-epoch spread of samples/s of the two "
        "strategies; every strategy ran with the same seed, data order and initial weights. "
        "Each figure leaves out the warm-up epoch (its process's one-off start); time to "
        "target counts it."
    )
