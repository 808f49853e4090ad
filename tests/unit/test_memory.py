"""Per-device memory arithmetic, without GPUs: physical ids, gathering, imbalance, summaries."""

from pathlib import Path

import pytest
import torch

from pipeline import memory, results
from pipeline.context import DistContext
from pipeline.memory import DevicePeak
from pipeline.tracking.provenance import gpu_tags, gpu_uuids, shared_tags, stack_tags
from pipeline.tracking.system_metrics import renumber_gpu_keys


def test_renumbered_cuda_index_maps_back_to_the_physical_id():
    # CUDA_VISIBLE_DEVICES="3,5": the run sees cuda:0 and cuda:1
    assert memory.physical_label("cuda:0", ("3", "5")) == "gpu_3"
    assert memory.physical_label("cuda:1", ("3", "5")) == "gpu_5"
    assert memory.physical_label("cuda", ("7",)) == "gpu_7"


def test_dataparallel_reads_every_device_and_ddp_only_its_own():
    one_process = DistContext(rank=0, local_rank=0, world_size=1, gpus=("3", "5"))
    assert memory.local_devices(["cuda:0", "cuda:1"], one_process) == [
        torch.device("cuda", 0),
        torch.device("cuda", 1),
    ]
    rank1 = DistContext(rank=1, local_rank=1, world_size=2, gpus=("3", "5"))
    assert memory.local_devices(["cuda:0", "cuda:1"], rank1) == [torch.device("cuda", 1)]
    cpu = DistContext(rank=1, local_rank=1, world_size=2, gpus=())
    assert memory.local_devices(["cpu", "cpu"], cpu) == []


def test_merge_keeps_rank_order_and_sums_processes_sharing_a_gpu():
    rank0 = [DevicePeak("gpu_3", 100.0, 120.0)]
    rank1 = [DevicePeak("gpu_5", 40.0, 50.0)]
    rank2 = [DevicePeak("gpu_3", 10.0, 20.0)]  # a second process on GPU 3
    merged = memory.merge_peaks([rank0, rank1, rank2])
    assert merged == [DevicePeak("gpu_3", 110.0, 140.0), DevicePeak("gpu_5", 40.0, 50.0)]


def test_imbalance_and_first_share():
    assert memory.imbalance([300.0, 100.0]) == pytest.approx(1.5)
    assert memory.first_share([300.0, 100.0]) == pytest.approx(0.75)
    assert memory.imbalance([5.0, 5.0, 5.0]) == 1.0
    assert memory.first_share([5.0, 5.0]) == 0.5
    assert memory.imbalance([0.0, 0.0]) == 1.0 and memory.first_share([0.0, 0.0]) == 0.5


def test_epoch_metrics_name_devices_by_physical_id_or_rank():
    gpu = memory.epoch_metrics(
        [DevicePeak("gpu_3", 300.0, 400.0), DevicePeak("gpu_5", 100.0, 150.0)]
    )
    assert gpu == {
        "memory/gpu_3_peak_allocated_mib": 300.0,
        "memory/gpu_3_peak_reserved_mib": 400.0,
        "memory/gpu_5_peak_allocated_mib": 100.0,
        "memory/gpu_5_peak_reserved_mib": 150.0,
        "mem_imbalance": pytest.approx(1.5),
        "gpu0_share": pytest.approx(0.75),
    }
    cpu = memory.epoch_metrics([DevicePeak("cpu_0", 900.0, None), DevicePeak("cpu_1", 900.0, None)])
    assert cpu == {
        "memory/cpu_0_peak_rss_mib": 900.0,
        "memory/cpu_1_peak_rss_mib": 900.0,
        "mem_imbalance": 1.0,
        "cpu0_share": 0.5,
    }


def test_epoch_metrics_keep_training_and_evaluation_apart():
    """Training's keys keep their names; evaluation's carry the eval_ prefix."""
    both = memory.epoch_metrics(
        [DevicePeak("gpu_3", 300.0, 400.0), DevicePeak("gpu_5", 100.0, 150.0)],
        [DevicePeak("gpu_3", 50.0, 400.0), DevicePeak("gpu_5", 150.0, 150.0)],
    )
    assert both == {
        "memory/gpu_3_peak_allocated_mib": 300.0,
        "memory/gpu_3_peak_reserved_mib": 400.0,
        "memory/gpu_5_peak_allocated_mib": 100.0,
        "memory/gpu_5_peak_reserved_mib": 150.0,
        "mem_imbalance": pytest.approx(1.5),
        "gpu0_share": pytest.approx(0.75),
        "memory/gpu_3_eval_peak_allocated_mib": 50.0,
        "memory/gpu_3_eval_peak_reserved_mib": 400.0,
        "memory/gpu_5_eval_peak_allocated_mib": 150.0,
        "memory/gpu_5_eval_peak_reserved_mib": 150.0,
        "eval_mem_imbalance": pytest.approx(1.5),
        "eval_gpu0_share": pytest.approx(0.25),
    }


