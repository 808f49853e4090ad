"""`balanced_dp.gpu0_bsz: auto` (pipeline/strategies/gpu0_autotune.py) on CPU: the pure chooser
exhaustively, the measuring loop's bookkeeping with a tiny model, the CPU/one-GPU resolution,
and what balanced_dp leaves to its `at_start` (tests/unit/test_tuning.py: once per run, kept on a
resume; tests/e2e/test_cli_options.py: a real run, restarted).

The profiling itself (CUDA timing and per-device peaks of a scattered batch) needs >=2 GPUs.
"""

from contextlib import nullcontext

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pipeline.batch_plan import BatchPlan
from pipeline.config import Config
from pipeline.context import DistContext
from pipeline.strategies import balanced_dp
from pipeline.strategies import gpu0_autotune as autotune
from pipeline.strategies.base import LoopForward, decided_params
from pipeline.strategies.gpu0_autotune import (
    CHOSEN_KEY,
    Measurement,
    Probe,
    candidates,
    choose_gpu0_bsz,
    evidence,
    measure,
    resolve_gpu0_bsz,
)
from support import parallelize, strategy_nproc

# the loop's forward uncompiled, in the model's dtype, NCHW: as on the CPU by default
EAGER = LoopForward(
    prepare=lambda forward: forward,
    autocast=nullcontext,
    channels_last=False,
    new_graph_step=lambda: None,
)


def m(gpu0_bsz, samples_per_s, *peaks, error=None):
    return Measurement(gpu0_bsz, samples_per_s, tuple(peaks), error)


@pytest.fixture(autouse=True)
def no_cuda_in_this_process(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize(
    "micro, n_devices, expected",
    [
        (64, 2, [32, 24, 16, 8, 0]),
        (64, 4, [16, 12, 8, 4, 0]),
        (10, 3, [4, 3, 2, 1, 0]),
        (3, 2, [2, 1, 0]),
        (1, 4, [1, 0]),
        (8, 1, [8, 6, 4, 2, 0]),
    ],
)
def test_candidates_are_fractions_of_the_even_share(micro, n_devices, expected):
    assert candidates(micro, n_devices) == expected


# --- the chooser -------------------------------------------------------------------------


def test_lowest_peak_among_equally_fast_candidates():
    choice, why = choose_gpu0_bsz(
        [m(32, 1000, 900, 700), m(24, 990, 800, 760), m(16, 970, 760, 820), m(0, 960, 600, 950)]
    )
    assert choice == 24  # peaks (max over devices): 900, 800, 820, 950
    assert "800 MiB" in why and "1000 samples/s" in why


def test_all_equal_throughput_picks_the_lowest_peak():
    assert (
        choose_gpu0_bsz(
            [m(8, 500, 1000, 400), m(6, 500, 700, 650), m(4, 500, 600, 720), m(0, 500, 300, 900)]
        )[0]
        == 6
    )


def test_throughput_collapse_excludes_a_leaner_candidate():
    choice, why = choose_gpu0_bsz([m(8, 1000, 900, 800), m(4, 1000, 850, 840), m(0, 500, 200, 700)])
    assert choice == 4
    assert "gpu0_bsz 0 needed less (700 MiB)" in why and "50% slower" in why


def test_the_tolerance_is_five_percent_inclusive():
    assert choose_gpu0_bsz([m(8, 1000, 900), m(0, 950, 500)])[0] == 0
    assert choose_gpu0_bsz([m(8, 1000, 900), m(0, 949, 500)])[0] == 8


def test_memory_ties_go_to_the_faster_then_the_larger_candidate():
    # 800 and 805 tie (within 1%); the faster wins
    assert choose_gpu0_bsz([m(8, 990, 805), m(4, 1000, 800)])[0] == 4
    assert choose_gpu0_bsz([m(8, 1000, 805), m(4, 990, 800)])[0] == 8
    # an exact tie in both: the larger gpu0_bsz (nearer the even split), in any order
    assert choose_gpu0_bsz([m(4, 1000, 800), m(8, 1000, 800)])[0] == 8
    assert choose_gpu0_bsz([m(8, 1000, 800), m(4, 1000, 800)])[0] == 8


def test_a_single_candidate_is_chosen():
    assert choose_gpu0_bsz([m(5, 10, 123)])[0] == 5


def test_failed_candidates_are_skipped_and_reported():
    choice, why = choose_gpu0_bsz([m(32, 1000, 900, 700), m(0, 0, error="out of memory")])
    assert choice == 32 and "failed: 0 (out of memory)" in why


@pytest.mark.parametrize(
    "measurements",
    [
        [],
        [m(8, 0, error="out of memory"), m(0, 0, error="out of memory")],
        [m(8, 0.0, 100), m(4, float("nan"), 100), m(2, 100)],  # no time, NaN, no peaks
    ],
)
def test_nothing_measured_gives_the_even_split(measurements):
    choice, why = choose_gpu0_bsz(measurements)
    assert choice is None and "even split" in why


@st.composite
def measurement_lists(draw):
    sizes = draw(st.lists(st.integers(0, 64), min_size=1, max_size=6, unique=True))
    return [
        m(size, draw(st.floats(1, 1e4)), *draw(st.lists(st.floats(1, 1e5), min_size=1, max_size=4)))
        for size in sizes
    ]


@settings(max_examples=300, deadline=None)
@given(measurement_lists())
def test_choice_is_fast_enough_and_no_fast_candidate_is_clearly_leaner(ms):
    choice, _ = choose_gpu0_bsz(ms)
    picked = next(x for x in ms if x.gpu0_bsz == choice)
    best = max(x.samples_per_s for x in ms)
    assert picked.samples_per_s >= 0.95 * best
    fast = [x for x in ms if x.samples_per_s >= 0.95 * best]
    assert all(picked.peak <= x.peak * 1.01 for x in fast)
    assert choose_gpu0_bsz(list(reversed(ms)))[0] == choice  # order does not matter


def test_evidence_lists_every_candidate():
    line = evidence([m(8, 1000.4, 900, 700.2), m(0, 0, error="out of memory")])
    assert line == "8: 1000 samples/s, peak 900/700 MiB; 0: out of memory"


# --- measuring and resolving --------------------------------------------------------------


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 26 * 26, 10)
    )


