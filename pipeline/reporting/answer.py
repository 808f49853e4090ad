"""The report's answer: which strategy to use on this hardware, one recommendation per
objective, each with its reasons in measured numbers. Pure functions over the rows the table
computes (table.comparison_rows): no files, no MLflow.

Objectives (a strategy missing the figure is left out of that objective and named):
  fastest_to_target  least wall time until test accuracy first reached report.target_accuracy
  throughput         most steady samples/s (a run without a steady figure is left out with
                     its reason; figures taken over warm-up epochs are named)
  peak_memory        lowest training peak on the strategy's busiest device
  memory_balance     lowest training memory imbalance (max/mean over devices), among the
                     strategies that spread over more than one device
Two strategies tie when their figures read the same at the precision the report shows them;
in the speed objectives when their ratio lies within the A/A noise floor (speed_noise.py: how
far apart single and the strategies that ran its very computation here came out; a run the
machine was too busy to time is shown, not ranked); in the memory objectives when they lie
within the memory floor (memory_noise.py: how far apart the same A/A group's peaks came out);
and, in the memory rankings and throughput, when they differ by no more than the larger of the
two strategies' epoch-to-epoch spreads of that figure (pipeline.memory.spreads: the noise of
one run's memory measurement; results.steady_spread: the max - min of samples/s over the
steady epochs); tied strategies are all recommended, the best exact figure first, and the one
whose model stands for them in MLflow is picked by a rule that reads no figure (`tie_pick`).
Without a spread (one epoch; one steady epoch for throughput) the answer says the difference
is untested. Where the speed objectives set runs against each other whose speed options differ
(precision, channels_last, compile, CUDA graphs: RunSummary.speed_features), a reason says so:
the difference is not the strategies' alone.

Accuracy differences against `single` are called real or within noise only with a measured
noise estimate: the spread (max - min) of final test accuracy across seeds of otherwise
identical runs (`seed_spread`); a difference is real when it exceeds the larger spread of the
two strategies compared (`accuracy_verdict`). Without seeds the answer says there is no
estimate, and how to get one.
"""

from __future__ import annotations

import html
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from pipeline.reporting.memory_noise import MemoryFloor, memory_floor
from pipeline.reporting.notes_accuracy import drop_explained
from pipeline.reporting.objectives import OBJECTIVES, Floors, Objective
from pipeline.reporting.objectives import and_names as _and
from pipeline.reporting.row import Row
from pipeline.reporting.speed_noise import (
    SpeedFloor,
    busy_words,
    floor_text,
    machine_busy,
    speed_floor,
    speedup_within_noise,
)
from pipeline.reporting.table import BASELINE, features_text
from pipeline.results import WARMUP_STANDS_IN, device_of
from pipeline.strategies import KNOWN
from pipeline.tracking.comparison_run import RECOMMENDED, Registration

# The source notes' measurement (DataParallel on 2 GPUs against 1 GPU): shown beside what was
# measured here for dp against single
NOTES_CLAIM = {
    "dp_devices": 2,
    "single_devices": 1,
    "single_epoch_s": 14.0,
    "dp_epoch_s": 9.3,
    "single_test_acc": 0.92,
}
SEED_SWEEP = (
    "`dvc exp run --queue -S seed=1,2,3`, then `dvc queue start`, then compare again "
    "(`dvc repro --force --single-item compare`)"
)
# the objective whose choice the compare stage registers in MLflow, if it has one
REGISTERED_OBJECTIVE = "throughput"
# the MLflow model alias of each objective's pick (models:/<name>@least-memory), beside
# comparison.RECOMMENDED, the registered choice's
OBJECTIVE_ALIASES = {o.key: o.alias for o in OBJECTIVES}


@dataclass(frozen=True)
class Recommendation:
    """One objective's answer: the strategies it recommends (several on a tie, none when no
    strategy qualifies), why, and how their accuracy compares with single's."""

    objective: str
    title: str
    strategies: tuple[str, ...]
    reasons: tuple[str, ...]
    accuracy: tuple[str, ...] = ()
    # the one of `strategies` whose model stands for the objective in MLflow (`tie_pick`);
    # None where it recommends none
    pick: Optional[str] = None
    # the report's one line for it, after its title: the pick, the figure that decides it,
    # and whether it is a tie or unranked and why, in a few words
    headline: str = ""
    alias: str = ""  # the MLflow model alias its pick goes under (Objective.alias)


