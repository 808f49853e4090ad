"""`devices` parsing and CUDA_VISIBLE_DEVICES composition (pure functions, no GPU needed)."""

import os

import pytest
import torch

from pipeline.context import PLACEMENT_ENV, DistContext
from pipeline.errors import UserError
from pipeline.launch.devices import (
    DeviceSpec,
    NvidiaHost,
    choose_devices,
    cuda_driver_initialised,
    parent_visible_ids,
    parse_devices,
    placement,
    resolve_devices,
    unusable_gpus,
    workers_can_fork,
)
from pipeline.launch.launcher import workers_environment


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
        ("0,0", DeviceSpec("gpus", (0, 0))),  # two ranks (or replicas) on GPU 0
    ],
)
def test_parse(text, spec):
    assert parse_devices(text) == spec


@pytest.mark.parametrize("text", ["", "0,,3", "gpu0", "-1", "0;1", "1x2", "cuda:0"])
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


# --- never a silent CPU run where the host has GPUs torch cannot use --------------------------

OLD_DRIVER = NvidiaHost(("/dev/nvidia0",), True, "535.104.05", "all")


@pytest.mark.parametrize(
    "host, torch_cuda, cuda_visible, seen, words",
    [
        (
            OLD_DRIVER,
            "13.0",
            None,
            0,
            [
                "driver 535.104.05",
                "CUDA 13.0, which needs driver >= 580",
                "535.104.05 is older",
                "PIPELINE_TORCH_CUDA=cu126",
                "devices=cpu",
            ],
        ),
        (
            NvidiaHost((), False, None, "all"),
            "13.0",
            None,
            0,
            ["NVIDIA_VISIBLE_DEVICES=all but no /dev/nvidia*", "--gpus all"],
        ),
        (
            NvidiaHost(("/dev/nvidia0",), False, None, None),
            None,
            None,
            0,
            ["/dev/nvidia0", "CPU-only build"],
        ),
        (
            NvidiaHost(("/dev/nvidia0",), True, "590.10", None),
            "13.0",
            None,
            0,
            ["driver 590.10", "needs driver >= 580"],
        ),  # new enough, yet unusable: still said
    ],
)
def test_gpus_torch_cannot_use_are_an_error(host, torch_cuda, cuda_visible, seen, words):
    problem = unusable_gpus(host, torch_cuda, cuda_visible, seen)
    assert problem is not None and "\n" not in problem
    assert all(w in problem for w in words), problem


ROUTE_TO_CUDA_12 = (
    "on driver 525 to 579, torch for CUDA 12.6: PIPELINE_TORCH_CUDA=cu126 in .env (the "
    "image's build arg TORCH_CUDA) then docker compose build, or on the host make install "
    "TORCH_CUDA=cu126"
)


@pytest.mark.parametrize("driver", ["550.54.15", "570.86.10"])
def test_a_driver_older_than_580_is_sent_to_the_cuda_12_build(driver):
    """torch for CUDA 13.0 needs 580 (NVIDIA's minor-version compatibility: any 13.x build
    runs on 580+); 550 and 570 can run torch for CUDA 12.6, and the error says how."""
    host = NvidiaHost(("/dev/nvidia0",), True, driver, None)
    problem = unusable_gpus(host, "13.0", None, 0)
    assert problem is not None and "\n" not in problem
    assert f"CUDA 13.0, which needs driver >= 580; driver {driver} is older;" in problem
    assert ROUTE_TO_CUDA_12 in problem, problem


def test_driver_580_is_not_older_than_cuda_13():
    host = NvidiaHost(("/dev/nvidia0",), True, "580.65.06", None)
    problem = unusable_gpus(host, "13.0", None, 0)
    assert problem is not None
    assert "CUDA 13.0, which needs driver >= 580;" in problem and "is older" not in problem


@pytest.mark.parametrize("driver", ["550.54.15", "570.86.10"])
def test_drivers_from_525_are_new_enough_for_cuda_12(driver):
    """Any 12.x build runs on 525+, 12.6 included, though 12.6 itself shipped with 560."""
    host = NvidiaHost(("/dev/nvidia0",), True, driver, None)
    problem = unusable_gpus(host, "12.6", None, 0)
    assert problem is not None
    assert "CUDA 12.6, which needs driver >= 525;" in problem and "is older" not in problem


@pytest.mark.parametrize(
    "host, cuda_visible, seen",
    [
        (NvidiaHost(), None, 0),  # no GPU anywhere: the CPU it is
        (NvidiaHost((), False, None, "void"), None, 0),  # a CUDA image asked for no GPU
        (NvidiaHost((), False, None, ""), None, 0),
        (OLD_DRIVER, "", 0),  # CUDA_VISIBLE_DEVICES="" hides them on purpose
        (OLD_DRIVER, None, 2),  # torch sees them: nothing to say
    ],
)
def test_no_gpu_or_gpus_hidden_on_purpose_is_no_error(host, cuda_visible, seen):
    assert unusable_gpus(host, "13.0", cuda_visible, seen) is None


