"""What a run decides at its start (its strategy's `at_start`, through `Training.started`),
through the real build, the checkpoint policy and its files in one process: measured once,
kept in the checkpoint and beside it, and taken from there by a resume and by a torchrun
restart, which never measure.

The profiler is a fake that counts its calls (balanced_dp's own profiles only with >=2 GPUs),
and it picks 8, which auto never picks on the CPU: a reused value can only have come from
the checkpoint."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipeline.checkpoints.checkpoint import Checkpointer, Position
from pipeline.checkpoints.checkpoint_policy import DECIDED, CheckpointPolicy
from pipeline.checkpoints.identity import RunIdentity
from pipeline.config import Config
from pipeline.context import DistContext
from pipeline.data.device_data import to_device
from pipeline.data.download import convert
from pipeline.numerics.build import build_training
from pipeline.run_spec import resolve_run
from pipeline.strategies import gpu0_autotune
from pipeline.strategies.base import decided_params
from pipeline.strategies.gpu0_autotune import CHOSEN_KEY

# one process, no process group: DCP says it saves and loads locally, as meant here
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

CPU = DistContext(rank=0, local_rank=0, world_size=1, gpus=())
IDENTITY = RunIdentity({"balanced_dp.gpu0_bsz": "auto"}, "balanced_dp", 1, {}, "d", {})
CHOSEN = f"{CHOSEN_KEY}=8: the fake profiler's pick"


@pytest.fixture(scope="module")
def data(raw_dataset):
    return to_device(convert(raw_dataset[0]), CPU.device, 64, 32)


class Start:
    """One process's start of the run: build, resume, start, with a counting profiler."""

    def __init__(
        self, data, directory, monkeypatch, restart: int = 0, identity: RunIdentity = IDENTITY
    ):
        cfg = Config()
        cfg.model.width, cfg.train.batch_size = 4, 16
        cfg.balanced_dp.gpu0_bsz = "auto"
        ctx = replace(CPU, restart=restart)
        spec = resolve_run(cfg, "balanced_dp")
        plan = spec.job_plan(1, len(data.train_labels))
        self.measured = 0
        monkeypatch.setattr(gpu0_autotune, "resolve_gpu0_bsz", self.fake)
        built = build_training(spec, ctx, data, plan)
        files = Checkpointer(directory, 0, 1, True, identity.key)
        self.policy = CheckpointPolicy(cfg.checkpoint, 2, files, identity, ctx)
        self.lines: list[str] = []
        self.training, self.progress = self.policy.resume(built, self.lines.append)

    def fake(self, *args, **kwargs):
        self.measured += 1
        return 8, [CHOSEN, "balanced_dp.gpu0_bsz=auto measurements: 8: 1 samples/s"]

    def chosen_notes(self) -> list[str]:
        return [note for note in self.training.notes if note.startswith(CHOSEN_KEY)]

    def save(self, epoch: int) -> dict:
        self.policy.save(Position(epoch, 0), self.progress, self.training, "run-id")
        return json.loads((self.policy.ckpt.record_path).read_text())


def test_measured_once_kept_in_the_checkpoint_and_reused_on_resume(data, tmp_path, monkeypatch):
    first = Start(data, tmp_path, monkeypatch)
    assert first.measured == 1 and first.training.run.at_start is None
    assert decided_params(first.progress.decided) == {CHOSEN_KEY: 8}
    assert first.chosen_notes() == [CHOSEN]
    assert first.training.forward.gpu0_bsz == 8  # the forward the loop calls
    assert not any("reused" in line for line in first.lines)
    record = first.save(1)
    assert record["decided"][CHOSEN_KEY]["value"] == 8

    resumed = Start(data, tmp_path, monkeypatch)
    assert resumed.measured == 0 and resumed.progress.position == Position(1, 0)
    assert resumed.progress.decided == first.progress.decided
    assert resumed.training.notes == first.training.notes  # the profile's notes, once
    assert resumed.training.forward.gpu0_bsz == 8
    (line,) = [line for line in resumed.lines if CHOSEN_KEY in line]
    assert line.startswith(f"{CHOSEN_KEY}=8: reused") and "not measured again" in line
    assert resumed.save(2)["decided"] == record["decided"]  # and kept by every checkpoint after


def test_a_torchrun_restart_before_the_first_checkpoint_takes_the_first_attempts(
    data, tmp_path, monkeypatch
):
    """It goes on with the same MLflow run, whose params hold the first attempt's value; a new
    attempt of the stage, or another run's file, decides afresh."""
    first = Start(data, tmp_path, monkeypatch)
    assert first.measured == 1 and (tmp_path / DECIDED).exists()
    assert not (tmp_path / "latest.json").exists()

    restarted = Start(data, tmp_path, monkeypatch, restart=1)
    assert restarted.measured == 0 and decided_params(restarted.progress.decided) == {CHOSEN_KEY: 8}
    assert restarted.chosen_notes() == [CHOSEN]
    assert any(line.startswith(f"{CHOSEN_KEY}=8: reused") for line in restarted.lines)

    assert Start(data, tmp_path, monkeypatch).measured == 1  # the stage run again: a new run
    other = replace(IDENTITY, params={"balanced_dp.gpu0_bsz": "auto", "seed": 1})
    assert Start(data, tmp_path, monkeypatch, restart=1, identity=other).measured == 1
