"""User errors: one clear line, exit code 2, no traceback.

Anything the user can fix by editing params.yaml, the command line or the data raises
`UserError` (bad params: `ConfigError`); `exit_on_user_error` turns either into the one-line
message at the top of every stage entry point. Bugs still raise normally so their traceback
is not hidden.
"""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from pipeline.config import ConfigError

USER_ERROR_EXIT = 2
ERROR_FILE_ENV = "PARALLEL_LAB_ERROR_FILE"  # where a torchrun worker leaves its one-line user error
SIGTERM_EXIT = 128 + signal.SIGTERM  # a worker's exit code after a SIGTERM checkpoint

F = TypeVar("F", bound=Callable[..., object])


class UserError(Exception):
    """Bad input: the message names the key or file and what was expected."""


# Everything the user can fix: bad params (found by pipeline/config.py, which imports nothing
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
