"""What a run leaves behind: its history of epochs (results/<strategy>/history.csv grows
with each, so `dvc plots` shows a run in progress), the MLflow run (continued on a resume),
the per-epoch line in the log, and at the end results/<strategy>/ and the summary. One per
process; only the strategy's writer rank keeps an MLflow run and writes files, the others
record nothing, so the epoch loop never asks `if rank == 0`. Nothing here talks to MLflow: the
writer keeps the run's record on disk (run.json) and appends its live figures to the stage's
stream, which the stage's publisher process pushes (tracking/publisher.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from pipeline import memory
from pipeline.checkpoints.checkpoint import Position
from pipeline.checkpoints.checkpoint_policy import Progress
from pipeline.config import effective_lr
from pipeline.context import DistContext
from pipeline.files import atomic_write
from pipeline.numerics.build import Training
from pipeline.results import (
    CHECKPOINTS,
    HISTORY,
    RESULTS,
    RUN_RECORD,
    EpochRow,
    RunSummary,
    history_csv,
    speed_figures,
    write_results,
)
from pipeline.run_spec import RunSpec
from pipeline.strategies.base import decided_params
from pipeline.timeline import mark
from pipeline.tracking import stream
from pipeline.tracking.mlflow_run import (
    FAILED,
    KILLED,
    mark_status,
    new_record,
    open_record,
    read_record,
)
from pipeline.tracking.provenance import base_tags, gpu_tags, gpu_uuids


def writer_log(name: str, writer: bool) -> Callable[[str], None]:
    """Lines in the stage's log, `train[<name>]: ...`, from the writer rank only."""

    def say(text: str) -> None:
        if writer:
            print(f"train[{name}]: {text}", flush=True)

    return say


