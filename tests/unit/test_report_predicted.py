"""The report's "On N devices (predicted)" section (pipeline/reporting/predicted.py) and the
compare stage's reading of the predict stage's document (results.read_predictions): every
figure is marked predicted, and a real run on N devices at the same settings stands beside
its prediction with the error; nothing else does."""

from __future__ import annotations

import json

import pytest

from pipeline.errors import UserError
from pipeline.reporting import predicted
from pipeline.results import read_predictions

SETTINGS = {"model.width": 8, "train.batch_size": 64, "train.grad_accum": 1}


def document(device: str = "cpu") -> dict:
    row = {
        "strategy": "ddp",
        "devices_used": 2,
        "predicted_step_s": 0.1,
        "predicted_epoch_s": 2.0,
        "predicted_samples_per_s": 640.0,
        "predicted_speedup": 1.5,
        "predicted_efficiency": 0.75,
        "exposed_communication_s": 0.02,
        "band": 0.23,
        "checked": "±23% on 2 CPU processes (the check)",
    }
    return {
        "kind": "predicted",
        "device": device,
        "measured_on": "CPU processes (x86_64)",
        "link": {"name": "gloo", "busbw_GBps": 1.5, "latency_us": 900.0, "source": "measured"},
        "settings": {**SETTINGS, "train.precision": "fp32", "train_samples": 1280},
        "single_step_s": 0.15,
        "by_devices": {"2": {"ddp": row}, "4": {}},
        "not_predicted": {"dp": "not predicted: DataParallel's threads are not modelled"},
        "leaves_out": ["NCCL's own buffers"],
    }


def run_row(world: int = 2, devices: list[str] | None = None, steady: float = 2.5) -> dict:
    return {
        "strategy": "ddp",
        "world_size": world,
        "devices": devices or ["cpu"] * world,
        "steady_epoch_s": steady,
    }


CONFIG = {"model": {"width": 8}, "train": {"batch_size": 64, "grad_accum": 1, "precision": "fp32"}}


def test_a_run_on_n_devices_at_the_same_settings_checks_the_prediction():
    checked = predicted.comparisons(document(), [run_row()], {"ddp": CONFIG})
    assert checked == {("2", "ddp"): (2.0, 2.5)}
    md = predicted.markdown(document(), [run_row()], {"ddp": CONFIG})
    assert "2.50 (-20%, within its band)" in md  # the band: ±23%


def test_a_measured_error_beyond_the_band_says_so():
    assert predicted.measured_cell(2.0, 2.5, 0.23) == "2.50 (-20%, within its band)"
    assert predicted.measured_cell(2.0, 3.2, 0.34) == "3.20 (-38%, outside its band)"
    assert predicted.measured_cell(2.0, 1.6, 0.23) == "1.60 (+25%, outside its band)"
    assert predicted.measured_cell(2.0, 2.5, None) == "2.50 (-20%)"  # no band to be inside


@pytest.mark.parametrize(
    "row, config",
    [
        (run_row(world=1), CONFIG),  # another N
        (run_row(steady=None), CONFIG),  # no steady figure
        (run_row(), {**CONFIG, "model": {"width": 16}}),  # other settings
        (run_row(), {}),  # a config that could not be read
        (run_row(devices=["cuda:0", "cuda:1"]), CONFIG),  # GPUs, not CPU processes
    ],
)
def test_nothing_else_stands_beside_a_prediction(row, config):
    assert predicted.comparisons(document(), [row], {"ddp": config}) == {}


def test_on_gpus_n_distinct_gpus_check_it():
    gpus = run_row(devices=["cuda:0", "cuda:1"])
    assert predicted.comparisons(document("cuda"), [gpus], {"ddp": CONFIG}) != {}
    shared = run_row(devices=["cuda:0", "cuda:0"])  # two ranks on one GPU: not 2 GPUs
    assert predicted.comparisons(document("cuda"), [shared], {"ddp": CONFIG}) == {}


def test_every_figure_of_the_section_says_predicted():
    md = predicted.markdown(document(), [], {})
    assert md.startswith("## On N devices (predicted)\n")
    assert "PREDICTED, not measured" in md
    header = next(line for line in md.splitlines() if line.startswith("| strategy"))
    figures = header.split(" | ")[2:-1]
    assert figures and all("(predicted)" in cell for cell in figures)
    assert "±23%" in md and "NCCL's own buffers" in md and "dp: not predicted" in md
    assert "On 4 devices" not in md  # nothing predicted there: no empty table
    page = predicted.html_section(document(), [], {})
    assert "On 2 devices (predicted)" in page and "<table>" in page


def test_mlflow_gets_names_no_one_reads_as_a_measurement():
    metrics = predicted.mlflow_metrics(document())
    assert metrics == {
        "predicted_2dev_ddp_epoch_s": 2.0,
        "predicted_2dev_ddp_speedup": 1.5,
        "predicted_2dev_ddp_efficiency": 0.75,
    }


def strategy_doc(name: str, **more) -> dict:
    base = document()
    keep = ("measured_on", "device", "link", "settings", "leaves_out")
    return {
        "kind": "predicted",
        "strategy": name,
        **{k: base[k] for k in keep},
        "band": 0.23,
        "checked": "±23% on 2 CPU processes (the check)",
        "by_devices": {},
        **more,
    }


