"""The floor under both jobs of benchmarks/peer.py: the same training as a bare PyTorch loop,
with nothing around it (no launcher, no MLflow, no checkpoint, no progress). What it takes is
what the arithmetic and `import torch` take on this machine; a stage's wall above it is what
the stage adds, and its ratio to the peer's wall is the best any implementation of this job
could reach against the peer.

    python -m benchmarks.bare_loop --width 8 --epochs 3 --batch-size 256 --lr 0.1 \\
        --marks marks.json     # in a project whose fetch stage has run

The same model (`build_model(width, seed)`), the fetched tensors normalised per batch, plain
SGD at the same lr, the same batch (a shuffled order each epoch, the last partial batch
dropped) and epochs, and an evaluation over the test set every epoch, in fp32 on a CPU and
under bf16 autocast on a GPU. `--marks` gets the JSON the peer writes: the Unix times
training started and ended, and the last epoch's test accuracy; and the steps it took and when
the first was queued, the floor under a stage's first step (benchmarks/startup.py).
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.nn import functional as F

from pipeline.data.device_data import normalize
from pipeline.data.fashion_mnist import load_tensors
from pipeline.resnet import build_model


def job_parser(doc: str) -> argparse.ArgumentParser:
    """The job's settings as benchmarks/peer.py passes them, here and to the Lightning peer."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--eval-batch-size", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--marks", type=Path, help="JSON of the training marks")
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = job_parser(__doc__)
    parser.add_argument("--limit-train", type=int, help="the first N training images only")
    parser.add_argument("--limit-test", type=int, help="the first N test images only")
    args = parser.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    autocast = (
        (lambda: torch.autocast("cuda", torch.bfloat16)) if device.type == "cuda" else nullcontext
    )
    tensors = {k: v.to(device) for k, v in load_tensors(Path("data/fashion-mnist")).items()}
    train, test = slice(args.limit_train), slice(args.limit_test)
    images, labels = tensors["train_images"][train], tensors["train_labels"][train].long()
    test_images, test_labels = tensors["test_images"][test], tensors["test_labels"][test].long()
    model = build_model(args.width, args.seed).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    steps = len(labels) // args.batch_size

    marks: dict[str, float] = {"train_start": time.time()}
    for _ in range(args.epochs):
        model.train()
        order = torch.randperm(len(labels), device=device, generator=generator)
        for step in range(steps):
            batch = order[step * args.batch_size : (step + 1) * args.batch_size]
            with autocast():
                loss = F.cross_entropy(model(normalize(images[batch])), labels[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            marks.setdefault("first_step", time.time())  # queued, on a GPU, as a stage marks it
        model.eval()
        correct = torch.zeros((), dtype=torch.long, device=device)
        with torch.no_grad(), autocast():
            for start in range(0, len(test_labels), args.eval_batch_size):
                logits = model(normalize(test_images[start : start + args.eval_batch_size]))
                hits = logits.argmax(1) == test_labels[start : start + args.eval_batch_size]
                correct += hits.sum()
        test_acc = correct.item() / len(test_labels)
    marks["train_end"] = time.time()
    result = {**marks, "test_acc": test_acc, "steps": steps * args.epochs}
    if args.marks is not None:
        args.marks.write_text(json.dumps(result) + "\n")
    return result


if __name__ == "__main__":
    main()
