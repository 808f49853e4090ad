"""One strategy's training run from start (or checkpoint) to results: the orchestration
around the shared loop. Runs in every torchrun worker; the strategy's writer rank also keeps
the MLflow run and writes results/<strategy>/.

    resume      the last committed checkpoint of this very configuration, if any
    epochs      train_epoch + evaluate (loop.py), memory peaks, a checkpoint, an MLflow push
    finish      the full model's state, results/<strategy>/, the run's final MLflow push
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline import strategies
from pipeline.config import Config, effective_lr, flatten, to_yaml
from pipeline.data.device_data import steps_per_epoch, to_device
from pipeline.data.fashion_mnist import DATA_DIR, TENSORS, load_tensors
from pipeline.errors import UserError
from pipeline.results import (
    ARTIFACTS,
    CHECKPOINTS,
    RESULTS,
    RUN_RECORD,
    EpochRow,
    RunSummary,
    steady_seconds,
    warmup_seconds,
    write_results,
)
from pipeline.strategies.base import Parallel
from pipeline.tracking.mlflow_run import FAILED, FINISHED, KILLED, NullTracker, Tracker
from pipeline.tracking.provenance import base_tags, gpu_tags, gpu_uuids
from pipeline.training import memory
from pipeline.training.build import Training, build_training
from pipeline.training.checkpoint import (
    Checkpointer,
    Position,
    load_model_state,
    load_optimizer_state,
    rng_state,
    set_rng_state,
)
from pipeline.training.context import DistContext
from pipeline.training.faults import fault_from_env
from pipeline.training.identity import RunIdentity, run_identity
from pipeline.training.loop import (
    StopRequest,
    evaluate,
    reduce_totals,
    train_epoch,
    wait_for_device,
)


@dataclass
class Progress:
    """Where the run stands: what a checkpoint saves and a resume restores."""

    position: Position  # the next (epoch, step) to train
    history: list[EpochRow]  # the epochs finished
    totals: torch.Tensor  # [loss_sum, correct, count] of the epoch so far, on the device


def run(cfg: Config, strategy_name: str, ctx: DistContext, control_group=None) -> RunSummary | None:
    """Train one strategy to the end (or to a SIGTERM checkpoint: then None is returned)."""
    device = ctx.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    fault = fault_from_env()
    stop = StopRequest(control_group, ctx.world_size)
    torch.manual_seed(cfg.seed)
    data = to_device(load_tensors(), device, cfg.data.limit_train, cfg.data.limit_test)
    steps = steps_per_epoch(len(data.train_labels), cfg.train.batch_size)
    if steps == 0:
        raise UserError(
            f"train.batch_size: got {cfg.train.batch_size}, larger than the "
            f"{len(data.train_labels)} training samples; expected at most that"
        )
    n_train = steps * cfg.train.batch_size  # samples trained per epoch
    training = build_training(cfg, strategies.get(strategy_name), ctx, data)
    par, prec, loader, optimizer, loss_fn = training

    identity = run_identity(cfg, strategy_name, ctx.world_size, DATA_DIR / TENSORS)
    key = identity.key
    ckpt = Checkpointer(CHECKPOINTS / strategy_name, ctx.rank, ctx.world_size, par.writer, key)
    progress = resume(cfg, ckpt, training, ctx, strategy_name, identity)
    out_dir = RESULTS / strategy_name
    tracker = open_tracker(cfg, strategy_name, ctx, par, key, progress.history)

    def save(at: Position) -> None:
        state = {
            "model": par.module.state_dict(),
            "optimizer": optimizer.state_dict(),
            "rng": rng_state(device),
            "train_totals": progress.totals,
            "grad_scaler": prec.scaler.state_dict() if prec.scaler is not None else None,
        }
        record = {
            "history": [r.to_record() for r in progress.history],
            "run_id": tracker.run_id,
            "identity": identity.to_record(),
        }

        def written() -> None:  # this rank's file is on disk, the commit still pending
            if fault is not None:
                fault.fire_if("checkpoint", ctx.rank, at.epoch, at.step)

        ckpt.save(at, state, record, on_written=written)

    if fault is not None:
        fault.fire_if("start", ctx.rank)
    history = progress.history
    start = time.perf_counter() - (history[-1].wall_seconds if history else 0.0)
    mem_devices = memory.local_devices(par.devices, ctx)
    ok = False
    try:
        for epoch in range(progress.position.epoch, cfg.train.epochs):
            memory.reset_peaks(mem_devices)
            t0 = time.perf_counter()
            first_step = progress.position.step if epoch == progress.position.epoch else 0
            stopped_at = train_epoch(
                par,
                optimizer,
                loader,
                prec,
                loss_fn,
                cfg,
                epoch,
                first_step,
                progress.totals,
                stop,
                fault,
                ctx.rank,
                progress=par.writer and sys.stderr.isatty(),
            )
            if stopped_at is not None:
                save(Position(epoch, stopped_at))
                if par.writer:
                    print(
                        f"train[{strategy_name}]: SIGTERM: checkpointed at epoch {epoch + 1} "
                        f"step {stopped_at}; `dvc repro` resumes from there",
                        flush=True,
                    )
                tracker.publish(history, status=KILLED)
                ok = True
                return None
            wait_for_device(device)
            seconds = time.perf_counter() - t0
            if fault is not None:
                fault.fire_if("eval", ctx.rank, epoch + 1)
            train_loss, train_acc = reduce_totals(progress.totals, ctx)
            progress.totals.zero_()
            test_loss, test_acc = reduce_totals(evaluate(par, data, loader, prec, cfg, device), ctx)
            # peaks of the epoch's training and evaluation, every device, on every rank
            peaks = memory.gather_peaks(memory.read_peaks(mem_devices, ctx), ctx)
            history.append(
                EpochRow(
                    epoch + 1,
                    train_loss,
                    train_acc,
                    test_loss,
                    test_acc,
                    seconds,
                    samples_per_s=n_train / seconds,
                    wall_seconds=time.perf_counter() - start,
                    ended_at=time.time(),
                    memory=memory.epoch_metrics(peaks),
                )
            )
            if cfg.checkpoint.every_epochs and (
                (epoch + 1) % cfg.checkpoint.every_epochs == 0 or epoch + 1 == cfg.train.epochs
            ):
                save(Position(epoch + 1, 0))
            tracker.publish_soon(history)
            if par.writer:
                print(
                    f"train[{strategy_name}] epoch {epoch + 1}/{cfg.train.epochs}: "
                    f"loss {train_loss:.4f} train_acc {train_acc:.4f} test_acc {test_acc:.4f} "
                    f"{seconds:.2f}s {n_train / seconds:.0f} samples/s",
                    flush=True,
                )
        if fault is not None:
            fault.fire_if("end", ctx.rank)
        state = par.state_dict()  # a collective for sharded/split models: every rank calls it
        summary = summarize(history, strategy_name, ctx, par, n_train)
        if par.writer:
            summary.fingerprint = key
            out_dir.mkdir(parents=True, exist_ok=True)
            write_results(out_dir, state, history, summary, to_yaml(cfg))
            tracker.publish(
                history,
                [out_dir / name for name in ARTIFACTS],
                status=FINISHED,
                wait_s=cfg.mlflow.final_sync_wait_s,
            )
        ok = True
        return summary
    finally:
        tracker.stop_system_metrics()
        if not ok:  # an error: whatever epochs finished still reach MLflow
            tracker.publish(history, status=FAILED)


def resume(
    cfg: Config,
    ckpt: Checkpointer,
    training: Training,
    ctx: DistContext,
    strategy_name: str,
    identity: RunIdentity,
) -> Progress:
    """Restore the last committed checkpoint of this run's identity (or of
    checkpoint.resume_from) into the model, optimizer, RNGs and scaler; a fresh start
    when there is none, saying why a checkpoint there was not this run's."""
    par, prec, _, optimizer, _ = training
    device = ctx.device
    progress = Progress(Position(0, 0), [], torch.zeros(3, device=device, dtype=torch.float64))
    source, found = ckpt, ckpt.latest()
    if found is None and cfg.checkpoint.resume_from:
        source = Checkpointer.foreign(Path(cfg.checkpoint.resume_from), ctx.rank, ctx.world_size)
        found = source.latest()
    if found is None:
        other = ckpt.other_run()
        if other is not None and par.writer:
            print(
                f"train[{strategy_name}]: not resuming {ckpt.directory}: "
                f"{identity.difference(other.get('identity'))}; training from scratch",
                flush=True,
            )
        return progress
    position, record = found
    state = source.load(position)
    load_model_state(par.module, state["model"], source.directory)
    load_optimizer_state(optimizer, state["optimizer"])
    set_rng_state(state["rng"], device)
    if prec.scaler is not None and state.get("grad_scaler"):
        prec.scaler.load_state_dict(state["grad_scaler"])  # fp16: the loss scale it reached
    if par.writer:
        print(
            f"train[{strategy_name}]: resuming at epoch {position.epoch + 1} step "
            f"{position.step} from {source.directory}",
            flush=True,
        )
    return Progress(
        position,
        [EpochRow.from_record(r) for r in record["history"]],
        state["train_totals"].to(device),
    )


