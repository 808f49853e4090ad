"""One run of a stage at a time in a project (issue 50), and the kernel's locks that make it.

A stage started a second time while the first still ran used to run beside it: two MLflow runs
for one strategy, two writers in one checkpoint directory. Each command that writes a
strategy's run now holds that strategy's lock for as long as it runs (`python -m
pipeline.train` and the quickstart's stages from their check of the outputs on, `python -m
pipeline.publish` for every strategy it pushes, the quickstart for its whole run): a second
start is refused at once, naming the process that holds it.

The locks are the kernel's (flock) on files under .cache/locks/: a lock belongs to the open
file, so it ends with the last process that holds it (the stage's forked workers inherit it
with the launcher's memory, so the lock lasts while any of them writes), and a killed run
(SIGKILL, out of memory) leaves nothing that could block the next. The holder writes its pid,
start and command into the file, for the refusal to name.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from pipeline.errors import UserError

LOCKS = Path(".cache/locks")  # git- and DVC-ignored, as all of .cache/


def lock_path(name: str, locks: Path = LOCKS) -> Path:
    return locks / f"{name}.lock"


def refusal(what: str, holder: str) -> str:
    """The one line a second start gets: what runs already, who holds it, what to do."""
    pid, _, rest = holder.partition(" ")
    if not pid.isdigit():  # the holder took it a moment ago and has not said who it is yet
        return f"{what} is already running in this project; wait for it to end, then run this again"
    since, _, command = rest.partition(" ")
    return (
        f"{what} is already running in this project (pid {pid}, since {since}: {command}); "
        f"wait for it to end, or stop it (kill {pid}), then run this again"
    )


def command() -> str:
    """This process's command line as it was typed: `python -m pipeline.train ddp`."""
    try:
        argv = Path("/proc/self/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:  # not Linux
        argv = [sys.executable, *sys.argv]
    argv = [a for a in argv if a]
    return " ".join([Path(argv[0]).name, *argv[1:]]) if argv else "?"


@contextlib.contextmanager
def holding(name: str, what: str, locks: Path = LOCKS) -> Iterator[None]:
    """Hold the project's lock `name` while the block runs; a UserError naming the holder,
    at once, where another process holds it. `what`: the run, in words ("train[ddp]")."""
    locks.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path(name, locks), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            raise UserError(refusal(what, holder)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {time.strftime('%H:%M:%S')} {command()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # the lock with it (forked children holding the file keep it till they end)


@contextlib.contextmanager
def waiting_for(path: Path) -> Iterator[None]:
    """Hold the lock on `path` while the block runs, waiting for whoever holds it first."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
