"""The N-device prediction checked where a real run exists: on this machine, each of ddp, fsdp
and pipeline_parallel predicted at 2 processes by the predict stage's own work
(pipeline.scaling.stage: its rank's step measured under the fake process group at world size
2, its communication over gloo as measured here between 2 processes), then run for real as 2
processes by its train stage, and the two steps compared (issue 48, goal 3).

    python -m benchmarks.scaling_check              # 3 rounds
    python -m benchmarks.scaling_check --runs 1 --set model.width=8
    python -m benchmarks.scaling_check --strategies channel_parallel hybrid

Each round measures the gloo link, predicts each strategy, and runs its stage in a project
copy (synthetic Fashion-MNIST-shaped data), the rows taking turns. The measured step is the
stage's steady epoch seconds over its steps per epoch (training only, as the prediction). The
JSON (benchmarks/results/<machine>-scaling-check-<date>.json unless --out) holds every round,
the medians, and each strategy's error: predicted / measured - 1. Goal: within 25% each.
single's row checks the baseline every speedup divides by: its profile at world size 1
against its own stage. A strategy predicted at every layout of its devices (hybrid) is
checked layout by layout, each run for real with its section set to that layout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.bench import machine, write_result
from benchmarks.e2e import fetched_copy, result_head
from pipeline.config import load_config
from pipeline.data.synthetic import write_synthetic
from pipeline.run_spec import resolve_run
from pipeline.scaling.stage import predict_strategy, the_link

# single: its profile (world size 1) is every speedup's baseline, checked like the others
STRATEGIES = ("single", "ddp", "fsdp", "pipeline_parallel")
WORLD = 2
GOAL = 0.25
SETTINGS = [
    "model.width=16",
    "train.batch_size=128",
    "train.epochs=3",
    "data.limit_train=2560",  # 20 steps an epoch
    "data.limit_test=256",
    "ddp.nproc=2",
    "fsdp.nproc=2",
    "pipeline_parallel.nproc=2",
    "pipeline_parallel.stages=2",
    "channel_parallel.nproc=2",
]
TRAIN, TEST = 2560, 256


def measured_step(project: Path, env: dict, name: str, overrides: list[str], world: int) -> float:
    """A fresh run of `name`'s train stage: its steady epoch seconds over its steps."""
    for kept in ("results", "checkpoints"):
        shutil.rmtree(project / kept / name, ignore_errors=True)
    command = [sys.executable, "-m", "pipeline.train", name, *overrides]
    done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"scaling_check: {name} failed:\n{done.stdout}\n{done.stderr}")
    summary = json.loads((project / "results" / name / "summary.json").read_text())
    history = (project / "results" / name / "history.csv").read_text().splitlines()
    assert len(history) > 1
    cfg = load_config(project / "params.yaml", overrides)
    steps = resolve_run(cfg, name).job_plan(world, TRAIN).steps
    return float(summary["steady_epoch_seconds"]) / steps


def layout_overrides(label: str, cfg: Any, name: str, row: dict[str, Any]) -> list[str]:
    """The section keys that run `name` at the layout a row of its prediction names."""
    spec = resolve_run(cfg, name)
    assert spec.facts.layouts is not None
    for options in spec.facts.layouts(spec.options, WORLD):
        if f"{name} ({spec.facts.mesh(options, WORLD).describe()})" == label:
            return [f"{name}.{k}={v}" for k, v in vars(options).items()]
    raise ValueError(f"no layout of {name} is {label!r}")


def predicted_rows(cfg: Any, name: str, doc: dict[str, Any]) -> dict[str, tuple[dict, list[str]]]:
    """label -> (its prediction at WORLD, the overrides that run it): one row, or one per
    layout of a strategy predicted at each (hybrid)."""
    row = doc["by_devices"][str(WORLD)]
    if "layouts" not in row:
        return {name: (row, [])}
    return {
        f"{name} ({k})": (r, layout_overrides(f"{name} ({k})", cfg, name, r))
        for k, r in row["layouts"].items()
    }


