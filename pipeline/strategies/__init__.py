"""The strategies, by name: the registry. One module each in this package, named after the
strategy, ends with its typed `SPEC` (`base.StrategySpec`: its facts and its two builders).
`NAMES` is the one list of them, in the order reports show them.

A strategy module is imported only when a run asks for it (`get`): some pull in heavy parts of
torch (FSDP, pipelining) that the other strategies and the other stages never need, and each
train stage depends on its own strategy's modules alone (dvc.yaml, pipeline/stage_code.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from pipeline.errors import UserError

if TYPE_CHECKING:
    from pipeline.strategies.base import StrategySpec

# Adding a strategy: CONTRIBUTING.md ("Adding a strategy").
NAMES = (
    "single",
    "dp",
    "balanced_dp",
    "ddp",
    "fsdp",
    "pipeline_parallel",
    "channel_parallel",
    "hybrid",
)
# Strategies whose library is installed by hand first (docs/horovod.md: `make install
# HOROVOD=1`): every command takes them where a user names them, but nothing that runs
# every strategy (the tests, the benchmarks, the default `strategies`) runs them.
OPT_IN = ("horovod",)
KNOWN = (*NAMES, *OPT_IN)  # every strategy a command takes, in the report's order


def check_names(names: Sequence[str], key: str = "strategies") -> None:
    """Every name in `key`'s list is a strategy."""
    for name in names:
        if name not in KNOWN:
            raise UserError(f"{key}: unknown entry {name!r}, expected any of {', '.join(KNOWN)}")


def check_strategy(name: str) -> None:
    if name not in KNOWN:
        raise UserError(f"strategy {name!r} is unknown; expected one of {', '.join(KNOWN)}")


def own_params(params: dict[str, Any], name: str) -> dict[str, Any]:
    """The params a run of `name` trains with: `params` (by section, or flattened to dotted
    keys) without the other strategies' sections, which its stage depends on none of. What
    --print-config prints, results/<name>/config.yaml keeps and MLflow's params hold."""
    return {
        key: value
        for key, value in params.items()
        if key.split(".", 1)[0] not in KNOWN or key.split(".", 1)[0] == name
    }


def get(name: str) -> StrategySpec[Any]:
    """The spec of strategy `name`, one of KNOWN: a name a user gave is checked once, where it
    came in (check_strategy on the command line, check_names for params.yaml's lists), not
    again here. Its options type is checked where the module builds the spec; a name known
    only at run time cannot say which it is, hence Any here."""
    module = importlib.import_module(f"{__name__}.{name}")
    # a cast, not an isinstance check: that needs base.py imported at this module's top, and
    # torch with it, in every command that only reads NAMES (tests/unit/test_layout.py
    # checks that each module's SPEC is a StrategySpec under its own name)
    return cast("StrategySpec[Any]", module.SPEC)
