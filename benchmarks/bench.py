"""The source notes' training loop against the project's, on one machine, in one process.

    python -m benchmarks.bench                                  # defaults for this device
    python -m benchmarks.bench --width 8 --limit-train 6000     # the CPU run in docs/performance.md

Every row trains the project's ResNet-18 (at --width) with the same global batch on the same
--limit-train training samples. The rows take turns epoch by epoch, so a change in machine
load falls on all of them alike; each row's first --warmup epochs (torch.compile, cuDNN
autotuning, allocator and worker start-up) are reported but not timed into the medians of
the --epochs after them. Ratios between rows are medians of the ratios within each round.
Only training is timed (no evaluation), as wall-clock time of the whole pass, data loading
included, with the device synchronised at the end.

Rows:
  baseline          the notes' loop, faithfully: torchvision FashionMNIST, ToTensor per sample,
                    DataLoader(shuffle, 4 workers), fp32 with PyTorch's default backend flags,
                    plain SGD, loss and accuracy read back (.item()) every step; it keeps the
                    last partial batch, as the notes do (throughput is per sample trained).
  single_dataloader the project's `single`, data.loader=dataloader, params.yaml's settings.
  single_fast       `single`, the device loader and the fastest settings (--fast).
  ddp, fsdp, dp     world size 1 with --fast: the wrapper's overhead against `single` with the
                    same effective settings (a wrapper that cannot take one runs without it,
                    see notes, and is compared with a `single` that runs without it too).
  single_fast+mlflow  single_fast with the train stage's MLflow publisher process beside it,
                    as the stage runs it: system metrics sampled during the epoch, the epoch's
                    row appended to the run's stream at its end (inside the timed epoch) and
                    pushed by the publisher.

MFU = FLOPs trained per second (fwd+bwd per image from FlopCounterMode) over the peak of the
row's arithmetic: the datasheet dense peak for a GPU listed in GPU_PEAKS, else a matmul peak
measured here (the CPU's, on all its threads). The table is printed and written as JSON to
benchmarks/results/<machine>-<date>.json with the targets for this kind of device.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import date
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pipeline import strategies
from pipeline.config import Config, flatten, load_config
from pipeline.context import DistContext
from pipeline.data.device_data import to_device
from pipeline.data.fashion_mnist import DATA_DIR, load_tensors
from pipeline.data.loaders import torchvision_root
from pipeline.files import atomic_write
from pipeline.interrupts.stop import StopRequest
from pipeline.numerics.build import build_training
from pipeline.numerics.precision import build_precision, configure_backends, cpu_has_native_bf16
from pipeline.numerics.totals import Totals
from pipeline.resnet import build_model
from pipeline.results import EpochRow
from pipeline.run_spec import resolve_run
from pipeline.tracking import stream
from pipeline.training.meter import wait_for_device
from pipeline.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
FULL_TRAIN = 60_000  # Fashion-MNIST's training set: what "s/epoch" targets refer to
# every strategy but single, at world size 1: what the project's wrapping costs against
# `single` with the same effective settings (pipeline_parallel: all stages in this process)
WRAPPERS = tuple(name for name in strategies.NAMES if name != "single")
# Dense tensor-core peaks from NVIDIA's datasheets, FLOP/s (SXM parts; fp32 = non-tensor).
GPU_PEAKS = {
    "H100": {"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
    "H200": {"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
}
FAST = {  # --fast defaults, chosen by measurement (docs/performance.md)
    # bf16 only where the CPU has bf16 instructions: emulated (AVX2) it ran 10x slower
    "cpu": [
        f"train.precision={'bf16' if cpu_has_native_bf16() else 'fp32'}",
        "train.channels_last=true",
        "train.compile=true",
    ],
    # at batch 256 an H100 step is bound by kernel launches: CUDA graphs remove them
    "cuda": [
        "train.precision=bf16",
        "train.channels_last=true",
        "train.compile=true",
        "train.compile_mode=reduce-overhead",
    ],
}
TARGETS = {  # (name, row, bound): see `check_targets`
    "cuda": [
        ("steady epoch <= 1.0 s (60k images)", "epoch_s_60k", 1.0),
        ("MFU >= 20%", "mfu", 0.20),
        ("single_fast >= 10x baseline", "speedup", 10.0),
        ("ddp <= 1.05x single", "ddp", 1.05),
        ("fsdp <= 1.15x single", "fsdp", 1.15),
        ("dp <= 1.02x single", "dp", 1.02),
        ("balanced_dp <= 1.02x single", "balanced_dp", 1.02),
        ("pipeline_parallel (2 stages, 1 GPU) <= 1.25x single", "pipeline_parallel", 1.25),
        ("MLflow logging <= 1%", "logging", 1.01),
    ],
    "cpu": [
        ("single_fast >= 2x baseline (1.5x at the very least)", "speedup", 2.0),
        ("MLflow logging <= 1%", "logging", 1.01),
    ],
}


class BaselineRow:
    """The notes' d2l training loop (train_ch6 without its plotting), on the same model."""

    name, precision = "baseline", "fp32"
    reference: Optional[str] = None

    def __init__(self, args, device: torch.device, raw_dir: Path):
        from torchvision import datasets, transforms

        with tempfile.TemporaryDirectory() as root:
            dataset = datasets.FashionMNIST(
                torchvision_root(raw_dir, Path(root)), train=True, transform=transforms.ToTensor()
            )
        dataset = torch.utils.data.Subset(dataset, range(min(len(dataset), args.limit_train)))
        self.train_iter = torch.utils.data.DataLoader(
            dataset, args.batch_size, shuffle=True, num_workers=args.baseline_workers
        )
        self.samples = len(dataset)
        self.device = device
        self.net = build_model(args.width, args.seed).to(device)
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=args.lr)
        self.loss = torch.nn.CrossEntropyLoss()
        self.notes = [f"DataLoader workers: {args.baseline_workers}"]
        if device.type == "cuda":  # PyTorch's default lets cuDNN convolutions use TF32
            self.precision = "tf32"
            self.notes.append(
                "fp32 tensors; convolutions on TF32 tensor cores (PyTorch's "
                "default), so MFU is against the TF32 peak"
            )

    def epoch(self) -> float:
        if self.device.type == "cuda":  # PyTorch's defaults, which the notes ran with
            torch.backends.cudnn.benchmark = False
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, False
        start = time.perf_counter()
        self.net.train()
        metric = [0.0, 0.0, 0]
        for X, y in self.train_iter:
            self.optimizer.zero_grad()
            X, y = X.to(self.device), y.to(self.device)
            y_hat = self.net(X)
            loss = self.loss(y_hat, y)
            loss.backward()
            self.optimizer.step()
            with torch.no_grad():
                metric[0] += float(loss * X.shape[0])
                metric[1] += float((y_hat.argmax(dim=1) == y).sum())
                metric[2] += X.shape[0]
        wait_for_device(self.device)
        return time.perf_counter() - start


