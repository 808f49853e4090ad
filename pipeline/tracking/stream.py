"""A train stage's live stream: one file that the run's writer appends to as it trains and the
stage's publisher (publisher.py) reads as it grows.

It holds what MLflow shows live and the run's files do not keep: the step metrics
(`step_train_loss`, `step_samples_per_s` every `mlflow.log_every_steps` steps), and each epoch's
row the moment it ends (the checkpoint record holds it only every `checkpoint.every_epochs`).
Its first line, the head, says that the writer has opened the run (run.json is written) and
how its system metrics are sampled. Everything else MLflow gets comes from the run's files,
pushed by `kept_runs.publish_strategy`.

The writer never waits for MLflow: a line is one append. The stream is the stage's alone (the
launcher makes it in a directory of its own): a torchrun restart of the workers appends to it,
and the next stage starts another.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from pipeline.results import EpochRow

STREAM_ENV = "PARALLEL_LAB_RUN_STREAM"  # where the launcher's publisher reads the stream


@dataclass(frozen=True)
class Head:
    """The stream's first line: the run was opened (its run.json written by the writer)."""

    fingerprint: str
    system_metrics_s: Optional[float]  # MLflow's sampling interval; None: off, or trains nothing
    gpu_uuids: Optional[dict[str, str]]  # the run's GPUs, for the sampler's NVML ids
    resume: bool  # the run has epochs already: its system metrics go on from their last step


Point = tuple[int, dict[str, float], int]  # (MLflow step, metrics, Unix time in ms)


def append(path: Path, line: dict[str, Any]) -> None:
    """One line, one write: the reader takes whole lines only."""
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def opened(path: Path) -> bool:
    """The writer opened the run in this stream (a torchrun restart's writer then goes on)."""
    return path.exists() and path.stat().st_size > 0


def open_stream(path: Path, head: Head) -> None:
    append(path, {"head": asdict(head)})


def epoch_ended(path: Path, row: EpochRow) -> None:
    append(path, {"epoch": row.to_record()})


def steps(path: Path, step: int, metrics: dict[str, float], timestamp_ms: int) -> None:
    append(path, {"step": step, "metrics": metrics, "at": timestamp_ms})


def read_lines(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The whole lines appended to `path` since `offset`, and the offset after them."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits
    return [json.loads(line) for line in complete.splitlines()], offset + len(complete)


@dataclass
class Read:
    """What the stream said so far, as the publisher takes it in."""

    head: Optional[Head] = None
    epochs: dict[int, EpochRow] = field(default_factory=dict)  # the first row of each epoch
    points: list[Point] = field(default_factory=list)  # step metrics not sent yet
    offset: int = 0

    def take(self, path: Path, keep_at_most: int) -> None:
        """Take in the lines appended since the last call. Step points past `keep_at_most`
        waiting to be sent are dropped: a live view, never the record, and MLflow away must
        not make the publisher grow."""
        lines, self.offset = read_lines(path, self.offset)
        for line in lines:
            if "head" in line:
                self.head = Head(**line["head"])
            elif "epoch" in line:
                row = EpochRow.from_record(line["epoch"])
                # an epoch redone after a restart: MLflow keeps the first, as a push never
                # logs an epoch twice
                self.epochs.setdefault(row.epoch, row)
            elif len(self.points) < keep_at_most:
                self.points.append((line["step"], line["metrics"], line["at"]))