def test_auto_on_this_gpu_less_machine():
    assert choose_devices("auto", {"CUDA_VISIBLE_DEVICES": ""}) == []
    assert choose_devices("cpu", {"NVIDIA_VISIBLE_DEVICES": "all"}) == []
    with pytest.raises(UserError, match="devices: auto found NVIDIA GPUs"):
        choose_devices("auto", {"NVIDIA_VISIBLE_DEVICES": "all"})


def test_a_run_is_tagged_with_the_gpus_it_uses_not_all_it_sees():
    """single on devices "3,5,6": torchrun sees three GPUs, the run computes on cuda:0 only."""
    ctx = DistContext(rank=0, local_rank=0, world_size=1, gpus=("3", "5", "6"))
    assert ctx.physical_gpus(["cuda:0"]) == {0: "3"}
    assert ctx.physical_gpus(["cuda:0", "cuda:1", "cuda:1"]) == {0: "3", 1: "5"}
    assert ctx.physical_gpus(["cpu"]) == {}


def test_the_context_knows_torchruns_restarts():
    """A restarted job's workers are the same stage's attempt (one MLflow run, not a new one)."""
    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "3"}
    ctx = DistContext.from_env(env)
    assert (ctx.rank, ctx.world_size, ctx.restart) == (1, 2, 3)
    assert DistContext.from_env({}).restart == 0


def test_workers_are_forked_unless_the_cuda_driver_was_initialised_in_the_launcher():
    """A worker forked after the launcher initialised the CUDA driver cannot use CUDA (seen
    on an H200): a GPU job forks only where the driver is known not to be initialised."""
    assert workers_can_fork([], None)
    assert workers_can_fork([], True)
    assert workers_can_fork(["0"], False)
    assert workers_can_fork(["0", "3"], False)
    assert not workers_can_fork(["0"], True)
    assert not workers_can_fork(["0", "3"], None)  # no way to ask: spawned, never a guess


def test_a_process_that_made_no_cuda_call_has_no_initialised_driver():
    """Asking must not initialise it either: the answer stays the same when asked again."""
    import torch

    torch.cuda.device_count()  # NVML where it answers: the launcher counts GPUs this way
    assert cuda_driver_initialised() is False
    assert cuda_driver_initialised() is False


def test_a_gpu_named_twice_holds_two_ranks():
    """devices "0,0": two ranks (or replicas) on GPU 0. CUDA_VISIBLE_DEVICES cannot list a GPU
    twice, so the workers see each GPU once and get every rank's CUDA index apart."""
    visible = ["0", "1"]
    assert resolve_devices(parse_devices("0,0"), visible) == ["0", "0"]
    assert resolve_devices(parse_devices("1,0,1"), visible) == ["1", "0", "1"]
    assert placement(["0", "0"]) == (["0"], (0, 0))
    assert placement(["3", "5", "3"]) == (["3", "5"], (0, 1, 0))
    assert placement(["0", "3"]) == (["0", "3"], (0, 1))
    assert placement([]) == ([], ())


def test_ranks_that_share_a_gpu_talk_over_gloo_and_know_their_device():
    """NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); gloo takes CUDA tensors."""
    shared = [
        DistContext(rank=r, local_rank=r, world_size=2, gpus=("4",), placement=(0, 0))
        for r in range(2)
    ]
    for ctx in shared:
        assert ctx.shares_devices and ctx.backend == "gloo"
        assert ctx.device == torch.device("cuda", 0)
        assert ctx.devices_of_ranks() == ["cuda:0", "cuda:0"]
        assert ctx.shared(ctx.devices_of_ranks()) == {"4": 2}
    own = DistContext(rank=1, local_rank=1, world_size=2, gpus=("4", "6"))
    assert not own.shares_devices and own.backend == "nccl"
    assert own.device == torch.device("cuda", 1) and own.shared(own.devices_of_ranks()) == {}
    three_on_two = DistContext(
        rank=2, local_rank=2, world_size=3, gpus=("0", "1"), placement=(0, 1, 0)
    )
    assert three_on_two.device == torch.device("cuda", 0)
    assert three_on_two.shared(three_on_two.devices_of_ranks()) == {"0": 2}
    # on the CPU each process gets cores of its own: nothing is shared-device there
    cpu = DistContext(rank=0, local_rank=0, world_size=2, gpus=())
    assert cpu.backend == "gloo" and cpu.shared(cpu.devices_of_ranks()) == {}


def test_the_workers_see_each_gpu_once_and_every_ranks_index_apart(tmp_path):
    before = dict(os.environ)
    with workers_environment(["0", "0"], 2, tmp_path, tmp_path / "events"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
        assert os.environ[PLACEMENT_ENV] == "0,0"
    assert dict(os.environ) == before
    with workers_environment([], 2, tmp_path, tmp_path / "events"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == ""  # the CPU, even on a GPU machine
        assert os.environ[PLACEMENT_ENV] == ""
