"""How many operators one training step dispatches, strategy by strategy, at world size 1:
what a launch-bound GPU pays for, counted on any machine (issue 49, goal 2).

    python -m benchmarks.op_count                                  # params.yaml's settings
    python -m benchmarks.op_count --set model.width=8 --strategies single pipeline_parallel

At this model's size an H200 is bound by launching kernels, not by computing them: single's
step went from 0.91 to 0.39 s an epoch once captured as one CUDA graph, which launches
nothing from the host (docs/performance.md). So a strategy's cost over single on a GPU
follows, to a first order, what its step dispatches beyond single's. Every aten operator
costs the host a dispatch; those that compute (not a view, not an empty allocation) are at
least one kernel launch on a GPU. The count needs no GPU: each strategy is built as its train
stage builds it (benchmarks/bench.py's ProjectRow) on the CPU, and a dispatch mode counts the
operators of --steps steps after one untimed epoch. It is a count, not a time: the JSON
(benchmarks/results/<machine>-op-count-<date>.json unless --out) holds, per strategy, the
operators and the computing ones per step, their ratios to single's, and the most frequent.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.bench import REPO, ProjectRow, machine, one_rank_group, write_result
from pipeline.config import load_config
from pipeline.context import DistContext
from pipeline.scaling.profile import synthetic_data
from pipeline.strategies import NAMES

TOP = 8  # the most frequent operators kept per strategy
# operators that launch no kernel beside the views: an allocation
ALLOCATIONS = {"aten.empty", "aten.empty_strided", "aten.empty_like"}


class Counted(TorchDispatchMode):
    """Every aten operator dispatched while it is up, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        self.views: set[str] = set()  # the names counted that only make a view

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func.overloadpacket)
        self.counts[name] += 1
        if func.is_view:
            self.views.add(name)
        return func(*args, **(kwargs or {}))


def per_step(counts: collections.Counter[str], views: set[str], steps: int) -> dict[str, Any]:
    """A strategy's row from its counts over `steps` steps: every operator, those that compute
    (neither a view nor an allocation), and the most frequent. Pure."""
    launch_nothing = views | ALLOCATIONS
    computing = sum(n for name, n in counts.items() if name not in launch_nothing)
    return {
        "ops_per_step": sum(counts.values()) / steps,
        "computing_per_step": computing / steps,
        "top": {name: n / steps for name, n in counts.most_common(TOP)},
    }


def over_single(rows: dict[str, dict[str, Any]], key: str) -> dict[str, float]:
    """Each strategy's `key` (ops_per_step, computing_per_step) over single's. Pure."""
    if "single" not in rows:
        return {}
    base = rows["single"][key]
    return {name: row[key] / base for name, row in rows.items() if name != "single"}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", nargs="*", default=list(NAMES), choices=NAMES)
    parser.add_argument("--set", nargs="*", default=[], help="key=value params overrides")
    parser.add_argument("--steps", type=int, default=3, help="steps counted per strategy")
    parser.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/...)")
    args = parser.parse_args(argv)

    device = torch.device("cpu")  # a count, the same on any device the step runs on
    ctx = DistContext(rank=0, local_rank=0, world_size=1, gpus=())
    cfg = load_config(REPO / "params.yaml", [*args.set, "train.epochs=2"])
    data = synthetic_data(cfg.train.batch_size * args.steps, device)  # an epoch: --steps steps
    label, info = machine(device)
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as work, one_rank_group(device, Path(work)):
        for name in args.strategies:
            row = ProjectRow(name, name, cfg, ctx, data, Path(work))
            row.epoch()  # untimed: the first step's one-off work (buckets, shape inference)
            with Counted() as counted:
                row.epoch()
            rows[name] = per_step(counted.counts, counted.views, args.steps)
            print(
                f"op_count: {name}: {rows[name]['ops_per_step']:.0f} operators a step, "
                f"{rows[name]['computing_per_step']:.0f} of them computing"
            )
    ratios = over_single(rows, "computing_per_step")
    result = {
        "machine": label,
        "info": info,
        "date": date.today().isoformat(),
        "settings": {**vars(args), "out": None},
        "rows": rows,
        "over_single": over_single(rows, "ops_per_step"),
        "computing_over_single": ratios,
    }
    for name, ratio in ratios.items():
        print(f"op_count: {name}: x{ratio:.2f} single's computing operators a step")
    out = write_result(result, "op-count", args.out)
    print(f"op_count: wrote {out}", flush=True)
    return result


if __name__ == "__main__":
    main()
