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

`--predict N` also runs N rounds of predict stages beside the train stages, each
`python -m pipeline.predict STRATEGY model.width=8 predict.time_s=0.5` as DVC runs one
(its own process, params.yaml's predict.gpus and link: auto), and times how much of it is
the stage's own cost: its wall time less the seconds it spends timing steps (profile.timed,
counted by a wrapper). The link this machine measures is kept after the first stage
(pipeline/scaling/kept_link.py), as in `dvc repro`: each run says whether it read it back.
Each round also times the floor under a predict stage: python and the stage's imports.
`--ref DIR` runs the train stages, predict stages and quickstarts of another checkout (the
code before a change) in turn with this one's, in the same sitting, so that both see the same load:
their medians side by side, and the ratios. Every run notes the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

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
    # the stage's MLflow publisher (pipeline/tracking/publisher.py) ends after the workers
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


PREDICT = ["model.width=8", "predict.time_s=0.5"]
# A predict stage as DVC runs it, with the seconds it spends in profile.timed counted: a
# wrapper that works on any checkout's code (before and after a change alike). The calls
# handed to timed as its warm-up's first (a first step, the steps read for their traffic and
# memory, which ran after it before 2026-12-02) count as the stage's own cost, not timing:
# that errs against the code that hands them in (its first step was timing before).
COUNTED = """
import os, sys, time
import pipeline.scaling.profile as profile
timed, spent = profile.timed, [0.0]
def uncounted(read):
    def run():
        start = time.perf_counter()
        try:
            read()
        finally:
            spent[0] -= time.perf_counter() - start
    return run
def counted(*args, **kwargs):
    kwargs["warm_up"] = [uncounted(read) for read in kwargs.get("warm_up", ())]
    start = time.perf_counter()
    try:
        return timed(*args, **kwargs)
    finally:
        spent[0] += time.perf_counter() - start
profile.timed = counted
from pipeline.predict import main
try:
    main(sys.argv[1:])
finally:
    open(os.environ["TIMED_OUT"], "w").write(str(spent[0]))
"""


def load() -> float:
    """The machine's load average over the last minute."""
    return os.getloadavg()[0]


def one_predict(project: Path, strategy: str) -> dict[str, Any]:
    """`python -m pipeline.predict STRATEGY` as its DVC stage runs it: its wall time, the
    seconds it spent timing steps, its own cost (the rest), and whether the link it used
    was read back (kept) rather than measured."""
    out = project / "timed.txt"
    out.unlink(missing_ok=True)
    env = {**os.environ, "TIMED_OUT": str(out)}
    before = load()
    cmd = [sys.executable, "-c", COUNTED, strategy, *PREDICT]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(
            f"predict {strategy} in {project} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
        )
    timing = float(out.read_text())
    doc = json.loads((project / "predictions" / f"{strategy}.json").read_text())
    source = doc.get("link", {}).get("source", "")
    return {
        "wall": wall,
        "timing steps": timing,
        "own": wall - timing,
        "link kept": float(source.startswith("kept")),
        "load": (before + load()) / 2,
        "document": doc,  # what it predicted: before and after a change, compared
    }


def one_import_floor(project: Path) -> float:
    """Python and the predict stage's imports (torch, the strategies' code): what no predict
    stage in its own process spends less than."""
    cmd = [sys.executable, "-c", "import pipeline.predict, pipeline.scaling.stage"]
    start = time.perf_counter()
    subprocess.run(cmd, cwd=project, check=True)
    return time.perf_counter() - start


# the quickstart's last line: "quickstart: done in 41 s (fetch 0.3, single 5.1, ... s): ..."
QUICK_STEPS = re.compile(r"quickstart: done in \d+ s \((.*?) s\)")


