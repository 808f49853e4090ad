"""The params.yaml schema: typed dataclasses, validated once, read everywhere.

`params.yaml` is the single source of truth; its sections mirror the DVC stages. Each field
carries a comment saying what it means; `metadata` holds the range or the allowed values that
`validate` enforces, so the rule and the field sit side by side.

Loading: `load_config(path, overrides)` merges params.yaml and `key=value` overrides (omegaconf
dotlist) onto the schema and raises `UserError` naming the key, the value and what was
expected for an unknown key, a wrong type or a value out of range.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, cast

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipeline.data import fashion_mnist
from pipeline.errors import UserError
from pipeline.strategies import NAMES as STRATEGY_NAMES
from pipeline.training.devices import parse_devices
from pipeline.training.topology import parse_endpoint


def _min(lo: float, **kw: Any) -> Any:
    return {"min": lo, **kw}


@dataclass
class DataConfig:
    # Base URLs tried in order for each file; file:// URLs and plain directories work too.
    mirrors: list[str] = field(
        default_factory=lambda: list(fashion_mnist.MIRRORS), metadata={"nonempty": True}
    )
    # File name -> expected MD5. Defaults to torchvision's sums; override for another mirror.
    md5: dict[str, str] = field(default_factory=lambda: dict(fashion_mnist.MD5))
    # Keep only the first N training / test samples (null = all). For smoke runs.
    limit_train: Optional[int] = field(default=None, metadata=_min(1))
    limit_test: Optional[int] = field(default=None, metadata=_min(1))
    # Training input pipeline (pipeline/data/loaders.py). device: the uint8 dataset on the training
    # device, batches gathered and normalised there. dataloader: the notes' torchvision
    # FashionMNIST + ToTensor per sample + DataLoader (DistributedSampler across ranks).
    loader: str = field(default="device", metadata={"choices": ("device", "dataloader")})
    # Random crop (4-pixel padding) + horizontal flip of training images.
    augment: bool = False
    # DataLoader worker processes (dataloader only); the notes use 4.
    workers: int = field(default=4, metadata=_min(0))


@dataclass
class ModelConfig:
    # Base channel width of the ResNet-18; 64 is the real network, 8 makes CPU runs quick.
    width: int = field(default=64, metadata=_min(1))


@dataclass
class TrainConfig:
    # Passes over the training set.
    epochs: int = field(default=10, metadata=_min(1))
    # Global batch per optimizer step, the same for every strategy so runs compare.
    batch_size: int = field(default=256, metadata=_min(1))
    # SGD learning rate (at base_batch_size when lr_scaling is linear).
    lr: float = field(default=0.1, metadata={"min_exclusive": 0.0})
    # SGD momentum; the notes' d2l loop uses plain SGD (0).
    momentum: float = field(default=0.0, metadata={"min": 0.0, "max_exclusive": 1.0})
    weight_decay: float = field(default=0.0, metadata=_min(0.0))
    # Micro-steps per optimizer step: batch_size is split into grad_accum forwards.
    grad_accum: int = field(default=1, metadata=_min(1))
    # none: use lr as is. linear: lr * batch_size / base_batch_size (the notes' 512 -> 0.2).
    lr_scaling: str = field(default="none", metadata={"choices": ("none", "linear")})
    base_batch_size: int = field(default=256, metadata=_min(1))
    # Arithmetic (pipeline/training/precision.py): fp32; fp64 for exact cross-strategy comparisons
    # (parity tests; fp32 training of this network is chaotic enough that 1e-7 differences
    # grow to 1e-2); tf32 (CUDA tensor cores); bf16 autocast; fp16 autocast + loss scaling
    # (CUDA). Modes the device lacks fall back to fp32 with a note. auto: bf16 on a GPU
    # (2.0x fp32 per step on an H100), fp32 on the CPU (bf16 is slower on most CPUs).
    precision: str = field(
        default="auto", metadata={"choices": ("auto", "fp32", "fp64", "tf32", "bf16", "fp16")}
    )
    # NHWC activations and weights (what tensor-core convolutions want). null = auto: on for
    # a GPU, off on the CPU (README "Performance").
    channels_last: Optional[bool] = None
    # torch.compile the strategy's forward; the first epoch then includes compilation.
    compile: bool = False
    # torch.compile's mode. reduce-overhead replays each compiled forward/backward as one
    # CUDA graph: at batch 256 this model is bound by the host launching ~400 kernels per
    # step, not by the GPU (README "Performance"). No effect on the CPU.
    compile_mode: str = field(
        default="default",
        metadata={
            "choices": ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
        },
    )
    # none | cosine (linear warm-up, cosine decay to 0) | onecycle (OneCycleLR's shape),
    # per optimizer step; the peak is the effective lr (pipeline/training/optim.py).
    lr_schedule: str = field(default="none", metadata={"choices": ("none", "cosine", "onecycle")})
    # Epochs (may be fractional) of warm-up to the peak lr (cosine, onecycle).
    warmup_epochs: float = field(default=1.0, metadata=_min(0.0))
    # Cross-entropy label smoothing of the training loss (reported losses are plain).
    label_smoothing: float = field(default=0.0, metadata={"min": 0.0, "max_exclusive": 1.0})
    # Batch used for evaluation only (no gradients, so it can be larger).
    eval_batch_size: int = field(default=1024, metadata=_min(1))


@dataclass
class DdpConfig:
    # Processes on CPU (on GPUs it is one process per device in `devices`).
    nproc: int = field(default=2, metadata=_min(1))
    # Convert BatchNorm to synchronised BatchNorm (statistics over the global batch).
    sync_bn: bool = True


@dataclass
class FsdpConfig:
    # Processes on CPU (on GPUs it is one process per device in `devices`).
    nproc: int = field(default=2, metadata=_min(1))
    sync_bn: bool = True
    # Parameter dtype inside forward/backward; gradients are reduced in fp32.
    mixed_precision: str = field(default="none", metadata={"choices": ("none", "bf16", "fp16")})


@dataclass
class BalancedDpConfig:
    # GPU 0's share of each batch per optimizer step (as in the source notes); GPU 0 also
    # gathers outputs, so it gets less. With train.grad_accum it must divide evenly over the
    # step's forwards: batch 16, gpu0_bsz 4, grad_accum 2 on 3 GPUs is 2+3+3 per forward.
    # 0 leaves GPU 0 only gathering. null = an even split. auto: a short profiling pass
    # before training picks the candidate with the lowest peak memory among those within 5%
    # of the best throughput (pipeline/strategies/gpu0_autotune.py); null on the CPU or one GPU.
    # (Any, not Union[int, str], which omegaconf lacks; `validate` enforces the type.)
    gpu0_bsz: Any = field(default=None, metadata={"min": 0, "integer": True, "or": ("auto",)})


@dataclass
class PipelineParallelConfig:
    # Pipeline stages: one per process (and per GPU on GPUs); all of them in one process on a
    # machine with one GPU, or on the CPU with nproc 1 (a looped schedule, no overlap).
    stages: int = field(default=2, metadata=_min(2))
    # Processes on the CPU: null = one per stage; 1 = every stage in one process.
    nproc: Optional[int] = field(default=None, metadata=_min(1))
    # Micro-batches each (micro-)batch is split into inside the schedule.
    microbatches: int = field(default=4, metadata=_min(1))
    schedule: str = field(default="gpipe", metadata={"choices": ("gpipe", "1f1b")})


@dataclass
class CheckpointConfig:
    # Checkpoint every N epochs (and always at the end and on SIGTERM); 0 = only those.
    every_epochs: int = field(default=1, metadata=_min(0))
    # torchrun --max-restarts: failed workers are restarted this often and resume from the
    # last checkpoint, continuing the same MLflow run.
    max_restarts: int = field(default=0, metadata=_min(0))
    # Continue from another run's checkpoint directory (e.g. checkpoints/ddp copied from
    # another machine) when this configuration has none of its own. It must come from the
    # same model and strategy at the same world size.
    resume_from: Optional[str] = None


@dataclass
class DistConfig:
    # Nodes the train stage spans (pipeline/training/topology.py): 1 runs torchrun --standalone
    # here; N runs the same command on every node, the nodes meeting in a c10d rendezvous (ddp and
    # fsdp only). Launch settings: they never change what is computed, and the environment
    # wins over them (NNODES, as N or MIN:MAX; NODE_RANK; RDZV_ENDPOINT or MASTER_ADDR +
    # MASTER_PORT; RDZV_ID; also with torchrun's PET_ prefix), so one params.yaml serves
    # every node.
    nnodes: int = field(default=1, metadata=_min(1))
    # Elastic: carry on with as few as this many nodes (torchrun --nnodes=MIN:MAX, MAX being
    # nnodes); null = exactly nnodes.
    min_nnodes: Optional[int] = field(default=None, metadata=_min(1))
    # This node's index; node 0 hosts the rendezvous store. null: the node whose address
    # matches rdzv_endpoint hosts it. (Ranks are numbered by the rendezvous either way.)
    node_rank: Optional[int] = field(default=None, metadata=_min(0))
    # host:port of the rendezvous store on one of the nodes (port 29400 if left out);
    # required for more than one node.
    rdzv_endpoint: Optional[str] = None
    # Names the job at the rendezvous, the same on every node; null = parallel-lab-<strategy>.
    rdzv_id: Optional[str] = None
    # Seconds for all nodes to join the rendezvous, at the start and after a failure, before
    # the job gives up.
    join_timeout_s: int = field(default=600, metadata=_min(1))


@dataclass
class ReportConfig:
    # Test accuracy whose first crossing the report times ("time to target"); null = none.
    target_accuracy: Optional[float] = field(default=0.9, metadata={"min": 0.0, "max": 1.0})
    # Seconds between MLflow system-metrics samples (GPU utilisation and memory through NVML,
    # CPU, RAM) of each strategy run; null = not sampled.
    system_metrics_interval_s: Optional[float] = field(default=2.0, metadata={"min_exclusive": 0.0})


@dataclass
class MlflowConfig:
    # Experiment name in MLflow. Tracking URI comes from MLFLOW_TRACKING_URI
    # (default: sqlite:///mlflow.db at the repository root).
    experiment: str = field(default="parallel-lab", metadata={"nonempty": True})
    # At the end of a stage, keep retrying an unreachable tracking server this long before
    # leaving the rest to `python -m pipeline.publish` (a restarting server gets a grace period).
    final_sync_wait_s: float = field(default=30.0, metadata=_min(0.0))


@dataclass
class Config:
    # Seeds weights, data order and augmentation, identically for every strategy.
    seed: int = 0
    # auto (every visible GPU, else CPU) | cpu | "0" | "0,3": the list picks the GPUs.
    devices: str = "auto"
    # Strategies the pipeline trains, each in its own DVC stage and MLflow run.
    strategies: list[str] = field(
        default_factory=lambda: ["single"], metadata={"nonempty": True, "each_in": STRATEGY_NAMES}
    )
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    ddp: DdpConfig = field(default_factory=DdpConfig)
    fsdp: FsdpConfig = field(default_factory=FsdpConfig)
    balanced_dp: BalancedDpConfig = field(default_factory=BalancedDpConfig)
    pipeline_parallel: PipelineParallelConfig = field(default_factory=PipelineParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    # `make quick` (python -m pipeline.quickstart): key=value overrides for a first result in
    # minutes on any machine. Not a stage's param: dvc repro runs the full experiment.
    quick: list[str] = field(default_factory=list)


def load_config(path: str | Path = "params.yaml", overrides: Sequence[str] = ()) -> Config:
    """params.yaml + `key=value` overrides -> a validated `Config`, or `UserError`."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) if path.exists() else {}
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML ({_first_line(err)})") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a mapping of sections at the top level")
    check_keys(raw, Config, source=str(path))
    for item in overrides:
        if "=" not in item:
            raise UserError(f"override {item!r}: expected key=value (e.g. train.epochs=2)")
    dot = _parse_dotlist(overrides)
    check_keys(dot, Config, source="override")
    return merge_and_validate(raw, dot, source=str(path))


