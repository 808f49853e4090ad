"""model.init (pipeline/resnet.py `initialise`): torch's default, or note 004's d2l init, and
the run identity that tells them apart."""

import pytest
import torch
from torch import nn

from pipeline.checkpoints.hardware import local_facts
from pipeline.checkpoints.identity import run_identity
from pipeline.config import Config, load_config
from pipeline.context import DistContext
from pipeline.data.device_data import to_device
from pipeline.data.download import convert
from pipeline.numerics.build import build_training
from pipeline.resnet import build_model, initialise, resnet18
from pipeline.run_spec import resolve_run


def note_004_init_weights(m):
    """Note 004's `init_weights`, as written there."""
    if type(m) in [nn.Linear, nn.Conv2d]:
        nn.init.normal_(m.weight, std=0.01)


def seeded(build, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return build()


def test_torch_is_the_plain_network_seeded():
    plain = seeded(lambda: resnet18(8), 3)
    for name, value in build_model(8, 3, "torch").state_dict().items():
        assert torch.equal(value, plain.state_dict()[name]), name
    default = build_model(8, 3).state_dict()  # the default is torch's
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in default.items())


def test_d2l_is_note_004s_init_weights_applied_to_the_seeded_network():
    note = seeded(lambda: resnet18(8).apply(note_004_init_weights), 3)
    plain = seeded(lambda: resnet18(8), 3)
    ours = build_model(8, 3, "d2l")
    weights = {
        f"{name}.weight" for name, m in ours.named_modules() if type(m) in (nn.Linear, nn.Conv2d)
    }
    assert len(weights) == 1 + 4 * 4 + 3 + 1  # the stem, 16 convs, 3 projections, the head
    for name, value in ours.state_dict().items():
        assert torch.equal(value, note.state_dict()[name]), name
        # what d2l leaves alone (biases, BatchNorm) is torch's, and every weight it draws moved
        assert torch.equal(value, plain.state_dict()[name]) == (name not in weights), name
    drawn = torch.cat([ours.state_dict()[n].flatten() for n in weights])
    assert abs(drawn.std().item() - 0.01) < 0.0005


def test_build_model_leaves_the_callers_generator_as_it_was():
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    build_model(8, 0, "d2l")
    assert torch.equal(torch.rand(3), expected)


def test_an_unknown_init_is_refused_by_the_schema_and_by_the_model():
    with pytest.raises(Exception, match="model.init"):
        load_config(None, ["model.init=xavier"])
    with pytest.raises(ValueError, match="model.init: got 'xavier'"):
        initialise(resnet18(8), "xavier")


def test_model_init_is_part_of_the_run_identity(tmp_path):
    data = tmp_path / "arrays.npz"
    data.write_bytes(b"0123")
    hw = local_facts(["cpu"], "fp32", 1, cpu=lambda: "a CPU")
    cfg = Config()
    torch_init = run_identity(resolve_run(cfg, "single"), 1, data, hw)
    cfg.model.init = "d2l"
    d2l = run_identity(resolve_run(cfg, "single"), 1, data, hw)
    assert d2l.key != torch_init.key
    assert "params differ (model.init: 'torch' -> 'd2l')" in d2l.difference(torch_init.to_record())


def test_the_training_builds_its_model_with_model_init(raw_dataset):
    cpu = DistContext(rank=0, local_rank=0, world_size=1, gpus=())
    data = to_device(convert(raw_dataset[0]), cpu.device, 64, 32)
    cfg = Config()
    cfg.model.width, cfg.train.batch_size, cfg.model.init = 4, 16, "d2l"
    spec = resolve_run(cfg, "single")
    training = build_training(spec, cpu, data, spec.job_plan(1, len(data.train_labels)))
    built = training.run.module.state_dict()
    for name, value in build_model(4, cfg.seed, "d2l").state_dict().items():
        assert torch.equal(built[name], value), name
