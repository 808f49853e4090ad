"""How `pipeline_parallel` cuts the model into stages, and what it refuses (no processes)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import Config
from pipeline.errors import UserError
from pipeline.resnet import block_flops, build_model
from pipeline.strategies import pipeline_parallel
from pipeline.strategies.pipeline_parallel import split_points
from support import strategy_nproc


def test_pipeline_stages_beyond_gpus_is_a_user_error():
    cfg = Config()
    cfg.pipeline_parallel.stages = 3
    with pytest.raises(UserError, match=r"pipeline_parallel\.stages: got 3.* 2 GPU"):
        strategy_nproc(pipeline_parallel.SPEC, cfg, 2)
    assert strategy_nproc(pipeline_parallel.SPEC, cfg, 0) == 3  # on the CPU: one gloo process each


def test_pipeline_microbatches_must_divide_the_step_batch():
    cfg = Config()
    cfg.train.batch_size, cfg.train.grad_accum, cfg.pipeline_parallel.microbatches = 32, 2, 3
    with pytest.raises(UserError, match=r"pipeline_parallel\.microbatches.*train\.batch_size"):
        strategy_nproc(pipeline_parallel.SPEC, cfg, 0)


def test_split_points_balance_the_heaviest_stage():
    assert split_points([1, 1, 1, 1, 1, 1], 2) == [0, 3, 6]
    assert split_points([5, 1, 1, 1, 1, 5], 3) == [0, 1, 5, 6]
    assert split_points([3, 1, 2], 3) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        split_points([1, 1], 3)


def heaviest(costs: list[int], bounds: list[int]) -> int:
    return max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))


@st.composite
def costs_and_another_cut(draw) -> tuple[list[int], list[int]]:
    costs = draw(st.lists(st.integers(0, 100), min_size=1, max_size=8))
    inner = range(1, len(costs))
    cuts = draw(st.sets(st.sampled_from(inner))) if inner else set()
    return costs, [0, *sorted(cuts), len(costs)]


@given(costs_and_another_cut())
def test_split_points_no_other_cut_is_lighter(costs_and_other):
    costs, other = costs_and_other
    bounds = split_points(costs, len(other) - 1)
    assert bounds[0] == 0 and bounds[-1] == len(costs)
    assert all(a < b for a, b in zip(bounds, bounds[1:]))
    assert heaviest(costs, bounds) <= heaviest(costs, other)


def test_resnet_blocks_split_by_flops():
    flops = block_flops(build_model(width=8, seed=0))
    assert len(flops) == 6
    # the stem and the head are cheap; the residual stages carry the work
    assert max(flops[0], flops[5]) < min(flops[1:5]) / 10
    assert split_points(flops, 2) == [0, 3, 6]


def test_one_gpu_or_one_cpu_process_holds_every_stage():
    cfg = Config()
    cfg.pipeline_parallel.stages = 3
    cfg.train.batch_size = 32
    cfg.pipeline_parallel.microbatches = 4
    assert strategy_nproc(pipeline_parallel.SPEC, cfg, 1) == 1  # one GPU: a looped schedule on it
    assert strategy_nproc(pipeline_parallel.SPEC, cfg, 4) == 3  # a GPU per stage
    cfg.pipeline_parallel.nproc = 1
    assert strategy_nproc(pipeline_parallel.SPEC, cfg, 0) == 1
    cfg.pipeline_parallel.nproc = 2
    with pytest.raises(UserError, match=r"pipeline_parallel\.nproc: got 2, expected 3 .* or 1"):
        strategy_nproc(pipeline_parallel.SPEC, cfg, 0)
