# parallel-lab trainer image: the project's pinned environment on top of the official PyTorch
# CUDA runtime image. `docker compose up` runs `dvc repro` in it on the repository, which is
# bind-mounted at /workspace (DVC needs the git repository, and dvc.lock, results/ and
# reports/ must land on the host), so no project source is baked in beyond the installed
# package.
#
# The base must carry exactly the torch/torchvision that requirements.lock pins: the build
# checks it and fails otherwise. It follows PyTorch's tag scheme
# <torch>-cuda<major.minor>-cudnn<N>-runtime; torch 2.14.1 from PyPI is built for CUDA 13.0
# (nvidia-cuda-runtime 13.0.* in the lock) and cuDNN 9, which needs NVIDIA driver 580 or
# newer. For drivers 525 to 579, TORCH_CUDA=cu126 (below) swaps in the same versions built
# for CUDA 12.6.
ARG BASE_IMAGE=pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime
FROM ${BASE_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DVC_NO_ANALYTICS=1

# git: DVC works on the git repository and every MLflow run is tagged with its commit.
# g++: torch.compile's inductor builds its CPU kernels as C++ (against Python.h, which the
# base's Python carries, and OpenMP, which comes with the compiler); the runtime image has no
# compiler. The build stops here if the base's Python lacks its headers.
# The distribution (and so the packages' versions) is the base image's choice, so an apt pin
# could only break a BASE_IMAGE override; the Python environment is what is pinned.
# safe.directory: the container may run under a uid that does not own the bind-mounted
# repository (`docker run --user`, or root on another user's tree); git and libgit2 (pygit2,
# used by DVC) both read the system config.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends git g++ \
    && rm -rf /var/lib/apt/lists/* \
    && git config --system --add safe.directory /workspace \
    && python -c "import os, sys, sysconfig; h = os.path.join(sysconfig.get_paths()['include'], 'Python.h'); \
sys.exit(0 if os.path.exists(h) else f'BASE_IMAGE: {h} is missing; torch.compile needs the Python headers')"

# The lock minus what the base image already provides: torch, torchvision and their CUDA
# stack (triton, nvidia-*, cuda-*), so the image never downloads or replaces a second torch.
# nvidia-ml-py is the project's own GPU-monitoring dependency, not part of that stack.
# --no-deps: the lock is complete, and it keeps pip from "upgrading" torch behind our back.
# TORCH_CUDA (compose: PIPELINE_TORCH_CUDA; docs/docker.md "Older drivers") picks the torch build:
# cu130 keeps the base's; cu126 replaces the base's pip-installed torch stack (torchaudio
# too, built against the old torch) with the lock's torch and torchvision from PyTorch's
# CUDA 12.6 index, torch 2.14's only CUDA 12 build, whose metadata pins the nvidia-*-cu12
# and triton wheels it pulls. NVIDIA's minor-version compatibility runs any CUDA 12 build on
# driver 525+. The base's CUDA 13 files stay in its layers, so that image is larger.
ARG TORCH_CUDA=cu130
COPY requirements.lock /tmp/requirements.lock
RUN case "${TORCH_CUDA}" in cu130|cu126) ;; *) echo "TORCH_CUDA (compose: PIPELINE_TORCH_CUDA): \
got '${TORCH_CUDA}', expected cu130 (the base's torch; the default base's needs NVIDIA driver 580 \
or newer) or cu126 (torch for CUDA 12.6, driver 525 or newer)" >&2; exit 2 ;; esac \
    && { grep -v -E '^(torch|torchvision|triton|cuda-[a-z-]+|nvidia-[a-z0-9-]+)==' /tmp/requirements.lock; \
      grep -E '^nvidia-ml-py==' /tmp/requirements.lock; } > /tmp/requirements.txt \
    && python -m pip install --no-deps -r /tmp/requirements.txt \
    && if [ "${TORCH_CUDA}" = cu126 ]; then \
         python -m pip list --format=freeze \
         | grep -E '^(torch|torchvision|torchaudio|triton|cuda-[a-z-]+|nvidia-[a-z0-9-]+)==' \
         | grep -v '^nvidia-ml-py==' | cut -d= -f1 | xargs -r python -m pip uninstall -y \
         && sed -n -E 's/^(torch|torchvision)==(.+)$/\1==\2+cu126/p' /tmp/requirements.lock \
         | xargs python -m pip install --index-url https://download.pytorch.org/whl/cu126; \
       fi \
    && python -c "import importlib.metadata as m, re, sys; \
pins = dict(re.findall(r'^(torch|torchvision)==(\S+)$', open('/tmp/requirements.lock').read(), re.M)); \
have = {n: m.version(n).split('+')[0] for n in pins}; \
sys.exit(0 if have == pins else f'BASE_IMAGE has {have}, requirements.lock pins {pins}')" \
    && rm /tmp/requirements.txt /tmp/requirements.lock

# The project itself, dependencies already in place; the lock's setuptools (installed above)
# builds it, so nothing unpinned is downloaded for the build.
COPY pyproject.toml README.md LICENSE /tmp/parallel-lab/
COPY pipeline /tmp/parallel-lab/pipeline
RUN python -m pip install --no-deps --no-build-isolation /tmp/parallel-lab \
    && rm -rf /tmp/parallel-lab

# The entrypoint (docker/entrypoint.py) starts as root only to drop to the owner of the
# bind-mounted repository, so any host user gets files of their own with no setting; and it
# sees SIGTERM through to the training processes (and SIGINT to DVC, which releases its lock)
# and waits for the stage's checkpoint. Without a bind mount the image's own /workspace
# belongs to `app`, and that is who runs.
RUN groupadd --gid 10001 app \
    && useradd --no-log-init --create-home --uid 10001 --gid 10001 --shell /bin/bash app \
    && mkdir -p /workspace \
    && chown app:app /workspace
COPY docker/entrypoint.py /usr/local/bin/parallel-lab-entrypoint
WORKDIR /workspace

ENTRYPOINT ["/usr/local/bin/parallel-lab-entrypoint"]
# The pipeline, then whatever the tracking server lacks of its runs: a server that is new (or
# was down) gets them from what is on disk even when DVC has nothing to re-run.
CMD ["sh", "-c", "dvc repro && python -m pipeline.publish"]
