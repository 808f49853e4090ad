"""Step-level training metrics (`step_train_loss`, `step_samples_per_s` every
`mlflow.log_every_steps` steps) on their way to MLflow, so a run's charts move while it trains.

They are a live view, not the record: the per-epoch metrics are (kept on disk, published until
MLflow has them). So nothing here ever makes training wait: points are queued for a thread of
their own and sent in batches; while MLflow is slow or away the queue fills and new points are
dropped, and a failed send is dropped with one warning. Points wait for the run's creation in
MLflow to be tried; if the server was away then, they are dropped too.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable
from typing import Any, Optional

from pipeline.errors import first_line
from pipeline.tracking import store

QUEUED_AT_MOST = 1000  # points waiting to be sent; later ones are dropped until there is room
Point = tuple[int, dict[str, float], int]  # (MLflow step, metrics, Unix time in ms)
STOP = threading.Event()  # queued by `close`: the thread sends what came before it and ends


class StepMetrics:
    def __init__(self, run_id: Callable[[], Optional[str]]):
        """`run_id`: the run's id in MLflow when a batch is sent (None: not created yet)."""
        self.run_id = run_id
        # set once the run's creation in MLflow was tried (MlflowTracker.open_soon): points queued
        # before that wait for it rather than being dropped as runless
        self.opened = threading.Event()
        self.opened.set()
        self.queue: queue.Queue[Point | threading.Event] = queue.Queue()
        self.thread: Optional[threading.Thread] = None
        self.warned = False

    def log_soon(self, step: int, metrics: dict[str, float], timestamp_ms: int) -> None:
        """Queue one point; returns at once."""
        if self.queue.qsize() >= QUEUED_AT_MOST:
            return  # MLflow is behind: this point is lost, training is not slowed
        if self.thread is None:
            self.thread = threading.Thread(target=self._send, name="mlflow-steps", daemon=True)
            self.thread.start()
        self.queue.put((step, metrics, timestamp_ms))

    def flush(self, wait_s: float) -> None:
        """Give the points queued so far up to `wait_s` seconds to reach MLflow (the end of a
        stage, before the run's final status)."""
        if self.thread is None:
            return
        sent = threading.Event()
        self.queue.put(sent)
        sent.wait(wait_s)

    def close(self, wait_s: float) -> None:
        """Send what is queued and end the thread, waiting for it up to `wait_s` seconds (a
        thread still inside a call to a hung server is left to the process's exit)."""
        if self.thread is None:
            return
        self.queue.put(STOP)
        self.thread.join(wait_s)
        self.thread = None

    def _send(self) -> None:
        client = None
        while True:
            items = [self.queue.get()]  # waits for the first, then takes whatever is there
            while True:
                try:
                    items.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            batch: list[Point] = []
            for item in items:
                if item is STOP:
                    self._log(client, batch)
                    return
                if isinstance(item, threading.Event):  # a flush: what came before it, now
                    client = self._log(client, batch)
                    batch = []
                    item.set()
                else:
                    batch.append(item)
            client = self._log(client, batch)

    def _log(self, client: Any, batch: list[Point]) -> Any:
        """Send `batch`; the client to send the next one with."""
        self.opened.wait()
        run_id = self.run_id()
        if not batch or run_id is None:
            return client
        from mlflow.entities import Metric

        metrics = [Metric(k, v, ts, step) for step, values, ts in batch for k, v in values.items()]
        try:
            client = client or store.client()
            for i in range(0, len(metrics), 1000):  # MLflow takes at most 1000 per batch
                client.log_batch(run_id, metrics=metrics[i : i + 1000])
        except Exception as err:  # noqa: BLE001 - a live chart is never worth a failed run
            if not self.warned:
                self.warned = True
                print(
                    f"warning: MLflow step metrics not logged ({first_line(err)}); the "
                    "per-epoch metrics are kept and published as usual",
                    file=sys.stderr,
                    flush=True,
                )
        return client
