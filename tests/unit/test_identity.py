"""A run's identity (pipeline/checkpoints/identity.py): what a checkpoint must agree on to be
resumed, and the one line that says why one was not."""

import dataclasses
import sys
from pathlib import Path

import pytest
import yaml

from pipeline import strategies
from pipeline.checkpoints import identity as identity_module
from pipeline.checkpoints.hardware import local_facts, merge
from pipeline.checkpoints.identity import (
    NOT_IDENTITY,
    SHAPING,
    RunIdentity,
    code_digests,
    in_identity,
    read_digest_cache,
    run_identity,
    shapes,
    source_key,
    tree_digest,
)
from pipeline.config import Config, flatten
from pipeline.run_spec import resolve_run
from support import REPO, code_deps, fresh_python

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
    "predict.",
    "quick",
)


HW = local_facts(["cpu", "cpu"], "fp32", 2, cpu=lambda: "AMD EPYC (AVX512)")


def gpu_facts(name: str = "NVIDIA H100 80GB HBM3", cc: str = "9.0", n: int = 2, **kw) -> dict:
    """What local_facts records on GPUs, through its seam (no GPU here)."""
    devices = [f"cuda:{i}" for i in range(n)]
    kind = lambda i: f"{name} (compute capability {cc})"  # noqa: E731
    return local_facts(devices, kw.get("precision", "bf16"), n, gpu=kind)


def identity(**changes) -> RunIdentity:
    base = dict(
        params={"train.lr": 0.1, "model.width": 8},
        strategy="ddp",
        world_size=2,
        code={"pipeline/numerics/optim.py": "a", "pipeline/training/trainer.py": "b"},
        data="d",
        hardware=HW,
    )
    return RunIdentity(**{**base, **changes})


def test_the_tree_digest_sees_code_not_comments_docstrings_or_layout():
    plain = tree_digest('def f(x):\n    """Half."""\n    return x / 2\n')
    assert tree_digest('def f(x):\n    """Half of x."""\n    # why\n    return (x / 2)\n') == plain
    assert tree_digest('def f(x):\n    """Half."""\n    return x / 3\n') != plain
    field = tree_digest("class C:\n    x: int = 1\n")
    assert tree_digest('class C:\n    """C."""\n    x: int = 1\n    """The x."""\n') == field
    assert tree_digest("class C:\n    x: int = 2\n") != field


@pytest.mark.parametrize(
    "change, words",
    [
        ({"strategy": "fsdp"}, "strategy 'ddp'"),
        ({"world_size": 4}, "written by 2 process(es), this run has 4"),
        ({"params": {"train.lr": 0.2, "model.width": 8}}, "params differ (train.lr: 0.1 -> 0.2)"),
        (
            {"code": {"pipeline/numerics/optim.py": "z", "pipeline/training/trainer.py": "b"}},
            "code differs (pipeline/numerics/optim.py)",
        ),
        ({"data": "e"}, "training data differs"),
        (
            {"hardware": gpu_facts()},
            "other hardware (devices: ['cpu', 'cpu'] -> ['cuda:0', 'cuda:1']",
        ),
    ],
)
def test_the_difference_names_what_changed(change, words):
    old, new = identity(), identity(**change)
    assert old.key != new.key
    assert words in new.difference(old.to_record())
    assert "\n" not in new.difference(old.to_record())


def test_a_record_without_an_identity_is_explained():
    assert "before runs recorded their identity" in identity().difference(None)


def test_the_identity_covers_the_code_this_process_imported(tmp_path):
    import pipeline.strategies.ddp  # noqa: F401 - what a ddp run imports
    import pipeline.training.session  # noqa: F401

    code = code_digests()
    assert "pipeline/strategies/ddp.py" in code and "pipeline/training/trainer.py" in code
    assert "pipeline/config/schema.py" in code and "pipeline/memory.py" in code
    assert not any(k.startswith("pipeline/tracking/") for k in code)
    data = tmp_path / "arrays.npz"
    data.write_bytes(b"0123")
    first = run_identity(resolve_run(Config(), "ddp"), 2, data, HW)
    cfg = Config()
    cfg.mlflow.experiment, cfg.devices, cfg.checkpoint.max_restarts = "other", "cpu", 3
    cfg.report.log_every_s, cfg.mlflow.log_every_steps = None, 7  # what a run shows as it goes
    assert (
        run_identity(resolve_run(cfg, "ddp"), 2, data, HW).key == first.key
    )  # nothing that shapes it
    cfg.train.lr = 0.2
    assert run_identity(resolve_run(cfg, "ddp"), 2, data, HW).key != first.key
    data.write_bytes(b"0124")
    assert run_identity(resolve_run(Config(), "ddp"), 2, Path(data), HW).key != first.key


