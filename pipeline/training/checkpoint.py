"""Atomic, per-rank checkpoints that resume a run at the exact step it stopped.

Layout, under checkpoints/<strategy>/:
    rank<r>-e<epoch>-s<step>.pt   this rank's state: its model shard/stage/replica, optimizer,
                                  scheduler and scaler state, RNG states, partial epoch totals
    latest.json                   the commit record: which (epoch, step) is complete, the
                                  run's identity (identity.py) and its fingerprint

Every rank writes its own file (write, then rename), a barrier makes sure all of them are on
disk, and only then does the writer replace latest.json (again write-then-rename) and delete
the previous set. A crash at any point leaves latest.json naming a complete set. The data
order needs no state: it is a function of (seed, epoch), so (epoch, step) is enough to
continue on exactly the same samples; on the CPU a resumed run is bitwise identical to an
uninterrupted one.

Sharded parameters (FSDP's DTensors) are saved as their local shards and copied back into the
live DTensors, so files load with `torch.load(weights_only=True)` and need no resharding (a
resume uses the same world size: the identity includes it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from pipeline.errors import UserError
from pipeline.files import atomic_write
from pipeline.results import CHECKPOINT_RECORD


@dataclass(frozen=True)
class Position:
    epoch: int  # 0-based epoch to continue in
    step: int  # first optimizer step of that epoch still to run


def _local(value: Any) -> Any:
    """Detach to CPU, DTensors as their local shard, recursively through containers."""
    if isinstance(value, DTensor):
        value = value.to_local()
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _local(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_local(v) for v in value)
    return value


def _copy_into(live: torch.Tensor, saved: torch.Tensor, name: str, path: Path) -> None:
    target = live.to_local() if isinstance(live, DTensor) else live
    if target.shape != saved.shape:
        raise UserError(
            f"{path}: {name} has shape {tuple(saved.shape)}, the model here has "
            f"{tuple(target.shape)}; expected a checkpoint of this model.width and "
            "strategy"
        )
    with torch.no_grad():
        target.copy_(saved)


def load_model_state(module: torch.nn.Module, saved: dict, path: Path) -> None:
    live = module.state_dict()
    missing = sorted(set(live) ^ set(saved))
    if missing:
        raise UserError(
            f"{path}: state does not match this model (first differing key: "
            f"{missing[0]}); expected a checkpoint of the same model and strategy"
        )
    for key, tensor in live.items():
        _copy_into(tensor, saved[key], key, path)


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    optimizer.load_state_dict(saved)
    # Optimizer state of sharded parameters must be sharded like them again.
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not isinstance(p, DTensor):
                continue
            state = optimizer.state.get(p, {})
            for key, value in state.items():
                if (
                    isinstance(value, torch.Tensor)
                    and not isinstance(value, DTensor)
                    and value.dim() > 0
                ):
                    state[key] = DTensor.from_local(value.to(p.device), p.device_mesh, p.placements)


class Checkpointer:
    def __init__(self, directory: Path, rank: int, world_size: int, writer: bool, key: str):
        self.directory, self.rank, self.world_size = directory, rank, world_size
        self.writer, self.key = writer, key

    @property
    def record_path(self) -> Path:
        return self.directory / CHECKPOINT_RECORD

    def _file(self, pos: Position, rank: int | None = None) -> Path:
        rank = self.rank if rank is None else rank
        return self.directory / f"rank{rank}-e{pos.epoch}-s{pos.step}.pt"

    def latest(self, any_config: bool = False) -> tuple[Position, dict] | None:
        """The committed position and record, if a checkpoint of this configuration (or, with
        any_config, of any configuration) exists."""
        try:
            record = json.loads(self.record_path.read_text())
        except FileNotFoundError:
            return None
        except json.JSONDecodeError:
            raise UserError(
                f"{self.record_path}: corrupt checkpoint record; delete "
                f"{self.directory} to start over"
            ) from None
        if record.get("fingerprint") != self.key and not any_config:
            return None
        return Position(record["epoch"], record["step"]), record

    def other_run(self) -> dict | None:
        """The committed record when it belongs to another run (another identity)."""
        found = self.latest(any_config=True)
        return None if found is None or found[1].get("fingerprint") == self.key else found[1]

    @classmethod
    def foreign(cls, directory: Path, rank: int, world_size: int) -> Checkpointer:
        """Read-only view of another run's checkpoints (checkpoint.resume_from)."""
        found = cls(directory, rank, world_size, writer=False, key="").latest(any_config=True)
        if found is None:
            raise UserError(
                f"checkpoint.resume_from: {directory} holds no checkpoint "
                "(no latest.json); expected a checkpoints/<strategy> directory"
            )
        if found[1].get("world_size") != world_size:
            raise UserError(
                f"checkpoint.resume_from: {directory} was saved by "
                f"{found[1].get('world_size')} process(es), this run has "
                f"{world_size}; expected the same world size"
            )
        return cls(directory, rank, world_size, writer=False, key=found[1]["fingerprint"])

    def load(self, pos: Position) -> dict:
        path = self._file(pos)
        try:
            return torch.load(path, weights_only=True, map_location="cpu")
        except FileNotFoundError:
            raise UserError(
                f"{path}: missing, but {self.record_path} names it; delete "
                f"{self.directory} to start over"
            ) from None

    def save(
        self, pos: Position, state: dict, record: dict, on_written: Callable[[], None] | None = None
    ) -> None:
        """Collective: every rank calls it at the same position."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._file(pos)
        atomic_write(path, lambda tmp: torch.save(_local(state), tmp))
        if on_written is not None:
            on_written()
        if dist.is_initialized():
            dist.barrier()
        if self.writer:
            previous = self.latest()
            body = {
                **record,
                "fingerprint": self.key,
                "epoch": pos.epoch,
                "step": pos.step,
                "world_size": self.world_size,
            }
            atomic_write(self.record_path, json.dumps(body, indent=1))
            if previous is not None and previous[0] != pos:
                for r in range(self.world_size):
                    self._file(previous[0], r).unlink(missing_ok=True)
        if dist.is_initialized():
            dist.barrier()


def rng_state(device: torch.device) -> dict:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
