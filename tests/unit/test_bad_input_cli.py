"""Bad input through the real command line: exit code 2, one line naming the culprit, no
traceback, and nothing the project kept changed (support.refused).

One project serves every case: fetched data and the kept files of earlier runs of both its
strategies, which each refusal must leave byte-identical. Every input here is refused before
torch is imported or before torchrun starts, so a case costs a process start (a fraction of a
second for params, command line and tracking URIs; a few seconds for the launcher's own
checks). The project's own files, damaged, are tests/e2e/test_bad_files.py's; the params
schema's refusals one by one test_config.py's; the data's test_fetch.py's.
"""

from __future__ import annotations

import json
import shutil

import pytest

from pipeline.config import load_config
from pipeline.data.download import fetch
from pipeline.data.fashion_mnist import DATA_DIR
from pipeline.files import atomic_write
from pipeline.results import (
    CHECKPOINT_RECORD,
    CHECKPOINTS,
    HISTORY,
    METRICS,
    RESULTS,
    RUN_RECORD,
    EpochRow,
    history_csv,
)
from pipeline.tracking.mlflow_run import FINISHED, new_record
from support import make_project, refused, run_summary, tiny_params

STRATEGIES = ("single", "ddp")  # tiny_params'


@pytest.fixture(scope="module")
def project(tmp_path_factory, http_mirror):
    project = make_project(tmp_path_factory.mktemp("bad") / "project", tiny_params(http_mirror))
    fetch(load_config(project / "params.yaml").data, project / DATA_DIR)
    for name in STRATEGIES:
        keep_earlier_run(project, name)
    return project


def keep_earlier_run(project, name: str) -> None:
    """What a finished 2-epoch run of `name` keeps: results/ as the compare stage reads them,
    its checkpoint record and its MLflow run record (checks that must refuse an input come
    before anything reads the checkpoint's own files)."""
    rows = [EpochRow(e, 1.0, 0.5, 1.0, 0.5, 1.0, 512.0, float(e), ended_at=1.0) for e in (1, 2)]
    summary = run_summary(name, ["cpu"], 1.0, 0.5, {})
    summary.fingerprint = f"earlier-{name}"
    results = project / RESULTS / name
    results.mkdir(parents=True)
    atomic_write(results / METRICS, json.dumps(summary.to_json()))
    atomic_write(results / HISTORY, history_csv(rows))
    checkpoints = project / CHECKPOINTS / name
    checkpoints.mkdir(parents=True)
    record = {"fingerprint": summary.fingerprint, "epoch": 2, "step": 0, "directory": "e2-s0"}
    record.update(world_size=1, history=[r.to_record() for r in rows])
    atomic_write(checkpoints / CHECKPOINT_RECORD, json.dumps(record))
    run_record = new_record(summary.fingerprint, "tests", name, {}, {})
    run_record.update(status=FINISHED)
    atomic_write(checkpoints / RUN_RECORD, json.dumps(run_record))


@pytest.mark.parametrize(
    "args, env, words",
    [
        (["pipeline.train", "deepspeed"], {}, ["strategy 'deepspeed' is unknown", "single"]),
        (["pipeline.train"], {}, ["usage: python -m pipeline.train STRATEGY"]),
        (["pipeline.train", "train.epochs=1"], {}, ["the first argument is the strategy"]),
        (["pipeline.train", "single", "--bogus"], {}, ["unrecognized arguments: --bogus"]),
        # named alone, not with the valid key=value arguments after it (issue 68)
        (
            ["pipeline.train", "single", "--gpus", "2", "model.width=8"],
            {},
            ["(unrecognized arguments: --gpus)"],
        ),
        # note 000's flag, read as the devices key it means
        (
            ["pipeline.train", "single", "--devices", "0,3", "model.width=8"],
            {},
            ["devices: GPU 0 is not there"],
        ),
        (["pipeline.train", "single", "--local-rank=0"], {}, ["torch.distributed.launch"]),
        (["pipeline.train", "--params", "nope"], {}, ["unknown params section 'nope'"]),
        (
            ["pipeline.train", "ddp", "train.batch_size=31"],
            {},
            ["train.batch_size: got 31", "multiple of processes x train.grad_accum = 2 x 1"],
        ),
        (["pipeline.train", "ddp", "ddp.nproc=3", "train.batch_size=32"], {}, ["= 3 x 1"]),
        (
            ["pipeline.train", "single", "devices=0"],
            {},
            ["devices: GPU 0 is not there", "visible GPUs: none"],
        ),
        (["pipeline.train", "single", "devices=0,,3"], {}, ["devices: got '0,,3'"]),
        (["pipeline.train", "single", "train.epoch=3"], {}, ["did you mean 'train.epochs'"]),
        (["pipeline.train", "single", "train.lr=-1"], {}, ["train.lr: got -1"]),
        (["pipeline.train", "single"], {"PARALLEL_LAB_FAULT": "rank=x"}, ["PARALLEL_LAB_FAULT"]),
        (["pipeline.fetch", "data.mirrors=[]"], {}, ["data.mirrors: is empty"]),
        # a CUDA image run without its GPUs (no NVIDIA runtime): never a silent CPU run
        (
            ["pipeline.train", "single"],
            {"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": None},
            ["devices: auto found NVIDIA GPUs", "no /dev/nvidia*", "devices=cpu"],
        ),
        (
            ["pipeline.compare", "strategies=[single,nope]"],
            {},
            ["strategies: unknown entry 'nope'"],
        ),
        (["pipeline.publish", "model.width=zero"], {}, ["model.width"]),
    ],
    ids=lambda v: str(v)[:40],
)
def test_refused_with_one_line(project, args, env, words):
    line = refused(project, *args, **env)
    for word in words:
        assert word in line, line


