"""The mesh's pieces without processes: hybrid's mesh fitted to a GPU count and its layouts
for a prediction, data x pipeline's refusals, what channel parallelism declares it sends
against what its code sends (under torch's fake process group), and a prediction's layouts
in the report."""

import itertools

import pytest
import torch

from pipeline.batch_plan import BatchPlan
from pipeline.config import HybridConfig
from pipeline.errors import UserError
from pipeline.reporting.predicted import combine, layout_picks, mlflow_metrics
from pipeline.resnet import build_model
from pipeline.scaling.profile import SentLog, fake_world
from pipeline.scaling.step_time import ALL_REDUCE
from pipeline.strategies import hybrid
from pipeline.strategies.channel_split import split_bytes
from pipeline.strategies.mesh_plan import apply_channel, channel_plan

SECTIONS = [
    HybridConfig(data=d, shard=s, channel=c)
    for d, s, c in itertools.product((1, 2), (1, 2), (1, 2, 4))
]


@pytest.mark.parametrize("options", SECTIONS, ids=lambda o: f"{o.data}x{o.shard}x{o.channel}")
@pytest.mark.parametrize("world", range(1, 9))
def test_hybrids_mesh_takes_every_device_and_keeps_what_divides(options, world):
    dims = hybrid.mesh(options, world)
    assert dims.world == world
    if options.data * options.shard * options.channel == world:  # the CPU's: as asked
        assert (dims.replicate, dims.shard, dims.channel) == (
            options.data,
            options.shard,
            options.channel,
        )
    assert options.channel % dims.channel == 0 and options.shard % dims.shard == 0
    assert dims.pipeline == 1


def test_one_gpu_runs_a_hybrid_as_one_rank():
    dims = hybrid.mesh(HybridConfig(data=2, shard=1, channel=2), 1)
    assert dims.world == 1 and dims.describe() == "1 rank"


