"""benchmarks/e2e.py without DVC (issue 49 goal 3): it runs dvc.yaml's stage commands in
their order, for real, at a tiny size, and its JSON says which mode ran, every command's
seconds, and that it finished."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from support import REPO


def test_the_stage_commands_run_in_dvc_yaml_order_and_the_json_says_so(tmp_path):
    from pipeline.data.synthetic import write_synthetic

    write_synthetic(tmp_path / "mirror", 256, 128)
    out = tmp_path / "e2e.json"
    tiny = ["model.width=4", "train.epochs=1", "predict.gpus=[]"]  # predict: nothing to time
    temp = tmp_path / "tmp"  # the stages' TMPDIR: what they leave behind there
    temp.mkdir()
    subprocess.run(
        [sys.executable, "-m", "benchmarks.e2e", "--mirror", str(tmp_path / "mirror")]
        + ["--strategies", "single", "--out", str(out), "--set", *tiny],
        cwd=REPO,
        check=True,
        capture_output=True,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    result = json.loads(out.read_text())
    assert result["ran"] == "dvc.yaml's stage commands, one after the other"
    assert result["finished"] is True
    seconds = result["seconds"]
    assert list(seconds) == ["fetch", "train@single", "predict@single", "compare", "total"]
    assert seconds["total"] == sum(v for k, v in seconds.items() if k != "total")
    assert result["steady_epoch_s"]["single"] > 0
    phases = result["phases_s"]["single"]  # where the stage's wall went, in order
    assert (
        0
        < phases["agent"]
        < phases["first step"]
        < phases["workers ended"]
        < seconds["train@single"]
    )
    # torch's elastic agent leaves a torchelastic_* directory per stage by default
    assert not [p.name for p in temp.iterdir() if p.name.startswith("torchelastic_")]
