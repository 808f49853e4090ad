"""What a train stage leaves behind, and the compare stage and `publish` read.

results/<strategy>/ (DVC outputs):
    model.pt      final weights: the plain model's state_dict, whatever the strategy
    metrics.json  the few numbers a person compares (`headline`): an MLflow artifact and
                  the final/ metrics of the run's model (the DVC metrics are the compare
                  stage's reports/summary.json, keyed by strategy)
    summary.json  `RunSummary`: every final figure, per device and per phase, the notes and the
                  run's identity; what reporting and MLflow read (`read_summary`)
    history.csv   one `EpochRow` per epoch (DVC plots)
    config.yaml   the resolved configuration the run used
checkpoints/<strategy>/ (the run's state; checkpoints/checkpoint.py):
    latest.json   the commit record of the last checkpoint, with the epochs so far
    run.json      the MLflow run: its store, id, params, tags and status (tracking/)

The per-epoch row and the run's summary are typed here, once: training fills them, the
checkpoint record and MLflow carry them, reporting reads them back.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, TypedDict

import yaml

from pipeline.errors import UserError, first_line
from pipeline.files import atomic_write

RESULTS = Path("results")
CHECKPOINTS = Path("checkpoints")
RUN_RECORD, CHECKPOINT_RECORD = "run.json", "latest.json"
MODEL, METRICS, HISTORY, CONFIG = "model.pt", "metrics.json", "history.csv", "config.yaml"
SUMMARY = "summary.json"
# summary.json's outcome of a run that ran out of device memory (pipeline/did_not_fit.py)
DID_NOT_FIT = "did_not_fit"
# what each strategy's MLflow run gets as files; model.pt also goes in as the MLflow model
# "model" (tracking/mlflow_run.py `log_final_model`)
ARTIFACTS = (METRICS, SUMMARY, HISTORY, CONFIG, MODEL)
# a CPU run's eval_peak_memory_mib in metrics.json, and what the report shows for it: its
# process's RSS during evaluation still holds training's heap (pipeline/memory.py)
NOT_SEPARABLE = "not separable on CPU"


@dataclass(frozen=True)
class EpochRow:
    """One epoch of one run: its training and test figures, time, and per-device memory."""

    epoch: int  # 1-based
    train_loss: float
    train_acc: float
    test_loss: float
    test_acc: float
    # training only, device synchronised: every step of the epoch, those an earlier process
    # ran before a SIGTERM included (its checkpoint carries their seconds); after a kill,
    # the steps redone count once, the killed attempt's time not at all
    epoch_seconds: float
    samples_per_s: float  # the samples of those steps / epoch_seconds
    # training seconds since the run began, across its processes: a resume goes on from the
    # seconds its checkpoint recorded (a SIGTERM's: up to the stop); a process's start-up and
    # the time between a stop and the resume are not counted, nor, after a kill, the time
    # since the last checkpoint
    wall_seconds: float
    ended_at: float = 0.0  # Unix time the epoch ended: its metrics' timestamp in MLflow
    # The first epoch its process ran, started fresh or resumed (possibly mid-epoch): it paid
    # the one-off work of a process start (allocator growth, cuDNN autotuning, NCCL set-up,
    # torch.compile), so steady figures leave it out (`is_warmup`). history.csv and MLflow
    # carry it as 0/1.
    warmup: bool = False
    # The step a process resumed this epoch at; 0: one process ran it from its first step.
    # An epoch resumed mid-way ran in more than one process, each paying a start's one-off
    # work: it is never a steady epoch, nor stands in for one (`is_split`).
    resumed_at_step: int = 0
    # The share of its training steps' runnable time the run's busiest rank spent waiting for
    # a CPU core (pipeline/core_wait.py): the machine's load during the epoch, which the
    # report's speed noise floor allows for. None where the kernel does not count it
    # (history.csv: an empty cell).
    core_wait: Optional[float] = None
    # pipeline.memory.epoch_metrics: "memory/gpu_3_peak_allocated_mib" (training steps),
    # "memory/gpu_3_eval_peak_allocated_mib" (evaluation; `device_metric`), "mem_imbalance", ...
    memory: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """What MLflow logs for this epoch (at step = epoch)."""
        values = {name: getattr(self, name) for name in METRIC_COLUMNS}
        return {**{k: float(v) for k, v in values.items() if v is not None}, **self.memory}

    def to_record(self) -> dict[str, Any]:
        """The flat mapping a checkpoint record keeps."""
        return {**{name: getattr(self, name) for name in HISTORY_COLUMNS}, **self.memory}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> EpochRow:
        known = {name: record[name] for name in HISTORY_COLUMNS if name in record}
        if "warmup" in known:  # history.csv holds 0/1, read back as a number
            known["warmup"] = bool(known["warmup"])
        if "resumed_at_step" in known:  # likewise a number from history.csv
            known["resumed_at_step"] = int(known["resumed_at_step"])
        memory = {k: v for k, v in record.items() if k not in HISTORY_COLUMNS}
        return cls(**known, memory=memory)


HISTORY_COLUMNS = tuple(f.name for f in dataclasses.fields(EpochRow) if f.name != "memory")
METRIC_COLUMNS = tuple(c for c in HISTORY_COLUMNS if c not in ("epoch", "ended_at"))
OPTIONAL_COLUMNS = ("core_wait",)  # None where not measured: an empty history.csv cell


class SpeedFeatures(TypedDict, total=False):
    """The speed options as they applied to a run, after every fallback
    (numerics/build.py `speed_features`); {} in results written before they were recorded."""

    precision: str  # the one that ran (train.precision after its fallback): fp32, bf16, ...
    channels_last: bool
    compile: str  # its mode, or "off"
    # "none", "compile": compile's per forward and backward, "step": the whole step
    cuda_graphs: Literal["none", "compile", "step"]


@dataclass
class RunSummary:
    """results/<strategy>/summary.json: the run's final figures."""

    strategy: str
    world_size: int
    devices: list[str]
    batch_split: list[int]
    epochs: int
    test_acc: float
    best_test_acc: float
    test_loss: float
    train_loss: float
    epoch_seconds: float
    samples_per_s: float
    total_seconds: float
    # the speed figures (`speed_figures`); None where the run has no honest one, `speed_note`
    # then says why
    warmup_epoch_seconds: Optional[float]
    steady_epoch_seconds: Optional[float]
    steady_samples_per_s: Optional[float]
    # what the steady figures are taken over (`steady_basis`): STEADY, WARMUP_STANDS_IN or
    # NO_STEADY
    steady_basis: str = "steady"
    # why a speed figure is empty or includes warm-up, in words; None: neither
    speed_note: Optional[str] = None
    # the speed options as they applied, after every fallback (`SpeedFeatures`)
    speed_features: SpeedFeatures = field(default_factory=lambda: SpeedFeatures())
    # pipeline.memory.run_summary: memory_kind, peak_memory_mib, peak_reserved_mib,
    # mem_imbalance and device 0's share ("gpu0_share" or "cpu0_share") of the training
    # steps; the same of evaluation prefixed "eval_" (eval_peak_memory_mib, ...)
    memory: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # physical GPU id -> the ranks (or DataParallel replicas) that shared it (devices: "0,0");
    # {} where each had a device of its own. Such a run's time is no speed (recorder.shared_note)
    shared_devices: dict[str, int] = field(default_factory=dict)
    # The run's identity (pipeline/checkpoints/identity.py). Its MLflow run is found through it:
    # checkpoints/<strategy>/run.json maps it to the store and run id that hold it now, and
    # the run carries it as the tag `parallel_lab_fingerprint`.
    fingerprint: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        """Every field (summary.json without one is an older parallel-lab's: read_summary)."""
        last = ("memory", "notes", "fingerprint")
        out = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in last
        }
        return {**out, **self.memory, "notes": self.notes, "fingerprint": self.fingerprint}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSummary:
        names = {f.name for f in dataclasses.fields(cls)} - {"memory"}
        return cls(
            **{k: v for k, v in data.items() if k in names},
            memory={k: v for k, v in data.items() if k not in names},
        )


