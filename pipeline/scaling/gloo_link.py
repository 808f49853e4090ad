"""This machine's own link between processes: gloo on the CPU, measured by two processes as
the ranks of a CPU job are (each with its share of the cores), in nccl-tests' terms.

A small all-reduce's time is its 2(n-1) ring steps' latency; a large one's, that and its
bytes over the bus bandwidth (step_time.collective_seconds), so two sizes give both."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipeline.scaling.links import Link

SMALL = 16  # floats: a SyncBatchNorm's statistics are this order
# a message this large is mostly bytes over the bus, even where each ring step costs a
# millisecond (gloo over loopback on a busy 2-core VM)
BANDWIDTH_BYTES = 16 << 20
REPEATS = 10  # all-reduces per timed round
ROUNDS = 5
WORLD = 2  # processes measured, as a CPU job's two ranks


def _rank(rank: int, world: int, store: str, size: int, out: str) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        results = []
        for numel in (SMALL, max(size, BANDWIDTH_BYTES) // 4):
            tensor = torch.ones(numel)
            for _ in range(3):
                dist.all_reduce(tensor)
            # back to back, as a step's collectives run: one barrier's skew between the
            # ranks would be most of a small one's time
            rounds = []
            for _ in range(ROUNDS):
                dist.barrier()
                start = time.perf_counter()
                for _ in range(REPEATS):
                    dist.all_reduce(tensor)
                rounds.append((time.perf_counter() - start) / REPEATS)
            results.append(statistics.median(rounds))
        if rank == 0:
            Path(out).write_text(" ".join(map(str, results)))
    finally:
        dist.destroy_process_group()


def measure_gloo_link(size: int, world: int = WORLD) -> Link:
    """gloo between `world` processes on this machine, from all-reduces of SMALL floats and
    of `size` bytes (a model's gradients), at least BANDWIDTH_BYTES."""
    with tempfile.TemporaryDirectory() as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "out")
        # forked, as the launcher forks its workers: they have torch already (seconds each);
        # spawned only where this process's CUDA is up, which a fork cannot inherit
        start = "spawn" if torch.cuda.is_initialized() else "fork"
        mp.start_processes(_rank, (world, store, size, out), nprocs=world, start_method=start)
        small_s, large_s = map(float, Path(out).read_text().split())
    steps = 2 * (world - 1)
    latency = small_s / steps
    size = max(size, BANDWIDTH_BYTES)
    moved = 2 * (world - 1) / world * size
    busbw = moved / max(large_s - steps * latency, 1e-9)
    return Link(
        f"gloo, {world} processes on this machine",
        busbw,
        latency,
        f"measured: all-reduce of {SMALL * 4} B and {size} B, "
        f"median of {ROUNDS} rounds of {REPEATS}",
    )
