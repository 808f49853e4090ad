"""User errors (one clear line, exit code 2, no traceback) and the stages' exit codes.

Anything the user can fix by editing params.yaml, the command line or the data raises
`UserError` (bad params: `ConfigError`); `exit_on_user_error` turns either into the one-line
message at the top of every stage entry point. Bugs still raise normally so their traceback
is not hidden.

A train stage exits with one code per outcome (docs/reliability.md):
    0   training finished: results/ written (also when a stop signal came after that)
    1   a failure: a crash, a lost rank that no restart recovered
    2   bad input, found before anything ran or by a worker (one line names it)
    74  no space left on the disk it writes to (one line names the path); what was saved
        before is kept, and a rerun once there is space resumes from the last checkpoint
    75  stopped by a signal (docker stop, Ctrl-C) at a checkpoint; `dvc repro` resumes there
"""

from __future__ import annotations

import enum
import errno
import functools
import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional, TypeVar

from pipeline.config import ConfigError

FAILURE_EXIT = 1
USER_ERROR_EXIT = 2
# sysexits' EX_TEMPFAIL, "try again later": nothing failed and a rerun continues. Not 143
# (128 + SIGTERM), which a shell also reports for a process killed before it could save.
STOPPED_EXIT = 75
# sysexits' EX_IOERR: a write failed for want of space (`out_of_space`)
DISK_FULL_EXIT = 74
NO_SPACE = "no space left on device"  # how its one line begins: the launcher reads it so
# torch.save reports a full disk as a RuntimeError of its own ("unexpected pos 704 vs 598"):
# where no ENOSPC says so, a filesystem with less than this free after a failed write is full
NEARLY_FULL_BYTES = 4 * 2**20
SQLITE_FULL = "database or disk is full"  # SQLite's SQLITE_FULL, as sqlite3 words it
ERROR_FILE_ENV = "PARALLEL_LAB_ERROR_FILE"  # where a torchrun worker leaves its one-line user error
# where the run's writer tells the launcher how it ended (an `Outcome`): torchrun's own exit
# code cannot, being non-zero whenever it forwarded a signal
OUTCOME_FILE_ENV = "PARALLEL_LAB_OUTCOME_FILE"
SIGTERM_EXIT = 128 + signal.SIGTERM  # a worker's exit code after a SIGTERM checkpoint


class Outcome(enum.Enum):
    FINISHED = "finished"  # results/ written
    STOPPED = "stopped"  # checkpointed at a stop signal
    DID_NOT_FIT = "did_not_fit"  # out of device memory: results/ say so (did_not_fit.py)


F = TypeVar("F", bound=Callable[..., object])


class UserError(Exception):
    """Bad input: the message names the key or file and what was expected."""


# Everything the user can fix: bad params (found by pipeline/config/, which imports nothing
# from the project) and every other bad input.
BAD_INPUT = (UserError, ConfigError)


def _chain(err: BaseException) -> Iterator[BaseException]:
    """`err`, its causes and contexts, and a distributed checkpoint's per-rank failures
    (torch's CheckpointException holds them as (exception, traceback) pairs)."""
    seen: set[int] = set()
    todo = [err]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            for failure in failures.values():
                inner = failure[0] if isinstance(failure, tuple) else failure
                if isinstance(inner, BaseException):
                    todo.append(inner)


def out_of_space(err: BaseException, *where: Path) -> Optional[Path]:
    """Where the disk ran out, if that is what `err` is: the file of an ENOSPC (or a full
    quota) anywhere in its chain, else the first of `where` (the directories the failed work
    wrote to) on a filesystem that is all but full; None for any other failure, and for an
    exit or an interrupt, however full the disk."""
    if isinstance(err, (SystemExit, KeyboardInterrupt)):
        return None
    for e in _chain(err):
        if SQLITE_FULL in str(e):  # SQLite's own word for it (an MLflow store on that disk)
            return where[0] if where else Path(".")
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            if not e.filename:
                return where[0] if where else Path(".")
            path = Path(e.filename)
            # files.atomic_write's temporary file: the file it was writing
            temporary = path.name.startswith(".") and path.name.endswith(".tmp")
            return path.with_name(path.name[1:-4]) if temporary else path
    for path in where:
        existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
        if shutil.disk_usage(existing).free < NEARLY_FULL_BYTES:
            return path
    return None


def disk_full(path: Path) -> OSError:
    """The error of a full disk under `path`, said as what it is whatever raised it."""
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def no_space_line(path: Path, then: str = "run this again") -> str:
    """The one line of a full disk: where, and what to do."""
    return (
        f"{NO_SPACE} writing {path}: free some space there (df -h {path.parent}), then "
        f"{then}; what was saved before is kept"
    )


def exit_on_user_error(main: F) -> F:
    @functools.wraps(main)
    def wrapper(*args: Any, **kwargs: Any) -> object:
        try:
            return main(*args, **kwargs)
        except BAD_INPUT as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            sys.exit(USER_ERROR_EXIT)
        except OSError as err:  # a full disk is the user's to fix too; anything else a bug
            full = out_of_space(err)
            if full is None:
                raise
            print(f"error: {no_space_line(full)}", file=sys.stderr, flush=True)
            sys.exit(DISK_FULL_EXIT)

    return wrapper  # type: ignore[return-value]


def first_line(err: BaseException, limit: int = 300) -> str:
    """An exception as one short line, for warnings that must not flood a log."""
    lines = str(err).strip().splitlines()
    return (lines[0] if lines else type(err).__name__)[:limit]


def first_sentence(err: BaseException, limit: int = 100) -> str:
    """What a library says of a damaged file, in the few words that carry it: torch's
    messages go on for sentences of advice that do not apply, and the fix must fit on the
    same line."""
    return first_line(err, limit).split(". ")[0].rstrip(".")