def one_round(
    project: Path, env: dict, overrides: list[str], strategies: tuple[str, ...]
) -> dict[str, Any]:
    """The predict stage's own work (pipeline.scaling.stage) for each strategy at WORLD, then
    each strategy's train stage (each layout's, where it is predicted at several)."""
    cfg = load_config(project / "params.yaml", [*overrides, f"predict.gpus=[{WORLD}]"])
    device = torch.device("cpu")
    link = the_link(cfg, device, None)  # auto: gloo between 2 processes, measured each round
    rows = {}
    for name in strategies:
        doc = predict_strategy(cfg, name, device, lambda: link)
        laid: dict[str, tuple[dict[str, Any], list[str]]]
        if name == "single":  # its step on one device: every speedup's baseline
            laid = {name: ({"predicted_step_s": doc["baseline_step_s"], "devices_used": 1}, [])}
        else:
            laid = predicted_rows(cfg, name, doc)
        for label, (row, layout) in laid.items():
            predicted, devices = row["predicted_step_s"], row["devices_used"]
            real = measured_step(project, env, name, [*overrides, *layout], devices)
            rows[label] = {
                **row,
                "predicted_step_s": predicted,
                "measured_step_s": real,
                "error": predicted / real - 1,
            }
            print(
                f"scaling_check: {label}: predicted {predicted * 1000:.1f} ms a step, "
                f"measured {real * 1000:.1f} ms ({rows[label]['error']:+.0%})",
                flush=True,
            )
    return {
        "link": {"busbw_GBps": link.busbw / 1e9, "latency_us": link.latency_s * 1e6},
        "strategies": rows,
    }


def table(result: dict) -> str:
    """Each strategy's predicted and measured step (medians of the rounds), its error, and
    every round's error: what the band a prediction is shown with comes from."""
    lines = [
        "| strategy | predicted ms/step | measured ms/step | error | each round | within 25% |",
        "|---|---:|---:|---:|---|---|",
    ]
    for name, m in result["median"].items():
        rounds = ", ".join(f"{r['strategies'][name]['error']:+.0%}" for r in result["rounds"])
        lines.append(
            f"| {name} | {m['predicted_step_s'] * 1000:.1f} | {m['measured_step_s'] * 1000:.1f} "
            f"| {m['error']:+.0%} | {rounds} | {'yes' if m['within_goal'] else 'no'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--set", nargs="*", default=[], help="more key=value settings")
    parser.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/...)")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    args = parser.parse_args(argv)
    overrides = [*SETTINGS, *args.set]
    label, info = machine(torch.device("cpu"))
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="parallel-lab-scaling-") as tmp:
        mirror = Path(tmp) / "mirror"
        write_synthetic(mirror, TRAIN, TEST)
        project, env = fetched_copy(Path.cwd(), Path(tmp) / "project", mirror)
        rounds = [
            one_round(project, env, overrides, tuple(args.strategies)) for _ in range(args.runs)
        ]
    median = {
        name: {
            what: statistics.median(r["strategies"][name][what] for r in rounds)
            for what in ("predicted_step_s", "measured_step_s")
        }
        for name in rounds[0]["strategies"]
    }
    for m in median.values():
        m["error"] = m["predicted_step_s"] / m["measured_step_s"] - 1
        m["within_goal"] = abs(m["error"]) <= GOAL
    result = {
        **result_head(label, info, load_before, {"runs": args.runs, "overrides": overrides}),
        "world_size": WORLD,
        "goal": f"|predicted / measured - 1| <= {GOAL:.0%} per strategy",
        "rounds": rounds,
        "median": median,
    }
    path = write_result(result, "scaling-check", args.out)
    print(f"scaling_check: wrote {path}")
    return result


if __name__ == "__main__":
    main()
