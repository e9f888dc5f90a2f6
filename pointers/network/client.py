"""The client side of a network worker: :func:`connect` returns a :class:`NetworkWorker`.

A :class:`NetworkWorker` speaks the same client interface as a
:class:`~pointers.worker.base.VirtualWorker` (``id``, ``new_id``, ``request``, ``post``,
``queue_delete``, ``introduce``, ``objects``, ``search``, ``stats``), so pointers, plans
and the ``mpc`` protocols run on it unchanged.

Pipelining: :meth:`NetworkWorker.post` encodes the message at once (so later writes to a
sent tensor do not leak into it, and encoding errors raise at the call) and queues it; one
background sender thread per connection sends the queue in order, many messages per call.
Errors of posted messages are kept and raised, as the worker's own message, by the next
synchronising call (:meth:`request`, ``get``); a request whose batch failed earlier is not
run at all, so a ``get`` never loses a value to an earlier error. A failed call raises the
root cause: the earliest error held for a message posted before it to any worker of the
same :class:`~pointers.network.context.ClientContext`.

Restarts: each worker process has an *incarnation* (a random epoch it reports in every
reply). The client watches its channel: once the connection dropped (or a call failed in
transport), the next read of :attr:`NetworkWorker.incarnation` asks the worker again with
a hello, so ``mpc`` notices a restart that happened while the client was idle before it
sends new work (and then introduces the peers again and deals new seeds). Objects made
before a restart died with the old process: a command that names one fails with
:class:`WorkerRestartedError`, which says so.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pointers.errors import DecodeError, LimitExceeded, PointerError, RemoteError
from pointers.network.calls import SYNC_ITEM, Future, Item
from pointers.network.certs import Credentials, check_identity, load_credentials
from pointers.network.connection import Connection
from pointers.network.context import DEFAULT_CONTEXT, ClientContext
from pointers.network.framing import buffer_bytes
from pointers.network.lease import SESSION_METADATA, renew_leases, session_of
from pointers.network.replies import (
    MAX_REPLY_HEADER,
    WorkerRestartedError,
    reply_check,
    search_reply,
)
from pointers.network.transport import (
    DEFAULT_MAX_MESSAGE,
    IDENTITY_METADATA,
    ChannelWatch,
    open_channel,
)
from pointers.pointer_tensor import search_worker
from pointers.wire.messages import (
    AcceptPeer,
    ConnectPeer,
    Delete,
    ErrorReply,
    Fetch,
    Message,
    Reply,
    SendToPeer,
    decode_message,
    encode_message,
)
from pointers.worker.base import Frames
from pointers.worker.client import Recorder, WorkerStats, sends

_HELLO_TIMEOUT = 10.0
# a hello after the connection dropped waits this long for it to come back (a restarted
# worker is back within the 1 s reconnect backoff; a hung one must not stall the caller)
_REHELLO_TIMEOUT = 3.0
_DELETE_BATCH = 64  # while recording, deletes become a command every so many (as in process)
_NO_OBJECT = re.compile(r"holds no object with id (\d+)")


class NetworkWorker:
    """A worker in another process, reached over gRPC (see :func:`connect`)."""

    def __init__(
        self,
        id: str,
        address: str,
        connection: Connection,
        identity: str,
        peer_address: str | None = None,
    ) -> None:
        self.id = id
        self.address = address
        self.identity = identity
        self.peer_address = peer_address or address
        self._conn = connection
        start = int.from_bytes(os.urandom(4), "little") << 20
        self._ids = itertools.count(start)
        # ids in [_first_id, _restarted_below) were made before the last restart noticed
        self._first_id = start
        self._restarted_below = start
        self.restarts = 0  # restarts of the worker this client noticed
        self._epoch_seen = connection.epoch
        self._failures_seen = connection.failures
        self._doubts = 0  # hellos that found no answer: the epoch is unconfirmed
        self._epoch_lock = threading.Lock()
        self._watch = ChannelWatch()
        try:
            connection.channel.subscribe(self._watch, try_to_connect=False)
        except Exception:  # noqa: S110 - a channel without a watch: transport failures still count
            pass
        _WORKERS.add(self)
        self._introduced: dict[str, tuple[NetworkWorker, Any]] = {}
        self._held_deletes: list[int] | None = None  # while a program is recorded
        self.recorder: Recorder | None = None  # a program recording this client, if any
        self._finalizer = weakref.finalize(self, connection.close)
        # programs one session may queue there (serve --max-queued-programs; its hello)
        self.max_queued_programs: int | None = None

    # -- the client interface of a worker ------------------------------------------------
    def new_id(self) -> int:
        epoch = self._conn.epoch
        if epoch is not self._epoch_seen:  # (a new reply: usually the same epoch)
            if epoch == self._epoch_seen:
                self._epoch_seen = epoch
            else:
                self._note_incarnation()
        i = next(self._ids)
        if self.recorder is not None:
            self.recorder.record_new_id(self.id, i)
        return i

    def set_recorder(self, recorder: Recorder | None) -> None:
        """While set, ``recorder`` sees every command and every new id of this client, and
        the deletes of dropped pointers are held for :meth:`flush_deletes` instead of
        travelling with the next batch, so that the program captures them."""
        self.recorder = recorder
        if recorder is not None:
            if self._held_deletes is None:
                self._held_deletes = []
            return
        held, self._held_deletes = self._held_deletes, None
        if held:
            self._conn.deletes.extend(held)

    def post(self, msg: Message) -> None:
        """Queue ``msg``; its errors surface at the next synchronising call."""
        self._exchange(msg, False)

    def request(self, msg: Message) -> Any:
        """Send ``msg`` and wait for its reply value (raises the worker's error, or the
        root cause: the earliest error of a message posted before it)."""
        return self._exchange(msg, True)()

    def _exchange(self, msg: Message, wait: bool = True) -> Any:
        """Every command passes here (so that :class:`pointers.worker.program.Recording` can
        capture it): queued when no reply is awaited (``wait=False``), else sent and its
        a :class:`PendingReply` returned."""
        if self.recorder is not None:
            self.recorder.record_command(self.id, msg)
            if not sends(self.recorder, msg, wait):
                return None
        held = self._held_deletes
        if held is not None and (wait or len(held) >= _DELETE_BATCH):
            self.flush_deletes()  # recording: deletes are commands of the program
        if not wait:
            frame = self._frame(msg)
            if type(msg) is SendToPeer:
                dest = self._introduced.get(msg.peer)
                if dest is not None:  # the destination waits for this id instead of failing
                    dest[0]._conn.expects.append((self.id, msg.new_id))
            self._conn.submit(Item(frame, None))
            return None
        item = Item(self._frame(msg), Future())
        # a fetch that keeps the object only reads: it may leave while the commands before
        # it are in flight (its value is dropped if one of them failed)
        item.reads = type(msg) is Fetch and not msg.delete
        self._conn.submit(item)
        return PendingReply(self, item, reply_check(msg))

    def request_async(self, msg: Message) -> PendingReply:
        """Send ``msg`` now and return a :class:`PendingReply`: calling it waits for the
        reply value (as :meth:`request`), so requests to several workers travel side by
        side."""
        pending: PendingReply = self._exchange(msg, True)
        return pending

    def _answer_of(self, item: Item, check: Any = None) -> Any:
        """The reply value of a submitted request (waits for it); ``check(value)`` names
        what is wrong with a malformed value (None: nothing)."""
        try:
            rh, rb = self._wait_answer(item)
            if not rb and rh == _OK_NONE:
                if check is not None and (why := check(None)) is not None:
                    raise self._conn.malformed(why)
                return None
            if len(rh) > MAX_REPLY_HEADER and check is not search_reply:
                raise self._conn.malformed(
                    f"a reply header of {len(rh)} bytes (a client takes at most "
                    f"{MAX_REPLY_HEADER} bytes but for a search's)"
                )
            try:
                reply = decode_message(rh, rb)
            except DecodeError as e:
                raise self._conn.malformed(e) from None
            if isinstance(reply, ErrorReply):
                raise self._conn.remote_error(reply.kind, reply.message)
            if not isinstance(reply, Reply):
                raise self._conn.malformed(f"a {reply.KIND!r} message answers a request")
            if check is not None and (why := check(reply.value)) is not None:
                raise self._conn.malformed(why)
        except BaseException as e:
            root = _explain(self._failed(e, item))
            if root is e:
                raise
            raise root from None
        return reply.value

    def handle_frames(self, header: bytes, buffers: list[Any]) -> Frames:
        """Send one encoded message as it is and return the encoded reply (a link)."""
        frame = (bytes(header), [bytes(buffer_bytes(b)) for b in buffers])
        try:
            return self._roundtrip(Item(frame, Future()))
        except RemoteError as e:
            return encode_message(ErrorReply(e.kind, e.remote_message))
        except PointerError as e:
            return encode_message(ErrorReply(type(e).__name__, str(e)))

    def queue_delete(self, obj_id: int) -> None:
        """Called when a pointer dies: no I/O and no lock; travels with a later call."""
        held = self._held_deletes
        (self._conn.deletes if held is None else held).append(obj_id)

    def flush_deletes(self) -> None:
        """Send the deletes of dropped pointers now, as one ``Delete`` command."""
        pending = self._conn.deletes if self._held_deletes is None else self._held_deletes
        n = len(pending)
        if n:
            ids = pending[:n]
            del pending[:n]
            self._exchange(Delete(ids), False)

    def wait_programs(self, timeout: float | None = None) -> None:
        """Wait until the programs this client started at the worker (``mpc.plan``) ended,
        at most ``timeout`` seconds (default: a little less than the call timeout)."""
        limit = max(self._conn.timeout - 5.0, 1.0)
        wait = limit if timeout is None else min(max(float(timeout), 0.0), limit)
        self._inspect("programs", flush=True, info={"timeout": wait})

    def introduce(self, peer: Any) -> None:
        """Let this worker deliver objects to ``peer`` directly (party to party)."""
        if not isinstance(peer, NetworkWorker):
            raise TypeError(
                f"network worker {self.id!r} can only deliver to another network worker, "
                f"not a {type(peer).__name__}"
            )
        if peer is self or peer.id == self.id:
            return
        known = self._introduced.get(peer.id)
        if known is not None and known[0] is peer and known[1] == self._link_state(peer):
            return
        peer.request(AcceptPeer(self.id))
        self.post(ConnectPeer(peer.id, peer.peer_address))
        self._introduced[peer.id] = (peer, self._link_state(peer))

    def _link_state(self, peer: NetworkWorker) -> tuple[Any, ...]:
        """Changes when either worker restarted (or may have): introduce again then. The
        incarnations are asked for when a connection dropped since (a restart while the
        client was idle leaves no failed call behind)."""
        a, b = self._conn, peer._conn
        return (
            (self.incarnation, a.failures, self._doubts),
            (peer.incarnation, b.failures, peer._doubts),
        )

    # PySyft 0.2's name for the object store (pointers.compat)
    _objects = property(lambda self: self.objects)
    is_client_worker = False

    @property
    def objects(self) -> Mapping[int, Any]:
        """A read-only view of this client's objects at the worker (fetched on use)."""
        return _RemoteObjects(self)

    def search(self, *query: str) -> list[Any]:
        """Pointers to this client's stored tensors carrying every tag in ``query``."""
        return search_worker(self, query)

    @property
    def stats(self) -> WorkerStats:
        """The worker's counters for this client (fetched after the queued messages ran)."""
        info = self._inspect("stats", flush=False)
        raw = info.get("stats")
        if not isinstance(raw, dict) or not all(
            isinstance(k, str) and type(v) is int and 0 <= v < 1 << 63 for k, v in raw.items()
        ):
            raise self._conn.malformed("its counters are not a map of names to counts")
        fields = WorkerStats.__dataclass_fields__
        return WorkerStats(**{k: v for k, v in raw.items() if k in fields})

    # -- extras --------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every object this client stored at the worker and zero its counters."""
        self._conn.deferred = None
        self._inspect("reset", flush=True)

    def clear_objects(self) -> None:
        self.reset()

    @property
    def incarnation(self) -> str | None:
        """Which run of the worker process this client talks to (its epoch): it changes
        when the worker restarts with an empty store. Known from the last reply, unless
        the connection dropped or a call failed in transport since: then a hello asks the
        worker (one round trip; if the worker cannot be reached, the last epoch heard)."""
        conn = self._conn
        if self._watch.dropped or conn.failures != self._failures_seen:
            self._watch.dropped = False
            failures = conn.failures
            try:
                self._hello()
            except PointerError:
                self._watch.dropped = True  # ask again next time
                self._doubts += 1  # (introductions are renewed meanwhile: see _link_state)
            else:
                self._failures_seen = failures
        self._note_incarnation()
        return conn.epoch

    def _hello(self) -> None:
        """Ask the worker for its epoch, waiting (bounded) for the channel to reconnect:
        right after a restart it may still be backing off from a failed attempt."""
        conn = self._conn
        # (notes the epoch; raises a reported error)
        conn.inspect_direct(
            {"what": "hello"}, timeout=min(conn.timeout, _REHELLO_TIMEOUT), wait_for_ready=True
        )

    def _note_incarnation(self) -> None:
        """Mark the ids made so far as dead if the worker's epoch changed (a restart)."""
        with self._epoch_lock:
            epoch = self._conn.epoch
            if epoch is self._epoch_seen or epoch == self._epoch_seen:
                self._epoch_seen = epoch
                return
            if self._epoch_seen is not None:
                self._restarted_below = next(self._ids)
                self.restarts += 1
            self._epoch_seen = epoch

    def _restarted_since(self, obj_id: int) -> bool:
        """Whether object ``obj_id`` of this client was made before a noticed restart."""
        self._note_incarnation()
        return self._first_id <= obj_id < self._restarted_below

    def expect_delivery(self, peer: str, obj_id: int) -> None:
        """Announce that worker ``peer`` will deliver ``obj_id`` here, outside any command
        of this client's (a program's step dealt ahead, see ``mpc``'s plans): the id
        travels with the next call, and a delivery that comes first is held until then."""
        self._conn.expects.append((peer, obj_id))

    def sync(self, wait_programs: float | None = None) -> None:
        """Wait until every queued message ran; raise the first error among them. The
        sync rides in the call that carries the last commands (or a call of its own),
        pipelined like them: it costs no round trip after them. ``wait_programs=T``: first
        wait (up to T seconds, at most a little less than the call timeout) for the
        programs this client started there (``mpc.plan`` calls), as :meth:`wait_programs`
        does, in the same call."""
        info = None
        if wait_programs is not None:
            limit = max(self._conn.timeout - 5.0, 1.0)
            info = {"programs": min(max(float(wait_programs), 0.0), limit)}
        self._inspect(SYNC_ITEM, flush=True, info=info)
        held = self._conn.take_deferred()
        if held is not None:
            context = self._conn.context
            root = context.root_cause(*held)
            context.consumed(context.tick())
            raise _explain(root)

    def close(self) -> None:
        """Send what is queued, then close the connection (also when garbage collected)."""
        self._finalizer()

    def __enter__(self) -> NetworkWorker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<NetworkWorker id={self.id!r} address={self.address!r} as {self.identity!r}>"

    # -- internals -----------------------------------------------------------------------
    def _frame(self, msg: Message) -> tuple[bytes, list[bytes]]:
        header, buffers = encode_message(msg)
        # copy the buffers now: the caller may write to a sent tensor right after
        frame = (header, [bytes(buffer_bytes(b)) for b in buffers])
        size = len(header) + sum(len(b) for b in frame[1])
        if size > self._conn.max_message_bytes - 4096:
            raise LimitExceeded(
                f"a {msg.KIND!r} message of {size} bytes exceeds the maximum message size of "
                f"{self._conn.max_message_bytes} bytes for worker {self.id!r}; split the tensor "
                "or raise max_message_bytes (and the worker's --max-message-mb)"
            )
        return frame

    def _roundtrip(self, item: Item) -> tuple[Any, list[Any]]:
        self._conn.submit(item)
        return self._wait_answer(item)

    def _wait_answer(self, item: Item) -> tuple[Any, list[Any]]:
        """The encoded answer to a submitted request (waits for it)."""
        assert item.future is not None
        reply = item.future.wait(self._conn)
        if reply is None:  # (the connection fails a request left unanswered: never here)
            raise self._conn.malformed("no answer to a request")
        return reply

    def _inspect(
        self, what: str, flush: bool, info: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        item = Item(None, Future(), what=what, flush=flush, info=info)
        self._conn.submit(item)
        try:
            assert item.future is not None
            return item.future.wait(self._conn)
        except BaseException as e:
            root = self._failed(e, item)
            if root is e:
                raise
            raise root from None

    def _failed(self, error: BaseException, item: Item) -> BaseException:
        """What to raise for the failed call ``item``: the root cause, the earliest error
        of a message posted before, to any worker of the context, if there is one
        (see :class:`~pointers.network.context.ClientContext`); then every error of a
        message posted before the call counts as reported."""
        context = self._conn.context
        root = error
        if isinstance(error, PointerError) and item.seq:
            origin = item.future.origin if item.future is not None else None
            root = context.root_cause(error, origin or item.seq)
        context.consumed(item.seq)
        return root


_OK_NONE, _ = encode_message(Reply(None))


class PendingReply:
    """The reply to a request sent with :meth:`NetworkWorker.request_async`: call it to
    wait for the value (raising as :meth:`NetworkWorker.request` would). ``origin``: the
    number of the message its error comes from, once answered (its own, or that of an
    earlier post that failed), so that of several failed requests the earliest cause can
    be raised."""

    __slots__ = ("_worker", "_item", "_check")

    def __init__(self, worker: NetworkWorker, item: Item, check: Any = None) -> None:
        self._worker, self._item, self._check = worker, item, check

    def __call__(self) -> Any:
        return self._worker._answer_of(self._item, self._check)

    @property
    def origin(self) -> int:
        future = self._item.future
        origin = future.origin if future is not None else None
        return self._item.seq if origin is None else origin


_WORKERS: weakref.WeakSet[NetworkWorker] = weakref.WeakSet()


def _explain(error: BaseException) -> BaseException:
    """``error``, or a :class:`WorkerRestartedError` if it reports a missing object that
    died with an earlier process of its worker (a restart this client noticed)."""
    if not isinstance(error, RemoteError) or isinstance(error, WorkerRestartedError):
        return error
    if error.kind != "UnknownObjectError":
        return error
    m = _NO_OBJECT.search(error.remote_message)
    if m is None:
        return error
    obj_id = int(m.group(1))
    for w in list(_WORKERS):
        if w.id == error.worker and w._restarted_since(obj_id):
            return WorkerRestartedError(error.worker, obj_id, error.remote_message)
    return error


class _RemoteObjects(Mapping[int, Any]):
    """``worker.objects`` of a network worker: ids and values fetched when used."""

    def __init__(self, worker: NetworkWorker) -> None:
        self._worker = worker

    def _ids(self) -> list[int]:
        ids = self._worker._inspect("ids", flush=True).get("ids")
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise self._worker._conn.malformed("its object ids are not a list of integers")
        return ids

    def __getitem__(self, key: int) -> Any:
        if not isinstance(key, int):
            raise KeyError(key)
        try:
            return self._worker.request(Fetch(key, False))
        except RemoteError as e:
            if e.kind == "UnknownObjectError":
                raise KeyError(key) from None
            raise

    def __contains__(self, key: object) -> bool:
        return key in set(self._ids())

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids())

    def __len__(self) -> int:
        return len(self._ids())

    def __repr__(self) -> str:
        ids = self._ids()
        return f"RemoteObjects({len(ids)} objects at {self._worker.id!r}: {ids[:10]})"


