"""The params.yaml schema: typed dataclasses, validated once, read everywhere.

`params.yaml` holds the experiment's values; its sections mirror the DVC stages. This module
is the one home of every key's default and meaning: each field's docstring (the string right
after it) says what it means, and `metadata` holds the range or the allowed values that
`validate` enforces, so the rule and the field sit side by side. `describe` prints them all,
for `python -m pipeline.<command> --help` and `--params SECTION`.

Loading: `load_config(path, overrides)` merges params.yaml and `key=value` overrides (omegaconf
dotlist) onto the schema and raises `ConfigError` naming the key, the value and what was
expected for an unknown key, a wrong type or a value out of range.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import math
import textwrap
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, cast

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """Bad params: the message names the key and what was expected. The commands print it as
    one line and exit with code 2, like any other bad input (pipeline/errors.py)."""


# torchvision.datasets.FashionMNIST.mirrors / .resources (tests check they still agree).
FASHION_MNIST_MIRRORS = ["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"]
FASHION_MNIST_MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}


# What `seed` feeds: torch.manual_seed (a 64-bit seed; a negative one wraps around, so -1
# would be 2**64 - 1 in disguise) and each epoch's data-order and augmentation generators,
# seeded with seed * 1_000_003 + epoch (pipeline/data), which must stay below 2**64. Up to
# 2**32 - 1 (numpy's range too) leaves room for 2**63 epochs.
SEED_MAX = 2**32 - 1


def _min(lo: float, **kw: Any) -> Any:
    return {"min": lo, **kw}


@dataclass
class DataConfig:
    """`data`: the dataset and the training input pipeline (the fetch stage's section)."""

    mirrors: list[str] = field(
        default_factory=lambda: list(FASHION_MNIST_MIRRORS), metadata={"nonempty": True}
    )
    """Base URLs tried in order for each file; file:// URLs and plain directories work too."""
    md5: dict[str, str] = field(default_factory=lambda: dict(FASHION_MNIST_MD5))
    """File name -> expected MD5. Defaults to torchvision's sums; override for another
    mirror."""
    limit_train: Optional[int] = field(default=None, metadata=_min(1))
    """Keep only the first N training samples (null = all 60000). For smoke runs."""
    limit_test: Optional[int] = field(default=None, metadata=_min(1))
    """Keep only the first N test samples (null = all 10000). For smoke runs."""
    loader: str = field(default="device", metadata={"choices": ("device", "dataloader")})
    """Training input pipeline (pipeline/data/loaders.py). device: the uint8 dataset on the
    training device, batches gathered and normalised there. dataloader: the notes'
    torchvision FashionMNIST + ToTensor per sample + DataLoader (DistributedSampler across
    ranks)."""
    augment: bool = False
    """Random crop (4-pixel padding) + horizontal flip of training images, drawn per
    position of each epoch's order (seed, epoch): the same whichever rank or worker loads it."""
    workers: int = field(default=4, metadata=_min(0))
    """DataLoader worker processes (dataloader only); the notes use 4."""


@dataclass
class ModelConfig:
    """`model`: the network every strategy trains."""

    width: int = field(default=64, metadata=_min(1))
    """Base channel width of the ResNet-18; 64 is the real network, 8 makes CPU runs
    quick."""


@dataclass
class TrainConfig:
    """`train`: the optimisation, identical for every strategy."""

    epochs: int = field(default=10, metadata=_min(1))
    """Passes over the training set."""
    batch_size: int = field(default=256, metadata=_min(1))
    """Global batch per optimizer step, the same for every strategy so runs compare."""
    lr: float = field(default=0.1, metadata={"min_exclusive": 0.0})
    """SGD learning rate (at base_batch_size when lr_scaling is linear)."""
    momentum: float = field(default=0.0, metadata={"min": 0.0, "max_exclusive": 1.0})
    """SGD momentum; the notes' d2l loop uses plain SGD (0)."""
    weight_decay: float = field(default=0.0, metadata=_min(0.0))
    """SGD weight decay (L2 penalty)."""
    grad_accum: int = field(default=1, metadata=_min(1))
    """Micro-steps per optimizer step: batch_size is split into grad_accum forwards."""
    lr_scaling: str = field(default="none", metadata={"choices": ("none", "linear")})
    """none: use lr as is. linear: lr * batch_size / base_batch_size (the notes' 512 ->
    0.2)."""
    base_batch_size: int = field(default=256, metadata=_min(1))
    """The batch size lr is meant for, when lr_scaling is linear."""
    precision: str = field(
        default="auto", metadata={"choices": ("auto", "fp32", "fp64", "tf32", "bf16", "fp16")}
    )
    """Arithmetic (pipeline/training/precision.py): fp32; fp64 for exact cross-strategy
    comparisons (parity tests; fp32 training of this network is chaotic enough that 1e-7
    differences grow to 1e-2); tf32 (CUDA tensor cores); bf16 autocast; fp16 autocast + loss
    scaling (CUDA). Modes the device lacks fall back to fp32 with a note. auto: bf16 on a GPU
    with native bfloat16 (compute capability 8.0+), fp16 with loss scaling on an older GPU,
    fp32 on the CPU (bf16 is slower on most CPUs; docs/performance.md)."""
    channels_last: Optional[bool] = None
    """NHWC activations and weights (what tensor-core convolutions want). null = auto: on for
    a GPU, off on the CPU (docs/performance.md). fsdp and pipeline_parallel run without
    it."""
    compile: bool = False
    """torch.compile the strategy's forward; the first epoch then includes compilation."""
    compile_mode: str = field(
        default="default",
        metadata={
            "choices": ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
        },
    )
    """torch.compile's mode. reduce-overhead replays each compiled forward/backward as one
    CUDA graph, the fastest setting on a GPU, where at batch 256 this model is bound by the
    host launching kernels (docs/performance.md); fsdp compiles in the default mode instead.
    No effect on the CPU."""
    cuda_graph: str = field(default="none", metadata={"choices": ("none", "step")})
    """none | step: capture the whole training step (forward, loss, backward, optimizer step)
    as one CUDA graph after 11 eager steps, then replay it every step
    (pipeline/training/graphed_step.py). Applies on a GPU, in a one-process job on one device
    (single; dp and balanced_dp on one GPU; ddp at world size 1), without gradient
    accumulation or fp16's loss scaler, in fp32, tf32 or bf16; elsewhere the run trains eagerly
    and its notes say why. Replaces compile's own CUDA graphs (reduce-overhead compiles in the
    default mode under it). Unmeasured on a GPU so far (docs/performance.md)."""
    lr_schedule: str = field(default="none", metadata={"choices": ("none", "cosine", "onecycle")})
    """none | cosine (linear warm-up, cosine decay to 0) | onecycle (OneCycleLR's shape), per
    optimizer step; the peak is the effective lr (pipeline/training/optim.py)."""
    warmup_epochs: float = field(default=1.0, metadata=_min(0.0))
    """Epochs (may be fractional) of warm-up to the peak lr (cosine, onecycle)."""
    label_smoothing: float = field(default=0.0, metadata={"min": 0.0, "max_exclusive": 1.0})
    """Cross-entropy label smoothing of the training loss (reported losses are plain)."""
    eval_batch_size: int = field(default=1024, metadata=_min(1))
    """Batch used for evaluation only (no gradients, so it can be larger)."""


@dataclass
class SingleConfig:
    """`single`: the plain model on one device. No options of its own: the section exists so
    that every strategy's train stage depends on exactly its own section (dvc.yaml)."""


@dataclass
class DpConfig:
    """`dp`: nn.DataParallel over every GPU in `devices`. No options of its own: the section
    exists so that every strategy's train stage depends on exactly its own section
    (dvc.yaml)."""


@dataclass
class DdpConfig:
    """`ddp`: DistributedDataParallel, one process per device."""

    nproc: int = field(default=2, metadata=_min(1))
    """Processes on CPU (on GPUs it is one process per device in `devices`)."""
    sync_bn: bool = True
    """Convert BatchNorm to synchronised BatchNorm (statistics over the global batch)."""


@dataclass
class FsdpConfig:
    """`fsdp`: FSDP2 (torch.distributed.fsdp.fully_shard, not the FullyShardedDataParallel
    wrapper): parameters, gradients and optimizer state sharded over the ranks, one process per
    device."""

    nproc: int = field(default=2, metadata=_min(1))
    """Processes on CPU (on GPUs it is one process per device in `devices`)."""
    sync_bn: bool = True
    """Convert BatchNorm to synchronised BatchNorm (statistics over the global batch)."""
    mixed_precision: str = field(default="none", metadata={"choices": ("none", "bf16", "fp16")})
    """Parameter dtype inside forward/backward; gradients are reduced in fp32."""


@dataclass
class BalancedDpConfig:
    """`balanced_dp`: DataParallel with a smaller share of each batch on GPU 0."""

    # (Any, not Union[int, str], which omegaconf lacks; `validate` enforces the type.)
    gpu0_bsz: Any = field(default=None, metadata={"min": 0, "integer": True, "or": ("auto",)})
    """GPU 0's share of each batch per optimizer step (as in the source notes); GPU 0 also
    gathers outputs, so it gets less. With train.grad_accum it must divide evenly over the
    step's forwards: batch 16, gpu0_bsz 4, grad_accum 2 on 3 GPUs is 2+3+3 per forward.
    0 leaves GPU 0 only gathering. null = an even split. auto: a short profiling pass before
    training picks the candidate with the lowest peak memory among those within 5% of the
    best throughput (pipeline/strategies/gpu0_autotune.py), once per run: the checkpoint keeps
    it for a resume; null on the CPU or one GPU."""


@dataclass
class PipelineParallelConfig:
    """`pipeline_parallel`: the model split into stages that micro-batches flow through."""

    stages: int = field(default=2, metadata=_min(2))
    """Pipeline stages: one per process (and per GPU on GPUs); all of them in one process on
    a machine with one GPU, or on the CPU with nproc 1 (a looped schedule, no overlap)."""
    nproc: Optional[int] = field(default=None, metadata=_min(1))
    """Processes on the CPU: null = one per stage; 1 = every stage in one process."""
    microbatches: int = field(default=4, metadata=_min(1))
    """Micro-batches each (micro-)batch is split into inside the schedule."""
    schedule: str = field(default="gpipe", metadata={"choices": ("gpipe", "1f1b")})
    """gpipe (every forward of a batch, then every backward) | 1f1b (forwards and backwards
    interleaved; with several processes it needs microbatches >= stages)."""


@dataclass
class CheckpointConfig:
    """`checkpoint`: saving and resuming training runs."""

    every_epochs: int = field(default=1, metadata=_min(0))
    """Checkpoint every N epochs (and always at the end and on SIGTERM); 0 = only those."""
    max_restarts: int = field(default=0, metadata=_min(0))
    """torchrun --max-restarts: failed workers are restarted this often and resume from the
    last checkpoint, continuing the same MLflow run."""
    resume_from: Optional[str] = None
    """Continue from another run's checkpoint directory (e.g. checkpoints/ddp copied from
    another machine) when this configuration has none of its own. It must come from the
    same model and strategy; it may have been saved by another number of processes (the
    model and optimizer state reshard)."""


@dataclass
class DistConfig:
    """`dist`: how the train stage is launched, on one node or several
    (pipeline/training/topology.py). Launch settings: they never change what is computed,
    and the environment wins over them (NNODES, as N or MIN:MAX; NODE_RANK; RDZV_ENDPOINT or
    MASTER_ADDR + MASTER_PORT; RDZV_ID; also with torchrun's PET_ prefix), so one
    params.yaml serves every node."""

    nnodes: int = field(default=1, metadata=_min(1))
    """Nodes the train stage spans: 1 runs torchrun --standalone here; N runs the same
    command on every node, the nodes meeting in a c10d rendezvous (ddp and fsdp only).
    Environment: NNODES."""
    min_nnodes: Optional[int] = field(default=None, metadata=_min(1))
    """Elastic: carry on with as few as this many nodes (torchrun --nnodes=MIN:MAX, MAX being
    nnodes); null = exactly nnodes."""
    node_rank: Optional[int] = field(default=None, metadata=_min(0))
    """This node's index; node 0 hosts the rendezvous store. null: the node whose address
    matches rdzv_endpoint hosts it. (Ranks are numbered by the rendezvous either way.)
    Environment: NODE_RANK."""
    rdzv_endpoint: Optional[str] = None
    """host:port of the rendezvous store on one of the nodes (port 29400 if left out);
    required for more than one node. Environment: RDZV_ENDPOINT, or MASTER_ADDR +
    MASTER_PORT."""
    rdzv_id: Optional[str] = None
    """Names the job at the rendezvous, the same on every node; null =
    parallel-lab-<strategy>. Environment: RDZV_ID."""
    join_timeout_s: int = field(default=600, metadata=_min(1))
    """Seconds for all nodes to join the rendezvous, at the start and after a failure,
    before the job gives up."""


@dataclass
class ReportConfig:
    """`report`: the compare stage's report, and the system metrics and progress lines of
    each train stage."""

    target_accuracy: Optional[float] = field(default=0.9, metadata={"min": 0.0, "max": 1.0})
    """Test accuracy whose first crossing the report times ("time to target"); null =
    none."""
    system_metrics_interval_s: Optional[float] = field(default=2.0, metadata={"min_exclusive": 0.0})
    """Seconds between MLflow system-metrics samples (GPU utilisation and memory through
    NVML, CPU, RAM) of each strategy run; null = not sampled."""
    log_every_s: Optional[float] = field(default=30.0, metadata=_min(0.0))
    """Seconds between the progress lines a train stage prints while an epoch runs, when its
    output is not a terminal (logs, Compose): epoch, step/steps, loss (the epoch's so far, of
    the writer rank's samples), samples/s, ETA of the epoch and the writer process's peak
    memory per device. 0 = a line after every optimizer step; null = none. At a terminal a
    live bar shows the same instead. Shows, never changes, a run: no stage re-runs for it."""


@dataclass
class MlflowConfig:
    """`mlflow`: where the runs are tracked."""

    experiment: str = field(default="parallel-lab", metadata={"nonempty": True})
    """Experiment name in MLflow. The tracking URI comes from MLFLOW_TRACKING_URI (default:
    sqlite:///mlflow.db at the repository root)."""
    final_sync_wait_s: float = field(default=30.0, metadata=_min(0.0))
    """At the end of a stage, keep retrying an unreachable tracking server this long before
    leaving the rest to `python -m pipeline.publish` (a restarting server gets a grace
    period)."""
    log_model: bool = True
    """Log each strategy's final model as an MLflow model (mlflow.pytorch, with a signature
    and an input example; the compare stage registers the recommended one). It costs a few
    seconds a stage; false leaves model.pt as the run's only copy of the weights."""
    log_every_steps: Optional[int] = field(default=50, metadata=_min(0))
    """Log step_train_loss (the mean loss of the writer rank's samples since the last point
    or the epoch's start) and step_samples_per_s every N optimizer steps of the run, at MLflow
    step epoch * steps_per_epoch + step, so its charts move while it trains. Never waits for
    MLflow: a slow or down server loses these points, not the per-epoch metrics. null or 0 =
    off. Shows, never changes, a run: no stage re-runs for it."""


@dataclass
class Config:
    """params.yaml: the top-level keys, then one section per stage and per strategy."""

    seed: int = field(default=0, metadata={"min": 0, "max": SEED_MAX})
    """Seeds weights, data order and augmentation, identically for every strategy
    (0 to 4294967295)."""
    devices: str = "auto"
    """auto (every visible GPU, else CPU) | cpu | "0" | "0,3": the list picks the GPUs."""
    strategies: list[str] = field(
        default_factory=lambda: ["single"], metadata={"nonempty": True, "unique": True}
    )
    """Strategies the pipeline trains, each in its own DVC stage and MLflow run."""
    data: DataConfig = field(default_factory=DataConfig)
    """The dataset and the input pipeline."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The network."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The optimisation, the same for every strategy."""
    single: SingleConfig = field(default_factory=SingleConfig)
    """Options of the single strategy (none)."""
    dp: DpConfig = field(default_factory=DpConfig)
    """Options of the dp strategy (none)."""
    ddp: DdpConfig = field(default_factory=DdpConfig)
    """Options of the ddp strategy."""
    fsdp: FsdpConfig = field(default_factory=FsdpConfig)
    """Options of the fsdp strategy."""
    balanced_dp: BalancedDpConfig = field(default_factory=BalancedDpConfig)
    """Options of the balanced_dp strategy."""
    pipeline_parallel: PipelineParallelConfig = field(default_factory=PipelineParallelConfig)
    """Options of the pipeline_parallel strategy."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpointing and restarts."""
    dist: DistConfig = field(default_factory=DistConfig)
    """Multi-node launch."""
    report: ReportConfig = field(default_factory=ReportConfig)
    """The report and the system metrics."""
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    """Where the runs are tracked."""
    quick: list[str] = field(default_factory=list)
    """`make quick` (python -m pipeline.quickstart): key=value overrides for a first result in
    minutes on any machine. Not a stage's param: dvc repro runs the full experiment."""


def load_config(path: str | Path | None = "params.yaml", overrides: Sequence[str] = ()) -> Config:
    """params.yaml + `key=value` overrides -> a validated `Config`, or `ConfigError`.
    `path` None: the schema's defaults alone (tests, benchmarks). A file that is missing,
    empty or all comments is refused rather than read as "every default": that is the full
    10-epoch experiment, which would overwrite the checkpoints and results of the one meant."""
    raw: Any = {}
    if path is not None:
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
    source = "defaults" if path is None else str(path)
    check_keys(raw, Config, source=source)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value (e.g. train.epochs=2)")
    dot = _parse_dotlist(overrides)
    check_keys(dot, Config, source="override")
    return merge_and_validate(raw, dot, source=source)


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


HELP_WIDTH = 100  # columns `describe` keeps to


def field_docs(schema: type) -> dict[str, str]:
    """A dataclass's attribute docstrings (the string statement right after a field), read
    from its source: field name -> docstring. Fields without one are left out."""
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        raise TypeError(f"{schema!r} is not a dataclass")
    return dict(_field_docs(schema))


@functools.cache
def _field_docs(schema: type) -> tuple[tuple[str, str], ...]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(schema)))
    body = next(node for node in tree.body if isinstance(node, ast.ClassDef)).body
    names = {f.name for f in dataclasses.fields(schema)}
    docs = []
    for stmt, after in zip(body, body[1:]):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and stmt.target.id in names
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs.append((stmt.target.id, inspect.cleandoc(after.value.value)))
    return tuple(docs)