class ProjectRow:
    """One strategy exactly as pipeline.train sets it up and trains an epoch."""

    reference: Optional[str] = None  # the row whose epoch time this one is compared with

    def __init__(
        self,
        name: str,
        strategy: str,
        cfg: Config,
        ctx: DistContext,
        data,
        raw_dir: Path,
        tracker_dir: Optional[Path] = None,
    ):
        self.name, self.cfg, self.ctx = name, cfg, ctx
        torch.manual_seed(cfg.seed)
        spec = resolve_run(cfg, strategy)
        plan = spec.job_plan(ctx.world_size, len(data.train_labels))
        # a setting decided at the run's start (auto) is measured, as a fresh run does
        self.training, _ = build_training(spec, ctx, data, plan, raw_dir).started(None)
        self.prec, self.loader = self.training.prec, self.training.loader
        self.precision = self.prec.name
        self.effective = (
            self.prec.name,
            self.loader.channels_last,
            cfg.train.compile and self.training.forward is not None,
        )
        self.samples = plan.samples_per_epoch
        self.totals = Totals.zeros(ctx.device)
        self.trainer = Trainer(self.training, ctx, StopRequest())
        self.notes = list(self.training.notes)
        self.index, self.history = 0, list[EpochRow]()
        self.losses: list[float] = []
        self.tracker = None if tracker_dir is None else start_tracker(cfg, ctx, name, tracker_dir)

    def epoch(self) -> float:
        configure_backends(self.prec, self.ctx.device)  # rows differ in process-wide flags
        start = time.perf_counter()
        self.trainer.train_epoch(self.index, 0, self.totals)
        wait_for_device(self.ctx.device)
        loss_sum, correct, count = self.totals.read()  # what run() reads back per epoch
        self.totals.zero_()
        self.losses.append(loss_sum / count)  # the epoch's mean training loss
        self.index += 1
        if self.tracker is not None:
            seconds = time.perf_counter() - start
            # as the train stage logs an epoch (the test set is not evaluated here)
            self.history.append(
                EpochRow(
                    self.index,
                    loss_sum / count,
                    correct / count,
                    float("nan"),
                    float("nan"),
                    seconds,
                    self.samples / seconds,
                    seconds,
                )
            )
            stream.epoch_ended(self.tracker.stream, self.history[-1])
        return time.perf_counter() - start

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.__exit__()  # its last push, then its files go