def merge_and_validate(raw: dict, dot: dict, source: str) -> Config:
    schema = OmegaConf.structured(Config)
    for where, layer in ((source, raw), ("override", dot)):
        try:
            schema = OmegaConf.merge(schema, layer)
        except OmegaConfBaseException as err:
            key = getattr(err, "full_key", None) or "?"
            raise UserError(f"{where}: {key}: {_first_line(err)}") from None
    cfg: Config = OmegaConf.to_object(schema)  # type: ignore[assignment]
    validate(cfg)
    return cfg


def _parse_dotlist(items: Sequence[str]) -> dict:
    out: dict = {}
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
                raise UserError(f"override {item!r}: {part} is not a section")
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


def check_keys(raw: dict, schema: type, source: str, prefix: str = "") -> None:
    """Unknown keys are refused by name, with the nearest known key as a hint."""
    known = {f.name: f for f in dataclasses.fields(schema)}
    for key, value in raw.items():
        full = f"{prefix}{key}"
        if key not in known:
            hint = difflib.get_close_matches(str(key), known, n=1)
            also = f"; did you mean '{prefix}{hint[0]}'?" if hint else ""
            raise UserError(
                f"{source}: unknown key '{full}' (expected one of: {', '.join(known)}){also}"
            )
        section = typing.get_type_hints(schema)[key]
        if dataclasses.is_dataclass(section):
            if not isinstance(value, dict):
                raise UserError(
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
        raise UserError(
            f"{key}: got {value!r}, expected {', '.join(options[:-1])} or {options[-1]}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{key}: got {value}, expected a finite number")
    if "min" in rule and value < rule["min"]:
        raise UserError(f"{key}: got {value}, expected >= {rule['min']}")
    if "min_exclusive" in rule and value <= rule["min_exclusive"]:
        raise UserError(f"{key}: got {value}, expected > {rule['min_exclusive']}")
    if "max" in rule and value > rule["max"]:
        raise UserError(f"{key}: got {value}, expected <= {rule['max']}")
    if "max_exclusive" in rule and value >= rule["max_exclusive"]:
        raise UserError(f"{key}: got {value}, expected < {rule['max_exclusive']}")
    if "choices" in rule and value not in rule["choices"]:
        raise UserError(f"{key}: got {value!r}, expected one of {', '.join(rule['choices'])}")
    if rule.get("nonempty") and len(value) == 0:
        raise UserError(f"{key}: is empty, expected at least one entry")
    if "each_in" in rule:
        for item in value:
            if item not in rule["each_in"]:
                raise UserError(
                    f"{key}: unknown entry {item!r}, expected any of {', '.join(rule['each_in'])}"
                )
        if len(set(value)) != len(value):
            raise UserError(f"{key}: lists a name twice ({value}); expected each once")


def _check_cross_fields(cfg: Config) -> None:
    parse_devices(cfg.devices)  # the syntax of `devices`
    if cfg.dist.min_nnodes is not None and cfg.dist.min_nnodes > cfg.dist.nnodes:
        raise UserError(
            f"dist.min_nnodes: got {cfg.dist.min_nnodes}, expected at most "
            f"dist.nnodes ({cfg.dist.nnodes})"
        )
    if cfg.dist.rdzv_endpoint is not None:
        parse_endpoint(cfg.dist.rdzv_endpoint)
    for name, digest in cfg.data.md5.items():
        if len(digest) != 32 or any(c not in "0123456789abcdef" for c in digest.lower()):
            raise UserError(f"data.md5.{name}: got {digest!r}, expected 32 hex digits")
    for name in cfg.data.md5:
        if name not in fashion_mnist.MD5:
            raise UserError(
                f"data.md5: unknown file {name!r}; expected the dataset's files: "
                f"{', '.join(fashion_mnist.MD5)}"
            )
    for name in fashion_mnist.MD5:
        if name not in cfg.data.md5:
            raise UserError(f"data.md5: no sum for {name}; expected one per dataset file")
    if cfg.train.batch_size % cfg.train.grad_accum:
        raise UserError(
            f"train.batch_size: got {cfg.train.batch_size}, expected a multiple of "
            f"train.grad_accum ({cfg.train.grad_accum})"
        )


def effective_lr(train: TrainConfig) -> float:
    """The learning rate actually used, after `lr_scaling`."""
    if train.lr_scaling == "linear":
        return train.lr * train.batch_size / train.base_batch_size
    return train.lr


def flatten(cfg: Config) -> dict[str, Any]:
    """Dotted keys -> values, for MLflow params (lists and dicts as compact strings)."""
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")
            else:
                out[f"{prefix}{f.name}"] = value

    walk(cfg, "")
    return out


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
