"""A train stage's fixed cost, phase by phase: what it spends before its first step and after
its last, against the training itself.

    python -m benchmarks.startup                         # single and 2-process ddp, 5 runs each
    python -m benchmarks.startup --runs 9 --strategies single ddp fsdp
    python -m benchmarks.startup --quickstart 3          # and 3 whole quickstarts

Each run is `python -m pipeline.train STRATEGY` on a tiny configuration (width 8, 512
synthetic images, 2 epochs; the rest as params.yaml has it: system and step metrics; the
compare stage, not this one, logs the model) in a throw-away project copy with an MLflow
store that already exists, as on a user's second stage. The stage marks its phases
(pipeline/timeline.py); the runs alternate between the two ways the launcher starts workers,
forked (the default: they inherit its imports) and spawned (each imports torch and the
project again: the fallback, and what a torchrun subprocess cost), so the two are compared
in one sitting. The JSON (benchmarks/results/<machine>-startup-<date>.json unless --out)
holds every run's marks and the median of each phase. Each round also runs the floor under
them: the same job as a bare PyTorch loop (benchmarks/bare_loop.py: python, torch, the model,
the data and SGD, nothing around them), whose first step and wall time no stage can beat on
this machine. `--quickstart N` also times N whole
`python -m pipeline.quickstart` runs on the 600 synthetic images, each from a new project
state (no results, no MLflow store), as a user's first: the wall time and the seconds of
each of its steps.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from benchmarks.bench import machine, write_result
from benchmarks.e2e import project_copy, torch_device
from benchmarks.peer import marked
from pipeline.data.synthetic import write_synthetic
from pipeline.launch.launcher import START_METHOD_ENV
from pipeline.strategies import NAMES
from pipeline.timeline import ENV as TIMELINE_ENV
from pipeline.timeline import PUBLISHER_CPU

TINY = [
    "model.width=8",
    "train.epochs=2",
    "train.batch_size=32",
    "data.limit_train=512",
    "data.limit_test=256",
    "ddp.nproc=2",
    "fsdp.nproc=2",
]
FIRST_STEP = "to the end of the first step"
# (phase, from mark, to mark): "spawned" is the benchmark's own clock as it starts the
# command, "exited" as it sees the command end
PHASES = [
    ("python and the command's imports", "spawned", "command"),
    ("validation, torch and the project", "command", "agent"),
    # the stage's publisher makes the MLflow store before the workers start (issue 51)
    ("machine warm-up (GPU, once per boot)", "agent", "machine warmed"),
    ("MLflow store made", "machine warmed", "MLflow store ready"),
    ("rendezvous and worker start", "MLflow store ready", "worker"),
    ("process group", "worker", "process group"),
    ("data to the device", "process group", "data on device"),
    ("model, strategy, checkpoint lookup", "data on device", "model built"),
    ("MLflow run handed to its publisher", "model built", "mlflow run opened"),
    (FIRST_STEP, "mlflow run opened", "first step"),
    ("training (the rest)", "first step", "trained"),
    ("results written", "trained", "results written"),
    ("workers' exit", "results written", "workers ended"),
    # the stage's MLflow publisher (pipeline/tracking/relay.py) ends after the workers
    ("final MLflow push", "workers ended", "published"),
    ("launcher's exit", "published", "exited"),
]
TRAINING = "training (the rest)"


def to_first_step(phases: dict[str, float]) -> float:
    """Seconds from the command to the end of its first step."""
    names = [phase for phase, _, _ in PHASES]
    return sum(phases[name] for name in names[: names.index(FIRST_STEP) + 1])


def one_run(project: Path, strategy: str, start_method: str, timeline: Path) -> dict[str, float]:
    for name in ("results", "checkpoints"):
        shutil.rmtree(project / name, ignore_errors=True)
    timeline.unlink(missing_ok=True)
    env = {
        **os.environ,
        TIMELINE_ENV: str(timeline),
        START_METHOD_ENV: start_method,
        "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}",
    }
    cmd = [sys.executable, "-m", "pipeline.train", strategy, *TINY]
    marks = {"spawned": time.time()}
    proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
    marks["exited"] = time.time()
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    cpu = 0.0
    for line in timeline.read_text().splitlines():
        at, _, phase = line.split(" ", 2)
        if phase.startswith(PUBLISHER_CPU):  # not a phase: what the publisher used beside them
            cpu = float(phase.removeprefix(PUBLISHER_CPU))
        marks.setdefault(phase, float(at))  # the first: "first step" comes once an epoch
    return {**{phase: marks[b] - marks[a] for phase, a, b in PHASES}, PUBLISHER_CPU: cpu}


def phase_sum(run: dict[str, float]) -> float:
    """The seconds of a run's phases (its publisher's CPU is beside them, not among them)."""
    return sum(run[phase] for phase, _, _ in PHASES)


def one_floor(project: Path) -> dict[str, float]:
    """TINY's job as a bare PyTorch loop: when its first step was queued and when it ended,
    counted from the command, as a stage's phases are."""
    tiny = dict(item.split("=", 1) for item in TINY)
    size = (tiny["model.width"], None, None, tiny["train.epochs"], tiny["train.batch_size"])
    limits = ["--limit-train", tiny["data.limit_train"], "--limit-test", tiny["data.limit_test"]]
    floor = marked("benchmarks.bare_loop", project, dict(os.environ), size, *limits)
    return {FIRST_STEP: floor["first_step_s"], "wall": floor["wall_s"]}


