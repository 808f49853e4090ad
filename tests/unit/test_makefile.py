"""The Makefile as a newcomer meets it: `make` alone lists the targets, `make quick` passes
overrides, a missing prerequisite is one line before anything is installed, `make install
TORCH_CUDA=cu126` installs the lock's torch built for CUDA 12.6 (it cannot run here: no route
to download.pytorch.org, so its command lines are what is checked), and `make gpu-check`
falls back to the machine's own python3 where the pinned environment does not install."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO


def make(*args: str, path: str | None = None, **extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path or os.environ["PATH"], **extra}
    env.pop("MAKEFLAGS", None)
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_make_alone_lists_every_target_with_its_purpose():
    proc = make()
    assert proc.returncode == 0, proc.stderr
    listed = {line.split()[1] for line in proc.stdout.splitlines() if line.startswith("  make ")}
    assert {"help", "install", "quick", "run", "test", "test-fast", "lint", "ui"} <= listed
    assert 'ARGS="devices=cpu' in proc.stdout


def test_quick_passes_ARGS_to_the_quickstart():
    proc = make("-n", "quick", "ARGS=devices=cpu train.epochs=1", "VENV=.venv")
    assert proc.stdout.splitlines()[-1].endswith(
        "-m pipeline.quickstart devices=cpu train.epochs=1"
    )


def test_run_passes_ARGS_as_a_dvc_experiment_and_runs_dvc_repro_without():
    proc = make("-n", "run", "ARGS=devices=cpu train.epochs=1", "VENV=.venv")
    assert "dvc exp run -S 'devices=cpu' -S 'train.epochs=1'" in proc.stdout.splitlines()
    assert "dvc repro" in make("-n", "run", "VENV=.venv").stdout.splitlines()


def test_gpu_check_runs_the_script_on_the_DEVICE_asked_for():
    for args, device in (((), "cuda"), (("DEVICE=cpu",), "cpu")):
        proc = make("-n", "gpu-check", *args, "VENV=.venv")
        assert f"-m benchmarks.gpu_check --device {device}" in proc.stdout, proc.stdout


def test_compose_creates_env_and_runs_the_pipeline_service_with_its_exit_code():
    gpu = make("-n", "compose").stdout.splitlines()
    assert gpu == [
        "test -f .env || cp .env.example .env",
        "docker compose up --build --exit-code-from pipeline pipeline",
    ]
    cpu = make("-n", "compose", "DEVICE=cpu").stdout.splitlines()
    assert cpu[-1] == (
        "docker compose --profile cpu up --build --exit-code-from pipeline-cpu pipeline-cpu"
    )


def recorder(path: Path, label: str, log: Path, exit_code: int) -> None:
    """A python3 stand-in: appends its label, arguments and PYTHONPATH to `log`, exits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'#!/bin/sh\necho "{label} $* PYTHONPATH=$PYTHONPATH" >> {log}\nexit {exit_code}\n'
    )
    path.chmod(0o755)


@pytest.mark.parametrize("activated", [False, True], ids=["plain", "venv-activated"])
def test_gpu_check_falls_back_to_the_machines_python3_not_the_half_made_venvs(tmp_path, activated):
    """A half-made venv whose python and python3 fail makes the install fail; the Makefile
    puts that venv's bin first on PATH, so `python3` there is the venv's. The fallback runs
    the python3 found outside the venv, for the carried wheels and the check alike, with an
    activated venv too."""
    log, venv, machine = tmp_path / "calls.log", tmp_path / "venv", tmp_path / "machine"
    for name in ("python", "python3"):
        recorder(venv / "bin" / name, "venv", log, 1)
    recorder(machine / "python3", "machine", log, 0)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"")
    path = f"{machine}:{os.environ['PATH']}"
    if activated:
        path = f"{venv}/bin:{path}"
    # relative to the checkout, as the default .venv is
    relative = os.path.relpath(venv, REPO)
    proc = make(
        "gpu-check", f"VENV={relative}", "DEVICE=cpu", f"WHEELS={wheels}", path=path, PYTHONPATH=""
    )
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    # the failed install ran the venv's python3: it is the one on the exported PATH
    assert any(call.startswith("venv -c ") for call in calls), calls
    assert [call for call in calls if not call.startswith("venv ")] == [
        "machine -m pip install -q --no-index --no-deps --upgrade --target .gpu-site "
        f"{wheels}/a-1.0-py3-none-any.whl PYTHONPATH=",
        f"machine -m benchmarks.gpu_check --device cpu PYTHONPATH={REPO}/.gpu-site",
    ]
    assert f"using {machine}/python3 and its own torch" in proc.stderr


