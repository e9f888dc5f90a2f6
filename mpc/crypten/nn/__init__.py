"""CrypTen's ``crypten.nn``: ``Module``, ``from_pytorch``, layers and losses."""

from __future__ import annotations

from typing import NoReturn

from mpc.crypten._errors import lookup
from mpc.crypten.nn.layers import (
    AdaptiveAvgPool2d,
    AdaptiveMaxPool2d,
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    BCELoss,
    BCEWithLogitsLoss,
    Conv1d,
    Conv2d,
    CrossEntropyLoss,
    Dropout,
    Flatten,
    Hardtanh,
    L1Loss,
    Linear,
    LogSoftmax,
    MaxPool2d,
    ModuleDict,
    ModuleList,
    MSELoss,
    ReLU,
    ReLU6,
    Sequential,
    Sigmoid,
    Softmax,
    Tanh,
)
from mpc.crypten.nn.module import FromPyTorch, Module, from_pytorch

_ONNX = (
    "there is no ONNX step here: crypten.nn.from_pytorch(model, dummy_input) runs the torch "
    "model itself on the shares (convert other frameworks' models to torch first)"
)
_GRAPH = (
    "CrypTen's ONNX graph nodes are not needed: use the torch module (any torch op the "
    "engine supports runs inside crypten.nn.from_pytorch(model) or a crypten.nn.Module)"
)
_UNAVAILABLE = {
    "from_onnx": _ONNX,
    "from_tensorflow": _ONNX,
    "TF_AND_TF2ONNX": _ONNX,
    "Graph": _GRAPH,
    "Parameter": "use torch.nn.Parameter (encrypt() shares the module's parameters)",
    "RAPPORLoss": "not offered; write the loss with torch ops on the shares",
    "CosineSimilarity": "write it with torch ops on the shares: (x * y).sum(1) / (x.norm...)",
}
for _name in (
    "Add Cast Concat Constant ConstantOfShape ConstantPad1d ConstantPad2d ConstantPad3d Conv "
    "Div Equal Erf Exp Expand Gather Gemm GlobalAveragePool GroupNorm MatMul Mean Mul Pow "
    "Range Reshape Shape Slice Sqrt Squeeze Sub Sum Transpose Unsqueeze Where"
).split():
    _UNAVAILABLE[_name] = _GRAPH


def __getattr__(name: str) -> NoReturn:
    lookup(_UNAVAILABLE, "crypten.nn", name)


__all__ = [
    "AdaptiveAvgPool2d",
    "AdaptiveMaxPool2d",
    "AvgPool2d",
    "BCELoss",
    "BCEWithLogitsLoss",
    "BatchNorm1d",
    "BatchNorm2d",
    "Conv1d",
    "Conv2d",
    "CrossEntropyLoss",
    "Dropout",
    "Flatten",
    "FromPyTorch",
    "Hardtanh",
    "L1Loss",
    "Linear",
    "LogSoftmax",
    "MSELoss",
    "MaxPool2d",
    "Module",
    "ModuleDict",
    "ModuleList",
    "ReLU",
    "ReLU6",
    "Sequential",
    "Sigmoid",
    "Softmax",
    "Tanh",
    "from_pytorch",
]
