"""The whole step as one CUDA graph (pipeline/numerics/graphed_step.py, issue 30), on a CPU.

No GPU here, so the graph is a stand-in behind the module's seam (`new_graph`): its capture
records the step without running it, as a CUDA capture does, and each replay calls what it
captured on the static buffers. Through the real build and epoch loop that is the same
control flow the GPU runs (warm-up, capture, replay; the lr in a tensor the step reads), and
it must compute exactly what the eager loop computes. Whether CUDA captures it is for a GPU.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from pipeline.config import Config
from pipeline.context import DistContext
from pipeline.data.device_data import to_device
from pipeline.data.download import convert
from pipeline.numerics.build import build_training, speed_features
from pipeline.numerics.graphed_step import GraphedStep, step_graph
from pipeline.numerics.optim import set_lr
from pipeline.numerics.totals import Totals
from pipeline.run_spec import resolve_run
from pipeline.strategies import fsdp, single
from pipeline.training.trainer import Trainer

CPU = DistContext(rank=0, local_rank=0, world_size=1, gpus=())
CUDA = torch.device("cuda", 0)
WARMUP = 2  # eager steps before the capture: fewer than the real 11, so a short run replays


class FakeGraph:
    """A `Graph` that records what it is asked: the capture keeps the function without
    running it; each replay runs it, noting which buffers the step read."""

    def __init__(self, log: list) -> None:
        self.log, self.fn = log, None

    def capture(self, fn) -> None:
        self.log.append("capture")
        self.fn = fn

    def replay(self) -> None:
        self.log.append("replay")
        self.fn()


class NoStop:
    flag = False

    def agreed(self) -> bool:
        return False


def config() -> Config:
    cfg = Config()
    cfg.model.width, cfg.train.batch_size, cfg.train.epochs = 4, 16, 2
    # an lr that changes every step, momentum and weight decay: state the graph must carry
    cfg.train.lr_schedule, cfg.train.warmup_epochs = "cosine", 0.5
    cfg.train.momentum, cfg.train.weight_decay = 0.9, 1e-3
    return cfg


@pytest.fixture(scope="module")
def data(raw_dataset):
    return to_device(convert(raw_dataset[0]), CPU.device, 64, 32)  # 4 steps of 16


def train(data, graphed_log: list | None):
    """Two epochs of `single` through the loop: eager, or graphed with the fake graph."""
    cfg = config()
    spec = resolve_run(cfg, "single")
    plan = spec.job_plan(1, len(data.train_labels))
    training = build_training(spec, CPU, data, plan)
    if graphed_log is not None:
        step = GraphedStep(training.optimizer, CPU.device, lambda: FakeGraph(graphed_log), WARMUP)
        training = replace(training, graphed=step)
        # the step reads the images it replays from the static buffer, never the batch's
        seen = graphed_log
        forward = training.forward

        def watched(x):
            if step.static is not None:
                seen.append(("images", x.data_ptr() == step.static[0].data_ptr()))
            return forward(x)

        training = replace(training, forward=watched)
    totals = Totals.zeros(CPU.device)
    per_epoch = []
    for epoch in range(cfg.train.epochs):
        assert Trainer(training, CPU, NoStop()).train_epoch(epoch, 0, totals) is None
        per_epoch.append(totals.tensor.clone())
        totals.zero_()  # in place, as the session does: the graph adds into this tensor
    return training, per_epoch


@pytest.fixture(scope="module")
def runs(data):
    """The eager run, and the graphed one with its log."""
    log: list = []
    return train(data, None), train(data, log), log


def test_the_graphed_step_computes_exactly_what_the_eager_step_computes(runs):
    (eager, eager_totals), (graphed, graphed_totals), log = runs
    # 8 steps: 2 eager, the capture (not run), then the capturing step and 5 more replayed
    events = [e for e in log if isinstance(e, str)]
    assert events == ["capture"] + ["replay"] * 6
    assert [e for e in log if not isinstance(e, str)] == [("images", True)] * 6
    # bitwise: parameters, BatchNorm's running statistics, momentum buffers, totals
    for (name, a), b in zip(
        eager.run.module.state_dict().items(), graphed.run.module.state_dict().values()
    ):
        assert torch.equal(a, b), name
    for p, q in zip(eager.run.module.parameters(), graphed.run.module.parameters()):
        assert torch.equal(
            eager.optimizer.state[p]["momentum_buffer"],
            graphed.optimizer.state[q]["momentum_buffer"],
        )
    assert all(torch.equal(a, b) for a, b in zip(eager_totals, graphed_totals))
    assert graphed_totals[1][2] == 64  # the second epoch counted its 64 samples, replayed
    # between steps the lr is the float the schedule set (checkpoints keep a float)
    assert graphed.optimizer.param_groups[0]["lr"] == eager.optimizer.param_groups[0]["lr"]
    assert isinstance(graphed.optimizer.param_groups[0]["lr"], float)


def test_one_graphed_micro_batch_makes_the_update_the_eager_step_makes(data):
    """The step the graph captures is the eager step itself (`Trainer.graph_step`): from the
    same model and batch, one captured and replayed step leaves the same parameters, BatchNorm
    statistics, momentum buffers and totals as one eager step, bit for bit."""
    cfg = config()
    spec = resolve_run(cfg, "single")
    plan = spec.job_plan(1, len(data.train_labels))
    eager, graphed = (build_training(spec, CPU, data, plan) for _ in range(2))
    log: list = []
    capture_at_once = GraphedStep(graphed.optimizer, CPU.device, lambda: FakeGraph(log), 0)
    graphed = replace(graphed, graphed=capture_at_once)
    before = {k: v.clone() for k, v in eager.run.module.state_dict().items()}
    totals = {"eager": Totals.zeros(CPU.device), "graphed": Totals.zeros(CPU.device)}
    for name, training in (("eager", eager), ("graphed", graphed)):
        set_lr(training.optimizer, training.schedule.at(2))  # past the warm-up's first steps
        _, micro_batches = next(iter(training.loader.epoch(0, 0)))
        ((x, y),) = micro_batches  # grad_accum 1: the one micro-batch a graph takes
        trainer = Trainer(training, CPU, NoStop())
        if training.graphed is None:
            trainer.step(micro_batches, totals[name])
        else:
            training.graphed(trainer.graph_step, x, y, totals[name])
    assert log == ["capture", "replay"]  # captured, not run, then run once by the replay
    after = eager.run.module.state_dict()
    assert any(not torch.equal(before[k], v) for k, v in after.items())  # it did update
    for (name, a), b in zip(after.items(), graphed.run.module.state_dict().values()):
        assert torch.equal(a, b), name
    for p, q in zip(eager.run.module.parameters(), graphed.run.module.parameters()):
        assert torch.equal(
            eager.optimizer.state[p]["momentum_buffer"],
            graphed.optimizer.state[q]["momentum_buffer"],
        )
    assert torch.equal(totals["eager"].tensor, totals["graphed"].tensor)
    assert totals["graphed"].read().samples == 16  # the batch's samples, counted by the replay


def test_a_replay_into_other_totals_is_refused(runs, data):
    _, (graphed, _), _ = runs
    assert graphed.graphed is not None
    x, y = data.train_images[:16], data.train_labels[:16]
    with pytest.raises(RuntimeError, match="not the tensor it was captured with"):
        graphed.graphed(lambda *a: None, graphed.loader.prepare(x), y, Totals.zeros(CPU.device))


def decide(
    cfg: Config,
    device=CUDA,
    world_size=1,
    devices=("cuda:0",),
    precision="bf16",
    facts=single.FACTS,
):
    return step_graph(cfg.train, facts.cuda_graphs, device, world_size, list(devices), precision)


def test_where_the_step_graph_applies_and_why_not_elsewhere():
    cfg = Config()
    cfg.train.cuda_graph = "none"  # what auto resolves to where nothing was measured
    assert decide(cfg) == (False, "default", [])
    cfg.train.cuda_graph, cfg.train.compile, cfg.train.compile_mode = (
        "step",
        True,
        "reduce-overhead",
    )
    applied, mode, notes = decide(cfg)
    assert applied and mode == "default"  # compile's own graphs give way to the step's
    assert notes == [
        "cuda_graph step: the whole training step is one CUDA graph, captured after 11 eager steps",
        "compile mode reduce-overhead: default instead, inside the step's graph",
    ]
    cfg.train.compile_mode = "max-autotune"
    assert decide(cfg)[1] == "max-autotune-no-cudagraphs"

    def why(**kw) -> str:
        applied, _, notes = decide(cfg, **kw)
        assert not applied
        (note,) = notes
        return note

    assert why(device=torch.device("cpu")) == (
        "cuda_graph step: not applied (CUDA graphs need a GPU); eager steps"
    )
    assert "this strategy takes no CUDA graphs" in why(facts=fsdp.FACTS)
    assert "one device only; this one: 2 process(es) on 2 device(s)" in why(
        world_size=2, devices=("cuda:0", "cuda:1")
    )
    assert "1 process(es) on 2 device(s)" in why(devices=("cuda:0", "cuda:1"))  # dp's replicas
    assert "precision fp16 stays eager" in why(precision="fp16")
    cfg.train.grad_accum = 2
    assert "grad_accum > 1" in why()


def test_the_run_records_which_speed_options_applied(data):
    cfg = config()
    cfg.train.cuda_graph = "step"  # asked, on the CPU: not applied, and the features say so
    spec = resolve_run(cfg, "single")
    plan = spec.job_plan(1, len(data.train_labels))
    training = build_training(spec, CPU, data, plan)
    assert training.graphed is None
    assert "cuda_graph step: not applied (CUDA graphs need a GPU); eager steps" in training.notes
    assert training.features == {
        "precision": "fp32",
        "channels_last": False,
        "compile": "off",
        "cuda_graphs": "none",
    }


def test_the_speed_features_name_which_cuda_graphs_ran():
    def graphs(mode, strategy_takes=True, graphed=False, device=CUDA):
        return speed_features("bf16", True, mode, strategy_takes, graphed, device)["cuda_graphs"]

    assert graphs("reduce-overhead") == graphs("max-autotune") == "compile"
    assert graphs("reduce-overhead", device=torch.device("cpu")) == "none"  # no effect there
    assert graphs("default") == graphs(None) == "none"
    assert graphs("default", graphed=True) == "step"
    # fsdp compiles reduce-overhead in the default mode (compile_forward): no graphs
    assert speed_features("bf16", False, "reduce-overhead", False, False, CUDA) == {
        "precision": "bf16",
        "channels_last": False,
        "compile": "default",
        "cuda_graphs": "none",
    }
