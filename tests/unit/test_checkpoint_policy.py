"""When a run checkpoints (pipeline/checkpoints/checkpoint_policy.py): every N epochs, and always
the last one, which publish and a rerun read the finished run from."""

from __future__ import annotations

import pytest

from pipeline.checkpoints.checkpoint import Checkpointer
from pipeline.checkpoints.checkpoint_policy import CheckpointPolicy
from pipeline.checkpoints.identity import RunIdentity
from pipeline.config import CheckpointConfig
from pipeline.context import DistContext

CPU = DistContext(rank=0, local_rank=0, world_size=1, gpus=())


def policy(tmp_path, every: int, epochs: int) -> CheckpointPolicy:
    identity = RunIdentity({}, "single", 1, {}, "d", {})
    options = CheckpointConfig(every_epochs=every)
    files = Checkpointer(tmp_path, 0, 1, True, identity.key)
    return CheckpointPolicy(options, epochs, files, identity, CPU)


@pytest.mark.parametrize(
    "every, epochs, due",
    [
        (1, 3, [1, 2, 3]),
        (2, 5, [2, 4, 5]),
        (0, 3, [3]),  # "only at the end (and on SIGTERM)": the end included
        (5, 3, [3]),
    ],
)
def test_the_last_epoch_is_always_checkpointed(tmp_path, every, epochs, due):
    rule = policy(tmp_path, every, epochs)
    assert [e for e in range(1, epochs + 1) if rule.due(e)] == due
