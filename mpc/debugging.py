"""``with mpc.debug():`` every op on shared values is also computed in plaintext and
compared: a development mode that REVEALS EVERYTHING TO THE CLIENT.

The parties cannot check a secret's range without revealing something, so a value that
leaves a range (a product past the fixed-point range, ``sqrt`` of a negative number,
``1/0``, ``exp(20)``, ``log(0)``) comes back wrong without an error. In this mode the
client opens the operands of every op it runs on shared values, runs the same op in
plaintext torch (float64), opens the result and compares: a mismatch raises
:class:`DebugMismatch`, which names the op, the range it left (the fixed-point range or
the function's valid range, :data:`mpc.ranges.DOMAINS`) and the fix. As CrypTen's
validation mode does, it shows where an encrypted computation goes wrong.

Only for values the client may see anyway: what it shared itself and what it computed
from them. A value shared by another owner (a held model's parameters,
:class:`mpc.HeldShared`; a data owner's value, :class:`mpc.OwnedShared`) is refused with
:class:`DebugRefused`, and so is a plan of a held model. It opens every value at the
client and adds a fetch per operand: never use it with another party's data, nor in
production. Entering it says so on stderr and with a :class:`DebugRevealWarning`.

Not checked: the calls of an ``mpc.plan`` (they run as programs at the workers: debug
the function itself, called directly), and what runs inside one op (an op is checked as a
whole, against torch's op).

Example (``x`` shared by the client)::

    with mpc.debug():
        torch.sqrt(x)  # x = [4., -4.]: DebugMismatch, "sqrt is valid for 0 <= x < ..."
"""

from __future__ import annotations

import contextlib
import math
import sys
import warnings
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from mpc import ranges
from mpc.errors import MPCError
from mpc.registry import hook
from mpc.session import recording
from mpc.shared import SharedTensor

aten = torch.ops.aten

BANNER = (
    "mpc.debug(): every op on shared values is also computed in plaintext AT THE CLIENT, "
    "which sees every input, intermediate value and output in the clear. For development "
    "on data you own only: never with another party's data, never in production."
)


class DebugRevealWarning(UserWarning):
    """Entering :func:`debug`: it reveals everything to the client."""


class DebugMismatch(MPCError):
    """An op on shared values gave a result that differs from plaintext torch's."""

    def __init__(self, op: str, message: str) -> None:
        super().__init__(message)
        self.op = op


class DebugRefused(MPCError):
    """:func:`debug` on a value the client does not own (it would reveal it)."""


@dataclass
class DebugState:
    """The mode's tolerance for the non-linear functions' approximations (``rtol``,
    ``atol``), and how many ops it checked."""

    rtol: float = 1e-2
    atol: float = 1e-2
    checked: int = 0
    depth: int = 0  # (an op inside an op: checked as part of the outer one)


_STATE: ContextVar[DebugState | None] = ContextVar("mpc_debug", default=None)


@contextlib.contextmanager
def debug(rtol: float = 1e-2, atol: float = 1e-2) -> Iterator[DebugState]:
    """Check every op on shared values against plaintext inside the block (see the
    module docstring). It reveals every value to the client. ``rtol``/``atol``: how far
    an approximated function (exp, log, reciprocal, sqrt, sigmoid, softmax...) may be from
    torch's before it counts as wrong; linear ops and products are held to their
    fixed-point precision."""
    print(f"WARNING: {BANNER}", file=sys.stderr)
    warnings.warn(BANNER, DebugRevealWarning, stacklevel=3)
    state = DebugState(rtol=rtol, atol=atol)
    token = _STATE.set(state)
    try:
        yield state
    finally:
        _STATE.reset(token)


def active() -> bool:
    return _STATE.get() is not None


def refuse(what: str) -> None:
    """Raise :class:`DebugRefused` if the mode is on: ``what`` cannot be checked without
    opening a value the client does not own."""
    if _STATE.get() is not None:
        raise DebugRefused(
            f"mpc.debug() refuses {what}: checking it would open a value the client does not "
            "own (its owner shared it from its worker). Run it outside mpc.debug()"
        )