# the quickstart's last line: "quickstart: done in 41 s (fetch 0.3, single 5.1, ... s): ..."
QUICK_STEPS = re.compile(r"quickstart: done in \d+ s \((.*?) s\)")


def one_quickstart(project: Path) -> dict[str, float]:
    """A whole quickstart as a user's first: no results, checkpoints or MLflow store yet. Its
    wall time, and each step's seconds as it printed them."""
    for name in ("results", "checkpoints", "reports", "mlflow.db"):
        path = project / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}"}
    cmd = [
        sys.executable,
        "-m",
        "pipeline.quickstart",
        "data.limit_train=600",
        "data.limit_test=300",
    ]
    start = time.time()
    proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
    wall = time.time() - start
    found = QUICK_STEPS.search(proc.stdout)
    if proc.returncode != 0 or not found:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    steps = dict(step.rsplit(" ", 1) for step in found.group(1).split(", "))
    return {"wall": wall, **{name: float(seconds) for name, seconds in steps.items()}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--strategies", nargs="*", default=["single", "ddp"], choices=NAMES)
    parser.add_argument("--quickstart", type=int, default=0, help="whole quickstarts to time")
    parser.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/...)")
    args = parser.parse_args(argv)
    label, info = machine(torch_device())
    runs: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="parallel-lab-startup-") as tmp:
        mirror = Path(tmp) / "mirror"
        write_synthetic(mirror, 600, 300)
        project = project_copy(Path(tmp) / "project", mirror)
        subprocess.run([sys.executable, "-m", "pipeline.fetch"], cwd=project, check=True)
        timeline = Path(tmp) / "timeline.txt"
        one_run(project, "single", "fork", timeline)  # the store's tables, the file cache
        floors = []
        for i in range(args.runs):
            floors.append(one_floor(project))
            print(
                f"startup: bare loop run {i + 1}: first step {floors[-1][FIRST_STEP]:.2f} s",
                flush=True,
            )
            for strategy in args.strategies:
                for start in ("fork", "spawn"):  # taking turns: load affects both alike
                    phases = one_run(project, strategy, start, timeline)
                    runs.setdefault(f"{strategy}/{start}", []).append(phases)
                    fixed = phase_sum(phases) - phases[TRAINING]
                    print(
                        f"startup: {strategy} {start} run {i + 1}: fixed {fixed:.2f} s", flush=True
                    )
        quickstarts = []
        for i in range(args.quickstart):
            quickstarts.append(one_quickstart(project))
            print(f"startup: quickstart run {i + 1}: {quickstarts[-1]['wall']:.1f} s", flush=True)
    medians = {
        key: {phase: statistics.median(r[phase] for r in rows) for phase, _, _ in PHASES}
        for key, rows in runs.items()
    }
    result = {
        "machine": label,
        "info": info,
        "date": date.today().isoformat(),
        "settings": {"runs": args.runs, "overrides": TINY},
        "median_s": medians,
        "median_fixed_s": {
            key: statistics.median(phase_sum(r) - r[TRAINING] for r in rows)
            for key, rows in runs.items()
        },
        "median_wall_s": {
            key: statistics.median(phase_sum(r) for r in rows) for key, rows in runs.items()
        },
        # the stage's MLflow publisher beside the phases, at idle priority (issue 51)
        "median_publisher_cpu_s": {
            key: statistics.median(r[PUBLISHER_CPU] for r in rows) for key, rows in runs.items()
        },
        "median_first_step_s": {
            key: statistics.median(map(to_first_step, rows)) for key, rows in runs.items()
        },
        "runs": runs,
        "floor": {
            "median_s": {name: statistics.median(f[name] for f in floors) for name in floors[0]},
            "runs": floors,
        },
    }
    if quickstarts:
        result["quickstart"] = {
            "median_s": {
                step: statistics.median(q[step] for q in quickstarts) for step in quickstarts[0]
            },
            "runs": quickstarts,
        }
    out = write_result(result, "startup", args.out)
    print(table(result), flush=True)
    print(f"startup: wrote {out}", flush=True)
    return result


