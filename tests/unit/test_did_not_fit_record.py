"""A run out of device memory, as a record (pipeline/did_not_fit.py): its one line, the keys
that would make it fit for each kind of strategy, the outputs DVC expects, saying nothing
untrue, and readers that tell it from a run's summary; the fault that injects it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipeline import results
from pipeline.did_not_fit import DidNotFit, how_to_fit, read_did_not_fit, write_did_not_fit
from pipeline.errors import UserError
from pipeline.interrupts.faults import Fault, hooks_from_env, parse_fault
from pipeline.reporting import unfit

RECORD = DidNotFit(
    strategy="dp",
    devices=["cuda:0", "cuda:1"],
    batch_split=[128, 128],
    failed_on="gpu_0",
    peak_mib={"gpu_0": 80512.0, "gpu_1": 41000.0},
    epoch=1,
    error="CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity ...",
    fix=how_to_fit("dp", 256, 1, sharded=False),
    epochs_done=0,
)


def test_the_line_says_where_at_what_batch_from_what_peak_and_how_to_fit():
    assert RECORD.line() == (
        "did not fit: out of memory on gpu_0 in epoch 1, at a per-device batch of 128+128, "
        "80512 MiB at its peak; to fit, lower train.batch_size (256 now), raise "
        "train.grad_accum (1 now), or use a strategy that shards the model (fsdp)"
    )


@pytest.mark.parametrize(
    ("strategy", "sharded", "keys"),
    [
        ("single", False, ["train.batch_size", "train.grad_accum", "(fsdp)"]),
        ("balanced_dp", False, ["train.grad_accum", "balanced_dp.gpu0_bsz", "(fsdp)"]),
        ("fsdp", True, ["train.batch_size", "or raise train.grad_accum"]),
    ],
)
def test_the_keys_to_fit_are_the_strategys(strategy, sharded, keys):
    fix = how_to_fit(strategy, 256, 2, sharded)
    assert fix.startswith("to fit, lower train.batch_size (256 now)")
    assert all(k in fix for k in keys)
    assert ("fsdp" in fix) != sharded and ("gpu0_bsz" in fix) == (strategy == "balanced_dp")


def test_its_outputs_are_every_one_dvc_expects_and_claim_nothing(tmp_path):
    write_did_not_fit(RECORD, [], "train: {}\n", tmp_path)
    out = tmp_path / "dp"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [results.MODEL, results.HISTORY, results.CONFIG, results.METRICS, results.SUMMARY]
    )
    assert torch.load(out / results.MODEL) == {}  # no weights: loading it fails loudly
    metrics = json.loads((out / results.METRICS).read_text())
    assert metrics["did_not_fit"] and metrics["test_acc"] is None
    assert read_did_not_fit("dp", tmp_path) == RECORD
    with pytest.raises(UserError, match="dp did not fit its device's memory"):
        results.read_summary("dp", tmp_path)
    assert read_did_not_fit("single", tmp_path) is None  # no results at all


def test_the_reports_section_lists_it_apart():
    md = unfit.markdown([RECORD])
    assert md.startswith("## Did not fit\n")
    assert "| dp | 128+128 | gpu_0 | 80512 | 1 | lower train.batch_size (256 now)" in md
    assert unfit.markdown([]) == "" and unfit.html_section([]) == ""


def test_the_answer_says_it_beside_the_picks():
    from dataclasses import replace

    from pipeline.reporting import answer, table
    from support import finished_run

    summary, history = finished_run("single", [3, 2, 2])
    rows = table.comparison_rows([summary], {"single": history}, None)
    answered = replace(answer.recommend(rows, None), unfit=(("dp", RECORD.line()),))
    md = answer.markdown(answered)
    assert f"- **Did not fit: dp**\n  - {RECORD.line()}\n" in md
    assert "<b>Did not fit:</b>" in answer.html_section(answered)
    assert all(len(line) <= 100 for line in answer.text(answered, width=100).splitlines())
    assert all("dp" not in r.strategies for r in answered.recommendations)


def test_the_injected_fault_raises_torchs_out_of_memory_in_its_strategys_stage_alone():
    fault = parse_fault("rank=0,epoch=2,step=3,action=oom,strategy=dp")
    assert fault == Fault(rank=0, epoch=2, step=3, action="oom", strategy="dp")
    env = {"PARALLEL_LAB_FAULT": "rank=0,epoch=2,step=3,action=oom,strategy=dp"}
    hooks_from_env(0, lambda: False, "single", env).at("step", 2, 3)  # another stage: nothing
    with pytest.raises(torch.OutOfMemoryError, match="out of memory before step 3 of epoch 2"):
        hooks_from_env(0, lambda: False, "dp", env).at("step", 2, 3)


def test_the_record_reads_back_from_its_json(tmp_path: Path):
    assert DidNotFit.from_json(json.loads(json.dumps(RECORD.to_json()))) == RECORD


def test_gpu_checks_oversized_run_needs_about_twice_the_gpu():
    from benchmarks.gpu_check import ACTIVATION_BYTES_W64, oversize_width

    width = oversize_width(143_000_000_000, 60_000)  # an H200, every training image
    assert width == 384 and width % 64 == 0
    assert ACTIVATION_BYTES_W64 * 60_000 * width / 64 >= 2 * 143e9 * 0.99
    assert oversize_width(10**6, 60_000) == 128  # never below twice the default width
