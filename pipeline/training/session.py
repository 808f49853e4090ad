"""One strategy's run assembled in a torchrun worker, up to its first step: the seeded data
and model, the strategy's run built around them, the resume of the last committed checkpoint
of this very configuration (checkpoint_policy.py, which then has the strategy take its own
last step before training), the MLflow run and the live report. What then trains it is the
Trainer's (trainer.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pipeline.checkpoints.checkpoint import Checkpointer
from pipeline.checkpoints.checkpoint_policy import CheckpointPolicy
from pipeline.checkpoints.hardware import run_hardware
from pipeline.checkpoints.identity import run_identity
from pipeline.context import DistContext
from pipeline.data.device_data import to_device
from pipeline.data.fashion_mnist import ARRAYS, DATA_DIR, load_arrays
from pipeline.interrupts.faults import hooks_from_env
from pipeline.interrupts.stop import StopRequest
from pipeline.numerics.build import build_training
from pipeline.recording.live import live_progress
from pipeline.recording.recorder import RunRecorder, writer_log
from pipeline.results import CHECKPOINTS
from pipeline.run_spec import RunSpec
from pipeline.timeline import mark
from pipeline.training.trainer import Session, Trainer


def start(
    spec: RunSpec[Any],
    ctx: DistContext,
    stop: StopRequest | None = None,
    terminal_columns: int | None = None,
    live: Path | None = None,
) -> tuple[Trainer, Session]:
    """The run of `spec` in this process, ready for `Trainer.fit`. `spec` is resolved for
    this job (`resolve_run`'s `job`): its plan is the batch over the job's ranks.
    `stop`: the process's stop request, which the caller keeps after the run (None: the run
    makes its own).
    `terminal_columns`: the width of the terminal the stage's output goes to, if it does
    (live.terminal_columns): the writer then shows a bar instead of progress lines.
    `live`: the stage's stream, which its MLflow publisher follows (tracking/stream.py);
    None: a worker started by hand, whose run `python -m pipeline.publish` pushes."""
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
    if stop is None:
        stop = StopRequest(None, ctx.world_size)
    torch.manual_seed(spec.seed)
    data = to_device(load_arrays(), ctx.device, spec.data.limit_train, spec.data.limit_test)
    mark("data on device", ctx.rank)
    training = build_training(spec, ctx, data, spec.plan)
    mark("model built", ctx.rank)
    hardware = run_hardware(ctx, training.run.devices, training.prec.name)
    identity = run_identity(spec, ctx.world_size, DATA_DIR / ARRAYS, hardware)
    checkpoints = Checkpointer(
        CHECKPOINTS / spec.name, ctx.rank, ctx.world_size, training.run.writer, identity.key
    )
    policy = CheckpointPolicy(spec.checkpoint, spec.train.epochs, checkpoints, identity, ctx)
    # restored, then the strategy's own last step before training, if it has one
    training, progress = policy.resume(training, writer_log(spec.name, training.run.writer))
    recorder = RunRecorder(spec, ctx, training, identity.key, progress, live)
    mark("mlflow run opened", ctx.rank)  # its record and stream: the name the benchmarks know
    progress_view = live_progress(spec, training, ctx, recorder.log_steps, terminal_columns)
    hooks = hooks_from_env(ctx.rank, lambda: stop.flag, spec.name)
    trainer = Trainer(training, ctx, stop, hooks, progress_view)
    return trainer, Session(spec, data, progress, policy, recorder)
