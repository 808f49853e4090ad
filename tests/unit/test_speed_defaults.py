"""params.yaml's `auto` speed settings (pipeline/numerics/speed_defaults.py, issue 49): on a GPU
what a measurement chose for the strategy, eager where none was measured, the CPU's as they
were; an explicit setting always wins."""

import pytest

from pipeline.config import Config
from pipeline.numerics.speed_defaults import MEASURED_ON_GPU, cuda_graph_choice
from pipeline.strategies import NAMES


def test_auto_is_the_default():
    assert Config().train.cuda_graph == "auto"


@pytest.mark.parametrize("strategy", NAMES)
def test_on_the_cpu_auto_is_eager_and_says_nothing(strategy):
    assert cuda_graph_choice("auto", strategy, "cpu") == ("none", [])


def test_on_a_gpu_auto_is_what_was_measured_and_says_so():
    value, notes = cuda_graph_choice("auto", "single", "cuda")
    assert value == "step" == MEASURED_ON_GPU["single"].cuda_graph
    assert notes == [
        f"cuda_graph auto: step for single, as measured ({MEASURED_ON_GPU['single'].evidence})"
    ]


@pytest.mark.parametrize("strategy", [n for n in NAMES if n not in MEASURED_ON_GPU])
def test_on_a_gpu_a_strategy_not_measured_stays_eager_and_says_why(strategy):
    value, notes = cuda_graph_choice("auto", strategy, "cuda")
    assert value == "none"
    assert notes == [
        f"cuda_graph auto: none for {strategy}: eager steps, the fastest correct setting of a "
        "strategy not measured on a GPU yet"
    ]


@pytest.mark.parametrize("asked", ["none", "step"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_an_explicit_setting_always_wins(asked, device):
    assert cuda_graph_choice(asked, "single", device) == (asked, [])
    assert cuda_graph_choice(asked, "ddp", device) == (asked, [])


def test_every_measured_strategy_is_one_and_names_its_evidence():
    for name, chosen in MEASURED_ON_GPU.items():
        assert name in NAMES and chosen.cuda_graph in ("none", "step") and chosen.evidence
