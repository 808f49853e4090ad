"""Where MLflow runs go (MLFLOW_TRACKING_URI, else the embedded store sqlite:///mlflow.db at
the repository root) and what MLflow accepts there."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import ParseResult, quote, urlparse

from pipeline.errors import UserError
from pipeline.locks import waiting_for

# Fail fast while the server is away (MLflow's default retries for minutes): training retries
# at the next epoch instead, and a stage never waits on the network for long.
HTTP_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
DATABASES = {"postgresql", "mysql", "mssql"}  # served through SQLAlchemy, as sqlite is
KNOWN_SCHEMES = {"http", "https", "sqlite", "file", "databricks", *DATABASES}


def client() -> Any:
    """An MlflowClient for the store MLflow is pointed at, failing fast when it is away.
    (mlflow is imported here: it takes about a second, and only the processes that talk to
    MLflow need it.)"""
    from mlflow.tracking import MlflowClient

    for key, value in HTTP_ENV.items():
        os.environ.setdefault(key, value)
    # a new store's migrations say each step at INFO ("Creating initial MLflow database
    # tables..."), two lines in the middle of a stage's log that ask nothing of its reader
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    return MlflowClient(tracking_uri=tracking_uri())


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{repository_root() / 'mlflow.db'}"


def repository_root() -> Path:
    """The repository the runs belong to. DVC runs a stage in the repository's root, except a
    queued or --run-all experiment, which it runs in a temporary copy (.dvc/tmp/exps/tmp...)
    that is deleted afterwards; DVC_ROOT names the repository in both cases, so the runs of a
    sweep land in the repository's own store, where `make ui` shows them."""
    return Path(os.environ.get("DVC_ROOT") or Path.cwd())


def check_tracking_uri(uri: str) -> None:
    """Refuse a malformed URI up front, one that could never work: every entry point that
    talks to MLflow calls it first. An unreachable one is an outage, handled later (training
    goes on, kept locally)."""
    parsed = urlparse(uri)
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and uri[1:3] in (":\\", ":/")):
        return  # a local directory (file store)
    scheme = parsed.scheme.partition("+")[0]  # postgresql+psycopg2: SQLAlchemy's dialect+driver
    if scheme not in KNOWN_SCHEMES:
        raise UserError(
            f"MLFLOW_TRACKING_URI: got {uri!r}, expected http(s)://host:port, "
            "sqlite:///path/mlflow.db, postgresql://..., file:/path or a directory"
        )
    if scheme in ("http", "https") and (not parsed.hostname or _bad_port(parsed)):
        raise UserError(f"MLFLOW_TRACKING_URI: got {uri!r}, expected http(s)://host[:port]")
    if scheme == "sqlite":
        _check_sqlite(uri)
    elif scheme in DATABASES and (
        not uri.startswith(f"{parsed.scheme}://")
        or not (parsed.hostname or parsed.path.strip("/"))
        or _bad_port(parsed)
    ):
        raise UserError(
            f"MLFLOW_TRACKING_URI: got {uri!r}, expected {parsed.scheme}://user@host[:port]/"
            "database"
        )
    elif scheme == "file" and not parsed.path:
        raise UserError(f"MLFLOW_TRACKING_URI: got {uri!r}, expected file:/path/to/mlruns")


def sqlite_database(uri: str) -> str:
    """The database file of a sqlite:/// URI, as written ("" for any other URI)."""
    return uri.removeprefix("sqlite:///").partition("?")[0] if uri.startswith("sqlite:///") else ""


@contextlib.contextmanager
def store_creation(uri: str) -> Iterator[None]:
    """While the block runs, no other process of this machine creates the SQLite store at
    `uri` (a lock file beside it): two stages that start together on a new store (DVC's queue
    workers) would both run its migrations, and one of them fail ("duplicate column name").
    It waits for the other, which takes about a second. Other stores guard themselves."""
    database = sqlite_database(uri)
    if not database:
        yield
        return
    with waiting_for(Path(database + ".lock")):
        yield


def _check_sqlite(uri: str) -> None:
    """sqlite:///relative/mlflow.db or sqlite:////absolute/mlflow.db, in a directory that
    exists: SQLite creates the file, never its directory, and a URI it cannot open would
    otherwise look like a store that is down, warned about every epoch."""
    database = sqlite_database(uri)
    if not database or database.endswith("/"):
        raise UserError(
            f"MLFLOW_TRACKING_URI: got {uri!r}, expected sqlite:///path/mlflow.db (three "
            "slashes, then the database file's path; four for an absolute one)"
        )
    folder = Path(database).parent
    if not folder.is_dir() or Path(database).is_dir():
        what = "is a directory" if Path(database).is_dir() else f"{folder}/ does not exist"
        raise UserError(
            f"MLFLOW_TRACKING_URI: got {uri!r}: {what}; expected a database file in an "
            "existing directory"
        )


def _bad_port(parsed: ParseResult) -> bool:
    try:
        _ = parsed.port  # urlparse checks the port when it is read
    except ValueError:
        return True
    return False


def param_text(value: Any) -> str:
    """A param value as MLflow stores it (at most 6000 characters)."""
    text = str(value)
    return text if len(text) <= 6000 else text[:5997] + "..."


# The MLflow UI's kind of experiment: classic training runs, for UIs that go by the tag.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
# MLflow 3.17's UI goes by its own switch instead (GenAI unless told, remembered per browser),
# and opens an experiment on its GenAI overview (traces), where these runs do not show; this
# query parameter on a link flips it to "Model training" (checked in headless Chromium).
TRAINING_VIEW = "workflowType=machine_learning"
UI_URL_ENV = "MLFLOW_UI_URL"  # where a browser reaches the MLflow UI, if not the tracking URI
DEFAULT_UI_URL = "http://127.0.0.1:5000"  # `make ui` (mlflow ui) on the embedded store


def experiment_id(client: Any, name: str) -> str:
    """The experiment's id, created (as a training experiment) if it does not exist yet."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.tags.get("mlflow.experimentKind") is None:
            for key, value in EXPERIMENT_KIND.items():
                client.set_experiment_tag(found.experiment_id, key, value)
        return str(found.experiment_id)
    return str(client.create_experiment(name, tags=EXPERIMENT_KIND))


def ui_url() -> str:
    """The MLflow UI a browser opens: MLFLOW_UI_URL, else an http(s) tracking URI itself,
    else the `mlflow ui` that serves the embedded store (make ui)."""
    explicit = os.environ.get(UI_URL_ENV)
    if explicit:
        return explicit.rstrip("/")
    uri = tracking_uri()
    return uri.rstrip("/") if urlparse(uri).scheme in ("http", "https") else DEFAULT_UI_URL


def compare_runs_url(experiment: str, runs: list[str]) -> str:
    """The MLflow UI page that shows exactly these runs side by side."""

    def ids(values: list[str]) -> str:
        return quote(json.dumps(values, separators=(",", ":")), safe="[],")

    return (
        f"{ui_url()}/#/compare-runs?runs={ids(runs)}&experiments={ids([experiment])}"
        f"&{TRAINING_VIEW}"
    )
