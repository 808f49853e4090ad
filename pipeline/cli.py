"""The command line every stage shares: `python -m pipeline.<command> [--help] [key=value ...]`.

`--help` prints what the command does and exits; anything the parser refuses is a `UserError`
(one line, exit code 2), like any other bad input.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from pipeline.errors import UserError

OVERRIDES_HELP = (
    "params.yaml values for this run only, e.g. train.epochs=2 model.width=8 "
    "(the schema, with a comment per key: pipeline/config.py)"
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        usage = self.format_usage().strip().removeprefix("usage: ").replace("[-h] ", "")
        raise UserError(f"usage: {usage} ({message})")


def parse_args(
    module: str, doc: Optional[str], argv: Optional[list[str]], strategy_names: tuple[str, ...] = ()
) -> argparse.Namespace:
    """`overrides` (key=value strings) and, when `strategy_names` is given, `strategy`.
    The help text is the module docstring."""
    summary, _, details = (doc or "").strip().partition("\n\n")
    parser = _Parser(
        prog=f"python -m {module}",
        description=summary,
        epilog=details,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if strategy_names:
        parser.add_argument(
            "strategy", metavar="STRATEGY", help=f"one of: {', '.join(strategy_names)}"
        )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help=OVERRIDES_HELP)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if strategy_names and "=" in args.strategy:
        parser.error(f"the first argument is the strategy, got {args.strategy!r}")
    return args
