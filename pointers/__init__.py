"""pointers: workers, PointerTensors and remote execution on PyTorch.

>>> import torch, pointers as pt
>>> alice = pt.VirtualWorker("alice")
>>> p = pt.send(torch.tensor([1.0, -2.0]), alice)
>>> (p + p).abs().get()
tensor([2., 4.])
"""

from .errors import (
    DecodeError,
    LocationMismatchError,
    NotAllowedError,
    ObjectGoneError,
    PointerError,
    RemoteError,
    UnknownObjectError,
    ValueRequiresGetError,
)
from .hook import hook
from .module import get, send, tag
from .pointer_tensor import PointerTensor, call_function, is_pointer
from .worker import VirtualWorker, Worker, WorkerStats

__all__ = [
    "DecodeError",
    "LocationMismatchError",
    "NotAllowedError",
    "ObjectGoneError",
    "PointerError",
    "PointerTensor",
    "RemoteError",
    "UnknownObjectError",
    "ValueRequiresGetError",
    "VirtualWorker",
    "call_function",
    "Worker",
    "WorkerStats",
    "get",
    "hook",
    "is_pointer",
    "send",
    "tag",
]
