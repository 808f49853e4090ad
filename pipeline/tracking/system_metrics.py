"""MLflow's system metrics (CPU, RAM and, through NVML, GPU utilisation and memory) for a
strategy's run: narrowed to the run's own GPUs, named by physical id, and with the last
sampling window kept."""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

from pipeline.errors import first_line


def publish_final_sample(monitor: Any) -> None:
    """Stop MLflow's sampler and log one last sample, the run's final state.

    MLflow 3.17 publishes only whole sampling windows and drops the open one at shutdown, so
    a run shorter than the interval would have no `system/...` metrics at all (and every run
    lost its tail). Once the thread has joined, nothing else touches the monitors.
    """
    monitor.finish()
    try:
        monitor.collect_metrics()
        monitor.publish_metrics(monitor.aggregate_metrics())
        monitor.mlflow_logger.flush()
    except Exception as err:  # noqa: BLE001 - as in start_system_metrics
        print(
            f"warning: last MLflow system-metrics sample not logged ({first_line(err)})",
            file=sys.stderr,
            flush=True,
        )


def system_metrics_monitor(
    run_id: str,
    interval_s: float,
    gpu_uuids: dict[str, str] | None,
    resume: bool,
    tracking_uri: str,
) -> Any:
    """MLflow's SystemMetricsMonitor, its NVML monitor narrowed to the run's GPUs.

    MLflow 3.17's GPUMonitor samples every GPU NVML sees (handles 0..nvmlDeviceGetCount-1)
    and names them by that position. The run's GPUs are looked up by UUID instead (NVML's
    order is PCI order, not necessarily CUDA's) and their metrics renamed to the physical ids
    the rest of the run uses: system/gpu_5_utilization_percentage is GPU 5. A CPU run drops
    the GPU monitor, so it logs no other job's GPUs.
    """
    from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    # its start and stop said at INFO in every stage's log (and "Skip logging GPU metrics" on
    # a CPU run): its warnings are what a user needs to see
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
    monitor = SystemMetricsMonitor(
        run_id, sampling_interval=interval_s, resume_logging=resume, tracking_uri=tracking_uri
    )
    others = [m for m in monitor.monitors if not isinstance(m, GPUMonitor)]
    if len(others) == len(monitor.monitors) or gpu_uuids is None:
        return monitor  # no NVML, or the run's GPUs are unknown: MLflow's default stands
    try:
        monitor.monitors = others + ([_run_gpu_monitor(gpu_uuids)] if gpu_uuids else [])
    except Exception as err:  # noqa: BLE001 - e.g. a MIG slice NVML finds by another UUID
        print(
            f"warning: system metrics cover every GPU NVML sees: cannot find the run's "
            f"({first_line(err)})",
            file=sys.stderr,
            flush=True,
        )
    return monitor


def _run_gpu_monitor(gpu_uuids: dict[str, str]) -> Any:
    import pynvml
    from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor

    # MLflow's monitors are unannotated; untyped_calls_exclude (pyproject) does not reach
    # calls through super(), hence the two ignores
    class RunGPUMonitor(GPUMonitor):
        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.gpu_handles = [pynvml.nvmlDeviceGetHandleByUUID(u) for u in gpu_uuids.values()]

        def aggregate_metrics(self) -> dict[str, float]:
            metrics = super().aggregate_metrics()  # type: ignore[no-untyped-call]
            return renumber_gpu_keys(metrics, list(gpu_uuids))

    return RunGPUMonitor()


def renumber_gpu_keys(metrics: dict[str, float], ids: list[str]) -> dict[str, float]:
    """gpu_<position>_... -> gpu_<physical id>_...: ids[i] is the id of the i-th handle."""
    return {
        re.sub(r"^gpu_(\d+)_", lambda m: f"gpu_{ids[int(m[1])]}_", k): v for k, v in metrics.items()
    }
