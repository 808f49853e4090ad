"""The params.yaml schema: typed dataclasses, one per section, each field with its default,
its meaning (the docstring right after it) and, in `metadata`, the range or the allowed values
that `validate` (validate.py) enforces, so the rule and the field sit side by side. `describe`
(help.py) reads the docstrings from this file's source.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional


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
    """DataLoader worker processes (dataloader only); the notes use 4. At most the cores the
    process may use (os.sched_getaffinity): fewer start where it has fewer, with a note."""


@dataclass
class ModelConfig:
    """`model`: the network every strategy trains."""

    width: int = field(default=64, metadata=_min(1))
    """Base channel width of the ResNet-18; 64 is the real network, 8 makes CPU runs
    quick."""
    init: str = field(default="torch", metadata={"choices": ("torch", "d2l")})
    """Initial weights: torch (each layer's own default) | d2l (note 004: normal_(std=0.01)
    on every Linear and Conv2d weight, biases and BatchNorm as torch makes them)."""


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
    """Arithmetic (pipeline/numerics/precision.py): fp32; fp64 for exact cross-strategy
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
    cuda_graph: str = field(default="auto", metadata={"choices": ("auto", "none", "step")})
    """auto | none | step. auto: on a GPU, what a GPU measurement chose for the strategy
    (pipeline/numerics/speed_defaults.py: step for single, measured on an H200; none for the
    strategies not measured yet), none on the CPU. step: capture the whole training step
    (forward, loss, backward, optimizer step)
    as one CUDA graph after 11 eager steps, then replay it every step
    (pipeline/numerics/graphed_step.py). Applies on a GPU, in a one-process job on one device
    (single; dp and balanced_dp on one GPU; ddp at world size 1), without gradient
    accumulation or fp16's loss scaler, in fp32, tf32 or bf16; elsewhere the run trains eagerly
    and its notes say why. Replaces compile's own CUDA graphs (reduce-overhead compiles in the
    default mode under it). docs/performance.md has what was measured."""
    lr_schedule: str = field(default="none", metadata={"choices": ("none", "cosine", "onecycle")})
    """none | cosine (linear warm-up, cosine decay to 0) | onecycle (OneCycleLR's shape), per
    optimizer step; the peak is the effective lr (pipeline/numerics/optim.py)."""
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
class HorovodConfig:
    """`horovod`: Horovod's DistributedOptimizer, one process per device, started by horovodrun
    over Gloo. Opt-in: `make install HOROVOD=1` builds Horovod (docs/horovod.md), and the
    strategy runs only where `strategies` lists it."""

    nproc: int = field(default=2, metadata=_min(1))
    """Processes on CPU (horovodrun -np; on GPUs it is one process per device in `devices`)."""
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
class ChannelParallelConfig:
    """`channel_parallel`: the notes' third scheme (通道并行): every rank sees the whole
    micro-batch and holds 1/N of each residual block's inner channels."""

    nproc: int = field(default=2, metadata=_min(1))
    """Processes on CPU (on GPUs it is one process per device in `devices`); model.width must
    be a multiple of it."""


@dataclass
class HybridConfig:
    """`hybrid`: data and model parallelism composed on one device mesh (the notes'
    数据+模型并行); the product of the dimensions is the number of processes (on GPUs, of
    devices in `devices`)."""

    data: int = field(default=2, metadata=_min(1))
    """Data replicas, DDP between them: each trains data x shard-th of every micro-batch."""
    shard: int = field(default=1, metadata=_min(1))
    """Data shards, FSDP2 between them (parameters, gradients and optimizer state sharded);
    with data > 1 too, HSDP: replicated across the data groups, sharded within."""
    channel: int = field(default=2, metadata=_min(1))
    """Channel shards inside every data rank, as channel_parallel; model.width must be a
    multiple of it."""
    pipeline: int = field(default=1, metadata=_min(1))
    """Pipeline stages inside every data rank, as pipeline_parallel's (GPipe), at most the
    model's 6 blocks; with pipeline > 1, channel and shard must be 1 (data x pipeline)."""
    microbatches: int = field(default=1, metadata=_min(1))
    """With pipeline > 1: pipeline micro-batches each data rank's share of a micro-batch is
    split into; 1 computes what single computes (BatchNorm over the whole share)."""
    sync_bn: bool = True
    """Synchronise BatchNorm statistics over the data ranks (over the global micro-batch)."""


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
    (pipeline/launch/topology.py). Launch settings: they never change what is computed,
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
class PredictConfig:
    """`predict`: the predict stage: each strategy's epoch on N devices like this machine's,
    predicted (pipeline/scaling): its rank's step measured here by the strategy's own code at
    world size N, its communication modelled over `link`."""

    gpus: list[int] = field(default_factory=lambda: [2, 4, 8])
    """The device counts N to predict for, each at least 2; [] = none (the predict stages
    then only say so, in a fraction of a second)."""
    time_s: float = field(default=2.0, metadata={"min_exclusive": 0.0})
    """Seconds each rank's steps are timed, after half as long untimed: longer is steadier,
    shorter quicker. The error bands were checked at 2 and 0.5, wider at 0.5; a prediction
    is shown with those of the longest checked timing within its own (docs/scaling.md)."""
    link: str = "auto"
    """The link between the devices: nvlink-h100 | pcie | ib-ndr | ethernet-100g (nccl-tests
    bus bandwidths), a number in GB/s, or the path of an nccl-tests all_reduce_perf output;
    auto = gloo between processes on this machine, measured, on a CPU, and nvlink-h100 on a
    GPU."""


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
    and an input example), by the compare stage for every strategy at once, which then
    registers the recommended one, and by `python -m pipeline.publish` where one is still
    missing. It costs the compare stage a few seconds; false leaves model.pt as the run's
    only copy of the weights."""
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
    """auto (every visible GPU, else CPU) | cpu | "0" | "0,3": the list picks the GPUs; a GPU
    named twice ("0,0") holds two ranks (or replicas): each rank's memory is real, their time
    is turns on one device and is not ranked (rehearsing N GPUs on one)."""
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
    horovod: HorovodConfig = field(default_factory=HorovodConfig)
    """Options of the horovod strategy (opt-in: docs/horovod.md)."""
    balanced_dp: BalancedDpConfig = field(default_factory=BalancedDpConfig)
    """Options of the balanced_dp strategy."""
    pipeline_parallel: PipelineParallelConfig = field(default_factory=PipelineParallelConfig)
    """Options of the pipeline_parallel strategy."""
    channel_parallel: ChannelParallelConfig = field(default_factory=ChannelParallelConfig)
    """Options of the channel_parallel strategy."""
    hybrid: HybridConfig = field(default_factory=HybridConfig)
    """Options of the hybrid strategy."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpointing and restarts."""
    dist: DistConfig = field(default_factory=DistConfig)
    """Multi-node launch."""
    report: ReportConfig = field(default_factory=ReportConfig)
    """The report and the system metrics."""
    predict: PredictConfig = field(default_factory=PredictConfig)
    """The N-device predictions."""
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    """Where the runs are tracked."""
    quick: list[str] = field(default_factory=list)
    """`make quick` (python -m pipeline.quickstart): key=value overrides for a first result in
    minutes on any machine. Not a stage's param: dvc repro runs the full experiment."""


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
