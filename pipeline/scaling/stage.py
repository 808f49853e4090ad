"""The predict stage's work, one strategy at a time (predict@STRATEGY, as train@STRATEGY): its
epoch at each N asked for, as one JSON document whose every figure is named "predicted".
single's document holds the baseline instead: its step on one device, measured the same way,
which every speedup divides (reporting/predicted.py puts the documents together)."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from pipeline.config import Config
from pipeline.data.fashion_mnist import DATA_DIR, load_arrays
from pipeline.errors import UserError
from pipeline.parallel_dims import ParallelDims
from pipeline.resnet import build_model
from pipeline.results import PREDICTED
from pipeline.run_spec import RunSpec, resolve_run
from pipeline.scaling.checked import band, band_text, layout_unchecked, not_predicted_document
from pipeline.scaling.gloo_link import BANDWIDTH_BYTES, WORLD, measure_gloo_link
from pipeline.scaling.kept_link import KEPT_LINKS, kept_link, this_machine
from pipeline.scaling.links import PRESETS, Link, check_link
from pipeline.scaling.prediction import LEAVES_OUT, DataSize, Measurements, predict
from pipeline.scaling.profile import measure_step, replica_split

# Fashion-MNIST's training and test sets, where the fetch stage has not run
FULL_TRAIN, FULL_TEST = 60000, 10000


def data_size(cfg: Config) -> DataSize:
    """What the runs train and test on: the fetched sets cut to data.limit_*, or where the
    fetch stage has not run, the full sets' sizes so cut."""
    try:
        arrays = load_arrays(DATA_DIR, ["train_labels", "test_labels"])
        sizes = len(arrays["train_labels"]), len(arrays["test_labels"])
    except UserError:  # not fetched
        sizes = FULL_TRAIN, FULL_TEST
    limits = cfg.data.limit_train, cfg.data.limit_test
    train, test = (min(n, limit or n) for n, limit in zip(sizes, limits))
    return DataSize(train, test)


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


def the_link(cfg: Config, device: torch.device, kept: Path | None = KEPT_LINKS) -> Link:
    """predict.link as given (check_link), or for auto: on a CPU, gloo between 2 processes
    measured here, at the size of the model's gradients (kept in `kept` once measured on this
    machine, and said to be kept where it is read back; None: measured every time); on a
    GPU, nvlink-h100."""
    given = check_link(cfg.predict.link)
    if given is not None:
        return given
    if device.type == "cuda":
        return PRESETS["nvlink-h100"]
    parameters = build_model(cfg.model.width, cfg.seed).parameters()
    size = sum(p.numel() * p.element_size() for p in parameters)
    if kept is None:
        return measure_gloo_link(size)
    # what the measurement depends on: gradients smaller than BANDWIDTH_BYTES measure alike
    key = this_machine(torch.__version__, WORLD, max(size, BANDWIDTH_BYTES))
    return kept_link(key, lambda: measure_gloo_link(size), kept)


def too_many_processes(device: torch.device, n: int) -> bool:
    """On a CPU, N "devices" are N processes sharing its cores: past one a core, each rank's
    measured share would be a core no rank gets."""
    return device.type == "cpu" and n > (os.cpu_count() or 1)