def test_the_cpu_has_no_evaluation_peak_of_its_own():
    """A process's peak RSS during evaluation still holds training's heap (clear_refs resets
    it to the current RSS, not to zero): no eval figure is kept on the CPU, only training's."""
    cpu = memory.epoch_metrics(
        [DevicePeak("cpu_0", 900.0, None), DevicePeak("cpu_1", 900.0, None)],
        [DevicePeak("cpu_0", 700.0, None), DevicePeak("cpu_1", 950.0, None)],
    )
    assert cpu == {
        "memory/cpu_0_peak_rss_mib": 900.0,
        "memory/cpu_1_peak_rss_mib": 900.0,
        "mem_imbalance": 1.0,
        "cpu0_share": 0.5,
    }
    # summary.json says why where the figures would be, also from epochs recorded with them
    recorded = {**cpu, "memory/cpu_0_eval_peak_rss_mib": 700.0, "eval_mem_imbalance": 1.1}
    for epochs in ([cpu], [recorded, cpu]):
        summary = memory.run_summary(epochs)
        assert summary["memory_kind"] == "cpu"
        assert summary["peak_memory_mib"] == {"cpu_0": 900.0, "cpu_1": 900.0}
        assert summary["eval_peak_memory_mib"] == "not separable on CPU" == memory.NOT_SEPARABLE
        assert summary["eval_peak_reserved_mib"] == {} and summary["eval_mem_imbalance"] is None
        assert "eval_cpu0_share" not in summary
    (note,) = memory.notes(torch.device("cpu"))
    assert note.startswith("memory: evaluation's peak is not separable on CPU")
    assert memory.notes(torch.device("cuda", 0)) == []


def test_run_summary_takes_each_devices_highest_epoch():
    history = [
        {
            "epoch": 1,
            "test_acc": 0.5,
            **memory.epoch_metrics(
                [DevicePeak("gpu_3", 300.0, 512.0), DevicePeak("gpu_5", 100.0, 128.0)],
                [DevicePeak("gpu_3", 400.0, 600.0), DevicePeak("gpu_5", 100.0, 128.0)],
            ),
        },
        {
            "epoch": 2,
            "test_acc": 0.6,
            **memory.epoch_metrics(
                [DevicePeak("gpu_3", 250.0, 512.0), DevicePeak("gpu_5", 200.0, 256.0)],
                [DevicePeak("gpu_3", 40.0, 512.0), DevicePeak("gpu_5", 300.0, 256.0)],
            ),
        },
    ]
    summary = memory.run_summary(history)
    assert summary["memory_kind"] == "gpu"
    assert list(summary["peak_memory_mib"]) == ["gpu_3", "gpu_5"]  # device 0 first
    # training's peaks only: evaluation's higher ones do not leak in
    assert summary["peak_memory_mib"] == {"gpu_3": 300.0, "gpu_5": 200.0}
    assert summary["peak_reserved_mib"] == {"gpu_3": 512.0, "gpu_5": 256.0}
    assert summary["mem_imbalance"] == pytest.approx(1.2)
    assert summary["gpu0_share"] == pytest.approx(0.6)
    # evaluation's, apart
    assert summary["eval_peak_memory_mib"] == {"gpu_3": 400.0, "gpu_5": 300.0}
    assert summary["eval_peak_reserved_mib"] == {"gpu_3": 600.0, "gpu_5": 256.0}
    assert summary["eval_mem_imbalance"] == pytest.approx(400.0 / 350.0)
    assert summary["eval_gpu0_share"] == pytest.approx(4.0 / 7.0)
    # how far the training figures moved between the epochs: the answer's noise for memory
    assert summary["peak_memory_spread_mib"] == 50.0  # the busiest device: 300, then 250
    assert summary["mem_imbalance_spread"] == pytest.approx(1.5 - 250.0 / 225.0, abs=1e-4)
    assert memory.run_summary(history[:1])["peak_memory_spread_mib"] is None  # one epoch
    none = memory.run_summary([{"epoch": 1, "test_acc": 0.5}])
    assert none["memory_kind"] == "none" and none["peak_memory_mib"] == {}
    assert none["mem_imbalance"] is None and none["eval_mem_imbalance"] is None
    # epochs recorded before evaluation was measured apart (an old checkpoint): no eval peaks
    old = memory.run_summary([memory.epoch_metrics([DevicePeak("gpu_0", 900.0, 1024.0)])])
    assert old["memory_kind"] == "gpu" and old["peak_memory_mib"] == {"gpu_0": 900.0}
    assert old["eval_peak_memory_mib"] == {} and old["eval_mem_imbalance"] is None


