"""The serving side of a worker and the in-process worker.

- base: :class:`Worker` (store, registered functions, the message handler) and
  :class:`VirtualWorker` (the in-process client side);
- execution: the handler table, and running ops and registered functions;
- client: :class:`WorkerClient`, the client-side API every worker kind provides;
- store: the object store (ids, tags, promises, sealed entries);
- functions: the registry of named functions a worker runs besides aten ops;
- sealing: protocol material that no client may read, and how functions declare it;
- program: recorded command lists replayed with one message per worker;
- lanes: in-process workers running side by side (:func:`pointers.concurrently`);
- memory: handing freed memory back to the system (:func:`memory.trim_heap`);
- chains: pointer chains between in-process workers (a pointer's chain methods reach
  them through :func:`pointers.pointer_tensor.use_chains`: ``pointers/__init__`` hands
  them in).
"""

from pointers.worker.base import Frames, VirtualWorker, Worker
from pointers.worker.client import WorkerClient, WorkerStats
from pointers.worker.execution import tensor_meta

__all__ = ["Frames", "VirtualWorker", "Worker", "WorkerClient", "WorkerStats", "tensor_meta"]
