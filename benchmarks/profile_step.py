"""Where one training step's time goes: torch.profiler over the project's own step.

    python -m benchmarks.profile_step --set train.precision=bf16 train.compile=true
    python -m benchmarks.profile_step --strategy ddp --steps 30 --trace $OUT/ddp.json

Builds the strategy exactly as the train stage does (pipeline.numerics.build.build_training, world
size 1 for ddp/fsdp), trains --warmup steps untimed (compilation, cuDNN autotuning), then
times --steps steps with the device synchronised only at the end, and profiles them. It
prints the wall time per step, the device's busy time per step (sum of kernel times: when it
is well under the wall time the step is bound by the host, launching kernels, not by the
device), and the operators that took the most device time. --trace writes a Chrome trace.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.bench import REPO, flops_per_image, one_rank_group
from pipeline.config import load_config
from pipeline.context import DistContext
from pipeline.data.device_data import to_device
from pipeline.data.fashion_mnist import DATA_DIR, load_tensors
from pipeline.interrupts.stop import StopRequest
from pipeline.numerics.build import build_training
from pipeline.numerics.totals import Totals
from pipeline.run_spec import resolve_run
from pipeline.strategies import NAMES
from pipeline.training.meter import wait_for_device
from pipeline.training.trainer import Trainer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strategy", default="single", choices=NAMES)
    parser.add_argument("--set", nargs="*", default=[], help="key=value params overrides")
    parser.add_argument("--warmup", type=int, default=15, help="untimed steps")
    parser.add_argument("--steps", type=int, default=20, help="profiled steps")
    parser.add_argument("--rows", type=int, default=12, help="operators listed")
    parser.add_argument("--trace", type=Path, help="write a Chrome trace here")
    parser.add_argument("--data", type=Path, default=DATA_DIR, help="the fetch stage's output")
    args = parser.parse_args(argv)

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    ctx = DistContext(rank=0, local_rank=0, world_size=1, gpus=("0",) if cuda else ())
    cfg = load_config(REPO / "params.yaml", args.set)
    batch = cfg.train.batch_size
    limit = batch * (args.warmup + args.steps)
    data = to_device(load_tensors(args.data), device, limit, None)
    with tempfile.TemporaryDirectory() as work, one_rank_group(device, Path(work)):
        torch.manual_seed(cfg.seed)
        spec = resolve_run(cfg, args.strategy)
        plan = spec.job_plan(1, len(data.train_labels))
        training, _ = build_training(spec, ctx, data, plan).started(None)
        loader = training.loader
        totals = Totals.zeros(device)
        trainer = Trainer(training, ctx, StopRequest())

        def steps(n: int, start: int) -> None:
            # train_epoch over a slice of the epoch: the loader's steps start..start+n
            loader.steps, real = start + n, loader.steps
            trainer.train_epoch(0, start, totals)
            loader.steps = real

        steps(args.warmup, 0)
        wait_for_device(device)
        activities = [torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if cuda else []
        )
        with torch.profiler.profile(activities=activities) as prof:
            start = time.perf_counter()
            steps(args.steps, args.warmup)
            wait_for_device(device)
            wall = (time.perf_counter() - start) / args.steps
        # a second, unprofiled pass: the profiler's own overhead inflates the first
        loader.steps = args.warmup + args.steps
        start = time.perf_counter()
        trainer.train_epoch(1, args.warmup, totals)
        wait_for_device(device)
        plain = (time.perf_counter() - start) / args.steps

    events = prof.key_averages()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e6 / args.steps if cuda else None
    flops = flops_per_image(cfg.model.width) * batch
    print(
        f"{args.strategy} {' '.join(args.set)} | batch {batch} | notes: {'; '.join(training.notes)}"
    )
    print(
        f"step: {1e3 * plain:.2f} ms unprofiled, {1e3 * wall:.2f} ms profiled; "
        f"{flops / plain / 1e12:.1f} TFLOP/s; kernels per step: "
        f"{len(kernels) / args.steps:.0f}"
        if cuda
        else f"step: {1e3 * plain:.2f} ms"
    )
    if busy is not None:  # against the unprofiled step: the profiler slows the host only
        print(
            f"device busy {1e3 * busy:.2f} ms/step = {100 * busy / plain:.0f}% of the "
            f"step ({'device' if busy > 0.8 * plain else 'host'}-bound)"
        )
    sort = "device_time_total" if cuda else "cpu_time_total"
    print(events.table(sort_by=sort, row_limit=args.rows, max_name_column_width=60))
    if args.trace:
        prof.export_chrome_trace(str(args.trace))


if __name__ == "__main__":
    main()
