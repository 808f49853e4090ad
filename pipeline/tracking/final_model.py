"""A run's final model as MLflow logs it (pipeline/tracking/mlflow_run.py `log_final_model`):
results/<strategy>/model.pt loaded into the plain ResNet-18 (`build_model` with config.yaml's
model.width and seed), with a few normalized test images as its input example, and the run's
final figures (metrics.json's, `results.headline`) to link to it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import yaml
from torch import nn

from pipeline.data.device_data import normalize
from pipeline.data.fashion_mnist import DATA_DIR, load_arrays
from pipeline.errors import UserError, first_line
from pipeline.resnet import build_model
from pipeline.results import CONFIG, MODEL, RERUN, SUMMARY, RunSummary, headline
from pipeline.tracking.mlflow_run import ModelSource

EXAMPLE_IMAGES = 4  # the input example's batch: more than 1, so the batch dimension is dynamic


def plain_model(out_dir: Path) -> nn.Sequential:
    """The plain model with the weights of `out_dir`/model.pt, in eval mode, on the CPU."""
    strategy = out_dir.name
    try:
        cfg = yaml.safe_load((out_dir / CONFIG).read_text())
        model = build_model(cfg["model"]["width"], cfg["seed"])
    except Exception as err:  # noqa: BLE001 - whatever a damaged file makes of the reading
        raise UserError(
            f"{out_dir / CONFIG}: not this project's run configuration ({first_line(err)}); "
            f"{RERUN.format(strategy=strategy)}"
        ) from None
    try:
        state = torch.load(out_dir / MODEL, weights_only=True, map_location="cpu")
        model.load_state_dict(state)
    except Exception as err:  # noqa: BLE001 - likewise
        raise UserError(
            f"{out_dir / MODEL}: not the run's final weights ({first_line(err)}); "
            f"{RERUN.format(strategy=strategy)}"
        ) from None
    return model.float().eval()


def input_example(data_dir: Path = DATA_DIR, n: int = EXAMPLE_IMAGES) -> np.ndarray:
    """The first `n` test images, normalized as training feeds them: float32 [n, 1, 28, 28]."""
    images = load_arrays(data_dir, ["test_images"])["test_images"][:n]
    return normalize(torch.from_numpy(images)).numpy()


def final_figures(out_dir: Path) -> dict[str, float]:
    """metrics.json's figures, from summary.json (written first), those the run has."""
    summary = RunSummary.from_json(json.loads((out_dir / SUMMARY).read_text()))
    return {k: float(v) for k, v in headline(summary).items() if v is not None}


def model_source(out_dir: Path, data_dir: Path = DATA_DIR) -> ModelSource:
    """What `publish_strategy` logs (the compare and publish stages) as the run's MLflow model."""
    return lambda: (plain_model(out_dir), input_example(data_dir), final_figures(out_dir))
