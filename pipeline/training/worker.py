"""One torchrun worker: its process group, then the training session.

The distributed state comes from torchrun's environment once, here (`DistContext.from_env`:
RANK, LOCAL_RANK, WORLD_SIZE, the visible GPUs) and is passed down explicitly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import cast

import torch.distributed as dist

from pipeline.config import load_config
from pipeline.context import DistContext
from pipeline.errors import BAD_INPUT, ERROR_FILE_ENV, SIGTERM_EXIT, USER_ERROR_EXIT
from pipeline.training.live import terminal_columns
from pipeline.training.session import run


def main(strategy: str, overrides: list[str]) -> None:
    try:
        train(strategy, overrides)
    except BAD_INPUT as err:
        # torchrun turns any worker exit into its own code 1; leave the line for the launcher
        if os.environ.get(ERROR_FILE_ENV):
            Path(os.environ[ERROR_FILE_ENV]).write_text(str(err))
        else:
            print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(USER_ERROR_EXIT)


def train(strategy: str, overrides: list[str]) -> None:
    cfg = load_config("params.yaml", overrides)
    ctx = DistContext.from_env()
    terminal = terminal_columns(os.environ, sys.stderr)  # the launcher's, not this pipe
    dist.init_process_group(
        ctx.backend,
        store=attempt_store(os.environ),
        rank=ctx.rank,
        world_size=ctx.world_size,
        device_id=ctx.device if ctx.on_cuda else None,
    )
    # the SIGTERM vote travels on a CPU group so it never waits on the GPU
    control = None
    if ctx.on_cuda and ctx.world_size > 1:
        control = cast(dist.ProcessGroup, dist.new_group(backend="gloo"))
    try:
        summary = run(cfg, strategy, ctx, control, terminal)
    finally:
        dist.destroy_process_group()
    if summary is None:
        sys.exit(SIGTERM_EXIT)


def attempt_store(env: Mapping[str, str]) -> dist.Store:
    """The rendezvous store, with keys scoped to this torchrun attempt. torchrun keeps its
    store across worker restarts but torch 2.14's env:// init assumes a fresh one, so a
    restarted process group would read the dead attempt's addresses and hang connecting."""
    store = dist.TCPStore(
        env["MASTER_ADDR"],
        int(env["MASTER_PORT"]),
        int(env["WORLD_SIZE"]),
        is_master=False,
        timeout=timedelta(minutes=10),
    )
    return dist.PrefixStore(
        f"parallel-lab/attempt-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", store
    )
