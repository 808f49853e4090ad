"""Reading a committed checkpoint's files (checkpoint.py), each checked: a damaged one is bad
input, one line naming the file and the command that starts over, never a traceback.

Reading a checkpoint is collective on a job of several ranks: a rank that stopped at a damaged
file while the others went on to load would leave them waiting in a collective until it timed
out. So before any rank loads, every rank checks every file the same way (`verify`): each
rank's own file (small: RNG states, three totals, the loss scale), DCP's metadata, and that
each shard file holds every byte range the metadata names. They then all fail alike, or all
go on. What this cannot see (bytes changed inside a shard) DCP's load reports on every rank
alike, as one CheckpointException (`dcp_failure` words it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata

from pipeline.errors import UserError, first_sentence
from pipeline.numerics.totals import Totals
from pipeline.results import CHECKPOINT_RECORD


def start_over(directory: Path) -> str:
    """The one command that fixes a damaged checkpoint: the run then trains from scratch."""
    return f"delete {directory} to start over (rm -r {directory})"


def read_rank_state(path: Path, directory: Path, record_path: Path) -> dict[str, Any]:
    """A rank's own file (`rank<r>.pt`), as `Checkpointer.save` wrote it. `directory`: the
    strategy's checkpoints, which `record_path` (latest.json) commits."""
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise UserError(
            f"{path}: missing, but {record_path} names it; {start_over(directory)}"
        ) from None
    except Exception as err:  # noqa: BLE001 - whatever torch.load makes of a damaged file
        raise UserError(
            f"{path}: corrupt ({first_sentence(err)}); {start_over(directory)}"
        ) from None
    problem = _rank_state_problem(state)
    if problem is not None:
        raise UserError(f"{path}: corrupt ({problem}); {start_over(directory)}")
    assert isinstance(state, dict)  # _rank_state_problem refuses anything else
    return state


def _rank_state_problem(state: Any) -> str | None:
    if not isinstance(state, dict):
        return f"holds a {type(state).__name__}, expected a rank's state"
    rng = state.get("rng")
    if not isinstance(rng, dict) or not all(
        isinstance(v, torch.Tensor) and v.dtype == torch.uint8 for v in rng.values()
    ):
        return "rng: expected the RNG states"
    if "cpu" not in rng:
        return "rng: no CPU RNG state"
    totals = Totals.state_problem(state.get("train_totals"))
    if totals is not None:
        return f"train_totals: {totals}"
    if not isinstance(state.get("grad_scaler"), (dict, type(None))):
        return "grad_scaler: expected the fp16 loss scaler's state or none"
    return None


def read_metadata(step_dir: Path, directory: Path) -> Metadata:
    """DCP's `.metadata` of the checkpoint in `step_dir` (a pickle: anything may come of a
    damaged one)."""
    path = step_dir / ".metadata"
    try:
        metadata = FileSystemReader(step_dir).read_metadata()
    except FileNotFoundError:
        raise UserError(
            f"{step_dir}: missing or incomplete, but {directory / CHECKPOINT_RECORD} names it; "
            f"{start_over(directory)}"
        ) from None
    except Exception as err:  # noqa: BLE001 - whatever unpickling makes of a damaged file
        raise UserError(
            f"{path}: corrupt ({first_sentence(err)}); {start_over(directory)}"
        ) from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise UserError(f"{path}: corrupt (not DCP's checkpoint metadata); {start_over(directory)}")
    return metadata


def check_shards(step_dir: Path, metadata: Metadata, directory: Path) -> None:
    """Every shard file the metadata names is there and holds each byte range it names."""
    ends: dict[str, int] = {}
    for info in metadata.storage_data.values():
        name = getattr(info, "relative_path", None)
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not isinstance(name, str) or not isinstance(offset, int) or not isinstance(length, int):
            raise UserError(
                f"{step_dir / '.metadata'}: corrupt (a shard entry without its file and byte "
                f"range); {start_over(directory)}"
            )
        ends[name] = max(ends.get(name, 0), offset + length)
    for name, end in sorted(ends.items()):
        path = step_dir / name
        size = path.stat().st_size if path.is_file() else None
        if size is None or size < end:
            what = "missing" if size is None else f"{size} bytes, the metadata names {end}"
            raise UserError(
                f"{path}: {what}; the checkpoint is incomplete or damaged; {start_over(directory)}"
            )


def dcp_failure(err: CheckpointException, step_dir: Path, directory: Path) -> UserError:
    """DCP's load failed on some rank (every rank raises the same CheckpointException, with
    every failing rank's traceback in its text): the first failure, in one line."""
    failures = list(err.failures.values())
    cause = first_sentence(failures[0][0]) if failures else "unreadable"
    return UserError(f"{step_dir}: a shard is damaged ({cause}); {start_over(directory)}")