def test_the_documents_combine_into_one_with_speedups_over_singles_baseline():
    row = {**document()["by_devices"]["2"]["ddp"]}
    for figure in ("predicted_speedup", "predicted_efficiency", "band", "checked"):
        del row[figure]  # what the report works out, and what the strategy's document holds
    docs = {
        "single": strategy_doc("single", baseline_step_s=0.15),
        "dp": strategy_doc("dp", not_predicted="not predicted: threads"),
        "ddp": strategy_doc("ddp", by_devices={"8": row, "2": row}),
    }
    shown = predicted.combine(docs)
    assert list(shown["by_devices"]) == ["2", "8"]  # by N, as numbers
    ddp = shown["by_devices"]["2"]["ddp"]
    assert ddp["predicted_speedup"] == pytest.approx(1.5)
    assert ddp["predicted_efficiency"] == pytest.approx(0.75)
    assert shown["not_predicted"] == {"dp": "not predicted: threads"}
    other = {**docs["single"], "settings": {**docs["single"]["settings"], "model.width": 16}}
    unlike = predicted.combine({**docs, "single": other})  # a baseline at other settings
    assert unlike["single_step_s"] is None
    assert "predicted_speedup" not in unlike["by_devices"]["2"]["ddp"]
    assert "No baseline" in predicted.markdown(unlike, [], {})
    assert predicted.combine({}) is None


def test_compare_reads_the_documents_of_its_strategies_where_they_ran(tmp_path):
    assert read_predictions(["single", "ddp"], tmp_path) == {}
    (tmp_path / "ddp.json").write_text(json.dumps(strategy_doc("ddp")))
    (tmp_path / "fsdp.json").write_text(json.dumps(strategy_doc("fsdp")))
    assert read_predictions(["single", "ddp"], tmp_path) == {"ddp": strategy_doc("ddp")}


@pytest.mark.parametrize("text", ["{", "[]", '{"kind": "measured"}'])
def test_a_document_that_is_not_the_stages_is_refused_in_one_line(tmp_path, text):
    path = tmp_path / "ddp.json"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        read_predictions(["ddp"], tmp_path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    assert "python -m pipeline.predict ddp" in message


def gpu_document() -> dict:
    doc = document("cuda")
    doc["by_devices"]["2"]["ddp"].update(predicted_peak_mib={"0": 105.0}, resident_data_mib=50.0)
    return doc


def shared_row(world: int = 2, peaks: dict | None = None) -> dict:
    row = run_row(world, ["cuda:0"] * world, steady=9.0)
    row["shared_devices"] = {"0": world}
    row["peak_memory_mib"] = peaks or {"gpu_0_rank0": 100.0, "gpu_0_rank1": 98.0}
    return row


def test_ranks_sharing_a_gpu_check_the_memory_prediction_never_the_time():
    """2 ddp ranks on one GPU (devices "0,0"): each rank's peak is real, so the busiest one
    stands beside the predicted per-device peak; their time is turns on one device, so none
    stands beside the predicted epoch."""
    rows, configs = [shared_row()], {"ddp": CONFIG}
    assert predicted.shared_memory_checks(gpu_document(), rows, configs) == {
        ("2", "ddp"): (105.0, 100.0)
    }
    assert predicted.comparisons(gpu_document(), rows, configs) == {}
    # ranks on 2 GPUs, 2 a GPU: the time is still turns, not a measure of 2 GPUs
    four = run_row(4, ["cuda:0", "cuda:1", "cuda:0", "cuda:1"])
    four["shared_devices"] = {"0": 2, "1": 2}
    assert predicted.comparisons(gpu_document(), [four], configs) == {}
    md = predicted.markdown(gpu_document(), rows, configs)
    assert "| 105 (shared-device 100, +5%) |  |" in md


@pytest.mark.parametrize(
    "doc, row, config",
    [
        (document("cpu"), shared_row(), CONFIG),  # a CPU's peaks are RSS: not comparable
        (gpu_document(), shared_row(world=4), CONFIG),  # 4 ranks check N=4, not 2
        (gpu_document(), {**shared_row(), "shared_devices": {}}, CONFIG),  # own GPUs
        (gpu_document(), shared_row(), {**CONFIG, "model": {"width": 16}}),  # other settings
    ],
)
def test_only_n_ranks_sharing_gpus_at_the_same_settings_check_the_memory(doc, row, config):
    assert predicted.shared_memory_checks(doc, [row], {"ddp": config}) == {}


def test_strategies_not_predicted_at_an_n_leave_its_table_for_one_line_below():
    doc = document()
    too_many = "this CPU's 2 cores: at most 2 processes"
    fsdp = {**doc["by_devices"]["2"]["ddp"], "strategy": "fsdp"}
    doc["by_devices"]["4"] = {
        "fsdp": fsdp,
        "ddp": {"strategy": "ddp", "not_predicted": too_many},
        "pipeline_parallel": {"strategy": "pipeline_parallel", "not_predicted": too_many},
    }
    md = predicted.markdown(doc, [], {})
    table = md[md.index("### On 4 devices") : md.index("\n- ")]  # the footer follows it
    assert "| fsdp |" in table and "ddp" not in table and too_many not in table
    assert f"- On 4 devices, not predicted for ddp, pipeline_parallel: {too_many}" in md
    assert md.count(too_many) == 1
