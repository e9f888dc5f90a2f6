"""Pointer chains between in-process workers (PySyft 0.2's ``x.send(bob).send(alice)``).

``ptr.send(alice)`` on a pointer to bob's tensor moves the tensor to alice, party to party,
and leaves *bob* holding a pointer to it: bob's store then holds a
:class:`~pointers.pointer_tensor.PointerTensor` whose location is a :class:`PeerClient`,
bob's own client of alice. An op the client sends bob on that pointer runs at bob as any
op does, and so bob forwards it to alice: the result is a new pointer at bob to a new
tensor at alice. ``get()`` goes one hop (bob's pointer becomes the client's pointer to
alice's tensor), ``remote_get()`` brings alice's tensor to bob, ``move`` collapses the
first hop and moves the tensor on.

What a worker may do as a client of another is narrow, and checked by the
:class:`PeerClient` before a message leaves the worker:

* only ops on the objects it points to (``ExecuteOp``), fetching one of them
  (``remote_get``), and deleting them; no registered functions, plans or stores;
* an op it forwards carries object references and Python scalars only, never a tensor
  value: nothing held at the forwarding worker (a local tensor mixed into the op, or
  protocol material, which is sealed) can leave it through a chain.

Chains exist between in-process workers only (``VirtualWorker``): a network worker is
never a client of another (a peer may deliver objects, not run commands or fetch them), so
:func:`check_chain_workers` refuses network workers with an error that says so. The chain
functions below are registered at an in-process worker when a chain first passes through
it (:func:`install`); they are never registered at a network worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pointers.errors import ChainError, NotAllowedError, PointerError, RemoteError
from pointers.pointer_tensor import (
    PointerTensor,
    call_function,
    contiguous_stride,
)
from pointers.wire import serde
from pointers.wire.messages import (
    CallFunction,
    Delete,
    ErrorReply,
    ExecuteOp,
    Fetch,
    Message,
    Reply,
    SendToPeer,
    decode_message,
    encode_message,
)
from pointers.worker.base import VirtualWorker, Worker

#: the names of the chain functions registered at an in-process worker
SEND = "pointers.chain.send"
UNLINK = "pointers.chain.unlink"
REMOTE_GET = "pointers.chain.remote_get"

_STATE = "pointers.chains"  # a worker's PeerClients, by peer id, in its function_state
_ALLOWED = (ExecuteOp, Fetch, Delete)


NETWORK_REFUSAL = (
    "pointer chains (a worker holding a pointer to another worker's object) exist between "
    "in-process workers only: a network worker is never a client of another worker (a peer "
    "may deliver objects, not run commands or fetch them; docs/coming-from-pysyft.md). "
    "Use .move(worker) to send the object on, party to party"
)


def check_chain_workers(location: Any, destination: Any) -> None:
    """Refuse a chain unless both ends are in-process workers."""
    if not hasattr(destination, "new_id"):
        raise TypeError(f"send() expects a worker, got {type(destination).__name__}")
    if not (isinstance(location, VirtualWorker) and isinstance(destination, VirtualWorker)):
        raise ChainError(NETWORK_REFUSAL)


class PeerClient:
    """A worker's own client of another in-process worker, for the pointers it holds.

    Its messages go through the encoder and decoder (nothing is pickled or shared by
    reference) and straight to the target's message handler: not through the user's
    client side of the target (its recordings and concurrent lanes are the user's). Ids
    at the target come from the target's id counter, so they never collide with the
    user's; deletes of dropped pointers travel with the target's next message."""

    recorder: Any = None

    def __init__(self, owner: Worker, target: VirtualWorker) -> None:
        self.owner = owner
        self.target = target
        self.id = target.id

    # -- WorkerClient ----------------------------------------------------------------
    def new_id(self) -> int:
        return next(self.target._ids)

    def post(self, msg: Message) -> None:
        self._exchange(msg)

    def request(self, msg: Message) -> Any:
        return self._exchange(msg)

    def queue_delete(self, obj_id: int) -> None:
        self.target.queue_delete(obj_id)  # no I/O here (see VirtualWorker.queue_delete)

    def flush_deletes(self) -> None:
        pass  # they travel with the target's next message

    def introduce(self, peer: Any) -> None:
        raise NotAllowedError(
            f"worker {self.owner.id!r} holds pointers to {self.id!r} but introduces no peers"
        )

    def set_recorder(self, recorder: Any) -> None:
        raise NotAllowedError("a worker's pointers to another worker are not recorded")

    def search(self, *query: str) -> list[Any]:
        raise NotAllowedError("a worker holding a pointer chain does not search its peer")

    def wait_programs(self, timeout: float | None = None) -> None:
        pass

    @property
    def objects(self) -> Any:
        raise NotAllowedError("a worker holding a pointer chain does not list its peer")

    @property
    def stats(self) -> Any:
        return self.owner.stats

    # -- the checked exchange --------------------------------------------------------
    def _exchange(self, msg: Message) -> Any:
        if not isinstance(msg, _ALLOWED):
            raise NotAllowedError(
                f"worker {self.owner.id!r} may only run ops on, fetch and delete the objects "
                f"it points to at {self.id!r}, not send a {msg.KIND!r} message"
            )
        if isinstance(msg, ExecuteOp) and _holds_tensor((msg.args, msg.kwargs)):
            raise NotAllowedError(
                f"an op forwarded along a pointer chain ({self.owner.id!r} -> {self.id!r}) "
                "takes the objects of the chain and Python numbers only, never a tensor "
                f"value: nothing held at {self.owner.id!r} leaves it this way. Send the "
                "tensor along the chain first"
            )
        header, buffers = encode_message(msg)
        stats = self.owner.stats
        stats.peer_messages_sent += 1
        stats.peer_bytes_sent += serde.nbytes(header, buffers) if buffers else len(header)
        rh, rb = self.target.handle_frames(header, buffers)
        reply = decode_message(rh, rb)
        if isinstance(reply, ErrorReply):
            raise RemoteError(self.id, reply.kind, reply.message)
        return reply.value if isinstance(reply, Reply) else None

    def __repr__(self) -> str:
        return f"<PeerClient {self.owner.id!r} -> {self.id!r}>"


def _holds_tensor(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, list | tuple):
        return any(_holds_tensor(o) for o in obj)
    if isinstance(obj, dict):
        return any(_holds_tensor(v) for v in obj.values())
    return False


def peer_client(worker: Worker, peer: str) -> PeerClient:
    """``worker``'s client of its in-process peer ``peer`` (one per pair, so that the
    pointers it holds there share one location)."""
    clients = worker.function_state.setdefault(_STATE, {})
    client = clients.get(peer)
    if client is None:
        link = worker.peer_link(peer)
        if not isinstance(link, VirtualWorker):
            raise ChainError(NETWORK_REFUSAL)
        client = clients[peer] = PeerClient(worker, link)
    return client


def _chain_pointer(worker: Worker, obj_id: int) -> Any:
    entry = worker.store.entry(obj_id)
    value = entry.value
    if not (isinstance(value, PointerTensor) and isinstance(value.location, PeerClient)):
        raise ChainError(f"object {obj_id} at {worker.id!r} is not a pointer to another worker")
    return value


# -- the chain functions, run at the worker holding the first hop ----------------------


def chain_send(worker: Worker, obj_id: int, peer: str, new_id: int) -> Any:
    """Move the tensor ``obj_id`` to ``peer`` (stored there as ``new_id``); returns this
    worker's pointer to it (stored here under the call's output id)."""
    value = worker.store.entry(obj_id).value
    if isinstance(value, PointerTensor):
        raise ChainError(
            f"object {obj_id} at {worker.id!r} is already a pointer to {value.location.id!r}: "
            "chains of more than two workers are not supported; get() one hop first"
        )
    if not isinstance(value, torch.Tensor):
        raise ChainError(f"object {obj_id} at {worker.id!r} is not a tensor")
    client = peer_client(worker, peer)
    shape, dtype = tuple(value.shape), value.dtype
    worker.send_to_peer(SendToPeer(obj_id, peer, new_id, True))
    return PointerTensor.from_meta(client, new_id, shape, contiguous_stride(shape), dtype)


def chain_unlink(worker: Worker, obj_id: int, keep: bool) -> torch.Tensor:
    """The id, at the next worker, of the object the pointer ``obj_id`` refers to; the
    pointer is dropped here without deleting that object (``keep``: it stays)."""
    ptr = _chain_pointer(worker, obj_id)
    remote_id = ptr.id_at_location
    if not keep:
        ptr._ref.release()  # the object now belongs to whoever asked
        worker.store.discard(obj_id)
    return torch.tensor([remote_id], dtype=torch.int64)


def chain_remote_get(worker: Worker, obj_id: int) -> None:
    """Bring the object the pointer ``obj_id`` refers to here, in the pointer's place."""
    entry = worker.store.entry(obj_id)
    ptr = _chain_pointer(worker, obj_id)
    value = ptr.get()  # a fetch by this worker, as the pointer's owner
    worker.store.put(obj_id, value, entry.tags, entry.description)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    SEND: chain_send,
    UNLINK: chain_unlink,
    REMOTE_GET: chain_remote_get,
}