def one_quickstart(project: Path) -> dict[str, float]:
    """A whole quickstart as a user's first: no results, checkpoints or MLflow store yet. Its
    wall time, and each step's seconds as it printed them."""
    # .cache/links.json too: a user's first measures this machine's link
    for name in ("results", "checkpoints", "reports", "mlflow.db", ".cache/links.json"):
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
    before = load()
    start = time.time()
    proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
    wall = time.time() - start
    found = QUICK_STEPS.search(proc.stdout)
    if proc.returncode != 0 or not found:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    printed = dict(step.rsplit(" ", 1) for step in found.group(1).split(", "))
    steps = {name: float(seconds) for name, seconds in printed.items()}
    return {"wall": wall, **steps, "load": (before + load()) / 2}


def stage_medians(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each strategy/start's medians over its runs: the fixed cost, the wall time, the MLflow
    publisher's CPU beside the phases (at idle priority: issue 51) and the first step."""

    def median(of: Callable[[dict[str, float]], float]) -> dict[str, float]:
        return {key: statistics.median(map(of, rows)) for key, rows in runs.items()}

    return {
        "median_fixed_s": median(lambda r: phase_sum(r) - r[TRAINING]),
        "median_wall_s": median(phase_sum),
        "median_publisher_cpu_s": median(lambda r: r[PUBLISHER_CPU]),
        "median_first_step_s": median(to_first_step),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--strategies", nargs="*", default=["single", "ddp"], choices=NAMES)
    parser.add_argument("--quickstart", type=int, default=0, help="whole quickstarts to time")
    parser.add_argument("--predict", type=int, default=0, help="rounds of predict stages")
    parser.add_argument(
        "--predict-strategies", nargs="*", default=list(NAMES), choices=NAMES, metavar="NAME"
    )
    parser.add_argument(
        "--ref", type=Path, help="another checkout whose predict stages and quickstarts to time"
    )
    parser.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/...)")
    args = parser.parse_args(argv)
    label, info = machine(torch_device())
    runs: dict[str, list[dict[str, float]]] = {}
    ref_runs: dict[str, list[dict[str, float]]] = {}  # the same train stages of --ref
    predicts: dict[str, dict[str, list[dict[str, float]]]] = {}
    floors_import: dict[str, list[float]] = {}
    quickstarts: dict[str, list[dict[str, float]]] = {}
    documents: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory(prefix="parallel-lab-startup-") as tmp:
        mirror = Path(tmp) / "mirror"
        write_synthetic(mirror, 600, 300)
        project = project_copy(Path(tmp) / "project", mirror)
        projects = {"this": project}
        if args.ref:  # the same data, its own code
            projects["ref"] = project_copy(Path(tmp) / "ref", mirror, args.ref.resolve())
        for copy in projects.values():
            subprocess.run([sys.executable, "-m", "pipeline.fetch"], cwd=copy, check=True)
        timeline = Path(tmp) / "timeline.txt"
        for copy in projects.values():  # the store's tables, the file cache
            one_run(copy, "single", "fork", timeline)
        floors = []
        for i in range(max(args.runs, args.predict)):  # a round: train stages, then predict
            for _ in range(1 if i < args.runs else 0):
                floors.append(one_floor(project))
                print(
                    f"startup: bare loop run {i + 1}: first step {floors[-1][FIRST_STEP]:.2f} s",
                    flush=True,
                )
            for strategy in args.strategies if i < args.runs else []:
                for start in ("fork", "spawn"):  # taking turns: load affects both alike
                    for key, copy in turns(projects, i):  # and this and ref take turns
                        phases = one_run(copy, strategy, start, timeline)
                        kept = runs if key == "this" else ref_runs
                        kept.setdefault(f"{strategy}/{start}", []).append(phases)
                        fixed = phase_sum(phases) - phases[TRAINING]
                        print(
                            f"startup: {strategy} {start} ({key}) run {i + 1}: fixed {fixed:.2f} s",
                            flush=True,
                        )
            if i >= args.predict:
                continue
            for key, copy in turns(projects, i):  # this and ref take turns, first in turn
                floors_import.setdefault(key, []).append(one_import_floor(copy))
                for strategy in args.predict_strategies:
                    run = one_predict(copy, strategy)
                    documents.setdefault(key, {}).setdefault(strategy, []).append(
                        run.pop("document")
                    )
                    predicts.setdefault(key, {}).setdefault(strategy, []).append(run)
                    print(
                        f"startup: predict {strategy} ({key}) run {i + 1}: wall "
                        f"{run['wall']:.2f} s, own {run['own']:.2f} s, load {run['load']:.1f}",
                        flush=True,
                    )
        for i in range(args.quickstart):
            for key, copy in turns(projects, i):
                quickstarts.setdefault(key, []).append(one_quickstart(copy))
                wall, at = quickstarts[key][-1]["wall"], quickstarts[key][-1]["load"]
                print(f"startup: quickstart ({key}) run {i + 1}: {wall:.1f} s, load {at:.1f}")
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
        **stage_medians(runs),
        "runs": runs,
        "floor": {
            # --runs 0 (predict stages and quickstarts only) times no floor
            "median_s": {name: statistics.median(f[name] for f in floors) for name in floors[0]}
            if floors
            else {},
            "runs": floors,
        },
    }
    if args.ref:
        result["ref"] = str(args.ref.resolve())
        # in turn with this checkout's, the same settings
        result["ref_train_stages"] = {**stage_medians(ref_runs), "runs": ref_runs}
    if predicts:
        result["predict"] = {
            "settings": {"overrides": PREDICT, "strategies": args.predict_strategies},
            **{
                key: {
                    "median_s": {name: medians_of(rows) for name, rows in by_strategy.items()},
                    "import_floor_median_s": statistics.median(floors_import[key]),
                    "runs": by_strategy,
                    "import_floor_runs": floors_import[key],
                    "documents": documents[key],
                }
                for key, by_strategy in predicts.items()
            },
        }
    if quickstarts:
        result["quickstart"] = {
            **{
                key: {"median_s": medians_of(rows), "runs": rows}
                for key, rows in quickstarts.items()
                if key != "this"
            },
            # this checkout's at the top, as older JSONs have it
            "median_s": medians_of(quickstarts["this"]),
            "runs": quickstarts["this"],
        }
    out = write_result(result, "startup", args.out)
    print(table(result), flush=True)
    print(f"startup: wrote {out}", flush=True)
    return result


