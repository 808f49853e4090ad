"""The command line every stage shares: `python -m pipeline.<command> [--help] [key=value ...]`.

`--help` prints what the command does and exits; `--params SECTION` prints the defaults and
meanings of one params.yaml section (pipeline/config.py's docstrings) and exits. Anything the
parser refuses is a `UserError` (one line, exit code 2), like any other bad input.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional

from pipeline.config import describe
from pipeline.errors import UserError

OVERRIDES_HELP = (
    "params.yaml values for this run only, e.g. train.epochs=2 model.width=8 "
    "(each key's default and meaning: --params SECTION)"
)
PARAMS_EPILOG = (
    "params.yaml keys, each with its default and meaning (override any as key=value;\n"
    "one section only: --params SECTION):\n\n"
)
PARAMS_HELP = (
    "print the default and meaning of every key of one params.yaml section "
    "(e.g. train, or a top-level key such as devices) and exit"
)


class _Parser(argparse.ArgumentParser):
    with_params = False  # end the help with every params.yaml key (parse_args' params_help)

    def format_help(self) -> str:
        # built only when help is shown: reading the config's docstrings from its source
        # takes a noticeable part of a second, which every stage and worker would pay
        if self.with_params:
            self.epilog = f"{self.epilog}\n\n{PARAMS_EPILOG}{describe()}"
            self.with_params = False
        return super().format_help()

    def error(self, message: str) -> None:  # type: ignore[override]
        usage = " ".join(self.format_usage().split()[1:])  # one line, without the options
        usage = usage.replace("[-h] ", "").replace("[--params SECTION] ", "")
        raise UserError(f"usage: {usage} ({message})")


class _PrintParams(argparse.Action):
    """`--params SECTION`: print that section's keys and exit, before the required
    arguments are checked (like --help). An unknown section raises `ConfigError`."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: Any,
        values: Any,
        option_string: Optional[str] = None,
    ) -> None:
        text = describe(values)
        print(text, end="", flush=True)
        parser.exit(0)


def parse_args(
    module: str,
    doc: Optional[str],
    argv: Optional[list[str]],
    strategy_names: tuple[str, ...] = (),
    params_help: bool = False,
) -> argparse.Namespace:
    """`overrides` (key=value strings) and, when `strategy_names` is given, `strategy`.
    The help text is the module docstring, followed with `params_help` by every params.yaml
    key's default and meaning."""
    summary, _, details = (doc or "").strip().partition("\n\n")
    parser = _Parser(
        prog=f"python -m {module}",
        description=summary,
        epilog=details,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.with_params = params_help
    if strategy_names:
        parser.add_argument(
            "strategy", metavar="STRATEGY", help=f"one of: {', '.join(strategy_names)}"
        )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help=OVERRIDES_HELP)
    parser.add_argument("--params", metavar="SECTION", action=_PrintParams, help=PARAMS_HELP)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if strategy_names and "=" in args.strategy:
        parser.error(f"the first argument is the strategy, got {args.strategy!r}")
    return args
