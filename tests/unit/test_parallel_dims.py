"""The device mesh's arithmetic (pipeline/parallel_dims.py), exhaustively over small meshes:
coordinates, data shares, groups and the refusals, without processes."""

import itertools

import pytest

from pipeline.errors import UserError
from pipeline.parallel_dims import DIMENSIONS, ParallelDims, factorizations
from pipeline.resnet import split_channels

SIZES = (1, 2, 3)
MESHES = [ParallelDims(*sizes) for sizes in itertools.product(SIZES, repeat=len(DIMENSIONS))]


@pytest.mark.parametrize("dims", MESHES, ids=lambda d: d.describe())
def test_every_rank_has_one_place_and_channel_is_innermost(dims):
    seen = set()
    for rank in range(dims.world):
        c = dims.coords(rank)
        assert all(0 <= c[n] < getattr(dims, n) for n in DIMENSIONS)
        # row-major with channel fastest: the layout DeviceMesh gives an arange of ranks
        rebuilt = 0
        for n in DIMENSIONS:
            rebuilt = rebuilt * getattr(dims, n) + c[n]
        assert rebuilt == rank
        seen.add(tuple(c.values()))
    assert len(seen) == dims.world


@pytest.mark.parametrize("dims", MESHES, ids=lambda d: d.describe())
def test_data_ranks_share_each_micro_batch_and_model_ranks_share_a_share(dims):
    shares = [dims.data_rank(r) for r in range(dims.world)]
    assert sorted(set(shares)) == list(range(dims.data))
    # every share is trained by the model ranks (pipeline x channel) of one data rank
    assert all(shares.count(s) == dims.model for s in range(dims.data))
    assert shares == [r // dims.model for r in range(dims.world)]


@pytest.mark.parametrize("dims", MESHES, ids=lambda d: d.describe())
def test_groups_partition_the_ranks_along_their_dimensions(dims):
    for names in [(n,) for n in DIMENSIONS] + [("replicate", "shard")]:
        groups = dims.group_ranks(*names)
        size = 1
        for n in names:
            size *= getattr(dims, n)
        assert all(len(g) == size and g == sorted(g) for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(dims.world))
        for group in groups:  # the members differ in the named dimensions alone
            others = {tuple(v for k, v in dims.coords(r).items() if k not in names) for r in group}
            assert len(others) == 1


@pytest.mark.parametrize("width", range(1, 17))
@pytest.mark.parametrize("channel", SIZES)
def test_channels_must_divide_every_split_layer(width, channel):
    dims = ParallelDims(channel=channel)
    if width % channel:
        with pytest.raises(UserError, match=rf"expected model.width a multiple of {channel}$"):
            dims.check_channels(split_channels(width), "channel_parallel")
    else:
        dims.check_channels(split_channels(width), "channel_parallel")


def test_split_channels_are_each_residual_blocks_inner_width():
    assert split_channels(8) == [8, 8, 16, 16, 32, 32, 64, 64]


@pytest.mark.parametrize("n", range(1, 17))
def test_factorizations_are_every_two_dimensional_layout(n):
    layouts = factorizations(n, ("replicate", "channel"))
    assert all(d.world == n and d.shard == d.pipeline == 1 for d in layouts)
    expected = [(a, n // a) for a in range(1, n + 1) if n % a == 0]
    assert [(d.replicate, d.channel) for d in layouts] == expected


def test_three_dimensions_lay_out_every_product():
    layouts = factorizations(4, ("replicate", "shard", "channel"))
    sizes = [(d.replicate, d.shard, d.channel) for d in layouts]
    assert sizes == [(1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1)]


def test_eight_devices_lay_out_four_ways():
    layouts = factorizations(8, ("shard", "channel"))
    assert [(d.shard, d.channel) for d in layouts] == [(1, 8), (2, 4), (4, 2), (8, 1)]


def test_a_dimension_below_one_is_refused():
    with pytest.raises(ValueError, match="ParallelDims.channel: got 0"):
        ParallelDims(channel=0)


def test_describe_names_the_dimensions_that_split():
    assert ParallelDims().describe() == "1 rank"
    assert ParallelDims(shard=2, channel=4).describe() == "shard 2 x channel 4"


def test_data_x_pipeline_lays_each_data_ranks_stages_side_by_side():
    """hybrid {data: 2, pipeline: 2}: ranks 0, 1 are data rank 0's stages 0 and 1; each
    stage's gradients are averaged over the ranks that hold it."""
    dims = ParallelDims(replicate=2, pipeline=2)
    assert dims.group_ranks("pipeline") == [[0, 1], [2, 3]]
    assert dims.group_ranks("replicate", "shard") == [[0, 2], [1, 3]]
    assert [dims.data_rank(r) for r in range(4)] == [0, 0, 1, 1]
    assert [dims.coords(r)["pipeline"] for r in range(4)] == [0, 1, 0, 1]
    assert dims.describe() == "replicate 2 x pipeline 2"
    layouts = factorizations(4, ("replicate", "pipeline"))
    assert [(d.replicate, d.pipeline) for d in layouts] == [(1, 4), (2, 2), (4, 1)]
