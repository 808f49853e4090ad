"""Which strategies are predicted, how far the predictions were found from real runs, and
where: the band each prediction is shown with. tests/unit/test_scaling_profile.py holds these
figures to the committed JSON, so they cannot drift from what was measured.

The check (benchmarks/scaling_check.py) predicts ddp, fsdp and pipeline_parallel at 2
processes on a 2-core CPU by the predict stage's own work, then runs each for real: the band
is the largest |predicted / measured - 1| over its rounds, rounded up to the next percent
(single's: its baseline against its own stage). It checks the CPU's model (nothing overlaps).
A GPU's (DDP's buckets behind the backward, FSDP's prefetch, NVLink) has had no real
multi-GPU run to check it: its figures say "unchecked on GPUs".

The error grows as each rank's steps are timed for less: the checks at params.yaml's
`predict.time_s: 2` found at most 34% (ddp), those at `make quick`'s 0.5 up to 42% (fsdp). Each
timing that was checked has its own bands, and a prediction is shown with those of the
longest checked timing not longer than its own (a shorter one than any checked: no band)."""

from __future__ import annotations

from typing import Any, Optional

from pipeline.results import PREDICTED

# predict.time_s -> the checks' JSON files that timed each rank's steps for that long
CHECKED_BY = {
    2.0: (
        "benchmarks/results/cpu2-amd-epyc-scaling-check-2026-11-27.json",
        # channel_parallel and hybrid (at both its layouts of 2), 2026-12-02, idle
        "benchmarks/results/scaling-check/cpu2-amd-epyc-mesh-2026-12-02.json",
    ),
    0.5: (
        "benchmarks/results/scaling-check/cpu2-amd-epyc-time-0.5s-2026-11-27.json",
        "benchmarks/results/scaling-check/cpu2-amd-epyc-quickstart-2026-11-28.json",
    ),
}
# predict.time_s -> strategy -> the largest |error| over every round of its checks (a
# fraction). dp and balanced_dp have none: DataParallel runs unsplit on a CPU, and no real
# multi-GPU run has checked them
BANDS = {
    2.0: {
        "single": 0.18,
        "ddp": 0.34,
        "fsdp": 0.26,
        "pipeline_parallel": 0.05,
        # a hybrid's band is the largest over every layout its check ran
        "channel_parallel": 0.20,
        "hybrid": 0.33,
    },
    0.5: {"single": 0.13, "ddp": 0.39, "fsdp": 0.42, "pipeline_parallel": 0.07},
}
# a strategy predicted layout by layout (a hybrid): the mesh dimensions its checks' layouts
# used. A layout using another (data x pipeline, FSDP x channel) was never run against its
# prediction, so the strategy's band does not cover it
CHECKED_DIMENSIONS = {"hybrid": frozenset({"replicate", "channel"})}
UNCHECKED_ON_GPUS = "unchecked on GPUs: no multi-GPU run has checked the overlap model yet"


def checked_timing(time_s: float) -> Optional[float]:
    """The longest timing the checks ran at that is not longer than `time_s` (None: shorter
    than every check): a rank timed longer is measured at least as steadily."""
    return max((t for t in BANDS if t <= time_s), default=None)


def band(strategy: str, time_s: float) -> Optional[float]:
    """The error band of `strategy`'s prediction timed for `time_s` (None: none checked)."""
    timing = checked_timing(time_s)
    return None if timing is None else BANDS[timing].get(strategy)


def band_text(strategy: str, on_gpu: bool, time_s: float) -> str:
    """The error band a strategy's prediction is shown with, and how it was checked."""
    timing = checked_timing(time_s)
    if timing is None:
        return (
            f"no band: each rank timed for {time_s:g} s, shorter than any check "
            f"({min(BANDS):g} s and longer; predict.time_s)"
        )
    if strategy not in BANDS[timing]:
        return "no band: not checked against a real run"
    files = ", ".join(CHECKED_BY[timing])  # every check of that timing, whichever held it
    checked = (
        f"±{BANDS[timing][strategy]:.0%} on 2 CPU processes, each rank timed for "
        f"{timing:g} s ({files})"
    )
    return f"{checked}; {UNCHECKED_ON_GPUS}" if on_gpu else checked


def layout_unchecked(strategy: str, used: tuple[str, ...]) -> Optional[str]:
    """Why a layout using the mesh dimensions `used` has no band though its strategy has one
    (None: the strategy's band holds for it)."""
    checked = CHECKED_DIMENSIONS.get(strategy)
    if checked is None or set(used) <= checked:
        return None
    return (
        f"no band: {strategy}'s checks ran {' and '.join(sorted(checked))} layouts, not "
        f"{' x '.join(used)}"
    )


NONE_ASKED = "not predicted: predict.gpus is empty"


def not_predicted_document(name: str, why: str) -> dict[str, Any]:
    """The document of a strategy not predicted: why not."""
    return {"kind": PREDICTED, "strategy": name, "not_predicted": why}
