"""The project's own images (trainer and MLflow server), built by the container tests from
the real Dockerfiles on the stand-in bases of `make docker-setup`.

A cold build (no cached layers, as on a fresh CI machine) takes 4-6 minutes, mostly network
and disk. So conftest starts both builds in the background as soon as collection shows a
test that needs them, and that test waits for their exit codes (files) when it gets there,
while the workers have run other tests. Under xdist every worker collects: the first to
create the run's build directory starts the builds, the others find it there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from support import REPO, wait_for

BUILD = REPO / "docker" / "standins" / "build.py"
PIPELINE_IMAGE = "parallel-lab-e2e/pipeline:test"
MLFLOW_IMAGE = "parallel-lab-e2e/mlflow:test"
RUN_ID = pytest.StashKey[str]()


def setup_status() -> dict:
    """What `make docker-setup` provided, as build.py reports it (it changes nothing)."""
    proc = subprocess.run(
        [sys.executable, str(BUILD), "status"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"build.py status exited {proc.returncode}\n{proc.stderr}"
    return json.loads(proc.stdout)


def build_dir(config: pytest.Config) -> Path:
    """One directory per test run, the same in every xdist worker of it."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        run_id = workerinput["testrunuid"]
    else:
        run_id = config.stash.setdefault(RUN_ID, uuid.uuid4().hex)
    return Path(tempfile.gettempdir()) / f"parallel-lab-image-builds-{run_id}"


# tag -> (build context, which stand-in base it builds on)
BUILDS = {
    MLFLOW_IMAGE: (REPO / "docker" / "mlflow", "python"),
    PIPELINE_IMAGE: (REPO, "pytorch"),
}


def files(directory: Path, tag: str) -> tuple[Path, Path, Path]:
    """A build's log, exit code and process id files."""
    stem = directory / tag.split("/")[-1].replace(":", "-")
    return stem.with_suffix(".log"), stem.with_suffix(".rc"), stem.with_suffix(".pid")


def start(directory: Path, bases: dict[str, str]) -> None:
    """Start both builds unless this run already has. Each writes its exit code to a file
    when it ends (renamed into place, so a reader never sees half of it)."""
    try:
        directory.mkdir()
    except FileExistsError:
        return
    for tag, (context, base) in BUILDS.items():
        log, rc, pid = files(directory, tag)
        # --network host: this machine reaches PyPI only through its own network setup.
        # The legacy builder is asked for explicitly: every Docker here has it (no buildx).
        build = f"BASE_IMAGE={bases[base]}", "-t", tag, str(context)
        proc = subprocess.Popen(
            ["sh", "-c", '"$@"; echo $? > "$RC.part" && mv "$RC.part" "$RC"', "sh"]
            + ["docker", "build", "--network", "host", "--build-arg", *build],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "DOCKER_BUILDKIT": "0", "RC": str(rc)},
            start_new_session=True,  # its own group: a timed-out wait stops the whole build
        )
        pid.write_text(str(proc.pid))


def wait(directory: Path, timeout: float) -> list[str]:
    """Block until every build has ended; what failed (or was stopped at `timeout` s), with
    the end of its log."""
    deadline = time.monotonic() + timeout
    failed = []
    for tag in BUILDS:
        log, rc, pid = files(directory, tag)
        try:
            # at least one look: a build may have ended while another was waited for
            wait_for(rc.exists, max(0.1, deadline - time.monotonic()), f"docker build {tag}")
            code = rc.read_text().strip()
        except AssertionError:
            code = f"still running after {timeout:.0f} s; stopped"
            try:
                os.killpg(int(pid.read_text()), signal.SIGTERM)
            except ProcessLookupError:
                pass
        if code != "0":
            failed.append(f"docker build {tag}: {code}\n{log.read_text()[-6000:]}")
    return failed


def start_early(config: pytest.Config) -> None:
    """Start the builds now if the setup step has done its part; where it has not, nothing
    starts and the tests say what is missing."""
    try:
        status = setup_status()
    except (AssertionError, OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        return
    if status["engine"] == "running" and not status["missing_images"]:
        start(build_dir(config), status["images"])
