"""What explains note 004's accuracy drop (DataParallel on 2 GPUs at batch 512 and lr 0.2: test
accuracy 0.72, against 0.92 on 1 GPU at batch 256 and lr 0.1), in figures this project
measured: what DataParallel's BatchNorm does to test accuracy (benchmarks/dp_batchnorm.py, its
committed result: `BATCHNORM`; tests/unit/test_notes_accuracy.py checks the figures are that
file's)
and how far the dp run's own test accuracy moved from epoch to epoch. Pure functions over the
table's rows (table.comparison_rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.reporting.row import Row

# note 004's two runs (its `train(net, num_gpus=..., batch_size=..., lr=...)` calls)
NOTES_RUNS = {
    "single": {"gpus": 1, "batch_size": 256, "lr": 0.1, "test_acc": 0.92},
    "dp": {"gpus": 2, "batch_size": 512, "lr": 0.2, "test_acc": 0.72},
}


@dataclass(frozen=True)
class BatchNormMeasured:
    """benchmarks/dp_batchnorm.py's measurement: single's training against the same one with
    each batch split the way DataParallel splits it (each chunk normalised on its own, only
    the first chunk's running statistics kept); test accuracy, medians over its seeds."""

    result: str  # the committed JSON it was read from
    whole: str  # the batch in one piece: single's
    split: str  # the split that lowered test accuracy most
    whole_acc: float
    split_acc: float
    seeds: int
    where: str

    @property
    def cost(self) -> float:
        """How much test accuracy DataParallel's BatchNorm cost where it was measured."""
        return self.whole_acc - self.split_acc

    @property
    def chunks(self) -> int:
        return len(self.split.split(","))


BATCHNORM = BatchNormMeasured(
    result="benchmarks/results/dp-batchnorm-cpu2-real-sample-2026-11-23.json",
    whole="64",
    split="8,8,8,8,8,8,8,8",
    whole_acc=0.8066666722297668,
    split_acc=0.7833333611488342,
    seeds=3,
    where="on 2 CPU cores, the 900-image real sample, width 16, 30 epochs",
)


def notes_drop() -> float:
    """How much lower note 004's dp run ended than its single run."""
    return float(NOTES_RUNS["single"]["test_acc"] - NOTES_RUNS["dp"]["test_acc"])


def epoch_range(accuracies: Sequence[float]) -> float:
    """max - min of a run's per-epoch test accuracy."""
    return max(accuracies) - min(accuracies)


def drop_explained(rows: list[Row]) -> tuple[str, dict[str, Any]]:
    """The notes' accuracy drop with what was measured about it: DataParallel's BatchNorm
    effect (the benchmark's) and the dp run's per-epoch test accuracy here (its row's
    `test_acc_by_epoch`), each set against the drop; and those figures as data."""
    s, d, bn = NOTES_RUNS["single"], NOTES_RUNS["dp"], BATCHNORM
    drop = notes_drop()
    text = (
        f"Note 004's dp run (batch {d['batch_size']}, lr {d['lr']}) ended at {d['test_acc']:g} "
        f"test accuracy against {s['test_acc']:g} (single, batch {s['batch_size']}, lr "
        f"{s['lr']}), {drop:.2f} lower. DataParallel's BatchNorm (each replica normalises its "
        "own chunk; only the first replica's running statistics are kept) cost "
        f"{bn.cost:.3f} where this project measured it (benchmarks/dp_batchnorm.py, {bn.where}: "
        f"batch {bn.whole} whole {bn.whole_acc:.3f}, in {bn.chunks} chunks {bn.split_acc:.3f}, "
        f"medians of {bn.seeds} seeds), {bn.cost / drop:.0%} of that drop."
    )
    measured: dict[str, Any] = {"notes_drop": drop, "batchnorm_cost": bn.cost}
    dp = next((r for r in rows if r["strategy"] == "dp"), None)
    epochs = list(dp.get("test_acc_by_epoch") or []) if dp is not None else []
    if not epochs:
        return f"{text} No dp run here to set its epochs beside it.", measured
    spread = epoch_range(epochs)
    measured.update(dp_test_acc_by_epoch=epochs, dp_epoch_range=spread)
    shown = ", ".join(f"{a:.2f}" for a in epochs)
    reach = (
        "as wide as the notes' drop: one epoch's reading moves that far"
        if spread >= drop
        else "narrower than the notes' drop, which neither figure here accounts for"
    )
    return (
        f"{text} dp's test accuracy here, epoch by epoch: {shown} (range {spread:.2f}, {reach}).",
        measured,
    )
