"""What synchronised BatchNorm costs a 2-process data-parallel job on the CPU.

    python -m benchmarks.sync_bn                      # ddp and fsdp, sync_bn on and off
    python -m benchmarks.sync_bn --tree ../old        # the same rows from another checkout too

`sync_bn: true` (the default of ddp and fsdp) normalises over the global micro-batch, as
`single` does, at the price of a collective per BatchNorm layer in forward and in backward:
on gloo that is where a CPU job's time goes. Each row is a whole train stage, `python -m
pipeline.train STRATEGY` with 2 gloo processes, on synthetic Fashion-MNIST-shaped images in a
throw-away project copy; what is compared is its steady epoch time (metrics.json: the median
epoch after the first). The rows take turns, each going first in turn, so load falls on all
alike; a row's ratio is the median over rounds of its epoch over the first row's (the first
strategy's, sync_bn off) in the same round. With --tree, every row also runs from that checkout's
pipeline/ (its own project copy and data): before and after a change, side by side. The JSON
(benchmarks/results/<machine>-sync-bn-<date>.json unless --out) holds every run, the medians,
the ratios, the settings and the 1-minute load average before and after.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.bench import machine, write_result
from benchmarks.e2e import (
    checkouts,
    fetched_copy,
    result_head,
    taking_turns,
    torch_device,
    turns_parser,
)
from benchmarks.peer import timed
from pipeline.data.synthetic import write_synthetic

# the job: 2048 images at width 8, batch 64 (32 steps an epoch), 3 epochs
JOB = [
    "model.width=8",
    "train.batch_size=64",
    "train.epochs=3",
    "data.limit_train=2048",
    "data.limit_test=512",
    "ddp.nproc=2",
    "fsdp.nproc=2",
    "mlflow.log_model=false",
    "report.system_metrics_interval_s=null",
]
ROWS = {  # label -> (strategy, overrides); the first is every ratio's denominator
    "ddp, sync_bn off": ("ddp", ["ddp.sync_bn=false"]),
    "ddp, sync_bn on": ("ddp", ["ddp.sync_bn=true"]),
    "fsdp, sync_bn off": ("fsdp", ["fsdp.sync_bn=false"]),
    "fsdp, sync_bn on": ("fsdp", ["fsdp.sync_bn=true"]),
}


def plan(strategies: list[str], trees: dict[str, Path]) -> list[tuple[str, str, list[str], str]]:
    """(label, strategy, overrides, tree name) for each row of the chosen strategies, once per
    tree; a tree other than this one is named in the label."""
    return [
        (label if tree == "this" else f"{label} ({tree})", strategy, overrides, tree)
        for tree in trees
        for label, (strategy, overrides) in ROWS.items()
        if strategy in strategies
    ]


def ratios(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each row's median over rounds of its epoch over the first row's in the same round."""
    first = next(iter(rounds[0]))
    return {label: statistics.median(r[label] / r[first] for r in rounds) for label in rounds[0]}


def steady_epoch(project: Path, env: dict[str, str], strategy: str, overrides: list[str]) -> float:
    for name in ("results", "checkpoints"):
        shutil.rmtree(project / name, ignore_errors=True)
    timed([sys.executable, "-m", "pipeline.train", strategy, *JOB, *overrides], project, env)
    metrics = json.loads((project / "results" / strategy / "metrics.json").read_text())
    return float(metrics["steady_epoch_seconds"])


def table(result: dict) -> str:
    first = next(iter(result["median_epoch_s"]))
    lines = [f"| row | s/epoch | ratio to {first} |", "|---|---:|---:|"]
    for label, seconds in result["median_epoch_s"].items():
        lines.append(f"| {label} | {seconds:.2f} | {result['ratios'][label]:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = turns_parser(__doc__, runs=5)
    parser.add_argument("--strategies", nargs="*", default=["ddp", "fsdp"], choices=["ddp", "fsdp"])
    args = parser.parse_args(argv)

    trees = checkouts(args.tree)
    rows = plan(args.strategies, trees)
    label, info = machine(torch_device())
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="parallel-lab-sync-bn-") as tmp:
        mirror = Path(tmp) / "mirror"
        write_synthetic(mirror, 2048, 512)
        projects = {
            name: fetched_copy(tree, Path(tmp) / f"project-{i}", mirror)
            for i, (name, tree) in enumerate(trees.items())
        }
        for tree in trees:  # untimed: each store's tables, the file cache
            _, strategy, overrides, _ = next(row for row in rows if row[3] == tree)
            steady_epoch(*projects[tree], strategy, overrides)
        rounds = taking_turns(
            rows, args.runs, lambda row: steady_epoch(*projects[row[3]], row[1], row[2]), "sync_bn"
        )
    settings = {
        "runs": args.runs,
        "job": JOB,
        "trees": {name: str(tree) for name, tree in trees.items()},
    }
    result = {
        **result_head(label, info, load_before, settings),
        "rounds": rounds,
        "median_epoch_s": {k: statistics.median(r[k] for r in rounds) for k in rounds[0]},
        "ratios": ratios(rounds),
    }
    out = write_result(result, "sync-bn", args.out)
    print(table(result), flush=True)
    print(f"sync_bn: wrote {out}", flush=True)
    return result


if __name__ == "__main__":
    main()
