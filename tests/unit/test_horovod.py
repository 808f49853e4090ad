"""The opt-in `horovod` strategy where Horovod is not installed: `python -m pipeline.train
horovod` is refused in the launcher with one line naming the make target that builds it, exit
code 2, before any process starts; and the build script's own refusal of a machine without
cmake or a C++ compiler, one line naming what to install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import REPO, make_project, refused, tiny_params

NOT_INSTALLED = (
    "error: strategy horovod: Horovod is not installed in this Python (No module named "
    "'horovod'); `make install HOROVOD=1` builds it (docs/horovod.md)"
)


def test_horovod_without_horovod_is_one_line_naming_the_make_target(tmp_path, http_mirror):
    project = make_project(tmp_path / "project", tiny_params(http_mirror))
    # Horovod may be installed in this venv (make install HOROVOD=1): a `horovod` package
    # first on the path whose import fails as a missing one does makes this Python one
    # without it, whichever this is
    absent = tmp_path / "without-horovod"
    (absent / "horovod").mkdir(parents=True)
    (absent / "horovod" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'horovod'\", name='horovod')\n"
    )
    path = f"{project}{os.pathsep}{absent}"
    assert refused(project, "pipeline.train", "horovod", PYTHONPATH=path) == NOT_INSTALLED


def test_the_build_without_cmake_or_a_compiler_says_what_to_install(tmp_path):
    # a PATH with make alone: no cmake, no c++ (the wheel's cache is looked at first, so
    # the script is pointed at an empty one)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "make").symlink_to("/usr/bin/make")
    env = {**os.environ, "PATH": str(bin_dir), "PARALLEL_LAB_HOROVOD_CACHE": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "horovod" / "build_wheel.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "error: building Horovod needs cmake, c++, not found on PATH "
        "(Debian/Ubuntu: apt-get install cmake g++)"
    ]


def test_horovodruns_variables_are_read_as_torchruns():
    from pipeline.context import DistContext
    from pipeline.launch.horovod_run import torchrun_env, under_horovodrun

    env = {
        "HOROVOD_RANK": "1",
        "HOROVOD_SIZE": "2",
        "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_CROSS_RANK": "0",
        "HOROVOD_CROSS_SIZE": "1",
    }
    assert under_horovodrun(env) and not under_horovodrun({"RANK": "1", "WORLD_SIZE": "2"})
    ctx = DistContext.from_env({**torchrun_env(env), "CUDA_VISIBLE_DEVICES": ""})
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.node, ctx.nodes) == (1, 1, 2, 0, 1)


def test_the_launch_is_horovodrun_with_gloo_on_this_host():
    from pipeline.launch.horovod_run import command

    cmd = command("horovod", 3)
    assert cmd[0] == str(Path(sys.executable).with_name("horovodrun"))
    assert cmd[1:] == [
        "-np",
        "3",
        "-H",
        "localhost:3",
        "--gloo",
        "--network-interfaces",
        "lo",
        sys.executable,
        "-m",
        "pipeline.train",
        "horovod",
    ]


def test_restarts_are_refused_for_horovodruns_workers(tmp_path, http_mirror):
    project = make_project(tmp_path / "project", tiny_params(http_mirror))
    line = refused(project, "pipeline.train", "horovod", "checkpoint.max_restarts=1")
    assert line == (
        "error: checkpoint.max_restarts: got 1, but horovod's workers are horovodrun's, which "
        "restarts none; expected 0 (run the stage again: it resumes from its last checkpoint)"
    )


def test_make_install_builds_horovod_only_when_asked():
    def commands(*args: str) -> list[str]:
        env = {k: v for k, v in os.environ.items() if k != "MAKEFLAGS"}
        proc = subprocess.run(
            ["make", "--no-print-directory", "-C", str(REPO), "-n", *args, "VENV=.venv"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.splitlines()

    build = ".venv/bin/python deploy/horovod/build_wheel.py --install"
    assert build in commands("install", "HOROVOD=1")
    assert build in commands("horovod")
    assert build not in commands("install")
