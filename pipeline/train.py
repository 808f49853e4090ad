"""DVC stage `train`: one strategy, one shared training loop, one writer.

    python -m pipeline.train STRATEGY [key=value ...]

Run directly, it validates the config, picks the devices and re-launches itself under
`torchrun --standalone --nproc-per-node=N` (N from the strategy; see pipeline/launch.py).
Under torchrun it trains: every rank builds the same seeded model, the strategy parallelizes
it, and the loop below drives it through the `Parallel` it got back.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from pipeline import memory, strategies
from pipeline.checkpoint import (ROOT as CHECKPOINTS, Checkpointer, Position, fingerprint,
                                 load_model_state, load_optimizer_state, rng_state,
                                 set_rng_state)
from pipeline.config import Config, effective_lr, flatten, load_config, to_yaml
from pipeline.context import DistContext
from pipeline.data import DeviceData, eval_shard, steps_per_epoch, to_device
from pipeline.errors import USER_ERROR_EXIT, UserError, exit_on_user_error
from pipeline.faults import Fault, fault_from_env
from pipeline.fetch import OUT_DIR, load_tensors
from pipeline.loaders import Batches, make_batches
from pipeline.model import build_model
from pipeline.optim import loss_function, lr_at, make_optimizer, set_lr
from pipeline.precision import (Precision, build_precision, compile_forward, configure_backends,
                                fit_to_strategy, graph_step_marker)
from pipeline.provenance import gpu_tags, gpu_uuids
from pipeline.report import steady_seconds, warmup_seconds
from pipeline.strategies.base import Parallel
from pipeline.tracking import NullTracker, Tracker, base_tags

RESULTS = Path("results")
ERROR_FILE_ENV = "PARALLEL_LAB_ERROR_FILE"  # where a worker leaves its one-line user error
SIGTERM_EXIT = 128 + signal.SIGTERM
HISTORY_FIELDS = ["epoch", "train_loss", "train_acc", "test_loss", "test_acc", "epoch_seconds",
                  "samples_per_s", "wall_seconds"]


class StopRequest:
    """SIGTERM (what `docker stop` sends) asks for a checkpoint and a clean exit. Ranks must
    agree on the step to stop at, so the flag is combined over a CPU (gloo) group at every
    step boundary: a host-side message, no GPU sync."""

    def __init__(self, group=None, world_size: int = 1):
        self.flag = False
        self.group, self.world_size = group, world_size
        signal.signal(signal.SIGTERM, self._handler)

    def _handler(self, signum, frame) -> None:
        self.flag = True

    def agreed(self) -> bool:
        if self.world_size == 1:
            return self.flag
        vote = torch.tensor([int(self.flag)])
        dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=self.group)
        return bool(vote.item())


def train_epoch(par: Parallel, optimizer: torch.optim.Optimizer, loader: Batches,
                prec: Precision, loss_fn, cfg: Config, epoch: int, start_step: int,
                totals: torch.Tensor, stop: StopRequest, fault: Fault | None, rank: int,
                progress: bool = False) -> int | None:
    """Optimizer steps start_step.. of one pass over the shuffled training set, adding
    [loss_sum, correct, count] of this rank's samples into `totals` on the device: nothing
    here waits for the GPU. Returns the step it stopped before on SIGTERM, else None."""
    accum = cfg.train.grad_accum
    new_graph_step = graph_step_marker(cfg.train, par.cuda_graphs)
    par.module.train()
    steps = loader.epoch(epoch, start_step)  # (step, this rank's micro-batches) on the device
    if progress:  # a bar on a terminal; log files get the one line per epoch instead
        steps = tqdm(steps, total=loader.steps - start_step, desc=f"epoch {epoch + 1}",
                     leave=False, unit="step")
    for step, micro_batches in steps:
        if stop.agreed():
            return step
        if fault is not None:
            fault.fire_if("step", rank, epoch + 1, step, signalled=lambda: stop.flag)
        set_lr(optimizer, lr_at(cfg.train, epoch * loader.steps + step, loader.steps))
        for micro, (x, y) in enumerate(micro_batches):
            new_graph_step()  # the last step's outputs are consumed (totals are queued)
            with par.grad_sync(micro == accum - 1):
                if par.pipeline_step is not None:
                    with prec.autocast():  # the schedule runs forward and backward itself
                        logits = par.pipeline_step(x, y, True)
                else:
                    with prec.autocast():
                        logits = par.forward(x)
                        # mean over this rank's share; DDP/FSDP average over ranks, and
                        # / accum makes the accumulated gradient the mean over the global batch
                        loss = loss_fn(logits, y.to(logits.device)) / accum
                    prec.backward(loss)  # scaled first when fp16 needs it
            if logits is not None:
                totals += batch_totals(logits.detach(), y)
        prec.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
    return None


def batch_totals(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    labels = labels.to(logits.device)
    loss_sum = F.cross_entropy(logits.float(), labels, reduction="sum")
    correct = (logits.argmax(1) == labels).sum()
    # a fill kernel, not torch.tensor(): a host->device copy would wait for the GPU
    count = torch.full((), len(labels), dtype=torch.float64, device=logits.device)
    return torch.stack([loss_sum.double(), correct.double(), count])


@torch.no_grad()
def evaluate(par: Parallel, data: DeviceData, loader: Batches, prec: Precision, cfg: Config,
             device: torch.device) -> torch.Tensor:
    """[loss_sum, correct, count] over this rank's share of the whole test set."""
    par.module.eval()
    batch = par.eval_batch_size or cfg.train.eval_batch_size
    new_graph_step = graph_step_marker(cfg.train, par.cuda_graphs)
    batches, counts = eval_shard(len(data.test_labels), par.data_rank, par.data_world, batch)
    totals = torch.zeros(3, device=device, dtype=torch.float64)
    for idx, count in zip(batches, counts):
        idx = idx.to(device)
        x, y = loader.prepare(data.test_images[idx]), data.test_labels[idx]
        new_graph_step()
        with prec.autocast():
            logits = par.pipeline_step(x, y, False) if par.pipeline_step else par.forward(x)
        if logits is not None and count > 0:
            totals += batch_totals(logits[:count], y[:count]).to(device)
    return totals


