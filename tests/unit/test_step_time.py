"""The N-device step model's arithmetic (pipeline/scaling/step_time.py) and the links it is
given (links.py): pure functions, checked exhaustively over small worlds."""

from __future__ import annotations

import math

import pytest

from pipeline.errors import UserError
from pipeline.scaling.links import GB, PRESETS, Link, nccl_tests_busbw, parse_link
from pipeline.scaling.prediction import data_pipeline_step
from pipeline.scaling.profile import DataPipelineProfile
from pipeline.scaling.step_time import (
    ALL_GATHER,
    ALL_REDUCE,
    REDUCE_SCATTER,
    SEND,
    Call,
    Traffic,
    collective_seconds,
    data_parallel_step,
    moved,
    pipeline_step,
)

LINK = Link("test", busbw=10 * GB, latency_s=1e-5, source="a test")
FREE = Link("free", busbw=math.inf, latency_s=0.0, source="no cost")


@pytest.mark.parametrize("n", range(1, 17))
def test_what_each_rank_moves_is_nccl_tests_bus_volume(n):
    size = 1 << 20
    if n == 1:
        assert moved(ALL_REDUCE, size, n) == (0, 0.0)
        assert moved(ALL_GATHER, size, n) == (0, 0.0)
    else:
        assert moved(ALL_REDUCE, size, n) == (2 * (n - 1), 2 * (n - 1) / n * size)
        assert moved(ALL_GATHER, size, n) == (n - 1, (n - 1) / n * size)
        assert moved(REDUCE_SCATTER, size, n) == (n - 1, (n - 1) / n * size)
    assert moved(SEND, size, n) == (1, float(size))


def test_a_collective_costs_its_steps_latency_and_its_bytes_over_the_bus():
    steps, volume = moved(ALL_REDUCE, 4_000_000, 8)
    assert collective_seconds(ALL_REDUCE, 4_000_000, 8, LINK) == pytest.approx(
        steps * 1e-5 + volume / (10 * GB)
    )
    with pytest.raises(ValueError, match="unknown collective"):
        moved("alltoall", 1, 2)


def test_without_overlap_a_rank_waits_for_all_it_sends():
    traffic = Traffic((Call(ALL_REDUCE, 10**8), Call(ALL_GATHER, 64, overlappable=False)))
    comm = sum(collective_seconds(c.kind, c.size, 4, LINK) for c in traffic.calls)
    step = data_parallel_step(0.5, 0.3, traffic, 4, LINK, overlaps=False)
    assert step.step_s == pytest.approx(0.5 + comm)
    assert step.exposed_s == pytest.approx(comm) and step.comm_s == pytest.approx(comm)


def test_overlap_hides_what_fits_in_the_window_but_never_the_last_collective():
    buckets = [Call(ALL_REDUCE, 10**8) for _ in range(4)]
    each = collective_seconds(ALL_REDUCE, 10**8, 8, LINK)
    for window in (0.0, each, 2.5 * each, 10 * each):
        step = data_parallel_step(1.0, window, Traffic(tuple(buckets)), 8, LINK, overlaps=True)
        assert step.exposed_s == pytest.approx(max(4 * each - window, each))
        assert step.step_s == pytest.approx(1.0 + step.exposed_s)


def test_a_blocking_collective_is_never_hidden():
    blocking = Call(ALL_GATHER, 64, overlappable=False)
    cost = collective_seconds(ALL_GATHER, 64, 2, LINK)
    step = data_parallel_step(1.0, 100.0, Traffic((blocking,)), 2, LINK, overlaps=True)
    assert step.exposed_s == pytest.approx(cost)


def test_one_world_sends_nothing_of_a_data_parallel_step():
    traffic = Traffic((Call(ALL_REDUCE, 10**8), Call(ALL_GATHER, 10**6)))
    assert data_parallel_step(0.2, 0.1, traffic, 1, FREE, overlaps=True).step_s == 0.2


