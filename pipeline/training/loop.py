"""The training loop every strategy shares: one epoch of optimizer steps, evaluation, and the
totals they add up. A strategy enters only through the run it returned (`Training.run`): a
`DataParallelRun`, whose logits the loop turns into a loss, or a `PipelinedRun`, whose
schedule runs forward and backward itself.

Nothing here waits for the GPU: per-batch loss and accuracy are summed into a tensor on the
device, and read back once per epoch (`reduce_totals`); the writer's live progress copies it
to the host now and then without waiting (live.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pipeline.context import DistContext
from pipeline.data.device_data import DeviceData, eval_shard
from pipeline.interrupts.faults import Hooks
from pipeline.interrupts.stop import StopRequest
from pipeline.numerics.build import Training
from pipeline.numerics.graphed_step import Step
from pipeline.numerics.optim import set_lr
from pipeline.recording.live import LiveProgress
from pipeline.strategies.base import PipelinedRun
from pipeline.timeline import mark


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


def train_epoch(trainer: Trainer, epoch: int, start_step: int, totals: torch.Tensor) -> int | None:
    """Optimizer steps start_step.. of one pass over the shuffled training set, adding
    [loss_sum, correct, count] of this rank's samples into `totals` on the device: nothing
    here waits for the GPU, nor does the live report, which reads `totals`. Returns the step
    it stopped before on SIGTERM, else None."""
    training, stop, live, rank = trainer.training, trainer.stop, trainer.live, trainer.ctx.rank
    run, optimizer, loader = training.run, training.optimizer, training.loader
    run.module.train()
    steps = loader.epoch(epoch, start_step)  # (step, this rank's micro-batches) on the device
    if live is not None:
        live.begin(epoch, start_step, loader.steps, totals)
    for step, micro_batches in steps:
        if stop.agreed():  # a collective at the steps every rank picks alike (stop.py)
            return step
        trainer.hooks.at("step", epoch + 1, step)
        set_lr(optimizer, training.schedule.at(epoch * loader.steps + step))
        if training.graphed is not None:  # one micro-batch (graphed_step.step_graph)
            ((x, y),) = micro_batches
            training.graphed(whole_step(training), x, y, totals)
        else:
            eager_step(training, micro_batches, totals)
        if step == start_step:
            mark("first step", rank)  # queued, on a GPU: the host's view
        if live is not None:
            live.step(step + 1)
    return None


def eager_step(
    training: Training, micro_batches: list[tuple[torch.Tensor, torch.Tensor]], totals: torch.Tensor
) -> None:
    """One optimizer step over this rank's micro-batches, kernel by kernel."""
    run, prec, optimizer = training.run, training.prec, training.optimizer
    last = training.plan.grad_accum - 1
    for micro, (x, y) in enumerate(micro_batches):
        training.new_graph_step()  # the last step's outputs are consumed (totals queued)
        logits: torch.Tensor | None
        if isinstance(run, PipelinedRun):
            with prec.autocast():  # the schedule runs forward and backward itself
                logits = run.step(x, y, True)
        else:
            assert training.forward is not None  # a DataParallelRun always has one
            with run.reduce_grads_if(micro == last):
                with prec.autocast():
                    logits = training.forward(x)
                    # mean over this rank's share, / grad_accum (step_loss); DDP/FSDP
                    # average over ranks: the gradient is the mean over the global batch
                    loss = training.loss_fn(logits, y.to(logits.device))
                prec.backward(loss)  # scaled first when fp16 needs it
        if logits is not None:
            totals += batch_totals(logits.detach(), y)
    prec.step(optimizer)
    optimizer.zero_grad(set_to_none=True)


def whole_step(training: Training) -> Step:
    """The step graphed_step.py captures: what `eager_step` computes for one micro-batch of
    a DataParallelRun (grad_accum 1: the loss's scale is 1) without a loss scaler (the only
    runs it applies to), with autocast's cast cache off, as a capture requires (a cached cast
    would not be redone in a replay)."""
    prec, optimizer, forward = training.prec, training.optimizer, training.forward
    assert forward is not None

    def step(x: torch.Tensor, y: torch.Tensor, totals: torch.Tensor) -> None:
        with prec.autocast(cache=False):
            logits = forward(x)
            loss = training.loss_fn(logits, y.to(logits.device))
        loss.backward()
        optimizer.step()
        totals += batch_totals(logits.detach(), y)

    return step


def batch_totals(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    labels = labels.to(logits.device)
    loss_sum = F.cross_entropy(logits.float(), labels, reduction="sum")
    correct = (logits.argmax(1) == labels).sum()
    # a fill kernel, not torch.tensor(): a host->device copy would wait for the GPU
    count = torch.full((), len(labels), dtype=torch.float64, device=logits.device)
    return torch.stack([loss_sum.double(), correct.double(), count])


@torch.no_grad()
def evaluate(
    training: Training, data: DeviceData, eval_batch_size: int, ctx: DistContext
) -> torch.Tensor:
    """[loss_sum, correct, count] over this rank's share of the whole test set."""
    run, prec, device = training.run, training.prec, ctx.device
    if isinstance(run, PipelinedRun):
        batch = run.eval_batch_size  # the schedule keeps its training shapes
    else:
        run.before_eval()
        batch = eval_batch_size
    run.module.eval()
    plan = training.plan
    batches, counts = eval_shard(
        len(data.test_labels), plan.data_rank(ctx.rank), plan.data_world, batch
    )
    totals = torch.zeros(3, device=device, dtype=torch.float64)
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
            totals += batch_totals(logits[:count], y[:count]).to(device)
    return totals


def reduce_totals(totals: torch.Tensor, ctx: DistContext) -> tuple[float, float]:
    """Sum [loss_sum, correct, count] over ranks -> (mean loss, accuracy). One host sync."""
    if ctx.world_size > 1:
        dist.all_reduce(totals)
    loss_sum, correct, count = totals.tolist()
    count = max(count, 1.0)
    return loss_sum / count, correct / count


def wait_for_device(device: torch.device) -> None:
    """Block until the GPU has finished what was queued (epoch timing); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
