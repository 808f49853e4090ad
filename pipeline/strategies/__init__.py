"""The strategies, by name: one module each in this package, all with the same small contract
(`base.Strategy`), each declaring its own facts (`FACTS`). `NAMES` is the one list of them, in
the order reports show them.

A strategy module is imported only when a run asks for it (`get`): some pull in heavy parts of
torch (FSDP, pipelining) that the other strategies and the other stages never need.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from pipeline.errors import UserError

if TYPE_CHECKING:
    from pipeline.strategies.base import Strategy

# Adding a strategy: CONTRIBUTING.md ("Adding a strategy").
NAMES = ("single", "dp", "balanced_dp", "ddp", "fsdp", "pipeline_parallel")


def check_names(names: Sequence[str], key: str = "strategies") -> None:
    """Every name in `key`'s list is a strategy."""
    for name in names:
        if name not in NAMES:
            raise UserError(f"{key}: unknown entry {name!r}, expected any of {', '.join(NAMES)}")


def check_strategy(name: str) -> None:
    if name not in NAMES:
        raise UserError(f"strategy {name!r} is unknown; expected one of {', '.join(NAMES)}")


def get(name: str) -> Strategy:
    check_strategy(name)
    return cast("Strategy", importlib.import_module(f"{__name__}.{name}"))