def open_tracker(
    cfg: Config,
    strategy_name: str,
    ctx: DistContext,
    par: Parallel,
    key: str,
    history: list[EpochRow],
) -> Tracker | NullTracker:
    """The writer's MLflow run (a resumed run continues the same one), its system metrics
    started; NullTracker on the other ranks, so the loop never asks `if rank == 0`."""
    if not par.writer:
        return NullTracker()
    tags = {
        **base_tags(),
        "strategy": strategy_name,
        "world_size": str(ctx.world_size),
        "backend": ctx.backend if ctx.world_size > 1 else "none",
        "devices": ",".join(par.devices),
        "gpus": ",".join(ctx.gpus) or "cpu",
        "batch_split": "+".join(map(str, par.batch_split)),
        "dvc_stage": f"train@{strategy_name}",
        "parallel_lab_fingerprint": key,  # what results/<strategy>/metrics.json calls the run
        # MLflow's run description: what the comparison must be read with
        "mlflow.note.content": "\n".join(par.notes),
        **gpu_tags(ctx.gpus),
    }
    params = {
        **flatten(cfg),
        "strategy": strategy_name,
        "world_size": ctx.world_size,
        "effective_lr": effective_lr(cfg.train),
        **par.params,
    }
    tracker = Tracker(
        CHECKPOINTS / strategy_name / RUN_RECORD,
        cfg.mlflow.experiment,
        strategy_name,
        tags,
        params,
        key,
    )
    tracker.publish(history)
    tracker.start_system_metrics(
        cfg.report.system_metrics_interval_s, gpu_uuids(ctx.gpus), resume=bool(history)
    )
    for note in par.notes:
        print(f"train[{strategy_name}]: note: {note}", flush=True)
    return tracker


def summarize(
    history: list[EpochRow], strategy: str, ctx: DistContext, par: Parallel, n_train: int
) -> RunSummary:
    last = history[-1]
    seconds = [r.epoch_seconds for r in history]
    return RunSummary(
        strategy=strategy,
        world_size=ctx.world_size,
        devices=par.devices,
        batch_split=par.batch_split,
        epochs=len(history),
        test_acc=last.test_acc,
        best_test_acc=max(r.test_acc for r in history),
        test_loss=last.test_loss,
        train_loss=last.train_loss,
        epoch_seconds=last.epoch_seconds,
        samples_per_s=last.samples_per_s,
        total_seconds=last.wall_seconds,
        warmup_epoch_seconds=warmup_seconds(seconds),
        steady_epoch_seconds=steady_seconds(seconds),
        steady_samples_per_s=n_train / steady_seconds(seconds),
        memory=memory.run_summary([r.memory for r in history]),
        notes=par.notes,
    )
