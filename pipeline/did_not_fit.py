"""A run that ran out of device memory: a result, not a crash (issue 50, goal 3).

On GPUs, running out of memory is one of the things this comparison exists to show: plain
DataParallel gathers on GPU 0 and runs out there first, which is why BalancedDataParallel
exists. So a strategy whose batch does not fit ends its stage with the outcome "did not fit"
(exit code 0, so `dvc repro` goes on to compare): results/<strategy>/summary.json says so, with
the per-device batch, the device that ran out and each device's peak before the failure, and
the keys that would make it fit; its other outputs exist (DVC needs them) and say nothing
else: metrics.json's figures are null, model.pt holds no weights, history.csv the epochs that
finished. The report lists it apart from the ranked strategies.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from pipeline.files import atomic_write
from pipeline.results import (
    CONFIG,
    DID_NOT_FIT,
    HISTORY,
    METRICS,
    MODEL,
    RESULTS,
    SUMMARY,
    EpochRow,
    history_csv,
)


@dataclass(frozen=True)
class DidNotFit:
    """results/<strategy>/summary.json of a run that ran out of device memory."""

    strategy: str
    devices: list[str]  # the run's devices, as its summary would name them
    batch_split: list[int]  # the per-device batch of one forward
    failed_on: str  # the device that ran out ("gpu_0"; "cpu_0": a CPU process's host memory)
    peak_mib: dict[str, float]  # each device's peak in the failing epoch, up to the failure
    epoch: int  # 1-based: the epoch it failed in
    error: str  # torch's words, first line
    fix: str  # the keys that would make it fit
    epochs_done: int = 0  # whole epochs before it
    outcome: str = DID_NOT_FIT

    def line(self) -> str:
        """What the stage says: one line."""
        batch = "+".join(map(str, self.batch_split))
        peak = self.peak_mib.get(self.failed_on)
        reached = f", {peak:.0f} MiB at its peak" if peak is not None else ""
        return (
            f"did not fit: out of memory on {self.failed_on} in epoch {self.epoch}, at a "
            f"per-device batch of {batch}{reached}; {self.fix}"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DidNotFit:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


class RunDidNotFit(Exception):
    """Raised by the rank that ran out, once its record is written."""

    def __init__(self, record: DidNotFit):
        super().__init__(record.line())
        self.record = record


def how_to_fit(strategy: str, batch_size: int, grad_accum: int, sharded: bool) -> str:
    """The keys that would make the run fit, as one clause."""
    keys = [
        f"lower train.batch_size ({batch_size} now)",
        f"raise train.grad_accum ({grad_accum} now)",
    ]
    if strategy == "balanced_dp":
        keys.append("lower balanced_dp.gpu0_bsz (GPU 0's share)")
    if not sharded:
        keys.append("or use a strategy that shards the model (fsdp)")
    else:
        keys[-1] = "or " + keys[-1]
    return "to fit, " + ", ".join(keys)


def write_did_not_fit(
    record: DidNotFit, history: list[EpochRow], config_yaml: str, results: Path = RESULTS
) -> None:
    """results/<strategy>/ of a run that did not fit: every output DVC expects, each saying
    only what is true (no figures, no weights)."""
    import torch  # only its model.pt needs it

    out = results / record.strategy
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / MODEL, lambda path: torch.save({}, path))  # no weights: it never ended
    atomic_write(out / HISTORY, history_csv(history))
    atomic_write(out / CONFIG, config_yaml)
    nulls = dict.fromkeys(
        ("test_acc", "best_test_acc", "steady_epoch_seconds", "steady_samples_per_s")
    )
    atomic_write(out / METRICS, json.dumps({**nulls, "did_not_fit": True}, indent=2) + "\n")
    atomic_write(out / SUMMARY, json.dumps(record.to_json(), indent=2) + "\n")


def read_did_not_fit(strategy: str, results: Path = RESULTS) -> Optional[DidNotFit]:
    """The strategy's record where its last run did not fit; None otherwise (no results,
    or a run's summary)."""
    try:
        data = json.loads((results / strategy / SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("outcome") != DID_NOT_FIT:
        return None
    return DidNotFit.from_json(data)