@pytest.mark.parametrize("p", range(1, 7))
@pytest.mark.parametrize("m", range(1, 9))
def test_a_pipeline_waits_its_fill_and_drain_for_the_slowest_stage(p, m):
    """Free sends: (m + p - 1) x the slowest stage, the bubble (p-1)/(m+p-1) of it."""
    stage_s = [0.01 * (1 + i % 3) for i in range(p)]
    step = pipeline_step(stage_s, [1000] * (p - 1), m, 1, 0.0, FREE)
    slowest = max(stage_s)
    assert step.step_s == pytest.approx((m + p - 1) * slowest)
    assert step.bubble_s / step.step_s == pytest.approx((p - 1) / (m + p - 1))
    assert step.compute_s == pytest.approx(m * slowest)


def test_a_pipelines_sends_and_accumulation_and_optimizer_add_up():
    stage_s, boundary = [0.02, 0.03], [4_000_000]
    send = 2 * collective_seconds(SEND, 4_000_000, 2, LINK)
    step = pipeline_step(stage_s, boundary, 4, 2, 0.005, LINK)
    slowest = max(0.02 + send, 0.03)
    assert step.step_s == pytest.approx(2 * (4 + 1) * slowest + 0.005)
    assert step.comm_s == pytest.approx(2 * 4 * send)
    with pytest.raises(ValueError, match="boundaries"):
        pipeline_step([0.1, 0.1], [], 2, 1, 0.0, LINK)


@pytest.mark.parametrize("data", [1, 2, 4])
def test_data_x_pipeline_is_the_pipelines_step_then_its_data_groups_all_reduce(data):
    profile = DataPipelineProfile(
        stage_s=[0.02, 0.03],
        boundary_bytes=[4_000_000],
        microbatches=2,
        optimizer_s=0.005,
        reduce_bytes=8_000_000,
        memory=(),
    )
    alone = pipeline_step([0.02, 0.03], [4_000_000], 2, 3, 0.005, LINK)
    step = data_pipeline_step(profile, data, 3, LINK)
    reduce_s = collective_seconds(ALL_REDUCE, 8_000_000, data, LINK)
    assert (reduce_s == 0) is (data == 1)  # one data rank reduces nothing
    assert step.step_s == pytest.approx(alone.step_s + reduce_s)
    assert step.exposed_s == pytest.approx(alone.exposed_s + reduce_s)
    assert (step.compute_s, step.bubble_s) == (alone.compute_s, alone.bubble_s)


def test_the_presets_are_the_issues_figures():
    assert {name: link.busbw / GB for name, link in PRESETS.items()} == {
        "nvlink-h100": 370,
        "pcie": 116,
        "ib-ndr": 46,
        "ethernet-100g": 12,
    }
    assert all(link.source for link in PRESETS.values())


@pytest.mark.parametrize(
    "text, busbw", [("25", 25 * GB), ("2.5GB/s", 2.5 * GB), (" 7 gb/s ", 7 * GB)]
)
def test_a_number_is_a_bus_bandwidth_in_gb_per_s(text, busbw):
    assert parse_link(text).busbw == pytest.approx(busbw)


ALL_REDUCE_PERF = """\
# nThread 1 nGpus 8 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20
#     out-of-place   in-place
# size count type redop root time algbw busbw #wrong time algbw busbw #wrong
# (B) (elements) (us) (GB/s) (GB/s) (us) (GB/s) (GB/s)
  8         2 float sum -1   28.50   0.00   0.00 0   27.90   0.00   0.00 0
  1048576   262144 float sum -1   40.10  26.15  45.76 0   39.80  26.35  46.11 0
  134217728 33554432 float sum -1  652.3 205.76 360.08 0  651.0 206.17 360.80 0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 135.3
"""


def test_an_nccl_tests_table_gives_its_largest_messages_out_of_place_busbw(tmp_path):
    assert nccl_tests_busbw(ALL_REDUCE_PERF, "x") == pytest.approx(360.08 * GB)
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text(ALL_REDUCE_PERF)
    link = parse_link(str(path))
    assert link.busbw == pytest.approx(360.08 * GB) and "all_reduce_perf.txt" in link.source


@pytest.mark.parametrize("text", ["fast", "0", "-3", "nvlink", ""])
def test_anything_else_is_refused_in_one_line_naming_what_was_expected(text):
    with pytest.raises(UserError) as err:
        parse_link(text)
    message = str(err.value)
    assert "\n" not in message and "expected" in message


def test_a_file_without_the_table_is_refused(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("no table here\n")
    with pytest.raises(UserError, match="no all_reduce_perf rows"):
        parse_link(str(path))