# what every summary.json this code writes holds (`RunSummary.to_json`)
SUMMARY_KEYS = frozenset(f.name for f in dataclasses.fields(RunSummary)) - {"memory"}


def device_metric(label: str, phase: str, what: str) -> str:
    """One device's peak as EpochRow.memory (and MLflow) names it: label "gpu_3", phase "" (the
    training steps) or "eval_", what "allocated", "reserved" or "rss" (a CPU process) ->
    "memory/gpu_3_eval_peak_allocated_mib", in the style of MLflow's own system metrics
    ("system/gpu_3_memory_usage_megabytes")."""
    return f"memory/{label}_{phase}peak_{what}_mib"


def device_of(label: str) -> str:
    """The device of a peak's label: "gpu_0_rank1" (a rank of several sharing GPU 0:
    memory.rank_label) -> "gpu_0"; any other label is its device's already."""
    return re.sub(r"_rank\d+$", "", label)


_PEAK = r"(?P<phase>eval_)?peak_(?P<what>allocated|reserved|rss)_mib$"
_DEVICE_METRIC = re.compile(r"^memory/(?P<label>(node\d+_)?(gpu|cpu)_.+?)_" + _PEAK)


def parse_device_metric(key: str) -> Optional[tuple[str, str, str]]:
    """`device_metric`'s (label, phase, what), or None for any other key."""
    m = _DEVICE_METRIC.match(key)
    if m:
        return m["label"], m["phase"] or "", m["what"]
    return None


