"""params.yaml schema: defaults, overrides, and every way it refuses bad input."""

import pytest
import yaml

from pipeline.batch_plan import BatchPlan
from pipeline.config import Config, ConfigError, effective_lr, flatten, load_config
from pipeline.data.fashion_mnist import MD5 as FASHION_MNIST_MD5
from pipeline.data.fashion_mnist import MIRRORS as FASHION_MNIST_MIRRORS
from pipeline.errors import UserError
from pipeline.launch.devices import parse_devices
from pipeline.launch.topology import parse_endpoint
from pipeline.strategies import check_names


def write(tmp_path, params) -> str:
    path = tmp_path / "params.yaml"
    path.write_text(params if isinstance(params, str) else yaml.safe_dump(params))
    return str(path)


def test_defaults_are_the_notes_experiment(tmp_path):
    cfg = load_config(write(tmp_path, {}))
    assert (cfg.model.width, cfg.train.epochs, cfg.train.batch_size, cfg.train.lr) == (
        64,
        10,
        256,
        0.1,
    )
    assert cfg.data.limit_train is None and cfg.data.mirrors == FASHION_MNIST_MIRRORS


def test_repo_params_yaml_is_valid():
    cfg = load_config("params.yaml")
    assert isinstance(cfg, Config) and cfg.strategies


def test_defaults_match_torchvision():
    from torchvision.datasets import FashionMNIST

    assert FASHION_MNIST_MIRRORS == FashionMNIST.mirrors
    assert FASHION_MNIST_MD5 == dict(FashionMNIST.resources)


def test_overrides_land(tmp_path):
    cfg = load_config(
        write(tmp_path, {"train": {"epochs": 3}}),
        [
            "train.epochs=2",
            "model.width=8",
            "strategies=[single,ddp]",
            "data.limit_train=100",
            "devices=cpu",
            "data.md5.t10k-labels-idx1-ubyte.gz=" + "a" * 32,
        ],
    )
    assert cfg.train.epochs == 2 and cfg.model.width == 8 and cfg.strategies == ["single", "ddp"]
    assert cfg.data.limit_train == 100 and cfg.devices == "cpu"
    assert cfg.data.md5["t10k-labels-idx1-ubyte.gz"] == "a" * 32
    assert (
        cfg.data.md5["train-labels-idx1-ubyte.gz"]
        == FASHION_MNIST_MD5["train-labels-idx1-ubyte.gz"]
    )


def test_linear_lr_scaling_reproduces_the_notes(tmp_path):
    cfg = load_config(
        write(tmp_path, {"train": {"batch_size": 512, "lr": 0.1, "lr_scaling": "linear"}})
    )
    assert effective_lr(cfg.train) == pytest.approx(0.2)


@pytest.mark.parametrize("text, expected", [("auto", "auto"), ("2", 2), ("0", 0), ("null", None)])
def test_gpu0_bsz_takes_auto_an_integer_or_null(tmp_path, text, expected):
    from_override = load_config(write(tmp_path, {}), [f"balanced_dp.gpu0_bsz={text}"])
    from_file = load_config(write(tmp_path, f"balanced_dp:\n  gpu0_bsz: {text}\n"))
    assert from_override.balanced_dp.gpu0_bsz == from_file.balanced_dp.gpu0_bsz == expected
    assert flatten(from_file)["balanced_dp.gpu0_bsz"] == expected


def test_flatten_gives_dotted_keys(tmp_path):
    flat = flatten(load_config(write(tmp_path, {})))
    assert flat["train.batch_size"] == 256 and flat["mlflow.experiment"] == "parallel-lab"


