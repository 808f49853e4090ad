"""End-to-end wall time: what a user waits for, from the command to its results.

    python -m benchmarks.e2e --mirror DIR --dvc                 # `dvc repro`, whole (issue 30)
    python -m benchmarks.e2e --mirror DIR                       # dvc.yaml's commands, no DVC
    python -m benchmarks.e2e --mirror DIR --quickstart          # `make quick`, whole
    python -m benchmarks.e2e --mirror DIR --set model.width=64 train.epochs=10

Copies the project into a temporary directory (its own results/, checkpoints/ and MLflow
store), fetches from --mirror (a directory with the four IDX files; their sums are taken as
they are), then times each command as a user runs it: process start, data to the device,
compilation, training, evaluation, MLflow, the report. Train stages are timed one after
the other, each on the whole machine. The JSON (benchmarks/results/<machine>-e2e-<date>.json
unless --out) holds every command's seconds, and the steady s/epoch each stage reported.

Without --dvc it runs dvc.yaml's stage commands one after the other, as `dvc repro` would
where DVC is not installed: fetch, every train stage, every predict stage, compare; the JSON's
`ran` says which of the three modes ran. It is rewritten after each command, `finished`
false until the last: a run cut off by a time limit keeps every command it timed. Each train
stage's warm-up epoch is in `warmup_epoch_s`, and where its wall went in `phases_s`: the
seconds from its command to each of its pipeline/timeline.py marks (agent, machine warmed,
first step, trained, workers ended, ...).

--dvc times the one command `dvc repro` (fetch, every train and predict stage, compare), with --set
written into the copy's params.yaml: its total, and each stage's seconds from the moment DVC
says it runs it to the next stage's (DVC's own work between them, hashing and caching the
outputs, counts to the stage before); a train stage's own process, from its first line to its
workers' end (pipeline/timeline.py marks), is in `train_process_s`. Issue 30's goal: at the
defaults on one H100, at most 120 s in all.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path
from typing import Any

import yaml

from benchmarks.bench import REPO, machine, write_result
from pipeline.strategies import NAMES

PROJECT_FILES = [
    "pipeline",
    "dvc.yaml",
    "params.yaml",
    ".dvc",
    ".dvcignore",
    ".gitignore",
    "pyproject.toml",
]


def project_copy(dest: Path, mirror: Path, source: Path = REPO) -> Path:
    """The project in `dest` (a copy of `source`, another checkout if need be), a git
    repository, with params.yaml fetching from `mirror`."""
    for name in PROJECT_FILES:
        src, target = source / name, dest / name
        if src.is_dir():
            shutil.copytree(
                src, target, ignore=shutil.ignore_patterns("__pycache__", "cache", "tmp")
            )
        else:
            shutil.copy2(src, target)
    params = yaml.safe_load((dest / "params.yaml").read_text())
    params["data"]["mirrors"] = [str(mirror.resolve())]
    params["data"]["md5"] = {
        p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(mirror.glob("*.gz"))
    }
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "bench"]):
        subprocess.run(["git", *args], cwd=dest, check=True, env=GIT_ENV)
    return dest


def project_path(project: Path) -> str:
    """PYTHONPATH for a project copy's commands: the copy's code first, then what the caller
    had there (make gpu-check's carried wheels, on a machine whose python lacks MLflow)."""
    return os.pathsep.join(filter(None, [str(project), os.environ.get("PYTHONPATH")]))


def fetched_copy(tree: Path, dest: Path, mirror: Path) -> tuple[Path, dict[str, str]]:
    """A project copy of `tree`'s pipeline with its data fetched, and the environment its
    stages run in: its own code, an MLflow store in the copy, no GPU."""
    project = project_copy(dest, mirror, source=tree)
    env = {
        **os.environ,
        "PYTHONPATH": project_path(project),
        "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}",
        "CUDA_VISIBLE_DEVICES": "",
    }
    subprocess.run(
        [sys.executable, "-m", "pipeline.fetch"],
        cwd=project,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return project, env


def turns_parser(doc: str, runs: int) -> argparse.ArgumentParser:
    """The options of a benchmark whose rows take turns, beside another tree if asked:
    --runs (rounds), --tree (the other checkout), --out (the JSON)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=runs)
    parser.add_argument("--tree", type=Path, help="another checkout whose rows run beside these")
    parser.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/...)")
    return parser


def checkouts(other: Path | None) -> dict[str, Path]:
    """The trees a side-by-side benchmark runs: this one ("this"), and `other`, named by its
    directory, if given (--tree)."""
    trees = {"this": REPO}
    if other is not None:
        trees[other.resolve().name] = other.resolve()
    return trees


def taking_turns(
    rows: Sequence[tuple[Any, ...]], runs: int, measure: Callable[[Any], float], name: str
) -> list[dict[str, float]]:
    """`runs` rounds of `measure(row)` for every row (a tuple, its label first), the rows
    taking turns to go first so that load falls on all alike; each round's seconds by label,
    in the rows' order, printed as the round ends."""
    rounds = []
    for i in range(runs):
        turn = [*rows[i % len(rows) :], *rows[: i % len(rows)]]
        seen = {row[0]: measure(row) for row in turn}
        rounds.append({row[0]: seen[row[0]] for row in rows})
        print(
            f"{name}: run {i + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in rounds[-1].items()),
            flush=True,
        )
    return rounds


def result_head(label: str, info: dict, load_before: tuple, settings: dict) -> dict:
    """What every side-by-side benchmark's JSON opens with: the machine, today, the 1-minute
    load average before (given) and after (now), and its settings."""
    return {
        "machine": label,
        "info": info,
        "date": date.today().isoformat(),
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "settings": settings,
    }


GIT_ENV = {
    **os.environ,
    **{f"GIT_{who}_{what}": "b" for who in ("AUTHOR", "COMMITTER") for what in ("NAME", "EMAIL")},
}


def set_params(project: Path, overrides: list[str], names: list[str]) -> None:
    """`key=value` overrides (values as YAML) and the strategies into the copy's
    params.yaml: `dvc repro` reads nothing else. The stages check the values."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["strategies"] = names
    for override in overrides:
        key, _, value = override.partition("=")
        *sections, last = key.split(".")
        section = params
        for name in sections:
            section = section.setdefault(name, {})
        section[last] = yaml.safe_load(value)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    subprocess.run(["git", "commit", "-qam", "params"], cwd=project, check=True, env=GIT_ENV)


RUNNING = re.compile(r"Running stage '([^']+)'")


def stage_seconds(stamped: list[tuple[float, str]], start: float, end: float) -> dict[str, float]:
    """Each stage's seconds from DVC's output, each line stamped when it arrived: from its
    "Running stage" line to the next one's, the last to `end`; what came before the first
    is DVC's start (`dvc start`)."""
    starts = [(t, m.group(1)) for t, line in stamped if (m := RUNNING.search(line))]
    seconds = {"dvc start": (starts[0][0] if starts else end) - start}
    for (t, name), (t_next, _) in zip(starts, [*starts[1:], (end, "")]):
        seconds[name] = t_next - t
    return seconds


def train_process_seconds(timeline: str) -> list[float]:
    """Each train stage's own process, in the order they ran: from its `command` mark to its
    `workers ended` mark (lines `<unix time> <pid> <phase>`, pipeline/timeline.py)."""
    began: dict[str, float] = {}
    spans = []
    for line in timeline.splitlines():
        at, pid, phase = line.split(" ", 2)
        if phase == "command":
            began[pid] = float(at)
        elif phase == "workers ended" and pid in began:
            spans.append(float(at) - began.pop(pid))
    return spans


def phase_offsets(timeline: str) -> dict[str, float]:
    """One stage's phases (pipeline/timeline.py marks: agent, machine warmed, first step,
    trained, workers ended, ...), each the seconds from its `command` mark to the phase's
    first mark: where a stage's wall goes."""
    marks = [line.split(" ", 2) for line in timeline.splitlines() if line.strip()]
    start = next((float(at) for at, _, phase in marks if phase == "command"), None)
    if start is None:
        return {}
    offsets: dict[str, float] = {}
    for at, _, phase in marks:
        offsets.setdefault(phase, round(float(at) - start, 2))
    return offsets


def dvc_repro(project: Path, env: dict, names: list[str]) -> dict:
    """`dvc repro` in `project`, its output passed through and stamped line by line."""
    timeline = project.parent / "timeline.txt"
    env = {**env, "PARALLEL_LAB_TIMELINE": str(timeline), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "dvc", "repro"]
    stamped = []
    start = time.perf_counter()
    with subprocess.Popen(
        cmd, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            stamped.append((time.perf_counter(), line))
            print(line, end="", flush=True)
    end = time.perf_counter()
    if proc.returncode != 0:
        sys.exit(f"dvc repro exited {proc.returncode}")
    seconds = stage_seconds(stamped, start, end)
    spans = train_process_seconds(timeline.read_text() if timeline.exists() else "")
    trains = [name for name in seconds if name.startswith("train@")]
    return {
        "seconds": {**seconds, "total": end - start},
        "train_process_s": dict(zip(trains, spans)),
    }


def timed(cmd: list[str], cwd: Path, env: dict) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return seconds, proc.stdout


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, required=True, help="directory of IDX .gz files")
    parser.add_argument("--set", nargs="*", default=[], help="key=value params overrides")
    parser.add_argument("--strategies", nargs="*", default=list(NAMES), choices=NAMES)
    parser.add_argument("--quickstart", action="store_true", help="time `make quick` instead")
    parser.add_argument("--dvc", action="store_true", help="time `dvc repro`, whole, instead")
    parser.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/...)")
    args = parser.parse_args(argv)

    label, info = machine(torch_device())
    result: dict = {
        "machine": label,
        "info": info,
        "date": date.today().isoformat(),
        "settings": {
            "set": args.set,
            "strategies": args.strategies,
            "quickstart": args.quickstart,
            "dvc": args.dvc,
        },
        # what was timed: `dvc repro` itself, or (without --dvc) dvc.yaml's stage commands run
        # one after the other, as `dvc repro` would where DVC is not installed
        "ran": (
            "make quick"
            if args.quickstart
            else "dvc repro"
            if args.dvc
            else "dvc.yaml's stage commands, one after the other"
        ),
        "seconds": {},
        "finished": False,  # until the last command: a cut-off run keeps what it timed
    }
    with tempfile.TemporaryDirectory(prefix="parallel-lab-e2e-") as tmp:
        project = project_copy(Path(tmp) / "project", args.mirror)
        env = {
            **os.environ,
            "PYTHONPATH": project_path(project),
            "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}",
            # the stages' `python` is this one, as in an activated environment
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        py = [sys.executable, "-m"]
        if args.dvc:
            set_params(project, args.set, args.strategies)
            result.update(dvc_repro(project, env, args.strategies))
            for stage, seconds in result["seconds"].items():
                print(f"e2e: {stage}: {seconds:.1f} s", flush=True)
            for name in args.strategies:
                metrics = json.loads((project / "results" / name / "metrics.json").read_text())
                result.setdefault("steady_epoch_s", {})[name] = metrics["steady_epoch_seconds"]
        elif args.quickstart:
            seconds, _ = timed([*py, "pipeline.quickstart", *args.set], project, env)
            result["seconds"]["quickstart"] = seconds
            print(f"e2e: make quick: {seconds:.0f} s", flush=True)
        else:
            result["seconds"]["fetch"], _ = timed([*py, "pipeline.fetch"], project, env)
            write_result(result, "e2e", args.out)  # after each command, as it went
            for name in args.strategies:
                timeline = Path(tmp) / f"timeline-{name}.txt"  # where the stage's wall goes
                marked = {**env, "PARALLEL_LAB_TIMELINE": str(timeline)}
                seconds, _ = timed([*py, "pipeline.train", name, *args.set], project, marked)
                summary = json.loads((project / "results" / name / "summary.json").read_text())
                result["seconds"][f"train@{name}"] = seconds
                result.setdefault("steady_epoch_s", {})[name] = summary["steady_epoch_seconds"]
                result.setdefault("warmup_epoch_s", {})[name] = summary["warmup_epoch_seconds"]
                phases = phase_offsets(timeline.read_text() if timeline.exists() else "")
                result.setdefault("phases_s", {})[name] = phases
                print(
                    f"e2e: train@{name}: {seconds:.1f} s (steady epoch "
                    f"{summary['steady_epoch_seconds']:.2f} s)",
                    flush=True,
                )
                write_result(result, "e2e", args.out)
            for name in args.strategies:  # dvc.yaml's predict@ stages, after the trains
                seconds, _ = timed([*py, "pipeline.predict", name, *args.set], project, env)
                result["seconds"][f"predict@{name}"] = seconds
                print(f"e2e: predict@{name}: {seconds:.1f} s", flush=True)
                write_result(result, "e2e", args.out)
            compare = ["pipeline.compare", f"strategies=[{','.join(args.strategies)}]", *args.set]
            result["seconds"]["compare"], _ = timed([*py, *compare], project, env)
        if not args.dvc:  # dvc repro's total is its own wall time
            result["seconds"]["total"] = sum(result["seconds"].values())
        result["finished"] = True
    out = write_result(result, "e2e", args.out)
    print(f"e2e: {result['ran']}: {result['seconds']['total']:.0f} s; wrote {out}", flush=True)
    return result


def torch_device():
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


if __name__ == "__main__":
    main()
