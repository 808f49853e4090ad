"""How many OpenMP threads a one-process strategy's training steps should run with on a CPU,
idle and beside a busy process: the launcher's choice (pipeline/launch/launcher.py
`omp_threads`), measured.

    python -m benchmarks.omp_threads                  # 5 rounds, width 8, batch 256
    python -m benchmarks.omp_threads --rounds 3 --busy 1

Each trial is a fresh process (OMP_NUM_THREADS is read once, when torch loads) that trains
the project's ResNet-18 (pipeline/resnet.py, at --width) on random Fashion-MNIST-shaped
images: --warmup steps, then --steps timed ones; it reports their median seconds and the
share of its runnable time its threads spent waiting for a core (pipeline/core_wait.py).
The conditions take turns within each round, each starting first in turn, so the load other
users put on a shared machine falls on all of them alike:

- idle: nothing the benchmark starts runs beside the trial (the machine's own load, its
  1-minute average, is recorded before and after every trial);
- busy: --busy `yes > /dev/null` processes (each count a load of its own: 1 and 2 by default)
  run beside it for the trial's whole life.

Each condition runs every thread count in --threads (default 1 and every core). The JSON
(benchmarks/results/<machine>-omp-threads-<date>.json unless --out) holds every trial, each
cell's median step seconds and core wait, and each load's ratio of the thread counts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def child(width: int, batch: int, warmup: int, steps: int) -> dict[str, Any]:
    """One trial, in this process (its OMP_NUM_THREADS already set): the timed steps' median
    seconds and core wait."""
    import torch

    from pipeline import core_wait
    from pipeline.resnet import build_model

    model = build_model(width, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 1, 28, 28, generator=generator)
    y = torch.randint(0, 10, (batch,), generator=generator)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    before = core_wait.read()
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    return {
        "threads": torch.get_num_threads(),
        "step_s": statistics.median(seconds),
        "core_wait": core_wait.wait_share(before, core_wait.read()),
    }


def trial(threads: int, busy: int, args: argparse.Namespace) -> dict[str, Any]:
    """One fresh process at `threads` threads, `busy` spinning processes beside it."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)}
    spinners = [
        subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(busy)
    ]
    load_before = os.getloadavg()[0]
    try:
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.omp_threads", "--child"]
            + [f"--{k}={getattr(args, k)}" for k in ("width", "batch", "warmup", "steps")],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    return {
        **json.loads(out.splitlines()[-1]),
        "busy_processes": busy,
        "load_1min_before": load_before,
        "load_1min_after": os.getloadavg()[0],
    }


def summary(trials: list[dict[str, Any]], loads: dict[str, int]) -> dict[str, Any]:
    """Per load and thread count: the median step seconds and core wait over the rounds;
    per load, each thread count's step seconds over the fewest threads'."""
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    for label, busy in loads.items():
        mine = [t for t in trials if t["busy_processes"] == busy]
        for n in sorted({t["threads"] for t in mine}):
            these = [t for t in mine if t["threads"] == n]
            waits = [t["core_wait"] for t in these if t["core_wait"] is not None]
            cells.setdefault(label, {})[str(n)] = {
                "step_s": statistics.median(t["step_s"] for t in these),
                "core_wait": statistics.median(waits) if waits else None,
                "load_1min": statistics.median(t["load_1min_before"] for t in these),
                "trials": len(these),
            }
    ratios = {
        label: {n: c["step_s"] / by[min(by, key=int)]["step_s"] for n, c in by.items()}
        for label, by in cells.items()
    }
    return {"cells": cells, "step_s_over_fewest_threads": ratios}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--busy", default="1,2", help="`yes` processes in each busy load")
    parser.add_argument("--threads", default=f"1,{os.cpu_count() or 1}")
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = child(args.width, args.batch, args.warmup, args.steps)
        print(json.dumps(result))
        return result
    threads = sorted({int(n) for n in args.threads.split(",")})
    loads = {"idle": 0} | {
        f"busy ({n} x `yes > /dev/null`)": n for n in sorted({int(b) for b in args.busy.split(",")})
    }
    conditions = [(n, busy) for busy in loads.values() for n in threads]
    trials = []
    for round_ in range(args.rounds):
        turn = conditions[round_ % len(conditions) :] + conditions[: round_ % len(conditions)]
        for n, busy in turn:
            trials.append({"round": round_, **trial(n, busy, args)})
            print(json.dumps(trials[-1]), flush=True)
    import torch

    from benchmarks.bench import machine, write_result

    label, info = machine(torch.device("cpu"))
    result = {
        "machine": label,
        "date": date.today().isoformat(),
        "info": info,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "child")},
        "loads": loads,
        "trials": trials,
        **summary(trials, loads),
    }
    path = write_result(result, "omp-threads", args.out)
    print(f"wrote {path}")
    print(json.dumps(result["cells"], indent=1))
    return result


if __name__ == "__main__":
    main()