@dataclass(frozen=True)
class Answer:
    hardware: str
    recommendations: tuple[Recommendation, ...]
    noise: str  # where the noise estimate comes from, or that there is none and how to get one
    notes_claim: str  # the source notes' dp claim beside what was measured here
    notes_measured: dict[str, Any] = field(default_factory=dict)
    floor: SpeedFloor = field(default_factory=lambda: SpeedFloor((), {}, {}))  # speed's A/A
    memory_floor: MemoryFloor = field(default_factory=lambda: MemoryFloor((), {}, None))
    # (strategy, its line) of each that ran out of device memory: ranked in nothing, said
    # beside the picks (pipeline/did_not_fit.py)
    unfit: tuple[tuple[str, str], ...] = ()

    @property
    def speed_noise(self) -> str:
        """How speed noise was measured: the A/A floor, or why there is none."""
        return floor_text(self.floor)

    def choice(self) -> Optional[tuple[str, str]]:
        """(objective, strategy) whose model the compare stage registers: the throughput
        pick, else the first objective that recommends one; None if none does."""
        ordered = sorted(self.recommendations, key=lambda r: r.objective != REGISTERED_OBJECTIVE)
        return next(((r.objective, r.pick) for r in ordered if r.pick is not None), None)


def tie_pick(tied: Sequence[Row]) -> str:
    """The one of tied strategies whose model an objective registers: the one on the fewest
    devices, then the first in the registry's order (single, dp, ... : the simplest first).
    A difference within the noise is no reason to take more devices or a wrapper, and a rule
    that reads no figure picks the same strategy whichever of them the noise put ahead."""
    first = min(tied, key=lambda r: (r["n_devices"], KNOWN.index(r["strategy"])))
    return str(first["strategy"])


# --- the noise rule -----------------------------------------------------------------------


def seed_spread(acc_by_seed: Optional[Mapping[str, float]]) -> Optional[float]:
    """Max - min of final test accuracy across seeds; None with fewer than two seeds."""
    if not acc_by_seed or len(acc_by_seed) < 2:
        return None
    return max(acc_by_seed.values()) - min(acc_by_seed.values())