def start_tracker(cfg: Config, ctx: DistContext, name: str, directory: Path):
    """The train stage's MLflow side as it runs it: a publisher process following the run's
    record and stream, in an MLflow store of its own (not the project's), system metrics at
    report.system_metrics_interval_s."""
    from pipeline.results import CHECKPOINTS, RUN_RECORD
    from pipeline.tracking.mlflow_run import new_record, open_record
    from pipeline.tracking.provenance import base_tags, gpu_uuids
    from pipeline.tracking.publisher import Publisher

    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{directory / 'mlflow.db'}"
    with contextlib.chdir(directory):  # where the publisher finds the run's files
        publisher = Publisher(name, 0.0, "bench")
    publisher.make_store()
    new = new_record(name, "bench", name, base_tags(), flatten(cfg))
    open_record(directory / CHECKPOINTS / name / RUN_RECORD, new, fresh=True)
    interval = cfg.report.system_metrics_interval_s
    head = stream.Head(name, interval, gpu_uuids(dict(enumerate(ctx.gpus))), resume=False)
    stream.open_stream(publisher.stream, head)
    return publisher


def flops_per_image(width: int) -> float:
    """Forward + backward FLOPs of one training image (FlopCounterMode, on the meta device)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = build_model(width, 0).to("meta")
    x = torch.empty(2, 1, 28, 28, device="meta")
    y = torch.zeros(2, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    return counter.get_total_flops() / 2


def measured_peak(device: torch.device, precision: str) -> float:
    """Best of up to six square matmuls in this precision, FLOP/s. The size doubles from 512
    while one product takes under 0.25 s (up to 8192 on a GPU, 2048 on a CPU), and the
    repeats stop after two seconds: a CPU without bf16 instructions emulates bf16, where one
    2048-square bf16 product took 58 s (an AVX2-only EPYC)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}.get(
        precision, torch.float32
    )
    configure_backends(build_precision(precision, device), device)

    def product_seconds(n: int) -> float:
        a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        start = time.perf_counter()
        a @ b
        wait_for_device(device)
        return time.perf_counter() - start

    n, largest = 512, 8192 if device.type == "cuda" else 2048
    while n < largest and product_seconds(n) < 0.25:
        n *= 2
    times: list[float] = []
    while len(times) < 6 and sum(times) < 2.0:
        times.append(product_seconds(n))
    return 2 * n**3 / min(times)