BAD = [  # (params.yaml content, overrides, words the one-line message must contain)
    ({"train": {"epoch": 3}}, [], ["unknown key 'train.epoch'", "did you mean 'train.epochs'"]),
    ({"trian": {"epochs": 3}}, [], ["unknown key 'trian'"]),
    ({"train": {"epochs": "ten"}}, [], ["train.epochs", "ten"]),
    ({"train": {"epochs": 0}}, [], ["train.epochs", "expected >= 1"]),
    ({"train": {"batch_size": -4}}, [], ["train.batch_size", ">= 1"]),
    ({"train": {"lr": 0}}, [], ["train.lr", "> 0"]),
    ({"train": {"lr": -0.1}}, [], ["train.lr"]),
    ({"train": {"momentum": 1.5}}, [], ["train.momentum", "< 1"]),
    ({"train": {"lr_scaling": "sqrt"}}, [], ["train.lr_scaling", "none, linear"]),
    ({"model": {"width": 0}}, [], ["model.width"]),
    ({"model": 8}, [], ["'model' is a section"]),
    ({"strategies": []}, [], ["strategies", "empty"]),
    ({"strategies": ["ddp", "ddp"]}, [], ["strategies", "twice"]),
    ({"data": {"mirrors": []}}, [], ["data.mirrors", "empty"]),
    ({"data": {"md5": {"train-images-idx3-ubyte.gz": "xyz"}}}, [], ["data.md5", "32 hex"]),
    ({"data": {"md5": {"extra.gz": "a" * 32}}}, [], ["data.md5", "extra.gz"]),
    ({"data": {"limit_train": 0}}, [], ["data.limit_train"]),
    ({"pipeline_parallel": {"stages": 1}}, [], ["pipeline_parallel.stages", ">= 2"]),
    ({"pipeline_parallel": {"schedule": "zb"}}, [], ["pipeline_parallel.schedule"]),
    ({"fsdp": {"mixed_precision": "int8"}}, [], ["fsdp.mixed_precision"]),
    ({"balanced_dp": {"gpu0_bsz": -1}}, [], ["balanced_dp.gpu0_bsz"]),
    ({}, ["balanced_dp.gpu0_bsz=-1"], ["balanced_dp.gpu0_bsz", "-1", "auto or an integer >= 0"]),
    ({}, ["balanced_dp.gpu0_bsz=many"], ["balanced_dp.gpu0_bsz", "'many'", "auto"]),
    ({"balanced_dp": {"gpu0_bsz": 1.5}}, [], ["balanced_dp.gpu0_bsz", "1.5"]),
    ({"balanced_dp": {"gpu0_bsz": True}}, [], ["balanced_dp.gpu0_bsz", "True"]),
    ({"mlflow": {"experiment": ""}}, [], ["mlflow.experiment"]),
    ({}, ["train.epochs"], ["key=value"]),
    ({}, ["train.nope=1"], ["unknown key 'train.nope'"]),
    ({}, ["train.epochs=abc"], ["train.epochs", "abc"]),
    ("train: [unclosed", [], ["not valid YAML"]),
    ("- a\n- b\n", [], ["expected a mapping"]),
]


@pytest.mark.parametrize("params, overrides, words", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_input_is_one_clear_line(tmp_path, params, overrides, words):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, params), overrides)
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


# Rules that need another layer's knowledge are that layer's (pipeline/config/ imports nothing
# else of the project), checked where a command uses the key: the same one line, exit code 2.
OWNED_ELSEWHERE = [
    (lambda: BatchPlan.make(10, 3), ["train.batch_size: got 10", "train.grad_accum (3)"]),
    (lambda: BatchPlan.make(32, 1).over(3, "ddp"), ["ddp needs", "= 3 x 1"]),
    (lambda: BatchPlan.make(32, 1).drawing_from(20), ["larger than the 20 training samples"]),
    (lambda: check_names(["single", "deepspeed"]), ["strategies: unknown entry 'deepspeed'"]),
    (lambda: parse_devices("0,,3"), ["devices", "0,,3"]),
    (lambda: parse_devices("gpu0"), ["devices", "gpu0"]),
    (lambda: parse_endpoint("host:port"), ["dist.rdzv_endpoint", "host:port"]),
]


@pytest.mark.parametrize(
    "check, words", OWNED_ELSEWHERE, ids=[f"owned{i}" for i in range(len(OWNED_ELSEWHERE))]
)
def test_cross_layer_rules_are_one_clear_line_from_their_layer(check, words):
    with pytest.raises(UserError) as err:
        check()
    assert "\n" not in str(err.value) and all(w in str(err.value) for w in words), err.value
