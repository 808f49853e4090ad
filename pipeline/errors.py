"""User errors (one clear line, exit code 2, no traceback) and the stages' exit codes.

Anything the user can fix by editing params.yaml, the command line or the data raises
`UserError` (bad params: `ConfigError`); `exit_on_user_error` turns either into the one-line
message at the top of every stage entry point. Bugs still raise normally so their traceback
is not hidden.

A train stage exits with one code per outcome (docs/reliability.md):
    0   training finished: results/ written (also when a stop signal came after that)
    1   a failure: a crash, a lost rank that no restart recovered
    2   bad input, found before anything ran or by a worker (one line names it)
    75  stopped by a signal (docker stop, Ctrl-C) at a checkpoint; `dvc repro` resumes there
"""

from __future__ import annotations

import enum
import functools
import signal
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from pipeline.config import ConfigError

FAILURE_EXIT = 1
USER_ERROR_EXIT = 2
# sysexits' EX_TEMPFAIL, "try again later": nothing failed and a rerun continues. Not 143
# (128 + SIGTERM), which a shell also reports for a process killed before it could save.
STOPPED_EXIT = 75
ERROR_FILE_ENV = "PARALLEL_LAB_ERROR_FILE"  # where a torchrun worker leaves its one-line user error
# where the run's writer tells the launcher how it ended (an `Outcome`): torchrun's own exit
# code cannot, being non-zero whenever it forwarded a signal
OUTCOME_FILE_ENV = "PARALLEL_LAB_OUTCOME_FILE"
SIGTERM_EXIT = 128 + signal.SIGTERM  # a worker's exit code after a SIGTERM checkpoint


class Outcome(enum.Enum):
    FINISHED = "finished"  # results/ written
    STOPPED = "stopped"  # checkpointed at a stop signal


F = TypeVar("F", bound=Callable[..., object])


class UserError(Exception):
    """Bad input: the message names the key or file and what was expected."""


# Everything the user can fix: bad params (found by pipeline/config/, which imports nothing
# from the project) and every other bad input.
BAD_INPUT = (UserError, ConfigError)


def exit_on_user_error(main: F) -> F:
    @functools.wraps(main)
    def wrapper(*args: Any, **kwargs: Any) -> object:
        try:
            return main(*args, **kwargs)
        except BAD_INPUT as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            sys.exit(USER_ERROR_EXIT)

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
