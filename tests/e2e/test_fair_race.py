"""A fair race (issue 51): the quickstart on a new MLflow store, with the strategies in
params.yaml's order and reversed, answers every objective the same (ties allowed), and calls
its A/A group (single, dp and balanced_dp: one computation on the CPU) a tie in both orders."""

import json
import shutil

from pipeline.strategies import NAMES
from support import run

# on top of params.yaml's `quick`: what the test mirror holds, in seconds per stage
SMALL = ["data.limit_train=512", "data.limit_test=128", "train.epochs=2", "train.batch_size=32"]
SMALL += ["predict.gpus=[]"]  # the race is the measured answer's: no predictions
# Every strategy as one process of one thread (tests' OMP_NUM_THREADS=1), as gpu-check runs
# them on one device: each takes one core, so the load `make test` puts on the other core
# (its second worker) weighs on every strategy alike. With ddp, fsdp and pipeline_parallel on
# 2 processes (the mesh strategies on 2 and 4), their second core was idle in one order and
# busy in the other, and the answer followed the neighbour's load, which no A/A pair of
# one-core runs can see. One process each also leaves memory_balance with nothing to rank.
ONE_CORE_EACH = ["ddp.nproc=1", "fsdp.nproc=1", "pipeline_parallel.nproc=1"]
ONE_CORE_EACH += ["channel_parallel.nproc=1", "hybrid.data=1", "hybrid.channel=1"]
NEW_STORE = "sqlite:///new-store.db"  # relative: created by the quickstart itself, not a copy


def quickstart(project, order: list[str]) -> dict:
    """The quickstart with the strategies in `order` on a new store; its recommendation.json."""
    (project / "new-store.db").unlink(missing_ok=True)
    for folder in ("results", "checkpoints", "reports"):  # else the stages would resume
        shutil.rmtree(project / folder, ignore_errors=True)
    strategies = f"strategies=[{','.join(order)}]"
    command = ("python", "-m", "pipeline.quickstart", strategies, *SMALL, *ONE_CORE_EACH)
    run(project, *command, timeout=600, MLFLOW_TRACKING_URI=NEW_STORE)
    return json.loads((project / "reports/recommendation.json").read_text())


def test_either_order_on_a_new_store_gives_the_same_answer(fetched_project):
    project = fetched_project(report={"target_accuracy": 0.5})
    forward = quickstart(project, list(NAMES))
    reverse = quickstart(project, list(reversed(NAMES)))
    for name, answer in (("forward", forward), ("reverse", reverse)):
        noise = answer["speed_noise"]
        assert noise["group"] == ["single", "dp", "balanced_dp"], name
        assert noise["floors"]["throughput"] is not None, name
        assert noise["text"].startswith("Speed noise: single, dp and balanced_dp run"), name
        # the A/A group is one computation: where one of it leads, all of it that was ranked
        # ties (a run that waited over half its time for a core is shown, not ranked)
        throughput = answer["objectives"]["throughput"]
        picks = throughput["strategies"]
        busy = "machine busy: not ranked: "
        reasons = throughput["reasons"]
        shown = {r.removeprefix(busy).split()[0] for r in reasons if r.startswith(busy)}
        if picks[0] in noise["group"]:
            assert set(noise["group"]) - shown <= set(picks), (name, reasons)
    assert forward["objectives"]["memory_balance"]["strategies"] == []  # one device each
    for objective, told in forward["objectives"].items():
        again = reverse["objectives"][objective]
        assert set(told["strategies"]) & set(again["strategies"]) or not (
            told["strategies"] or again["strategies"]
        ), (objective, told, again)
