import json

from support import LEARNED, run


def test_single_trains_and_writes_results(fetched_project):
    project = fetched_project()
    run(project, "python", "-m", "pipeline.train", "single")
    metrics = json.loads((project / "results/single/metrics.json").read_text())
    assert metrics["strategy"] == "single" and metrics["epochs"] == 2
    assert metrics["test_acc"] >= LEARNED, metrics["test_acc"]  # chance is 0.1
