"""Atomic checkpoints that resume a run at the exact step it stopped.

Layout, under checkpoints/<strategy>/:
    e<epoch>-s<step>/             one checkpoint (a "-1" suffix when it replaces a committed
                                  one at the same position, e.g. a SIGTERM right after a resume)
        .metadata, __<r>_0.distcp the model and optimizer state, written by
                                  torch.distributed.checkpoint (DCP) under the plain model's
                                  parameter names: each rank writes its shard (FSDP), its stage
                                  (pipeline_parallel) or, for state every rank holds alike,
                                  rank 0 writes the one copy
        rank<r>.pt                this rank's own state: RNG states, the epoch's partial
                                  [loss_sum, correct, count] totals, the fp16 grad scaler
    latest.json                   the commit record: which (epoch, step) is complete, in which
                                  directory, the run's identity (identity.py), its fingerprint
    decided.json                  what the run decided at its start (its strategy's
                                  `at_start`), written at once (checkpoint_policy.py): a
                                  torchrun restart before the first checkpoint takes it

Every rank writes its part (DCP's shards and metadata, then its own file, write-then-rename),
a barrier makes sure all of them are on disk, and only then does the writer replace
latest.json (again write-then-rename) and delete every other checkpoint directory. A crash at
any point leaves latest.json naming a complete checkpoint: a save never writes into the
directory latest.json names. The data order needs no state: it is a function of (seed,
epoch), so (epoch, step) is enough to continue on exactly the same samples; on the CPU a
resumed run is bitwise identical to an uninterrupted one.

Model and optimizer state go through torch.distributed.checkpoint.state_dict
(get/set_model_state_dict, get/set_optimizer_state_dict with flattened optimizer state): the
names are the plain model's whatever wraps it (DDP's "module." is dropped), FSDP's DTensor
parameters and their momentum are saved as the shards they are, with their global shape, and
loaded by each rank as the slice its own (possibly uneven) shard covers. That loading does not
depend on how the saving job sharded them, so the files themselves reshard to another world
size. Each rank reads its own file; at another world size (checkpoint.resume_from: a run's
identity includes its world size, see identity.py) a rank the saving job did not have reads
rank 0's, and rank 0 carries the epoch's partial totals of every saved rank (`restore`).

BatchNorm statistics of data-parallel ranks without sync_bn drift apart within an epoch (each
normalises its own shard); the checkpoint keeps rank 0's, the writer's: those are the ones
every rank takes before each evaluation (`writer_buffers`) and that model.pt holds, so a
resumed run's results are the uninterrupted run's.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from pipeline.checkpoints.checkpoint_files import (
    check_shards,
    dcp_failure,
    read_metadata,
    read_rank_state,
)
from pipeline.errors import UserError, disk_full, out_of_space
from pipeline.files import atomic_write
from pipeline.results import CHECKPOINT_RECORD, OLDER, is_older, read_checkpoint_record

MODEL, OPTIMIZER = "model", "optimizer"  # the two sections of the DCP state
# Optimizer state keyed by parameter name ("state.<name>.momentum_buffer",
# "param_groups.<name>.lr"): pipeline stages hold different parameters and so different
# param_groups, which flattening keeps apart.
OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
STEP_DIR = "e{epoch}-s{step}"
STEP_DIR_NAME = re.compile(r"e\d+-s\d+(-1)?")  # a step directory, replacing another or not


@dataclass(frozen=True)
class Position:
    epoch: int  # 0-based epoch to continue in
    step: int  # first optimizer step of that epoch still to run


def _cpu(value: Any) -> Any:
    """Detach to CPU, recursively through containers (a rank's own state: plain tensors)."""
    if isinstance(value, DTensor):
        value = value.to_local()
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu(v) for v in value)
    return value


def sharded_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The model's and optimizer's state as DCP saves it: live tensors (DTensor shards where
    sharded), under the plain model's names. Collective where the module is sharded.

    An optimizer that has not stepped yet has no state to save (SGD's momentum buffers start
    with the first step); get_optimizer_state_dict would make some up by stepping it once at
    lr 0, which leaves momentum buffers of weight_decay * p, not the first step's gradient."""
    state: dict[str, Any] = {MODEL: get_model_state_dict(module, options=OPTIONS)}
    if optimizer.state:
        state[OPTIMIZER] = get_optimizer_state_dict(module, optimizer, options=OPTIONS)
    return state