def describe(section: Optional[str] = None, values: Optional[Config] = None) -> str:
    """Every params.yaml key, dotted, with its value (as YAML writes it) and its meaning,
    grouped by section; with `section` (a top-level key of params.yaml) only that one.
    The value is `values`' (the config a command would run with), followed by the schema's
    default where the two differ; without `values`, the default. An unknown section is a
    `ConfigError` listing the known ones."""
    fields = dataclasses.fields(Config)
    known = [f.name for f in fields]
    if section is not None and section not in known:
        hint = difflib.get_close_matches(section, known, n=1)
        also = f"; did you mean '{hint[0]}'?" if hint else ""
        raise ConfigError(
            f"unknown params section {section!r} (expected one of: {', '.join(known)}){also}"
        )
    types = typing.get_type_hints(Config)
    defaults = Config()
    used = defaults if values is None else values
    docs = field_docs(Config)
    chosen = [f.name for f in fields if section is None or f.name == section]
    top = [name for name in chosen if not dataclasses.is_dataclass(types[name])]
    blocks = []
    if top:
        lines = ["top-level keys:"]
        for name in top:
            default = getattr(defaults, name)
            lines += _describe_key(name, getattr(used, name), docs.get(name, ""), default)
        blocks.append("\n".join(lines))
    for name in chosen:
        if not dataclasses.is_dataclass(types[name]):
            continue
        schema = cast(type, types[name])
        title = inspect.cleandoc(schema.__doc__ or "").removeprefix(f"`{name}`: ")
        lines = _wrap(f"{name}: {title}", indent=0, hang=4)
        section_docs = field_docs(schema)
        for f in dataclasses.fields(schema):
            value = getattr(getattr(used, name), f.name)
            default = getattr(getattr(defaults, name), f.name)
            doc = section_docs.get(f.name, "")
            lines += _describe_key(f"{name}.{f.name}", value, doc, default)
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _describe_key(key: str, value: Any, doc: str, default: Any) -> list[str]:
    differs = f"(default: {_yaml_flow(default)})" if value != default else ""
    line = f"  {key}: {_yaml_flow(value)}" + (f"  {differs}" if differs else "")
    if len(line) <= HELP_WIDTH:
        lines = [line]
    else:  # a long mapping or list: YAML's block style, one entry a line
        block = yaml.safe_dump(value, default_flow_style=False, sort_keys=False, width=10**9)
        lines = [f"  {key}:", *(f"    {row}" for row in block.splitlines())]
        lines += _wrap(differs, indent=4, hang=6)
    return lines + _wrap(doc, indent=6, hang=6)


def _yaml_flow(value: Any) -> str:
    """A value as YAML writes it on one line: null, true, 0.1, [a, b], {k: v}, '0'."""
    text: str = yaml.safe_dump([value], default_flow_style=True, sort_keys=False, width=10**9)
    return text.strip()[1:-1]


def _wrap(text: str, indent: int, hang: int) -> list[str]:
    return textwrap.wrap(
        " ".join(text.split()),
        width=HELP_WIDTH,
        initial_indent=" " * indent,
        subsequent_indent=" " * hang,
        break_long_words=False,
        break_on_hyphens=False,
    )
