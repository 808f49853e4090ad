"""MLflow's code loaded ahead of its first use, where a process has time to spare: the
quickstart's process before it forks its stages' workers and publishers (each inherits it
instead of loading its own; its compare step logs the final models), and a stage's publisher
while the launcher imports torch. Measured on 2 CPU cores: the SQLAlchemy store's modules
take 0.8 s, the final model's code 0.9 s (docs/performance.md, "A train stage's fixed
cost")."""

from __future__ import annotations

from urllib.parse import urlparse

from pipeline.tracking.store import DATABASES


def client_code(uri: str) -> None:
    """The modules a client of the store at `uri` loads on its first call: the client's and
    the store's (SQLAlchemy's models for a database, the REST client for a server). Nothing
    is opened: a connection made before a fork would be shared by the children."""
    from mlflow.tracking import MlflowClient  # noqa: F401

    scheme = urlparse(uri).scheme.partition("+")[0]
    if scheme == "sqlite" or scheme in DATABASES:
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    elif scheme in ("http", "https"):
        import mlflow.store.tracking.rest_store  # noqa: F401


def final_model_code() -> None:
    """What logging the final model (mlflow_run.log_final_model) loads on first use:
    mlflow.pytorch, torch.export's tracer (the model is saved as an exported program), and
    MLflow's map of installed packages to modules, which it builds from every installed
    distribution's file list to check the model's requirements against the environment, and
    keeps for the process."""
    import mlflow.pytorch  # noqa: F401
    import torch.export._trace  # noqa: F401  # torch.export.export imports it on its first call
    from mlflow.utils.requirements_utils import _init_modules_to_packages_map

    _init_modules_to_packages_map()