def load_sharded(
    directory: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer, where: Path
) -> None:
    """Load a DCP checkpoint's model and optimizer state into the live (possibly wrapped,
    sharded or staged) module and its optimizer. Collective: every rank calls it. `where`
    names the checkpoint in errors."""
    saved = read_metadata(directory, where).state_dict_metadata
    model = get_model_state_dict(module, options=OPTIONS)
    _check_model(model, saved, where)
    state: dict[str, Any] = {MODEL: model}
    # the same answer on every rank: the metadata is the whole checkpoint's
    has_optimizer = any(key.startswith(f"{OPTIMIZER}.") for key in saved)
    if has_optimizer:
        state[OPTIMIZER] = get_optimizer_state_dict(module, optimizer, options=OPTIONS)
    try:
        dcp.load(state, checkpoint_id=directory)
    except CheckpointException as err:  # raised on every rank alike
        raise dcp_failure(err, directory, where) from None
    set_model_state_dict(module, state[MODEL], options=OPTIONS)
    if has_optimizer:
        set_optimizer_state_dict(module, optimizer, state[OPTIMIZER], options=OPTIONS)


def _check_model(model: dict[str, Any], saved: dict[str, Any], where: Path) -> None:
    """Refuse, in one line, a checkpoint of another model before DCP reads it (its own
    errors arrive wrapped in a CheckpointException of every rank's tracebacks)."""
    missing = sorted(key for key in model if f"{MODEL}.{key}" not in saved)
    if missing:
        raise UserError(
            f"{where}: state does not match this model (first differing key: "
            f"{missing[0]}); expected a checkpoint of the same model and strategy"
        )
    for key, tensor in model.items():
        meta = saved[f"{MODEL}.{key}"]
        if isinstance(meta, TensorStorageMetadata) and tuple(meta.size) != tuple(tensor.shape):
            raise UserError(
                f"{where}: {key} has shape {tuple(meta.size)}, the model here has "
                f"{tuple(tensor.shape)}; expected a checkpoint of this model.width and "
                "strategy"
            )


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class Checkpointer:
    def __init__(self, directory: Path, rank: int, world_size: int, writer: bool, key: str):
        self.directory, self.rank, self.world_size = directory, rank, world_size
        self.writer, self.key = writer, key

    @property
    def record_path(self) -> Path:
        return self.directory / CHECKPOINT_RECORD

    def _committed(self) -> dict[str, Any] | None:
        found = self.latest(any_config=True)
        return None if found is None else found[1]

    def step_dir(self, pos: Position) -> Path:
        """The directory of the checkpoint at `pos`: the committed one's, if it is at `pos`."""
        record = self._committed()
        if record is not None and (record["epoch"], record["step"]) == (pos.epoch, pos.step):
            name: str = record["directory"]
            return self.directory / name
        return self.directory / STEP_DIR.format(epoch=pos.epoch, step=pos.step)

    def _new_step_dir(self, pos: Position) -> Path:
        """Where a save at `pos` writes: never the committed checkpoint's directory."""
        name = STEP_DIR.format(epoch=pos.epoch, step=pos.step)
        record = self._committed()
        if record is not None and record.get("directory") == name:
            name += "-1"
        return self.directory / name

    def latest(self, any_config: bool = False) -> tuple[Position, dict[str, Any]] | None:
        """The committed position and record, if a checkpoint of this configuration (or, with
        any_config, of any configuration) exists."""
        record = read_checkpoint_record(self.directory)
        if record is None:
            return None
        if record.get("fingerprint") != self.key and not any_config:
            return None
        return Position(record["epoch"], record["step"]), record

    def other_run(self) -> dict[str, Any] | None:
        """The committed record when it belongs to another run (another identity)."""
        found = self.latest(any_config=True)
        return None if found is None or found[1].get("fingerprint") == self.key else found[1]

    @classmethod
    def foreign(cls, directory: Path, rank: int, world_size: int, strategy: str) -> Checkpointer:
        """Read-only view of another run's checkpoints (checkpoint.resume_from): of the same
        strategy, at any world size (its model and optimizer state reshard)."""
        found = cls(directory, rank, world_size, writer=False, key="").latest(any_config=True)
        if found is None:
            raise UserError(
                f"checkpoint.resume_from: {directory} holds no checkpoint "
                "(no latest.json); expected a checkpoints/<strategy> directory"
            )
        if is_older(found[1]):  # another machine's older copy: nothing to resume it with
            raise UserError(
                f"checkpoint.resume_from: {directory / CHECKPOINT_RECORD}: {OLDER}; expected a "
                "checkpoint of this one (or checkpoint.resume_from=null to train from scratch)"
            )
        saved_by = found[1]["identity"]["strategy"]
        if saved_by != strategy:
            raise UserError(
                f"checkpoint.resume_from: {directory} was saved by strategy {saved_by!r}, "
                f"this run is {strategy!r}; expected a checkpoint of the same strategy"
            )
        return cls(directory, rank, world_size, writer=False, key=found[1]["fingerprint"])

    def to_resume(
        self, resume_from: str | None, strategy: str
    ) -> tuple[Checkpointer, Position, dict[str, Any]] | None:
        """Where a run resumes: its own committed checkpoint (this identity's), else the one
        in `resume_from` (checkpoint.resume_from, read-only; None: none), as (the checkpoints'
        view, position, record). None: nowhere, the run starts afresh."""
        found = self.latest()
        if found is not None:
            return (self, *found)
        if not resume_from:
            return None
        source = Checkpointer.foreign(Path(resume_from), self.rank, self.world_size, strategy)
        found = source.latest()
        assert found is not None  # `foreign` refuses a directory without one
        return (source, *found)

    def restore(
        self,
        pos: Position,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
    ) -> dict[str, Any]:
        """The checkpoint at `pos` into `module`, `optimizer` and this process's RNGs
        (collective), after every file of it is checked alike on every rank; returns this
        rank's own state. Its `train_totals` are the epoch's partial totals: at another world
        size than the saving job's, rank 0 carries all of them and the other ranks none (they
        are only ever summed over ranks)."""
        self.verify(pos)
        state = self.load(pos)
        # through torch.distributed.checkpoint: each rank reads its shard, stage or replica
        self.load_sharded(pos, module, optimizer)
        set_rng_state(state["rng"], device)
        saved_by = self.saved_world_size()
        if saved_by != self.world_size:
            totals = torch.zeros_like(state["train_totals"])
            if self.rank == 0:
                for rank in range(saved_by):
                    totals += self.load(pos, rank)["train_totals"]
            state["train_totals"] = totals
        return state

    def saved_world_size(self) -> int:
        """How many processes wrote the committed checkpoint."""
        record = self._committed()
        assert record is not None  # only a resume asks, of the checkpoint it found
        return int(record["world_size"])

    def load(self, pos: Position, rank: int | None = None) -> dict[str, Any]:
        """A rank's own state (RNG, partial totals, scaler) of the checkpoint at `pos`: this
        rank's, or, where the checkpoint was saved by fewer processes, rank 0's."""
        step_dir = self.step_dir(pos)
        if rank is None:
            rank = self.rank if self.rank < self.saved_world_size() else 0
        return read_rank_state(step_dir / f"rank{rank}.pt", self.directory, self.record_path)

    def verify(self, pos: Position) -> None:
        """Every file of the checkpoint at `pos` reads, checked the same way on every rank
        before any of them loads from it (checkpoint_files.py says why)."""
        for rank in range(self.saved_world_size()):
            self.load(pos, rank)
        step_dir = self.step_dir(pos)
        check_shards(step_dir, read_metadata(step_dir, self.directory), self.directory)

    def load_sharded(
        self, pos: Position, module: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        """The checkpoint's model and optimizer state into `module` and `optimizer`.
        Collective."""
        load_sharded(self.step_dir(pos), module, optimizer, self.directory)

    def save(
        self,
        pos: Position,
        state: dict[str, Any],
        record: dict[str, Any],
        on_written: Callable[[], None] | None = None,
        sharded: dict[str, Any] | None = None,
    ) -> None:
        """Collective: every rank calls it at the same position. `state`: this rank's own
        (plain tensors and numbers); `sharded`: what DCP saves (see `sharded_state`)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self._new_step_dir(pos)  # every rank reads the same record: none commits yet
        if self.writer and target.exists():
            shutil.rmtree(target)  # left by a save that never committed
        _barrier()
        target.mkdir(exist_ok=True)
        try:
            if sharded is not None:
                # state every rank holds alike is written once, by rank 0 (the writer of
                # data-parallel runs, whose BatchNorm statistics are the ones that count)
                dcp.save(
                    sharded,
                    checkpoint_id=target,
                    planner=DefaultSavePlanner(dedup_save_to_lowest_rank=True),
                )
            atomic_write(target / f"rank{self.rank}.pt", lambda t: torch.save(_cpu(state), t))
        except BaseException as err:  # torch's CheckpointException is not an Exception
            full = out_of_space(err, target)  # read before the space below is given back
            # the half-written checkpoint goes at once; the last complete one stays what the
            # record names
            if self.writer:
                shutil.rmtree(target, ignore_errors=True)
            if full is not None:  # said as what it is, whatever torch's writer raised
                raise disk_full(self.directory) from err
            raise
        if on_written is not None:
            on_written()
        _barrier()
        if self.writer:
            body = {
                **record,
                "fingerprint": self.key,
                "epoch": pos.epoch,
                "step": pos.step,
                "directory": target.name,
                "world_size": self.world_size,
            }
            atomic_write(self.record_path, json.dumps(body, indent=1))
            self._remove_all_but(target)
        _barrier()

    def _remove_all_but(self, keep: Path) -> None:
        """Every other checkpoint: the one replaced, those of saves that never committed, and
        files of the earlier one-file-per-rank layout (a run trains from scratch over an older
        parallel-lab's checkpoints, never reading them: none is left behind)."""
        for path in self.directory.iterdir():
            if path == keep:
                continue
            if path.is_dir() and STEP_DIR_NAME.fullmatch(path.name):
                shutil.rmtree(path, ignore_errors=True)
            elif re.fullmatch(r"rank\d+-e\d+-s\d+\.pt", path.name):
                path.unlink(missing_ok=True)


def rng_state(device: torch.device) -> dict[str, Any]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
