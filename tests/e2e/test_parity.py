"""The parallel strategies train the same model as `single` (CPU, real torchrun runs via the CLI).

fp32 training of this network is chaotic (a 1e-7 nudge to single's own weights can grow to
~1e-2 in 10 steps at lr 0.1), so exact parity is checked in fp64, where every strategy below
lands within 1e-14 of `single` after 10 optimizer steps from the same seed and global batch
(pipeline with one chunk: bit-identical); the issue asks for 1e-5, the tests assert 1e-9.
ddp, fsdp and pipeline_parallel run with gradient accumulation (2 micro-steps: DDP's no_sync,
FSDP's unsharded accumulation and the pipeline's micro-batches in play), against `single`
with the same; without it run the pipeline's one-chunk layouts, and dp and balanced_dp (one
device on the CPU, so they run unsplit). In fp32 the same runs end about 0.014 apart
relative to how far training moved the weights (single on 2 threads vs 1 thread differs as
much): chaos, not a fault, so fp32 is not compared; fsdp's bf16 mixed precision is checked to
train. Under bf16 autocast the pipeline (one chunk, its two stages in processes of their own)
is compared with single under the same autocast.

The runs are shared between tests (module-scoped) and grouped by setting; each group trains
in its own project copy (own results/ and MLflow store), its stages one after the other in one
process as the quickstart runs them, and the groups run side by side.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import torch

import support
from support import make_project, run, tiny_params, train_in_one_process

WIDTH, SEED = 8, 0
# support.TEN_STEPS (at this width and seed), each strategy at 2 processes
TEN_STEPS = [
    *support.TEN_STEPS,
    "ddp.nproc=2",
    "ddp.sync_bn=true",
    "fsdp.nproc=2",
    "fsdp.sync_bn=true",
    "pipeline_parallel.stages=2",
]
FP64 = [*TEN_STEPS, "train.precision=fp64"]
BF16 = [*TEN_STEPS, "train.precision=bf16"]
ONE_CHUNK = ["pipeline_parallel.microbatches=1"]  # BatchNorm over the whole batch, as in single

# group -> [(label, strategy, overrides)]; `single` comes first and is the reference
RUNS = {
    "fp64": [
        ("single", "single", FP64),
        # DataParallel has one device here: it runs unsplit, the replica is the model itself
        ("dp", "dp", FP64),
        ("balanced_dp", "balanced_dp", [*FP64, "balanced_dp.gpu0_bsz=2"]),
        ("pipeline_parallel", "pipeline_parallel", [*FP64, *ONE_CHUNK]),
        # both stages in one process, as on a machine with one GPU (a looped schedule)
        (
            "pipeline_parallel_1proc",
            "pipeline_parallel",
            [*FP64, *ONE_CHUNK, "pipeline_parallel.nproc=1"],
        ),
    ],
    "fp64_accum2": [
        ("single", "single", [*FP64, "train.grad_accum=2"]),
        ("ddp", "ddp", [*FP64, "train.grad_accum=2"]),
        ("fsdp", "fsdp", [*FP64, "train.grad_accum=2"]),
        ("pipeline_parallel", "pipeline_parallel", [*FP64, *ONE_CHUNK, "train.grad_accum=2"]),
        # Two pipeline micro-batches of 16 normalise and average exactly as single's two
        # accumulation micro-steps of 16 do: the same computation, through the 1F1B schedule.
        (
            "pipeline_parallel_1f1b_2chunks",
            "pipeline_parallel",
            [*FP64, "pipeline_parallel.microbatches=2", "pipeline_parallel.schedule=1f1b"],
        ),
        # the same with both stages in one process: the looped Interleaved1F1B schedule
        (
            "pipeline_parallel_1proc_1f1b_2chunks",
            "pipeline_parallel",
            [
                *FP64,
                "pipeline_parallel.microbatches=2",
                "pipeline_parallel.schedule=1f1b",
                "pipeline_parallel.nproc=1",
            ],
        ),
    ],
    "fp32": [
        ("single", "single", TEN_STEPS),
        ("fsdp_bf16", "fsdp", [*TEN_STEPS, "fsdp.mixed_precision=bf16"]),
    ],
    "bf16": [
        ("single", "single", BF16),
        ("pipeline_parallel", "pipeline_parallel", [*BF16, *ONE_CHUNK]),
    ],
}
FP64_BOUND = 1e-9


@dataclass
class Trained:
    state: dict  # results/<strategy>/model.pt
    metrics: dict  # results/<strategy>/summary.json
    precision: str  # what the run computed in, as its identity records it


@pytest.fixture(scope="module")
def fetched_template(tmp_path_factory, http_mirror):
    project = make_project(tmp_path_factory.mktemp("parity") / "template", tiny_params(http_mirror))
    run(project, "python", "-m", "pipeline.fetch")
    return project


@pytest.fixture(scope="module")
def trained(fetched_template) -> dict[str, dict[str, Trained]]:
    def train_group(group: str) -> dict[str, Trained]:
        project = shutil.copytree(fetched_template, fetched_template.parent / group)
        out = {}
        # one thread per process: every strategy runs the same kernels (single's thread
        # count would otherwise differ), and the groups share the cores without spinning
        kept = train_in_one_process(project, RUNS[group], OMP_NUM_THREADS="1")
        for label, _, _ in RUNS[group]:
            latest = json.loads((kept / label / "latest.json").read_text())
            out[label] = Trained(
                torch.load(kept / label / "model.pt"),
                json.loads((kept / label / "summary.json").read_text()),
                latest["identity"]["hardware"]["precision"],
            )
        return out

    with ThreadPoolExecutor(len(RUNS)) as pool:
        return dict(zip(RUNS, pool.map(train_group, RUNS)))


def max_abs_diff(reference: dict, other: dict) -> float:
    """Largest difference over every parameter and buffer; the keys must be the same."""
    assert list(other) == list(reference), "state_dict keys differ from the plain model's"
    return max((other[k].double() - reference[k].double()).abs().max().item() for k in reference)


@pytest.mark.parametrize(
    "group,label", [(g, label) for g in ("fp64", "fp64_accum2") for label, _, _ in RUNS[g][1:]]
)
def test_fp64_matches_single(trained, group, label):
    runs = trained[group]
    diff = max_abs_diff(runs["single"].state, runs[label].state)
    print(f"{group} {label}: max |param/buffer - single| = {diff:.3g}")
    assert diff < FP64_BOUND


def test_fsdp_bf16_trains(trained):
    bf16, single = trained["fp32"]["fsdp_bf16"], trained["fp32"]["single"]
    assert list(bf16.state) == list(single.state)
    assert all(v.dtype == single.state[k].dtype for k, v in bf16.state.items())
    assert all(torch.isfinite(v.double()).all() for v in bf16.state.values())
    # The epoch's mean training loss (10 steps, the first at chance, ln 10 = 2.30) is where
    # fp32's is: measured 1.36 in bf16, 1.40 in fp32. (Test accuracy says little after 10
    # steps: BatchNorm's running statistics have not settled yet.)
    assert bf16.metrics["epochs"] == 1
    loss, fp32_loss = bf16.metrics["train_loss"], single.metrics["train_loss"]
    assert fp32_loss < 1.7 and abs(loss - fp32_loss) < 0.15, (loss, fp32_loss)
    assert any("bf16" in note for note in bf16.metrics["notes"])


def test_pipeline_parallel_trains_in_bf16_as_single_does(trained):
    """Two processes, a stage each, exchanging bf16 activations and gradients over gloo."""
    single, piped = trained["bf16"]["single"], trained["bf16"]["pipeline_parallel"]
    assert single.precision == piped.precision == "bf16"
    assert not any("running fp32 instead" in note for note in piped.metrics["notes"])
    diff = max_abs_diff(single.state, piped.state)
    print(f"bf16 pipeline_parallel: max |param/buffer - single| = {diff:.3g}")
    assert diff == 0.0  # measured: the same kernels on the same shapes, so the same bits
    assert piped.metrics["train_loss"] == single.metrics["train_loss"]


def test_pipeline_notes_record_the_split_and_batchnorm(trained):
    one_chunk = trained["fp64"]["pipeline_parallel"].metrics["notes"]
    two_chunks = trained["fp64_accum2"]["pipeline_parallel_1f1b_2chunks"].metrics["notes"]
    assert any("split at [3]" in note for note in one_chunk)
    assert not any("BatchNorm" in note for note in one_chunk)
    assert any("BatchNorm statistics per pipeline micro-batch" in note for note in two_chunks)
    looped = trained["fp64"]["pipeline_parallel_1proc"].metrics
    assert looped["world_size"] == 1 and looped["devices"] == ["cpu"]
    assert any("2 stages on 1 process: no overlap" in note for note in looped["notes"])


@pytest.mark.parametrize("label", ["dp", "balanced_dp"])
def test_data_parallel_runs_unsplit_on_the_cpu_and_says_so(trained, label):
    metrics = trained["fp64"][label].metrics
    assert metrics["strategy"] == label and metrics["devices"] == ["cpu"]
    assert metrics["batch_split"] == [32]  # the whole micro-batch on the one device
    assert any("runs unsplit" in note for note in metrics["notes"])


def test_gpu0_bsz_above_the_micro_batch_exits_2_with_one_line(fetched_template):
    proc = run(
        fetched_template,
        "python",
        "-m",
        "pipeline.train",
        "balanced_dp",
        "balanced_dp.gpu0_bsz=999",
        check=False,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "balanced_dp.gpu0_bsz" in lines[0] and "999" in lines[0], lines


def test_pipeline_stages_beyond_blocks_exit_2(fetched_template):
    proc = run(
        fetched_template,
        "python",
        "-m",
        "pipeline.train",
        "pipeline_parallel",
        "pipeline_parallel.stages=7",
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0  # one line, no traceback
    assert proc.stderr.startswith("error: pipeline_parallel.stages: got 7")
    assert "at most 6" in proc.stderr