def predict_strategy(
    cfg: Config,
    name: str,
    device: torch.device,
    link: Callable[[], Link],
    done: Mapping[str, dict[str, Any]] = MappingProxyType({}),
) -> dict[str, Any]:
    """`name`'s document: its epoch at each N of predict.gpus (single: the baseline).
    `link`: the link, measured or read the first time it is called (single needs none);
    `done`: the documents this process predicted before, whose rows a layout that is the same
    run reuses (`preset_row`)."""
    data = data_size(cfg)
    doc: dict[str, Any] = {
        "kind": PREDICTED,  # every figure of it is a prediction, never a measurement
        "strategy": name,
        "measured_on": device_name(device),
        "device": device.type,
        "settings": {
            "model.width": cfg.model.width,
            "train.batch_size": cfg.train.batch_size,
            "train.grad_accum": cfg.train.grad_accum,
            "train.precision": cfg.train.precision,
            "train_samples": data.train,
            "test_samples": data.test,
        },
        "band": band(name, cfg.predict.time_s),
        "checked": band_text(name, device.type == "cuda", cfg.predict.time_s),
        "leaves_out": list(LEAVES_OUT),
        "by_devices": {},
    }
    spec = resolve_run(cfg, name)
    if spec.facts.launched_by != "torchrun":
        # a prediction steps one rank of N under torch's fake process group, where Horovod
        # (horovodrun's ranks, its own collectives) has no ranks: not measured that way yet
        why = f"not predicted: {name}'s ranks are {spec.facts.launched_by}'s (docs/horovod.md)"
        return not_predicted_document(name, why)
    if name == "single":  # one device at any N: what every speedup divides
        baseline = measure_step(spec, 1, device, cfg.predict.time_s)
        return {**doc, "baseline_step_s": baseline}
    given = link()
    doc["link"] = {
        "name": given.name,
        "busbw_GBps": given.busbw / 1e9,
        "latency_us": given.latency_s * 1e6,
        "source": given.source,
    }
    measured = Measurements(spec, device, cfg.predict.time_s)  # what no N changes, once
    for n in cfg.predict.gpus:
        # DataParallel's one process times nothing on a CPU (prediction.REPLICAS_ON_A_CPU)
        if too_many_processes(device, n) and replica_split(name) is None:
            why = f"this CPU's {os.cpu_count()} cores: at most {os.cpu_count()} processes"
            doc["by_devices"][str(n)] = {"strategy": name, "not_predicted": why}
        elif spec.facts.layouts is None:
            doc["by_devices"][str(n)] = predicted_or_why(measured, n, given, data)
        else:  # every way to lay n devices out, each its own row (`layout`)
            rows = {}
            for options in spec.facts.layouts(spec.options, n):
                laid_out = replace(spec, options=options)
                dims = laid_out.dims(n)
                reused = preset_row(cfg, laid_out, dims, n, done)
                if reused is not None:
                    rows[dims.describe()] = reused
                    continue
                at = Measurements(laid_out, device, cfg.predict.time_s)
                row = predicted_or_why(at, n, given, data)
                unchecked = layout_unchecked(name, dims.used)
                if unchecked is not None:  # the strategy's band is its checked layouts'
                    row = {**row, "band": None, "checked": unchecked}
                rows[dims.describe()] = row
            doc["by_devices"][str(n)] = {"strategy": name, "layouts": rows}
    return doc


def preset_row(
    cfg: Config, spec: RunSpec[Any], dims: ParallelDims, n: int, done: Mapping[str, dict[str, Any]]
) -> dict[str, Any] | None:
    """The row at n of the preset whose run this layout builds (StrategyFacts.preset_of),
    where this process predicted the preset already: the same code on the same mesh with the
    same settings and facts, so its measurement is the layout's; None: measure the layout.
    Only documents made here count: a DVC stage depends on no other stage's prediction."""
    preset = spec.facts.preset_of(spec.options, dims) if spec.facts.preset_of else None
    if preset is None or preset[0] not in done:
        return None
    name, keys = preset
    other = resolve_run(cfg, name)
    facts = (other.facts.cuda_graphs, other.facts.sharded_parameters)
    same = (
        other.dims(n) == dims
        and all(getattr(other.options, key) == value for key, value in keys.items())
        and facts == (spec.facts.cuda_graphs, spec.facts.sharded_parameters)
    )
    row = done[name].get("by_devices", {}).get(str(n))
    if not same or row is None or "not_predicted" in row or "band" not in done[name]:
        return None
    why = f"{name}'s run on the same mesh, predicted once: {done[name]['checked']}"
    return {**row, "strategy": spec.name, "band": done[name]["band"], "checked": why}


def predicted_or_why(measured: Measurements, n: int, link: Link, data: DataSize) -> dict[str, Any]:
    try:
        return predict(measured, n, link, data).to_json()
    except UserError as err:  # e.g. more pipeline stages than devices
        return {"strategy": measured.spec.name, "not_predicted": str(err)}
