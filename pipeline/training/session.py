"""One strategy's training run from start (or checkpoint) to results, in every torchrun
worker: the seeded data and model, the batch plan, the strategy's run built around them, then
the epochs. What is kept of it is the recorder's (recorder.py), when it checkpoints and
where it resumes the policy's (checkpoint_policy.py), one step of training the loop's
(loop.py).

    resume      the last committed checkpoint of this very configuration, if any
    epochs      train_epoch + evaluate, the memory peaks of each apart, a checkpoint when
                due, an MLflow push; the first epoch this process runs is marked warm-up
    finish      the full model's state, results/<strategy>/, the run's final MLflow push
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline import core_wait, memory
from pipeline.checkpoints.checkpoint import Position
from pipeline.checkpoints.checkpoint_policy import CheckpointPolicy, Progress
from pipeline.checkpoints.hardware import run_hardware
from pipeline.checkpoints.identity import run_identity
from pipeline.context import DistContext
from pipeline.data.device_data import DeviceData, to_device
from pipeline.data.fashion_mnist import ARRAYS, DATA_DIR, load_arrays
from pipeline.did_not_fit import DidNotFit, RunDidNotFit, how_to_fit, write_did_not_fit
from pipeline.errors import first_line
from pipeline.interrupts.faults import hooks_from_env
from pipeline.interrupts.stop import StopRequest
from pipeline.numerics.build import Training, build_training
from pipeline.numerics.torch_compile import compile_cache_line
from pipeline.recording.live import LiveProgress, LiveSettings
from pipeline.recording.recorder import RunRecorder, writer_log
from pipeline.results import CHECKPOINTS, EpochRow, RunSummary
from pipeline.run_spec import RunSpec
from pipeline.timeline import mark
from pipeline.training.loop import (
    Trainer,
    evaluate,
    reduce_totals,
    train_epoch,
    wait_for_device,
)
from pipeline.training.tuning import settle


@dataclass(frozen=True)
class RunEnd:
    """How a run ended in this process: its summary (None: a SIGTERM stopped it at a
    checkpoint) and whether this process is the run's writer, the one that tells."""

    summary: RunSummary | None
    writer: bool


@dataclass(frozen=True)
class Session:
    """One process's run, as its epochs go: the steps' trainer (the training, this process,
    the stop request, the hooks, the live report), what the run is and trains on, when it
    checkpoints (`policy`) and what it leaves behind (`recorder`)."""

    trainer: Trainer
    spec: RunSpec[Any]
    data: DeviceData
    policy: CheckpointPolicy
    recorder: RunRecorder


def run(
    spec: RunSpec[Any],
    ctx: DistContext,
    stop: StopRequest | None = None,
    terminal_columns: int | None = None,
    events: Path | None = None,
) -> RunEnd:
    """Train one strategy to the end (or to a SIGTERM checkpoint: then the summary is None).
    `stop`: the process's stop request, which the caller keeps after the run (None: the run
    makes its own).
    `terminal_columns`: the width of the terminal the stage's output goes to, if it does
    (live.terminal_columns): the writer then shows a bar instead of progress lines.
    `events`: where the stage's MLflow publisher takes the run's events (tracking/relay.py);
    None: the writer publishes itself."""
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
    name = spec.name
    if stop is None:
        stop = StopRequest(None, ctx.world_size)
    hooks = hooks_from_env(ctx.rank, lambda: stop.flag, spec.name)
    torch.manual_seed(spec.seed)
    data = to_device(load_arrays(), ctx.device, spec.data.limit_train, spec.data.limit_test)
    mark("data on device", ctx.rank)
    plan = spec.job_plan(ctx.world_size, len(data.train_labels))
    training = build_training(spec, ctx, data, plan)
    mark("model built", ctx.rank)
    hardware = run_hardware(ctx, training.run.devices, training.prec.name)
    identity = run_identity(spec, ctx.world_size, DATA_DIR / ARRAYS, hardware)
    policy = CheckpointPolicy(
        spec.checkpoint, spec.train.epochs, CHECKPOINTS / name, identity, ctx, training.run.writer
    )
    say = writer_log(name, training.run.writer)
    progress = policy.resume(training, say)
    # what the run decides at its start (balanced_dp.gpu0_bsz: auto): a resume's is kept
    training = settle(training, progress.tuned, policy.keep_tuned, say)
    recorder = RunRecorder(spec, ctx, training, identity.key, progress, events)
    mark("mlflow run opened", ctx.rank)
    live = live_progress(spec, training, ctx, recorder, terminal_columns)
    trainer = Trainer(training, ctx, stop, hooks, live)
    ok = False
    try:
        summary = train_epochs(Session(trainer, spec, data, policy, recorder), progress)
        ok = True
        return RunEnd(summary, training.run.writer)
    except OUT_OF_MEMORY as err:  # a result (did_not_fit.py): the rank that ran out says so
        record = out_of_memory(spec, training, ctx, err, progress)
        write_did_not_fit(record, progress.history, recorder.config_yaml)
        raise RunDidNotFit(record) from err
    finally:
        recorder.close()
        if not ok:
            recorder.failed()
        training.run.release()  # the strategy's own hold on its process groups


# what running out of memory raises: torch's, on a GPU or a CPU (its allocator's), and
# Python's where NumPy or the interpreter allocates
OUT_OF_MEMORY = (torch.OutOfMemoryError, MemoryError)


