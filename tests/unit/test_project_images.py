"""The container tests' background image builds (tests/project_images.py), with a stand-in
`docker` on PATH: each build starts once per run, a failure comes back with its exit code
and log, and a build that outlives the wait is stopped, its whole process group."""

import os
import stat

import psutil

import project_images
from project_images import MLFLOW_IMAGE, PIPELINE_IMAGE

BASES = {"python": "base/python:1", "pytorch": "base/pytorch:1"}


def fake_docker(tmp_path, monkeypatch, body: str) -> None:
    """`docker` on PATH is a shell script: it notes its arguments, then runs `body`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "docker"
    script.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_each_image_builds_once_per_run_and_failures_say_which(tmp_path, monkeypatch):
    fake_docker(tmp_path, monkeypatch, 'case "$*" in *mlflow*) echo "no such wheel"; exit 3;; esac')
    directory = tmp_path / "builds"
    project_images.start(directory, BASES)
    project_images.start(directory, BASES)  # another worker, or the fixture after collection
    failed = project_images.wait(directory, timeout=60)
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 2
    assert any(f"BASE_IMAGE=base/pytorch:1 -t {PIPELINE_IMAGE}" in call for call in calls)
    assert any(f"BASE_IMAGE=base/python:1 -t {MLFLOW_IMAGE}" in call for call in calls)
    assert failed == [f"docker build {MLFLOW_IMAGE}: 3\nno such wheel\n"]


def test_a_build_that_outlives_the_wait_is_stopped(tmp_path, monkeypatch):
    # the build blocks reading a FIFO nobody writes: it can only end by being stopped
    fifo = tmp_path / "never"
    os.mkfifo(fifo)
    fake_docker(tmp_path, monkeypatch, f"read line < {fifo}")
    directory = tmp_path / "builds"
    project_images.start(directory, BASES)
    shells = [psutil.Process(int(p.read_text())) for p in directory.glob("*.pid")]
    failed = project_images.wait(directory, timeout=1)
    assert len(failed) == 2
    assert all("still running after 1 s; stopped" in f for f in failed)
    gone, alive = psutil.wait_procs(shells, timeout=30)
    assert not alive