def pair_noise(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """The noise of a difference between two strategies: the larger of their seed spreads
    that were measured; None if neither was."""
    known = [s for s in (a, b) if s is not None]
    return max(known) if known else None


def accuracy_verdict(delta: Optional[float], noise: Optional[float]) -> str:
    """'real', 'within noise', or why neither can be said."""
    if delta is None:
        return f"no {BASELINE} run to compare with"
    if noise is None:
        return "no noise estimate"
    return "real" if abs(delta) > noise else "within noise"


# --- the objectives (objectives.py: one record each) ----------------------------------------


def _ties(
    objective: Objective, best_row: Row, best: float, row: Row, value: float, floors: Floors
) -> bool:
    """Reads the same as the best, or lies within the objective's A/A noise floor (speed's or
    memory's), or within the larger measured spread."""
    if objective.shown(value) == objective.shown(best):
        return True
    if _within_floor(objective, floors, best, value):
        return True
    if objective.spread is None:
        return False
    known = [s for s in (objective.spread(best_row), objective.spread(row)) if s is not None]
    return bool(known) and abs(value - best) <= max(known)


def _within_floor(objective: Objective, floors: Floors, best: float, value: float) -> bool:
    return objective.noise is not None and objective.noise.within(floors, best, value)


def _floor_of(objective: Objective, floors: Floors) -> Optional[float]:
    return None if objective.noise is None else objective.noise.bound(floors)


def _spread_reason(objective: Objective, ranked: list[Row]) -> str:
    spread = objective.spread or (lambda r: None)
    known = [(r["strategy"], s) for r in ranked if (s := spread(r)) is not None]
    if not known:
        return (
            f"no epoch-to-epoch spread measured (it takes {objective.spread_needs}): the "
            "differences are not tested against noise"
        )
    spec, _, unit = objective.spread_shown.partition(" ")
    cells = ", ".join(f"{name} {s:{spec}}{' ' + unit if unit else ''}" for name, s in known)
    return f"epoch-to-epoch spread (a difference within it is a tie): {cells}"


def _recommend(
    objective: Objective,
    rows: list[Row],
    target: Optional[float],
    device: str,
    verdicts: Mapping[str, str],
    floors: Floors,
) -> Recommendation:
    turns = []  # ranks that took turns on one GPU: their time is no speed (recorder.shared_note)
    busy: list[tuple[Row, float]] = []  # timed on a machine too busy to time them: shown only
    if objective.timed is not None:
        turns = [r["strategy"] for r in rows if r.get("shared_devices")]
        rows = [r for r in rows if not r.get("shared_devices")]
        busy = [
            (r, v)
            for r in rows
            if (v := objective.value(r)) is not None and machine_busy(r, objective.key) is not None
        ]
        rows = [r for r in rows if all(r is not b for b, _ in busy)]
    measured = [(r, v) for r in rows if (v := objective.value(r)) is not None]
    missing = [r for r in rows if objective.value(r) is None]
    left_out = [
        *(
            [f"not ranked, its ranks shared a GPU (shared-device): {', '.join(turns)}"]
            * bool(turns)
        ),
        *(
            f"machine busy: not ranked: {objective.describe(r, v, device)} "
            f"({busy_words(r, objective.key)})"
            for r, v in busy
        ),
    ]

    unranked = [
        *([f"not ranked, shared a GPU: {_and(turns)}"] if turns else []),
        *([f"not ranked, machine busy: {_and([r['strategy'] for r, _ in busy])}"] if busy else []),
    ]
    waits = [machine_busy(r, objective.key) or 0.0 for r, _ in busy]
    all_busy = (
        f"every strategy {objective.timed} ran on a busy machine (waited "
        f"{min(waits, default=0):.0%} to {max(waits, default=0):.0%} of its runnable time for "
        "a core)"
    )

    def none(*reasons: str) -> Recommendation:
        why = reasons[0].removesuffix("; none recommended for it")
        # where every strategy was busy, the reason names them all
        line = "; ".join(["none", why, *(unranked if why != all_busy else unranked[:-1])])
        return Recommendation(
            objective.key,
            objective.title(target),
            (),
            (*reasons, *left_out),
            headline=line,
            alias=objective.alias,
        )

    if not measured and busy:
        return none(all_busy)
    if not measured:
        return none(*objective.nothing(rows, target))

    sign = 1 if objective.lower_is_better else -1
    ranked = sorted(measured, key=lambda rv: sign * rv[1])  # stable: report order on ties
    best_row, best = ranked[0]
    winners = [(r, v) for r, v in ranked if _ties(objective, best_row, best, r, v, floors)]
    tied = {id(r) for r, _ in winners}  # not always the first ones: each has its own spread
    rest = [(r, v) for r, v in ranked if id(r) not in tied]
    names = tuple(r["strategy"] for r, _ in winners)
    pick = tie_pick([r for r, _ in winners])
    reasons = []
    if len(winners) > 1:
        cells = "; ".join(objective.describe(r, v, device) for r, v in winners)
        reasons.append(f"{_and(names)} tie{_tie_kind(objective, winners, best, floors)} ({cells})")
    if pick != names[0]:
        alike = len({r["n_devices"] for r, _ in winners}) == 1
        why = "the simplest of them" if alike else "the simplest on the fewest devices"
        reasons.append(f"{pick}'s model stands for them in MLflow: {why}")
    base = next((v for r, v in measured if r["strategy"] == BASELINE), None)
    compared: list[str] = list(names[1:])  # what the reasons set the winner against
    if objective.ratio is None:  # its own figure says it: the next best beside it
        primary = objective.winner(best_row, best, device)
        if rest:
            primary += f"; the next best: {objective.describe(*rest[0], device)}"
        reasons.append(primary)
    elif base is not None and BASELINE not in names:
        reasons.append(objective.ratio(names[0], best, BASELINE, base, device))
        compared.append(BASELINE)
    elif rest:
        runner, theirs = rest[0]
        reasons.append(
            objective.ratio(names[0], best, runner["strategy"], theirs, device) + " (the next best)"
        )
        compared.append(runner["strategy"])
    elif len(winners) == 1:
        only = "the only strategy compared" if len(rows) == 1 else "the only one measured"
        reasons.append(f"{objective.winner(best_row, best, device)}; {only}")
    if len(measured) > 2 and rest:  # beyond what the lines above name
        reasons.append("ranking: " + "; ".join(objective.describe(r, v, device) for r, v in ranked))
    warm = [r["strategy"] for r, _ in measured if r.get("steady_basis") == WARMUP_STANDS_IN]
    if objective.steady and warm:
        reasons.append(f"including warm-up (no epoch free of it): {', '.join(warm)}")
    if objective.timed is not None:
        differ = _features_differ(best_row, [r for r in rows if r["strategy"] in compared])
        if differ:
            reasons.append(differ)
    if objective.noise is not None and len(measured) > 1:
        reasons += filter(None, [objective.noise.reason(floors)])
    if objective.spread is not None and len(measured) > 1:
        reasons.append(_spread_reason(objective, [r for r, _ in ranked]))
    if missing:
        reasons.append(objective.missing(missing))
    reasons += left_out
    accuracy = tuple(verdicts[n] for n in names if n in verdicts)
    pick_row, pick_value = next((r, v) for r, v in winners if r["strategy"] == pick)
    described = objective.describe(pick_row, pick_value, device).removeprefix(pick + " ")
    status = [f"{pick} {described}"]
    if len(winners) > 1:
        kind = _tie_kind(objective, winners, best, floors)
        bound = _floor_of(objective, floors) if kind == " within the noise floor" else None
        status.append(
            f"a tie{kind}{f' {bound:.1%}' if bound is not None else ''} with "
            f"{_and([n for n in names if n != pick])}"
        )
    elif rest:
        runner = rest[0][0]
        spreads = [objective.spread(r) for r in (best_row, runner)] if objective.spread else []
        tested = _floor_of(objective, floors) is not None or any(x is not None for x in spreads)
        status.append(
            f"ahead of {runner['strategy']} "
            + ("beyond the noise" if tested else "(not tested against noise)")
        )
    line = "; ".join([*status, *unranked])
    return Recommendation(
        objective.key,
        objective.title(target),
        names,
        tuple(reasons),
        accuracy,
        pick,
        line,
        objective.alias,
    )


def _tie_kind(
    objective: Objective, winners: list[tuple[Row, float]], best: float, floors: Floors
) -> str:
    """How tied strategies tie: "" (their figures read the same), " within the noise floor"
    (the A/A group's), or " within the spread" (the epoch-to-epoch one)."""
    inexact = [v for _, v in winners if objective.shown(v) != objective.shown(best)]
    if not inexact:
        return ""
    floored = all(_within_floor(objective, floors, best, v) for v in inexact)
    return " within the noise floor" if floored else " within the spread"


def _features_differ(best: Row, others: list[Row]) -> Optional[str]:
    """A reason where the winner ran with other speed options than a strategy it is set
    against (a graphed or compiled run against an eager one, bf16 against fp32); None where
    they match, or where a run's options were not recorded."""
    mine = best.get("speed_features") or {}
    unlike = [r for r in others if r.get("speed_features") and mine and r["speed_features"] != mine]
    if not unlike:
        return None
    cells = "; ".join(f"{r['strategy']}: {features_text(r['speed_features'])}" for r in unlike)
    return (
        f"not like for like: {best['strategy']} ran {features_text(mine)}; {cells} (part of "
        "the difference is the speed options', not the strategies')"
    )


# --- the answer ------------------------------------------------------------------------------


def hardware(rows: list[Row]) -> str:
    """What the strategies ran on, in words: the GPUs (physical ids) they used, or the CPU."""
    if rows[0].get("memory_kind") == "gpu":
        gpus = sorted({device_of(d) for r in rows for d in (r.get("peak_memory_mib") or {})})
        gpus = gpus or sorted({d for r in rows for d in r["devices"]})
        return f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} ({', '.join(gpus)})"
    most = max(r["world_size"] for r in rows)
    return f"the CPU (up to {most} process{'es' if most != 1 else ''})"


