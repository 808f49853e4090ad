"""What a train stage leaves behind, and the compare stage and `publish` read.

results/<strategy>/ (DVC outputs):
    model.pt      final weights: the plain model's state_dict, whatever the strategy
    metrics.json  `RunSummary` (DVC metrics)
    history.csv   one `EpochRow` per epoch (DVC plots)
    config.yaml   the resolved configuration the run used
checkpoints/<strategy>/ (the run's state; training/checkpoint.py):
    latest.json   the commit record of the last checkpoint, with the epochs so far
    run.json      the MLflow run: its store, id, params, tags and status (tracking/)

The per-epoch row and the run's summary are typed here, once: training fills them, the
checkpoint record and MLflow carry them, reporting reads them back.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from pipeline.errors import UserError
from pipeline.files import atomic_write

RESULTS = Path("results")
CHECKPOINTS = Path("checkpoints")
RUN_RECORD, CHECKPOINT_RECORD = "run.json", "latest.json"
MODEL, METRICS, HISTORY, CONFIG = "model.pt", "metrics.json", "history.csv", "config.yaml"
# what each strategy's MLflow run gets as files; model.pt also goes in as the MLflow model
# "model" (tracking/mlflow_run.py `log_final_model`)
ARTIFACTS = (METRICS, HISTORY, CONFIG, MODEL)
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
    epoch_seconds: float  # training only (the steps this process ran), device synchronised
    samples_per_s: float  # the samples of those steps / epoch_seconds
    wall_seconds: float  # since training began (a resumed run goes on counting)
    ended_at: float = 0.0  # Unix time the epoch ended: its metrics' timestamp in MLflow
    # The first epoch its process ran, started fresh or resumed (possibly mid-epoch): it paid
    # the one-off work of a process start (allocator growth, cuDNN autotuning, NCCL set-up,
    # torch.compile), so steady figures leave it out (`is_warmup`). history.csv and MLflow
    # carry it as 0/1; records written before it existed read as False.
    warmup: bool = False
    # pipeline.memory.epoch_metrics: "gpu3/peak_allocated_mib" (training steps),
    # "gpu3/eval_peak_allocated_mib" (evaluation), "mem_imbalance", ...
    memory: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """What MLflow logs for this epoch (at step = epoch)."""
        return {**{name: float(getattr(self, name)) for name in METRIC_COLUMNS}, **self.memory}

    def to_record(self) -> dict[str, Any]:
        """The flat mapping a checkpoint record keeps."""
        return {**{name: getattr(self, name) for name in HISTORY_COLUMNS}, **self.memory}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> EpochRow:
        known = {name: record[name] for name in HISTORY_COLUMNS if name in record}
        if "warmup" in known:  # history.csv holds 0/1, read back as a number
            known["warmup"] = bool(known["warmup"])
        memory = {k: v for k, v in record.items() if k not in HISTORY_COLUMNS}
        return cls(**known, memory=memory)


HISTORY_COLUMNS = tuple(f.name for f in dataclasses.fields(EpochRow) if f.name != "memory")
METRIC_COLUMNS = tuple(c for c in HISTORY_COLUMNS if c not in ("epoch", "ended_at"))


@dataclass
class RunSummary:
    """results/<strategy>/metrics.json: the run's final figures."""

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
    warmup_epoch_seconds: float
    steady_epoch_seconds: float
    steady_samples_per_s: float
    # pipeline.memory.run_summary: memory_kind, peak_memory_mib, peak_reserved_mib,
    # mem_imbalance and device 0's share ("gpu0_share" or "cpu0_share") of the training
    # steps; the same of evaluation prefixed "eval_" (eval_peak_memory_mib, ...)
    memory: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # The run's identity (pipeline/training/identity.py). Its MLflow run is found through it:
    # checkpoints/<strategy>/run.json maps it to the store and run id that hold it now, and
    # the run carries it as the tag `parallel_lab_fingerprint`.
    fingerprint: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
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


def is_warmup(row: EpochRow) -> bool:
    """An epoch that paid a process start's one-off work: marked so by its process, or epoch 1
    (always a fresh start's first; also in histories recorded before the mark existed)."""
    return row.warmup or row.epoch == 1


def steady_rows(history: list[EpochRow]) -> list[EpochRow]:
    """The epochs steady figures are taken over: every one not a warm-up. When all of them
    are (a 1-epoch run, or every epoch in a process of its own) there is no steady state to
    tell apart and they all stand in (the warm-up then equals the steady figure)."""
    return [r for r in history if not is_warmup(r)] or history


def warmup_seconds(history: list[EpochRow]) -> float:
    """Epoch 1's seconds, the fresh start's warm-up: reported apart. (A resumed epoch is a
    warm-up too, left out of the steady figures, but it ran only part of an epoch's steps.)"""
    return history[0].epoch_seconds


def steady_seconds(history: list[EpochRow]) -> float:
    """Median seconds of the steady epochs (`steady_rows`)."""
    return statistics.median(r.epoch_seconds for r in steady_rows(history))


def steady_samples_per_s(history: list[EpochRow]) -> float:
    """The steady epochs' median samples over their median seconds (`steady_seconds`), so
    throughput and speedup tell the same story; an epoch's samples are those of the steps its
    process ran (samples_per_s x epoch_seconds): every steady epoch is a whole one, a resumed
    epoch that stands in for lack of any counts only its own steps."""
    rows = steady_rows(history)
    samples = statistics.median(r.samples_per_s * r.epoch_seconds for r in rows)
    return samples / statistics.median(r.epoch_seconds for r in rows)


def write_results(
    out_dir: Path, state: dict, history: list[EpochRow], summary: RunSummary, config_yaml: str
) -> None:
    """Every file is written beside its final name and renamed into place."""
    import torch  # only the writer of model.pt needs it

    atomic_write(out_dir / MODEL, lambda path: torch.save(state, path))
    atomic_write(out_dir / HISTORY, history_csv(history))
    atomic_write(out_dir / CONFIG, config_yaml)
    atomic_write(out_dir / METRICS, json.dumps(summary.to_json(), indent=2) + "\n")


def history_csv(history: list[EpochRow]) -> str:
    def cell(name: str, value: float | int) -> str:
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
    path = results / strategy / METRICS
    try:
        return RunSummary.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        raise UserError(
            f"{path}: not found; run its train stage first (dvc repro train@{strategy})"
        ) from None
    except (json.JSONDecodeError, TypeError) as err:
        raise UserError(f"{path}: not a metrics file of this project ({err})") from None


def read_history(strategy: str, results: Path = RESULTS) -> list[EpochRow]:
    with (results / strategy / HISTORY).open(newline="") as f:
        return [
            EpochRow.from_record({k: int(v) if k == "epoch" else float(v) for k, v in row.items()})
            for row in csv.DictReader(f)
        ]
