"""Bad input through the real command line: exit code 2, one line, nothing half-written.

(The params schema's own refusals are in test_config.py, the data's in test_fetch.py, a
checkpoint of another width in test_reliability.py.)
"""

import shutil

import pytest

from support import make_project, run, tiny_params


@pytest.fixture(scope="module")
def project(tmp_path_factory, http_mirror):
    return make_project(tmp_path_factory.mktemp("bad") / "project", tiny_params(http_mirror))


def refused(project, *args, **env):
    proc = run(project, "python", "-m", *args, check=False, **env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    return lines[0]


@pytest.mark.parametrize(
    "args, env, words",
    [
        (["pipeline.train", "horovod"], {}, ["strategy 'horovod' is unknown", "single"]),
        (["pipeline.train"], {}, ["usage: python -m pipeline.train STRATEGY"]),
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
        (
            ["pipeline.train", "single"],
            {"MLFLOW_TRACKING_URI": "htp:/nowhere"},
            ["MLFLOW_TRACKING_URI: got 'htp:/nowhere'"],
        ),
        (
            ["pipeline.train", "single"],
            {"MLFLOW_TRACKING_URI": "http://:5000"},
            ["MLFLOW_TRACKING_URI"],
        ),
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


def test_training_without_fetched_data_says_what_to_run(project):
    line = refused(project, "pipeline.train", "single")
    assert "data/fashion-mnist/tensors.pt: not found" in line and "dvc repro fetch" in line
    assert not (project / "results" / "single" / "metrics.json").exists()


def test_unwritable_output_directory(project, tmp_path):
    blocker = project / "results" / "single"
    shutil.rmtree(blocker, ignore_errors=True)  # an earlier refusal may have made it
    blocker.parent.mkdir(exist_ok=True)
    blocker.write_text("a file where the output directory should be")
    try:
        line = refused(project, "pipeline.train", "single")
    finally:
        blocker.unlink()
    assert "results/single/: not writable" in line


def test_compare_without_results(project):
    line = refused(project, "pipeline.compare")
    assert "results/single/summary.json: not found" in line and "train@single" in line