def turns(projects: dict[str, Path], i: int) -> list[tuple[str, Path]]:
    """The checkouts in round i's order: each goes first every other round."""
    items = list(projects.items())
    return items if i % 2 == 0 else items[::-1]


def medians_of(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def table(result: dict) -> str:
    """The medians as a Markdown table, a column per strategy and start method."""
    keys = list(result["median_s"])
    lines = ["| phase (median s) | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    if not keys:  # --runs 0: predict stages and quickstarts alone
        lines = []
    for phase in result["median_s"][keys[0]] if keys else []:  # as the JSON has them
        cells = [f"{result['median_s'][k][phase]:.2f}" for k in keys]
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    if "median_first_step_s" in result and keys:  # older JSONs have the phases alone
        first = [f"**{result['median_first_step_s'][k]:.2f}**" for k in keys]
        lines.append("| **the command to the end of its first step** | " + " | ".join(first) + " |")
    fixed = [f"**{result['median_fixed_s'][k]:.2f}**" for k in keys]
    if keys:
        lines.append("| **fixed cost (all but training)** | " + " | ".join(fixed) + " |")
    if "median_wall_s" in result and keys:  # older JSONs have the phases alone
        wall = [f"**{result['median_wall_s'][k]:.2f}**" for k in keys]
        lines.append("| **the stage's wall time** | " + " | ".join(wall) + " |")
    if result.get("median_publisher_cpu_s"):  # older JSONs have no such figure
        cpu = ", ".join(f"{k} {v:.2f}" for k, v in result["median_publisher_cpu_s"].items())
        lines += [
            "",
            "Beside these phases, the stage's MLflow publisher (its imports, the store, the run, "
            "the pushes, the system metrics), at idle priority so that it never takes a "
            f"training core, used a median of {cpu} s of CPU.",
        ]
    if result.get("floor", {}).get("runs"):
        floor = result["floor"]
        lines += [
            "",
            f"The floor, run in turn with them: the same job as a bare PyTorch loop "
            f"(benchmarks/bare_loop.py: python, torch, the model, the data and SGD, nothing "
            f"around them), median of {len(floor['runs'])}: its first step "
            f"**{floor['median_s'][FIRST_STEP]:.2f} s** after the command, its wall time "
            f"**{floor['median_s']['wall']:.2f} s**.",
        ]
    if "predict" in result:
        lines += ["", *predict_table(result)]
    if "quickstart" in result:
        quick = result["quickstart"]
        lines += ["", f"The whole quickstart{quickstart_text(quick)}."]
        if "ref" in quick:
            ratio = quick["median_s"]["wall"] / quick["ref"]["median_s"]["wall"]
            lines[-1] += (
                f" In turn with it, the code before (`--ref`): {quickstart_text(quick['ref'])}; "
                f"after / before **{ratio:.2f}**."
            )
    return "\n".join(lines)


def quickstart_text(quick: dict) -> str:
    steps = ", ".join(
        f"{k} {v:.1f}" for k, v in quick["median_s"].items() if k not in ("wall", "load")
    )
    at = f", load average {quick['median_s']['load']:.1f}" if "load" in quick["median_s"] else ""
    return (
        f" (every strategy with its prediction, the report, the MLflow runs; 600 images, a new "
        f"MLflow store), median of {len(quick['runs'])}: **{quick['median_s']['wall']:.1f} s** "
        f"({steps} s{at})"
    )


def predict_table(result: dict) -> list[str]:
    """Each predict stage's wall time, the seconds it timed steps and its own cost (the
    rest), beside the code before where it ran (`--ref`), and the floor under them."""
    predict = result["predict"]
    this, ref = predict["this"], predict.get("ref")
    head = "| predict stage (median s) | wall | timing steps | **own cost** |"
    rule = "|---|---:|---:|---:|"
    if ref:
        head += " before: wall | before: own cost | own cost after / before |"
        rule += "---:|---:|---:|"
    lines = [head, rule]
    for name, m in this["median_s"].items():
        row = f"| {name} | {m['wall']:.2f} | {m['timing steps']:.2f} | **{m['own']:.2f}** |"
        if ref:
            r = ref["median_s"][name]
            row += f" {r['wall']:.2f} | {r['own']:.2f} | {m['own'] / r['own']:.2f} |"
        lines.append(row)
    runs = len(next(iter(this["runs"].values())))
    kept = sum(r["link kept"] for rows in this["runs"].values() for r in rows)
    total = sum(len(rows) for rows in this["runs"].values())
    loads = [r["load"] for rows in this["runs"].values() for r in rows]
    floor = f"**{this['import_floor_median_s']:.2f} s**"
    if ref:
        floor += f" (before: {ref['import_floor_median_s']:.2f} s)"
    fixed = result["median_fixed_s"].get("single/fork")
    beside = "" if fixed is None else f" A train stage's fixed cost, same rounds: {fixed:.2f} s."
    return [
        f"Each predict stage as DVC runs it, in the rounds above, median of {runs}: "
        f"`python -m pipeline.predict STRATEGY {' '.join(predict['settings']['overrides'])}` "
        "(params.yaml's predict.gpus, link auto); its own cost is its wall time less the "
        "seconds it spent timing steps. "
        f"The link was read back (kept) in {kept:.0f} of {total} runs (the first measures it); "
        f"load average {statistics.median(loads):.1f} (median). "
        + (f"Before: `{result.get('ref')}`. " if ref else "")
        + "The floor under the own cost, "
        f"python and the stage's imports: {floor}.{beside}",
        "",
        *lines,
    ]


if __name__ == "__main__":
    main()
