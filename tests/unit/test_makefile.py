"""The Makefile as a newcomer meets it: `make` alone lists the targets, `make quick` passes
overrides, and a missing prerequisite is one line before anything is installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import REPO


def make(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path or os.environ["PATH"]}
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
