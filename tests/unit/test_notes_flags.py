"""The source notes' flags on the command line (pipeline/cli.py `notes_flags`): note 000's
`--devices` and `--disable-cuda`, the `--local-rank` torch.distributed.launch passes."""

import pytest

from pipeline.cli import notes_flags, parse_args
from pipeline.errors import UserError


@pytest.mark.parametrize(
    "argv, meant",
    [
        (["single", "--devices", "0,3"], ["single", "devices=0,3"]),
        (["single", "--devices=0,3", "model.width=8"], ["single", "model.width=8", "devices=0,3"]),
        (
            ["--disable-cuda", "single", "train.epochs=1"],
            ["single", "train.epochs=1", "devices=cpu"],
        ),
        (["single", "devices=0", "--disable-cuda"], ["single", "devices=0", "devices=cpu"]),
        (["--local-rank=1", "ddp", "train.epochs=1"], ["ddp", "train.epochs=1"]),
        (["--local_rank=1", "ddp"], ["ddp"]),
        (["--local-rank", "1", "ddp"], ["ddp"]),
        (["ddp", "--print-config"], ["ddp", "--print-config"]),
    ],
)
def test_the_notes_flags_read_as_the_params_they_mean(argv, meant):
    assert notes_flags(argv, {"LOCAL_RANK": "1"}) == meant


@pytest.mark.parametrize(
    "argv, env, words",
    [
        (["--local-rank=0", "ddp"], {"LOCAL_RANK": "1"}, ["--local-rank=0", "LOCAL_RANK=1"]),
        (["--local_rank=0", "ddp"], {}, ["--local_rank=0", "torch.distributed.launch"]),
        (["single", "--devices"], {}, ["--devices: expected a value"]),
        (["single", "--devices", "--disable-cuda"], {}, ["--devices: expected a value"]),
    ],
)
def test_a_notes_flag_that_cannot_mean_anything_is_one_line(argv, env, words):
    with pytest.raises(UserError) as err:
        notes_flags(argv, env)
    for word in words:
        assert word in str(err.value)


def test_parse_args_gives_the_overrides_they_mean():
    args = parse_args("pipeline.train", None, ["single", "--devices", "0,3"], ("single",))
    assert args.strategy == "single" and args.overrides == ["devices=0,3"]


def test_an_unknown_flag_is_named_alone():
    # argparse would list every argument after it as unrecognized (issue 68)
    with pytest.raises(UserError) as err:
        parse_args("pipeline.train", None, ["single", "--gpus", "2", "model.width=8"], ("single",))
    line = str(err.value)
    assert line.endswith("(unrecognized arguments: --gpus)"), line
    assert "model.width" not in line
