"""Ranks that shared one GPU (devices: "0,0", issue 48 goal 1) in the run's records and the
report: each rank's memory is its own and ranked, their time is no speed and is not."""

from test_answer import SINGLE, TARGET, by_objective, rows_of, run

from pipeline import memory
from pipeline.context import DistContext
from pipeline.recording.recorder import shared_note
from pipeline.reporting import answer, table
from pipeline.results import RunSummary, device_metric, device_of, parse_device_metric

# ddp as 2 ranks on GPU 0: each rank's own peak; faster than single on paper
SHARED = run("ddp", ["cuda:0", "cuda:0"], 4.0, 0.89, {"gpu_0_rank0": 60.0, "gpu_0_rank1": 58.0})
SHARED.shared_devices = {"0": 2}


def test_each_rank_of_a_shared_gpu_has_its_own_label():
    shared = DistContext(rank=1, local_rank=1, world_size=2, gpus=("0",), placement=(0, 0))
    own = DistContext(rank=1, local_rank=1, world_size=2, gpus=("0", "1"))
    assert memory.rank_label("cuda:0", shared) == "gpu_0_rank1"
    assert memory.rank_label("cuda:1", own) == "gpu_1"
    key = device_metric("gpu_0_rank1", "", "allocated")
    assert parse_device_metric(key) == ("gpu_0_rank1", "", "allocated")
    assert device_of("gpu_0_rank1") == "gpu_0" and device_of("node1_gpu_5") == "node1_gpu_5"


def test_the_note_says_what_the_figures_of_a_shared_run_mean():
    assert shared_note({}, True) is None
    note = shared_note({"0": 2}, True)
    assert note.startswith("shared-device: its ranks shared GPUs (2 on GPU 0;")
    assert "no throughput, speedup or time to target is ranked" in note
    assert "each replica's memory" in shared_note({"0": 2}, False)
    back = RunSummary.from_json(SHARED.to_json())
    assert back.shared_devices == {"0": 2} and "shared_devices" not in back.memory


def test_a_shared_run_counts_its_gpu_once_and_has_no_speedup():
    rows = {r["strategy"]: r for r in rows_of([SINGLE, SHARED])}
    ddp = rows["ddp"]
    assert ddp["n_devices"] == 1 and ddp["world_size"] == 2
    assert ddp["speedup_vs_single"] is None and ddp["scaling_efficiency"] is None
    head, body = table.table_cells(list(rows.values()), TARGET)
    cells = dict(zip(head, body[1]))
    assert cells["devices (processes)"] == "1 (2, shared-device)"
    assert cells["speedup vs single (scaling efficiency)"] == "n/a (shared-device)"
    assert "1 (2, shared-device)" in table.text_table(list(rows.values()), TARGET)


def test_no_speed_is_ranked_from_a_shared_run_but_its_memory_is():
    a = answer.recommend(rows_of([SINGLE, SHARED]), TARGET)
    assert a.hardware == "1 GPU (gpu_0)"
    rec = by_objective(a)
    left_out = "not ranked, its ranks shared a GPU (shared-device): ddp"
    for objective in ("fastest_to_target", "throughput"):
        assert rec[objective].strategies == ("single",)
        assert rec[objective].reasons[-1] == left_out
    assert rec["peak_memory"].strategies == ("ddp",)  # each rank's own peak: 60 < 100 MiB
    balance = " ".join(rec["memory_balance"].reasons)
    assert "over its 2 ranks sharing 1 GPU (gpu_0_rank0 60, gpu_0_rank1 58 MiB)" in balance
