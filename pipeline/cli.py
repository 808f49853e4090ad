"""The command line every stage shares: `python -m pipeline.<command> [--help] [key=value ...]`.

`--help` prints what the command does and exits; `--params SECTION` prints the keys of one
params.yaml section and exits. Both show each key with the value the command would run with
(params.yaml and the key=value overrides given beside them), the schema's default where that
differs, and its meaning (pipeline/config/schema.py's docstrings). Anything the parser
refuses is a `UserError` (one line, exit code 2), like any other bad input.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, Optional

from pipeline.config import Config, ConfigError, describe, load_config
from pipeline.errors import UserError

OVERRIDES_HELP = (
    "params.yaml values for this run only, e.g. train.epochs=2 model.width=8 "
    "(each key's default and meaning: --params SECTION)"
)
PARAMS_EPILOG = (
    "params.yaml keys, each with the value this command would use (params.yaml and the\n"
    "overrides given), the default where that differs, and its meaning (override any as\n"
    "key=value; one section only: --params SECTION):\n\n"
)
PRINT_CONFIG = "--print-config"
# the notes' flags (note 000's parser, note 002's launcher): flag -> the params key it sets
NOTES_VALUE_FLAGS = {"--devices": "devices"}
NOTES_SWITCHES = {"--disable-cuda": "devices=cpu"}
LOCAL_RANK_FLAGS = ("--local-rank", "--local_rank")
PARAMS_HELP = (
    "print the value in use, default and meaning of every key of one params.yaml section "
    "(e.g. train, or a top-level key such as devices) and exit"
)


def values_in_use(argv: list[str]) -> tuple[Optional[Config], str]:
    """The config the command line would run with, for the help to show: params.yaml and the
    key=value items of `argv`. Where they do not load (bad input, which running the command
    reports), the schema's defaults stand in and a line says why."""
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    try:
        return load_config("params.yaml", overrides), ""
    except ConfigError as err:
        return None, f"(showing the schema's defaults: {err})\n\n"


class _Parser(argparse.ArgumentParser):
    with_params = False  # end the help with every params.yaml key (parse_args' params_help)
    argv: list[str] = []  # the command line, for the values the help shows

    def format_help(self) -> str:
        # built only when help is shown: reading the config's docstrings from its source
        # takes a noticeable part of a second, which every stage and worker would pay
        if self.with_params:
            values, why = values_in_use(self.argv)
            self.epilog = f"{self.epilog}\n\n{PARAMS_EPILOG}{why}{describe(values=values)}"
            self.with_params = False
        return super().format_help()

    def error(self, message: str) -> None:  # type: ignore[override]
        usage = " ".join(self.format_usage().split()[1:])  # one line, without the options
        for option in ("[-h] ", "[--params SECTION] ", f"[{PRINT_CONFIG}] "):
            usage = usage.replace(option, "")
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
        used, why = values_in_use(getattr(parser, "argv", []))
        print(why + describe(values, values=used), end="", flush=True)
        parser.exit(0)


def notes_flags(argv: list[str], env: Mapping[str, str]) -> list[str]:
    """`argv` with the source notes' flags read as what they mean: `--devices X` (or
    `--devices=X`) as the override `devices=X`, `--disable-cuda` as `devices=cpu`, both put
    after the other arguments (the notes' flag wins over a `devices=` given beside it), and
    torch.distributed.launch's `--local-rank=K` / `--local_rank K` dropped once it agrees with
    the LOCAL_RANK of `env`, which the worker reads (`DistContext.from_env`)."""
    kept: list[str] = []
    meant: list[str] = []
    items = iter(argv)
    for item in items:
        flag, eq, value = item.partition("=")
        if flag in NOTES_VALUE_FLAGS or flag in LOCAL_RANK_FLAGS:
            if not eq:
                value = next(items, "")
                if not value or value.startswith("-"):
                    raise UserError(f"{flag}: expected a value after it (e.g. {flag} 0)")
            if flag in NOTES_VALUE_FLAGS:
                meant.append(f"{NOTES_VALUE_FLAGS[flag]}={value}")
            else:
                check_local_rank(flag, value, env)
        elif item in NOTES_SWITCHES:
            meant.append(NOTES_SWITCHES[item])
        else:
            kept.append(item)
    return kept + meant


def check_local_rank(flag: str, value: str, env: Mapping[str, str]) -> None:
    """torch.distributed.launch's `--local-rank` must restate its LOCAL_RANK: the worker's
    device comes from the environment, and a process started with this flag by anything else
    would train as a rank nothing else knows of."""
    if "LOCAL_RANK" not in env:
        raise UserError(
            f"{flag}={value}: only a worker started by torch.distributed.launch or torchrun "
            "takes it (they set LOCAL_RANK); run `python -m pipeline.train STRATEGY` without it"
        )
    if value.strip() != env["LOCAL_RANK"].strip():
        raise UserError(
            f"{flag}={value} disagrees with LOCAL_RANK={env['LOCAL_RANK']} in the environment"
        )


def unknown_flag(argv: list[str], known: tuple[str, ...]) -> Optional[str]:
    """The first argument that looks like a flag and is none of `known` (the value after
    `--params` is not one); None where every flag is known."""
    items = iter(argv)
    for item in items:
        flag = item.partition("=")[0]
        if flag == "--params" and "=" not in item:
            next(items, None)
        elif item.startswith("-") and flag not in known:
            return item
    return None


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
    argv = notes_flags(sys.argv[1:] if argv is None else argv, os.environ)
    parser.with_params, parser.argv = params_help, argv
    if strategy_names:
        parser.add_argument(
            "strategy", metavar="STRATEGY", help=f"one of: {', '.join(strategy_names)}"
        )
        parser.add_argument(
            PRINT_CONFIG,
            action="store_true",
            help="print the params the strategy would run with (params.yaml and the overrides; "
            "its own section, no other strategy's) as YAML and exit",
        )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help=OVERRIDES_HELP)
    parser.add_argument("--params", metavar="SECTION", action=_PrintParams, help=PARAMS_HELP)
    # a flag may follow the overrides (`ddp train.epochs=2 --print-config`): argparse takes
    # positionals in one run, so the flag goes first, which changes nothing it means
    known = ("-h", "--help", "--params", *((PRINT_CONFIG,) if strategy_names else ()))
    unknown = unknown_flag(argv, known)
    if unknown is not None:
        # named alone: argparse would list every argument after it as unrecognized too
        parser.error(f"unrecognized arguments: {unknown}")
    flags = [a for a in argv if a == PRINT_CONFIG]
    args = parser.parse_args(flags + [a for a in argv if a != PRINT_CONFIG])
    if strategy_names and "=" in args.strategy:
        parser.error(f"the first argument is the strategy, got {args.strategy!r}")
    return args


def exit_code(main: Callable[[Optional[list[str]]], None], argv: Optional[list[str]]) -> int:
    """Run a command's `main` in this process, as `python -m` would; its exit code (a
    message given to SystemExit is printed, and the code is then 1, as Python does)."""
    try:
        main(argv)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr, flush=True)
        return 1
    return 0
