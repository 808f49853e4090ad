"""benchmarks/choose_defaults.py: the choice of each strategy's `train.cuda_graph` from its
rows (the fastest setting that applied and trained alike), the ratios to single, the lines
for speed_defaults.py, and one tiny real run on the CPU, where no capture applies."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.choose_defaults import LOSS_BOUND, choose, ratios, settings_of, speed_default_lines
from support import REPO


def row(strategy: str, setting: str, epoch_s: float, loss: float, applied: bool = True) -> dict:
    return {
        "strategy": strategy,
        "setting": setting,
        "applied": applied,
        "epoch_s": epoch_s,
        "last_loss": loss,
    }


def test_the_fastest_setting_that_applied_and_trained_alike_is_chosen():
    rows = {
        "single/none": row("single", "none", 2.0, 0.50),
        "single/step": row("single", "step", 1.0, 0.52),  # faster, trained alike: chosen
        "ddp/none": row("ddp", "none", 2.4, 0.50),
        "ddp/step": row("ddp", "step", 1.1, 2.30),  # faster, but did not train: not chosen
        "dp/none": row("dp", "none", 2.1, 0.50),
        "dp/step": row("dp", "step", 1.0, 0.50, applied=False),  # ran eagerly: not a choice
    }
    chosen = choose(rows)
    assert {name: c["cuda_graph"] for name, c in chosen.items()} == {
        "single": "step",
        "ddp": "none",
        "dp": "none",
    }
    assert chosen["single"] == {"cuda_graph": "step", "epoch_s": 1.0, "eager_epoch_s": 2.0}
    assert ratios(chosen) == pytest.approx({"ddp": 2.4, "dp": 2.1})


def test_the_loss_bound_decides_at_its_edge():
    for delta, alike in ((LOSS_BOUND * 0.99, True), (LOSS_BOUND * 1.01, False)):
        rows = {
            "s/none": row("single", "none", 2.0, 1.0),
            "s/step": row("single", "step", 1.0, 1.0 + delta),
        }
        assert choose(rows)["single"]["cuda_graph"] == ("step" if alike else "none")


def test_a_strategy_whose_eager_row_failed_gets_no_choice_and_no_ratio():
    chosen = choose({"ddp/step": row("ddp", "step", 1.0, 0.5)})
    assert chosen == {} and ratios(chosen) == {}


def test_only_strategies_that_take_graphs_are_measured_captured():
    assert settings_of("single") == ("none", "step")
    assert settings_of("fsdp") == ("none",) and settings_of("pipeline_parallel") == ("none",)


def test_the_lines_for_speed_defaults_say_where_and_what_was_measured():
    chosen = {"ddp": {"cuda_graph": "step", "epoch_s": 1.234, "eager_epoch_s": 2.5}}
    (line,) = speed_default_lines(chosen, "NVIDIA H200", "2026-12-01", 20000, {})
    assert line == (
        '    "ddp": Chosen("step", "NVIDIA H200: steady epoch of 20000 images 1.23 vs 2.5 s '
        'eager (benchmarks/choose_defaults.py, 2026-12-01)"),'
    )


def test_an_eager_choice_says_why_it_is_eager():
    eager = {"epoch_s": 2.0, "eager_epoch_s": 2.0, "cuda_graph": "none"}
    chosen = {name: eager for name in ("fsdp", "ddp", "single")}
    failed = {"ddp/step": "AcceleratorError: CUDA error: operation failed during capture"}
    lines = speed_default_lines(chosen, "H200", "2026-12-01", 100, failed)
    assert [line.split("; ")[1].split(" (bench")[0] for line in lines] == [
        "it takes no CUDA graphs",
        "capturing its step failed (AcceleratorError)",
        "captured, no faster or not alike",
    ]


def test_on_the_cpu_every_row_runs_eagerly_and_eager_is_chosen(tmp_path):
    out = tmp_path / "choose.json"
    subprocess.run(
        [sys.executable, "-m", "benchmarks.choose_defaults", "--strategies", "single", "ddp"]
        + ["--set", "model.width=4", "--limit-train", "512", "--epochs", "1", "--out", str(out)],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    result = json.loads(out.read_text())
    assert sorted(result["rows"]) == ["ddp/none", "ddp/step", "single/none", "single/step"]
    assert [r["applied"] for r in result["rows"].values() if r["setting"] == "step"] == [False] * 2
    assert {name: c["cuda_graph"] for name, c in result["chosen"].items()} == {
        "single": "none",
        "ddp": "none",
    }
    assert set(result["x_single"]) == {"ddp"} and result["speed_defaults"] == []