def test_cached_digests_are_the_parsed_ones_and_a_bad_cache_is_worked_out_again(
    tmp_path, monkeypatch
):
    import pipeline.training.trainer  # noqa: F401

    cache = tmp_path / ".cache" / "code-digests.json"
    parsed = []
    monkeypatch.setattr(identity_module, "tree_digest", lambda s: parsed.append(s) or "d" * 16)
    first = code_digests(cache)
    assert set(first.values()) == {"d" * 16}
    sources = len(parsed)
    assert sources and len(set(parsed)) == sources  # each distinct source parsed once
    assert code_digests(cache) == first and len(parsed) == sources  # the rest from the cache
    # a cache that is not one (cut short, edited by hand) is ignored and written anew
    for junk in ("{", "[1]", '{"k": 1}'):
        cache.write_text(junk)
        parsed.clear()
        assert code_digests(cache) == first and len(parsed) == sources
    assert read_digest_cache(cache) == {source_key(s): "d" * 16 for s in parsed}
    # the same source under another Python may dump its tree otherwise: another key
    monkeypatch.setattr(sys, "version_info", (3, 99, 0))
    assert source_key(parsed[0]) not in read_digest_cache(cache)


def test_the_digest_cache_holds_the_real_digests(tmp_path):
    cache = tmp_path / "digests.json"
    digests = code_digests(cache)
    root = Path(identity_module.__file__).parents[2]
    assert digests == {name: tree_digest((root / name).read_text()) for name in digests}
    keys = {source_key((root / name).read_text()): d for name, d in digests.items()}
    assert read_digest_cache(cache) == keys


def module_of(path: str) -> str:
    parts = Path(path).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def worker_code() -> set[str]:
    """The files in the identity of a worker of any strategy: code_digests in a fresh
    interpreter that imported what `python -m pipeline.train` does under torchrun, and every
    strategy."""
    imports = ["pipeline.train", "pipeline.launch.worker"]
    imports += [f"pipeline.strategies.{name}" for name in strategies.KNOWN]
    code = (
        "import importlib, json\n"
        f"for name in {imports!r}:\n"
        "    importlib.import_module(name)\n"
        "from pipeline.checkpoints.identity import code_digests\n"
        "print(json.dumps(sorted(code_digests())))"
    )
    return set(fresh_python(code))


def test_every_file_the_train_stage_depends_on_is_in_the_identity_or_named_outside_it():
    """An edit to a train-stage dependency (dvc.yaml) re-runs the stage. Where the file is in
    the identity of the runs that execute it (a strategy's own module in its runs' alone),
    they train afresh; any other must be in NOT_IDENTITY, whose rerun resumes the finished
    run and hands on what it measured. Issue 28: pipeline/memory.py was neither, and an
    edit to it brought back the old memory figures."""
    deps = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["train"]["do"]["deps"]
    files = set().union(*(code_deps(deps, name) for name in strategies.KNOWN))
    code = worker_code()
    assert sorted(f for f in files if f not in code and in_identity(module_of(f))) == []
    assert sorted(f for f in code if not in_identity(module_of(f))) == []
    modules = {module_of(p.relative_to(REPO).as_posix()) for p in REPO.glob("pipeline/**/*.py")}
    for name in NOT_IDENTITY:  # each names a module or package of the project
        assert any(m == name or (m + ".").startswith(name) for m in modules), name


