"""`devices` parsing and CUDA_VISIBLE_DEVICES composition (pure functions, no GPU needed)."""

import pytest

from pipeline.errors import UserError
from pipeline.training.context import DistContext
from pipeline.training.devices import DeviceSpec, parent_visible_ids, parse_devices, resolve_devices


@pytest.mark.parametrize(
    "text, spec",
    [
        ("auto", DeviceSpec("auto")),
        ("cpu", DeviceSpec("cpu")),
        ("CPU", DeviceSpec("cpu")),
        ("0", DeviceSpec("gpus", (0,))),
        ("0,3", DeviceSpec("gpus", (0, 3))),
        (" 1, 2 ", DeviceSpec("gpus", (1, 2))),
        (3, DeviceSpec("gpus", (3,))),
    ],
)
def test_parse(text, spec):
    assert parse_devices(text) == spec


@pytest.mark.parametrize("text", ["", "0,,3", "gpu0", "-1", "0;1", "1,1", "cuda:0"])
def test_parse_refuses(text):
    with pytest.raises(UserError, match="devices"):
        parse_devices(text)


def test_list_decides_cpu_one_or_several():
    visible = ["0", "1", "2", "3"]
    assert resolve_devices(parse_devices("cpu"), visible) == []
    assert resolve_devices(parse_devices("auto"), visible) == visible
    assert resolve_devices(parse_devices("auto"), []) == []
    assert resolve_devices(parse_devices("2"), visible) == ["2"]
    assert resolve_devices(parse_devices("0,3"), visible) == ["0", "3"]


def test_indices_count_the_gpus_this_process_sees():
    # an outer CUDA_VISIBLE_DEVICES="2,3,5": devices "0,2" are physical GPUs 2 and 5
    visible = parent_visible_ids("2,3,5", 3)
    assert resolve_devices(parse_devices("0,2"), visible) == ["2", "5"]
    assert parent_visible_ids(None, 2) == ["0", "1"]
    assert parent_visible_ids("", 0) == []


def test_absent_gpu_lists_what_is_visible():
    with pytest.raises(UserError) as err:
        resolve_devices(parse_devices("0,3"), ["4", "6"])
    assert "GPU 3 is not there" in str(err.value) and "0 (id 4), 1 (id 6)" in str(err.value)
    with pytest.raises(UserError, match="visible GPUs: none"):
        resolve_devices(parse_devices("0"), [])


def test_context_from_env_on_cpu():
    ctx = DistContext.from_env(
        {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": ""}
    )
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.backend) == (1, 2, False, "gloo")
    assert str(ctx.device) == "cpu" and ctx.devices_of_ranks() == ["cpu", "cpu"]