def out_of_memory(
    spec: RunSpec[Any], training: Training, ctx: DistContext, err: BaseException, at: Progress
) -> DidNotFit:
    """The record of this rank's run out of memory: where, at what batch, from what peak."""
    devices = memory.local_devices(training.run.devices, ctx)
    peaks = {p.label: p.allocated_mib for p in memory.read_peaks(devices, ctx)}
    gpu = re.search(r"GPU (\d+)", str(err))  # torch names the device that ran out
    failed_on = (
        memory.physical_label(f"cuda:{gpu[1]}", ctx.gpus, ctx.node, ctx.nodes)
        if gpu and ctx.on_cuda
        else next(iter(peaks), f"cpu_{ctx.rank}")
    )
    plan = training.plan
    return DidNotFit(
        strategy=spec.name,
        devices=list(training.run.devices),
        batch_split=list(training.run.batch_split),
        failed_on=failed_on,
        peak_mib=peaks,
        epoch=len(at.history) + 1,
        error=first_line(err),
        fix=how_to_fit(spec.name, plan.batch_size, plan.grad_accum, spec.facts.sharded_parameters),
        epochs_done=len(at.history),
    )


def live_progress(
    spec: RunSpec[Any],
    training: Training,
    ctx: DistContext,
    recorder: RunRecorder,
    terminal_columns: int | None,
) -> LiveProgress | None:
    """The writer's report while an epoch runs; the other ranks report nothing."""
    if not training.run.writer:
        return None
    settings = LiveSettings(terminal_columns, spec.report.log_every_s, spec.mlflow.log_every_steps)
    devices = memory.local_devices(training.run.devices, ctx)
    return LiveProgress(
        settings,
        spec.name,
        spec.train.epochs,
        training.plan.batch_size,
        recorder.tracker.log_steps_soon,
        lambda: memory.read_peaks(devices, ctx),  # allocator counters: no device sync
    )


def train_epochs(session: Session, progress: Progress) -> RunSummary | None:
    """The epochs from `progress` on; None when a SIGTERM stopped them at a checkpoint."""
    trainer, policy, recorder = session.trainer, session.policy, session.recorder
    training, ctx, stop, hooks, live = (
        trainer.training,
        trainer.ctx,
        trainer.stop,
        trainer.hooks,
        trainer.live,
    )
    history, run = progress.history, training.run
    start = time.perf_counter() - progress.wall_seconds  # the clock goes on from the resume
    mem_devices = memory.local_devices(run.devices, ctx)
    hooks.at("start")
    for epoch in range(progress.position.epoch, session.spec.train.epochs):
        memory.reset_peaks(mem_devices)
        cores_before = core_wait.read()  # the machine's load over the steps (issue 51)
        t0 = time.perf_counter()
        # this process's first epoch (fresh or resumed): it pays the start's one-off work
        warmup = epoch == progress.position.epoch
        first_step = progress.position.step if warmup else 0
        # the epoch's seconds before this process: those of its steps 0..first_step-1
        before = progress.epoch_seconds if warmup else 0.0
        stopped_at = train_epoch(trainer, epoch, first_step, progress.totals)
        if stopped_at is not None:
            wait_for_device(ctx.device)  # the steps before the stop, done
            now = time.perf_counter()
            if live is not None:
                live.end()
            # the time trained until the stop, for the resume to go on from
            progress.wall_seconds = now - start
            progress.epoch_seconds = None if before is None else before + now - t0
            at = Position(epoch, stopped_at)
            policy.save(at, progress, training, recorder.tracker.run_id, hooks)
            recorder.say(
                f"SIGTERM: checkpointed at epoch {epoch + 1} step {stopped_at}; "
                "`dvc repro` resumes from there"
            )
            recorder.stopped()
            return None
        wait_for_device(ctx.device)
        # every step of the epoch, those before a resume included; a checkpoint that did not
        # record their seconds leaves steps first_step.. (and their samples) to count
        seconds = time.perf_counter() - t0 + (before or 0.0)
        waited = core_wait.wait_share(cores_before, core_wait.read())
        counted_from = first_step if before is None else 0
        if live is not None:
            live.end()  # outside the epoch's time; the device is idle: no wait
        train_peaks = memory.read_peaks(mem_devices, ctx)  # the training steps' alone
        memory.reset_peaks(mem_devices)
        hooks.at("eval", epoch + 1)
        train_loss, train_acc = reduce_totals(progress.totals, ctx)
        progress.totals.zero_()
        test_loss, test_acc = reduce_totals(
            evaluate(training, session.data, session.spec.train.eval_batch_size, ctx), ctx
        )
        eval_peaks = memory.read_peaks(mem_devices, ctx)
        # every device's peaks, training and evaluation apart, on every rank (collectives)
        peaks = memory.gather_peaks(train_peaks, ctx), memory.gather_peaks(eval_peaks, ctx)
        row = EpochRow(
            epoch + 1,
            train_loss,
            train_acc,
            test_loss,
            test_acc,
            seconds,
            samples_per_s=training.plan.samples_from(counted_from) / seconds,
            wall_seconds=time.perf_counter() - start,
            ended_at=time.time(),
            warmup=warmup,
            resumed_at_step=first_step,
            core_wait=core_wait.busiest(waited, ctx),  # a collective, like the peaks'
            memory=memory.epoch_metrics(*peaks),
        )
        history.append(row)  # before the save: the checkpoint's record holds this epoch
        progress.wall_seconds, progress.epoch_seconds = row.wall_seconds, 0.0
        if policy.due(epoch + 1):
            policy.save(Position(epoch + 1, 0), progress, training, recorder.tracker.run_id, hooks)
        recorder.epoch_done(row)
    hooks.at("end")
    mark("trained", ctx.rank)
    if training.features["compile"] != "off":
        recorder.say(compile_cache_line())
    state = run.state_dict()  # a collective for sharded/split models: every rank calls it
    # A SIGTERM after the last step: the results are written all the same, and the final push
    # makes one attempt instead of waiting for the server, well inside torchrun's grace.
    return recorder.finish(state, stopping=lambda: stop.flag)
