"""The Trainer: one strategy's run in one torchrun worker, epoch by epoch and step by step,
the same for every strategy. A strategy enters only through the run it returned
(`Training.run`): a `DataParallelRun`, whose logits the step turns into a loss, or a
`PipelinedRun`, whose schedule runs forward and backward itself.

    fit         the epochs from where the run stands (a resume's position), each one
                train_epoch + evaluate, a checkpoint when due, an MLflow push; the first
                epoch this process runs is marked warm-up; then the full model's state,
                results/<strategy>/ and the final push
    train_epoch the optimizer steps of one pass over the shuffled training set
    step        one optimizer step: autocast, forward, loss, backward, the gradient sync
                skipped on all but the last micro-step, the optimizer's step
    evaluate    this rank's share of the test set

Nothing in an epoch waits for the GPU: per-batch loss and accuracy are summed into a tensor
on the device and read back once per epoch (numerics/totals.py); the writer's live progress
copies it to the host now and then without waiting (live.py). What an epoch measures beside
its losses (its seconds, the machine's load, memory peaks) is the meter's (meter.py).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import torch

from pipeline import memory
from pipeline.checkpoints.checkpoint import Position
from pipeline.checkpoints.checkpoint_policy import CheckpointPolicy, Progress
from pipeline.context import DistContext
from pipeline.data.device_data import DeviceData, eval_shard
from pipeline.did_not_fit import DidNotFit, RunDidNotFit, how_to_fit, write_did_not_fit
from pipeline.errors import first_line
from pipeline.interrupts.faults import Hooks
from pipeline.interrupts.stop import StopRequest
from pipeline.numerics.build import Training
from pipeline.numerics.optim import set_lr
from pipeline.numerics.torch_compile import compile_cache_line
from pipeline.numerics.totals import Totals
from pipeline.recording.live import LiveProgress
from pipeline.recording.recorder import RunRecorder
from pipeline.results import EpochRow, RunSummary
from pipeline.run_spec import RunSpec
from pipeline.strategies.base import PipelinedRun
from pipeline.timeline import mark
from pipeline.training.meter import Meter

MicroBatches = list[tuple[torch.Tensor, torch.Tensor]]  # (images, labels) on the device
# what running out of memory raises: torch's, on a GPU or a CPU (its allocator's), and
# Python's where NumPy or the interpreter allocates
OUT_OF_MEMORY = (torch.OutOfMemoryError, MemoryError)


@dataclass(frozen=True)
class Session:
    """What a run keeps beside its steps: what it is (`spec`), what it trains on, where it
    stands (`progress`), when it checkpoints (`policy`) and what it leaves (`recorder`)."""

    spec: RunSpec[Any]
    data: DeviceData
    progress: Progress
    policy: CheckpointPolicy
    recorder: RunRecorder


@dataclass(frozen=True)
class Trainer:
    """What runs the steps beside the model: this process (`ctx`), the stop request every
    step consults, the hooks it reaches (faults.py: nothing outside the tests) and the
    writer's live report (a bar or log lines, MLflow step metrics; None elsewhere)."""

    training: Training
    ctx: DistContext
    stop: StopRequest
    hooks: Hooks = Hooks()
    live: LiveProgress | None = None

    def fit(self, session: Session) -> RunSummary | None:
        """Train to the end; None when a SIGTERM stopped the run at a checkpoint. Running
        out of memory is a result (did_not_fit.py): this rank records it and says so."""
        spec, progress, policy, recorder = (
            session.spec,
            session.progress,
            session.policy,
            session.recorder,
        )
        meter = Meter(self.training.memory_devices, self.ctx)
        meter.wall_before, ok = progress.wall_seconds, False
        try:
            self.hooks.at("start")
            for epoch in range(progress.position.epoch, spec.train.epochs):
                # this process's first epoch (fresh or resumed) pays the start's one-off work
                warmup = epoch == progress.position.epoch
                first_step = progress.position.step if warmup else 0
                # the epoch's seconds before this process: its steps 0..first_step-1
                before = progress.epoch_seconds if warmup else 0.0
                meter.started()
                stopped_at = self.train_epoch(epoch, first_step, progress.totals)
                seconds = meter.trained() + before
                if self.live is not None:
                    self.live.end()  # outside the epoch's time
                if stopped_at is not None:
                    self.stopped(session, Position(epoch, stopped_at), meter, seconds)
                    ok = True
                    return None
                row = self.epoch_row(session, epoch, first_step, seconds, meter)
                progress.history.append(row)  # before the save: the checkpoint holds it
                progress.wall_seconds, progress.epoch_seconds = row.wall_seconds, 0.0
                if policy.due(epoch + 1):
                    at = Position(epoch + 1, 0)
                    policy.save(at, progress, self.training, recorder.run_id, self.hooks)
                recorder.epoch_done(row)
            self.hooks.at("end")
            mark("trained", self.ctx.rank)
            if self.training.features["compile"] != "off":
                recorder.say(compile_cache_line())
            state = self.training.run.state_dict()  # a collective for sharded/split models
            # A SIGTERM after the last step: the results are written all the same (the
            # launcher's publisher then makes one attempt to push them, no wait)
            summary = recorder.finish(state)
            ok = True
            return summary
        except OUT_OF_MEMORY as err:  # the rank that ran out says so
            record = self.out_of_memory(spec, err, progress)
            write_did_not_fit(record, progress.history, recorder.config_yaml)
            raise RunDidNotFit(record) from err
        finally:
            if not ok:
                recorder.failed()
            self.training.run.release()  # the strategy's own hold on its process groups

    def train_epoch(self, epoch: int, start_step: int, totals: Totals) -> int | None:
        """Optimizer steps start_step.. of one pass over the shuffled training set, adding
        this rank's samples into `totals` on the device: nothing
        here waits for the GPU, nor does the live report, which reads `totals`. Returns the
        step it stopped before on SIGTERM, else None."""
        training, live = self.training, self.live
        loader = training.loader
        training.run.module.train()
        if live is not None:
            live.begin(epoch, start_step, loader.steps, totals)
        for step, micro_batches in loader.epoch(epoch, start_step):
            if self.stop.agreed():  # a collective at the steps every rank picks alike
                return step
            self.hooks.at("step", epoch + 1, step)
            set_lr(training.optimizer, training.schedule.at(epoch * loader.steps + step))
            if training.graphed is not None:  # one micro-batch, replayed as one CUDA graph
                ((x, y),) = micro_batches
                training.graphed(self.graph_step, x, y, totals)
            else:
                self.step(micro_batches, totals)
            if step == start_step:
                mark("first step", self.ctx.rank)  # queued, on a GPU: the host's view
            if live is not None:
                live.step(step + 1)
        return None

    def step(self, micro_batches: MicroBatches, totals: Totals, cast_cache: bool = True) -> None:
        """One optimizer step over this rank's micro-batches (train.grad_accum of them). The
        graphed step (graphed_step.py) captures this same function on one micro-batch, with
        autocast's cast cache off (`graph_step`)."""
        run, prec, optimizer = self.training.run, self.training.prec, self.training.optimizer
        last = len(micro_batches) - 1
        for micro, (x, y) in enumerate(micro_batches):
            self.training.new_graph_step()  # the last step's outputs are consumed (totals)
            logits: torch.Tensor | None
            # gradients are reduced across the data ranks in the step's last micro-step alone
            with run.reduce_grads_if(micro == last):
                if isinstance(run, PipelinedRun):
                    with prec.autocast(cast_cache):  # the schedule runs forward and backward
                        logits = run.step(x, y, True)
                else:
                    assert self.training.forward is not None  # a DataParallelRun has one
                    with prec.autocast(cast_cache):
                        logits = self.training.forward(x)
                        # this rank's mean over its share, / grad_accum: the accumulated
                        # gradient is the mean over the step's batch (DDP/FSDP average ranks)
                        loss = self.training.loss_fn(logits, y.to(logits.device)) / (last + 1)
                    prec.backward(loss)  # fp16 scales the loss first: small gradients survive
            if logits is not None:
                totals.add(logits.detach(), y)
        if prec.scaler is None:
            optimizer.step()
        else:  # fp16: unscale, skip the step on inf/NaN gradients, adapt the scale
            prec.scaler.step(optimizer)
            prec.scaler.update()
        optimizer.zero_grad(set_to_none=True)

    def graph_step(self, x: torch.Tensor, y: torch.Tensor, totals: Totals) -> None:
        """`step` on one micro-batch as graphed_step.py captures it: autocast's cast cache off
        (a cached cast would not be redone in a replay). Only runs without a loss scaler and
        with grad_accum 1 are graphed (`step_graph`)."""
        self.step([(x, y)], totals, cast_cache=False)

    @torch.no_grad()
    def evaluate(self, data: DeviceData, eval_batch_size: int) -> Totals:
        """The totals of this rank's share of the whole test set."""
        training, device = self.training, self.ctx.device
        run, prec, plan = training.run, training.prec, training.plan
        if isinstance(run, PipelinedRun):
            eval_batch_size = run.eval_batch_size  # the schedule keeps its training shapes
        run.before_eval()
        run.module.eval()
        batches, counts = eval_shard(
            len(data.test_labels), plan.data_rank(self.ctx.rank), plan.data_world, eval_batch_size
        )
        totals = Totals.zeros(device)
        for idx, count in zip(batches, counts):
            idx = idx.to(device)
            x, y = training.loader.prepare(data.test_images[idx]), data.test_labels[idx]
            training.new_graph_step()
            logits: torch.Tensor | None
            with prec.autocast():
                if isinstance(run, PipelinedRun):
                    logits = run.step(x, y, False)
                else:
                    assert training.forward is not None
                    logits = training.forward(x)
            if logits is not None and count > 0:
                totals.add(logits[:count], y[:count])
        return totals

    def epoch_row(
        self,
        session: Session,
        epoch: int,
        first_step: int,
        seconds: float,
        meter: Meter,
    ) -> EpochRow:
        """The finished epoch's row: the training totals, the evaluation, and what the meter
        read, on every rank (the reductions and the meter's gather are collectives)."""
        progress, spec = session.progress, session.spec
        self.hooks.at("eval", epoch + 1)
        train_loss, train_acc = progress.totals.reduced(self.ctx)
        progress.totals.zero_()
        test = self.evaluate(session.data, spec.train.eval_batch_size)
        test_loss, test_acc = test.reduced(self.ctx)
        metrics, core_wait = meter.gathered()
        return EpochRow(
            epoch + 1,
            train_loss,
            train_acc,
            test_loss,
            test_acc,
            seconds,
            samples_per_s=self.training.plan.samples_from(0) / seconds,
            wall_seconds=meter.wall_seconds(),
            ended_at=time.time(),
            warmup=epoch == progress.position.epoch,
            resumed_at_step=first_step,
            core_wait=core_wait,
            memory=metrics,
        )

    def stopped(self, session: Session, at: Position, meter: Meter, seconds: float) -> None:
        """A SIGTERM stopped the epoch before step `at.step`: checkpoint there, with the time
        trained until the stop for the resume to go on from."""
        progress, recorder = session.progress, session.recorder
        progress.wall_seconds = meter.wall_seconds()
        progress.epoch_seconds = seconds
        session.policy.save(at, progress, self.training, recorder.run_id, self.hooks)
        recorder.say(
            f"SIGTERM: checkpointed at epoch {at.epoch + 1} step {at.step}; "
            "`dvc repro` resumes from there"
        )
        recorder.stopped()

    def out_of_memory(self, spec: RunSpec[Any], err: BaseException, at: Progress) -> DidNotFit:
        """The record of this rank's run out of memory: where, at what batch, from what peak."""
        run, ctx, plan = self.training.run, self.ctx, self.training.plan
        devices = self.training.memory_devices
        peaks = {p.label: p.allocated_mib for p in memory.read_peaks(devices, ctx)}
        gpu = re.search(r"GPU (\d+)", str(err))  # torch names the device that ran out
        failed_on = (
            memory.rank_label(f"cuda:{gpu[1]}", ctx)
            if gpu and ctx.on_cuda
            else next(iter(peaks), f"cpu_{ctx.rank}")
        )
        return DidNotFit(
            strategy=spec.name,
            devices=list(run.devices),
            batch_split=list(run.batch_split),
            failed_on=failed_on,
            peak_mib=peaks,
            epoch=len(at.history) + 1,
            error=first_line(err),
            fix=how_to_fit(
                spec.name, plan.batch_size, plan.grad_accum, spec.facts.sharded_parameters
            ),
            epochs_done=len(at.history),
        )