# reading what a tensor is (its shape, dtype, repr) is no op on its value
_METADATA = {
    "__get__",
    "__repr__",
    "__format__",
    "__len__",
    "__hash__",
    "size",
    "dim",
    "numel",
    "stride",
    "element_size",
    "is_floating_point",
    "is_complex",
    "is_contiguous",
}


@hook("function")
def refuse_foreign(func: Any, args: Any, kwargs: Any) -> None:
    """Refuse an op on a held or owned value (a SharedTensor subclass) in the mode."""
    if _STATE.get() is None or getattr(func, "__name__", "") in _METADATA:
        return
    for t in _tensors(args, kwargs or {}):
        if isinstance(t, SharedTensor) and type(t) is not SharedTensor:
            refuse(f"an op on a {type(t).__name__} ({t!r})")


def _tensors(*trees: Any) -> Iterator[Any]:
    for tree in trees:
        items = tree.values() if isinstance(tree, dict) else tree
        for a in items:
            if isinstance(a, list | tuple):
                yield from _tensors(a)
            else:
                yield a


def _plain(a: Any) -> Any:
    """The operand in plaintext: a shared value opened (kept), floats in float64."""
    if isinstance(a, SharedTensor):
        v = a._open()
        return v.double() if v.is_floating_point() else v
    if isinstance(a, torch.Tensor) and a.is_floating_point():
        return a.detach().double()
    if isinstance(a, list | tuple):
        return type(a)(_plain(b) for b in a)
    if isinstance(a, dict):
        return {k: _plain(v) for k, v in a.items()}
    return a


@hook("run")
def run_checked(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], run: Callable[[], Any]
) -> Any:
    """``run()`` (the op on shares), checked against ``func`` on the plaintext operands."""
    state = _STATE.get()
    if state is None or state.depth or recording():
        return run()
    plain_args, plain_kwargs = _plain(args), _plain(kwargs)
    state.depth += 1
    try:
        out = run()
    finally:
        state.depth -= 1
    try:
        with torch._C.DisableTorchFunctionSubclass():
            want = func(*plain_args, **plain_kwargs)
    except Exception:  # (torch refuses it in plaintext too: nothing to compare)
        return out
    if func._schema.is_mutable and isinstance(plain_args[0], torch.Tensor):
        want = plain_args[0]  # (an in-place op: the operand it changed)
    _compare(func, args, plain_args, out, want, state)
    state.checked += 1
    return out


def _pairs(out: Any, want: Any) -> Iterator[tuple[SharedTensor, torch.Tensor]]:
    if isinstance(out, list | tuple):
        for o, w in zip(out, want):
            yield from _pairs(o, w)
    elif isinstance(out, SharedTensor) and isinstance(want, torch.Tensor):
        yield out, want


_INDICES = {aten.argmax.default, aten.argmin.default}
_VALUES_AND_INDICES = {aten.max.dim, aten.min.dim, aten.max_pool2d_with_indices.default}


def _compare(func: Any, args: Any, plain: Any, out: Any, want: Any, state: DebugState) -> None:
    if func in _INDICES or func in _VALUES_AND_INDICES:
        _compare_indices(func, plain, out, want)
        if func in _INDICES:
            return
        out, want = out[0], want[0]  # the values, as below
    for o, w in _pairs(out, want):
        got = o._open()
        got = got.double() if got.is_floating_point() else got
        if tuple(got.shape) != tuple(w.shape):
            _fail(func, plain, o, f"shape {tuple(got.shape)}, torch gives {tuple(w.shape)}")
        if not (got.is_floating_point() or w.is_floating_point()):
            bad = got != w
            if bool(bad.any()):
                _mismatch(func, plain, o, got, w, bad, "exact")
            continue
        w = w.double()
        masked = (w <= -1e30) & (got <= -(2.0**13))  # (a public mask's sentinel)
        rtol, atol = _tolerance(func, args, o, state)
        err = (got - w).abs()
        bad = ~torch.isfinite(w) | ~(err <= atol + rtol * w.abs())
        bad &= ~masked
        if bool(bad.any()):
            _mismatch(func, plain, o, got, w, bad, f"{atol:.3g} + {rtol:.3g} |torch|")


