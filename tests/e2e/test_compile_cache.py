"""torch.compile's caches outlive a run (issue 29): the launcher points inductor at
.cache/torch-compile/ in the project, outside DVC's outputs, so a repeat run of the same code
and settings loads every graph the first one compiled instead of compiling it again. Inductor's
own counters say which, in the stage's log; no timing is judged (2 shared cores promise none).
"""

import json
import re
import shutil

from support import run

CACHE_LINE = re.compile(
    r"train\[single\]: compile cache: (\d+) of (\d+) graphs loaded from (\S+), (\d+) compiled$",
    re.M,
)
# one epoch, compiled: the training forward and backward, and evaluation's forward
TRAIN = ("python", "-m", "pipeline.train", "single", "train.compile=true", "train.epochs=1")
# the project's cache, not one this machine's environment may name
DEFAULT_CACHE = {"TORCHINDUCTOR_CACHE_DIR": None, "TRITON_CACHE_DIR": None}


def cache_line(proc) -> tuple[int, int, str, int]:
    (found,) = CACHE_LINE.findall(proc.stdout)
    loaded, total, where, compiled = found
    return int(loaded), int(total), where, int(compiled)


def test_a_repeat_run_loads_every_graph_the_first_one_compiled(fetched_project):
    project = fetched_project()
    cache = (project / ".cache/torch-compile").resolve()
    first = run(project, *TRAIN, timeout=900, **DEFAULT_CACHE)
    loaded, total, where, compiled = cache_line(first)
    assert (where, loaded) == (str(cache), 0) and compiled == total > 0
    kernels = sorted(cache.rglob("*.so"))  # inductor's C++ kernels, built for the CPU
    assert kernels, f"no compiled kernels under {cache}"
    features = json.loads((project / "results/single/summary.json").read_text())["speed_features"]
    assert features == {
        "precision": "fp32",
        "channels_last": False,
        "compile": "default",
        "cuda_graphs": "none",
    }

    # the same run again from its start (its finished checkpoint would only be reused)
    shutil.rmtree(project / "checkpoints")
    shutil.rmtree(project / "results")
    second = run(project, *TRAIN, timeout=900, **DEFAULT_CACHE)
    assert cache_line(second) == (total, total, str(cache), 0)
    assert sorted(cache.rglob("*.so")) == kernels  # nothing compiled into it this time
