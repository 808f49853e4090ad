"""benchmarks/suite_cpu.py: how processes are told apart, and that the sampler sees the CPU a
real child process spends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.suite_cpu import Proc, Sampler, kind_of, measure, summarize
from support import wait_for

PY = "/work/.venv/bin/python"
LAUNCHER = f"{PY} -m pipeline.train ddp mlflow.final_sync_wait_s=180"
CASES = [
    (f"{PY} -m pytest -n 2 --dist loadgroup", None, "pytest and its workers"),
    (f"{PY} -u -c import sys;exec(eval(sys.stdin.readline()))", None, "pytest and its workers"),
    (LAUNCHER, f"{PY} -m pytest", "pipeline.train"),
    (LAUNCHER, LAUNCHER, "pipeline.train: forked"),
    (f"{PY} -m pipeline.compare", None, "pipeline.compare"),
    ("python -m pipeline.fetch", "sh -c dvc repro", "pipeline.fetch"),
    (
        f"{PY} -c \nimport json\nfrom pipeline import train\n",
        None,
        "pipeline in-process (python -c)",
    ),
    (f"{PY} -m benchmarks.gpu_check --device cpu", None, "benchmarks.gpu_check"),
    (f"{PY} /work/.venv/bin/mlflow server --host 127.0.0.1", None, "MLflow server"),
    (f"{PY} /work/.venv/bin/dvc repro", None, "dvc"),
    ("/usr/lib/gcc/x86_64-linux-gnu/12/cc1plus -quiet -I x", None, "C++ compiler"),
    ("g++ /tmp/k.cpp -shared -o k.so", None, "C++ compiler"),
    ("/usr/bin/dockerd --data-root x", None, "containers"),
    ("postgres: mlflow mlflow 172.18.0.3(4242) idle", None, "containers"),
    ("/usr/bin/python3 -c pass", None, "python, other"),
    ("[kworker/0:1-events]", None, "kernel threads"),
    ("/usr/bin/git status --porcelain", None, "git"),
    # a module named in a path or a -c script is not the one python runs
    (f"{PY} -m benchmarks.bench --out /tmp/pytest-of-root/x.json", None, "benchmarks.bench"),
    (
        f"{PY} -c \nfrom pipeline import train\nprint('python -m pipeline.train')",
        None,
        "pipeline in-process (python -c)",
    ),
]


@pytest.mark.parametrize(("cmd", "parent", "kind"), CASES)
def test_each_process_gets_its_kind(cmd, parent, kind):
    assert kind_of(cmd, parent) == kind


def test_a_summary_sums_by_kind_and_tells_forks_from_launchers():
    procs = [
        Proc(1, 0, "python -m pytest", 10.0),
        Proc(2, 1, LAUNCHER, 3.0),
        Proc(3, 2, LAUNCHER, 2.0),  # its worker
        Proc(4, 2, LAUNCHER, 1.0),  # its publisher
        Proc(5, 1, LAUNCHER, 4.0),  # another stage
    ]
    summary = summarize(procs)
    assert {
        kind: (r["cpu_s"], r["processes"], r["median_cpu_s"]) for kind, r in summary.items()
    } == {
        "pytest and its workers": (10.0, 1, 10.0),
        "pipeline.train": (7.0, 2, 3.5),
        "pipeline.train: forked": (3.0, 2, 1.5),
    }
    assert list(summary) == ["pytest and its workers", "pipeline.train", "pipeline.train: forked"]
    assert summary["pipeline.train"]["largest"] == [[4.0, LAUNCHER], [3.0, LAUNCHER]]


SPIN = "import time\nwhile time.process_time() < 0.5: pass"


def test_the_sampler_sees_a_childs_cpu_time():
    """The child spins until it has spent 0.5 s of CPU; the last sample is at most 0.1 s of
    wall time before it exits, so at least 0.3 s of it is seen whatever the load."""
    with Sampler() as sampler:
        spinner = subprocess.Popen([sys.executable, "-c", SPIN])
        spinner.wait()
    (child,) = [p for p in sampler.procs({}) if p.pid == spinner.pid]
    assert 0.3 <= child.cpu_s and kind_of(child.cmd, None) == "python, other"


def test_a_fork_seen_before_its_exec_is_named_by_what_it_runs():
    """A process first sampled between fork and exec has its parent's command line; once
    it has exec'd, its own."""
    sampler = Sampler()
    release, hold = os.pipe()
    stdin, stop = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait for the word, then become a python reading stdin
        try:
            os.read(release, 1)
            os.dup2(stdin, 0)
            os.execv(sys.executable, [sys.executable, "-c", "import sys; sys.stdin.read(1)"])
        finally:
            os._exit(1)  # never back into pytest
    try:
        sampler.sample()
        assert sampler.by_pid[pid].cmd == sampler.by_pid[os.getpid()].cmd
        os.write(hold, b"x")

        def execd() -> bool:
            sampler.sample()
            return kind_of(sampler.by_pid[pid].cmd, None) == "python, other"

        wait_for(execd, 60, "the fork's exec")
    finally:
        os.write(hold, b"x")  # a second byte if it was released already: never read
        os.write(stop, b"x")
        os.waitpid(pid, 0)


def test_a_fork_keeps_its_command_line_once_it_has_exited():
    """A stage's worker has its launcher's command line and is read again at each sample (it
    might have exec'd); once exited, a zombie has none, and it stays the worker it was."""
    sampler = Sampler()
    release, hold = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a fork that exits when told
        os.read(release, 1)
        os._exit(0)
    try:
        sampler.sample()
        ours = sampler.by_pid[os.getpid()].cmd
        assert sampler.by_pid[pid].cmd == ours
        os.write(hold, b"x")

        def exited() -> bool:  # a zombie: state Z, until waitpid reaps it
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"

        wait_for(exited, 60, "the fork to exit")
        sampler.sample()
        assert sampler.by_pid[pid].cmd == ours
    finally:
        os.write(hold, b"x")
        os.waitpid(pid, 0)


def test_measure_accounts_for_the_command_it_runs():
    result = measure([sys.executable, "-c", SPIN])
    assert result["exit_code"] == 0
    assert result["kinds"]["python, other"]["cpu_s"] >= 0.3
    assert 0 < result["busy_share"] <= 1
