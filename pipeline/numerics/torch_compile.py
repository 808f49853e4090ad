"""torch.compile as the shared loop uses it: the strategy's forward compiled with fixed
shapes, the mode a strategy can take, CUDA graphs' step marker, and what a run took from
inductor's on-disk cache. Compile is an opt-in speed option (`train.compile`,
`train.compile_mode`); docs/performance.md has what it gains on each device."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Optional

import torch

from pipeline.config import TrainConfig
from pipeline.strategies.base import Forward

RECOMPILE_LIMIT = 64  # graphs per function: 8 residual blocks x train/eval, with room


def compile_forward(
    forward: Optional[Forward], enabled: bool, mode: str = "default", cuda_graphs: bool = True
) -> tuple[Optional[Forward], list[str]]:
    """torch.compile the strategy's forward (the DDP/FSDP-wrapped module where there is one,
    which is how both are meant to be compiled). The strategy keeps its uncompiled module for
    parameters and state_dict, so checkpoints and results keep their keys. Shapes are fixed
    (remainders are dropped, evaluation batches padded), hence dynamic=False.

    Where a wrapper's hooks break the graph between blocks (FSDP), each residual block is
    compiled on its own, once per block shape and per train/eval mode: more graphs for one
    function than dynamo's default limit of 8, past which it would silently run the rest
    eagerly. The limit is raised to cover the model's blocks."""
    if not enabled:
        return forward, []
    if forward is None:
        return None, ["compile: not applied; this strategy runs its own pipeline schedule"]
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(
        torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT
    )
    notes = ["compile: the first epoch includes compilation; compare steady epochs"]
    runs = mode_that_runs(mode, cuda_graphs)
    if runs != mode:
        notes.append(
            f"compile mode {mode}: not applied (no CUDA graphs for this strategy); "
            f"{runs} mode instead"
        )
    if runs != "default":
        notes.append(f"compile mode: {runs}")
    return torch.compile(forward, dynamic=False, mode=runs), notes


def mode_that_runs(mode: str, cuda_graphs: bool) -> str:
    """The compile mode a strategy runs when `mode` is asked for: reduce-overhead's CUDA
    graphs only where it takes them (StrategyFacts.cuda_graphs), the default mode elsewhere."""
    return "default" if mode == "reduce-overhead" and not cuda_graphs else mode


def compile_cache_line() -> str:
    """What this process's compilation took from inductor's on-disk cache (its FX graph
    cache: each compiled forward and backward graph) and what it compiled afresh, for the
    stage's log: a repeat run of the same code and settings loads every graph (issue 29;
    the launcher keeps the cache in the project)."""
    from torch._dynamo.utils import counters

    found = counters["inductor"]
    loaded, compiled = found["fxgraph_cache_hit"], found["fxgraph_cache_miss"]
    where = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "inductor's default directory")
    bypassed = found["fxgraph_cache_bypass"]
    return (
        f"compile cache: {loaded} of {loaded + compiled + bypassed} graphs loaded from {where}, "
        f"{compiled} compiled" + (f", {bypassed} not cacheable" if bypassed else "")
    )


def graph_step_marker(train: TrainConfig, cuda_graphs: bool) -> Callable[[], None]:
    """What to call before each forward. CUDA graphs (compile_mode reduce-overhead, where the
    strategy takes them: Parallel.cuda_graphs, as in compile_forward) reuse their output
    buffers, and must be told where a new step begins; otherwise nothing, as the call
    imports torch._inductor (seconds) on first use."""
    if train.compile and train.compile_mode == "reduce-overhead" and cuda_graphs:
        return torch.compiler.cudagraph_mark_step_begin
    return lambda: None
