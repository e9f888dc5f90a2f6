"""Plaintext data and model for the encrypted-inference demo on handwritten digits.

The data is scikit-learn's bundled ``load_digits()`` set (1797 grayscale 8x8 images of the
digits 0-9; it ships with scikit-learn, so nothing is downloaded). The model is a small CNN
built only from layers the MPC engine supports: ``Conv2d``, ``ReLU``, ``MaxPool2d``,
``Flatten`` and ``Linear`` (no batch norm, dropout or softmax).

Everything here is deterministic given ``seed``; training runs inside
``torch.random.fork_rng()`` so that it leaves the global torch RNG state untouched.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["accuracy", "load_digits_split", "make_digits_cnn", "train_digits_cnn"]

NUM_CLASSES = 10
IMAGE_SIZE = 8
_MAX_LR = 0.02


def load_digits_split(
    test_fraction: float = 0.25, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Load the digits data set and split it into train and test sets.

    Images are float32 tensors of shape ``(N, 1, 8, 8)`` scaled to ``[0, 1]`` (the raw pixel
    values are 0..16); labels are int64 tensors of shape ``(N,)``. The split is stratified
    by label and deterministic given ``seed``.

    Returns:
        ``(x_train, y_train, x_test, y_test)``.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = np.asarray(digits.images, dtype=np.float32).reshape(-1, 1, IMAGE_SIZE, IMAGE_SIZE) / 16.0
    y = np.asarray(digits.target, dtype=np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    return (
        torch.from_numpy(np.ascontiguousarray(x_train)),
        torch.from_numpy(np.ascontiguousarray(y_train)),
        torch.from_numpy(np.ascontiguousarray(x_test)),
        torch.from_numpy(np.ascontiguousarray(y_test)),
    )


def make_digits_cnn() -> nn.Sequential:
    """Build the (untrained) digits CNN: 8x8 -> 4x4 -> 2x2 feature maps, then a linear head."""
    return nn.Sequential(
        nn.Conv2d(1, 8, kernel_size=3, padding=1),  # 1x8x8 -> 8x8x8
        nn.ReLU(),
        nn.MaxPool2d(2),  # -> 8x4x4
        nn.Conv2d(8, 16, kernel_size=3, padding=1),  # -> 16x4x4
        nn.ReLU(),
        nn.MaxPool2d(2),  # -> 16x2x2
        nn.Flatten(),  # -> 64
        nn.Linear(64, NUM_CLASSES),
    )


def accuracy(model: nn.Module, x: Tensor, y: Tensor) -> float:
    """Fraction of samples in ``x`` whose arg-max prediction equals the label in ``y``."""
    if len(y) == 0:
        raise ValueError("accuracy of an empty set is undefined")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            predictions = model(x).argmax(dim=1)
    finally:
        model.train(was_training)
    return int((predictions == y).sum().item()) / len(y)


def train_digits_cnn(
    epochs: int = 20, seed: int = 0, verbose: bool = False
) -> tuple[nn.Module, float]:
    """Train the digits CNN with Adam on mini-batches and report its test accuracy.

    Uses mini-batches of 32 and a one-cycle learning-rate schedule (peak 0.02). The default
    20 epochs take about 2 s on one CPU thread and reach roughly 97-99% test accuracy
    (depending on ``seed``, which also picks the train/test split).

    Training is deterministic given ``seed``: weights are initialised after
    ``torch.manual_seed(seed)`` inside ``torch.random.fork_rng()`` and batches are shuffled
    by a private ``torch.Generator`` seeded with ``seed``, so the global torch RNG state is
    the same afterwards as before.

    Returns:
        ``(model, test_accuracy)`` with the model in eval mode.
    """
    x_train, y_train, x_test, y_test = load_digits_split(seed=seed)
    batch_size = 32
    steps_per_epoch = (len(y_train) + batch_size - 1) // batch_size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = make_digits_cnn()
        optimizer = torch.optim.Adam(model.parameters(), lr=_MAX_LR)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=_MAX_LR, total_steps=max(1, epochs * steps_per_epoch)
        )
        loss_fn = nn.CrossEntropyLoss()
        generator = torch.Generator().manual_seed(seed)
        for epoch in range(epochs):
            model.train()
            order = torch.randperm(len(y_train), generator=generator)
            total_loss = 0.0
            for start in range(0, len(order), batch_size):
                idx = order[start : start + batch_size]
                optimizer.zero_grad()
                loss = loss_fn(model(x_train[idx]), y_train[idx])
                loss.backward()
                optimizer.step()
                scheduler.step()
                total_loss += loss.item() * len(idx)
            if verbose:
                print(
                    f"epoch {epoch + 1:3d}/{epochs}: loss {total_loss / len(order):.4f}, "
                    f"test accuracy {accuracy(model, x_test, y_test):.4f}"
                )
    model.eval()
    return model, accuracy(model, x_test, y_test)