def is_warmup(row: EpochRow) -> bool:
    """An epoch that paid a process start's one-off work: marked so by its process, or epoch 1
    (always a fresh start's first; also in histories recorded before the mark existed)."""
    return row.warmup or row.epoch == 1


def is_split(row: EpochRow) -> bool:
    """An epoch resumed mid-way: its steps ran in more than one process."""
    return row.resumed_at_step > 0


# what a run's steady figures are taken over (RunSummary.steady_basis)
STEADY = "steady"  # the epochs free of warm-up
WARMUP_STANDS_IN = "warm-up"  # none is: the whole warm-up epochs stand in
NO_STEADY = "none"  # not even a whole epoch: no steady figures


def steady_rows(history: list[EpochRow]) -> list[EpochRow]:
    """The epochs steady figures are taken over: every one not a warm-up. When all of them
    are (a 1-epoch run, or every epoch in a process of its own) the whole ones stand in: each
    a real epoch, a start's one-off work included (`speed_note` says so). An epoch resumed
    mid-way never does: its time spans several starts, and its figures would be neither a
    steady epoch's nor a warm-up's. None may be left: the run then has no steady figures."""
    return [r for r in history if not is_warmup(r)] or [r for r in history if not is_split(r)]


def steady_basis(history: list[EpochRow]) -> str:
    if any(not is_warmup(r) for r in history):
        return STEADY
    return WARMUP_STANDS_IN if steady_rows(history) else NO_STEADY


def warmup_seconds(history: list[EpochRow]) -> Optional[float]:
    """Epoch 1's seconds, the fresh start's warm-up: reported apart; None when epoch 1 was
    resumed mid-way (its time then spans more than one start). (A resumed epoch is a warm-up
    too, left out of the steady figures, but not shown apart.)"""
    return None if is_split(history[0]) else history[0].epoch_seconds


def steady_seconds(history: list[EpochRow]) -> Optional[float]:
    """Median seconds of the steady epochs (`steady_rows`); None without any."""
    rows = steady_rows(history)
    return statistics.median(r.epoch_seconds for r in rows) if rows else None