def reduce_totals(totals: torch.Tensor, ctx: DistContext) -> tuple[float, float]:
    """Sum [loss_sum, correct, count] over ranks -> (mean loss, accuracy). One host sync."""
    if ctx.world_size > 1:
        dist.all_reduce(totals)
    loss_sum, correct, count = totals.tolist()
    count = max(count, 1.0)
    return loss_sum / count, correct / count


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_training(cfg: Config, strategy: ModuleType, ctx: DistContext, data: DeviceData,
                   raw_dir: Path = OUT_DIR / "raw") -> tuple[Parallel, Precision, Batches,
                                                             torch.optim.Optimizer, Callable]:
    """The seeded model as `strategy` trains it, with the speed options applied, its
    optimizer, training batches and loss: what `run` trains and benchmarks/bench.py times."""
    device = ctx.device
    prec = build_precision(cfg.train.precision, device)
    model = build_model(cfg.model.width, cfg.seed).to(device, prec.dtype)
    par = strategy.parallelize(model, cfg, ctx)
    prec, channels_last = fit_to_strategy(prec, par, cfg.train.channels_last)
    configure_backends(prec, device)
    par.forward, compile_notes = compile_forward(par.forward, cfg.train.compile,
                                                   cfg.train.compile_mode, par.cuda_graphs)
    par.notes += prec.notes + compile_notes
    loss_fn = loss_function(cfg.train, schedule_owns_loss=par.pipeline_step is not None)
    optimizer = make_optimizer(par.module.parameters(), cfg.train)
    loader = make_batches(data, cfg, par.data_rank, par.data_world, prec.dtype, channels_last,
                          device, raw_dir)
    return par, prec, loader, optimizer, loss_fn