def _accuracy_line(row: Row, base: Optional[Row], noise: Optional[float]) -> str:
    name = row["strategy"]
    if base is None:
        return f"{name} {row['test_acc']:.4f} ({accuracy_verdict(None, noise)})"
    delta = row["test_acc"] - base["test_acc"]
    verdict = accuracy_verdict(delta, noise)
    if noise is not None:
        verdict += f" (seed spread {noise:.4f})"
    return (
        f"{name} {row['test_acc']:.4f} vs {BASELINE} {base['test_acc']:.4f} "
        f"({delta:+.4f}): {verdict}"
    )


def _noise_text(spreads: Mapping[str, Optional[float]], seeds: Mapping[str, int]) -> str:
    known = {n: s for n, s in spreads.items() if s is not None}
    if not known:
        return (
            "No noise estimate: each strategy ran with one seed here, so no accuracy "
            "difference is called real or within noise. To get one: " + SEED_SWEEP + "."
        )
    cells = ", ".join(f"{n} {s:.4f} ({seeds.get(n, 0)} seeds)" for n, s in known.items())
    unknown = [n for n in spreads if n not in known]
    return (
        "Noise: the spread (max - min) of final test accuracy across seeds of otherwise "
        f"identical runs: {cells}. A difference is called real when it exceeds the larger "
        "spread of the two strategies compared."
        + (f" No seeds yet for {', '.join(unknown)}: " + SEED_SWEEP + "." if unknown else "")
    )


