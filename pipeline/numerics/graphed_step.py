"""The whole training step as one CUDA graph (`train.cuda_graph: step`, issue 30).

At batch 256 this model is bound by the host launching ~400 kernels a step
(docs/performance.md, "Where the time goes"); replaying one graph launches them all at once.
The pattern is the one of PyTorch's CUDA graphs notes ("whole network capture") and of
NVIDIA's MLPerf ResNet:

    warm-up   the first WARMUP_STEPS steps run eagerly, on a side stream: they are real
              training steps, and they leave behind what a capture must not allocate
              (SGD's momentum buffers, cuDNN's autotuned algorithms, DDP's rebuilt buckets)
    capture   the next step's inputs are copied into static buffers, the gradients set to
              None (backward then allocates them in the graph's private pool), and the step
              (forward, loss, backward, optimizer step, the epoch's running totals) is
              recorded, not run
    replay    each step from then on copies its batch into the static buffers and replays;
              the capturing step replays at once, so no step is skipped

The learning rate changes every step (`train.lr_schedule`) while a graph keeps the values it
was captured with, so during capture and replay the optimizer's lr is a one-element tensor
on the device, which the fused SGD kernel reads; the host fills it before each replay.
Between steps (checkpoints, MLflow params) the lr is the plain float again.

Everything that touches CUDA sits behind two seams, `new_graph` (a factory of `Graph`) and
the side stream, so that on a CPU a test drives the same control flow with a graph that
records what it was asked and calls the captured function at each replay
(tests/unit/test_graphed_step.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Optional, Protocol

import torch

from pipeline.config import TrainConfig
from pipeline.numerics.totals import Totals

# DDP's reducer must have run 11 eager iterations before a capture (PyTorch's CUDA graphs
# notes, "Usage with DistributedDataParallel"); the other strategies need fewer, and the
# first epoch is a warm-up anyway, so one number serves every strategy.
WARMUP_STEPS = 11

# compile's modes that make CUDA graphs of their own, and what each becomes inside the step's
COMPILE_WITHOUT_GRAPHS = {
    "reduce-overhead": "default",
    "max-autotune": "max-autotune-no-cudagraphs",
}

# (images, labels, totals): one optimizer step on a batch, adding its sums into `totals`:
# the eager `Trainer.step` itself on one micro-batch (training/trainer.py `graph_step`)
Step = Callable[[torch.Tensor, torch.Tensor, Totals], None]


def step_graph(
    train: TrainConfig,
    cuda_graphs: bool,
    device: torch.device,
    world_size: int,
    devices: Sequence[str],
    precision: str,
) -> tuple[bool, str, list[str]]:
    """Whether this run captures its whole step (`train.cuda_graph: step`), the compile mode
    it then runs, and the notes that say so or why not. `cuda_graphs`: the strategy takes
    them (StrategyFacts); `devices`: those the run computes on; `precision`: what runs."""
    mode = train.compile_mode
    if train.cuda_graph != "step":
        return False, mode, []
    why = None
    if device.type != "cuda":
        why = "CUDA graphs need a GPU"
    elif not cuda_graphs:
        why = "this strategy takes no CUDA graphs (its hooks or schedule run between kernels)"
    elif world_size > 1 or len(devices) > 1:
        # several ranks' or replicas' collectives in a capture are untried here
        why = (
            f"captured in a one-process job on one device only; this one: {world_size} "
            f"process(es) on {len(devices)} device(s)"
        )
    elif train.grad_accum > 1:
        why = "grad_accum > 1 runs several forwards per optimizer step"
    elif precision in ("fp16", "fp64"):
        # fp16's loss scaler decides on the host whether to step; fp64 is for parity runs,
        # and the graph reads its lr as an fp32 tensor
        why = f"precision {precision} stays eager"
    if why is not None:
        return False, mode, [f"cuda_graph step: not applied ({why}); eager steps"]
    notes = [
        f"cuda_graph step: the whole training step is one CUDA graph, captured after "
        f"{WARMUP_STEPS} eager steps"
    ]
    if train.compile and mode in COMPILE_WITHOUT_GRAPHS:
        notes.append(
            f"compile mode {mode}: {COMPILE_WITHOUT_GRAPHS[mode]} instead, inside the step's graph"
        )
        mode = COMPILE_WITHOUT_GRAPHS[mode]
    return True, mode, notes


class Graph(Protocol):
    def capture(self, fn: Callable[[], None]) -> None:
        """Record what `fn` launches, without running it."""

    def replay(self) -> None:
        """Run what was recorded, on the buffers it was recorded with."""


class CudaGraph:
    """torch.cuda.CUDAGraph, as a `Graph`."""

    def __init__(self) -> None:
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, fn: Callable[[], None]) -> None:
        with torch.cuda.graph(self.graph):
            fn()

    def replay(self) -> None:
        self.graph.replay()


@contextmanager
def side_stream(device: torch.device) -> Iterator[None]:
    """Warm-up work on a stream of its own that waits for what came before and is waited
    for after, as the CUDA graphs notes ask (a capture's first kernels must not race with
    work queued on the default stream). Nothing on the CPU."""
    if device.type != "cuda":
        yield
        return
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream(device).wait_stream(stream)


class GraphedStep:
    """Runs each training step: eagerly for the warm-up, then as one captured graph."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        new_graph: Callable[[], Graph] = CudaGraph,
        warmup_steps: int = WARMUP_STEPS,
    ) -> None:
        self.optimizer, self.device = optimizer, device
        self.new_graph, self.warmup_steps = new_graph, warmup_steps
        self.eager_steps = 0
        self.graph: Optional[Graph] = None
        # the step's inputs and outputs as the graph knows them: its static buffers
        self.static: Optional[tuple[torch.Tensor, torch.Tensor, Totals]] = None
        self.lr = torch.zeros((), dtype=torch.float32, device=device)

    def __call__(
        self, step: Step, images: torch.Tensor, labels: torch.Tensor, totals: Totals
    ) -> None:
        """One optimizer step of `step` on this batch. After the capture `step` is not called
        again: the graph replays what it launched, into the same `totals`."""
        if self.eager_steps < self.warmup_steps:
            with side_stream(self.device):
                self.optimizer.zero_grad(set_to_none=True)
                step(images, labels, totals)
            self.eager_steps += 1
            return
        if self.static is None:
            self._capture(step, images, labels, totals)
        else:
            static_images, static_labels, captured_totals = self.static
            # the graph adds into the tensor it was captured with
            if totals.tensor is not captured_totals.tensor:
                raise RuntimeError("graphed step: totals is not the tensor it was captured with")
            static_images.copy_(images)
            static_labels.copy_(labels)
        assert self.graph is not None
        # this step's lr (optim.set_lr gives every group the same): a fill kernel, no sync
        self.lr.fill_(self.optimizer.param_groups[0]["lr"])
        with self._lr_on_device():
            self.graph.replay()

    def _capture(
        self, step: Step, images: torch.Tensor, labels: torch.Tensor, totals: Totals
    ) -> None:
        # clone keeps the memory format: channels_last batches stay channels_last
        self.static = (images.clone(), labels.clone(), totals)
        static_images, static_labels, _ = self.static

        def captured() -> None:
            # grads None as the step starts: backward allocates them (under a capture, in the
            # graph's pool) instead of adding into the last step's, and each replay writes the
            # same buffers afresh. Setting them to None launches nothing: a CUDA graph keeps
            # no trace of it, a stand-in that calls this function again starts from None too.
            self.optimizer.zero_grad(set_to_none=True)
            step(static_images, static_labels, totals)

        graph = self.new_graph()
        with self._lr_on_device():
            graph.capture(captured)
        self.graph = graph

    @contextmanager
    def _lr_on_device(self) -> Iterator[None]:
        """The optimizer reads its lr from `self.lr` in here; outside, the float it had."""
        groups = self.optimizer.param_groups
        floats = [group["lr"] for group in groups]
        for group in groups:
            group["lr"] = self.lr
        try:
            yield
        finally:
            for group, lr in zip(groups, floats):
                group["lr"] = lr