def table(result: dict) -> str:
    """The medians as a Markdown table, a column per strategy and start method."""
    keys = list(result["median_s"])
    lines = [
        "| phase (median s) | " + " | ".join(keys) + " |",
        "|---|" + "---:|" * len(keys),
    ]
    for phase in result["median_s"][keys[0]]:  # as the JSON has them (older ones, other phases)
        cells = [f"{result['median_s'][k][phase]:.2f}" for k in keys]
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    if "median_first_step_s" in result:  # older JSONs have the phases alone
        first = [f"**{result['median_first_step_s'][k]:.2f}**" for k in keys]
        lines.append("| **the command to the end of its first step** | " + " | ".join(first) + " |")
    fixed = [f"**{result['median_fixed_s'][k]:.2f}**" for k in keys]
    lines.append("| **fixed cost (all but training)** | " + " | ".join(fixed) + " |")
    if "median_wall_s" in result:  # older JSONs have the phases alone
        wall = [f"**{result['median_wall_s'][k]:.2f}**" for k in keys]
        lines.append("| **the stage's wall time** | " + " | ".join(wall) + " |")
    if "median_publisher_cpu_s" in result:  # older JSONs have no such figure
        cpu = ", ".join(f"{k} {v:.2f}" for k, v in result["median_publisher_cpu_s"].items())
        lines += [
            "",
            "Beside these phases, the stage's MLflow publisher (its imports, the store, the run, "
            "the pushes, the system metrics), at idle priority so that it never takes a "
            f"training core, used a median of {cpu} s of CPU.",
        ]
    if "floor" in result:
        floor = result["floor"]
        lines += [
            "",
            f"The floor, run in turn with them: the same job as a bare PyTorch loop "
            f"(benchmarks/bare_loop.py: python, torch, the model, the data and SGD, nothing "
            f"around them), median of {len(floor['runs'])}: its first step "
            f"**{floor['median_s'][FIRST_STEP]:.2f} s** after the command, its wall time "
            f"**{floor['median_s']['wall']:.2f} s**.",
        ]
    if "quickstart" in result:
        quick = result["quickstart"]
        steps = ", ".join(f"{k} {v:.1f}" for k, v in quick["median_s"].items() if k != "wall")
        lines += [
            "",
            f"The whole quickstart (every strategy, the report, the MLflow runs; 600 images, "
            f"a new MLflow store), median of {len(quick['runs'])}: "
            f"**{quick['median_s']['wall']:.1f} s** ({steps} s).",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