def steady_samples_per_s(history: list[EpochRow]) -> Optional[float]:
    """The steady epochs' median samples over their median seconds (`steady_seconds`), so
    throughput and speedup tell the same story (every steady epoch is a whole one, so its
    samples are an epoch's: samples_per_s x epoch_seconds); None without any."""
    rows = steady_rows(history)
    if not rows:
        return None
    samples = statistics.median(r.samples_per_s * r.epoch_seconds for r in rows)
    return samples / statistics.median(r.epoch_seconds for r in rows)


def steady_spread(history: list[EpochRow]) -> Optional[float]:
    """The epoch-to-epoch spread (max - min) of samples/s over the epochs the steady figure
    is taken over (`steady_rows`): how far apart two runs' throughput can be by chance alone.
    None with fewer than two such epochs."""
    rows = steady_rows(history)
    if len(rows) < 2:
        return None
    return max(r.samples_per_s for r in rows) - min(r.samples_per_s for r in rows)


def core_wait(rows: list[EpochRow]) -> Optional[float]:
    """The median of `rows`' core-wait shares (EpochRow.core_wait): the load the run saw;
    None where any of them was not measured."""
    shares = [r.core_wait for r in rows if r.core_wait is not None]
    if not shares or len(shares) < len(rows):
        return None
    return statistics.median(shares)


def _epochs(numbers: list[int]) -> str:
    if len(numbers) == 1:
        return f"epoch {numbers[0]}"
    return f"epochs {', '.join(map(str, numbers[:-1]))} and {numbers[-1]}"


def speed_note(history: list[EpochRow]) -> Optional[str]:
    """Why the run's speed figures are empty or include warm-up, in words; None when they
    are what they claim (steady epochs free of warm-up, epoch 1 a whole warm-up)."""
    basis, split = steady_basis(history), [r for r in history if is_split(r)]
    where = ", ".join(f"epoch {r.epoch} at step {r.resumed_at_step}" for r in split)
    if basis == NO_STEADY:
        return (
            "no steady epoch: every epoch was the first its process ran and was resumed "
            f"mid-epoch ({where}), its steps split between processes that each paid a "
            "start's one-off work; its warm-up and steady speed figures are left empty"
        )
    notes = []
    left = ", ".join(f"epoch {r.epoch} resumed at step {r.resumed_at_step}" for r in split)
    if basis == WARMUP_STANDS_IN:
        stand = [r.epoch for r in steady_rows(history)]
        notes.append(
            "steady figures include warm-up: every epoch was the first its process ran, none "
            f"is free of a start's one-off work; {_epochs(stand)} "
            f"{'stands' if len(stand) == 1 else 'stand'} in"
            + (f" ({left}: left out, its steps ran in more than one process)" if split else "")
        )
    if is_split(history[0]):
        notes.append(
            f"no warm-up figure: epoch 1 was resumed at step {history[0].resumed_at_step}, its "
            "steps split between processes"
        )
    return "; ".join(notes) or None


def speed_figures(history: list[EpochRow]) -> dict[str, Any]:
    """RunSummary's speed fields, from the run's epochs."""
    return {
        "warmup_epoch_seconds": warmup_seconds(history),
        "steady_epoch_seconds": steady_seconds(history),
        "steady_samples_per_s": steady_samples_per_s(history),
        "steady_basis": steady_basis(history),
        "speed_note": speed_note(history),
    }


def write_results(
    out_dir: Path,
    state: dict[str, Any],
    history: list[EpochRow],
    summary: RunSummary,
    config_yaml: str,
) -> None:
    """Every file is written beside its final name and renamed into place."""
    import torch  # only the writer of model.pt needs it

    atomic_write(out_dir / MODEL, lambda path: torch.save(state, path))
    atomic_write(out_dir / HISTORY, history_csv(history))
    atomic_write(out_dir / CONFIG, config_yaml)
    atomic_write(out_dir / SUMMARY, json.dumps(summary.to_json(), indent=2) + "\n")
    atomic_write(out_dir / METRICS, json.dumps(headline(summary), indent=2) + "\n")