def _notes_claim(
    rows: list[Row], noise: Mapping[str, Optional[float]], floor: SpeedFloor
) -> tuple[str, dict[str, Any]]:
    c = NOTES_CLAIM
    claim = (
        f"The source notes: dp on {c['dp_devices']} GPUs vs single on "
        f"{c['single_devices']} GPU: {c['single_epoch_s'] / c['dp_epoch_s']:.2f}x faster per "
        f"epoch ({c['single_epoch_s']:g} s -> {c['dp_epoch_s']:g} s), with lower accuracy "
        f"(single: {c['single_test_acc']:g} test accuracy)."
    )
    by = {r["strategy"]: r for r in rows}
    single, dp = by.get(BASELINE), by.get("dp")
    if single is None or dp is None:
        missing = " and ".join(n for n, r in ((BASELINE, single), ("dp", dp)) if r is None)
        # not run, or out of device memory (listed apart: did_not_fit.py)
        return f"{claim} Here: not measured ({missing}: no run compared).", {}
    single_s, dp_s = single["steady_epoch_s"], dp["steady_epoch_s"]
    if single_s is None or dp_s is None:  # their notes say why
        unsteady = [n for n, s in ((BASELINE, single_s), ("dp", dp_s)) if s is None]
        return f"{claim} Here: not measured (no steady figure: {' and '.join(unsteady)}).", {}
    up = single_s / dp_s
    delta = dp["test_acc"] - single["test_acc"]
    kind = "GPU" if single.get("memory_kind") == "gpu" else "CPU device"

    def count(row: Row) -> str:
        n = row["n_devices"]
        return f"{n} {kind}{'s' if n != 1 else ''} ({', '.join(row['devices'])})"

    verdict = accuracy_verdict(delta, pair_noise(noise.get("dp"), noise.get(BASELINE)))
    measured: dict[str, object] = {
        "dp_devices": dp["n_devices"],
        "single_devices": single["n_devices"],
        "single_epoch_s": single["steady_epoch_s"],
        "dp_epoch_s": dp["steady_epoch_s"],
        "speedup": up,
        "single_test_acc": single["test_acc"],
        "dp_test_acc": dp["test_acc"],
        "acc_delta": delta,
        "acc_verdict": verdict,
        "same_computation": "dp" in floor.group,
    }
    # within the floor the table judges its speedup by, the claim line says so too: a tie
    within = speedup_within_noise(dp, single, floor)
    busy = [n for n, r in ((BASELINE, single), ("dp", dp)) if machine_busy(r, "throughput")]
    measured["speedup_within_noise"] = bool(within)
    measured["machine_busy"] = busy
    # on one device dp is single's computation: its speedup is the A/A pair's noise
    aa = " (the same computation here: an A/A pair, so noise)" if "dp" in floor.group else ""
    if within:
        aa += f", within noise (the noise floor {floor.floor('throughput'):.1%}: a tie)"
    if busy:
        aa += f", machine busy: not ranked ({' and '.join(busy)})"
    return (
        f"{claim} Here: dp on {count(dp)} vs single on {count(single)}: {up:.2f}x per "
        f"steady epoch{aa} ({single['steady_epoch_s']:.2f} s -> {dp['steady_epoch_s']:.2f} s); "
        f"test accuracy {single['test_acc']:.4f} -> {dp['test_acc']:.4f} ({delta:+.4f}: "
        f"{verdict}).",
        measured,
    )


