"""A model its owner offers from its own worker, on the client's side: the placeholders
that stand for the owner's values, and ``mpc.share`` of such a model.

The owner registers each parameter's value and scale at its worker (``mpc.offer`` in
process, ``python -m pointers serve --offer FILE`` on a served worker). The client holds
the model's architecture only: ``mpc.offered(model, owner)`` replaces every parameter and
secret buffer of its copy by an :class:`Offered` placeholder (the owner, the name, the
shape), and ``mpc.share(model_ptr, ...)`` has the owner's worker split each *registered*
value (``mpc.held_share``: by name, never a tensor the client names) and move the shares
to the parties, sealed as the owner's held shares (:mod:`pointers.worker.holding`). On the
client the parameters become :class:`HeldShared`: no op runs on one and none opens.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mpc.errors import MPCError
from mpc.session import Session
from mpc.shared import SharedTensor
from pointers.pointer_tensor import PointerTensor
from pointers.pointer_tensor import call_function as pt_call_function

HELD_SHARE_FUNCTION = "mpc.held_share"


class HeldError(MPCError):
    """Using an owner's held weights outside a computation it approved."""


class Offered(torch.Tensor):
    """Stands for a value its owner registered at its worker (a meta tensor with the
    owner and the parameter's name): what the client's copy of an offered model holds
    until ``mpc.share`` turns it into the parties' held shares."""

    owner: Any
    param_name: str

    @staticmethod
    def __new__(cls, shape: Any, dtype: torch.dtype, owner: Any, name: str) -> Offered:
        t = torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=dtype, device=torch.device("meta")
        )
        t.owner, t.param_name = owner, name
        return t  # type: ignore[no-any-return]

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return f"Offered({self.param_name!r}, shape={tuple(self.shape)}, owner={self.owner.id!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        names = [a.param_name for a in args if isinstance(a, Offered)]
        raise HeldError(
            f"{func} on {names or 'an offered parameter'}: it is its owner's value, at the "
            "owner's worker: share the model (mpc.share(model_ptr, parties..., "
            "crypto_provider=...)) and run the plan its owner approved"
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> Offered:
        return Offered(self.shape, self.dtype, self.owner, self.param_name)


class HeldShared(SharedTensor):
    """A parameter its owner shared from its worker: usable only inside an approved plan
    (``mpc.plan(model, x)``), never opened."""

    owner: str
    param_name: str

    def get(self) -> torch.Tensor:  # type: ignore[override]
        raise HeldError(
            f"parameter {self.param_name!r} is {self.owner!r}'s, shared from its worker: it never "
            "opens; run the model as the plan its owner approved (mpc.plan(model, x)) and "
            "open that plan's output"
        )

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return (
            f"HeldShared({self.param_name!r}, shape={tuple(self.shape)}, owner={self.owner!r}, "
            f"parties={[p.id for p in self.session.parties]})"
        )

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        names = [a.param_name for a in args if isinstance(a, HeldShared)]
        raise HeldError(
            f"{func} on {names or 'a held parameter'}: a model its owner shared from its "
            "worker runs only as the plan the owner approved: record it with "
            "mpc.plan(model, x) and call the plan (the workers refuse anything else)"
        )


def held_tensor(
    shares: list[PointerTensor], session: Session, frac_bits: int, dtype: Any, owner: str, name: str
) -> HeldShared:
    s0 = shares[0]
    t = torch.Tensor._make_wrapper_subclass(
        HeldShared, s0.shape, strides=s0.stride(), dtype=dtype, device=torch.device("cpu")
    )
    t.shares, t.session, t.frac_bits, t.pending = shares, session, frac_bits, 0
    t.views_of_pending, t.keep_alive, t.fixed, t.weight_epoch = False, None, None, 0
    t.owner, t.param_name = owner, name
    return t  # type: ignore[no-any-return]


# -- which tensors of a model are the owner's ------------------------------------------------


def buffer_is_secret(module: nn.Module, name: str, buffer: torch.Tensor) -> bool:
    """The default rule for a buffer (``module._buffers[name]``) of a shared model: secret
    if it is floating point and saved with the model (in its ``state_dict``); public if it
    is an integer or bool tensor (an index or a mask: structure) or a non-persistent
    buffer (computed from the config when the model is built, e.g. rotary ``inv_freq``)."""
    if not buffer.is_floating_point():
        return False
    return name not in module._non_persistent_buffers_set


def secret_slots(model: nn.Module) -> list[tuple[nn.Module, str, bool, str]]:
    """(module, attribute, is_parameter, qualified name) of every parameter and secret
    buffer, each tensor once (tied weights under their first name), in a fixed order."""
    out: list[tuple[nn.Module, str, bool, str]] = []
    for prefix, m in model.named_modules(remove_duplicate=False):
        for attr, p in m._parameters.items():
            if p is not None:
                out.append((m, attr, True, f"{prefix}.{attr}" if prefix else attr))
    for prefix, m in model.named_modules(remove_duplicate=False):
        for attr, b in m._buffers.items():
            if b is None or not b.dtype.is_floating_point or not buffer_is_secret(m, attr, b):
                continue
            out.append((m, attr, False, f"{prefix}.{attr}" if prefix else attr))
    first: list[tuple[nn.Module, str, bool, str]] = []
    seen: set[int] = set()
    for m, attr, is_param, name in out:
        t = tensor_at(m, attr, is_param)
        if id(t) in seen:
            continue
        seen.add(id(t))
        first.append((m, attr, is_param, name))
    return first


def tensor_at(m: nn.Module, attr: str, is_param: bool) -> Any:
    return (m._parameters if is_param else m._buffers)[attr]


def replace_tensors(model: nn.Module, new: dict[int, Any]) -> None:
    """Every place of ``model`` that holds a tensor keyed (by ``id``) in ``new`` (tied
    aliases included) holds the new value, in place."""
    for m in model.modules():
        for d in (m._parameters, m._buffers):
            for attr, t in list(d.items()):
                if t is not None and id(t) in new:
                    d[attr] = new[id(t)]


def offered(model: nn.Module, owner: Any) -> nn.Module:
    """The client's side of an offered model: ``model`` (the architecture; its values are
    not used) with every parameter and secret buffer replaced, in place, by a placeholder
    for the value ``owner``'s worker registered under the same name. Pass the result to
    ``mpc.share(model_ptr, parties..., crypto_provider=...)``."""
    if not hasattr(owner, "id"):
        raise TypeError(f"owner is a worker (a VirtualWorker or a connection), not {owner!r}")
    new: dict[int, Any] = {}
    for m, attr, is_param, name in secret_slots(model):
        t = tensor_at(m, attr, is_param)
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise MPCError(f"{name!r} is not a floating tensor: it cannot be an owner's value")
        new[id(t)] = Offered(tuple(t.shape), t.dtype, owner, name)
    replace_tensors(model, new)
    return model


def is_offered(model: nn.Module) -> bool:
    """Whether ``model`` holds an owner's placeholders (:func:`offered`); a model with
    some parameters at a worker and others not is refused."""
    tensors = [t for m, a, p, _ in secret_slots(model) for t in [tensor_at(m, a, p)]]
    placeholders = [t for t in tensors if isinstance(t, Offered)]
    if placeholders and len(placeholders) != len(tensors):
        raise MPCError(
            "some of the model's parameters are an owner's offered values and some are not: "
            "offer the whole model (mpc.offered(model, owner))"
        )
    owners = {id(t.owner) for t in placeholders}
    if len(owners) > 1:
        raise MPCError("one model is offered by one owner")
    return bool(placeholders)


def share_offered(model: nn.Module, session: Session, frac_bits: int | None) -> nn.Module:
    """``mpc.share(model_ptr, ...)`` for an offered model: each registered value split at
    its owner's worker and moved to the parties as the owner's held shares. In place.
    ``frac_bits``: the scale the client expects (default the session's); the owner's
    worker refuses a value registered at another."""
    f = session.config.frac_bits if frac_bits is None else frac_bits
    session.watch()
    done: dict[int, HeldShared] = {}
    owner = None
    for m, attr, is_param, name in secret_slots(model):
        ph = tensor_at(m, attr, is_param)
        owner = ph.owner
        shape = list(ph.shape)
        functions = getattr(owner, "functions", None)
        if functions is not None and HELD_SHARE_FUNCTION not in functions:
            raise MPCError(
                f"worker {owner.id!r} does not split held values: its owner offers the model "
                "there first (mpc.offer)"
            )
        shares = pt_call_function(
            owner,
            HELD_SHARE_FUNCTION,
            [name, shape, f, session.n, [p.id for p in session.parties]],
            out=[(tuple(shape), torch.int64)] * session.n,
        )
        moved = [s.move(p) for s, p in zip(shares, session.parties)]  # type: ignore[union-attr]
        done[id(ph)] = held_tensor(moved, session, f, ph.dtype, owner.id, name)
    sync = getattr(owner, "sync", None)
    if sync is not None:  # (a network owner's refusal is told now, not at a later call)
        sync()
    replace_tensors(model, done)
    return model


__all__ = [
    "HeldError",
    "HeldShared",
    "Offered",
    "buffer_is_secret",
    "is_offered",
    "offered",
    "replace_tensors",
    "secret_slots",
    "share_offered",
    "tensor_at",
]