def test_cpu_peak_is_the_process_rss_and_resets_each_epoch():
    ctx = DistContext(rank=2, local_rank=0, world_size=3, gpus=())
    memory.reset_peaks([])
    block = bytearray(300 * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page so it is resident
    (peak,) = memory.read_peaks([], ctx)
    assert peak.label == "cpu_2" and peak.reserved_mib is None and peak.kind == "cpu"
    assert peak.allocated_mib > 300
    del block
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("no /proc/self/clear_refs: the peak cannot be reset here")
    memory.reset_peaks([])
    assert memory.read_peaks([], ctx)[0].allocated_mib < peak.allocated_mib - 200


def test_system_metrics_are_renamed_to_physical_ids():
    sampled = {
        "gpu_0_utilization_percentage": 90.0,
        "gpu_1_memory_usage_megabytes": 5.0,
        "cpu_utilization_percentage": 50.0,
    }
    assert renumber_gpu_keys(sampled, ["3", "5"]) == {
        "gpu_3_utilization_percentage": 90.0,
        "gpu_5_memory_usage_megabytes": 5.0,
        "cpu_utilization_percentage": 50.0,
    }


def test_provenance_on_a_machine_without_gpus(monkeypatch):
    monkeypatch.setenv("PARALLEL_LAB_IMAGE", "registry/parallel-lab:1")
    tags = stack_tags()
    assert tags["torch"] == torch.__version__
    assert tags["container_image"] == "registry/parallel-lab:1"
    assert all(isinstance(v, str) and v for v in tags.values())
    assert len(tags["params_sha256"]) == 64
    assert gpu_tags({}) == {"gpu_names": "none (CPU)"} and gpu_uuids({}) == {}


def test_devices_of_several_nodes_keep_their_node():
    """Every node has a GPU 0: labels carry the node, so two nodes' GPU 0 are two devices and
    the imbalance is over all four GPUs of a 2 x 2 job."""
    assert memory.physical_label("cuda:1", ("0", "1"), node=1, nodes=2) == "node1_gpu_1"
    assert memory.physical_label("cuda:1", ("0", "1")) == "gpu_1"  # one node: as before
    per_rank = [
        [DevicePeak(f"node{n}_gpu_{g}", 100.0 * (1 + n + g), 200.0)] for n in (0, 1) for g in (0, 1)
    ]
    merged = memory.merge_peaks(per_rank)
    assert [p.label for p in merged] == ["node0_gpu_0", "node0_gpu_1", "node1_gpu_0", "node1_gpu_1"]
    assert [p.allocated_mib for p in merged] == [100.0, 200.0, 200.0, 300.0]
    metrics = memory.epoch_metrics(merged)
    assert metrics["memory/node1_gpu_0_peak_allocated_mib"] == 200.0
    assert metrics["mem_imbalance"] == pytest.approx(300.0 / 200.0)
    summary = memory.run_summary([metrics])
    assert set(summary["peak_memory_mib"]) == {
        "node0_gpu_0",
        "node0_gpu_1",
        "node1_gpu_0",
        "node1_gpu_1",
    }


def test_device_metrics_are_named_like_mlflows_system_metrics():
    """One scheme, MLflow's own ("system/gpu_3_memory_usage_megabytes"): a group, then the
    device as gpu_<physical id>."""
    assert results.device_metric("gpu_3", "", "allocated") == "memory/gpu_3_peak_allocated_mib"
    assert results.device_metric("node1_gpu_3", "eval_", "reserved") == (
        "memory/node1_gpu_3_eval_peak_reserved_mib"
    )
    for key, parsed in [
        ("memory/gpu_3_peak_allocated_mib", ("gpu_3", "", "allocated")),
        ("memory/node1_gpu_12_eval_peak_reserved_mib", ("node1_gpu_12", "eval_", "reserved")),
        ("memory/cpu_0_peak_rss_mib", ("cpu_0", "", "rss")),
        ("mem_imbalance", None),
        ("system/gpu_3_memory_usage_megabytes", None),
    ]:
        assert results.parse_device_metric(key) == parsed, key


def test_shared_tags_say_where_runs_disagree_and_leave_out_what_none_has():
    runs = [{"torch": "2.9", "cuda": "12.8"}, {"torch": "2.9", "cuda": "13.0"}, {"torch": "2.9"}]
    assert shared_tags(runs, ("torch", "cuda", "nccl")) == {
        "torch": "2.9",
        "cuda": "mixed: 12.8, 13.0",
    }
    assert shared_tags([], ("torch",)) == {}