def recommend(
    rows: list[Row],
    target: Optional[float],
    seeds: Optional[Mapping[str, Optional[Mapping[str, float]]]] = None,
    objectives: Sequence[Objective] = OBJECTIVES,
) -> Answer:
    """The answer for these rows (table.comparison_rows, in report order): one recommendation
    per objective, in their order. `seeds`: per strategy, the final test accuracy of each
    seed of otherwise identical runs (None or missing: no noise estimate for it)."""
    if not rows:
        raise ValueError("no strategies to recommend from")
    seeds = seeds or {}
    spreads = {r["strategy"]: seed_spread(seeds.get(r["strategy"])) for r in rows}
    base = next((r for r in rows if r["strategy"] == BASELINE), None)
    verdicts = {
        r["strategy"]: _accuracy_line(
            r, base, pair_noise(spreads[r["strategy"]], spreads.get(BASELINE))
        )
        for r in rows
        if r["strategy"] != BASELINE
    }
    device = "GPU" if rows[0].get("memory_kind") == "gpu" else "process"
    floor = speed_floor(rows)
    floors = Floors(floor, memory_floor(rows))
    recommendations = tuple(
        _recommend(objective, rows, target, device, verdicts, floors) for objective in objectives
    )
    claim, measured = _notes_claim(rows, spreads, floor)
    claim = f"{claim} {drop_explained(rows)[0]}"  # what explains the notes' lower accuracy
    counts = {n: len(seeds.get(n) or {}) for n in spreads}
    noise = _noise_text(spreads, counts)
    return Answer(hardware(rows), recommendations, noise, claim, measured, floor, floors.memory)


# --- rendering -------------------------------------------------------------------------------


def _model_line(registered: Optional[Registration]) -> Optional[str]:
    if registered is None:
        return None
    if registered.version is None:
        return f"MLflow model: not registered ({registered.why_not})"
    line = (
        f"MLflow model: {registered.strategy}'s ({registered.objective}) registered as "
        f"{registered.name} version {registered.version} (run {registered.run_id}); load it "
        f'with `mlflow.pytorch.load_model("{registered.uri}")`'
    )
    others = {a: vs for a, vs in registered.aliases.items() if a != RECOMMENDED}
    if others:  # each objective's pick, which may be another strategy's version
        line += ". Per objective: " + ", ".join(
            f"`@{alias}` {strategy}'s (version {version})"
            for alias, (version, strategy) in others.items()
        )
    return line


@dataclass(frozen=True)
class _Entry:
    """One entry of the answer as every format shows it: an objective's recommendation, or a
    strategy that did not fit."""

    title: str
    names: tuple[str, ...]  # whom it names: the recommended strategies, or the one that did not fit
    picked: bool  # the names are picks (highlighted as such), not left out
    headline: str  # its one line under the answer's heading
    details: tuple[str, ...]  # what folds beneath: its reasons, then the accuracy line
    recommendation: Optional[Recommendation] = None  # an objective's: its fields for JSON


@dataclass(frozen=True)
class _Walk:
    """The answer walked once, in the order every format shows it."""

    hardware: str
    entries: tuple[_Entry, ...]
    paragraphs: tuple[tuple[str, str], ...]  # (kind, text): the noise, the claim, the model


def _walk(answer: Answer, registered: Optional[Registration]) -> _Walk:
    entries = [
        _Entry(
            r.title,
            r.strategies,
            r.pick is not None,
            r.headline,
            (*r.reasons, *([f"final test accuracy: {'; '.join(r.accuracy)}"] * bool(r.accuracy))),
            r,
        )
        for r in answer.recommendations
    ]
    entries += [_Entry("Did not fit", (name,), False, name, (line,)) for name, line in answer.unfit]
    model = _model_line(registered)
    paragraphs = [
        ("noise", answer.speed_noise),
        ("noise", answer.noise),
        ("claim", answer.notes_claim),
        *([("model", model)] if model is not None else []),
    ]
    return _Walk(answer.hardware, tuple(entries), tuple(paragraphs))


def _names(entry: _Entry) -> str:
    return _and(entry.names) if entry.names else "none"


