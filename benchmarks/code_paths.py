"""How much code a reader meets, measured on real runs: issue 70's figures, side by side for
this checkout and another (`--ref DIR`, the code before).

For each checkout, in a project copy of its own on the same synthetic data:
- lines: every .py file of pipeline/, and their lines;
- the optimizer step's path: one `train@ddp` stage (2 processes, gloo, 1 epoch at width 8)
  with the fault hook's `trace` action at rank 0's first optimizer step, which prints the
  project's frames from the command down (pipeline/interrupts/faults.py): the distinct files
  on that stack and their lines;
- what one DDP run touches: the project's modules loaded by any process of that stage (the
  launcher, its workers, the MLflow publisher), collected by a `sitecustomize` that each
  process runs at start and that writes its `sys.modules` as it exits (forked processes
  included: it patches `os._exit` and registers after-fork hooks);
- `duplicates pipeline`: its pairs of places sharing six or more lines (where the tool is on
  PATH).

    python -m benchmarks.code_paths --ref /path/to/checkout-before
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

import torch

from benchmarks.bench import REPO, machine, write_result
from benchmarks.e2e import fetched_copy
from pipeline.data.synthetic import write_synthetic

# Each process of the run writes the project modules it loaded into $CODE_PATHS_DIR/<pid>.txt.
SITECUSTOMIZE = """
import atexit, os, sys

def _dump():
    out = os.environ.get("CODE_PATHS_DIR")
    if not out:
        return
    files = sorted({getattr(m, "__file__", None) or "" for m in list(sys.modules.values())})
    with open(os.path.join(out, f"{os.getpid()}.txt"), "w") as f:
        f.write("\\n".join(x for x in files if x))

_exit = os._exit

def _dumping_exit(code):
    _dump()
    _exit(code)

os._exit = _dumping_exit
atexit.register(_dump)
"""
RUN = ("model.width=8", "train.epochs=1", "ddp.nproc=2", "checkpoint.every_epochs=0")
TRACE = "rank=0,point=optimizer,epoch=1,step=1,action=trace"


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def package_lines(tree: Path) -> dict[str, int]:
    files = sorted((tree / "pipeline").rglob("*.py"))
    return {"files": len(files), "lines": sum(lines(f) for f in files)}


def measure(tree: Path, work: Path, mirror: Path) -> dict[str, Any]:
    project, env = fetched_copy(tree, work / "project", mirror)
    site, dumps = work / "site", work / "modules"
    site.mkdir()
    dumps.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {
        **env,
        "PYTHONPATH": os.pathsep.join([str(site), env["PYTHONPATH"]]),
        "CODE_PATHS_DIR": str(dumps),
        "PARALLEL_LAB_FAULT": TRACE,
    }
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.train", "ddp", *RUN],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise SystemExit(f"train@ddp failed in {tree}:\n{done.stdout}\n{done.stderr}")
    (trace,) = [x for x in done.stdout.splitlines() if x.startswith("fault: rank 0 stack")]
    frames = trace.partition(": ")[2].partition(": ")[2].split(" > ")
    stack_files = sorted({frame.split(":")[0] for frame in frames})
    touched: set[str] = set()
    processes = 0
    for dump in dumps.glob("*.txt"):
        processes += 1
        for name in dump.read_text().splitlines():
            path = Path(name)
            if project / "pipeline" in path.parents:
                touched.add(str(path.relative_to(project)))
    return {
        "package": package_lines(tree),
        "step_path": {
            "frames": frames,
            "files": stack_files,
            "lines": sum(lines(tree / f) for f in stack_files),
        },
        "ddp_run": {
            "processes": processes,
            "files": len(touched),
            "lines": sum(lines(tree / f) for f in touched),
            "modules": sorted(touched),
        },
        "duplicates": duplicate_pairs(tree),
    }


def duplicate_pairs(tree: Path) -> int | None:
    if shutil.which("duplicates") is None:
        return None
    done = subprocess.run(
        ["duplicates", "--most", "200", "--seconds", "300"],
        cwd=tree / "pipeline",
        capture_output=True,
        text=True,
        timeout=600,
    )
    found = re.search(r"(\d+) pairs?", done.stdout + done.stderr)
    return int(found[1]) if found else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", type=Path, help="another checkout: the code before")
    parser.add_argument("--out", type=Path, help="the JSON's path (default: benchmarks/results)")
    args = parser.parse_args(argv)
    trees = {"this": REPO, **({"ref": args.ref.resolve()} if args.ref else {})}
    label, info = machine(torch.device("cpu"))
    result: dict[str, Any] = {"machine": label, "info": info, "date": date.today().isoformat()}
    with tempfile.TemporaryDirectory(prefix="code-paths-") as tmp:
        mirror = Path(tmp) / "mirror"
        write_synthetic(mirror, 600, 300)
        for key, tree in trees.items():
            result[key] = {"tree": str(tree), **measure(tree, Path(tmp) / key, mirror)}
    for key in trees:
        r = result[key]
        print(
            f"{key}: pipeline/ {r['package']['files']} files, {r['package']['lines']} lines; "
            f"command to optimizer step {len(r['step_path']['files'])} files, "
            f"{r['step_path']['lines']} lines; one DDP run {r['ddp_run']['files']} files, "
            f"{r['ddp_run']['lines']} lines; duplicates {r['duplicates']}"
        )
    write_result(result, "code-paths", args.out)
    return result


if __name__ == "__main__":
    main()