def _tag(value: Any) -> str:
    """A tag's text: true/false for a flag, as params.yaml writes it."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def shared_note(shared: dict[str, int], processes: bool) -> Optional[str]:
    """What a run whose ranks (`processes`; else DataParallel's replicas) shared GPUs says of
    its figures; None where none shared."""
    if not shared:
        return None
    who = "ranks" if processes else "replicas"
    on = ", ".join(f"{n} on GPU {gpu}" for gpu, n in shared.items())
    return (
        f"shared-device: its {who} shared GPUs ({on}; devices names a GPU more than once): "
        f"each {who[:-1]}'s memory is its own and real, but they took turns on one device, "
        "so its time is no speed: no throughput, speedup or time to target is ranked from it"
    )


class RunRecorder:
    def __init__(
        self,
        spec: RunSpec[Any],
        ctx: DistContext,
        training: Training,
        key: str,
        progress: Progress,
        live: Path | None = None,
    ):
        """`key`: the run identity's; `progress`: where the run starts, its history the
        epochs a resumed run already finished (the list the epochs go on adding to);
        `live`: the stage's stream (tracking/stream.py), where the launcher's publisher
        follows the run; None: a worker started by hand, whose run `python -m
        pipeline.publish` pushes."""
        # A new MLflow run where training starts from scratch, but not for torchrun
        # restarting this job's workers (the stage's same attempt, whose run a failed rank
        # may have ended)
        self.fresh = progress.position == Position(0, 0) and ctx.restart == 0
        self.shared = ctx.shared(training.run.devices)  # ranks that took turns on a GPU
        self.gpus = ctx.physical_gpus(training.run.devices)  # the run's, not every one it sees
        # the strategy's notes and the precision's, then what happened to this run on its way
        shared = shared_note(self.shared, ctx.world_size > 1)
        self.notes = [*training.notes, *([shared] if shared else []), *progress.notes]
        self.spec, self.name, self.ctx, self.training = spec, spec.name, ctx, training
        self.key, self.history, self.decided = key, progress.history, progress.decided
        self.epochs = spec.train.epochs
        self.config_yaml = spec.config_yaml  # what it ran with, no other strategy's section
        self.writer = training.run.writer
        self.say = writer_log(self.name, self.writer)
        self.record_path = CHECKPOINTS / self.name / RUN_RECORD
        self.live = live if self.writer else None  # the writer's alone
        if self.writer:
            self._open_run()
        if self.history:  # a resumed run's epochs, back in the plot DVC removed before the stage
            self._write_history()

    def _open_run(self) -> None:
        """run.json (a resumed run continues the same MLflow run), then the stream's head:
        from there on the stage's publisher pushes the run. A torchrun restart's writer finds
        the stream opened and goes on with the same run."""
        # a run resumed at its end trains nothing: no samples of it in the finished run
        trains = len(self.history) < self.epochs
        # how to read the figures of what trains now; a finished run run again trains
        # nothing, and its one line says so (checkpoint_policy.py)
        for note in self.notes if trains else ():
            self.say(f"note: {note}")
        if self.live is not None and stream.opened(self.live):
            return
        run, ctx, gpus = self.training.run, self.ctx, self.gpus
        tags = {
            **base_tags(),
            "strategy": self.name,
            "world_size": str(ctx.world_size),
            "backend": ctx.backend if ctx.world_size > 1 else "none",
            "devices": ",".join(run.devices),
            "gpus": ",".join(gpus.values()) or "cpu",
            "batch_split": "+".join(map(str, run.batch_split)),
            # "0:2": two ranks took turns on GPU 0, so the run's time is no speed
            "shared_devices": ",".join(f"{g}:{n}" for g, n in self.shared.items()) or "none",
            "dvc_stage": f"train@{self.name}",
            "parallel_lab_fingerprint": self.key,  # what results/<strategy>/summary.json calls it
            # the speed options as they applied (build.speed_features), for MLflow's filters
            **{f"speed.{k}": _tag(v) for k, v in self.training.features.items()},
            # MLflow's run description: what the comparison must be read with
            "mlflow.note.content": "\n".join(self.notes),
            **gpu_tags(gpus),
        }
        spec = self.spec
        params: dict[str, Any] = {
            **spec.params,  # what it ran with: no other strategy's section
            "strategy": self.name,
            "world_size": ctx.world_size,
            "effective_lr": effective_lr(spec.train),
            **decided_params(self.decided),  # what its strategy decided at its start
        }
        new = new_record(self.key, spec.mlflow.experiment, self.name, tags, params)
        open_record(self.record_path, new, self.fresh)
        if self.live is not None:
            interval = spec.report.system_metrics_interval_s if trains else None
            head = stream.Head(self.key, interval, gpu_uuids(gpus), bool(self.history))
            stream.open_stream(self.live, head)

    @property
    def run_id(self) -> str | None:
        """The run's MLflow id as the publisher recorded it so far (None: not created yet,
        or a rank that does not write)."""
        if not self.writer:
            return None
        run_id: str | None = read_record(self.record_path).get("run_id")
        return run_id

    def log_steps(self, step: int, metrics: dict[str, float], timestamp_ms: int) -> None:
        """A step-level point (`step_train_loss`, ...) at MLflow step `step`: a live view for
        the publisher to send, never kept."""
        if self.live is not None:
            stream.steps(self.live, step, metrics, timestamp_ms)

    def epoch_done(self, row: EpochRow) -> None:
        """`row` is in the history already (a checkpoint may have saved it): history.csv,
        the stream (the publisher pushes it at once), the log line."""
        self._write_history()
        if self.live is not None:
            stream.epoch_ended(self.live, row)
        if self.writer:
            print(
                f"train[{self.name}] epoch {row.epoch}/{self.epochs}: loss {row.train_loss:.4f} "
                f"train_acc {row.train_acc:.4f} test_acc {row.test_acc:.4f} "
                f"{row.epoch_seconds:.2f}s {row.samples_per_s:.0f} samples/s"
                + (" (warm-up)" if row.warmup else "")
                + (f" (resumed at step {row.resumed_at_step})" if row.resumed_at_step else ""),
                flush=True,
            )

    def _write_history(self) -> None:
        """results/<strategy>/history.csv with the epochs so far, atomically: `dvc plots` may
        read it at any moment. The end of the run writes it once more, with the rest."""
        if self.writer:
            out_dir = RESULTS / self.name
            out_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(out_dir / HISTORY, history_csv(self.history))

    def stopped(self) -> None:
        """A SIGTERM checkpoint: the run ends KILLED, to be resumed (the launcher tells the
        publisher so; a worker started by hand keeps it in run.json)."""
        self._ended(KILLED)

    def failed(self) -> None:
        """An error: the run ends FAILED, its finished epochs kept."""
        self._ended(FAILED)

    def _ended(self, status: str) -> None:
        if self.writer and self.live is None:
            mark_status(self.record_path, status)
            self._kept_by_hand()

    def _kept_by_hand(self) -> None:
        """A worker started by hand has no publisher: where its run waits, and what pushes it."""
        self.say(
            f"MLflow: {self.record_path} keeps the run; `python -m pipeline.publish` pushes it"
        )

    def finish(self, state: dict[str, Any]) -> RunSummary:
        """results/<strategy>/ from the full model's `state`: the publisher pushes them."""
        summary = self.summary()
        if self.writer:
            summary.fingerprint = self.key
            out_dir = RESULTS / self.name
            out_dir.mkdir(parents=True, exist_ok=True)
            write_results(out_dir, state, self.history, summary, self.config_yaml)
            mark("results written")
            if self.live is None:
                self._kept_by_hand()
        return summary

    def summary(self) -> RunSummary:
        history, run = self.history, self.training.run
        last = history[-1]
        return RunSummary(
            strategy=self.name,
            world_size=self.ctx.world_size,
            devices=run.devices,
            batch_split=run.batch_split,
            epochs=len(history),
            test_acc=last.test_acc,
            best_test_acc=max(r.test_acc for r in history),
            test_loss=last.test_loss,
            train_loss=last.train_loss,
            epoch_seconds=last.epoch_seconds,
            samples_per_s=last.samples_per_s,
            total_seconds=last.wall_seconds,
            # steady figures leave out every warm-up epoch (results.steady_rows), and a split
            # one always; where none is left they are None, speed_note saying why
            **speed_figures(history),
            speed_features=self.training.features.copy(),
            memory=memory.run_summary([r.memory for r in history]),
            notes=list(self.notes),
            shared_devices=dict(self.shared),
        )
