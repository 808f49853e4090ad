"""How far the predictions were found from real runs, and where: the band each prediction is
shown with. tests/unit/test_scaling_checked.py holds these figures to the committed JSON, so
they cannot drift from what was measured.

The check (benchmarks/scaling_check.py) predicts ddp, fsdp and pipeline_parallel at 2
processes on a 2-core CPU from 1-process profiles and the gloo link measured there, then runs
each for real: the band is the largest |predicted / measured - 1| over its rounds, rounded up
to the next percent. It checks the CPU's model (nothing overlaps). A GPU's (DDP's buckets
behind the backward, FSDP's prefetch, NVLink) has had no real multi-GPU run to check it: its
figures say "unchecked on GPUs"."""

from __future__ import annotations

CHECKED_BY = "benchmarks/results/cpu2-amd-epyc-scaling-check-2026-11-27.json"
# strategy -> the largest |error| of its rounds (a fraction)
BAND = {"single": 0.18, "ddp": 0.34, "fsdp": 0.26, "pipeline_parallel": 0.05}
UNCHECKED_ON_GPUS = "unchecked on GPUs: no multi-GPU run has checked the overlap model yet"


def band_text(strategy: str, on_gpu: bool) -> str:
    """The error band a strategy's prediction is shown with, and how it was checked."""
    if strategy not in BAND:
        return "no band: not checked against a real run"
    checked = f"±{BAND[strategy]:.0%} on 2 CPU processes ({CHECKED_BY})"
    return f"{checked}; {UNCHECKED_ON_GPUS}" if on_gpu else checked
