"""The shipped DVC remote, for real: `dvc push` in one clone, `dvc pull` in a fresh clone
beside it, and the second clone has every output of the first, byte for byte, with nothing
for `dvc repro` to run (no retraining); and docs/mlflow.md's way to S3 keeps the locked DVC."""

import json
import re
import subprocess
from pathlib import Path

import yaml
from dvc.repo import Repo

from support import REPO, dvc, make_project, run, tiny_params

STAGES = ("fetch", "train@single", "compare")


def default_remote(project: Path) -> Path:
    """Where the project's default remote resolves to, as DVC reads its config."""
    with Repo(str(project)) as repo:
        return Path(repo.config["remote"][repo.config["core"]["remote"]]["url"])


def outputs(project: Path) -> dict[str, bytes]:
    """Every file of every stage output that dvc.lock records (directories expanded), by
    path in the project."""
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    files = {}
    for stage in lock["stages"].values():
        for out in stage["outs"]:
            path = project / out["path"]
            found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
            for file in found:
                files[file.relative_to(project).as_posix()] = file.read_bytes()
    return files


def test_push_then_pull_in_another_clone_leaves_nothing_to_run(tmp_path, http_mirror):
    params = tiny_params(
        http_mirror,
        strategies=["single"],
        model={"width": 4},
        data={"limit_train": 64, "limit_test": 32},
        train={"epochs": 1},
        report={"system_metrics_interval_s": None},
    )
    # Two clones side by side, as a user's would be: the shipped default remote is then
    # their shared sibling, which here lies in tmp_path (never the user's own remote).
    first = make_project(tmp_path / "parallel-lab", params)
    remote = tmp_path / "parallel-lab-dvc-remote"
    assert default_remote(first) == remote
    dvc(first, "repro", timeout=600)
    run(first, "git", "add", "-A")  # dvc.lock and the git-tracked metrics files
    run(first, "git", "commit", "-qm", "trained")
    dvc(first, "push")
    assert any(p.is_file() for p in remote.rglob("*"))

    second = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(first), str(second)], check=True)
    assert default_remote(second) == remote
    # git brought code, params, dvc.lock and the metrics, no DVC cache: the stages are stale
    assert not (second / ".dvc" / "cache").exists()
    assert json.loads(dvc(second, "status", "--json").stdout) != {}

    dvc(second, "pull")
    assert json.loads(dvc(second, "status", "--json").stdout) == {}
    again = dvc(second, "repro")
    assert "Running stage" not in again.stdout, again.stdout
    for stage in STAGES:
        assert f"Stage '{stage}' didn't change, skipping" in again.stdout, again.stdout
    pulled, trained = outputs(second), outputs(first)
    assert {"results/single/model.pt", "results/single/metrics.json"} <= set(trained)
    assert pulled.keys() == trained.keys()
    assert [p for p in trained if pulled[p] != trained[p]] == []


def test_the_docs_s3_install_is_the_locked_dvc():
    """docs/mlflow.md's `pip install "dvc[s3]==X"` adds S3 to the DVC the lock pins, not
    another."""
    (locked,) = re.findall(r"^dvc==(\S+)$", (REPO / "requirements.lock").read_text(), re.M)
    page = (REPO / "docs" / "mlflow.md").read_text()
    assert re.findall(r'pip install "dvc\[s3\]==([^"]+)"', page) == [locked]
