"""A train stage against a peer framework: `python -m pipeline.train single` against a
Lightning Trainer doing the same job on the same machine (issue 29: ours at most half the
peer's wall time).

    python -m benchmarks.peer                  # 3 runs of each, at the two small sizes
    python -m benchmarks.peer --runs 5 --sizes quickstart
    python -m benchmarks.peer --runs 1 --warmup 0 --sizes "default job"   # on a GPU (issue 49)

Lightning is an optional extra (`make peer-install`), never needed by the pipeline; without
it this exits 2 saying so. In a throw-away project copy with synthetic Fashion-MNIST-shaped
data (fetched once), each size runs our stage and benchmarks/lightning_peer.py (the same
model, data, batch, lr, SGD, epochs and precision, with an MLflow logger to a SQLite store, a
checkpoint and a validation every epoch) as whole processes, with a third job beside them:
benchmarks/bare_loop.py, the same training as a bare PyTorch loop, the floor under both (its
wall over the peer's is the lowest ratio any implementation of the job could have). They take
turns, each going first in turn; one untimed run of each first creates the MLflow store's
tables and warms the file cache. Each run's process wall time (the benchmark's own clock
around the command), ours' training (metrics.json `total_seconds`: its epochs, evaluation
included) and the others' before and during training (their marks of training's start and
end). The JSON (benchmarks/results/<machine>-peer-<date>.json unless --out) holds every run,
the medians, the ratios of the medians' walls ours/peer and bare/peer, the settings and the
1-minute load average before and after, the whole and each size.

"default job" is params.yaml's experiment (its width, epochs and batch over all 60000
images): what the README's performance table shows on a GPU. Each job's MFU is its training
FLOPs (forward and backward of every image it trained, benchmarks/bench.py's count) over its
training seconds, its evaluation included, against the device's peak in the precision all
three run (bf16 on a GPU, fp32 on a CPU: the datasheet's for a known GPU, else a measured
matmul peak).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def default_job(params: Path = REPO / "params.yaml") -> tuple[int, int, int, int, int]:
    """params.yaml's experiment at Fashion-MNIST's full size, read rather than restated."""
    p = yaml.safe_load(params.read_text())
    return (p["model"]["width"], 60000, 10000, p["train"]["epochs"], p["train"]["batch_size"])


# name -> (model width, training images, test images, epochs, batch)
SIZES = {
    "quickstart": (8, 6000, 1000, 3, 256),  # `make quick`'s sizes
    "one epoch": (8, 6000, 1000, 1, 256),  # the fixed cost weighs most
    "default job": default_job(),  # hours on 2 CPU cores: a GPU's size
}
SMALL = ["quickstart", "one epoch"]  # what runs unless --sizes says otherwise
JOBS = {"ours": "ours", "bare": "bare loop", "peer": "Lightning"}  # the table's names
GOAL = 0.5  # issue 29: each train stage's wall at most half the peer's
MISSING = "benchmarks.peer: lightning is not installed; run `make peer-install` (the peer extra)"


def lightning_missing() -> bool:
    try:
        return importlib.util.find_spec("lightning") is None
    except (ImportError, ValueError):  # a parent package hidden, or a module with no spec
        return True


def ours(project: Path, env: dict, size: tuple) -> dict[str, float]:
    """Our train stage, as `dvc repro` runs it, with the size's overrides."""
    width, _, _, epochs, batch = size
    for name in ("results", "checkpoints"):
        shutil.rmtree(project / name, ignore_errors=True)
    overrides = [f"model.width={width}", f"train.epochs={epochs}", f"train.batch_size={batch}"]
    wall = timed([sys.executable, "-m", "pipeline.train", "single", *overrides], project, env)
    # summary.json: metrics.json's figures and the epochs' (issue 49: the warm-up, first,
    # epoch and the steady one, where the run had them)
    summary = json.loads((project / "results" / "single" / "summary.json").read_text())
    speed = {
        "warmup_epoch_s": summary["warmup_epoch_seconds"],
        "steady_epoch_s": summary["steady_epoch_seconds"],
    }
    return {
        "wall_s": wall,
        "train_s": summary["total_seconds"],
        "test_acc": summary["test_acc"],
        **{key: value for key, value in speed.items() if value is not None},
    }