def connect(
    id: str,
    address: str,
    *,
    certs: str | os.PathLike[str] | None = None,
    identity: str = "client",
    insecure: bool = False,
    timeout: float = 120.0,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE,
    peer_address: str | None = None,
    deadline: float | None = None,
    context: ClientContext | None = None,
) -> NetworkWorker:
    """Connect to worker ``id`` served at ``address`` (``host:port``) as ``identity``.

    ``certs`` is the directory ``python -m pointers certs`` wrote (``ca.pem``,
    ``<identity>.pem``, ``<identity>.key``); the worker must present the certificate of
    ``id`` signed by the same CA. ``insecure=True`` connects without TLS (loopback only,
    matching ``serve --insecure``). ``timeout`` bounds each call; ``peer_address`` is the
    address the other workers use to reach this one, when it differs from ``address``.
    ``deadline`` (seconds) overrides the worker's ``--deadline`` for this client: how long
    the worker waits for an object a peer delivers before it reports the peer unavailable.
    ``context`` orders the errors of this connection with those of the others in the same
    context (:data:`~pointers.network.context.DEFAULT_CONTEXT` unless given): a failed call
    raises the earliest error among them, the root cause.
    """
    if deadline is not None and not 0 < deadline <= 3600:
        raise ValueError(f"deadline must lie in (0, 3600] seconds, got {deadline}")
    check_identity(id)
    check_identity(identity)
    if insecure == (certs is not None):
        raise ValueError("pass certs=DIR for mutual TLS, or insecure=True (loopback), not both")
    creds: Credentials | None = None
    if certs is not None:
        creds = load_credentials(Path(certs), identity)
    channel = open_channel(
        address, worker_id=id, credentials=creds, max_message_bytes=max_message_bytes
    )
    context = DEFAULT_CONTEXT if context is None else context
    # the session names this client's namespace at every worker (pointers.network.lease)
    metadata = (((IDENTITY_METADATA, identity),) if insecure else ()) + (
        (SESSION_METADATA, session_of(context)),
    )
    conn = Connection(
        id,
        address,
        channel,
        metadata,
        timeout,
        max_message_bytes,
        deadline,
        context=context,
    )
    try:
        hello = conn.inspect_direct({"what": "hello"}, min(timeout, _HELLO_TIMEOUT))
    except BaseException:
        conn.close()
        raise
    served = hello.get("worker")
    if served != id:
        conn.close()
        raise PointerError(f"{address} serves worker {served!r}, not {id!r}")
    renew_leases(conn, hello)  # the worker frees a session's objects a lease after its calls
    worker = NetworkWorker(id, address, conn, identity, peer_address)
    queued = hello.get("max_queued_programs")
    if type(queued) is int and 0 < queued < 1 << 31:
        worker.max_queued_programs = queued
    return worker
