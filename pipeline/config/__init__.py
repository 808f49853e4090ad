"""params.yaml, typed, validated once, read everywhere.

`params.yaml` holds the experiment's values; its sections mirror the DVC stages.
    schema.py    the dataclasses: every key's default, meaning (its docstring) and range
    load.py      `load_config(path, overrides)`: params.yaml + `key=value` overrides -> `Config`
                 (`read_params` + `config_from`, for a command that needs two configs of one read)
    validate.py  unknown keys, ranges, choices, rules between keys -> `ConfigError`
    help.py      `describe`: each key's value, default and meaning, for --help and --params

A leaf: it imports nothing else of the project, so every module may import it
(`test_config_is_a_leaf`). A bad key, type or value is a `ConfigError` naming the key, the
value and what was expected.
"""

from pipeline.config.help import describe, field_docs
from pipeline.config.load import (
    config_from,
    launch_free,
    load_config,
    merge_and_validate,
    read_params,
    to_yaml,
)
from pipeline.config.schema import (
    FASHION_MNIST_MD5,
    FASHION_MNIST_MIRRORS,
    SEED_MAX,
    BalancedDpConfig,
    ChannelParallelConfig,
    CheckpointConfig,
    Config,
    ConfigError,
    DataConfig,
    DdpConfig,
    DistConfig,
    DpConfig,
    FsdpConfig,
    HorovodConfig,
    HybridConfig,
    MlflowConfig,
    ModelConfig,
    PipelineParallelConfig,
    PredictConfig,
    ReportConfig,
    SingleConfig,
    TrainConfig,
    effective_lr,
    flatten,
)
from pipeline.config.validate import check_keys, validate

__all__ = [
    "FASHION_MNIST_MD5",
    "FASHION_MNIST_MIRRORS",
    "SEED_MAX",
    "BalancedDpConfig",
    "ChannelParallelConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "DdpConfig",
    "HorovodConfig",
    "DistConfig",
    "DpConfig",
    "FsdpConfig",
    "HybridConfig",
    "MlflowConfig",
    "ModelConfig",
    "PipelineParallelConfig",
    "PredictConfig",
    "ReportConfig",
    "SingleConfig",
    "TrainConfig",
    "check_keys",
    "describe",
    "effective_lr",
    "field_docs",
    "flatten",
    "config_from",
    "launch_free",
    "load_config",
    "read_params",
    "merge_and_validate",
    "to_yaml",
    "validate",
]