def _compare_indices(func: Any, plain: Any, out: Any, want: Any) -> None:
    """Ties may be broken differently: the index is right if it points at the extreme."""
    if func is aten.max_pool2d_with_indices.default:
        return  # (the values are compared; the indices are the backward's)
    idx = out if func in _INDICES else out[1]
    x = plain[0]
    dim = plain[1] if len(plain) > 1 else None
    got = idx._open()
    values = want[0] if func in _VALUES_AND_INDICES else None
    if dim is None:
        picked = x.reshape(-1)[got.reshape(-1)].reshape(got.shape)
        best = x.max() if func is aten.argmax.default else x.min()
    else:
        keep = len(plain) > 2 and bool(plain[2])
        g = got if keep else got.unsqueeze(dim)
        picked = x.gather(dim, g)
        picked = picked if keep else picked.squeeze(dim)
        if values is not None:
            best = values
        else:
            best = (
                x.amax(dim, keepdim=keep)
                if func is aten.argmax.default
                else x.amin(dim, keepdim=keep)
            )
    bad = picked != best
    if bool(bad.any()):
        _mismatch(func, plain, idx, picked, best, bad, "the index of an extreme value")


_EXACT = {
    *(op for op in ranges.SAME if ranges.RULES.get(op) is ranges.same_entries),
    aten.add.Tensor,
    aten.add.Scalar,
    aten.sub.Tensor,
    aten.sub.Scalar,
    aten.rsub.Tensor,
    aten.rsub.Scalar,
    aten.cat.default,
    aten.stack.default,
    aten.where.self,
    aten.masked_fill.Scalar,
    aten.masked_fill.Tensor,
    aten.sum.default,
    aten.sum.dim_IntList,
    aten.clamp.default,
    aten.clamp.Tensor,
    aten.hardtanh.default,
    aten.embedding.default,
} - {
    aten.gelu.default,
    aten.silu.default,
    aten.mean.default,
    aten.mean.dim,
    aten.avg_pool2d.default,
    aten._adaptive_avg_pool2d.default,
    aten.std.correction,
}
# a product with a public number (one truncation, the number's encoding): as a product
_SCALED = {
    aten.mean.default,
    aten.mean.dim,
    aten.avg_pool2d.default,
    aten._adaptive_avg_pool2d.default,
}


def _tolerance(func: Any, args: Any, o: SharedTensor, state: DebugState) -> tuple[float, float]:
    """How far a result may be from torch's: a linear op's two units, a product's
    fixed-point rounding (one unit per term, plus a public operand's encoding), or an
    approximated function's (the mode's ``rtol``/``atol``)."""
    unit = 2.0**-o.session.config.frac_bits
    base = ranges.IN_PLACE.get(func, func)
    divided = base in (aten.div.Tensor, aten.div.Scalar) and not isinstance(args[1], SharedTensor)
    if base in ranges.PRODUCTS or base in _SCALED or divided:
        k = _contracted_length(base, args)
        top = max((float(t._open().abs().max()) for t in _shared(args) if t.numel()), default=1.0)
        return 1e-3, (k + 2) * unit * (1 + top)
    if base in _EXACT:
        return 1e-6, 4 * unit
    return state.rtol, state.atol  # (the non-linear functions, and ops with no rule)


def _shared(args: Any) -> list[SharedTensor]:
    return [t for t in _tensors(args) if isinstance(t, SharedTensor)]


def _contracted_length(func: Any, args: Any) -> int:
    if func in (aten.mm.default, aten.bmm.default, aten.mv.default, aten.dot.default):
        return int(args[0].shape[-1])
    if func in (aten.addmm.default, aten.baddbmm.default):
        return int(args[1].shape[-1])
    if func is aten.convolution.default:
        w = args[1]
        return int(w.shape[1] * w.shape[2] * w.shape[3])
    return 1