def test_gpu_wheels_downloads_into_DIR_and_without_it_says_so_before_any_install(tmp_path):
    proc = make("-n", "gpu-wheels", "DIR=/carry/wheels", "VENV=.venv")
    assert proc.stdout.splitlines()[-1] == (
        ".venv/bin/python -m benchmarks.gpu_wheels --download /carry/wheels"
    )
    venv = tmp_path / "venv"
    proc = make("gpu-wheels", f"VENV={venv}")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("make")]
    assert errors == ["error: make gpu-wheels DIR=<directory>: where to put the wheels"]
    assert not venv.exists()


def test_an_old_python_is_refused_in_one_line_before_any_install(tmp_path):
    """A python3 that reports 3.10 (the real interpreter with its version_info replaced)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "sys.version_info = (3, 10, 12, 'final', 0)\n"
        "exec(compile(sys.argv[2], '-c', 'exec'))\n"
    )
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    proc = make("install", f"VENV={venv}", path=f"{bin_dir}:{os.environ['PATH']}")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("make")]
    assert errors == ["error: Python 3.11 or newer is needed; python3 is 3.10"], proc.stderr
    assert not Path(venv).exists()


LOCK = (REPO / "requirements.lock").read_text()
PINS = dict(re.findall(r"^(torch|torchvision)==(\S+)$", LOCK, re.M))
CU126_INDEX = "https://download.pytorch.org/whl/cu126"


def test_default_install_is_the_lock_as_it_is(tmp_path):
    venv = tmp_path / "venv"
    proc = make("-n", "install", f"VENV={venv}")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert f"{venv}/bin/python -m pip install --quiet -r requirements.lock" in lines
    assert "download.pytorch.org" not in proc.stdout
    assert lines[-1] == f"echo cu130 > {venv}/.installed"


def test_install_TORCH_CUDA_cu126_takes_the_locked_torch_from_the_cuda_12_6_index(tmp_path):
    """The lock minus the CUDA 13 torch stack from PyPI, then the lock's torch and
    torchvision, built for CUDA 12.6, from PyTorch's index."""
    venv = tmp_path / "venv"
    proc = make("-n", "install", "TORCH_CUDA=cu126", f"VENV={venv}")
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if "lock-cu126.txt" in x]
    write_rest, install_rest, install_torch = line.split(" && ")
    assert install_rest == f"{venv}/bin/python -m pip install --quiet -r {venv}/lock-cu126.txt"
    assert install_torch == (
        f"{venv}/bin/python -m pip install --quiet --index-url {CU126_INDEX} "
        f"torch=={PINS['torch']}+cu126 torchvision=={PINS['torchvision']}+cu126"
    )
    assert "-r requirements.lock" not in proc.stdout
    assert proc.stdout.splitlines()[-1] == f"echo cu126 > {venv}/.installed"

    venv.mkdir()
    subprocess.run(["bash", "-c", write_rest], cwd=REPO, check=True)
    rest = (venv / "lock-cu126.txt").read_text().splitlines()
    stack = re.compile(r"^(torch|torchvision|triton|cuda-[a-z-]+|nvidia-[a-z0-9-]+)==")
    assert sorted(rest) == sorted(
        line
        for line in LOCK.splitlines()
        if not stack.match(line) or line.startswith("nvidia-ml-py==")
    )


def test_the_installed_build_sticks_and_naming_the_other_starts_afresh(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed").write_text("cu126\n")
    proc = make("-n", "install", f"VENV={venv}")
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout, proc.stdout
    proc = make("-n", "install", "TORCH_CUDA=cu130", f"VENV={venv}")
    assert f"python3 -m venv --clear {venv}" in proc.stdout.splitlines()
    assert f"{venv}/bin/python -m pip install --quiet -r requirements.lock" in proc.stdout


def test_an_unknown_TORCH_CUDA_is_refused_in_one_line_before_any_install(tmp_path):
    venv = tmp_path / "venv"
    proc = make("install", "TORCH_CUDA=cu128", f"VENV={venv}")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("make")]
    assert errors == [
        "error: TORCH_CUDA=cu128: expected cu130 (the default: PyPI's torch for CUDA 13.0, "
        "NVIDIA driver 580 or newer) or cu126 (torch for CUDA 12.6, driver 525 or newer)"
    ], proc.stderr
    assert not venv.exists()