# key=value overrides of `python -m pipeline.train single` that no run could take, each
# refused by name before torch loads (pipeline/config/'s ranges, omegaconf's types)
OVERRIDES = [
    # torch's seed is 64 bits and a negative one wraps; the data order's seed*1000003+epoch
    # must fit too: 0 to 2**32-1 (config.SEED_MAX)
    ("seed=-1", ["seed: got -1, expected >= 0"]),
    ("seed=4294967296", ["seed: got 4294967296, expected <= 4294967295"]),
    ("seed=18446744073709551616", ["seed: got 18446744073709551616"]),
    ("seed=1.5", ["seed", "1.5"]),
    ("seed=yes", ["seed", "bool"]),
    ("train.epochs=0", ["train.epochs: got 0, expected >= 1"]),
    ("train.batch_size=0", ["train.batch_size: got 0"]),
    ("train.grad_accum=0", ["train.grad_accum: got 0"]),
    ("train.lr=nan", ["train.lr: got nan, expected a finite number"]),
    ("train.momentum=1", ["train.momentum: got 1.0, expected < 1.0"]),
    ("train.label_smoothing=1.0", ["train.label_smoothing"]),
    ("train.warmup_epochs=-1", ["train.warmup_epochs: got -1.0"]),
    ("train.precision=fp8", ["train.precision: got 'fp8'", "bf16"]),
    ("data.limit_train=0", ["data.limit_train: got 0"]),
    ("data.loader=gpu", ["data.loader: got 'gpu'", "device, dataloader"]),
    ("data.workers=-1", ["data.workers: got -1"]),
    ("data.mirrors=notalist", ["data.mirrors"]),
    ("data.md5.train-images-idx3-ubyte.gz=xyz", ["data.md5.train-images-idx3-ubyte.gz", "hex"]),
    ("model.width=-8", ["model.width: got -8"]),
    ("checkpoint.every_epochs=-1", ["checkpoint.every_epochs: got -1"]),
    ("report.target_accuracy=1.5", ["report.target_accuracy: got 1.5, expected <= 1.0"]),
    ("report.system_metrics_interval_s=0", ["report.system_metrics_interval_s: got 0"]),
    ("mlflow.experiment=", ["mlflow.experiment: is empty"]),
    ("dist.min_nnodes=3", ["dist.min_nnodes: got 3", "dist.nnodes (1)"]),
    ("dist.join_timeout_s=0", ["dist.join_timeout_s: got 0"]),
    ("strategies=[single,single]", ["strategies", "twice"]),
    ("strategies=single", ["strategies"]),
    ("train=3", ["'train' is a section"]),
    ("nokey", ["override 'nokey': expected key=value"]),
]


@pytest.mark.parametrize("override, words", OVERRIDES, ids=[o for o, _ in OVERRIDES])
def test_values_no_run_could_take(project, override, words):
    line = refused(project, "pipeline.train", "single", override)
    assert all(word in line for word in words), line


