"""The predict stage's work: every predictable strategy of the experiment at each N asked for,
as one JSON document, and its text for the terminal. Every figure is named "predicted"."""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

from pipeline.config import Config
from pipeline.data.fashion_mnist import train_samples
from pipeline.errors import UserError
from pipeline.resnet import build_model
from pipeline.results import PREDICTED
from pipeline.run_spec import resolve_run
from pipeline.scaling.checked import BAND, band_text
from pipeline.scaling.gloo_link import measure_gloo_link
from pipeline.scaling.links import PRESETS, Link, check_link
from pipeline.scaling.prediction import LEAVES_OUT, NOT_PREDICTED, predict
from pipeline.scaling.profile import measure_rank

FULL_TRAIN = 60000  # Fashion-MNIST's training set, where the fetch stage has not run


def measuring_device(devices: str) -> torch.device:
    """This machine's device the ranks are measured on: its first GPU unless params.yaml's
    `devices` says cpu or none is visible."""
    if devices != "cpu" and torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU processes ({platform.processor() or platform.machine()})"


def the_link(given: Link | None, device: torch.device, gradient_bytes: int, n: int) -> Link:
    """predict.link as given (check_link), or for auto: on a CPU, gloo between n processes
    measured here; on a GPU, nvlink-h100."""
    if given is not None:
        return given
    if device.type == "cpu":
        return measure_gloo_link(gradient_bytes, min(n, 2))
    return PRESETS["nvlink-h100"]


def predict_all(cfg: Config) -> dict[str, Any]:
    given = check_link(cfg.predict.link)  # before seconds of measuring
    device = measuring_device(cfg.devices)
    try:
        n_train = train_samples(cfg.data.limit_train)
    except UserError:  # not fetched: the full set's epoch
        n_train = min(FULL_TRAIN, cfg.data.limit_train or FULL_TRAIN)
    single = resolve_run(cfg, "single")
    baseline = measure_rank(single, 1, device).step_s
    parameters = build_model(cfg.model.width, cfg.seed).parameters()
    gradient_bytes = sum(p.numel() * p.element_size() for p in parameters)
    link = the_link(given, device, gradient_bytes, max(cfg.predict.gpus))
    on_gpu = device.type == "cuda"
    by_n: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    for n in cfg.predict.gpus:
        rows: dict[str, Any] = {}
        by_n[str(n)] = rows
        if too_many_processes(device, n):
            skipped[f"{n} devices"] = (
                f"not predicted: on a CPU the N processes share its {os.cpu_count()} cores, "
                f"so at most {os.cpu_count()}"
            )
            continue
        for name in cfg.strategies:
            if name == "single":  # one device at any N: the baseline, measured above
                continue
            if name in NOT_PREDICTED:
                skipped[name] = NOT_PREDICTED[name]
                continue
            try:
                p = predict(resolve_run(cfg, name), n, link, device, n_train, baseline)
            except UserError as err:
                rows[name] = {"strategy": name, "not_predicted": str(err)}
                continue
            rows[name] = {**p.to_json(), "band": BAND.get(name), "checked": band_text(name, on_gpu)}
    return {
        "kind": PREDICTED,  # every figure of it is a prediction, never a measurement
        "measured_on": device_name(device),
        "device": device.type,
        "link": {
            "name": link.name,
            "busbw_GBps": link.busbw / 1e9,
            "latency_us": link.latency_s * 1e6,
            "source": link.source,
        },
        "settings": {
            "model.width": cfg.model.width,
            "train.batch_size": cfg.train.batch_size,
            "train.grad_accum": cfg.train.grad_accum,
            "train.precision": cfg.train.precision,
            "train_samples": n_train,
        },
        "single_step_s": baseline,
        "by_devices": by_n,
        "not_predicted": skipped,
        "leaves_out": list(LEAVES_OUT),
    }


def too_many_processes(device: torch.device, n: int) -> bool:
    """On a CPU, N "devices" are N processes sharing its cores: past one a core, each rank's
    measured share would be a core no rank gets."""
    return device.type == "cpu" and n > (os.cpu_count() or 1)


def render_text(result: dict[str, Any]) -> str:
    """The terminal's view: a table per N, every figure marked predicted."""
    link = result["link"]
    lines = [
        f"PREDICTED, not measured: each strategy on N x {result['measured_on']}, linked by "
        f"{link['name']} ({link['busbw_GBps']:.3g} GB/s bus bandwidth, {link['source']})",
        f"  baseline: single on one device, {result['single_step_s'] * 1000:.1f} ms a step "
        "(measured here)",
    ]
    for n, rows in result["by_devices"].items():
        lines.append(f"on {n} devices (predicted):")
        lines.append(
            f"  {'strategy':<18} {'devices':>7} {'s/epoch':>8} {'speedup':>8} "
            f"{'efficiency':>10} {'comm waited':>11}  band"
        )
        for name, row in rows.items():
            if "not_predicted" in row:
                lines.append(f"  {name:<18} {row['not_predicted']}")
                continue
            band = f"±{row['band']:.0%}" if row["band"] is not None else "unchecked"
            if result["device"] == "cuda":
                band += ", unchecked on GPUs"
            lines.append(
                f"  {name:<18} {row['devices_used']:>7} {row['predicted_epoch_s']:>8.2f} "
                f"{row['predicted_speedup']:>7.2f}x {row['predicted_efficiency']:>10.0%} "
                f"{row['exposed_communication_s'] * 1000:>9.1f}ms  {band}"
            )
    for name, why in result["not_predicted"].items():
        lines.append(f"{name}: {why}")
    lines.append("left out of every prediction: " + "; ".join(result["leaves_out"]))
    return "\n".join(lines) + "\n"
