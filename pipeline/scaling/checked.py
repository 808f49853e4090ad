"""Which strategies are predicted, how far the predictions were found from real runs, and
where: the band each prediction is shown with. tests/unit/test_scaling_profile.py holds these
figures to the committed JSON, so they cannot drift from what was measured.

The check (benchmarks/scaling_check.py) predicts ddp, fsdp and pipeline_parallel at 2
processes on a 2-core CPU by the predict stage's own work, then runs each for real: the band
is the largest |predicted / measured - 1| over its rounds, rounded up to the next percent
(single's: its baseline against its own stage). It checks the CPU's model (nothing overlaps).
A GPU's (DDP's buckets behind the backward, FSDP's prefetch, NVLink) has had no real
multi-GPU run to check it: its figures say "unchecked on GPUs"."""

from __future__ import annotations

from typing import Any

from pipeline.results import PREDICTED

CHECKED_BY = "benchmarks/results/cpu2-amd-epyc-scaling-check-2026-11-27.json"
# strategy -> the largest |error| of its rounds (a fraction). dp and balanced_dp have none:
# DataParallel runs unsplit on a CPU, and no real multi-GPU run has checked them
BAND = {"single": 0.18, "ddp": 0.34, "fsdp": 0.26, "pipeline_parallel": 0.05}
UNCHECKED_ON_GPUS = "unchecked on GPUs: no multi-GPU run has checked the overlap model yet"


def band_text(strategy: str, on_gpu: bool) -> str:
    """The error band a strategy's prediction is shown with, and how it was checked."""
    if strategy not in BAND:
        return "no band: not checked against a real run"
    checked = f"±{BAND[strategy]:.0%} on 2 CPU processes ({CHECKED_BY})"
    return f"{checked}; {UNCHECKED_ON_GPUS}" if on_gpu else checked


NONE_ASKED = "not predicted: predict.gpus is empty"


def not_predicted_document(name: str, why: str) -> dict[str, Any]:
    """The document of a strategy not predicted: why not."""
    return {"kind": PREDICTED, "strategy": name, "not_predicted": why}