# params.yaml itself (None: there is none): never read as "every default", which is the full
# 10-epoch experiment that would overwrite the runs the user meant
PARAMS_FILES = [
    ("", ["params.yaml: is empty"]),
    ("# every key commented out\n", ["params.yaml: is empty"]),
    (None, ["params.yaml: not found"]),
    (b"\xff\xfeseed: 0\n", ["params.yaml: not readable"]),
    ("- seed\n- train\n", ["expected a mapping of sections", "got list"]),
    ("just words\n", ["expected a mapping of sections", "got str"]),
    ("train: [unclosed\n", ["params.yaml: not valid YAML"]),
    ("seed: -1\n", ["seed: got -1"]),
    ("model: 8\n", ["'model' is a section"]),
    ("train:\n  epochs: ten\n", ["train.epochs", "ten"]),
]


@pytest.mark.parametrize("text, words", PARAMS_FILES, ids=[f"p{i}" for i in range(10)])
def test_params_files_no_run_could_take(project, text, words):
    line = with_params(project, text, "pipeline.train", "single")
    assert all(word in line for word in words), line


@pytest.mark.parametrize("text", ["", None], ids=["empty", "missing"])
def test_the_quickstart_refuses_params_it_would_read_as_every_default(project, text):
    line = with_params(project, text, "pipeline.quickstart")
    assert "params.yaml: " in line and ("is empty" in line or "not found" in line), line


def with_params(project, text: str | bytes | None, *command: str) -> str:
    """`refused(project, *command)` with `text` as params.yaml (None: none at all)."""
    params = project / "params.yaml"
    kept = params.read_bytes()
    try:
        if text is None:
            params.unlink()
        else:
            params.write_bytes(text if isinstance(text, bytes) else text.encode())
        return refused(project, *command)
    finally:
        params.write_bytes(kept)


# MLFLOW_TRACKING_URI values that could never work: refused at once by every entry point that
# talks to MLflow (a well-formed URI of a store that is down is an outage instead: training
# goes on and keeps the run locally)
URIS = [
    ("sqlite:/x", ["expected sqlite:///path/mlflow.db"]),
    ("sqlite:///", ["expected sqlite:///path/mlflow.db"]),
    ("sqlite://", ["expected sqlite:///path/mlflow.db"]),
    ("sqlite:///nowhere/mlflow.db", ["nowhere/ does not exist"]),
    ("sqlite:///data", ["is a directory"]),
    ("htp:/nowhere", ["got 'htp:/nowhere'", "expected http(s)://host:port"]),
    ("http://:5000", ["expected http(s)://host[:port]"]),
    ("http://localhost:99999", ["expected http(s)://host[:port]"]),
    ("postgresql:/x", ["expected postgresql://user@host[:port]/database"]),
    ("mysql://db:port/mlflow", ["expected mysql://user@host[:port]/database"]),
    ("file:", ["expected file:/path/to/mlruns"]),
]


@pytest.mark.parametrize("uri, words", URIS, ids=[u for u, _ in URIS])
def test_tracking_uris_that_could_never_work(project, uri, words):
    line = refused(project, "pipeline.train", "single", MLFLOW_TRACKING_URI=uri)
    assert line.startswith(f"error: MLFLOW_TRACKING_URI: got {uri!r}"), line
    assert all(word in line for word in words), line


@pytest.mark.parametrize("command", ["compare", "publish", "quickstart"])
def test_every_entry_point_refuses_a_malformed_tracking_uri(project, command):
    """compare once exited 0 here and rewrote the report without its MLflow links."""
    line = refused(project, f"pipeline.{command}", MLFLOW_TRACKING_URI="sqlite:/x")
    assert "MLFLOW_TRACKING_URI: got 'sqlite:/x'" in line, line


def test_training_without_fetched_data_says_what_to_run(project):
    """Refused before anything runs: no results/dp/ or checkpoints/dp/ made on the way."""
    data = project / DATA_DIR
    data.rename(data.with_name("aside"))
    try:
        line = refused(project, "pipeline.train", "dp")
    finally:
        data.with_name("aside").rename(data)
    assert "data/fashion-mnist/arrays.npz: not found" in line and "dvc repro fetch" in line


def test_unwritable_output_directory(project):
    blocker = project / RESULTS / "dp"
    blocker.write_text("a file where the output directory should be")
    try:
        line = refused(project, "pipeline.train", "dp")
    finally:
        blocker.unlink()
    assert "results/dp/: not writable (Not a directory)" in line


def test_compare_without_results(project):
    results = project / RESULTS
    shutil.move(results / "single", project / "single-aside")
    try:
        line = refused(project, "pipeline.compare")
    finally:
        shutil.move(project / "single-aside", results / "single")
    assert "results/single/summary.json: not found" in line and "train@single" in line
