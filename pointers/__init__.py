"""pointers: workers, PointerTensors and remote execution on PyTorch.

>>> import torch, pointers as pt
>>> alice = pt.VirtualWorker("alice")
>>> p = pt.send(torch.tensor([1.0, -2.0]), alice)
>>> (p + p).abs().get()
tensor([2., 4.])
"""

from .concurrent import concurrently
from .errors import (
    DecodeError,
    LimitExceeded,
    LocationMismatchError,
    NotAllowedError,
    ObjectGoneError,
    PartyUnavailable,
    PointerError,
    RemoteError,
    UnknownObjectError,
    ValueRequiresGetError,
)
from .fedavg import Aggregator, FedAvgHistory, PlainAggregator, check_updates, fedavg
from .federated import FederatedDataLoader, FederatedDataset, WorkerDataset
from .hook import hook
from .module import get, send, tag
from .plan import Plan, PointerPlan, State, func2plan
from .plan_graph import (
    PlanBuildError,
    PlanCallError,
    PlanDecodeError,
    PlanError,
    PlanNotBuiltError,
    PlanRunError,
)
from .pointer_tensor import PointerTensor, call_function, is_pointer
from .protocol import Protocol, ProtocolError
from .worker import VirtualWorker, Worker, WorkerStats

__all__ = [
    "Aggregator",
    "concurrently",
    "DecodeError",
    "FedAvgHistory",
    "FederatedDataLoader",
    "FederatedDataset",
    "LocationMismatchError",
    "NotAllowedError",
    "ObjectGoneError",
    "PlainAggregator",
    "Plan",
    "PlanBuildError",
    "PlanCallError",
    "PlanDecodeError",
    "PlanError",
    "PlanNotBuiltError",
    "PlanRunError",
    "PointerPlan",
    "Protocol",
    "ProtocolError",
    "State",
    "PointerError",
    "PointerTensor",
    "RemoteError",
    "UnknownObjectError",
    "ValueRequiresGetError",
    "VirtualWorker",
    "WorkerDataset",
    "call_function",
    "Worker",
    "WorkerStats",
    "check_updates",
    "fedavg",
    "func2plan",
    "get",
    "hook",
    "is_pointer",
    "send",
    "tag",
    "LimitExceeded",
    "NetworkWorker",
    "PartyUnavailable",
    "connect",
]


def __getattr__(name: str) -> object:
    # Network workers load gRPC and cryptography only when first used.
    if name in ("connect", "NetworkWorker"):
        from . import network

        return getattr(network, name)
    raise AttributeError(f"module 'pointers' has no attribute {name!r}")
