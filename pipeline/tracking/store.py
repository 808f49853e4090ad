"""Where MLflow runs go (MLFLOW_TRACKING_URI, else the embedded store sqlite:///mlflow.db at
the repository root, the directory DVC runs stages in) and what MLflow accepts there."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pipeline.errors import UserError

KNOWN_SCHEMES = {"http", "https", "sqlite", "postgresql", "mysql", "mssql", "file", "databricks"}


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def check_tracking_uri(uri: str) -> None:
    """Refuse a malformed URI up front; an unreachable one is an outage, handled later."""
    parsed = urlparse(uri)
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and uri[1:3] in (":\\", ":/")):
        return  # a local directory (file store)
    if parsed.scheme not in KNOWN_SCHEMES:
        raise UserError(
            f"MLFLOW_TRACKING_URI: got {uri!r}, expected http(s)://host:port, "
            "sqlite:///path/mlflow.db, postgresql://..., file:/path or a directory"
        )
    if parsed.scheme in ("http", "https") and (not parsed.hostname or _bad_port(parsed)):
        raise UserError(f"MLFLOW_TRACKING_URI: got {uri!r}, expected http(s)://host[:port]")


def _bad_port(parsed) -> bool:
    try:
        _ = parsed.port  # urlparse checks the port when it is read
    except ValueError:
        return True
    return False


def param_text(value: Any) -> str:
    """A param value as MLflow stores it (at most 6000 characters)."""
    text = str(value)
    return text if len(text) <= 6000 else text[:5997] + "..."