def peer(project: Path, env: dict, size: tuple) -> dict[str, float]:
    """The Lightning peer, its own process, started from the same clock."""
    shutil.rmtree(project / "peer", ignore_errors=True)
    return marked("benchmarks.lightning_peer", project, env, size)


def bare(project: Path, env: dict, size: tuple) -> dict[str, float]:
    """The floor: the same training as a bare PyTorch loop (benchmarks/bare_loop.py)."""
    return marked("benchmarks.bare_loop", project, env, size)


def marked(module: str, project: Path, env: dict, size: tuple, *extra: str) -> dict[str, float]:
    """`python -m module` with the size's settings (and `extra` arguments), timed as a
    process, and its own marks of when training started and ended (and, where it marks it,
    when its first step was queued)."""
    width, _, _, epochs, batch = size
    marks_file = project / "marks.json"
    marks_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", module, "--width", str(width)]
    cmd += ["--epochs", str(epochs), "--batch-size", str(batch), "--marks", str(marks_file)]
    spawned = time.time()
    wall = timed([*cmd, *extra], project, env)
    marks = json.loads(marks_file.read_text())
    result = {
        "wall_s": wall,
        "before_train_s": marks["train_start"] - spawned,
        "train_s": marks["train_end"] - marks["train_start"],
        "test_acc": marks["test_acc"],
    }
    if "first_step" in marks:
        result["first_step_s"] = marks["first_step"] - spawned
    return result


def timed(cmd: list[str], cwd: Path, env: dict) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return seconds


def mfu(flops_per_image: float, size: dict, train_s: float, peak_flops: float) -> float:
    """The fraction of the device's peak a job's training seconds reached: every training
    image's forward and backward FLOPs, each epoch, over those seconds."""
    return flops_per_image * size["train"] * size["epochs"] / train_s / peak_flops


def medians(rounds: list[dict]) -> dict:
    """Each job's median of each figure over the rounds, ours/peer of the median walls and,
    where the bare loop ran, bare/peer: the lowest ratio this job could have."""
    out: dict = {
        job: {key: statistics.median(r[job][key] for r in rounds) for key in rounds[0][job]}
        for job in rounds[0]
    }
    out["ratio_wall"] = out["ours"]["wall_s"] / out["peer"]["wall_s"]
    if "bare" in out:
        out["ratio_bare"] = out["bare"]["wall_s"] / out["peer"]["wall_s"]
    return out


def measure_size(size: tuple, runs: int, warmup: int, tmp: Path) -> list[dict]:
    from benchmarks.e2e import project_copy, project_path
    from pipeline.data.synthetic import write_synthetic

    _, n_train, n_test, _, _ = size
    mirror = tmp / "mirror"
    shutil.rmtree(mirror, ignore_errors=True)
    write_synthetic(mirror, n_train, n_test)
    project = project_copy(tmp / "project", mirror)
    # the peer is a module of benchmarks/, run from the copy like the stage
    shutil.copytree(Path(__file__).parent, project / "benchmarks", ignore=ignored)
    env = {
        **os.environ,
        "PYTHONPATH": project_path(project),
        "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}",
    }
    subprocess.run([sys.executable, "-m", "pipeline.fetch"], cwd=project, env=env, check=True)
    jobs = {"ours": ours, "peer": peer, "bare": bare}
    for _ in range(warmup):
        for job in jobs.values():
            job(project, env, size)  # untimed: the store's tables, the file cache
    rounds = []
    for i in range(runs):
        turn = list(jobs)[i % len(jobs) :] + list(jobs)[: i % len(jobs)]  # each first in turn
        row = {name: jobs[name](project, env, size) for name in turn}
        rounds.append({name: row[name] for name in jobs})
        print(
            f"peer: run {i + 1}: "
            + ", ".join(f"{name} {row[name]['wall_s']:.1f} s" for name in jobs),
            flush=True,
        )
    shutil.rmtree(project)
    return rounds