def _name(func: Any) -> str:
    return str(getattr(func, "__name__", func)).split(".")[0]


def _ranges_of(plain: Any) -> str:
    parts = []
    for k, t in enumerate(x for x in _tensors(plain) if isinstance(x, torch.Tensor)):
        if t.numel() and t.is_floating_point():
            parts.append(f"operand {k} in [{float(t.min()):.4g}, {float(t.max()):.4g}]")
    return "; ".join(parts) or "no floating operands"


def _mismatch(
    func: Any, plain: Any, o: SharedTensor, got: Any, want: Any, bad: Any, tol: str
) -> None:
    flat = bad.reshape(-1).nonzero()
    i = int(flat[0]) if len(flat) else 0
    g, w = got.reshape(-1)[i].item(), want.reshape(-1)[i].item()
    where = (
        f"{int(bad.sum())} of {bad.numel()} entries differ from plaintext torch beyond "
        f"{tol} (first at flat index {i}: got {g:.6g}, torch gives {w:.6g})"
    )
    _fail(func, plain, o, where, want)


def _fail(func: Any, plain: Any, o: SharedTensor, where: str, want: Any = None) -> None:
    name = _name(func)
    f = o.session.config.frac_bits
    domain = ranges.DOMAINS.get(func) or ranges.DOMAINS.get(ranges.IN_PLACE.get(func))
    operand = next((x for x in _tensors(plain) if isinstance(x, torch.Tensor)), None)
    if func in (aten.div.Tensor, aten.div.Scalar):
        operand = plain[1] if isinstance(plain[1], torch.Tensor) else None
    top = float(want.abs().max()) if isinstance(want, torch.Tensor) and want.numel() else 0.0
    if domain is not None and isinstance(operand, torch.Tensor):
        out = domain.outside_of(operand.double())
        left = (
            f"{name} is valid for {domain.text()}: {int(out.sum())} input entries lie outside "
            f"it (e.g. {float(operand.reshape(-1)[int(out.reshape(-1).nonzero()[0])]) if out.any() else float('nan'):.4g}); "
            f"outside it the result is {domain.outside}"
        )
        fix = domain.fix
    elif func in ranges.PRODUCTS or ranges.IN_PLACE.get(func) in ranges.PRODUCTS:
        edge = 2.0 ** (ranges.PRODUCT_BITS - 2 * f)
        left = (
            f"the product left the fixed-point range: |result| < 2**{ranges.PRODUCT_BITS - 2 * f}"
            f" = {edge:.4g} at frac_bits={f} (torch's result reaches {top:.4g})"
        )
        fix = (
            "scale the values down before the product (and back up after, in plaintext), "
            "or share with fewer fractional bits (mpc.share(..., frac_bits=...))"
        )
    elif math.isfinite(top) and top * 2.0**f >= 2.0 ** (ranges.RING_BITS - 1):
        left = (
            f"the result left the fixed-point range |x| < 2**{ranges.RING_BITS - 1 - f} at "
            f"frac_bits={f} (torch's result reaches {top:.4g})"
        )
        fix = "scale the values down, or share with fewer fractional bits"
    else:
        left = (
            f"torch's result is {'not finite' if not math.isfinite(top) else f'up to {top:.4g}'}: "
            f"beyond {name}'s accuracy on these inputs (docs/secret-sharing.md lists each "
            "function's domain and error)"
        )
        fix = (
            "bring the inputs into the function's domain, or pass a looser rtol/atol to mpc.debug()"
        )
    raise DebugMismatch(
        name,
        f"mpc.debug: {name} on shared values: {where}. Inputs: {_ranges_of(plain)}. The range "
        f"it left: {left}. Fix: {fix}",
    )


__all__ = ["DebugMismatch", "DebugRefused", "DebugRevealWarning", "DebugState", "debug"]