def peak(device: torch.device, precision: str, cache: dict) -> tuple[float, str]:
    if precision not in cache:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
        sheet = next((v for k, v in GPU_PEAKS.items() if k in name), {})
        if precision in sheet:
            cache[precision] = (sheet[precision], f"datasheet {name}")
        else:
            cache[precision] = (measured_peak(device, precision), "measured matmul")
    return cache[precision]


def write_result(result: dict, kind: str, out: Optional[Path] = None) -> Path:
    """A benchmark's JSON at `out`, else benchmarks/results/<machine>-<kind>-<date>.json."""
    name = f"{result['machine']}-{kind}-{result['date']}.json"
    path = out or REPO / "benchmarks" / "results" / name
    # whole or not at all: a benchmark cut off by a time limit while writing leaves the last one
    atomic_write(path, json.dumps(result, indent=1) + "\n")
    return path


def machine(device: torch.device) -> tuple[str, dict]:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in open("/proc/cpuinfo")
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    info = {
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if device.type == "cuda":
        label = info["gpu"] = torch.cuda.get_device_name(device)
    else:
        label = f"cpu{os.cpu_count()}-{cpu}"
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-"), info


def build_rows(
    args, cfg_for: Callable[[list[str]], Config], ctx: DistContext, data, raw_dir: Path, work: Path
) -> tuple[list, dict[str, str]]:
    """The rows to time and, for rows that cannot run here, why not."""
    rows: list[BaselineRow | ProjectRow] = [BaselineRow(args, ctx.device, raw_dir)]
    skipped: dict[str, str] = {}
    rows.append(
        ProjectRow(
            "single_dataloader", "single", cfg_for(["data.loader=dataloader"]), ctx, data, raw_dir
        )
    )
    fast = ProjectRow("single_fast", "single", cfg_for(args.fast), ctx, data, raw_dir)
    rows.append(fast)
    references = {fast.effective: fast.name}
    for name in WRAPPERS:
        if name not in strategies.NAMES:
            skipped[name] = f"strategy {name!r} is not registered in pipeline/strategies"
            continue
        row = ProjectRow(name, name, cfg_for(args.fast), ctx, data, raw_dir)
        rows.append(row)
        if row.effective not in references:  # a `single` with what this wrapper really ran
            precision, channels_last, compiled = row.effective
            ref = ProjectRow(
                f"single_as_{name}",
                "single",
                cfg_for(
                    [
                        *args.fast,
                        f"train.precision={precision}",
                        f"train.channels_last={str(channels_last).lower()}",
                        f"train.compile={str(compiled).lower()}",
                    ]
                ),
                ctx,
                data,
                raw_dir,
            )
            rows.append(ref)
            references[ref.effective] = ref.name
        row.reference = references[row.effective]
    logged = ProjectRow(
        "single_fast+mlflow", "single", cfg_for(args.fast), ctx, data, raw_dir, tracker_dir=work
    )
    logged.reference = fast.name
    rows.append(logged)
    return rows, skipped


@contextlib.contextmanager
def one_rank_group(device: torch.device, work: Path) -> Iterator[None]:
    """A process group of one rank, for the strategies that need one (ddp, fsdp) built in
    this process; a file store in `work` needs no free port."""
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        rank=0,
        world_size=1,
        store=dist.FileStore(str(work / "store"), 1),
        device_id=device if device.type == "cuda" else None,
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def take_turns(rows: list, rounds: int, who: str) -> tuple[dict[str, list[float]], dict]:
    """Each row's `epoch()` in turn, `rounds` times, so that a change in the machine's load
    falls on every row alike: each row's seconds per round, and the rows that failed (a
    row's first error in a line: one row must not sink the run)."""
    failed: dict[str, str] = {}
    times: dict[str, list[float]] = {row.name: [] for row in rows}
    for round_ in range(rounds):
        for row in [r for r in rows if r.name not in failed]:
            try:
                seconds = row.epoch()
            except Exception as err:  # noqa: BLE001 - one row must not sink the run
                first = (str(err).splitlines() or [""])[0]
                failed[row.name] = f"{type(err).__name__}: {first}"
                print(f"{who}: {row.name} failed: {failed[row.name]}", file=sys.stderr, flush=True)
                continue
            times[row.name].append(seconds)
            print(
                f"{who}: round {round_ + 1}/{rounds} {row.name}: {seconds:.2f} s",
                file=sys.stderr,
                flush=True,
            )
    return times, failed


def paired_ratio(times: dict[str, list[float]], row: str, ref: str) -> float:
    """Median over rounds of row's epoch time / ref's epoch time in the same round."""
    return statistics.median(a / b for a, b in zip(times[row], times[ref]))


def check_targets(kind: str, table: dict[str, dict]) -> list[dict]:
    fast = table["single_fast"]
    values = {
        "epoch_s_60k": fast.get("epoch_s_60k"),
        "mfu": fast.get("mfu"),
        "speedup": fast.get("speedup"),
        "logging": table["single_fast+mlflow"].get("vs_ref"),
    }
    values.update({w: table[w]["vs_ref"] for w in WRAPPERS if table.get(w, {}).get("vs_ref")})
    out = []
    for name, key, bound in TARGETS[kind]:
        value = values.get(key)
        lower_is_better = key in ("epoch_s_60k", "logging", *WRAPPERS)
        if value is None:
            status = "not measured"
        elif lower_is_better:
            status = "met" if value <= bound else "missed"
        elif value >= bound:
            status = "met"
        else:
            status = "met the 1.5x minimum only" if key == "speedup" and value >= 1.5 else "missed"
        out.append({"target": name, "value": value, "bound": bound, "status": status})
    return out


def main(argv: list[str] | None = None) -> dict:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=64 if cuda else 8)
    parser.add_argument("--limit-train", type=int, default=FULL_TRAIN if cuda else 6000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=1, help="untimed epochs per row")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per row")
    parser.add_argument("--baseline-workers", type=int, default=4, help="the notes use 4")
    parser.add_argument(
        "--fast",
        nargs="*",
        default=FAST["cuda" if cuda else "cpu"],
        help="key=value settings of the fastest project rows",
    )
    parser.add_argument(
        "--set", nargs="*", default=[], help="key=value settings for every project row"
    )
    parser.add_argument("--data", type=Path, default=DATA_DIR, help="the fetch stage's output")
    parser.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/...)")
    args = parser.parse_args(argv)

    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    ctx = DistContext(rank=0, local_rank=0, world_size=1, gpus=("0",) if cuda else ())
    if cuda:
        torch.cuda.set_device(device)
    common = [
        f"model.width={args.width}",
        f"data.limit_train={args.limit_train}",
        f"train.batch_size={args.batch_size}",
        f"train.lr={args.lr}",
        f"seed={args.seed}",
        f"train.epochs={args.warmup + args.epochs}",
        # eager unless asked: auto captures single's step on a GPU, the wrapped rows' not
        "train.cuda_graph=none",
        *args.set,
    ]

    def cfg_for(extra: list[str]) -> Config:
        return load_config(REPO / "params.yaml", [*common, *extra])

    data = to_device(load_tensors(args.data), device, args.limit_train, None)
    if len(data.train_labels) < args.batch_size:
        sys.exit(f"--limit-train {args.limit_train} is smaller than --batch-size")
    raw_dir = args.data / "raw"
    label, info = machine(device)
    with tempfile.TemporaryDirectory() as work, one_rank_group(device, Path(work)):
        load_before = os.getloadavg()
        rows, skipped = build_rows(args, cfg_for, ctx, data, raw_dir, Path(work))
        times, failed = take_turns(rows, args.warmup + args.epochs, "bench")
        for row in rows:
            getattr(row, "close", lambda: None)()
        rows = [r for r in rows if r.name not in failed]
        load_after = os.getloadavg()

    flops = flops_per_image(args.width)
    peaks: dict = {}
    timed = {name: t[args.warmup :] for name, t in times.items()}
    table: dict[str, dict] = {}
    base = rows[0]
    for row in rows:
        seconds = statistics.median(timed[row.name])
        rate = row.samples / seconds
        peak_flops, peak_source = peak(device, row.precision, peaks)
        entry = {
            "status": "ok",
            "epoch_s": seconds,
            "first_epoch_s": times[row.name][0],
            "samples_per_epoch": row.samples,
            "samples_per_s": rate,
            "epoch_s_60k": FULL_TRAIN // args.batch_size * args.batch_size / rate,
            "speedup": statistics.median(  # throughput over the baseline's, round by round
                (row.samples / a) / (base.samples / b)
                for a, b in zip(timed[row.name], timed[base.name])
            ),
            "precision": row.precision,
            "mfu": flops * rate / peak_flops,
            "peak_flops": peak_flops,
            "peak_source": peak_source,
            "notes": row.notes,
            "epochs_s": times[row.name],
        }
        if row.reference and row.reference not in failed:
            entry["reference"] = row.reference
            entry["vs_ref"] = paired_ratio(timed, row.name, row.reference)
        table[row.name] = entry
    for name, why in skipped.items():
        table[name] = {"status": "skipped", "reason": why}
    for name, why in failed.items():
        table[name] = {"status": "failed", "reason": why}

    kind = "cuda" if cuda else "cpu"
    result = {
        "machine": label,
        "info": info,
        "date": date.today().isoformat(),
        "settings": {
            "width": args.width,
            "limit_train": args.limit_train,
            "batch_size": args.batch_size,
            "warmup_epochs": args.warmup,
            "timed_epochs": args.epochs,
            "fast": args.fast,
            "set": args.set,
            "baseline_workers": args.baseline_workers,
        },
        "flops_per_image": flops,
        "load_average": {"before": load_before, "after": load_after},
        "rows": table,
        # each strategy's epoch time over single's with the same effective settings
        "ratios_to_single": {
            w: table[w]["vs_ref"] for w in WRAPPERS if table.get(w, {}).get("vs_ref") is not None
        },
        "targets": check_targets(kind, table),
    }
    out = args.out or RESULTS / f"{label}-{result['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(render(result))
    print(f"bench: wrote {out}")
    return result