def test_another_strategys_section_is_not_part_of_the_identity(tmp_path):
    """Editing fsdp.nproc must not stop ddp from resuming its own checkpoint; editing a key
    of ddp's own that shapes its trajectory must."""
    data = tmp_path / "arrays.npz"
    data.write_bytes(b"0123")
    cfg = Config()
    first = run_identity(resolve_run(cfg, "ddp"), 2, data, HW)
    cfg.fsdp.nproc, cfg.fsdp.mixed_precision, cfg.pipeline_parallel.stages = 3, "bf16", 3
    cfg.ddp.nproc = 4  # the world size, which the identity holds on its own
    assert run_identity(resolve_run(cfg, "ddp"), 2, data, HW).key == first.key
    cfg.ddp.sync_bn = False
    assert run_identity(resolve_run(cfg, "ddp"), 2, data, HW).key != first.key
    assert (
        run_identity(resolve_run(Config(), "fsdp"), 2, data, HW).params.get("fsdp.mixed_precision")
        == "none"
    )


def test_every_key_is_shaping_a_strategys_own_or_named_as_not_shaping():
    """A new key must be placed: in SHAPING, in a strategy's section (its FACTS say which of
    its keys shape the run), or in NOT_SHAPING above."""
    sections = {name: strategies.get(name).facts for name in strategies.KNOWN}
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


@pytest.mark.parametrize(
    "other, what",
    [
        (gpu_facts(name="NVIDIA A100-SXM4-80GB", cc="8.0"), "kind"),  # a requeue onto an A100
        (gpu_facts(n=4), "count"),  # dp on "0,1,2,3" after "0,1"
        (gpu_facts(precision="fp16"), "precision"),
        (HW, "devices"),  # a GPU checkpoint resumed on the CPU
    ],
)
def test_a_checkpoint_from_other_hardware_is_not_this_runs(other, what):
    ran, now = identity(hardware=gpu_facts()), identity(hardware=other)
    assert ran.key != now.key
    why = now.difference(ran.to_record())
    assert why.startswith("it ran on other hardware (") and what in why and "\n" not in why


def test_the_hardware_record_names_gpus_cpus_precision_and_versions():
    facts = gpu_facts()
    assert facts["kind"] == ["NVIDIA H100 80GB HBM3 (compute capability 9.0)"]
    assert facts["devices"] == ["cuda:0", "cuda:1"] and facts["count"] == 2
    assert facts["precision"] == "bf16" and facts["torch"] and "cuda" in facts
    cpu = local_facts(["cpu"], "fp32", 3, cpu=lambda: "Intel Xeon (AVX2)")
    assert cpu["kind"] == ["Intel Xeon (AVX2)"] and cpu["count"] == 3  # processes on the CPU
    # the nodes of a job agree on one record holding every node's kind
    node1 = local_facts(["cpu"], "fp32", 3, cpu=lambda: "AMD EPYC (AVX512)")
    assert merge([cpu, node1])["kind"] == ["AMD EPYC (AVX512)", "Intel Xeon (AVX2)"]


def test_the_record_of_a_mixed_gpu_job_holds_each_capability_and_its_one_precision():
    a100, t4 = "NVIDIA A100 (compute capability 8.0)", "Tesla T4 (compute capability 7.5)"
    ranks = [
        local_facts(["cuda:0"], "fp16", 2, gpu=lambda i, kind=kind: kind) for kind in (a100, t4)
    ]
    job = merge(ranks)
    assert job["kind"] == [a100, t4] and job["precision"] == "fp16"
    ranks[0]["precision"] = "bf16"  # what each rank chose for itself before issue 28
    with pytest.raises(RuntimeError, match=r"different precisions: \['bf16', 'fp16'\]"):
        merge(ranks)


def test_the_world_size_counts_only_where_the_trajectory_depends_on_it(tmp_path):
    """ddp and fsdp with SyncBN compute the same at any world size: their checkpoints resume
    at another one, resharded. Without SyncBN each rank's BatchNorm sees its own share."""
    data = tmp_path / "arrays.npz"
    data.write_bytes(b"0123")
    on = [local_facts(["cpu"], "fp32", world, cpu=lambda: "AMD EPYC (AVX512)") for world in (2, 3)]
    cfg = Config()
    two, three = (run_identity(resolve_run(cfg, "ddp"), w, data, hw) for w, hw in zip((2, 3), on))
    assert two.key == three.key and two.world_size is None
    cfg.ddp.sync_bn = False
    two, three = (run_identity(resolve_run(cfg, "ddp"), w, data, hw) for w, hw in zip((2, 3), on))
    assert two.key != three.key
    assert "written by 2 process(es), this run has 3" in three.difference(two.to_record())
