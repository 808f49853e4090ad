"""The checkpoint files of pipeline/checkpoints/checkpoint.py in one process: torch.distributed
.checkpoint directories committed by latest.json, never written over while committed, and
model/optimizer state that comes back exactly (tests/e2e/test_sharded_checkpoints.py runs
them under torchrun)."""

import pytest
import torch
from torch import nn

from pipeline.checkpoints.checkpoint import Checkpointer, Position, rng_state, sharded_state
from pipeline.errors import UserError

# one process, no process group: DCP says it saves and loads locally, as meant here
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def model_and_optimizer(width: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(1, width, 3), nn.BatchNorm2d(width), nn.Flatten())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    return model, optimizer


def train_step(model, optimizer, seed: int = 1):
    torch.manual_seed(seed)
    model(torch.randn(4, 1, 6, 6)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def save(ckpt, pos, model, optimizer, **own):
    """A save as the run makes it: each rank's own state whole (loading checks every part)."""
    state = {"rng": rng_state(torch.device("cpu")), "train_totals": torch.zeros(3)}
    state.update(grad_scaler=None, **own)
    ckpt.save(pos, state, {"history": []}, sharded=sharded_state(model, optimizer))


def test_state_comes_back_exactly_and_training_goes_on_identically(tmp_path):
    model, optimizer = model_and_optimizer()
    train_step(model, optimizer)
    ckpt = Checkpointer(tmp_path, rank=0, world_size=1, writer=True, key="k")
    save(ckpt, Position(1, 0), model, optimizer, train_totals=torch.tensor([1.0, 2.0, 3.0]))
    train_step(model, optimizer, seed=2)  # the uninterrupted run goes on

    resumed, resumed_optimizer = model_and_optimizer(seed=7)  # other weights to overwrite
    pos, record = ckpt.latest()
    assert record["directory"] == "e1-s0" and (tmp_path / "e1-s0/.metadata").exists()
    ckpt.load_sharded(pos, resumed, resumed_optimizer)
    assert ckpt.load(pos)["train_totals"].tolist() == [1.0, 2.0, 3.0]
    train_step(resumed, resumed_optimizer, seed=2)
    for key, value in model.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key


def test_an_optimizer_that_never_stepped_stays_fresh(tmp_path):
    """Its state is saved as none at all: torch's state_dict helpers would step it at lr 0
    to make some, leaving momentum buffers of weight_decay * p."""
    model, optimizer = model_and_optimizer()
    ckpt = Checkpointer(tmp_path, rank=0, world_size=1, writer=True, key="k")
    save(ckpt, Position(0, 0), model, optimizer)
    assert not optimizer.state  # saving did not initialise it either
    resumed, resumed_optimizer = model_and_optimizer(seed=7)
    ckpt.load_sharded(Position(0, 0), resumed, resumed_optimizer)
    assert not resumed_optimizer.state
    train_step(model, optimizer)
    train_step(resumed, resumed_optimizer)
    for key, value in model.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key


def test_a_save_never_writes_into_the_committed_checkpoint(tmp_path):
    model, optimizer = model_and_optimizer()
    train_step(model, optimizer)
    ckpt = Checkpointer(tmp_path, rank=0, world_size=1, writer=True, key="k")
    save(ckpt, Position(1, 5), model, optimizer)
    # left by a save at the next position that died before its commit
    (tmp_path / "e2-s0").mkdir()
    (tmp_path / "e2-s0/__7_0.distcp").write_bytes(b"stale")
    # a SIGTERM right after resuming saves at the committed position again: beside it
    save(ckpt, Position(1, 5), model, optimizer)
    assert ckpt.latest()[1]["directory"] == "e1-s5-1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e1-s5-1", "latest.json"]
    save(ckpt, Position(1, 5), model, optimizer)
    assert ckpt.latest()[1]["directory"] == "e1-s5"
    save(ckpt, Position(2, 0), model, optimizer)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e2-s0", "latest.json"]
    assert not (tmp_path / "e2-s0/__7_0.distcp").exists()


def test_a_checkpoint_of_another_width_is_refused_in_one_line(tmp_path):
    model, optimizer = model_and_optimizer(width=8)
    ckpt = Checkpointer(tmp_path, rank=0, world_size=1, writer=True, key="k")
    save(ckpt, Position(1, 0), model, optimizer)
    other, other_optimizer = model_and_optimizer(width=4)
    with pytest.raises(UserError, match=r"0.weight has shape \(8, 1, 3, 3\).*model.width"):
        ckpt.load_sharded(Position(1, 0), other, other_optimizer)
