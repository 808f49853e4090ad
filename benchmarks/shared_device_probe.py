"""Which collectives and wrappers run with N ranks on ONE device over gloo (issue 48 goal 1).

    python -m benchmarks.shared_device_probe --device cuda --ranks 2 4
    python -m benchmarks.shared_device_probe --device cpu --ranks 2     # the same, on the CPU

NCCL refuses two ranks on one GPU, so a run with `devices: "0,0"` talks over gloo with CUDA
tensors. This probe asks torch, in a few seconds and before any stage trains, which of the
operations the strategies use go through that way: all_reduce (DDP's buckets), all_gather and
reduce_scatter (FSDP2's units, in fp32 and bf16), send/recv (pipeline stages), DDP with
SyncBatchNorm, and FSDP2's fully_shard. Each line says ok (with what came back) or the error.
Prints one line per operation and rank count; exit 0 when every one ran.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def attempt(rank: int, name: str, fn: Callable[[], Any], failed: Any) -> None:
    """Run `fn` on every rank; rank 0 says how it went."""
    start = time.perf_counter()
    try:
        said = f"ok {fn() or ''}".strip()
    except Exception as err:  # noqa: BLE001 - torch's refusal is the finding
        said = f"FAIL {type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"
        failed.value = 1
    if rank == 0:
        print(f"  {name}: {said} ({time.perf_counter() - start:.2f} s)", flush=True)


def operations(rank: int, world: int, device: torch.device) -> dict[str, Callable[[], Any]]:
    x = torch.full((8,), float(rank + 1), device=device)

    def all_reduce() -> str:
        y = x.clone()
        dist.all_reduce(y)
        return f"{y[0].item():g} (expected {world * (world + 1) / 2:g})"

    def all_gather() -> str:
        out = torch.empty(8 * world, device=device)
        dist.all_gather_into_tensor(out, x)
        return str(out[::8].tolist())

    def reduce_scatter(dtype: torch.dtype) -> Callable[[], str]:
        def run() -> str:
            out = torch.empty(8, dtype=dtype, device=device)
            dist.reduce_scatter_tensor(out, torch.ones(8 * world, dtype=dtype, device=device))
            return f"{out[0].item():g} (expected {world})"

        return run

    def send_recv() -> str:
        if rank == 0:
            dist.send(x, 1)
        elif rank == 1:
            y = torch.empty_like(x)
            dist.recv(y, 0)
            return f"{y[0].item():g}"
        return ""

    def ddp_sync_bn() -> str:
        from torch.nn.parallel import DistributedDataParallel as DDP

        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Conv2d(1, 8, 3),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(8 * 26 * 26, 10),
        ).to(device)
        if device.type == "cuda":  # SyncBatchNorm is CUDA's only
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        torch.manual_seed(rank)
        ddp(torch.randn(4, 1, 28, 28, device=device)).sum().backward()
        conv = model[0]
        assert isinstance(conv, nn.Conv2d) and conv.weight.grad is not None
        grad = conv.weight.grad.flatten()[:1].clone()
        grads = [torch.empty_like(grad) for _ in range(world)]
        dist.all_gather(grads, grad)
        return f"gradients equal on every rank: {all(torch.equal(grads[0], g) for g in grads)}"

    def fsdp2() -> str:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (world,))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(device)
        fully_shard(model[0], mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        model(torch.randn(4, 32, device=device)).sum().backward()
        return "bf16 parameters, fp32 reduce-scatter"

    return {
        "all_reduce": all_reduce,
        "all_gather_into_tensor": all_gather,
        "reduce_scatter_tensor fp32": reduce_scatter(torch.float32),
        "reduce_scatter_tensor bf16": reduce_scatter(torch.bfloat16),
        "send/recv": send_recv,
        "DDP + SyncBatchNorm": ddp_sync_bn,
        "FSDP2 fully_shard": fsdp2,
    }


def worker(rank: int, world: int, init: str, device_type: str, failed: Any) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        for name, fn in operations(rank, world, device).items():
            attempt(rank, name, fn, failed)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--ranks", type=int, nargs="*", default=[2, 4])
    args = parser.parse_args(argv)
    print(f"shared_device_probe: torch {torch.__version__}, gloo, {args.device}", flush=True)
    context = mp.get_context("spawn")
    failed = context.Value("i", 0)
    for world in args.ranks:
        print(f"{world} ranks on one {args.device} device:", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            mp.start_processes(
                worker,
                args=(world, f"file://{tmp}/store", args.device, failed),
                nprocs=world,
                start_method="spawn",
            )
    return int(failed.value)


if __name__ == "__main__":
    sys.exit(main())
