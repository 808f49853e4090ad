"""What the N-device prediction measures of the real code (pipeline/scaling/profile.py) and
what it writes (stage.py, the predict command): each rank's traffic is what the strategy
really sends, the pipeline's boundaries are the model's, every figure is called predicted,
and the error bands are the committed check's."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

from pipeline.config import load_config
from pipeline.parallel_dims import ParallelDims
from pipeline.reporting.predicted import combine, text
from pipeline.resnet import block_flops, build_model
from pipeline.run_spec import resolve_run
from pipeline.scaling import checked
from pipeline.scaling.checked import not_predicted_document
from pipeline.scaling.prediction import REPLICAS_ON_A_CPU
from pipeline.scaling.profile import measure_data_pipeline, measure_rank, measure_stages
from pipeline.scaling.stage import predict_strategy, the_link
from pipeline.scaling.step_time import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from pipeline.strategies.pipeline_parallel import split_points
from support import REPO

CPU = torch.device("cpu")
# What these tests check is what the steps send and weigh, not how long they take: the
# fewest steps the profile's timing takes.
FEW = 1e-6
TINY = ["model.width=4", "train.batch_size=32", "train.precision=fp32"]


def spec(name: str, *more: str):
    return resolve_run(load_config(None, [*TINY, *more]), name)


def gradient_bytes(width: int) -> int:
    return sum(p.numel() * p.element_size() for p in build_model(width, 0).parameters())


@pytest.mark.parametrize("world", [2, 4])
def test_a_ddp_rank_all_reduces_every_gradient_once_a_step(world):
    profile = measure_rank(spec("ddp", "ddp.sync_bn=false"), world, CPU, FEW)
    reduced = [c for c in profile.traffic.calls if c.kind == ALL_REDUCE]
    assert sum(c.size for c in reduced) == gradient_bytes(4)
    assert all(c.overlappable for c in reduced)
    assert profile.per_rank_batch == 32 // world and profile.step_s > 0


def test_sync_batchnorm_statistics_block_the_step():
    calls = measure_rank(spec("ddp", "ddp.sync_bn=true"), 2, CPU, FEW).traffic.calls
    blocking = [c for c in calls if not c.overlappable]
    assert blocking and all(c.kind == ALL_GATHER for c in blocking)


def test_an_fsdp_rank_gathers_and_scatters_what_it_shards():
    """Each unit's parameters are gathered whole (before forward, again before backward
    where it was freed), and its gradients reduce-scattered whole: the model's bytes, once."""
    profile = measure_rank(spec("fsdp", "fsdp.sync_bn=false"), 2, CPU, FEW)
    calls = profile.traffic.calls
    scattered = sum(c.size for c in calls if c.kind == REDUCE_SCATTER)
    gathered = sum(c.size for c in calls if c.kind == ALL_GATHER)
    assert scattered == gradient_bytes(4)
    assert gradient_bytes(4) < gathered <= 2 * gradient_bytes(4)


def test_fsdps_last_rank_is_measured_apart_and_ddps_ranks_are_alike():
    """Where the shards do not divide evenly the last rank's is the smaller: both measured;
    DDP's ranks all hold the whole model: rank 0 speaks for them."""
    fsdp = measure_rank(spec("fsdp"), 2, CPU, FEW).memory
    assert [m.rank for m in fsdp] == [0, 1]
    assert all(m.allocator is None and m.tensors["Activation"] > 0 for m in fsdp)
    assert [m.rank for m in measure_rank(spec("ddp"), 2, CPU, FEW).memory] == [0]


def test_a_pipelines_stages_are_the_strategys_split_and_send_the_cut_activations():
    run = spec(
        "pipeline_parallel", "pipeline_parallel.stages=3", "pipeline_parallel.microbatches=2"
    )
    profile = measure_stages(run, CPU, FEW)
    model = build_model(4, 0)
    bounds = split_points(block_flops(model), 3)
    x = torch.zeros(profile.micro_batch, 1, 28, 28)
    sizes = []
    for first, end in zip(bounds, bounds[1:-1]):
        x = model[first:end](x)
        sizes.append(x.numel() * x.element_size())
    assert profile.micro_batch == 16 and len(profile.stage_s) == 3
    assert profile.boundary_bytes == sizes
    assert all(s > 0 for s in profile.stage_s) and profile.optimizer_s > 0


def test_a_data_x_pipeline_layouts_stages_send_the_cut_and_reduce_their_own_gradients():
    """hybrid data 2 x pipeline 2, as data rank 0's two stage ranks step it under the fake
    process group: stage 0 sends its micro-batches' activations (16 samples a data rank, 2
    pipeline micro-batches of 8), and the largest all-reduce is a stage's own gradients."""
    run = spec(
        "hybrid", "hybrid.data=2", "hybrid.pipeline=2", "hybrid.channel=1", "hybrid.microbatches=2"
    )
    profile = measure_data_pipeline(run, ParallelDims(replicate=2, pipeline=2), CPU, FEW)
    model = build_model(4, 0)
    cut = split_points(block_flops(model), 2)[1]
    x = model[:cut](torch.zeros(8, 1, 28, 28))
    assert profile.microbatches == 2
    assert profile.boundary_bytes == [x.numel() * x.element_size()]
    stage_bytes = [
        sum(p.numel() * p.element_size() for p in blocks.parameters())
        for blocks in (model[:cut], model[cut:])
    ]
    assert profile.reduce_bytes == max(stage_bytes)
    assert [m.rank for m in profile.memory] == [0, 1]
    assert all(s > 0 for s in profile.stage_s) and profile.optimizer_s > 0


