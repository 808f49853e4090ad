"""The clock of a resumed run (pipeline/training/trainer.py `Trainer.fit`, issue 28): a run
stopped by SIGTERM mid-epoch and resumed counts the time it trained before the stop, in its
wall time and in the split epoch's seconds, through the real build, checkpoint policy and
epoch loop in one process.

The training is real; the clock is the session's own, moved on by 100 s when the stop arrives
(the SIGTERM's checkpoint must carry those seconds): a bound no real timing comes near, so
nothing here depends on how fast this machine is."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from pipeline.checkpoints.checkpoint import Checkpointer, Position
from pipeline.checkpoints.checkpoint_policy import CheckpointPolicy
from pipeline.checkpoints.identity import RunIdentity
from pipeline.config import Config
from pipeline.context import DistContext
from pipeline.data.device_data import to_device
from pipeline.data.download import convert
from pipeline.numerics.build import build_training
from pipeline.recording.recorder import RunRecorder
from pipeline.results import NO_STEADY
from pipeline.run_spec import resolve_run
from pipeline.training import meter
from pipeline.training.trainer import Session, Trainer

# one process, no process group: DCP says it saves and loads locally, as meant here
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

CPU = DistContext(rank=0, local_rank=0, world_size=1, gpus=())
IDENTITY = RunIdentity({}, "single", 1, {}, "d", {})
SPENT = 100.0  # the seconds the steps before the stop took, as the session's clock reads them


class Clock:
    """The meter's `time`: the real clocks, perf_counter moved on by `offset`."""

    def __init__(self) -> None:
        self.offset = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.offset

    def time(self) -> float:
        return time.time()


class StopBefore:
    """A SIGTERM that has arrived before the process's step `step` (one process stops at
    once), after the steps before it took SPENT seconds; `step` None: no SIGTERM."""

    def __init__(self, step: int | None, clock: Clock) -> None:
        self.step, self.clock, self.flag, self.steps = step, clock, False, 0

    def agreed(self) -> bool:
        if self.steps == self.step and not self.flag:
            self.clock.offset += SPENT
            self.flag = True
        self.steps += 1
        return self.flag


@pytest.fixture(scope="module")
def data(raw_dataset):
    return to_device(convert(raw_dataset[0]), CPU.device, 64, 32)  # 4 steps of 16


def process(data, directory, stop_before, monkeypatch):
    """One process of a 1-epoch single run: build, resume, train until the end or the stop.
    Returns (its progress at the start, the summary or None, the lines it said)."""
    clock = Clock()
    monkeypatch.setattr(meter, "time", clock)
    cfg = Config()
    cfg.model.width, cfg.train.batch_size, cfg.train.epochs = 4, 16, 1
    spec = resolve_run(cfg, "single")
    plan = spec.job_plan(1, len(data.train_labels))
    training = build_training(spec, CPU, data, plan)
    # the recorder of a rank that writes no results/ and keeps no MLflow run
    training = replace(training, run=replace(training.run, writer=False))
    files = Checkpointer(directory, 0, 1, True, IDENTITY.key)
    policy = CheckpointPolicy(cfg.checkpoint, 1, files, IDENTITY, CPU)
    lines: list[str] = []
    training, progress = policy.resume(training, lines.append)
    start = replace(progress, history=list(progress.history), notes=list(progress.notes))
    recorder = RunRecorder(spec, CPU, training, IDENTITY.key, progress)
    stop = StopBefore(stop_before, clock)
    trainer = Trainer(training, CPU, stop)
    summary = trainer.fit(Session(spec, data, progress, policy, recorder))
    return start, summary, lines


def test_a_sigterm_resume_counts_the_time_before_the_stop(data, tmp_path, monkeypatch):
    directory = tmp_path / "checkpoints"
    _, stopped, _ = process(data, directory, 2, monkeypatch)
    assert stopped is None  # checkpointed at the stop
    record = json.loads((directory / "latest.json").read_text())
    assert (record["epoch"], record["step"]) == (0, 2)
    # the clock at the save, and the epoch's training seconds before the stop (steps 0, 1)
    assert record["epoch_seconds"] >= SPENT and record["wall_seconds"] >= record["epoch_seconds"]

    start, summary, _ = process(data, directory, None, monkeypatch)
    assert start.position == Position(0, 2)
    assert (start.wall_seconds, start.epoch_seconds) == (
        record["wall_seconds"],
        record["epoch_seconds"],
    )
    (row,) = summary_history(summary, directory)
    assert row.resumed_at_step == 2 and row.warmup
    # every step of the epoch: the 2 before the stop (carried) and the 2 after the resume
    assert row.epoch_seconds > record["epoch_seconds"]
    assert row.samples_per_s * row.epoch_seconds == pytest.approx(64)
    assert row.wall_seconds > record["wall_seconds"]  # the clock went on from the stop
    assert summary.total_seconds == row.wall_seconds
    # its only epoch is split: no speed figures, and why
    assert summary.steady_epoch_seconds is None and summary.steady_samples_per_s is None
    assert summary.steady_basis == NO_STEADY
    assert summary.speed_note.startswith("no steady epoch: every epoch was the first its")


def summary_history(summary, directory):
    """The epochs the finished run's last checkpoint records (what results/ would hold)."""
    from pipeline.results import EpochRow

    assert summary is not None
    record = json.loads((directory / "latest.json").read_text())
    return [EpochRow.from_record(r) for r in record["history"]]


def test_the_record_a_run_writes_is_of_the_current_format(data, tmp_path, monkeypatch):
    """What `is_older` takes for this code's record is what a real run's checkpoint holds: every
    key and every epoch column, so none of this code's own checkpoints reads as older."""
    from pipeline.results import HISTORY_COLUMNS, RECORD_KEYS, is_older

    directory = tmp_path / "checkpoints"
    process(data, directory, None, monkeypatch)  # one whole epoch, checkpointed at its end
    record = json.loads((directory / "latest.json").read_text())
    assert set(record) == RECORD_KEYS and not is_older(record)
    assert all(set(HISTORY_COLUMNS) <= set(row) for row in record["history"])
