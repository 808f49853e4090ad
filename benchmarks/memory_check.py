"""Per-device memory at N, predicted from one process, checked against real N-process runs
(issue 48, goal 2, its CPU half): ddp, fsdp and pipeline_parallel predicted at N by the predict
stage's own code (each role's rank stepped at world size N under the fake process group:
profile.measure_rank, and every stage of a pipeline: profile.stage_memories),
then run for real as N gloo processes on this CPU, every rank's step at its peak read the same
way (MemTracker: profile.rank_memory), rank by rank.

    python -m benchmarks.memory_check                   # N = 2 and 4
    python -m benchmarks.memory_check --gpus 2 --set model.width=8
    python -m benchmarks.memory_check --device cuda     # the real ranks share the one GPU
    python -m benchmarks.memory_check --strategies channel_parallel hybrid
    python -m benchmarks.memory_check --strategies hybrid --gpus 4 \
        --set hybrid.data=2 hybrid.pipeline=2 hybrid.channel=1   # data x pipeline

What is compared is the step's tensor memory, the part the prediction runs code for; the data
each device holds beside it is arithmetic (prediction.DataSize), the same in both. On a CPU
that is MemTracker's total (a run reports its process's RSS, which also holds torch itself, so
no stage's figure is compared here). With `--device cuda` the prediction runs on the GPU and
the real ranks are N processes on that one GPU over gloo, as a run with devices "0,0" puts
them (issue 48 goal 1): what is compared is each rank's allocator peak over its step, which a
process reads of its own allocations only. Goal: within 5% per rank.
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.bench import machine, write_result
from benchmarks.e2e import result_head
from pipeline.config import load_config
from pipeline.context import DistContext
from pipeline.run_spec import resolve_run
from pipeline.scaling.profile import (
    RankMemory,
    measure_data_pipeline,
    measure_rank,
    rank_memory,
    stage_memories,
)

STRATEGIES = ("ddp", "fsdp", "pipeline_parallel")
GOAL = 0.05
SETTINGS = ["model.width=16", "train.batch_size=128"]
FEW = 1e-6  # seconds of timing: the memory is what is read here


def _real_rank(rank: int, world: int, port: int, job: tuple[str, list[str], str], out: Any) -> None:
    name, overrides, device_type = job
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        spec = resolve_run(load_config(None, overrides), name)
        gpus: tuple[str, ...] = ()
        placement: tuple[int, ...] = ()
        if device_type == "cuda":  # every rank on GPU 0, as devices "0,0,..." places them
            torch.cuda.set_device(0)
            gpus, placement = ("0",), (0,) * world
        ctx = DistContext(rank, rank, world, gpus, placement=placement)
        out.put(rank_memory(spec, ctx, ctx.device))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def real_ranks(
    name: str, world: int, overrides: list[str], device: torch.device
) -> dict[int, RankMemory]:
    """Every rank of a real `world`-process gloo job of `name` on `device`'s type (all on
    the one GPU where it is CUDA): its step at the peak."""
    spawn = mp.get_context("spawn")
    out = spawn.SimpleQueue()
    port = free_port()
    job = (name, overrides, device.type)
    procs = [
        spawn.Process(target=_real_rank, args=(r, world, port, job, out)) for r in range(world)
    ]
    for p in procs:
        p.start()
    got = [out.get() for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"memory_check: {name} rank exited {p.exitcode}")
    return {m.rank: m for m in got}


def check(name: str, world: int, overrides: list[str], device: torch.device) -> dict[str, Any]:
    """`name` at `world`: every real rank against the prediction of its role (the rank the
    prediction measured of that number, else rank 0, which speaks for the ranks between):
    MemTracker's total on a CPU, the allocator's peak on a GPU (RankMemory.step_bytes)."""
    if name == "pipeline_parallel":  # a process per stage: as many stages as processes
        overrides = [*overrides, f"pipeline_parallel.stages={world}"]
    spec = resolve_run(load_config(None, overrides), name)
    stages = 1  # the ranks of one data rank's pipeline, each a role of its own
    if name == "pipeline_parallel":
        found = stage_memories(spec, device)
    elif (dims := spec.dims(world)).pipeline > 1:
        stages = dims.pipeline  # a hybrid's data x pipeline: data rank 0's stages
        found = measure_data_pipeline(spec, dims, device, FEW).memory
    else:
        found = measure_rank(spec, world, device, FEW).memory
    predicted = {m.rank: m for m in found}
    real = real_ranks(name, world, overrides, device)
    ranks = {}
    for rank, measured in sorted(real.items()):
        # a data rank's stages are neighbouring ranks (the mesh's inner dimension): rank r
        # is stage r % stages of its pipeline
        role = predicted[rank % stages] if stages > 1 else predicted.get(rank, predicted[0])
        mine, theirs = role.step_bytes, measured.step_bytes
        ranks[str(rank)] = {
            "predicted_as_rank": role.rank,
            "predicted_step_bytes": mine,
            "measured_step_bytes": theirs,
            "error": mine / theirs - 1,
            "predicted_parts": role.tensors,
            "measured_parts": measured.tensors,
        }
    return {"world_size": world, "ranks": ranks}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--set", nargs="*", default=[], help="more key=value settings")
    parser.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/...)")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    args = parser.parse_args(argv)
    overrides = [*SETTINGS, *args.set]
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    label, info = machine(device)
    load_before = os.getloadavg()
    rows = {}
    for name in args.strategies:
        for world in args.gpus:
            row = check(name, world, overrides, device)
            rows[f"{name}@{world}"] = row
            for rank, r in row["ranks"].items():
                print(
                    f"memory_check: {name} at {world}, rank {rank}: predicted "
                    f"{r['predicted_step_bytes'] / 2**20:.2f} MiB, measured "
                    f"{r['measured_step_bytes'] / 2**20:.2f} MiB ({r['error']:+.1%})",
                    flush=True,
                )
    worst = max(abs(r["error"]) for row in rows.values() for r in row["ranks"].values())
    result = {
        **result_head(
            label,
            info,
            load_before,
            {
                "gpus": args.gpus,
                "overrides": overrides,
                "device": args.device,
                "strategies": args.strategies,
            },
        ),
        "compared": "allocator peak per rank" if device.type == "cuda" else "MemTracker total",
        "goal": f"|predicted / measured - 1| <= {GOAL:.0%} per rank",
        "checks": rows,
        "worst_error": worst,
        "within_goal": worst <= GOAL,
    }
    path = write_result(result, "memory-check", args.out)
    print(f"memory_check: wrote {path}")
    return result


if __name__ == "__main__":
    main()