def test_every_figure_of_the_documents_is_a_prediction_with_its_band(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no fetched data here: an epoch of the full set
    cores = os.cpu_count() or 1
    cfg = load_config(
        None, [*TINY, f"predict.gpus=[2,{cores + 1}]", "predict.link=12", f"predict.time_s={FEW}"]
    )
    link = the_link(cfg, CPU)
    assert link.busbw == 12e9
    names = ("single", "ddp", "dp")
    docs = {name: predict_strategy(cfg, name, CPU, lambda: link) for name in names}
    assert all(doc["kind"] == "predicted" for doc in docs.values())
    assert docs["single"]["baseline_step_s"] > 0 and docs["single"]["by_devices"] == {}
    # DataParallel on a CPU: its memory predicted, its time not, and why; no band
    dp = docs["dp"]["by_devices"]["2"]
    assert dp["time_not_predicted"] == REPLICAS_ON_A_CPU and "predicted_epoch_s" not in dp
    assert set(dp["predicted_peak_mib"]) == {"0", "1"} and docs["dp"]["band"] is None
    row = docs["ddp"]["by_devices"]["2"]
    figures = {"step_s", "epoch_s", "samples_per_s"}
    assert {f"predicted_{f}" for f in figures} <= set(row) and not figures & set(row)
    assert row["steps_per_epoch"] == 60000 // 32  # the full set: nothing fetched here
    # timed for FEW seconds, shorter than any check: shown with no band, and why
    assert docs["ddp"]["band"] is None and "shorter than any check" in docs["ddp"]["checked"]
    # more processes than cores: said why, not predicted
    assert "at most" in docs["ddp"]["by_devices"][str(cores + 1)]["not_predicted"]
    shown = combine(docs)
    assert shown["single_step_s"] == docs["single"]["baseline_step_s"]
    speedup = shown["by_devices"]["2"]["ddp"]["predicted_speedup"]
    assert speedup == pytest.approx(shown["single_step_s"] / row["predicted_step_s"])
    words = text(shown)
    # the per-device peak: rank 0's step at its peak (MemTracker on a CPU) and the data
    data = (60000 + 10000) * (28 * 28 + 8) / 2**20  # the full sets: nothing fetched here
    assert row["resident_data_mib"] == pytest.approx(data)
    step = row["predicted_step_tensors_mib"]["Total"]
    assert row["predicted_peak_mib"] == {"0": pytest.approx(step + data)}
    assert row["peak_measured_as"] == "tensors (MemTracker)"
    assert "Peak MiB per device (predicted)" in words and "within 0.3%" in words
    assert shown["by_devices"]["2"]["ddp"]["predicted_peak_mib"] == row["predicted_peak_mib"]
    assert words.startswith("PREDICTED, not measured")
    assert f"dp: {REPLICAS_ON_A_CPU}" in words and "Left out of every prediction" in words
    assert "dp                       2 not predicted on a CPU" in words


def test_the_bands_are_the_committed_checks_largest_errors():
    """Rounded up to the next percent, per timing and strategy, over every round of the checks
    that timed each rank for that long."""
    assert set(checked.BANDS) == set(checked.CHECKED_BY)
    for timing, files in checked.CHECKED_BY.items():
        results = [json.loads((REPO / path).read_text()) for path in files]
        for result in results:
            overrides = result["settings"]["overrides"]
            timed = [float(o.split("=")[1]) for o in overrides if o.startswith("predict.time_s=")]
            assert (timed or [2.0])[-1] == timing, files  # 2: params.yaml's, unless overridden
        for name, band in checked.BANDS[timing].items():
            # a strategy checked layout by layout (hybrid) is "name (layout)" in its rounds
            errors = [
                abs(row["error"])
                for res in results
                for r in res["rounds"]
                for label, row in r["strategies"].items()
                if label == name or label.startswith(f"{name} (")
            ]
            assert band == math.ceil(max(errors) * 100) / 100, (timing, name)
        assert {"single", "ddp", "fsdp", "pipeline_parallel"} <= set(checked.BANDS[timing])
    assert {"channel_parallel", "hybrid"} <= set(checked.BANDS[2.0])  # their own check


def test_a_prediction_gets_the_bands_of_the_longest_checked_timing_within_its_own():
    assert checked.band("ddp", 2.0) == checked.BANDS[2.0]["ddp"]
    assert checked.band("ddp", 10.0) == checked.BANDS[2.0]["ddp"]  # timed longer than checked
    assert checked.band("ddp", 1.0) == checked.BANDS[0.5]["ddp"]
    assert checked.band("ddp", 0.5) == checked.BANDS[0.5]["ddp"] > checked.BANDS[2.0]["ddp"]
    assert checked.band("ddp", 0.4) is None and checked.band("dp", 2.0) is None
    assert checked.band_text("ddp", False, 0.5).startswith(
        "±39% on 2 CPU processes, each rank timed for 0.5 s (benchmarks/results/scaling-check/"
    )
    assert checked.band_text("ddp", False, 0.4) == (
        "no band: each rank timed for 0.4 s, shorter than any check (0.5 s and longer; "
        "predict.time_s)"
    )
    assert checked.band_text("dp", True, 2.0) == "no band: not checked against a real run"
    assert checked.band_text("fsdp", True, 2.0).endswith(checked.UNCHECKED_ON_GPUS)


def test_a_bad_link_is_refused_in_one_line_naming_the_key(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.predict", "predict.link=warp-drive", *TINY],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "predict.link" in line and "nvlink-h100" in line


def test_this_machines_gloo_link_is_measured_between_two_processes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no link kept (.cache/links.json) from an earlier run
    link = the_link(load_config(None, [*TINY, "predict.link=auto"]), CPU)
    assert link.busbw > 0 and link.latency_s > 0
    assert link.source.startswith("measured") and "gloo" in link.name


def test_no_n_asked_for_is_said_in_a_fraction_of_a_second(tmp_path):
    """predict.gpus: [] writes each strategy's document saying so, without loading torch."""
    shutil.copy(REPO / "params.yaml", tmp_path)
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pipeline.predict", "predict.gpus=[]"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert not [line for line in proc.stderr.splitlines() if line.endswith("| torch")]
    doc = json.loads((tmp_path / "predictions/ddp.json").read_text())
    assert doc == not_predicted_document("ddp", checked.NONE_ASKED)


def test_the_memory_bands_words_hold_the_committed_check():
    """The report's "within 0.3%" is the committed memory check's worst rank, rounded up."""
    result = json.loads(
        (REPO / "benchmarks/results/cpu2-amd-epyc-memory-check-2026-11-28.json").read_text()
    )
    assert result["within_goal"] and result["worst_error"] <= 0.003
    assert math.ceil(result["worst_error"] * 1000) / 10 == 0.3


@pytest.mark.parametrize("name", ["all_gather_single", "all_gather_into_tensor"])
def test_syncbatchnorms_gather_into_one_row_passes_the_fake_group(name):
    """torch's SyncBatchNorm gathers (2C + 1) statistics per rank into a (1, world * (2C + 1))
    tensor: the fake group refused that shape on the H200 (predict@ddp, sync_bn), and the
    prediction now hands it the same memory flat, as NCCL reads it."""
    from pipeline.scaling.profile import fake_world

    stats = torch.arange(17.0)
    torchs = getattr(torch.distributed, name)
    with fake_world(2, CPU):
        gather = getattr(torch.distributed, name)
        row = torch.empty(1, 34)
        gather(row, stats)
        assert torch.equal(row, torch.cat([stats, stats])[None])  # every rank alike
        with pytest.raises(RuntimeError, match="must match"):  # what the fake group does
            torchs(torch.empty(1, 34), stats)
    assert getattr(torch.distributed, name) is torchs  # put back


def test_a_hybrid_layout_its_checks_never_ran_is_shown_without_their_band():
    """hybrid's band is the worst of the layouts its check ran; a layout using another mesh
    dimension (data x pipeline) was never run against its prediction, so has none."""
    labels = {
        label.removeprefix("hybrid (").removesuffix(")")
        for path in checked.CHECKED_BY[2.0]
        for r in json.loads((REPO / path).read_text())["rounds"]
        for label in r["strategies"]
        if label.startswith("hybrid (")
    }
    ran = {part.split()[0] for label in labels for part in label.split(" x ")}
    assert ran == checked.CHECKED_DIMENSIONS["hybrid"] == {"replicate", "channel"}
    assert checked.layout_unchecked("hybrid", ("replicate", "channel")) is None
    assert checked.layout_unchecked("hybrid", ("channel",)) is None
    assert checked.layout_unchecked("ddp", ("replicate",)) is None  # not laid out
    assert checked.layout_unchecked("hybrid", ("replicate", "pipeline")) == (
        "no band: hybrid's checks ran channel and replicate layouts, not replicate x pipeline"
    )
    row = {"predicted_step_s": 0.1, "band": None, "checked": "no band: ..."}
    doc = {"band": 0.33, "checked": "±33% ...", "by_devices": {"4": {"layouts": {"x": row}}}}
    shown = combine(
        {
            "hybrid": {
                **doc,
                "kind": "predicted",
                "strategy": "hybrid",
                "settings": {},
                "measured_on": "",
                "device": "cpu",
                "link": {},
                "leaves_out": [],
            }
        }
    )
    assert shown["by_devices"]["4"]["hybrid (x)"]["band"] is None  # the layout's own
