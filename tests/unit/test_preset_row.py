"""A hybrid's layout that is a preset's run (the same mesh, settings and facts) reuses the
preset's row where the same predict process predicted it, and is measured otherwise
(scaling/stage.py `preset_row`). No process starts: the rows are documents."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from pipeline.config import load_config
from pipeline.parallel_dims import ParallelDims
from pipeline.run_spec import resolve_run
from pipeline.scaling.stage import preset_row

ROW = {"strategy": "x", "devices_used": 2, "predicted_step_s": 0.5}


def document(name: str, n: int = 2) -> dict[str, Any]:
    return {
        "strategy": name,
        "band": 0.2,
        "checked": f"{name}'s check",
        "by_devices": {str(n): {**ROW, "strategy": name}},
    }


def layout_row(overrides: list[str], layout: dict[str, int], done: list[str]) -> Any:
    cfg = load_config(None, overrides)
    spec = resolve_run(cfg, "hybrid")
    laid = replace(spec, options=replace(spec.options, **layout))
    n = math.prod(layout.values())  # the layout's own world
    return preset_row(cfg, laid, laid.dims(n), n, {name: document(name, n) for name in done})


CHANNEL = {"data": 1, "shard": 1, "channel": 2, "pipeline": 1}
SHARD = {"data": 1, "shard": 2, "channel": 1, "pipeline": 1}


def test_a_channel_layout_is_channel_parallels_row_with_its_band() -> None:
    row = layout_row([], CHANNEL, ["channel_parallel"])
    assert row == {
        **ROW,
        "strategy": "hybrid",
        "band": 0.2,
        "checked": "channel_parallel's run on the same mesh, predicted once: "
        "channel_parallel's check",
    }


def test_a_shard_layout_is_fsdps_where_their_settings_agree() -> None:
    fsdp = ["fsdp.sync_bn=true", "hybrid.sync_bn=true", "fsdp.mixed_precision=none"]
    assert layout_row(fsdp, SHARD, ["fsdp"])["strategy"] == "hybrid"


@pytest.mark.parametrize(
    "overrides, layout, done",
    [
        ([], CHANNEL, []),  # the preset not predicted in this process: measured
        ([], CHANNEL, ["fsdp"]),
        (["fsdp.sync_bn=false", "hybrid.sync_bn=true"], SHARD, ["fsdp"]),
        (["fsdp.mixed_precision=bf16"], SHARD, ["fsdp"]),
        # replicas alone are ddp's mesh, but ddp's run may take CUDA graphs: not a preset
        ([], {"data": 2, "shard": 1, "channel": 1, "pipeline": 1}, ["ddp"]),
        ([], {"data": 2, "shard": 1, "channel": 2, "pipeline": 1}, ["channel_parallel"]),
    ],
    ids=["not_predicted", "other_preset", "sync_bn_differs", "mixed_precision", "ddp", "2d"],
)
def test_any_other_layout_is_measured(overrides: list[str], layout: dict[str, int], done) -> None:
    assert layout_row(overrides, layout, done) is None


def test_a_preset_not_predicted_at_n_is_measured() -> None:
    cfg = load_config(None, [])
    spec = resolve_run(cfg, "hybrid")
    laid = replace(spec, options=replace(spec.options, **CHANNEL))
    why = {**document("channel_parallel"), "by_devices": {"2": {"not_predicted": "cores"}}}
    assert preset_row(cfg, laid, ParallelDims(channel=2), 2, {"channel_parallel": why}) is None