def test_measure_leaves_the_model_and_the_random_streams_untouched():
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.random.get_rng_state()
    wrapped = []
    results = measure(
        model,
        lambda module, size: wrapped.append(size) or module,
        Probe(4, [], passes=2),
        options=[2, 1, 0],
        loop=EAGER,
    )
    assert [r.gpu0_bsz for r in results] == wrapped == [2, 1, 0]
    assert all(r.ok and r.samples_per_s > 0 and len(r.peak_mib) == 1 for r in results)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.random.get_rng_state(), rng)


def test_measure_runs_the_forward_as_the_loop_does():
    """Prepared (compiled, in a run with train.compile) per candidate, on channels_last input
    when the loader's batches are, a graph step marked before each forward."""
    prepared, layouts, steps = [], [], []

    def prepare(forward):
        prepared.append(forward.size)

        def as_the_loop_runs(x):
            layouts.append(x.is_contiguous(memory_format=torch.channels_last))
            return forward(x)

        return as_the_loop_runs

    class Wrapped(nn.Module):
        def __init__(self, module, size):
            super().__init__()
            self.module, self.size = module, size

        def forward(self, x):
            return self.module(x)

    loop = LoopForward(prepare, nullcontext, True, lambda: steps.append(1))
    measure(tiny_model(), Wrapped, Probe(4, [], passes=2), options=[2, 0], loop=loop)
    assert prepared == [2, 0] and layouts == [True] * 6 and len(steps) == 6


@pytest.mark.parametrize(
    "on_cuda, n_gpus, where", [(False, 0, "on the CPU"), (True, 1, "on one GPU")]
)
def test_auto_without_two_gpus_is_the_even_split_without_profiling(
    monkeypatch, on_cuda, n_gpus, where
):
    monkeypatch.setattr(autotune, "measure", lambda *a, **k: pytest.fail("profiled"))
    choice, notes = resolve_gpu0_bsz(
        nn.Linear(2, 2), BatchPlan.make(16, 1), n_gpus, on_cuda, wrap=None, loop=None
    )
    assert choice is None and len(notes) == 1
    assert notes[0].startswith(f"{CHOSEN_KEY}=null") and where in notes[0]


