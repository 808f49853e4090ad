"""The container's entrypoint on `docker stop`, outside Docker: SIGTERM reaches the image's
default command, `sh -c "dvc repro && ..."`, as SIGINT to DVC and to the shell, and the exit
status is DVC's 255 (a failed stage), not the shell's 143 (killed by SIGTERM)."""

import signal
import subprocess
import sys

from support import REPO

# A stand-in for DVC (the entrypoint knows DVC by the name of its script): SIGINT fails the
# running stage with 255, as DVC does; SIGTERM would kill it.
FAKE_DVC = """
import signal, sys
signal.signal(signal.SIGINT, lambda *_: sys.exit(255))
print("stage running", flush=True)
signal.pause()  # until the entrypoint passes the stop on
"""


def test_docker_stop_returns_dvcs_status_through_the_shell(tmp_path):
    dvc = tmp_path / "dvc"
    dvc.write_text(FAKE_DVC)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "docker" / "entrypoint.py"),
            "sh",
            "-c",
            f"{sys.executable} {dvc} && echo published",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "stage running\n"  # the event: DVC is in a stage
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 255
        assert "published" not in proc.stdout.read()
    finally:
        proc.kill()
