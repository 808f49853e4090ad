"""BatchPlan (pipeline/batch_plan.py) on its own: every plan over small ranges, no processes.
Each plan that exists divides exactly; each that cannot is refused naming the key."""

import itertools

import pytest

from pipeline.batch_plan import BatchPlan
from pipeline.errors import UserError
from pipeline.parallel_dims import ParallelDims

BATCHES, ACCUMS, WORLDS = range(1, 25), range(1, 7), range(1, 7)


def test_make_accepts_exactly_the_batches_its_forwards_divide():
    for batch, accum in itertools.product(BATCHES, ACCUMS):
        if batch % accum:
            with pytest.raises(UserError, match=r"^train\.batch_size: got .*train\.grad_accum"):
                BatchPlan.make(batch, accum)
            continue
        plan = BatchPlan.make(batch, accum)
        assert plan.micro * accum == batch
        assert (plan.data_world, plan.per_rank, plan.data_rank(3)) == (1, plan.micro, 0)


def test_over_splits_each_micro_batch_evenly_or_refuses():
    for batch, accum, world in itertools.product(BATCHES, ACCUMS, WORLDS):
        if batch % accum:
            continue
        plan = BatchPlan.make(batch, accum)
        if plan.micro % world:
            with pytest.raises(UserError, match=rf"ddp needs a multiple of .* {world} x {accum}"):
                plan.over(world, "ddp")
            continue
        shared = plan.over(world, "ddp")
        assert shared.per_rank * world * accum == batch
        assert shared.micro == plan.micro  # the forward's samples over every rank
        ranks = [shared.data_rank(r) for r in range(world)]
        # every share trained once: rank r trains share r; one rank trains the whole
        assert ranks == (list(range(world)) if world > 1 else [0])


def test_of_job_shares_only_over_the_data_dimensions():
    plan = BatchPlan.make(12, 2)
    for world in WORLDS:
        # any world of model ranks alone: unsplit
        assert plan.of_job(ParallelDims(pipeline=world), "pipeline_parallel") == plan
        assert plan.of_job(ParallelDims(channel=world), "channel_parallel") == plan
        if 6 % world == 0:
            assert plan.of_job(ParallelDims(replicate=world), "ddp") == plan.over(world, "ddp")
        else:
            with pytest.raises(UserError):
                plan.of_job(ParallelDims(replicate=world), "ddp")


def test_a_mesh_shares_each_micro_batch_over_its_data_ranks_alone():
    """data x channel: the channel shards of one data rank train the same share, the next
    data rank the next one (ParallelDims puts channel innermost)."""
    plan = BatchPlan.make(24, 1)
    for dims in (
        ParallelDims(replicate=2, channel=2),
        ParallelDims(shard=3, channel=2),
        ParallelDims(replicate=2, shard=2, channel=3),
    ):
        shared = plan.of_job(dims, "hybrid")
        assert shared.data_world == dims.data and shared.per_rank * dims.data == 24
        ranks = [shared.data_rank(r) for r in range(dims.world)]
        assert ranks == [dims.data_rank(r) for r in range(dims.world)]
        assert ranks == [r // dims.channel for r in range(dims.world)]


def test_steps_drop_the_last_partial_batch_and_samples_count_what_ran():
    for batch, n_train in itertools.product(BATCHES, range(1, 50)):
        plan = BatchPlan.make(batch, 1)
        if batch > n_train:
            with pytest.raises(UserError, match=r"larger than the .* training samples"):
                plan.drawing_from(n_train)
            continue
        drawn = plan.drawing_from(n_train)
        assert drawn.steps == n_train // batch
        assert drawn.samples_per_epoch <= n_train < drawn.samples_per_epoch + batch
        for step in range(drawn.steps + 1):
            assert drawn.samples_from(step) == (drawn.steps - step) * batch
        with pytest.raises(ValueError):
            drawn.samples_from(drawn.steps + 1)
    with pytest.raises(ValueError, match="drawing_from"):
        _ = BatchPlan.make(4, 1).steps