def ignored(directory: str, names: list[str]) -> list[str]:
    return [n for n in names if n in ("__pycache__", "results")]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", nargs="*", default=SMALL, choices=list(SIZES))
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed rounds first (0: the first is cold)"
    )
    parser.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/...)")
    args = parser.parse_args(argv)
    if lightning_missing():
        print(MISSING, file=sys.stderr)
        sys.exit(2)
    import lightning

    from benchmarks.bench import flops_per_image, machine, peak, write_result
    from benchmarks.e2e import torch_device

    device = torch_device()
    label, info = machine(device)
    precision = "bf16" if device.type == "cuda" else "fp32"  # what all three jobs run
    peak_flops, peak_source = peak(device, precision, {})
    load_before = os.getloadavg()
    sizes = {}
    with tempfile.TemporaryDirectory(prefix="parallel-lab-peer-") as tmp:
        for name in args.sizes:
            print(f"peer: {name}", flush=True)
            before = os.getloadavg()
            rounds = measure_size(SIZES[name], args.runs, args.warmup, Path(tmp))
            load = {"before": before, "after": os.getloadavg()}  # which size other jobs hit
            sizes[name] = {
                "runs": rounds,
                "median": medians(rounds),
                "load_average": load,
                "flops_per_image": flops_per_image(SIZES[name][0]),
            }
    result = {
        "machine": label,
        "info": {**info, "lightning": lightning.__version__},
        "date": date.today().isoformat(),
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "peak": {"precision": precision, "flops": peak_flops, "source": peak_source},
        "settings": {
            "runs": args.runs,
            "warmup": args.warmup,
            "sizes": {
                name: dict(zip(["width", "train", "test", "epochs", "batch"], SIZES[name]))
                for name in args.sizes
            },
        },
        "sizes": sizes,
    }
    out = write_result(result, "peer", args.out)
    print(table(result), flush=True)
    print(f"peer: wrote {out}", flush=True)
    return result


def table(result: dict) -> str:
    """One row per size: the three process walls, ours/peer against the goal and bare/peer
    (the floor), and where each job's seconds went."""
    lines = [
        "| size | ours: wall s | ours: training s | peer: wall s | peer: before training s "
        "| peer: training s | bare loop: wall s | bare loop: training s "
        "| ours / peer (goal <= 0.5x) | bare loop / peer |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, size in result["sizes"].items():
        s, m = result["settings"]["sizes"][name], size["median"]
        epochs = f"{s['epochs']} epoch" + "s" * (s["epochs"] != 1)
        label = f"{name}: width {s['width']}, {s['train']} images, {epochs}"
        verdict = "met" if m["ratio_wall"] <= GOAL else "missed"
        bare = m.get("bare")  # results from before the bare loop have none
        floor = ["-", "-", "-"]
        if bare:
            floor = [f"{bare['wall_s']:.1f}", f"{bare['train_s']:.1f}", f"{m['ratio_bare']:.2f}x"]
        cells = [
            label,
            f"{m['ours']['wall_s']:.1f}",
            f"{m['ours']['train_s']:.1f}",
            f"{m['peer']['wall_s']:.1f}",
            f"{m['peer']['before_train_s']:.1f}",
            f"{m['peer']['train_s']:.1f}",
            *floor[:2],
            f"{m['ratio_wall']:.2f}x ({verdict})",
            floor[2],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def job_table(result: dict, name: str) -> str:
    """One size's jobs as rows (ours, the bare loop, Lightning): walls, training (its
    evaluation included) and the rest (start, data, exit), MFU where the result has a peak,
    and each wall over Lightning's."""
    s, m = result["settings"]["sizes"][name], result["sizes"][name]["median"]
    peak = result.get("peak")  # results from before MFU have none
    lines = [
        "| job | wall s | training s | the rest s | MFU | test acc | wall / Lightning's |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for job, label in JOBS.items():
        if job not in m:
            continue
        row = m[job]
        share = "-"
        if peak is not None:
            per_image = result["sizes"][name]["flops_per_image"]
            share = f"{100 * mfu(per_image, s, row['train_s'], peak['flops']):.1f}%"
        ratio = row["wall_s"] / m["peer"]["wall_s"]
        verdict = f" (goal <= {GOAL}x: {'met' if ratio <= GOAL else 'missed'})" * (job == "ours")
        cells = [
            label,
            f"{row['wall_s']:.1f}",
            f"{row['train_s']:.1f}",
            f"{row['wall_s'] - row['train_s']:.1f}",
            share,
            f"{row['test_acc']:.4f}",
            f"{ratio:.2f}x{verdict}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
