"""Running commands on stored objects: the handler table, aten ops and registered functions.

:class:`Execution` is the part of :class:`~pointers.worker.base.Worker` that runs an op
(:class:`~pointers.wire.messages.ExecuteOp`) or a registered function
(:class:`~pointers.wire.messages.CallFunction`, protocol steps among them) on the objects
a command refers to, and stores the outputs under the ids the sender chose. A reference
to sealed protocol material (:mod:`pointers.worker.sealing`) reaches only a protocol
step whose rule admits it. :func:`handles` marks a worker method as the handler of one
message type; a worker class's handler table collects them along its classes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.utils._pytree as pytree

from pointers.errors import ValueRequiresGetError
from pointers.wire import serde
from pointers.wire.messages import CallFunction, ExecuteOp, Message
from pointers.wire.ops import resolve_op
from pointers.wire.serde import Ref
from pointers.worker import holding
from pointers.worker.functions import FunctionRegistry
from pointers.worker.sealing import Arg, Label, ProtocolCall, refused, sealing_of, spend
from pointers.worker.store import Entry, ObjectStore

F = TypeVar("F", bound=Callable[..., Any])
Handler = Callable[[Any, Any], Any]  # (worker, message) -> reply value


def handles(kind: type[Message]) -> Callable[[F], F]:
    """Mark a worker method as the handler of the commands of type ``kind``.

    A worker class's :attr:`Worker.handlers` maps each message type to the method marked
    for it, the most derived class's winning: a subclass extends or replaces handlers by
    marking methods of its own (or by overriding a handler method under the same name)."""

    def mark(fn: F) -> F:
        setattr(fn, "_handles", kind)  # noqa: B010 - an attribute of a function
        return fn

    return mark


def handler_table(cls: type) -> dict[type[Message], Handler]:
    """The handlers of ``cls`` by message type (see :func:`handles`)."""
    names: dict[type[Message], str] = {}
    for klass in reversed(cls.__mro__):
        for name, attr in vars(klass).items():
            kind = getattr(attr, "_handles", None)
            if kind is not None:
                names[kind] = name
    return {kind: getattr(cls, name) for kind, name in names.items()}


def tensor_meta(t: torch.Tensor) -> list[Any]:
    return [list(t.shape), list(t.stride()), serde.dtype_name(t.dtype)]


def _owns_storage(t: torch.Tensor) -> bool:
    """Whether ``t`` is all of its storage (not a view into a larger buffer)."""
    return t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _seal_of(seals: Any, k: int) -> Any:
    """The seal of output ``k`` of a step (see :meth:`Execution._store_outputs`)."""
    if seals is None or seals is False:
        return False
    if isinstance(seals, list) and seals and type(seals[0]) is str:
        return seals  # one label for every output
    if isinstance(seals, list | tuple):
        s = seals[k] if k < len(seals) else None
        return s if s else False
    raise TypeError(f"a protocol rule returned {type(seals).__name__} as its seals")


def _admitted(e: Entry, obj_id: int) -> bool:
    """Whether a sealed entry reads as ordinary to the command this thread runs (an
    approved run's own objects and parameters, :mod:`pointers.worker.holding`)."""
    run = holding.current()
    return run is not None and run.admits(e.sealed, obj_id)


def _as_run_sees(e: Entry, obj_id: int) -> Entry:
    """A protocol step's view of an entry: an approved run's own objects as ordinary."""
    if e.sealed:
        return Entry(e.value) if _admitted(e, obj_id) else e
    run = holding.current()
    if run is not None:
        run.check_read(obj_id)
    return e


def _labels(named: dict[str, Arg]) -> list[Label]:
    out = []
    for a in named.values():
        for e in a.entries or ([a.entry] if a.entry is not None else []):
            if e is not None and e.sealed:
                label = Label.of(e.sealed)
                if label is not None:
                    out.append(label)
    return out


class Execution:
    """The op and function handlers of a worker, with what they share: resolving the
    references in a command's arguments (counting the sealed ones) and storing outputs.

    A mixin of :class:`~pointers.worker.base.Worker`, which provides the attributes below;
    a worker with limits overrides :meth:`check_op` and :meth:`check_function`."""

    id: str
    store: ObjectStore
    functions: FunctionRegistry
    function_state: dict[str, Any]

    @handles(ExecuteOp)  # the hot path
    def _execute_op(self, msg: ExecuteOp) -> Any:
        op = resolve_op(msg.op)
        args = msg.args
        entry = self.store.entry
        run = holding.current()
        sealed = False
        for k, a in enumerate(args):  # one pass; nested lists take the general path
            t = type(a)
            if t is Ref:
                e = entry(a.obj_id)
                args[k] = e.value
                if e.sealed:
                    if not _admitted(e, a.obj_id):
                        sealed = True
                elif run is not None:
                    run.check_read(a.obj_id)
            elif t is list or t is tuple or t is dict:
                marks = [0, 0, 0]
                args = self._resolve_marked(args, marks)
                sealed = sealed or marks[0] > 0
                break
        if msg.kwargs:
            marks = [0, 0, 0]
            kwargs = self._resolve_marked(msg.kwargs, marks)
            sealed = sealed or marks[0] > 0
        else:
            kwargs = {}
        if sealed:  # protocol material: only protocol steps take it (a registered rule)
            raise refused(f"running {msg.op} on it")
        self.check_op(msg, op, args, kwargs)
        return self._store_outputs(op(*args, **kwargs), msg.out_ids, msg.want_meta)

    def check_op(self, msg: ExecuteOp, op: Any, args: list[Any], kwargs: dict[str, Any]) -> None:
        """Called before an op runs, with its resolved arguments: a worker with limits
        refuses here what would take it past them (a served worker's namespace)."""

    def check_function(
        self, name: str, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
    ) -> None:
        """Called before a registered function runs, with its resolved arguments: a worker
        with limits refuses here a call whose declared size
        (:func:`pointers.worker.functions.sized`) would take it past them, and charges
        what the call keeps (a served worker's namespace)."""

    @handles(CallFunction)
    def _call_function(self, msg: CallFunction) -> Any:
        fn = self.functions.get(msg.name)
        rule = sealing_of(fn).rule
        params = self.functions.parameters(msg.name)
        if rule is None:  # an ordinary function: no sealed input, no sealed output
            marks = [0, 0, 0]
            args = self._resolve_marked(msg.args, marks)
            kwargs = self._resolve_marked(msg.kwargs, marks)
            if marks[0]:
                raise refused(f"passing it to {msg.name}, which is not a protocol step")
            self.check_function(msg.name, fn, args, kwargs)
            return self._store_outputs(fn(self, *args, **kwargs), msg.out_ids, msg.want_meta)
        named: dict[str, Arg] = {}
        args = []
        for k, raw in enumerate(msg.args):
            a = self._protocol_arg(raw)
            args.append(a.value)
            if k < len(params):
                named[params[k]] = a
        kwargs = {}
        for key, raw in msg.kwargs.items():
            a = self._protocol_arg(raw)
            kwargs[key] = a.value
            named[key] = a
        self.check_function(msg.name, fn, args, kwargs)  # (before the rule: it has effects)
        call = ProtocolCall(msg.name, self.id, self.function_state, named)
        call.policy = getattr(self, "holding_policy", None)
        call.data_policy = getattr(self, "data_policy", None)
        if holding.any_bound(self.function_state):  # (an approved run is, or was, here)
            holding.check_instances(self.function_state, _labels(named))
        seals = rule(call)
        result = fn(self, *args, **kwargs)
        spend(call.spend)
        if seals is None and type(result) is torch.Tensor and not _owns_storage(result):
            result = result.clone()  # a final share keeps no view of material (e.g. [e | f])
        return self._store_outputs(result, msg.out_ids, msg.want_meta, seals)

    def _protocol_arg(self, raw: Any) -> Arg:
        """An argument of a protocol step with the store entries it refers to."""
        if type(raw) is Ref:
            e = _as_run_sees(self.store.entry(raw.obj_id), raw.obj_id)
            return Arg(e.value, entry=e)
        if type(raw) is list and raw and all(type(r) is Ref for r in raw):
            entries = [_as_run_sees(self.store.entry(r.obj_id), r.obj_id) for r in raw]
            return Arg([e.value for e in entries], entries=entries)
        marks = [0, 0, 0]
        value = self._resolve_marked(raw, marks)
        if marks[0]:
            raise refused("passing it to a protocol step inside a structure")
        return Arg(value)

    def _resolve_marked(self, obj: Any, marks: list[int]) -> Any:
        """:meth:`_resolve`, counting in ``marks`` the sealed and unsealed references
        and the other values (not None) it meets."""
        t = type(obj)
        if t is Ref:
            e = self.store.entry(obj.obj_id)
            if e.sealed:
                marks[1 if _admitted(e, obj.obj_id) else 0] += 1
            else:
                run = holding.current()
                if run is not None:
                    run.check_read(obj.obj_id)
                marks[1] += 1
            return e.value
        if t is list:
            return [self._resolve_marked(o, marks) for o in obj]
        if t is tuple:
            return tuple(self._resolve_marked(o, marks) for o in obj)
        if t is dict:
            return {k: self._resolve_marked(v, marks) for k, v in obj.items()}
        if obj is not None:
            marks[2] += 1
        return obj

    def _resolve(self, obj: Any) -> Any:
        if isinstance(obj, Ref):
            return self.store.get(obj.obj_id)
        if isinstance(obj, list):
            return [self._resolve(o) for o in obj]
        if isinstance(obj, tuple):
            return tuple(self._resolve(o) for o in obj)
        if isinstance(obj, dict):
            return {k: self._resolve(v) for k, v in obj.items()}
        return obj

    def _store_outputs(
        self, result: Any, out_ids: list[int | None], want_meta: bool, seals: Any = None
    ) -> Any:
        """Store an op's or a function's outputs. ``seals``: a protocol step's output
        labels (see :mod:`pointers.worker.sealing`), one per output (None: an ordinary
        object), or one label for every output."""
        put = self.store.put
        run = holding.current()
        if run is not None:  # an approved run: the ordinary objects it makes are held
            held, given = run.seal(), seals
            seals = [_seal_of(given, k) or held for k in range(max(len(out_ids), 1))]
            if want_meta:  # (outputs counted from the result)
                n = len(pytree.tree_leaves(result))
                seals = [_seal_of(given, k) or held for k in range(max(n, 1))]
        if type(result) is torch.Tensor and not want_meta and len(out_ids) == 1:
            if out_ids[0] is not None:
                put(out_ids[0], result, None, "", _seal_of(seals, 0))
            return None
        leaves, spec = pytree.tree_flatten(result)
        if want_meta:
            # Ids were not known to the sender: outputs go to out_ids[0] + k.
            base = out_ids[0] if out_ids else None
            metas: list[Any] = []
            for k, leaf in enumerate(leaves):
                if leaf is None:
                    metas.append(None)
                elif isinstance(leaf, torch.Tensor):
                    if base is None:
                        raise ValueError("want_meta needs a base output id")
                    put(base + k, leaf, None, "", _seal_of(seals, k))
                    metas.append(tensor_meta(leaf))
                else:
                    raise ValueRequiresGetError(
                        f"the op returned a Python {type(leaf).__name__}, not a tensor"
                    )
            return [isinstance(result, tuple | list), metas]
        if len(leaves) != len(out_ids):
            raise ValueError(
                f"the op returned {len(leaves)} outputs but {len(out_ids)} ids were sent"
            )
        for k, (leaf, obj_id) in enumerate(zip(leaves, out_ids)):
            if obj_id is not None:
                if not isinstance(leaf, torch.Tensor):
                    raise TypeError(f"output for id {obj_id} is a {type(leaf).__name__}")
                put(obj_id, leaf, None, "", _seal_of(seals, k))
        return None


__all__ = ["Execution", "Handler", "handler_table", "handles", "tensor_meta"]
