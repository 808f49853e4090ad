"""What a strategy is (`StrategySpec`: its facts, how many processes it needs, how it
parallelizes the model), and the two kinds of result it hands the shared training loop
(`DataParallelRun`, `PipelinedRun`).

A strategy module (one per file in this package, named in `pipeline.strategies.NAMES`) ends
with `SPEC = StrategySpec(FACTS, nproc, parallelize)`, where

    FACTS: StrategyFacts[Options]
        its facts, stated once: its params section's dataclass (`Options`), whether it
        spans nodes, its capabilities, and the keys of its section that change what a run
        computes
    def nproc(options: Options, plan: BatchPlan, n_gpus: int) -> int
        processes torchrun must start, given its own params section, the batch as one
        process trains it, and the GPUs chosen (0: the CPU); raises UserError if the
        strategy cannot run as asked
    def parallelize(model, options: Options, plan: BatchPlan, ctx: DistContext, autocast) -> Run
        applies the parallelism to the plain model (the six blocks of
        pipeline.resnet.resnet18), already on ctx.device; `plan` is the batch over
        this job's data-parallel ranks, `autocast` the run's arithmetic (a context factory).
        What the strategy can do only once the checkpoint is restored and the loop's speed
        options apply (a broadcast from rank 0, a setting measured once per run) is left
        to the run's `at_start`, called before the first step (numerics/build.py `started`)

`StrategySpec` is generic in the options type, so where a module builds its SPEC mypy checks
that both builders take the section its FACTS name (tests/unit/test_strategy_types.py).
The Trainer (pipeline/training/trainer.py) branches on the type of the result, never on names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Generic, Literal, Optional, TypeVar, Union, overload

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from pipeline.batch_plan import BatchPlan
from pipeline.context import DistContext
from pipeline.parallel_dims import ParallelDims

Autocast = Callable[[], ContextManager[object]]
Forward = Callable[[torch.Tensor], torch.Tensor]  # images -> logits
StateDict = dict[str, Any]  # a module's state_dict (tensors, and what a BatchNorm keeps)

# what starts a job's processes: torchrun's elastic agent, or horovodrun (launch/horovod_run.py)
Launcher = Literal["torchrun", "horovodrun"]
Preset = tuple[str, dict[str, object]]  # StrategyFacts.preset_of's: a strategy, its keys
OptionsT = TypeVar("OptionsT")  # a strategy's options: the dataclass of its params section


@dataclass(frozen=True)
class StrategyFacts(Generic[OptionsT]):
    name: str  # the strategy's name, its module's and its params section's
    options: type[OptionsT]  # the dataclass of its params section (pipeline/config/schema.py)
    # its world is processes per node x nodes (else it runs on one node)
    spans_nodes: bool
    # how its job's processes split the work, given its section and the world size: the
    # device mesh (pipeline/parallel_dims.py), whose data dimensions each train a share of
    # every micro-batch (the plan's data_world)
    mesh: Callable[[OptionsT, int], ParallelDims]
    # its section at every way to lay n devices out that a prediction compares (a hybrid's
    # factorizations of n); None: the section as it is
    layouts: Optional[Callable[[OptionsT, int], list[OptionsT]]] = None
    # keys of its own section that change what a run computes, and so its identity
    # (pipeline/checkpoints/identity.py); the others only place the run (e.g. nproc: the
    # world size, which the identity holds anyway)
    shaping_keys: tuple[str, ...] = ()
    # torch.compile may replay its forward/backward as CUDA graphs (reduce-overhead)
    cuda_graphs: bool = True
    # its parameters are sharded DTensors, which must stay contiguous: no channels_last
    sharded_parameters: bool = False
    # whether, with these options, what a run computes is the same at any world size (the
    # global batch, its order and the BatchNorm statistics all independent of the ranks): a
    # checkpoint then resumes at another world size, resharded (identity.py)
    same_at_any_world_size: Callable[[OptionsT], bool] = lambda options: False
    # what starts its job's processes: torchrun's elastic agent in the launcher, or
    # horovodrun (pipeline/launch/horovod_run.py), whose processes Horovod needs
    launched_by: Launcher = "torchrun"
    # a layout (`layouts`) whose run is a preset's, with the preset's section keys that must
    # equal for the two to compute alike: (its name, {key: value}); None: no preset builds it.
    # A prediction that predicts both measures it once (scaling/stage.py `preset_row`)
    preset_of: Optional[Callable[[OptionsT, ParallelDims], Optional[Preset]]] = None


@dataclass(frozen=True)
class LoopForward:
    """How the training loop runs a DataParallelRun's forward (pipeline/numerics/build.py),
    for what a strategy measures at its `at_start`: the same compilation, autocast, input
    layout and CUDA-graph step marker, so that it times the forward the run will train with."""

    # a strategy's forward as the loop calls it: compiled when train.compile
    prepare: Callable[[Forward], Forward]
    autocast: Autocast
    channels_last: bool  # the loader's batches are channels_last
    new_graph_step: Callable[[], None]  # called before each forward


def _always_reduce(_: bool) -> ContextManager[object]:
    return nullcontext()


@dataclass(frozen=True, kw_only=True)
class _Run:
    module: nn.Module  # holds the parameters this rank's optimizer updates
    writer: bool  # this process logs to MLflow and writes results/ (exactly one does)
    devices: list[str]  # devices this run computes on, e.g. ["cuda:0", "cuda:1"] or ["cpu"]
    batch_split: list[int]  # samples each device gets per forward of one micro-batch
    # the whole model's state_dict on the writer (a collective where the model is split);
    # None: the module's own
    full_state_dict: Optional[Callable[[], StateDict]] = None
    notes: tuple[str, ...] = ()  # facts for the record, e.g. "dp on 1 device: runs unsplit"
    # the strategy's last step of building, where it has one: run once on every rank after
    # the checkpoint's restore and before the first step, where the loop's speed options
    # apply, with what an earlier process of this same run decided there (`Decided`, kept by
    # its checkpoints; None on a fresh run) and the run's way to say a line. -> the run to
    # train (which has none) and what it decided, for the checkpoints to keep
    at_start: Optional[AtStart] = None
    # drops what the strategy keeps of its process groups beyond the model (a DeviceMesh's
    # registry, which torch's global DTensor caches keep alive), so that destroying the groups
    # frees them and joins their threads (pipeline/launch/worker.py `exit_cleanly`)
    release: Callable[[], None] = lambda: None
    # reduce_grads_if(is_last_micro_step): context for a micro-step's forward and backward
    # (a DataParallelRun's, or a PipelinedRun's schedule run); with gradient accumulation,
    # gradients are reduced across the data ranks only in the last one's
    reduce_grads_if: Callable[[bool], ContextManager[object]] = _always_reduce
    # called on every rank before each evaluation: ranks whose BatchNorm buffers drifted
    # apart take the writer's, so the reported test accuracy is that of the saved model
    before_eval: Callable[[], None] = lambda: None
    # the optimizer as the run steps it, made from the loop's (numerics/build.py): Horovod's
    # DistributedOptimizer, whose step waits for its gradients' all-reduce; the loop's own
    # elsewhere
    distributed_optimizer: Callable[[torch.optim.Optimizer], torch.optim.Optimizer] = (
        lambda optimizer: optimizer
    )

    def state_dict(self) -> StateDict:
        if self.full_state_dict is not None:
            return self.full_state_dict()
        return {k: v.detach().cpu() for k, v in self.module.state_dict().items()}


@dataclass(frozen=True, kw_only=True)
class DataParallelRun(_Run):
    """Every rank runs the whole model on its share of each micro-batch; the loop computes
    the loss from the logits and calls backward."""

    forward: Callable[[torch.Tensor], torch.Tensor]  # images -> logits on the writer's device


@dataclass(frozen=True, kw_only=True)
class PipelinedRun(_Run):
    """The model is cut into stages; a schedule runs forward and backward through them
    (where data ranks each run such a pipeline, `reduce_grads_if` averages every stage's
    gradients over its data group after the step's last schedule run)."""

    # (images, labels, training) -> logits on the loss-holding rank, None elsewhere
    step: Callable[[torch.Tensor, torch.Tensor, bool], Optional[torch.Tensor]]
    eval_batch_size: int  # the schedule keeps its training shapes in evaluation too


Run = Union[DataParallelRun, PipelinedRun]
# What a strategy decided once for a run at its `at_start`, as JSON: each setting's name ->
# {"value": what it decided, and whatever else the strategy keeps of it}. The checkpoints keep
# it (checkpoint_policy.py), so a resume or a torchrun restart hands it back instead of deciding
# again, and the run's MLflow params hold each value under its name (`decided_params`).
Decided = dict[str, Any]
AtStart = Callable[[LoopForward, Optional[Decided], Callable[[str], None]], tuple[Run, Decided]]


def decided_params(decided: Optional[Decided]) -> dict[str, Any]:
    """What a run decided at its start as MLflow params: each setting's value under its name."""
    return {name: setting["value"] for name, setting in (decided or {}).items()}


@dataclass(frozen=True)
class StrategySpec(Generic[OptionsT]):
    """A strategy, as the launcher, the worker and the tests use it: `facts` and the two
    builders all about the same options type, so a builder that takes another section
    than the one FACTS names does not type-check."""

    facts: StrategyFacts[OptionsT]
    nproc: Callable[[OptionsT, BatchPlan, int], int]
    parallelize: Callable[[nn.Sequential, OptionsT, BatchPlan, DistContext, Autocast], Run]
    # How its prediction measures it where not as one rank of N under the fake process group
    # (pipeline/scaling/profile.py), declared here rather than guessed: a pipeline's cut of
    # the blocks' costs into stages, or the shares of a micro-batch that one process's
    # DataParallel replicas take on n devices.
    stage_split: Optional[Callable[[Sequence[float], int], list[int]]] = None
    replica_shares: Optional[Callable[[OptionsT, BatchPlan, int], list[int]]] = None


Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (logits, labels) -> mean loss


def writer_buffers(model: nn.Module, writer_rank: int = 0) -> Callable[[], None]:
    """A `before_eval` that gives every rank the writer's buffers (BatchNorm's running
    statistics), for data-parallel ranks without synchronised BatchNorm: each normalised its
    own shard, so their statistics differ, and only the writer's are saved in model.pt."""

    def share() -> None:
        for buffer in model.buffers():
            dist.broadcast(buffer, src=writer_rank)

    return share


def alone(options: object, world_size: int) -> ParallelDims:
    """The mesh of a strategy that runs in one process (`StrategyFacts.mesh`)."""
    return ParallelDims()


def replicas(options: object, world_size: int) -> ParallelDims:
    """Every rank a data replica (ddp)."""
    return ParallelDims(replicate=world_size)


@overload
def local(t: torch.Tensor) -> torch.Tensor: ...
@overload
def local(t: None) -> None: ...
def local(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A parameter's or buffer's own shard (a plain tensor as it is)."""
    return t.to_local() if isinstance(t, DTensor) else t


def gathered_state(module: nn.Module) -> StateDict:
    """The whole model's state_dict, its DTensors gathered (`full_tensor`: every rank must
    take part), on the CPU: a `full_state_dict` where parameters are sharded."""
    return {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
        for k, v in module.state_dict().items()
    }


def gpu_count_or_nproc(n_gpus: int, cpu_nproc: int) -> int:
    """One process per GPU on GPUs; `cpu_nproc` gloo processes on the CPU."""
    return n_gpus if n_gpus > 0 else cpu_nproc