def render(result: dict) -> str:
    s = result["settings"]
    lines = [
        f"{result['machine']} | width {s['width']}, {s['limit_train']} training images, "
        f"batch {s['batch_size']}, median of {s['timed_epochs']} epochs after "
        f"{s['warmup_epochs']} warm-up | load average {result['load_average']['before'][0]:.1f}"
        f" -> {result['load_average']['after'][0]:.1f}",
        "| row | s/epoch | 1st epoch s | samples/s | x baseline | vs reference | MFU | "
        "precision | peak | notes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in result["rows"].items():
        if r["status"] != "ok":
            lines.append(f"| {name} | {r['status']}: {r['reason']} |||||||||")
            continue
        vs = f"{r['vs_ref']:.3f}x {r['reference']}" if "vs_ref" in r else ""
        lines.append(
            f"| {name} | {r['epoch_s']:.2f} | {r['first_epoch_s']:.2f} | "
            f"{r['samples_per_s']:.0f} | {r['speedup']:.2f} | {vs} | "
            f"{100 * r['mfu']:.1f}% | {r['precision']} | "
            f"{r['peak_flops'] / 1e9:.0f} GFLOP/s {r['peak_source']} | "
            f"{'; '.join(r['notes'])} |"
        )
    lines.append("")
    for t in result["targets"]:
        value = "n/a" if t["value"] is None else f"{t['value']:.3g}"
        lines.append(f"target: {t['target']}: {value} -> {t['status']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
