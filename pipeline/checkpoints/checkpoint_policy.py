"""When a run checkpoints, and where it starts again: the resume of the last committed
checkpoint of this very run (or of checkpoint.resume_from), and the saves every
`checkpoint.every_epochs`, at the end and on SIGTERM. Checkpoint files themselves:
checkpoint.py. What the run decided at its start (its strategy's `at_start`) travels with its
checkpoints, and beside them in decided.json from the moment it is decided."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from pipeline.checkpoints.checkpoint import Checkpointer, Position, rng_state, sharded_state
from pipeline.checkpoints.identity import RunIdentity
from pipeline.config import CheckpointConfig
from pipeline.context import DistContext
from pipeline.files import atomic_write
from pipeline.interrupts.faults import Hooks
from pipeline.numerics.build import Training
from pipeline.numerics.totals import Totals
from pipeline.results import RESULTS, EpochRow
from pipeline.strategies.base import Decided

DECIDED = "decided.json"  # beside the checkpoints: what the run decided at its start


@dataclass
class Progress:
    """Where the run stands: what a checkpoint saves and a resume restores."""

    position: Position  # the next (epoch, step) to train
    history: list[EpochRow]  # the epochs finished
    totals: Totals  # the epoch's so far, on the device
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
    # from them.
    epoch_seconds: float = 0.0


class CheckpointPolicy:
    def __init__(
        self,
        options: CheckpointConfig,
        epochs: int,
        ckpt: Checkpointer,
        identity: RunIdentity,
        ctx: DistContext,
    ):
        """`ckpt`: the run's checkpoints, as this rank reads and writes them."""
        self.options, self.epochs, self.identity, self.ctx = options, epochs, identity, ctx
        self.ckpt = ckpt

    def due(self, epochs_done: int) -> bool:
        """Whether the end of this epoch is checkpointed: every N epochs, and always the last
        (what publish and a rerun read the finished run from), every_epochs 0 included."""
        every = self.options.every_epochs
        return epochs_done == self.epochs or (every > 0 and epochs_done % every == 0)

    def resume(self, training: Training, say: Callable[[str], None]) -> tuple[Training, Progress]:
        """The run as it starts again, and where: `training` restored (`restored`), then its
        strategy's own last step before training (`Training.started`), which takes what the
        run decided at its start where a checkpoint, or this run's first attempt, kept it.
        What it decided goes into the progress (every checkpoint keeps it), and where it
        decided afresh beside the checkpoints at once: a torchrun restart before the first
        checkpoint goes on with the same run (and MLflow run, whose params hold it), so it
        takes it rather than deciding again."""
        # an earlier attempt of this very run (this identity), restarted by torchrun, may have
        # decided before it checkpointed anything
        kept = self.first_attempt_decided() if self.ctx.restart > 0 else None
        progress = self.restored(training, say, kept)
        training, decided = training.started(progress.decided, say)
        afresh = progress.decided is None and decided is not None
        # what this run's strategy decided (a kept value, handed back): what every checkpoint
        # keeps and the MLflow params hold (recorder.py); None where it decides nothing
        progress.decided = decided
        if afresh and self.ckpt.writer:
            self.ckpt.directory.mkdir(parents=True, exist_ok=True)
            record = {"fingerprint": self.identity.key, "decided": decided}
            atomic_write(self.ckpt.directory / DECIDED, json.dumps(record, indent=1))
        return training, progress

    def first_attempt_decided(self) -> Optional[Decided]:
        """What an earlier attempt of this very run (this identity) decided at its start and
        kept beside its checkpoints (`resume`); None where there is nothing of it."""
        try:
            kept = json.loads((self.ckpt.directory / DECIDED).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return kept.get("decided") if kept.get("fingerprint") == self.identity.key else None

    def restored(
        self, training: Training, say: Callable[[str], None], kept: Optional[Decided]
    ) -> Progress:
        """Restore the last committed checkpoint of this run's identity (or of
        checkpoint.resume_from) into the model, optimizer, RNGs and scaler; a fresh start
        when there is none, saying why a checkpoint there was not this run's. `kept`: what
        a fresh start takes as decided (`first_attempt_decided`)."""
        device = self.ctx.device
        found = self.ckpt.to_resume(self.options.resume_from, self.identity.strategy)
        if found is None:
            other = self.ckpt.other_run()
            if other is not None:
                say(
                    f"not resuming {self.ckpt.directory}: "
                    f"{self.identity.difference(other.get('identity'))}; training from scratch"
                )
            return Progress(Position(0, 0), [], Totals.zeros(device), decided=kept)
        source, position, record = found
        state = source.restore(position, training.run.module, training.optimizer, device)
        scaler = training.prec.scaler
        if scaler is not None and state.get("grad_scaler"):
            scaler.load_state_dict(state["grad_scaler"])  # fp16: the loss scale it reached
        saved_by = source.saved_world_size()
        resharded = ""
        # the record is this code's: its own run's, or resume_from's, which refuses an older one
        notes = list(record["notes"])
        if saved_by != self.ctx.world_size:
            # another world size: checkpoint.resume_from, or a strategy that computes the same
            # at any world size
            resharded = f" (saved by {saved_by} process(es), resharded over {self.ctx.world_size})"
            notes.append(
                f"world size {saved_by} -> {self.ctx.world_size} at epoch {position.epoch + 1} "
                f"step {position.step}: resumed from a checkpoint of {saved_by} process(es), "
                "resharded"
            )
        if position.epoch >= self.epochs:
            # its last checkpoint is its end: the rerun trains nothing and writes what it had
            say(
                f"already trained: all {self.epochs} epoch(s) are in {source.directory}, its "
                f"results in {RESULTS / self.identity.strategy}/ (nothing to train)"
            )
        else:
            say(
                f"resuming at epoch {position.epoch + 1} step {position.step} from "
                f"{source.directory}{resharded}"
            )
        return Progress(
            position,
            [EpochRow.from_record(r) for r in record["history"]],
            Totals(state["train_totals"].to(device)),  # checkpoint_files.py checked it
            notes,
            record["decided"],
            record["wall_seconds"],
            record["epoch_seconds"],
        )

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
            "train_totals": progress.totals.tensor,
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
