"""Reading the params: params.yaml and `key=value` overrides (omegaconf dotlist) merged onto
the schema, checked key by key (validate.py), as one `Config`; and back to YAML.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipeline.config.schema import Config, ConfigError
from pipeline.config.validate import check_keys, validate


def load_config(path: str | Path | None = "params.yaml", overrides: Sequence[str] = ()) -> Config:
    """params.yaml + `key=value` overrides -> a validated `Config`, or `ConfigError`.
    `path` None: the schema's defaults alone (tests, benchmarks)."""
    return config_from(read_params(path), overrides, "defaults" if path is None else str(path))


def read_params(path: str | Path | None = "params.yaml") -> dict[str, Any]:
    """params.yaml as read, its keys checked; {} for `path` None (the schema's defaults). A
    file that is missing, empty or all comments is refused rather than read as "every
    default": that is the full 10-epoch experiment, which would overwrite the checkpoints
    and results of the one meant."""
    if path is None:
        return {}
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: not found; expected the experiment's params (run the command in the "
            "repository root, where params.yaml is)"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not readable ({_first_line(err)})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({_first_line(err)})") from None
    if raw is None:
        raise ConfigError(
            f"{path}: is empty; expected a mapping of the experiment's sections (seed, "
            "train, ...; `git checkout params.yaml` restores the project's)"
        )
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{path}: expected a mapping of sections at the top level, got {type(raw).__name__}"
        )
    check_keys(raw, Config, source=str(path))
    return raw


def config_from(
    raw: dict[str, Any], overrides: Sequence[str] = (), source: str = "params.yaml"
) -> Config:
    """The params `raw` (read_params, from `source`) with `key=value` overrides, validated."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value (e.g. train.epochs=2)")
    dot = _parse_dotlist(overrides)
    check_keys(dot, Config, source="override")
    return merge_and_validate(raw, dot, source=source)


def launch_free(overrides: Sequence[str]) -> list[str]:
    """The overrides a run trains with: all but dist.*. Those only shape the launch, and
    node-specific ones (dist.node_rank) would give the ranks of different nodes different
    configurations, hence different checkpoint fingerprints."""
    return [o for o in overrides if not o.strip().startswith("dist.")]


def merge_and_validate(raw: dict[str, Any], dot: dict[str, Any], source: str) -> Config:
    schema = OmegaConf.structured(Config)
    for where, layer in ((source, raw), ("override", dot)):
        try:
            schema = OmegaConf.merge(schema, layer)
        except OmegaConfBaseException as err:
            key = getattr(err, "full_key", None) or "?"
            raise ConfigError(f"{where}: {key}: {_first_line(err)}") from None
    cfg: Config = OmegaConf.to_object(schema)  # type: ignore[assignment]
    validate(cfg)
    return cfg


def _parse_dotlist(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, _, text = item.partition("=")
        try:
            value = yaml.safe_load(text) if text != "" else ""
        except yaml.YAMLError:
            value = text
        node = out
        parts = _split_key(key.strip())
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
        node[parts[-1]] = value
    return out


def _split_key(key: str) -> list[str]:
    """Split a dotted key; inside a mapping field (data.md5) the rest is one key, since file
    names hold dots: data.md5.train-images-idx3-ubyte.gz -> [data, md5, train-...gz]."""
    parts = key.split(".")
    schema: Any = Config
    for i, part in enumerate(parts):
        types = typing.get_type_hints(schema)
        if part not in types:
            return parts
        field_type = types[part]
        if dataclasses.is_dataclass(field_type):
            schema = field_type
        elif typing.get_origin(field_type) is dict and i + 1 < len(parts):
            return parts[: i + 1] + [".".join(parts[i + 1 :])]
        else:
            return parts
    return parts


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
