"""The MLflow parent run that groups one comparison's strategy runs and holds the report; the
recommended strategies' models registered as versions of the experiment's registered model,
with aliases saying what each was recommended for (`models:/<name>@recommended`); the seed
sweeps of a run found among the runs of its experiment.

A comparison is identified by the strategy runs it compares: `compare` run again over the
same runs updates the same parent instead of adding another, and a parent whose runs have
all moved to a newer comparison is deleted, so the experiment keeps one "comparison" per
set of runs and none empty.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pipeline.errors import first_line
from pipeline.tracking import store
from pipeline.tracking.mlflow_run import MODEL_NAME
from pipeline.tracking.provenance import TORCH_STACK, shared_tags, torch_stack_tags
from pipeline.tracking.store import compare_runs_url, experiment_id, param_text, tracking_uri

KEY_TAG = "parallel_lab_comparison"  # on the parents compare creates: which runs they group
# the alias of the version the compare stage recommends: models:/<name>@recommended loads it
RECOMMENDED = "recommended"


def comparison_key(children: list[str]) -> str:
    return hashlib.sha256(",".join(sorted(children)).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Comparison:
    """A comparison's place in MLflow: its parent run and the page with its runs side by
    side."""

    parent_id: str
    experiment_id: str
    runs: list[str]

    @property
    def url(self) -> str:
        return compare_runs_url(self.experiment_id, self.runs)


def open_comparison(
    experiment: str, children: list[str], tags: dict[str, str], params: dict[str, Any]
) -> Comparison | None:
    """The parent run for these strategy runs: the one an earlier `compare` made for them,
    or a new one. None if MLflow is away (the report is still written; only the grouping is
    lost). Its torch stack tags are its runs' (what the compared numbers were trained with),
    so the stage imports torch only where it logs models or a run lacks them."""
    try:
        from mlflow.entities import Param, RunTag

        client = store.client()
        stack = shared_tags([client.get_run(c).data.tags for c in children], TORCH_STACK)
        if len(stack) < len(TORCH_STACK):
            stack = {**torch_stack_tags(), **stack}
        tags = {**tags, **stack}
        key = comparison_key(children)
        exp_id = experiment_id(client, experiment)
        earlier = client.search_runs([exp_id], f"tags.{KEY_TAG} = '{key}'", max_results=1)
        if earlier:
            run_id = earlier[0].info.run_id
            client.update_run(run_id, status="RUNNING")
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        else:
            run_id = client.create_run(
                exp_id, run_name="comparison", tags={**tags, KEY_TAG: key}
            ).info.run_id
            client.log_batch(run_id, params=[Param(k, param_text(v)) for k, v in params.items()])
        return Comparison(run_id, exp_id, list(children))
    except Exception as err:  # noqa: BLE001 - an outage, as in publisher.Follower.push
        print(
            f"warning: MLflow at {tracking_uri()} unreachable ({first_line(err)}); the "
            "comparison is not grouped in MLflow",
            file=sys.stderr,
            flush=True,
        )
        return None


def close_comparison(
    parent_id: str,
    children: dict[str, dict[str, float]],
    artifacts: list[Path],
    child_tags: dict[str, dict[str, str]] | None = None,
    own_metrics: dict[str, float] | None = None,
) -> None:
    """Nest each strategy run under the parent (the `mlflow.parentRunId` tag the UI reads),
    log the comparison's figures into it (those that changed) and its `child_tags` (e.g.
    `speed_note`: why a figure is absent) and `own_metrics` into the parent, attach the
    report to the parent, finish it, and delete the parents left without runs."""
    import time

    from mlflow.entities import Metric, RunTag

    client = store.client()
    stamp = int(time.time() * 1000)
    for run_id, metrics in children.items():
        try:
            logged = client.get_run(run_id).data.metrics
            changed = {k: float(v) for k, v in metrics.items() if logged.get(k) != float(v)}
            tags = {**(child_tags or {}).get(run_id, {}), "mlflow.parentRunId": parent_id}
            client.log_batch(
                run_id,
                tags=[RunTag(k, v) for k, v in tags.items()],
                metrics=[Metric(k, v, stamp, 0) for k, v in changed.items()],
            )
        except Exception as err:  # noqa: BLE001 - e.g. a run logged to another tracking store
            print(
                f"warning: MLflow run {run_id} not grouped ({first_line(err)})",
                file=sys.stderr,
                flush=True,
            )
    try:
        if own_metrics:  # the comparison's own figures: the predictions, named as such
            client.log_batch(
                parent_id, metrics=[Metric(k, float(v), stamp, 0) for k, v in own_metrics.items()]
            )
        for path in artifacts:
            client.log_artifact(parent_id, str(path), artifact_path="report")
        client.set_terminated(parent_id, "FINISHED")
        delete_empty_comparisons(client, client.get_run(parent_id).info.experiment_id)
    except Exception as err:  # noqa: BLE001
        print(
            f"warning: MLflow comparison run {parent_id} incomplete ({first_line(err)})",
            file=sys.stderr,
            flush=True,
        )


def delete_empty_comparisons(client: Any, exp_id: str) -> None:
    """Parents compare made whose strategy runs all moved under another comparison."""
    for parent in client.search_runs([exp_id], f"tags.{KEY_TAG} LIKE '%'"):
        pid = parent.info.run_id
        if not client.search_runs([exp_id], f"tags.`mlflow.parentRunId` = '{pid}'", max_results=1):
            client.delete_run(pid)


@dataclass(frozen=True)
class Registration:
    """The recommended strategy's logged model as version `version` of the registered model
    `name`, or why it is not one (version None); `aliases`: alias -> (version, strategy) of
    every alias the comparison set (`set_aliases`), RECOMMENDED among them."""

    name: str
    strategy: str
    objective: str
    run_id: str | None
    version: str | None = None
    why_not: str = ""
    aliases: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def uri(self) -> str | None:
        """Through the alias where it is set: it follows the recommendation as it changes."""
        if self.version is None:
            return None
        if self.aliases.get(RECOMMENDED, ("",))[0] == self.version:
            return f"models:/{self.name}@{RECOMMENDED}"
        return f"models:/{self.name}/{self.version}"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "uri": self.uri,
            "strategy": self.strategy,
            "objective": self.objective,
            "run_id": self.run_id,
            "aliases": {a: {"version": v, "strategy": s} for a, (v, s) in self.aliases.items()},
            **({"why_not": self.why_not} if self.version is None else {}),
        }


def register_model(name: str, strategy: str, objective: str, run_id: str | None) -> Registration:
    """Register the model logged in `run_id` (tracking/mlflow_run.py `log_final_model`) as a
    version of the registered model `name`, created if need be. Idempotent: a version already
    pointing at that logged model is reused. Never raises: MLflow away, or a run without a
    logged model, gives a Registration saying why."""
    unregistered = Registration(name, strategy, objective, run_id)
    if run_id is None:
        return _not(unregistered, f"{strategy}'s run is not in the MLflow store")
    try:
        from mlflow.entities import LoggedModelStatus

        client = store.client()
        exp_id = client.get_run(run_id).info.experiment_id
        models = [
            m
            for m in client.search_logged_models(
                [exp_id], filter_string=f"source_run_id = '{run_id}' AND name = '{MODEL_NAME}'"
            )
            if m.status == LoggedModelStatus.READY
        ]
        if not models:
            return _not(
                unregistered,
                f"run {run_id} has no logged model yet (`python -m pipeline.publish` logs it)",
            )
        model = models[0]
        quoted = name.replace("'", "\\'")
        for version in client.search_model_versions(f"name = '{quoted}' AND run_id = '{run_id}'"):
            if version.source == model.model_uri:
                return replace(unregistered, version=str(version.version))
        if not client.search_registered_models(f"name = '{quoted}'"):
            client.create_registered_model(
                name, description="parallel-lab: the compare stage's recommended strategy"
            )
        version = client.create_model_version(
            name,
            source=model.model_uri,
            run_id=run_id,
            model_id=model.model_id,
            tags={"strategy": strategy, "recommended_for": objective},
        )
        return replace(unregistered, version=str(version.version))
    except Exception as err:  # noqa: BLE001 - an outage: the report is still written
        print(
            f"warning: MLflow at {tracking_uri()}: {strategy}'s model not registered "
            f"({first_line(err)})",
            file=sys.stderr,
            flush=True,
        )
        return _not(unregistered, f"MLflow unreachable: {first_line(err)}")


def _not(registration: Registration, why: str) -> Registration:
    return replace(registration, why_not=why)


def set_aliases(name: str, wanted: dict[str, Registration | None]) -> dict[str, tuple[str, str]]:
    """Point each alias of the registered model `name` at its registration's version; remove
    one whose registration is None or has no version, so no alias outlives the comparison
    that set it (an objective that recommends nothing this time). Returns the aliases set,
    alias -> (version, strategy). Never raises: MLflow away, none is set."""
    try:
        client = store.client()
        quoted = name.replace("'", "\\'")
        if not client.search_registered_models(f"name = '{quoted}'"):
            return {}  # nothing registered (no logged model): no alias to set or remove
        existing = client.get_registered_model(name).aliases
        done = {}
        for alias, registration in wanted.items():
            if registration is None or registration.version is None:
                if alias in existing:
                    client.delete_registered_model_alias(name, alias)
                continue
            if str(existing.get(alias)) != registration.version:
                client.set_registered_model_alias(name, alias, registration.version)
            done[alias] = (registration.version, registration.strategy)
        return done
    except Exception as err:  # noqa: BLE001 - an outage: the versions stand, unaliased
        print(
            f"warning: MLflow at {tracking_uri()}: model aliases not set ({first_line(err)})",
            file=sys.stderr,
            flush=True,
        )
        return {}


def seed_accuracies(run_id: str | None) -> dict[str, float] | None:
    """Final test accuracy by seed of the finished runs of the same strategy, in the run's
    experiment, whose params are the run's except `seed` (the run itself included): a seed
    sweep of the same configuration (`dvc exp run --queue -S seed=1,2,3`). The newest run
    stands for a seed run more than once. None if MLflow is away or the run is not in it."""
    if run_id is None:
        return None
    try:
        client = store.client()
        run = client.get_run(run_id)
        mine = {k: v for k, v in run.data.params.items() if k != "seed"}
        strategy = run.data.tags.get("strategy", "").replace("'", "")
        found: dict[str, tuple[int, float]] = {}
        for other in client.search_runs(
            [run.info.experiment_id],
            f"tags.strategy = '{strategy}' AND attributes.status = 'FINISHED'",
        ):
            params = other.data.params
            acc = other.data.metrics.get("test_acc")
            if acc is None or "seed" not in params:
                continue
            if {k: v for k, v in params.items() if k != "seed"} != mine:
                continue
            start = other.info.start_time or 0
            if params["seed"] not in found or found[params["seed"]][0] < start:
                found[params["seed"]] = (start, float(acc))
        return {seed: acc for seed, (_, acc) in sorted(found.items())}
    except Exception as err:  # noqa: BLE001 - an outage: no noise estimate, said so
        print(
            f"warning: MLflow at {tracking_uri()}: no seed sweep looked up ({first_line(err)})",
            file=sys.stderr,
            flush=True,
        )
        return None