def config(gpu0_bsz, batch_size=32, grad_accum=2) -> Config:
    cfg = Config()
    cfg.train.batch_size, cfg.train.grad_accum = batch_size, grad_accum
    cfg.balanced_dp.gpu0_bsz = gpu0_bsz
    return cfg


def test_nproc_does_not_compare_auto_with_the_micro_batch():
    assert strategy_nproc(balanced_dp.SPEC, config("auto"), 4) == 1


def settled(par):
    """The run as its `at_start` leaves a fresh one: measured, then applied; and the MLflow
    params of what it decided."""
    run, decided = par.at_start(EAGER, None, lambda line: None)
    return run, decided_params(decided)


def test_auto_is_left_to_settle_and_a_set_value_is_not():
    cpu = DistContext(rank=0, local_rank=0, world_size=1, gpus=())
    assert parallelize(balanced_dp.SPEC, nn.Linear(3, 2), config(8), cpu).at_start is None
    par = parallelize(balanced_dp.SPEC, nn.Linear(3, 2), config("auto"), cpu)
    assert par.at_start is not None
    assert not any(note.startswith(CHOSEN_KEY) for note in par.notes)


def test_parallelize_on_cpu_resolves_auto_to_the_even_split():
    cpu = DistContext(rank=0, local_rank=0, world_size=1, gpus=())
    par, params = settled(parallelize(balanced_dp.SPEC, nn.Linear(3, 2), config("auto"), cpu))
    assert par.batch_split == [16] and par.forward.gpu0_bsz is None and par.at_start is None
    assert params == {CHOSEN_KEY: None}
    assert any(note.startswith(f"{CHOSEN_KEY}=null") for note in par.notes)


def test_parallelize_with_three_gpus_uses_the_measured_choice(monkeypatch):
    """What is recorded for 3 GPUs, the measurements standing in for the profiling."""
    seen = {}

    def fake_measure(model, wrap, probe, options, loop):
        seen.update(
            micro=probe.micro,
            devices=probe.devices,
            options=options,
            wrapped=wrap(model, options[1]).gpu0_bsz,
        )
        return [m(size, 1000 + size, 500 + 40 * size, 600) for size in options]

    monkeypatch.setattr(autotune, "measure", fake_measure)
    three_gpus = DistContext(rank=0, local_rank=0, world_size=1, gpus=("0", "1", "2"))
    unsettled = parallelize(
        balanced_dp.SPEC, nn.Linear(3, 2), config("auto", batch_size=16, grad_accum=1), three_gpus
    )
    assert not seen  # nothing measured until the run is settled
    par, params = settled(unsettled)
    assert par.forward is unsettled.forward  # the module build.py compiled takes the value
    assert seen["micro"] == 16 and seen["options"] == [6, 4, 3, 1, 0]
    assert [str(d) for d in seen["devices"]] == ["cuda:0", "cuda:1", "cuda:2"]
    assert seen["wrapped"] == 4
    # all within 5%; peaks max(500 + 40 s, 600): 740, 660, 620, 600, 600: 1 and 0 tie, 1 is faster
    assert par.forward.gpu0_bsz == 1 and par.batch_split == [1, 8, 7]
    assert params == {CHOSEN_KEY: 1}
    assert (
        par.notes[0] == "balanced_dp: each micro-batch of 16 is split 1+8+7 over cuda:0, "
        "cuda:1, cuda:2"
    )
    assert par.notes[1].startswith(
        f"{CHOSEN_KEY}=1: balanced_dp.gpu0_bsz=auto picked it "
        "from 6, 4, 3, 1, 0 per forward, for the micro-batch of 16"
    )
    assert par.notes[2].startswith("balanced_dp.gpu0_bsz=auto measurements: 6: 1006 samples/s")


# --- a real run ---------------------------------------------------------------------------