def install(worker: Any) -> None:
    """Register the chain functions at an in-process worker (idempotent)."""
    if not isinstance(worker, VirtualWorker):
        raise ChainError(NETWORK_REFUSAL)
    worker.functions.register_all(FUNCTIONS)


# -- a pointer's side: what PointerTensor's send, get, move and remote_get do on a chain


class PointerChains:
    """The chain methods of :class:`~pointers.pointer_tensor.PointerTensor`
    (:class:`~pointers.pointer_tensor.Chains`): a pointer calls them through
    :func:`~pointers.pointer_tensor.use_chains`, since this module sits above it
    (``pointers/__init__`` hands them in)."""

    @staticmethod
    def send(ptr: PointerTensor, destination: Any, *args: Any, **kwargs: Any) -> PointerTensor:
        """``ptr.send(destination)``: start a chain (see :meth:`PointerTensor.send`)."""
        ref = ptr._ref
        ref.check()
        if args or kwargs:
            raise TypeError("send() on a pointer takes one worker")
        if destination is ref.location or getattr(destination, "id", None) == ref.location.id:
            raise PointerError(f"this tensor is already at {ref.location.id!r}")
        if ref.chain is not None:
            raise ChainError(
                f"this pointer is already a chain ({ref.location.id!r} -> {ref.chain.id!r}): "
                "chains of more than two workers are not supported; get() one hop first"
            )
        if ptr.requires_grad:
            raise ChainError(
                "a pointer that requires grad cannot start a chain (remote autograd does not "
                "cross one): detach() it first, or move(worker) it"
            )
        check_chain_workers(ref.location, destination)
        install(ref.location)
        ref.location.introduce(destination)
        far_id = destination.new_id()
        (out,) = call_function(
            ref.location,
            SEND,
            [ref.obj_id, destination.id, far_id],
            out=[(tuple(ptr.shape), ptr.dtype)],
        )
        ref.release()
        assert out is not None
        out._ref.chain = destination
        return out

    @staticmethod
    def get_hop(ptr: PointerTensor, delete: bool) -> PointerTensor:
        """A chain's ``get()``: one hop (see :meth:`PointerTensor._get_hop`)."""
        ref = ptr._ref
        nxt = ref.chain
        assert nxt is not None
        (id_ptr,) = call_function(
            ref.location, UNLINK, [ref.obj_id, not delete], out=[((1,), torch.int64)]
        )
        assert id_ptr is not None
        remote_id = int(id_ptr.get()[0])
        if delete:
            ref.release()
        return PointerTensor.from_meta(
            nxt, remote_id, ptr.shape, contiguous_stride(ptr.shape), ptr.dtype, owned=delete
        )

    @staticmethod
    def remote_get(ptr: PointerTensor) -> PointerTensor:
        """``ptr.remote_get()`` (see :meth:`PointerTensor.remote_get`)."""
        ref = ptr._ref
        ref.check()
        if ref.chain is None:
            raise ChainError(
                f"remote_get() brings an object one hop back along a pointer chain; this "
                f"pointer is to a tensor at {ref.location.id!r} itself (use get())"
            )
        ref.location.request(CallFunction(REMOTE_GET, [ref.obj_id], {}, [None], False))
        ref.chain = None
        return ptr


__all__ = [
    "ChainError",
    "PeerClient",
    "PointerChains",
    "check_chain_workers",
    "install",
    "peer_client",
    "NETWORK_REFUSAL",
]
