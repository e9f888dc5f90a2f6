"""CrypTen's layers and losses: each layer is the torch layer of the same name as a
:class:`~mpc.crypten.nn.module.Module` (so ``encrypt()`` shares its parameters); each loss
takes CrypTen's targets (the same shape as the input: one-hot classes for
``CrossEntropyLoss``) and computes CrypTen's formula on the shares."""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import nn

from mpc.crypten.cryptensor import (
    conv1d,
    on_shares,
    shared_bce,
    shared_bce_with_logits,
    shared_cross_entropy,
)
from mpc.crypten.nn.module import Module


class Linear(Module, nn.Linear):
    pass


class Conv1d(Module, nn.Conv1d):
    """torch's Conv1d, run as a 2-D convolution of height 1 (the engine's convolution is
    2-D); zero padding only."""

    def _conv_forward(self, input: Any, weight: Any, bias: Any) -> Any:  # noqa: A002
        if self.padding_mode != "zeros":
            raise ValueError(f"padding_mode={self.padding_mode!r}: only 'zeros' here")
        return conv1d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)


class Conv2d(Module, nn.Conv2d):
    pass


class ReLU(Module, nn.ReLU):
    pass


class ReLU6(Module, nn.ReLU6):
    pass


class Hardtanh(Module, nn.Hardtanh):
    pass


class Sigmoid(Module, nn.Sigmoid):
    pass


class Tanh(Module, nn.Tanh):
    pass


class Softmax(Module, nn.Softmax):
    pass


class LogSoftmax(Module, nn.LogSoftmax):
    pass


class MaxPool2d(Module, nn.MaxPool2d):
    pass


class AvgPool2d(Module, nn.AvgPool2d):
    pass


class AdaptiveAvgPool2d(Module, nn.AdaptiveAvgPool2d):
    pass


class AdaptiveMaxPool2d(Module, nn.AdaptiveMaxPool2d):
    pass


class BatchNorm1d(Module, nn.BatchNorm1d):
    pass


class BatchNorm2d(Module, nn.BatchNorm2d):
    pass


class Dropout(Module, nn.Dropout):
    pass


class Flatten(Module, nn.Flatten):
    pass


class Sequential(Module, nn.Sequential):
    pass


class ModuleList(Module, nn.ModuleList):
    pass


class ModuleDict(Module, nn.ModuleDict):
    pass


class _Loss(Module):
    """CrypTen's loss base: ``loss(x, y)`` with ``y`` the shape of ``x``."""

    def forward(self, x: Any, y: Any) -> Any:
        if tuple(x.shape) != tuple(y.shape):
            raise ValueError(
                f"input and target must have the same size (CrypTen's losses take one-hot "
                f"or per-element targets), got {tuple(x.shape)} and {tuple(y.shape)}"
            )
        return self.loss(x, y)

    def loss(self, x: Any, y: Any) -> Any:
        raise NotImplementedError


class MSELoss(_Loss):
    """mean((x - y)^2)."""

    def loss(self, x: Any, y: Any) -> Any:
        return F.mse_loss(x, y)


class L1Loss(_Loss):
    """mean(|x - y|), as (x - y) * sign(x - y): abs's own backward needs torch's sgn, which
    the engine lacks."""

    def loss(self, x: Any, y: Any) -> Any:
        d = x - y
        return (d * d.sign().detach()).mean()


class BCELoss(_Loss):
    """-mean(y log x + (1 - y) log(1 - x)), x in (0, 1)."""

    def loss(self, x: Any, y: Any) -> Any:
        return shared_bce(x, y)


class BCEWithLogitsLoss(_Loss):
    """The binary cross-entropy of sigmoid(x)."""

    def loss(self, x: Any, y: Any) -> Any:
        return on_shares("BCEWithLogitsLoss", shared_bce_with_logits, x, y)


class CrossEntropyLoss(_Loss):
    """Mean over the batch of -sum(y * log_softmax(x, 1)), y one-hot (as CrypTen's; torch's
    takes class indices)."""

    def loss(self, x: Any, y: Any) -> Any:
        return shared_cross_entropy(x, y)