@pytest.mark.parametrize("n", range(1, 9))
def test_layouts_vary_the_dimensions_the_section_uses(n):
    laid = hybrid.layouts(HybridConfig(data=2, shard=1, channel=2), n)
    assert [(o.data, o.channel) for o in laid] == [
        (a, n // a) for a in range(1, n + 1) if n % a == 0
    ]
    assert all(o.shard == 1 for o in laid)
    fsdp_x_channel = hybrid.layouts(HybridConfig(data=1, shard=2, channel=2), n)
    assert all(o.data == 1 and o.shard * o.channel == n for o in fsdp_x_channel)


@pytest.mark.parametrize("world", range(1, 9))
def test_a_pipelines_mesh_is_as_asked_never_fitted(world):
    dims = hybrid.mesh(HybridConfig(data=2, pipeline=2, channel=1), world)
    assert (dims.replicate, dims.shard, dims.pipeline, dims.channel) == (2, 1, 2, 1)


@pytest.mark.parametrize("n", range(1, 9))
def test_layouts_of_data_x_pipeline_are_every_factorization_with_a_block_a_stage(n):
    laid = hybrid.layouts(HybridConfig(data=2, pipeline=2, channel=1, microbatches=2), n)
    assert [(o.data, o.pipeline) for o in laid] == [
        (a, n // a) for a in range(1, n + 1) if n % a == 0 and n // a <= 6
    ]
    assert all(o.channel == o.shard == 1 and o.microbatches == 2 for o in laid)
    assert [(o.data, o.channel) for o in hybrid.layouts(HybridConfig(), n)] == [
        (a, n // a) for a in range(1, n + 1) if n % a == 0
    ]  # the default section (data x channel) is laid out over data and channel alone


def test_data_x_pipeline_takes_its_product_of_processes():
    plan = BatchPlan.make(32, 2)
    options = HybridConfig(data=2, pipeline=2, channel=1)
    assert hybrid.nproc(options, plan, 0) == 4  # the CPU's
    assert hybrid.nproc(options, plan, 4) == 4  # 4 GPUs
    assert hybrid.nproc(HybridConfig(data=1, pipeline=6, channel=1), plan, 0) == 6


@pytest.mark.parametrize(
    "options, n_gpus, key, expected",
    [
        (
            HybridConfig(data=2, pipeline=2, channel=2),
            0,
            "hybrid.pipeline",
            "channel 1 and shard 1",
        ),
        (
            HybridConfig(data=1, shard=2, pipeline=2, channel=1),
            0,
            "hybrid.pipeline",
            "channel 1 and shard 1",
        ),
        (HybridConfig(data=1, pipeline=7, channel=1), 0, "hybrid.pipeline", "at most 6"),
        (HybridConfig(data=2, pipeline=2, channel=1), 3, "hybrid.pipeline", "product to be 3"),
        (HybridConfig(data=3, pipeline=2, channel=1), 0, "train.batch_size", "3 x 2"),
        (
            HybridConfig(data=2, pipeline=2, channel=1, microbatches=3),
            0,
            "hybrid.microbatches",
            "32 / 2 / 2 = 8",
        ),
    ],
    ids=["with_channel", "with_shard", "stages_over_blocks", "gpus", "batch", "microbatches"],
)
def test_data_x_pipeline_refuses_what_it_cannot_run_naming_the_key(options, n_gpus, key, expected):
    with pytest.raises(UserError) as err:
        hybrid.nproc(options, BatchPlan.make(32, 2), n_gpus)
    message = str(err.value)
    assert message.startswith(f"{key}: ") and expected in message and "\n" not in message


@pytest.mark.parametrize(
    "options, same",
    [
        (HybridConfig(data=2, pipeline=2, channel=1), True),
        (HybridConfig(data=2, pipeline=2, channel=1, microbatches=2), True),
        (HybridConfig(data=4, pipeline=1, channel=1, microbatches=2), False),
        (HybridConfig(data=2, pipeline=2, channel=1, sync_bn=False), False),
        (HybridConfig(), True),
    ],
)
def test_a_checkpoint_reshards_where_every_factorization_computes_the_same(options, same):
    """A pipeline's micro-batches are the same samples at any data x pipeline factorization
    with sync_bn (data_pipeline.py); without stages `microbatches` does not apply."""
    assert hybrid.FACTS.same_at_any_world_size(options) is same


@pytest.mark.parametrize("world", [2, 4])
def test_channel_collectives_are_what_the_plan_declares(world):
    """Every all-reduce a channel-split step sends, read off the dispatcher under the fake
    group, is one split_bytes declares, in the same order (f's gradients come back in the
    backward, reversed)."""
    torch.manual_seed(0)
    model = build_model(8, 0).double()
    plan = channel_plan(model)
    declared = split_bytes(model, plan, torch.zeros(1, 1, 28, 28, dtype=torch.float64))
    batch = 3
    x = torch.randn(batch, 1, 28, 28, dtype=torch.float64)
    with fake_world(world, torch.device("cpu")) as ctx:
        from pipeline.parallel_dims import ParallelDims

        mesh = ParallelDims(channel=ctx.world_size).mesh("cpu")
        apply_channel(model, mesh["channel"], None, batch)
        log = SentLog()
        with log:
            model(x).sum().backward()
        mesh._pg_registry.clear()
    sent = [c.size for c in log.calls if c.kind == ALL_REDUCE]
    forward = [batch * size for how, size in declared if how == "rowwise"]
    backward = [batch * size for how, size in reversed(declared) if how == "colwise"]
    assert sorted(sent) == sorted(forward + backward)
    assert sent[: len(forward)] == forward
    assert not any(c.overlappable for c in log.calls)  # inside the layers: blocking


def document(rows):
    return {
        "strategy": "hybrid",
        "settings": {},
        "band": 0.3,
        "checked": "±30%",
        "measured_on": "cpu",
        "device": "cpu",
        "link": {"name": "12 GB/s"},
        "leaves_out": [],
        "by_devices": {"4": {"strategy": "hybrid", "layouts": rows}},
    }


def row(epoch_s, peak):
    return {
        "strategy": "hybrid",
        "devices_used": 4,
        "predicted_step_s": epoch_s / 10,
        "predicted_epoch_s": epoch_s,
        "predicted_peak_mib": {"0": peak},
    }


def test_each_layout_is_a_row_and_the_report_names_the_best_per_objective():
    rows = {
        "replicate 1 x channel 4": row(9.0, 50.0),
        "replicate 2 x channel 2": row(5.0, 70.0),
        "replicate 4 x channel 1": row(6.0, 90.0),
    }
    combined = combine(
        {"hybrid": document(rows), "single": {"baseline_step_s": 1.0, "settings": {}}}
    )
    names = list(combined["by_devices"]["4"])
    assert names == [f"hybrid ({k})" for k in rows]
    assert (
        combined["by_devices"]["4"]["hybrid (replicate 2 x channel 2)"]["predicted_speedup"] == 2.0
    )
    (line,) = layout_picks(combined)
    assert line == (
        "On 4 devices, hybrid's layout (predicted): fastest replicate 2 x channel 2 "
        "(5.00 s/epoch ±30%); least memory per device replicate 1 x channel 4 (50 MiB)"
    )


def test_a_layouts_mlflow_metric_names_are_names_mlflow_takes():
    from mlflow.utils.validation import _validate_metric_name

    rows = {"replicate 2 x channel 2": row(5.0, 70.0)}
    combined = combine({"hybrid": document(rows)})
    names = list(mlflow_metrics(combined))
    assert "predicted_4dev_hybrid_replicate_2_x_channel_2_epoch_s" in names
    for name in names:
        _validate_metric_name(name)  # raises on a name MLflow refuses
