"""What DataParallel does to BatchNorm, measured on the CPU: test accuracy of `single` against
the same training with each batch split over devices the way `dp` and `balanced_dp` split it.

    python -m benchmarks.dp_batchnorm --data ../shared/fashion-mnist-sample   # a fetched dir
    python -m benchmarks.dp_batchnorm --splits 86,85,85 2,127,127 --epochs 15

Under nn.DataParallel every device's replica normalises its own chunk of the batch with that
chunk's statistics, and only cuda:0's replica keeps its running statistics (the others are
thrown away with the replicas), so evaluation uses running statistics gathered from cuda:0's
chunk alone: 2 samples per forward with balanced_dp's gpu0_bsz 2. Gradients are still those of
the whole batch (the logits are gathered, the loss is one mean).

`split_forward` computes exactly that on one device: the chunks go through the one model one
after the other (each normalised on its own), and after the backward the running statistics
are rolled back to what the first chunk left. Everything else (seeded weights, data order,
SGD) is the train stage's. Results are medians over --seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.data.device_data import epoch_permutation, normalize
from pipeline.data.fashion_mnist import DATA_DIR, load_tensors
from pipeline.resnet import build_model


def split_forward(
    model: nn.Module, x: torch.Tensor, sizes: list[int]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits as DataParallel computes them over len(sizes) devices, and the buffers its first
    replica left, which the caller restores once the backward is done (autograd still holds
    the live ones)."""
    outputs, kept = [], {}
    for i, chunk in enumerate(x.split(sizes)):
        if i == 1:  # what the first replica left: the only statistics DataParallel keeps
            kept = {k: v.clone() for k, v in model.named_buffers()}
        outputs.append(model(chunk))
    return torch.cat(outputs), kept


def train_and_test(tensors: dict, sizes: list[int], args, seed: int) -> float:
    torch.manual_seed(seed)
    model = build_model(args.width, seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    images, labels = tensors["train_images"][: args.limit_train], tensors["train_labels"].long()
    batch, n = sum(sizes), len(images)
    for epoch in range(args.epochs):
        model.train()
        order = epoch_permutation(seed, epoch, n, torch.device("cpu"))
        for step in range(n // batch):
            idx = order[step * batch : (step + 1) * batch]
            logits, kept = split_forward(model, normalize(images[idx]), sizes)
            loss = F.cross_entropy(logits, labels[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                buffers = dict(model.named_buffers())
                for name, value in kept.items():
                    buffers[name].copy_(value)
    model.eval()
    with torch.no_grad():
        logits = model(normalize(tensors["test_images"]))
    return (logits.argmax(1) == tensors["test_labels"].long()).float().mean().item()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA_DIR, help="the fetch stage's output")
    parser.add_argument(
        "--splits",
        nargs="*",
        default=["256", "86,85,85", "2,127,127"],
        help="per-device chunk sizes of one batch; a single number is single",
    )
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--limit-train", type=int, default=None)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    tensors = load_tensors(args.data)
    results = {}
    for text in args.splits:
        sizes = [int(s) for s in text.split(",")]
        accs = [train_and_test(tensors, sizes, args, seed) for seed in range(args.seeds)]
        results[text] = {"test_acc_median": statistics.median(accs), "test_acc": accs}
        print(
            f"split {'+'.join(map(str, sizes))}: test accuracy median "
            f"{statistics.median(accs):.4f} over seeds {[round(a, 4) for a in accs]}",
            flush=True,
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "settings": vars(args) | {"data": str(args.data), "out": str(args.out)},
                    "results": results,
                },
                indent=1,
            )
            + "\n"
        )
    return results


if __name__ == "__main__":
    main()
