"""The checks a loaded `Config` passes: no unknown key (named, with the nearest known one as a
hint), each field's range or choices from its `metadata`, and the rules between keys of one
section. Each refusal is a `ConfigError` naming the key, the value and what was expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from typing import Any, cast

from pipeline.config.schema import FASHION_MNIST_MD5, Config, ConfigError


def check_keys(raw: dict[str, Any], schema: type, source: str, prefix: str = "") -> None:
    """Unknown keys are refused by name, with the nearest known key as a hint."""
    known = {f.name: f for f in dataclasses.fields(schema)}
    for key, value in raw.items():
        full = f"{prefix}{key}"
        if key not in known:
            hint = difflib.get_close_matches(str(key), known, n=1)
            also = f"; did you mean '{prefix}{hint[0]}'?" if hint else ""
            raise ConfigError(
                f"{source}: unknown key '{full}' (expected one of: {', '.join(known)}){also}"
            )
        section = typing.get_type_hints(schema)[key]
        if dataclasses.is_dataclass(section):
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{source}: '{full}' is a section; expected a mapping, got {value!r}"
                )
            check_keys(value, cast(type, section), source, prefix=f"{full}.")


def validate(cfg: Any, prefix: str = "") -> None:
    """Enforce each field's metadata (ranges, choices, non-empty) and cross-field rules."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            validate(value, prefix=f"{key}.")
            continue
        _check_field(key, value, f.metadata)
    if prefix == "":
        _check_cross_fields(cfg)


def _check_field(key: str, value: Any, rule: Any) -> None:
    if value is None:
        return
    if isinstance(value, str) and value in rule.get("or", ()):
        return  # a word the field takes besides its numbers, e.g. auto
    if rule.get("integer") and (
        isinstance(value, bool)
        or not isinstance(value, int)
        or ("min" in rule and value < rule["min"])
    ):
        options = [
            "null",
            *rule.get("or", ()),
            f"an integer >= {rule['min']}" if "min" in rule else "an integer",
        ]
        raise ConfigError(
            f"{key}: got {value!r}, expected {', '.join(options[:-1])} or {options[-1]}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: got {value}, expected a finite number")
    if "min" in rule and value < rule["min"]:
        raise ConfigError(f"{key}: got {value}, expected >= {rule['min']}")
    if "min_exclusive" in rule and value <= rule["min_exclusive"]:
        raise ConfigError(f"{key}: got {value}, expected > {rule['min_exclusive']}")
    if "max" in rule and value > rule["max"]:
        raise ConfigError(f"{key}: got {value}, expected <= {rule['max']}")
    if "max_exclusive" in rule and value >= rule["max_exclusive"]:
        raise ConfigError(f"{key}: got {value}, expected < {rule['max_exclusive']}")
    if "choices" in rule and value not in rule["choices"]:
        raise ConfigError(f"{key}: got {value!r}, expected one of {', '.join(rule['choices'])}")
    if rule.get("nonempty") and len(value) == 0:
        raise ConfigError(f"{key}: is empty, expected at least one entry")
    if rule.get("unique") and len(set(value)) != len(value):
        raise ConfigError(f"{key}: lists a name twice ({value}); expected each once")


def _check_cross_fields(cfg: Config) -> None:
    """Rules between keys of one section. Rules that need another layer's knowledge (the
    syntax of `devices`, the rendezvous endpoint, strategy names, how a batch divides over
    the processes) are checked by that layer when a command uses the key."""
    if cfg.dist.min_nnodes is not None and cfg.dist.min_nnodes > cfg.dist.nnodes:
        raise ConfigError(
            f"dist.min_nnodes: got {cfg.dist.min_nnodes}, expected at most "
            f"dist.nnodes ({cfg.dist.nnodes})"
        )
    for n in cfg.predict.gpus:
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ConfigError(
                f"predict.gpus: got {cfg.predict.gpus}, expected device counts of 2 or more"
            )
    for name, digest in cfg.data.md5.items():
        if len(digest) != 32 or any(c not in "0123456789abcdef" for c in digest.lower()):
            raise ConfigError(f"data.md5.{name}: got {digest!r}, expected 32 hex digits")
    for name in cfg.data.md5:
        if name not in FASHION_MNIST_MD5:
            raise ConfigError(
                f"data.md5: unknown file {name!r}; expected the dataset's files: "
                f"{', '.join(FASHION_MNIST_MD5)}"
            )
    for name in FASHION_MNIST_MD5:
        if name not in cfg.data.md5:
            raise ConfigError(f"data.md5: no sum for {name}; expected one per dataset file")
