"""The project's own files, damaged, are bad input like any other (docs/reliability.md):
exit code 2, one line naming the file and the command that fixes it, and everything the
project kept byte-identical, the damaged file included (support.refused), with no MLflow run
added or left RUNNING.

One tiny ddp run (two processes, one epoch) is trained once; each case damages one of its
files, runs the command that reads it and puts the file back. Two ranks: a checkpoint read is
collective, so a file only one rank reads (rank1.pt) must stop both alike, not leave rank 0
waiting in a collective. (Each damaged checkpoint file's other forms, in one process:
tests/unit/test_damaged_files.py.)
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from support import make_project, refused, run, tiny_params

STEP = "checkpoints/ddp/e1-s0"  # the one checkpoint of a 1-epoch run


@pytest.fixture(scope="module")
def trained(tmp_path_factory, http_mirror) -> Path:
    params = tiny_params(http_mirror, strategies=["ddp"], train={"epochs": 1})
    params["data"].update(limit_train=128, limit_test=64)
    project = make_project(tmp_path_factory.mktemp("bad-files") / "project", params)
    run(project, "python", "-m", "pipeline.fetch")
    run(project, "python", "-m", "pipeline.train", "ddp")
    assert (project / STEP / "rank1.pt").exists()
    return project


def garbage(data: bytes) -> bytes:
    return b"not what the project wrote\n"


def truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def zeroed(data: bytes) -> bytes:
    """Bytes overwritten inside: the file keeps its size, so only reading it tells."""
    return data[:100] + bytes(1900) + data[2000:]


@contextlib.contextmanager
def damaged(project: Path, name: str, damage: Callable[[bytes], bytes]) -> Iterator[None]:
    path = project / name
    kept = path.read_bytes()
    path.write_bytes(damage(kept))
    try:
        yield
    finally:
        path.write_bytes(kept)


def mlflow_runs(project: Path) -> list[tuple[str, str]]:
    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tests").experiment_id
    return sorted((r.info.run_id, r.info.status) for r in client.search_runs([experiment]))


CASES = [
    # read by every worker, before the collective load (checkpoint_files.verify)
    ("train", f"{STEP}/rank1.pt", garbage, [f"{STEP}/rank1.pt: corrupt"]),
    ("train", f"{STEP}/.metadata", truncated, [f"{STEP}/.metadata: corrupt"]),
    # in the collective load itself: DCP fails on both ranks alike
    ("train", f"{STEP}/__0_0.distcp", zeroed, [f"{STEP}: a shard is damaged"]),
    # read by the launcher before torchrun starts
    ("train", "checkpoints/ddp/latest.json", truncated, ["latest.json: corrupt checkpoint"]),
    ("train", "checkpoints/ddp/run.json", truncated, ["run.json: corrupt MLflow run record"]),
    ("train", "data/fashion-mnist/arrays.npz", truncated, ["arrays.npz: corrupt"]),
    # the compare stage's and publish's reads
    ("compare", "results/ddp/summary.json", truncated, ["summary.json: not a run summary"]),
    ("compare", "results/ddp/history.csv", garbage, ["history.csv: not a history"]),
    ("compare", "checkpoints/ddp/run.json", garbage, ["run.json: corrupt MLflow run record"]),
    ("publish", "checkpoints/ddp/latest.json", garbage, ["latest.json: corrupt checkpoint"]),
    ("publish", "checkpoints/ddp/run.json", truncated, ["run.json: corrupt MLflow run record"]),
]
# the one command each file's line must name
FIXES = {
    "checkpoints/ddp/run.json": "rm checkpoints/ddp/run.json",
    "data/fashion-mnist/arrays.npz": "dvc repro fetch",
    "results/ddp/summary.json": "python -m pipeline.train ddp",
    "results/ddp/history.csv": "python -m pipeline.train ddp",
}


@pytest.mark.parametrize(
    "command, name, damage, words",
    CASES,
    ids=[f"{c}-{n.rsplit('/', 1)[-1]}-{d.__name__}" for c, n, d, _ in CASES],
)
def test_a_damaged_file_is_refused_with_its_fix(trained, command, name, damage, words):
    runs = mlflow_runs(trained)
    args = ["pipeline.train", "ddp"] if command == "train" else [f"pipeline.{command}"]
    with damaged(trained, name, damage):
        line = refused(trained, *args)
    fix = FIXES.get(name, "rm -r checkpoints/ddp")
    assert all(word in line for word in words) and fix in line, line
    assert mlflow_runs(trained) == runs  # none added, none left RUNNING (it was FINISHED)


def without(key: str) -> Callable[[bytes], bytes]:
    """A JSON file as an older parallel-lab wrote it: without `key`, which it did not write."""

    def damage(data: bytes) -> bytes:
        content = json.loads(data)
        del content[key]
        return json.dumps(content).encode()

    damage.__name__ = f"without_{key}"
    return damage


def without_core_wait(data: bytes) -> bytes:
    """history.csv as a parallel-lab before core_wait was measured wrote it."""
    lines = data.decode().splitlines()
    cut = lines[0].split(",").index("core_wait")
    kept = [",".join(c for i, c in enumerate(line.split(",")) if i != cut) for line in lines]
    return ("\n".join(kept) + "\n").encode()


OLDER = "written by an older parallel-lab: rerun with --force (dvc repro --force train@ddp)"
OLDER_CASES = [
    ("compare", "results/ddp/summary.json", without("steady_basis")),
    ("compare", "results/ddp/history.csv", without_core_wait),
    ("publish", "checkpoints/ddp/latest.json", without("epoch_seconds")),
]


@pytest.mark.parametrize(
    "command, name, damage",
    OLDER_CASES,
    ids=[f"{c}-{n.rsplit('/', 1)[-1]}-{d.__name__}" for c, n, d in OLDER_CASES],
)
def test_a_file_of_an_older_format_gets_one_line(trained, command, name, damage):
    """Issue 70 goal 6: no reader is kept for an older parallel-lab's files; the command that
    reads one says so in one line and leaves everything as it was."""
    runs = mlflow_runs(trained)
    with damaged(trained, name, damage):
        line = refused(trained, f"pipeline.{command}")
    assert line == f"error: {name}: {OLDER}"
    assert mlflow_runs(trained) == runs
