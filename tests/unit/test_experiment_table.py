"""The experiments table from the shape of `dvc exp show --json`."""

from pipeline.reporting.experiment_table import build_rows, markdown


def fake_show() -> list[dict]:
    """The shape of `dvc exp show --json` (DVC 3): workspace, a baseline, its experiments."""

    def rev(lr, strategies=None):
        figures = {"acc": {}, "peak_mib": {}}  # reports/summary.json: figure -> strategy
        for s, (acc, mib) in (strategies or {}).items():
            figures["acc"][s], figures["peak_mib"][s] = acc, mib
        metrics = {"reports/summary.json": {"data": figures if strategies else {}}}
        return {
            "params": {
                "params.yaml": {
                    "data": {"train": {"lr": lr, "batch_size": 256, "epochs": 2}, "seed": 0}
                }
            },
            "metrics": metrics,
        }

    missing = rev(0.4)
    missing["metrics"] = {"reports/summary.json": {"error": {"type": "FileNotFoundError"}}}
    return [
        {"rev": "workspace", "name": None, "data": rev(0.1), "experiments": None},
        {
            "rev": "abc1234def",
            "name": "main",
            "data": rev(0.1),
            "experiments": [
                {
                    "name": "exp-a",
                    "executor": {"state": "success"},
                    "revs": [
                        {
                            "rev": "1111111",
                            "name": "exp-a",
                            "data": rev(0.2, {"single": (0.5, 1), "ddp": (0.6, 2)}),
                        }
                    ],
                },
                {
                    "name": "exp-b",
                    "executor": None,
                    "revs": [
                        {"rev": "2222222", "name": "exp-b", "data": rev(0.3, {"ddp": (0.7, 2)})}
                    ],
                },
                {
                    "name": "exp-c",
                    "executor": {"state": "failed"},
                    "revs": [{"rev": "3333333", "name": "exp-c", "data": missing}],
                },
            ],
        },
    ]


def test_experiments_table_has_a_row_per_experiment_and_strategy():
    rows, columns, without = build_rows(fake_show())
    assert [(r["experiment"], r["strategy"]) for r in rows] == [
        ("exp-a", "ddp"),
        ("exp-a", "single"),
        ("exp-b", "ddp"),
    ]
    assert columns == ["train.batch_size", "train.lr", "train.epochs"]
    assert without == ["exp-c (failed)"]
    table = markdown(rows, columns, without)
    assert "| exp-a | ddp | 256 | 0.2 | 2 | 0.6000 | — | — | 2 |" in table
    assert "exp-c (failed)" in table
