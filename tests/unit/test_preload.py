"""pipeline/tracking/preload.py loads, for each kind of store, the store's code and none of
the final model's, and for the final model what logging it loads and builds on first use;
each in a new interpreter, since a module once imported stays."""

import json
import subprocess
import sys

import pytest

from support import REPO

LOADED = """
import json, sys
from pipeline.tracking import preload
preload.{call}
from mlflow.utils import requirements_utils
print(json.dumps({{
    "modules": [m for m in {names} if m in sys.modules],
    "package_map": requirements_utils._MODULES_TO_PACKAGES is not None,
}}))
"""
SQLALCHEMY, REST = "mlflow.store.tracking.sqlalchemy_store", "mlflow.store.tracking.rest_store"
MODEL = ["mlflow.pytorch", "torch.export._trace"]


def loaded(call: str, names: list[str]) -> dict:
    code = LOADED.format(call=call, names=names)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    result: dict = json.loads(out.stdout)
    return result


@pytest.mark.parametrize(
    "uri, store",
    [
        ("sqlite:///mlflow.db", SQLALCHEMY),
        ("postgresql://mlflow@db:5432/mlflow", SQLALCHEMY),
        ("http://127.0.0.1:5000", REST),
    ],
)
def test_the_client_code_is_the_stores_own_and_nothing_of_the_model(uri, store):
    got = loaded(f"client_code({uri!r})", [store, *MODEL])
    assert got == {"modules": [store], "package_map": False}


def test_the_final_models_code_and_package_map_are_loaded_ahead():
    got = loaded("final_model_code()", MODEL)
    assert got == {"modules": MODEL, "package_map": True}