def headline(summary: RunSummary) -> dict[str, Optional[float]]:
    """metrics.json, the headline figures of a run: numbers only, the same keys for every
    strategy, and few of them. Per-device, per-phase and per-epoch figures stay in
    summary.json and history.csv. A speed figure the run has no honest value for is null
    (summary.json's speed_note says why); peak_memory_mib is the busiest device's training
    peak (summary.json has each device's)."""
    peaks = summary.memory.get("peak_memory_mib")
    return {
        "test_acc": summary.test_acc,
        "best_test_acc": summary.best_test_acc,
        "steady_epoch_seconds": summary.steady_epoch_seconds,
        "steady_samples_per_s": summary.steady_samples_per_s,
        "total_seconds": summary.total_seconds,
        "peak_memory_mib": max(peaks.values()) if isinstance(peaks, dict) and peaks else None,
    }


def history_csv(history: list[EpochRow]) -> str:
    def cell(name: str, value: float | int | None) -> str:
        if value is None:
            return ""  # not measured (EpochRow.core_wait)
        if isinstance(value, bool):
            return str(int(value))  # 0/1: a number for DVC plots and read_history
        if name == "ended_at":
            return f"{value:.3f}"  # a Unix time: 6 significant digits would lose the day
        return f"{value:.6g}" if isinstance(value, float) else str(value)

    lines = [",".join(HISTORY_COLUMNS)]
    for row in history:
        lines.append(",".join(cell(name, getattr(row, name)) for name in HISTORY_COLUMNS))
    return "\n".join(lines) + "\n"


def read_summary(strategy: str, results: Path = RESULTS) -> RunSummary:
    path = results / strategy / SUMMARY
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise TypeError(f"a JSON {type(data).__name__}, expected an object")
        if data.get("outcome") == DID_NOT_FIT:
            raise UserError(f"{path}: {strategy} did not fit its device's memory: no figures")
        if "strategy" in data and not SUMMARY_KEYS <= data.keys():
            raise UserError(f"{path}: {older(strategy)}")
        return RunSummary.from_json(data)
    except FileNotFoundError:
        raise UserError(
            f"{path}: not found; run its train stage first (dvc repro train@{strategy})"
        ) from None
    except (OSError, ValueError, TypeError) as err:  # ValueError: JSON's and UTF-8's errors
        raise UserError(
            f"{path}: not a run summary of this project ({first_line(err)}); "
            f"{RERUN.format(strategy=strategy)}"
        ) from None


# the predict stages' documents, predictions/<strategy>.json (pipeline/predict.py); the
# compare stage shows those of its strategies
PREDICTIONS = Path("predictions")
PREDICTED = "predicted"  # their "kind": every figure in them is a prediction


def read_predictions(names: list[str], directory: Path = PREDICTIONS) -> dict[str, Any]:
    """Strategy -> its predict stage's document, for those of `names` that have one. One
    that is not such a document is bad input, named."""
    docs = {}
    for name in names:
        path = directory / f"{name}.json"
        again = f"run python -m pipeline.predict {name} again"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as err:
            why = first_line(err)
            raise UserError(f"{path}: not the predict stage's output ({why}); {again}") from None
        if not isinstance(data, dict) or data.get("kind") != PREDICTED:
            why = 'no "kind": "predicted"'
            raise UserError(f"{path}: not the predict stage's output ({why}); {again}")
        docs[name] = data
    return docs


