"""pointers: workers, PointerTensors and remote execution on PyTorch.

>>> import torch, pointers as pt
>>> alice = pt.VirtualWorker("alice")
>>> p = pt.send(torch.tensor([1.0, -2.0]), alice)
>>> (p + p).abs().get()
tensor([2., 4.])
"""

from typing import TYPE_CHECKING, Any

from pointers.compat import FixedPrecisionTensor, Optims
from pointers.compat import install as _install_compat
from pointers.errors import (
    DecodeError,
    LimitExceeded,
    LocationMismatchError,
    NotAllowedError,
    ObjectGoneError,
    PartyUnavailable,
    PointerError,
    RemoteError,
    SendError,
    UnknownObjectError,
    ValueRequiresGetError,
)
from pointers.hook import TorchHook, hook
from pointers.module import get, get_all, send, tag
from pointers.plans.graph import (
    PlanBuildError,
    PlanCallError,
    PlanDecodeError,
    PlanError,
    PlanNotBuiltError,
    PlanRunError,
)
from pointers.plans.plan import Plan, State, func2plan
from pointers.plans.pointer_plan import PointerPlan
from pointers.plans.protocol import Protocol, ProtocolError
from pointers.pointer_tensor import PointerTensor, call_function, is_pointer, use_chains
from pointers.worker.base import VirtualWorker, Worker
from pointers.worker.chains import PointerChains
from pointers.worker.client import WorkerStats
from pointers.worker.lanes import concurrently
from pointers.worker.owners import DataPolicy, OwnedData, own, save_data

# The registrations made as pointers loads, in this one place (tests/test_layering.py
# allows module-level calls nowhere else): a pointer's chain methods, handed down to
# pointers.pointer_tensor from pointers.worker.chains above it, and PySyft 0.2's names
_install_compat()  # PySyft 0.2 compatible names: worker._objects, ptr.owner
use_chains(PointerChains())

if TYPE_CHECKING:  # the lazily loaded names (_LAZY, __getattr__), for type checkers
    from pointers.federated.datasets import FederatedDataLoader, FederatedDataset, WorkerDataset
    from pointers.federated.datasets import WorkerDataset as BaseDataset
    from pointers.federated.fedavg import (
        Aggregator,
        FedAvgHistory,
        PlainAggregator,
        check_updates,
        fedavg,
    )
    from pointers.network import NetworkWorker, connect
    from pointers.pysyft_sandbox import PrivateGridNetwork, create_sandbox, sandbox

    local_worker: Any  # pointers.compat.local_worker(), made on each access

__all__ = [
    "Aggregator",
    "concurrently",
    "DataPolicy",
    "OwnedData",
    "own",
    "save_data",
    "DecodeError",
    "FixedPrecisionTensor",
    "Optims",
    "TorchHook",
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
    "SendError",
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
    "get_all",
    "hook",
    "is_pointer",
    "send",
    "tag",
    "LimitExceeded",
    "NetworkWorker",
    "PartyUnavailable",
    "connect",
    "BaseDataset",
    "create_sandbox",
    "PrivateGridNetwork",
    "local_worker",
    "sandbox",
]


# the application layers, loaded on first use: federated learning, and network workers
# (gRPC and cryptography)
_LAZY = {
    "Aggregator": "pointers.federated.fedavg",
    "FedAvgHistory": "pointers.federated.fedavg",
    "PlainAggregator": "pointers.federated.fedavg",
    "check_updates": "pointers.federated.fedavg",
    "fedavg": "pointers.federated.fedavg",
    "FederatedDataLoader": "pointers.federated.datasets",
    "FederatedDataset": "pointers.federated.datasets",
    "WorkerDataset": "pointers.federated.datasets",
    "connect": "pointers.network",
    "create_sandbox": "pointers.pysyft_sandbox",
    "PrivateGridNetwork": "pointers.pysyft_sandbox",
    "sandbox": "pointers.pysyft_sandbox",
    "NetworkWorker": "pointers.network",
}


def __getattr__(name: str) -> object:
    if name == "local_worker":  # PySyft's sy.local_worker (pointers.compat)
        from pointers.compat import local_worker

        return local_worker()
    if name == "BaseDataset":  # PySyft's name for one worker's dataset
        name = "WorkerDataset"
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pointers' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
