"""A run's identity (pipeline/training/identity.py): what a checkpoint must agree on to be
resumed, and the one line that says why one was not."""

import dataclasses
from pathlib import Path

import pytest

from pipeline import strategies
from pipeline.config import Config, flatten
from pipeline.strategies import ddp, fsdp
from pipeline.training.identity import (
    SHAPING,
    RunIdentity,
    code_digests,
    run_identity,
    shapes,
    source_digest,
)

# What never changes what a run computes: where the data came from, which strategies the
# experiment lists, which GPUs, the launch, checkpointing, MLflow, the report, `make quick`.
NOT_SHAPING = (
    "strategies",
    "devices",
    "data.mirrors",
    "data.md5",
    "checkpoint.",
    "dist.",
    "mlflow.",
    "report.",
    "quick",
)


def identity(**changes) -> RunIdentity:
    base = dict(
        params={"train.lr": 0.1, "model.width": 8},
        strategy="ddp",
        world_size=2,
        code={"pipeline/training/optim.py": "a", "pipeline/training/loop.py": "b"},
        data="d",
    )
    return RunIdentity(**{**base, **changes})


def test_the_source_digest_sees_code_not_comments_docstrings_or_layout(tmp_path):
    def digest(text: str) -> str:
        path = tmp_path / "m.py"
        path.write_text(text)
        return source_digest(path)

    plain = digest('def f(x):\n    """Half."""\n    return x / 2\n')
    assert digest('def f(x):\n    """Half of x."""\n    # why\n    return (x / 2)\n') == plain
    assert digest('def f(x):\n    """Half."""\n    return x / 3\n') != plain
    field = digest("class C:\n    x: int = 1\n")
    assert digest('class C:\n    """C."""\n    x: int = 1\n    """The x."""\n') == field
    assert digest("class C:\n    x: int = 2\n") != field


@pytest.mark.parametrize(
    "change, words",
    [
        ({"strategy": "fsdp"}, "strategy 'ddp'"),
        ({"world_size": 4}, "written by 2 process(es), this run has 4"),
        ({"params": {"train.lr": 0.2, "model.width": 8}}, "params differ (train.lr: 0.1 -> 0.2)"),
        (
            {"code": {"pipeline/training/optim.py": "z", "pipeline/training/loop.py": "b"}},
            "code differs (pipeline/training/optim.py)",
        ),
        ({"data": "e"}, "training data differs"),
    ],
)
def test_the_difference_names_what_changed(change, words):
    old, new = identity(), identity(**change)
    assert old.key != new.key
    assert words in new.difference(old.to_record())
    assert "\n" not in new.difference(old.to_record())


def test_a_record_without_an_identity_is_explained():
    assert "before runs recorded their identity" in identity().difference(None)


def test_the_identity_covers_the_trajectory_code_this_process_imported(tmp_path):
    import pipeline.strategies.ddp  # noqa: F401 - what a ddp run imports
    import pipeline.training.session  # noqa: F401

    code = code_digests()
    assert "pipeline/strategies/ddp.py" in code and "pipeline/training/loop.py" in code
    assert "pipeline/config.py" in code
    assert not any(k.startswith(("pipeline/tracking/", "pipeline/reporting/")) for k in code)
    data = tmp_path / "tensors.pt"
    data.write_bytes(b"0123")
    first = run_identity(Config(), ddp.FACTS, 2, data)
    cfg = Config()
    cfg.mlflow.experiment, cfg.devices, cfg.checkpoint.max_restarts = "other", "cpu", 3
    assert run_identity(cfg, ddp.FACTS, 2, data).key == first.key  # nothing that shapes it
    cfg.train.lr = 0.2
    assert run_identity(cfg, ddp.FACTS, 2, data).key != first.key
    data.write_bytes(b"0124")
    assert run_identity(Config(), ddp.FACTS, 2, Path(data)).key != first.key


def test_another_strategys_section_is_not_part_of_the_identity(tmp_path):
    """Editing fsdp.nproc must not stop ddp from resuming its own checkpoint; editing a key
    of ddp's own that shapes its trajectory must."""
    data = tmp_path / "tensors.pt"
    data.write_bytes(b"0123")
    cfg = Config()
    first = run_identity(cfg, ddp.FACTS, 2, data)
    cfg.fsdp.nproc, cfg.fsdp.mixed_precision, cfg.pipeline_parallel.stages = 3, "bf16", 3
    cfg.ddp.nproc = 4  # the world size, which the identity holds on its own
    assert run_identity(cfg, ddp.FACTS, 2, data).key == first.key
    cfg.ddp.sync_bn = False
    assert run_identity(cfg, ddp.FACTS, 2, data).key != first.key
    assert run_identity(Config(), fsdp.FACTS, 2, data).params.get("fsdp.mixed_precision") == "none"


def test_every_key_is_shaping_a_strategys_own_or_named_as_not_shaping():
    """A new key must be placed: in SHAPING, in a strategy's section (its FACTS say which of
    its keys shape the run), or in NOT_SHAPING above."""
    sections = {name: strategies.get(name).FACTS for name in strategies.NAMES}
    for key in flatten(Config()):
        section = key.split(".")[0]
        placed = [
            shapes(key, SHAPING),
            section in sections,
            shapes(key, NOT_SHAPING) or key in NOT_SHAPING,
        ]
        assert sum(placed) == 1, f"{key}: {placed}"
    for name, facts in sections.items():
        fields = {f.name for f in dataclasses.fields(facts.options)}
        assert set(facts.shaping_keys) <= fields, name
