"""What `make gpu-wheels` carries to a GPU machine without network (benchmarks/gpu_wheels.py):
the selection from requirements.lock, and what a download that misses a wheel says. Whether
the selection is enough is tests/e2e/test_gpu_check.py's: gpu-check runs on it alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import gpu_wheels
from benchmarks.gpu_wheels import MACHINE, ROOTS, normalize, read_lock, select, wheel_key
from support import REPO

PINS = read_lock((REPO / "requirements.lock").read_text())


def test_the_selection_is_the_roots_and_what_they_need_at_the_locks_pins_never_torchs():
    chosen = select(PINS)
    assert {normalize(root) for root in ROOTS} <= set(chosen)
    assert all(chosen[name] == PINS[name] for name in chosen)
    # what mlflow-skinny and pandas require is there
    assert {"protobuf", "pydantic", "opentelemetry-sdk", "python-dateutil"} <= set(chosen)
    assert not [name for name in chosen if MACHINE.fullmatch(name)]
    # the server and UI, the tools and what gpu-check never runs stay home
    assert not {"mlflow", "mlflow-tracing", "scipy", "pyarrow", "dvc", "pytest", "mypy"} & set(
        chosen
    )


def test_the_machine_keeps_torchs_companions_but_not_nvidia_ml_py():
    for name in ("torch", "triton", "nvidia-cudnn-cu13", "cuda-bindings", "numpy", "jinja2"):
        assert MACHINE.fullmatch(name), name
    assert not MACHINE.fullmatch("nvidia-ml-py")
    assert "nvidia-ml-py" in select(PINS)


def test_requirements_are_followed_as_python_3_12_on_linux_sees_them():
    graph = {
        "app": [
            "lib>=1",
            'old; python_version < "3.12"',  # this interpreter is 3.11: true here, not there
            'new; python_version >= "3.12"',
            'win; sys_platform == "win32"',
            'dev; extra == "test"',
            "numpy",  # the machine's: neither carried nor followed
        ],
        "lib": ["Dep_Name"],
        "numpy": ["never"],
    }
    pins = {name: "1.0" for name in ("app", "lib", "new", "dep-name", "old", "win", "dev")}
    chosen = select(pins, lambda name: graph.get(name, []), roots=["app"])
    assert chosen == {"app": "1.0", "dep-name": "1.0", "lib": "1.0", "new": "1.0"}


def test_a_needed_package_the_lock_does_not_pin_is_an_error():
    with pytest.raises(ValueError, match="lib: needed by gpu-check, but requirements.lock"):
        select({"app": "1.0"}, lambda name: ["lib"] if name == "app" else [], roots=["app"])


def test_lock_and_wheel_names_compare_normalized():
    assert read_lock("PyYAML==6.0.3\nruamel.yaml==0.19.1\n# a comment\n") == {
        "pyyaml": "6.0.3",
        "ruamel-yaml": "0.19.1",
    }
    path = Path("mlflow_skinny-3.17.2-py3-none-any.whl")
    assert wheel_key(path) == ("mlflow-skinny", "3.17.2")


def test_a_download_names_every_package_without_a_wheel(tmp_path, monkeypatch, capsys):
    """pip stops at the first package it cannot get; each is then asked for on its own."""
    asked = []

    def pip(directory: Path, specs: list[str]):
        asked.append(specs)
        ok = [s for s in specs if not s.startswith("sdist-only")]
        for spec in ok:
            name, version = spec.split("==")
            (directory / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(
                b"x" * 1000
            )
        failed = len(ok) < len(specs)
        stderr = "ERROR: No matching distribution found for sdist-only==2.0" if failed else ""
        return type("Proc", (), {"returncode": int(failed), "stderr": stderr})()

    monkeypatch.setattr(gpu_wheels, "pip_download", pip)
    chosen = {"pure-lib": "1.0", "sdist-only": "2.0"}
    assert gpu_wheels.download(chosen, tmp_path / "wheels") == 1
    assert asked == [["pure-lib==1.0", "sdist-only==2.0"], ["pure-lib==1.0"], ["sdist-only==2.0"]]
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "gpu-wheels: sdist-only==2.0: no cp312 wheel (ERROR: No matching distribution found "
        "for sdist-only==2.0)",
        f"gpu-wheels: 1 of 2 wheels in {tmp_path / 'wheels'}, 0.0 MB",
    ]
    assert err == "gpu-wheels: missing sdist-only==2.0\n"