def run(cfg: Config, strategy_name: str, ctx: DistContext, control_group=None) -> dict | None:
    """Train one strategy to the end (or to a SIGTERM checkpoint: then None is returned)."""
    strategy = strategies.get(strategy_name)
    device = ctx.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    fault = fault_from_env()
    stop = StopRequest(control_group, ctx.world_size)
    torch.manual_seed(cfg.seed)
    data = to_device(load_tensors(), device, cfg.data.limit_train, cfg.data.limit_test)
    if steps_per_epoch(len(data.train_labels), cfg.train.batch_size) == 0:
        raise UserError(f"train.batch_size: got {cfg.train.batch_size}, larger than the "
                        f"{len(data.train_labels)} training samples; expected at most that")
    par, prec, loader, optimizer, loss_fn = build_training(cfg, strategy, ctx, data)
    lr = effective_lr(cfg.train)

    # Resume: the last committed checkpoint of this very configuration, if any.
    key = fingerprint(cfg, strategy_name, ctx.world_size)
    ckpt = Checkpointer(CHECKPOINTS / strategy_name, ctx.rank, ctx.world_size, par.writer, key)
    pos, history = Position(0, 0), []
    totals = torch.zeros(3, device=device, dtype=torch.float64)
    source = ckpt
    found = ckpt.latest()
    if found is None and cfg.checkpoint.resume_from:
        source = Checkpointer.foreign(Path(cfg.checkpoint.resume_from), ctx.rank, ctx.world_size)
        found = source.latest()
    if found is not None:
        pos, record = found
        state = source.load(pos)
        load_model_state(par.module, state["model"], source.directory)
        load_optimizer_state(optimizer, state["optimizer"])
        set_rng_state(state["rng"], device)
        totals = state["train_totals"].to(device)
        if prec.scaler is not None and state.get("grad_scaler"):
            prec.scaler.load_state_dict(state["grad_scaler"])  # fp16: the loss scale it reached
        history = record["history"]
        if par.writer:
            print(f"train[{strategy_name}]: resuming at epoch {pos.epoch + 1} step {pos.step} "
                  f"from {source.directory}", flush=True)

    out_dir = RESULTS / strategy_name
    tracker = NullTracker()
    if par.writer:
        out_dir.mkdir(parents=True, exist_ok=True)
        tags = {**base_tags(), "strategy": strategy_name, "world_size": str(ctx.world_size),
                "backend": ctx.backend if ctx.world_size > 1 else "none",
                "devices": ",".join(par.devices), "gpus": ",".join(ctx.gpus) or "cpu",
                "batch_split": "+".join(map(str, par.batch_split)),
                "dvc_stage": f"train@{strategy_name}", **gpu_tags(ctx.gpus)}
        params = {**flatten(cfg), "strategy": strategy_name, "world_size": ctx.world_size,
                  "effective_lr": lr, **par.params}
        tracker = Tracker(CHECKPOINTS / strategy_name / "run.json", cfg.mlflow.experiment,
                          strategy_name, tags, params, key)
        tracker.sync(history)
        tracker.start_system_metrics(cfg.report.system_metrics_interval_s, gpu_uuids(ctx.gpus),
                                     resume=bool(history))
        for note in par.notes:
            print(f"train[{strategy_name}]: note: {note}", flush=True)

    def save(at: Position) -> None:
        state = {"model": par.module.state_dict(), "optimizer": optimizer.state_dict(),
                 "rng": rng_state(device), "train_totals": totals,
                 "grad_scaler": prec.scaler.state_dict() if prec.scaler is not None else None}
        ckpt.save(at, state, {"history": history, "run_id": tracker.run_id},
                  on_written=lambda: fault and fault.fire_if("checkpoint", ctx.rank,
                                                             at.epoch, at.step))

    if fault is not None:
        fault.fire_if("start", ctx.rank)
    n_train = steps_per_epoch(len(data.train_labels), cfg.train.batch_size) * cfg.train.batch_size
    start = time.perf_counter() - (history[-1]["wall_seconds"] if history else 0.0)
    mem_devices = memory.local_devices(par.devices, ctx)
    ok = False
    try:
        for epoch in range(pos.epoch, cfg.train.epochs):
            memory.reset_peaks(mem_devices)
            t0 = time.perf_counter()
            stopped_at = train_epoch(par, optimizer, loader, prec, loss_fn, cfg, epoch,
                                     pos.step if epoch == pos.epoch else 0, totals, stop,
                                     fault, ctx.rank, progress=par.writer and sys.stderr.isatty())
            if stopped_at is not None:
                save(Position(epoch, stopped_at))
                if par.writer:
                    print(f"train[{strategy_name}]: SIGTERM: checkpointed at epoch {epoch + 1} "
                          f"step {stopped_at}; `dvc repro` resumes from there", flush=True)
                tracker.sync(history)
                return None
            sync(device)
            seconds = time.perf_counter() - t0
            if fault is not None:
                fault.fire_if("eval", ctx.rank, epoch + 1)
            train_loss, train_acc = reduce_totals(totals, ctx)
            totals.zero_()
            test_loss, test_acc = reduce_totals(evaluate(par, data, loader, prec, cfg, device),
                                                ctx)
            # peaks of the epoch's training and evaluation, every device, on every rank
            peaks = memory.gather_peaks(memory.read_peaks(mem_devices, ctx), ctx)
            row = {"epoch": epoch + 1, "train_loss": train_loss, "train_acc": train_acc,
                   "test_loss": test_loss, "test_acc": test_acc, "epoch_seconds": seconds,
                   "samples_per_s": n_train / seconds,
                   "wall_seconds": time.perf_counter() - start, **memory.epoch_metrics(peaks)}
            history.append(row)
            if cfg.checkpoint.every_epochs and ((epoch + 1) % cfg.checkpoint.every_epochs == 0
                                                or epoch + 1 == cfg.train.epochs):
                save(Position(epoch + 1, 0))
            tracker.sync_soon(history)
            if par.writer:
                print(f"train[{strategy_name}] epoch {epoch + 1}/{cfg.train.epochs}: "
                      f"loss {train_loss:.4f} train_acc {train_acc:.4f} test_acc {test_acc:.4f} "
                      f"{seconds:.2f}s {n_train / seconds:.0f} samples/s", flush=True)
        if fault is not None:
            fault.fire_if("end", ctx.rank)
        state = par.state_dict()  # a collective for sharded/split models: every rank calls it
        summary = summarize(history, cfg, strategy_name, ctx, par, n_train)
        if par.writer:
            summary["mlflow_run_id"] = tracker.run_id
            write_results(out_dir, state, history, summary, cfg)
            artifacts = [out_dir / n for n in ("metrics.json", "history.csv", "config.yaml",
                                               "model.pt")]
            tracker.sync(history, artifacts, finished=True,
                         wait_s=cfg.mlflow.final_sync_wait_s)
        ok = True
        return summary
    finally:
        tracker.stop_system_metrics()
        if not ok:  # whatever epochs finished still reach MLflow
            tracker.sync(history)