def read_config(strategy: str, results: Path = RESULTS) -> dict[str, Any]:
    """The configuration a run recorded (config.yaml), as plain data; {} where it is missing
    or not a mapping (what reads it only matches settings, and matches none then)."""
    try:
        data = yaml.safe_load((results / strategy / CONFIG).read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _number(column: str, cell: str) -> Optional[float]:
    """A history.csv cell; an empty one is a figure not measured, where a column may be."""
    return None if cell == "" and column in OPTIONAL_COLUMNS else float(cell)


def read_history(strategy: str, results: Path = RESULTS) -> list[EpochRow]:
    path = results / strategy / HISTORY
    try:
        with path.open(newline="") as f:
            columns = set(f.readline().strip().split(","))
            f.seek(0)
            if "epoch" in columns and columns < set(HISTORY_COLUMNS):  # ours, some missing
                raise UserError(f"{path}: {older(strategy)}")
            rows = [
                EpochRow.from_record(
                    {k: int(v) if k == "epoch" else _number(k, v) for k, v in row.items()}
                )
                for row in csv.DictReader(f)
            ]
        if not rows:
            raise ValueError("no epochs")
        return rows
    except FileNotFoundError:
        raise UserError(
            f"{path}: not found; run its train stage first (dvc repro train@{strategy})"
        ) from None
    except (OSError, ValueError, TypeError) as err:  # a cell that is no number, a column short
        raise UserError(
            f"{path}: not a history of this project ({first_line(err)}); "
            f"{RERUN.format(strategy=strategy)}"
        ) from None


# What rewrites a strategy's results/: its train stage, which rewrites them from a finished
# checkpoint without training again (or retrains where there is none).
RERUN = "run `python -m pipeline.train {strategy}` (or dvc repro train@{strategy}) to rewrite it"
OLDER = "written by an older parallel-lab"


def older(strategy: str) -> str:
    """The line a file of an older format gets instead of a reader kept for it (issue 70).
    `--force` is dvc repro's (the project's commands have none): it reruns the stage, having
    removed the stage's outputs."""
    return f"{OLDER}: rerun with --force (dvc repro --force train@{strategy})"


# every key a checkpoint record of this code holds (checkpoint_policy.py, checkpoint.py `save`)
RECORD_KEYS = {"fingerprint", "epoch", "step", "directory", "world_size", "history", "run_id"}
RECORD_KEYS |= {"identity", "notes", "decided", "wall_seconds", "epoch_seconds"}


def is_older(record: dict[str, Any]) -> bool:
    """A sound record (`read_checkpoint_record`) without a key, or an epoch without a column,
    that this code writes: an older parallel-lab's."""
    columns = set(HISTORY_COLUMNS)
    return not RECORD_KEYS <= record.keys() or any(
        not columns <= r.keys() for r in record["history"]
    )


def read_checkpoint_record(directory: Path) -> dict[str, Any] | None:
    """`directory`/latest.json, checked, or None where there is none. Every reader (the
    launcher, each worker alike, publish) refuses a corrupt one in the same one line, before
    any rank reads a checkpoint it names."""
    path = directory / CHECKPOINT_RECORD
    try:
        record = json.loads(path.read_text())
        problem = _record_problem(record)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:  # ValueError: JSON's and UTF-8's errors
        problem = first_line(err)
    if problem is not None:
        raise UserError(
            f"{path}: corrupt checkpoint record ({problem}); delete {directory} to start over "
            f"(rm -r {directory})"
        )
    assert isinstance(record, dict)  # _record_problem refuses anything else
    return record


def _record_problem(record: Any) -> str | None:
    """What makes a checkpoint record unusable, in words; None when it is sound."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, expected an object"
    # a key absent here is a record of an older parallel-lab's where it is read (`is_older`)
    for key, low in (("epoch", 0), ("step", 0), ("world_size", 1)):
        value = record.get(key, low)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            return f"{key}: got {value!r}, expected an integer >= {low}"
    if not isinstance(record.get("fingerprint"), str):
        return f"fingerprint: got {record.get('fingerprint')!r}, expected a string"
    name = record.get("directory", "e0-s0")
    if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name:
        return f"directory: got {name!r}, expected a checkpoint directory's name"
    history = record.get("history")
    if not isinstance(history, list):
        return f"history: got {history!r:.40}, expected a list of epochs"
    for row in history:
        # numbers, but where a column may be unmeasured (EpochRow.core_wait: null)
        numbers = isinstance(row, dict) and all(
            isinstance(v, (int, float)) or (v is None and k in OPTIONAL_COLUMNS)
            for k, v in row.items()
        )
        try:
            EpochRow.from_record(row if numbers else {})
        except TypeError:
            return f"history: {str(row)[:60]!r} is not an epoch's figures"
    return None
