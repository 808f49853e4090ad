"""Strategies by name. Each module exposes NAME, nproc() and parallelize() (see base.py)."""
from __future__ import annotations

from types import ModuleType

from pipeline.config import STRATEGY_NAMES
from pipeline.errors import UserError
from pipeline.strategies import balanced_dp, ddp, dp, fsdp, pipeline_parallel, single

_REGISTRY: dict[str, ModuleType] = {
    m.NAME: m for m in (single, dp, balanced_dp, ddp, fsdp, pipeline_parallel)}


def names() -> list[str]:
    return [n for n in STRATEGY_NAMES if n in _REGISTRY]


def get(name: str) -> ModuleType:
    if name not in _REGISTRY:
        raise UserError(f"strategy {name!r} is unknown; expected one of {', '.join(names())}")
    return _REGISTRY[name]
