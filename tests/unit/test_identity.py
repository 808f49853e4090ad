"""A run's identity (pipeline/training/identity.py): what a checkpoint must agree on to be
resumed, and the one line that says why one was not."""

from pathlib import Path

import pytest

from pipeline.config import Config
from pipeline.training.identity import RunIdentity, code_digests, run_identity, source_digest


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
    first = run_identity(Config(), "ddp", 2, data)
    cfg = Config()
    cfg.mlflow.experiment, cfg.devices, cfg.checkpoint.max_restarts = "other", "cpu", 3
    assert run_identity(cfg, "ddp", 2, data).key == first.key  # nothing that shapes training
    cfg.train.lr = 0.2
    assert run_identity(cfg, "ddp", 2, data).key != first.key
    data.write_bytes(b"0124")
    assert run_identity(Config(), "ddp", 2, Path(data)).key != first.key