def headlines(answer: Answer) -> list[tuple[str, str]]:
    """The answer on one screen: (title, line) per objective (its headline), and one per
    strategy that did not fit."""
    return [(e.title, e.headline) for e in _walk(answer, None).entries]


# what folds beneath the headline lines
DETAILS = "Why: the rankings, noise floors and spreads of each objective"
HEADING = "Which strategy on this hardware"


def markdown(answer: Answer, registered: Optional[Registration] = None) -> str:
    walk = _walk(answer, registered)
    lines = [f"## {HEADING}: {walk.hardware}", ""]
    lines += [f"- **{e.title}**: {e.headline}" for e in walk.entries]
    lines += ["", f"### {DETAILS}", ""]
    for e in walk.entries:
        lines.append(f"- **{e.title}: {_names(e)}**")
        lines += [f"  - {line}" for line in e.details]
    for _, paragraph in walk.paragraphs:
        lines += ["", paragraph]
    return "\n".join(lines) + "\n"


def text(answer: Answer, registered: Optional[Registration] = None, width: int = 120) -> str:
    """`markdown` as the compare stage prints it: every line wrapped to `width`, a list item's
    continuation lines indented under its text."""
    out = []
    for line in markdown(answer, registered).splitlines():
        item = re.match(r"^(\s*- )", line)
        hang = " " * len(item.group(1)) if item else ""
        out += textwrap.wrap(
            line, width, subsequent_indent=hang, break_long_words=False, break_on_hyphens=False
        ) or [""]
    return "\n".join(out) + "\n"


def _esc(text: str) -> str:  # `code` as <code>
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _spans(entry: _Entry) -> str:
    """Its names highlighted: as picks, or as left out; "none" where it names none."""
    if not entry.names:
        return "<span class=none>none</span>"
    css = "pick" if entry.picked else "none"
    return _and([f"<span class={css}>{_esc(name)}</span>" for name in entry.names])


def _head_pick(entry: _Entry) -> str:
    """A headline's pick highlighted: the text up to its first "; " (the pick and its figure),
    then the rest (a tie, the unranked)."""
    first, sep, rest = entry.headline.partition("; ")
    name, _, figure = first.partition(" ")
    css = "pick" if entry.picked else "none"
    figure = f" {_esc(figure)}" if figure else ""
    return f"<span class={css}>{_esc(name)}</span>{figure}{_esc(sep + rest)}"


def html_section(answer: Answer, registered: Optional[Registration] = None) -> str:
    walk = _walk(answer, registered)
    heads = "".join(f"<li><b>{_esc(e.title)}</b>: {_head_pick(e)}</li>" for e in walk.entries)
    items = "".join(
        f"<li><b>{_esc(e.title)}:</b> {_spans(e)}<ul>"
        + "".join(f"<li>{_esc(line)}</li>" for line in e.details)
        + "</ul></li>"
        for e in walk.entries
    )
    paragraphs = "".join(f'<p class="{kind}">{_esc(p)}</p>\n' for kind, p in walk.paragraphs)
    return (
        '<section class="answer">\n'
        f"<h2>{HEADING}: {_esc(walk.hardware)}</h2>\n"
        f'<ul class="headlines">{heads}</ul>\n'
        f"<details><summary>{_esc(DETAILS)}</summary>\n"
        f"<ul>{items}</ul>\n"
        f"{paragraphs}"
        "</details>\n</section>"
    )


def to_json(answer: Answer, registered: Optional[Registration] = None) -> dict[str, Any]:
    """reports/recommendation.json."""
    walk = _walk(answer, registered)
    return {
        "hardware": walk.hardware,
        "objectives": {
            r.objective: {
                "title": r.title,
                "strategies": list(r.strategies),
                "pick": r.pick,  # the one whose model is the objective's MLflow alias
                "reasons": list(r.reasons),
                "accuracy": list(r.accuracy),
            }
            for r in (e.recommendation for e in walk.entries)
            if r is not None
        },
        "noise": answer.noise,
        "speed_noise": {"text": answer.speed_noise, **answer.floor.to_json()},
        "memory_noise": answer.memory_floor.to_json(),
        "notes_claim": {
            "text": answer.notes_claim,
            "notes": dict(NOTES_CLAIM),
            "measured": answer.notes_measured,
        },
        "registered_model": None if registered is None else registered.to_json(),
    }
