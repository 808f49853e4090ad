"""The Lightning peer of `python -m pipeline.train single`: the same job, written as a plain
Lightning user would write it. benchmarks/peer.py runs it as its own process and times it.

    python -m benchmarks.lightning_peer --width 8 --epochs 3 --batch-size 256 --lr 0.1 \\
        --out peer/ --marks marks.json     # in a project whose fetch stage has run

The same model (`build_model(width, seed)`), the fetched tensors (`load_tensors`), normalised
as the pipeline does (`device_data.normalize`, per batch), plain SGD at the same lr, the same
batch and epochs, fp32 on a CPU and bf16-mixed on a GPU; a LightningModule and a Trainer with
an MLflow logger (the project's SQLite store unless MLFLOW_TRACKING_URI says otherwise), a
checkpoint and a validation over the test set every epoch. A DataLoader over a
TensorDataset (shuffled, the last partial batch dropped as the pipeline drops it) feeds it;
Lightning's defaults stay as they are (sanity validation steps, model summary), but for the
progress bar, which nobody watches here. `--marks` gets a JSON of the Unix times training
started and ended (a callback) and the last epoch's test accuracy.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.bare_loop import job_parser
from pipeline.data.device_data import normalize
from pipeline.data.fashion_mnist import load_tensors
from pipeline.resnet import build_model


class Classifier(L.LightningModule):
    def __init__(self, width: int, seed: int, lr: float) -> None:
        super().__init__()
        self.net = build_model(width, seed)
        self.lr = lr

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = F.cross_entropy(self.net(normalize(images)), labels)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        logits = self.net(normalize(images))
        self.log("test_loss", F.cross_entropy(logits, labels))
        self.log("test_acc", (logits.argmax(1) == labels).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class Marks(Callback):
    """When training starts and ends: what came before the start is the peer's fixed cost."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    def on_train_start(self, trainer, pl_module) -> None:
        self.times["train_start"] = time.time()

    def on_train_end(self, trainer, pl_module) -> None:
        self.times["train_end"] = time.time()


def loaders(batch_size: int, eval_batch_size: int) -> tuple[DataLoader, DataLoader]:
    tensors = load_tensors(Path("data/fashion-mnist"))
    train = TensorDataset(tensors["train_images"], tensors["train_labels"].long())
    test = TensorDataset(tensors["test_images"], tensors["test_labels"].long())
    return (
        DataLoader(train, batch_size=batch_size, shuffle=True, drop_last=True),
        DataLoader(test, batch_size=eval_batch_size),
    )


def main(argv: list[str] | None = None) -> dict:
    parser = job_parser(__doc__)
    parser.add_argument("--out", type=Path, default=Path("peer"), help="checkpoints go here")
    args = parser.parse_args(argv)

    L.seed_everything(args.seed)  # the DataLoader's shuffle
    train, test = loaders(args.batch_size, args.eval_batch_size)
    marks = Marks()
    gpu = torch.cuda.is_available()
    logger = MLFlowLogger(
        experiment_name="lightning-peer",
        tracking_uri=os.environ.get("MLFLOW_TRACKING_URI", f"sqlite:///{Path.cwd() / 'mlflow.db'}"),
    )
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="gpu" if gpu else "cpu",
        devices=1,
        precision="bf16-mixed" if gpu else "32-true",
        logger=logger,
        callbacks=[ModelCheckpoint(dirpath=args.out / "checkpoints", every_n_epochs=1), marks],
        enable_progress_bar=False,
    )
    model = Classifier(args.width, args.seed, args.lr)
    trainer.fit(model, train, test)
    result = {**marks.times, "test_acc": float(trainer.callback_metrics["test_acc"])}
    if args.marks is not None:
        args.marks.write_text(json.dumps(result) + "\n")
    return result


if __name__ == "__main__":
    main()
