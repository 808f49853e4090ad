"""End-to-end wall time: what a user waits for, from the command to its results.

    python -m benchmarks.e2e --mirror DIR                       # every train stage, then compare
    python -m benchmarks.e2e --mirror DIR --quickstart          # `make quick`, whole
    python -m benchmarks.e2e --mirror DIR --set model.width=64 train.epochs=10

Copies the project into a temporary directory (its own results/, checkpoints/ and MLflow
store), fetches from --mirror (a directory with the four IDX files; their sums are taken as
they are), then times each command as a user runs it: process start, data to the device,
compilation, training, evaluation, MLflow, the report. Train stages are timed one after
the other, each on the whole machine. The JSON (benchmarks/results/<machine>-e2e-<date>.json
unless --out) holds every command's seconds, and the steady s/epoch each stage reported.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import yaml

from benchmarks.bench import REPO, machine
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


def project_copy(dest: Path, mirror: Path) -> Path:
    """The project in `dest`, a git repository, with params.yaml fetching from `mirror`."""
    for name in PROJECT_FILES:
        src, target = REPO / name, dest / name
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
        subprocess.run(
            ["git", "-c", "user.email=b@b", "-c", "user.name=b", *args], cwd=dest, check=True
        )
    return dest


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
    parser.add_argument("--strategies", nargs="*", default=list(NAMES))
    parser.add_argument("--quickstart", action="store_true", help="time `make quick` instead")
    parser.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/...)")
    args = parser.parse_args(argv)

    label, info = machine(torch_device())
    result: dict = {
        "machine": label,
        "info": info,
        "date": date.today().isoformat(),
        "settings": {"set": args.set, "strategies": args.strategies, "quickstart": args.quickstart},
        "seconds": {},
    }
    with tempfile.TemporaryDirectory(prefix="parallel-lab-e2e-") as tmp:
        project = project_copy(Path(tmp) / "project", args.mirror)
        env = {
            **os.environ,
            "PYTHONPATH": str(project),
            "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}",
        }
        py = [sys.executable, "-m"]
        if args.quickstart:
            seconds, _ = timed([*py, "pipeline.quickstart", *args.set], project, env)
            result["seconds"]["quickstart"] = seconds
            print(f"e2e: make quick: {seconds:.0f} s", flush=True)
        else:
            result["seconds"]["fetch"], _ = timed([*py, "pipeline.fetch"], project, env)
            for name in args.strategies:
                seconds, _ = timed([*py, "pipeline.train", name, *args.set], project, env)
                metrics = json.loads((project / "results" / name / "metrics.json").read_text())
                result["seconds"][f"train@{name}"] = seconds
                result.setdefault("steady_epoch_s", {})[name] = metrics["steady_epoch_seconds"]
                print(
                    f"e2e: train@{name}: {seconds:.1f} s (steady epoch "
                    f"{metrics['steady_epoch_seconds']:.2f} s)",
                    flush=True,
                )
            compare = ["pipeline.compare", f"strategies=[{','.join(args.strategies)}]", *args.set]
            result["seconds"]["compare"], _ = timed([*py, *compare], project, env)
        result["seconds"]["total"] = sum(result["seconds"].values())
    out = args.out or REPO / "benchmarks" / "results" / f"{label}-e2e-{result['date']}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"e2e: total {result['seconds']['total']:.0f} s; wrote {out}", flush=True)
    return result


def torch_device():
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


if __name__ == "__main__":
    main()
