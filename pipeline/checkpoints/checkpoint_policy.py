"""When a run checkpoints, and where it starts again: the resume of the last committed
checkpoint of this very run (or of checkpoint.resume_from), and the saves every
`checkpoint.every_epochs`, at the end and on SIGTERM. Checkpoint files themselves:
checkpoint.py. What the run decided at its start (its strategy's `at_start`) travels with its
checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from pipeline.checkpoints.checkpoint import Checkpointer, Position, rng_state, sharded_state
from pipeline.checkpoints.identity import RunIdentity
from pipeline.config import CheckpointConfig
from pipeline.context import DistContext
from pipeline.interrupts.faults import Hooks
from pipeline.numerics.build import Training
from pipeline.results import EpochRow
from pipeline.strategies.base import Decided


@dataclass
class Progress:
    """Where the run stands: what a checkpoint saves and a resume restores."""

    position: Position  # the next (epoch, step) to train
    history: list[EpochRow]  # the epochs finished
    totals: torch.Tensor  # [loss_sum, correct, count] of the epoch so far, on the device
    # what happened to the run on its way that its results must be read with (e.g. the world
    # size changed at a resume); kept in every checkpoint after
    notes: list[str] = field(default_factory=list)
    # what the run decided at its start (its strategy's `at_start`; None: nothing yet); kept
    # in every checkpoint, so that a resume takes it instead of deciding again
    decided: Optional[Decided] = None
    # The run's clock at `position`: its training seconds so far (EpochRow.wall_seconds), up
    # to the stop for a SIGTERM's checkpoint. A resume goes on from it, so what a run counts
    # is the time its processes trained and checkpointed, up to its last checkpoint: not a
    # process's start-up, the time between a stop and the resume, nor (after a kill, which
    # saves nothing) the time since the last checkpoint.
    wall_seconds: float = 0.0
    # The position's epoch's training seconds before `position.step` (its steps 0..step-1,
    # in the processes that ran them, device synchronised): the resumed epoch's seconds start
    # from them. None: a checkpoint written before they were recorded.
    epoch_seconds: Optional[float] = 0.0


class CheckpointPolicy:
    def __init__(
        self,
        options: CheckpointConfig,
        epochs: int,
        directory: Path,
        identity: RunIdentity,
        ctx: DistContext,
        writer: bool,
    ):
        self.options, self.epochs, self.identity, self.ctx = options, epochs, identity, ctx
        self.writer = writer
        self.ckpt = Checkpointer(directory, ctx.rank, ctx.world_size, writer, identity.key)

    def due(self, epochs_done: int) -> bool:
        """Whether the end of this epoch is checkpointed: every N epochs, and always the last
        (what publish and a rerun read the finished run from), every_epochs 0 included."""
        every = self.options.every_epochs
        return epochs_done == self.epochs or (every > 0 and epochs_done % every == 0)

    def resume(self, training: Training, say: Callable[[str], None]) -> Progress:
        """Restore the last committed checkpoint of this run's identity (or of
        checkpoint.resume_from) into the model, optimizer, RNGs and scaler; a fresh start
        when there is none, saying why a checkpoint there was not this run's."""
        device = self.ctx.device
        found = self.ckpt.to_resume(self.options.resume_from, self.identity.strategy)
        if found is None:
            other = self.ckpt.other_run()
            if other is not None:
                say(
                    f"not resuming {self.ckpt.directory}: "
                    f"{self.identity.difference(other.get('identity'))}; training from scratch"
                )
            fresh = Progress(Position(0, 0), [], torch.zeros(3, device=device, dtype=torch.float64))
            # a torchrun restart with no checkpoint yet goes on with what its first attempt
            # decided (a new attempt of the stage starts a new run, which decides for itself)
            if self.ctx.restart > 0:
                fresh.decided = self.ckpt.first_attempt_decided()
            return fresh
        source, position, record = found
        state = source.restore(position, training.run.module, training.optimizer, device)
        scaler = training.prec.scaler
        if scaler is not None and state.get("grad_scaler"):
            scaler.load_state_dict(state["grad_scaler"])  # fp16: the loss scale it reached
        saved_by = source.saved_world_size()
        resharded = ""
        notes = list(record.get("notes", []))
        if saved_by != self.ctx.world_size:
            # another world size: checkpoint.resume_from, or a strategy that computes the same
            # at any world size
            resharded = f" (saved by {saved_by} process(es), resharded over {self.ctx.world_size})"
            notes.append(
                f"world size {saved_by} -> {self.ctx.world_size} at epoch {position.epoch + 1} "
                f"step {position.step}: resumed from a checkpoint of {saved_by} process(es), "
                "resharded"
            )
        say(
            f"resuming at epoch {position.epoch + 1} step {position.step} from "
            f"{source.directory}{resharded}"
        )
        history = [EpochRow.from_record(r) for r in record["history"]]
        # a record from before the clock was kept: the last finished epoch's wall time, and
        # no seconds for the steps of the position's epoch before it (none at its start)
        epoch_seconds = record.get("epoch_seconds", None if position.step else 0.0)
        if epoch_seconds is None:
            e, k = position.epoch + 1, position.step
            notes.append(
                f"resumed at epoch {e} step {k} from a checkpoint that did not record the time "
                f"trained before it: epoch {e}'s seconds and samples/s count steps {k}.. only, "
                "and the wall times leave out the time before the stop"
            )
        return Progress(
            position,
            history,
            state["train_totals"].to(device),
            notes,
            record.get("decided"),
            record.get("wall_seconds", history[-1].wall_seconds if history else 0.0),
            epoch_seconds,
        )

    def keep_decided(self, progress: Progress, decided: Optional[Decided]) -> None:
        """What the run just decided at its start, where it decided afresh: into `progress`
        (every checkpoint keeps it) and beside its checkpoints at once, for a torchrun restart
        before the first checkpoint, which goes on with the same run (and MLflow run, whose
        params hold it) and so takes it rather than deciding again."""
        if progress.decided is not None or decided is None:
            return
        progress.decided = decided
        self.ckpt.write_decided(decided)

    def save(
        self,
        at: Position,
        progress: Progress,
        training: Training,
        run_id: Any,
        hooks: Hooks = Hooks(),
    ) -> None:
        """Checkpoint `progress` at `at`; `hooks` hear of the point between this rank's file
        written and the checkpoint committed ("checkpoint")."""
        prec = training.prec
        state = {  # this rank's own; the model and optimizer go to DCP (`sharded`)
            "rng": rng_state(self.ctx.device),
            "train_totals": progress.totals,
            "grad_scaler": prec.scaler.state_dict() if prec.scaler is not None else None,
        }
        record = {
            "history": [r.to_record() for r in progress.history],
            "run_id": run_id,
            "identity": self.identity.to_record(),
            "notes": progress.notes,
            "decided": progress.decided,
            "wall_seconds": progress.wall_seconds,
            "epoch_seconds": progress.epoch_seconds,
        }

        def written() -> None:  # this rank's file is on disk, the commit still pending
            hooks.at("checkpoint", at.epoch, at.step)

        sharded = sharded_state(training.run.module, training.optimizer)
        self.ckpt.save(at, state, record, on_written=written, sharded=sharded)