def summarize(history: list[dict], cfg: Config, strategy: str, ctx: DistContext,
              par: Parallel, n_train: int) -> dict:
    last = history[-1]
    seconds = [r["epoch_seconds"] for r in history]
    return {
        "strategy": strategy, "world_size": ctx.world_size, "devices": par.devices,
        "batch_split": par.batch_split, "epochs": len(history),
        "test_acc": last["test_acc"], "best_test_acc": max(r["test_acc"] for r in history),
        "test_loss": last["test_loss"], "train_loss": last["train_loss"],
        "epoch_seconds": last["epoch_seconds"],
        "samples_per_s": last["samples_per_s"],
        "total_seconds": last["wall_seconds"],
        "warmup_epoch_seconds": warmup_seconds(seconds),
        "steady_epoch_seconds": steady_seconds(seconds),
        "steady_samples_per_s": n_train / steady_seconds(seconds),
        **memory.run_summary(history),
        "notes": par.notes,
    }


def write_results(out_dir: Path, state: dict, history: list[dict], summary: dict,
                  cfg: Config) -> None:
    """Each file is written beside its final name and renamed into place (never half-written)."""
    def atomic(name: str, write) -> None:
        tmp = out_dir / f".{name}.tmp"
        write(tmp)
        os.replace(tmp, out_dir / name)

    atomic("model.pt", lambda p: torch.save(state, p))
    atomic("history.csv", lambda p: p.write_text(history_csv(history)))
    atomic("config.yaml", lambda p: p.write_text(to_yaml(cfg)))
    atomic("metrics.json", lambda p: p.write_text(json.dumps(summary, indent=2) + "\n"))


def history_csv(history: list[dict]) -> str:
    lines = [",".join(HISTORY_FIELDS)]
    for row in history:
        lines.append(",".join(f"{row[k]:.6g}" if isinstance(row[k], float) else str(row[k])
                              for k in HISTORY_FIELDS))
    return "\n".join(lines) + "\n"


def under_torchrun(env: dict) -> bool:
    return "TORCHELASTIC_RUN_ID" in env and "LOCAL_RANK" in env


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not under_torchrun(os.environ):
        from pipeline.launch import launch

        sys.exit(launch(argv))
    try:
        worker(argv)
    except UserError as err:
        # torchrun turns any worker exit into its own code 1; leave the line for the launcher
        if os.environ.get(ERROR_FILE_ENV):
            Path(os.environ[ERROR_FILE_ENV]).write_text(str(err))
        else:
            print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(USER_ERROR_EXIT)


def attempt_store(env) -> dist.Store:
    """The rendezvous store, with keys scoped to this torchrun attempt. torchrun keeps its
    store across worker restarts but torch 2.14's env:// init assumes a fresh one, so a
    restarted process group would read the dead attempt's addresses and hang connecting."""
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]),
                          int(env["WORLD_SIZE"]), is_master=False,
                          timeout=timedelta(minutes=10))
    return dist.PrefixStore(f"parallel-lab/attempt-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}",
                            store)


def worker(argv: list[str]) -> None:
    name, overrides = argv[0], argv[1:]
    cfg = load_config("params.yaml", overrides)
    ctx = DistContext.from_env()
    dist.init_process_group(ctx.backend, store=attempt_store(os.environ), rank=ctx.rank,
                            world_size=ctx.world_size,
                            device_id=ctx.device if ctx.on_cuda else None)
    # the SIGTERM vote travels on a CPU group so it never waits on the GPU
    control = dist.new_group(backend="gloo") if ctx.on_cuda and ctx.world_size > 1 else None
    try:
        summary = run(cfg, name, ctx, control)
    finally:
        dist.destroy_process_group()
    if summary is None:
        sys.exit(SIGTERM_EXIT)


if __name__ == "__main__":
    main()
