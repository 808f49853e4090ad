"""A fair race: the quickstart on a new MLflow store, the strategies in params.yaml's order and
in the reverse one, and what each order answers (issue 51).

    python -m benchmarks.fair_race                    # 2 rounds
    python -m benchmarks.fair_race --tree ../old      # the same rows from another checkout too

Each row is `python -m pipeline.quickstart` (params.yaml's `quick`: 6000 synthetic
Fashion-MNIST-shaped images, width 8, 3 epochs) in a throw-away project copy with a new
SQLite store, as a new user's first run: every strategy, forward (single first, as
params.yaml lists them) or reversed. The rows take turns, each going first in turn; with
--tree each row also runs from that checkout's pipeline/. Per run it keeps every strategy's
epoch seconds and steady samples/s, the speed floor the report measured (its A/A group, where
the tree has one) and the strategies recommended per objective; per round and tree, whether
the two orders agree on every objective (their picks share a strategy: ties allowed). On a
CPU, single, dp and balanced_dp run the same computation at the same cost, so single's
first-position penalty shows as its steady samples/s against theirs. The JSON
(benchmarks/results/<machine>-fair-race-<date>.json unless --out) holds every run, the
medians and the settings.
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from benchmarks.bench import machine, write_result
from benchmarks.e2e import checkouts, fetched_copy, result_head, torch_device, turns_parser
from pipeline.data.synthetic import write_synthetic
from pipeline.strategies import NAMES

ORDERS = {"forward": list(NAMES), "reverse": list(reversed(NAMES))}
TRAIN, TEST = 6000, 1000  # what params.yaml's quick trains on


def quickstart(tree: Path, order: list[str], mirror: Path, tmp: Path) -> dict[str, Any]:
    """One quickstart on a new store in a new copy of `tree`: its strategies' figures and
    its answer."""
    project, env = fetched_copy(tree, Path(tempfile.mkdtemp(dir=tmp)) / "project", mirror)
    command = [sys.executable, "-m", "pipeline.quickstart", f"strategies=[{','.join(order)}]"]
    done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"fair_race: the quickstart failed:\n{done.stdout}\n{done.stderr}")
    figures = {}
    for name in order:
        history = list(csv.DictReader(open(project / "results" / name / "history.csv")))
        summary = json.loads((project / "results" / name / "summary.json").read_text())
        figures[name] = {
            "epoch_s": [round(float(r["epoch_seconds"]), 3) for r in history],
            "steady_samples_per_s": summary["steady_samples_per_s"],
        }
    answer = json.loads((project / "reports" / "recommendation.json").read_text())
    floor = answer.get("speed_noise") or {}
    return {
        "strategies": figures,
        "picks": {k: v["strategies"] for k, v in answer["objectives"].items()},
        "floors": floor.get("floors"),
        "group": floor.get("group"),
    }


def agree(a: dict[str, list[str]], b: dict[str, list[str]]) -> dict[str, bool]:
    """Per objective: the two answers share a pick (ties allowed), or both pick none."""
    return {k: (not a[k] and not b[k]) or bool(set(a[k]) & set(b[k])) for k in a}


def table(result: dict) -> str:
    lines = [
        "| tree | order | single samples/s | dp | balanced_dp | speed floor | orders agree |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for tree, by_order in result["median"].items():
        for order, m in by_order.items():
            floor = m["throughput_floor"]
            name = tree if tree == "this" else f"({tree})"  # another checkout's, as in tables.py
            lines.append(
                f"| {name} | {order} | {m['single']:.0f} | {m['dp']:.0f} | "
                f"{m['balanced_dp']:.0f} | {'none' if floor is None else f'{floor:.1%}'} | "
                f"{result['agreement'][tree]} |"
            )
    return "\n".join(lines)


def medians(runs: list[dict]) -> dict[str, Any]:
    def sps(name: str) -> float:
        return statistics.median(r["strategies"][name]["steady_samples_per_s"] for r in runs)

    floors = [r["floors"]["throughput"] for r in runs if r["floors"]]
    return {
        **{name: sps(name) for name in ("single", "dp", "balanced_dp")},
        "throughput_floor": statistics.median(floors) if floors else None,
    }


def main(argv: list[str] | None = None) -> dict:
    args = turns_parser(__doc__, runs=2).parse_args(argv)
    trees = checkouts(args.tree)
    rows = [(tree, order) for tree in trees for order in ORDERS]
    label, info = machine(torch_device())
    load_before = os.getloadavg()
    rounds: list[dict[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="parallel-lab-fair-race-") as tmp:
        mirror = Path(tmp) / "mirror"
        write_synthetic(mirror, TRAIN, TEST)
        for i in range(args.runs):
            turn = [*rows[i % len(rows) :], *rows[: i % len(rows)]]
            seen = {
                f"{tree}/{order}": quickstart(trees[tree], ORDERS[order], mirror, Path(tmp))
                for tree, order in turn
            }
            rounds.append(seen)
            for key, run in seen.items():
                cells = ", ".join(
                    f"{n} {f['steady_samples_per_s']:.0f}" for n, f in run["strategies"].items()
                )
                print(f"fair_race: run {i + 1} {key}: {cells}; picks {run['picks']}", flush=True)
    agreement = {
        tree: [agree(r[f"{tree}/forward"]["picks"], r[f"{tree}/reverse"]["picks"]) for r in rounds]
        for tree in trees
    }
    quick = yaml.safe_load((trees["this"] / "params.yaml").read_text())["quick"]
    result = {
        **result_head(
            label,
            info,
            load_before,
            {
                "runs": args.runs,
                "quick": quick,
                "orders": ORDERS,
                "trees": {n: str(t) for n, t in trees.items()},
            },
        ),
        "rounds": rounds,
        "median": {
            tree: {o: medians([r[f"{tree}/{o}"] for r in rounds]) for o in ORDERS} for tree in trees
        },
        "agreement": {
            tree: f"{sum(all(a.values()) for a in runs)} of {len(runs)} rounds"
            for tree, runs in agreement.items()
        },
        "disagreements": {
            tree: [sorted(k for k, ok in a.items() if not ok) for a in runs]
            for tree, runs in agreement.items()
        },
    }
    out = write_result(result, "fair-race", args.out)
    print(table(result), flush=True)
    print(f"fair_race: wrote {out}", flush=True)
    return result


if __name__ == "__main__":
    main()
