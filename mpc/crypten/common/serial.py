"""CrypTen's ``crypten.common.serial``: which classes a saved model may be loaded as.

CrypTen loads files with its own restricted unpickler; here loading is torch's
weights-only ``torch.load``, which refuses every class not on its allow-list.
``register_safe_class(cls)`` puts ``cls`` and the torch layers CrypTen trusts by default
on it (:func:`torch.serialization.add_safe_globals`), so a model saved whole with
``torch.save(model, f)`` loads with ``torch.load(f)`` and ``crypten.load_from_party(f)``.
Only register classes whose files you trust to describe data: nothing else runs."""

from __future__ import annotations

import torch
from torch import nn

# the torch layers CrypTen's unpickler allows without registration
_TORCH_LAYERS: list[type] = [
    nn.LogSigmoid,
    nn.LogSoftmax,
    nn.ReLU,
    nn.Sigmoid,
    nn.Softmax,
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.Conv1d,
    nn.Conv2d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.Flatten,
    nn.Linear,
    nn.BCELoss,
    nn.BCEWithLogitsLoss,
    nn.CrossEntropyLoss,
    nn.L1Loss,
    nn.MSELoss,
    nn.AvgPool2d,
    nn.MaxPool2d,
]


def register_safe_class(input_class: type) -> None:
    """Allow ``torch.load`` to rebuild ``input_class`` (and torch's common layers)."""
    if not isinstance(input_class, type):
        raise TypeError(f"register_safe_class takes a class, got {type(input_class).__name__}")
    torch.serialization.add_safe_globals([input_class, *_TORCH_LAYERS])


__all__ = ["register_safe_class"]
