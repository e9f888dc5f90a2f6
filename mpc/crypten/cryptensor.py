"""CrypTen's ``CrypTensor`` and ``MPCTensor``: an encrypted tensor, here an
:class:`mpc.SharedTensor` (additive shares over Z/2^64 held by the party workers, floats in
fixed point with 16 fractional bits by default, as CrypTen's).

An ``MPCTensor`` wraps the ``SharedTensor`` (``x._shared``) and speaks CrypTen's dialect:
``get_plain_text()``, ``ptype``, ``argmax`` giving a one-hot tensor, comparisons giving an
encrypted 0./1. tensor. Every torch method and function works on it as on the
``SharedTensor`` (``x.relu()``, ``torch.cat``, ``F.conv2d``...): the call is made on the
shares and the result wrapped again. Each call is one collective of the ranks
(:mod:`mpc.crypten._world`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import torch
import torch.nn.functional as F

import mpc
import pointers as pt
from mpc.crypten import _world
from mpc.crypten._errors import EncryptedBoolError, lookup, unavailable
from mpc.ops.backward import track_grad
from mpc.shared import SharedTensor


class ptype(enum.Enum):  # noqa: N801  (CrypTen's name)
    """CrypTen's private types. Only ``arithmetic`` exists here (see ``binary``)."""

    arithmetic = 0
    binary = 1

    def __str__(self) -> str:
        return f"ptype.{self.name}"

    def __repr__(self) -> str:
        return str(self)


_BINARY = (
    "binary (XOR) sharing exists only inside the comparison protocol here (x < y, relu, max "
    "and sign use it), and bitwise ops on shared values are not offered: share integers with "
    "the arithmetic ptype (crypten.cryptensor(x), or exactly in Z/2^64 with "
    "mpc.share(torch.tensor([...]), parties..., crypto_provider=...))"
)

# CrypTen MPCTensor names with no honest equivalent here, and what to use instead
_UNAVAILABLE = {
    "encoder": "the fixed-point scale is the SharedTensor's (x._shared.frac_bits; set it with "
    "crypten.cryptensor(x, precision=bits) or crypten.init(config=mpc.MPCConfig(frac_bits=...)))",
    "bernoulli": "values the parties draw jointly are not offered: share a value the client "
    "draws, crypten.cryptensor(torch.rand(...)) (the client then knows it)",
    "rand": "see bernoulli",
    "share_": "shares are set by the protocols; make a new sharing with crypten.cryptensor",
    "set": "shares are set by the protocols; make a new sharing with crypten.cryptensor",
    "xor": _BINARY,
    "cuda": "the engine runs on CPU (int64 ring arithmetic at the workers)",
}


def _method(name: str) -> Callable[..., Any]:
    """``x.<name>(...)``: the SharedTensor's torch method, made once for all ranks."""

    def method(self: MPCTensor, *args: Any) -> Any:
        return self._call(name, *args)

    method.__name__ = name
    return method


class CrypTensor:
    """CrypTen's abstract encrypted tensor; :class:`MPCTensor` is the one kind here."""


class MPCTensor(CrypTensor):
    """An encrypted tensor. ``MPCTensor(x, src=0)`` and ``crypten.cryptensor(x, src=0)``
    share rank ``src``'s ``x`` among the world's parties; ``precision`` (fractional bits,
    default the session's 16) and ``requires_grad`` as in CrypTen."""

    _shared: SharedTensor

    def __new__(
        cls,
        tensor: Any = None,
        ptype: ptype = ptype.arithmetic,  # noqa: A002
        device: Any = None,
        *args: Any,
        src: int = 0,
        requires_grad: bool = False,
        precision: int | None = None,
        **kwargs: Any,
    ) -> MPCTensor:
        if args or kwargs:
            unavailable(
                f"MPCTensor(..., {', '.join([*map(repr, args), *kwargs])})",
                "the arguments here are tensor, ptype, device, src, requires_grad, precision",
            )
        return encrypt(tensor, ptype, device, src, requires_grad, precision)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass  # (made by __new__)

    @classmethod
    def _of(cls, shared: SharedTensor) -> MPCTensor:
        out = object.__new__(cls)
        out._shared = shared
        return out

    # -- CrypTen's own ----------------------------------------------------------------
    def get_plain_text(self, dst: int | None = None) -> torch.Tensor | None:
        """Decrypt: the value, to the client (every rank gets it, or only rank ``dst``)."""
        if dst is not None:
            _world.check_src(dst, "dst")
        value = _world.collective("get_plain_text", lambda _: self._shared.get(delete=False))
        if dst is not None and _world.rank() != dst:
            return None
        return value if _world.rank() == 0 else value.clone()

    def reveal(self, dst: int | None = None) -> torch.Tensor | None:
        return self.get_plain_text(dst)

    @property
    def ptype(self) -> ptype:
        return ptype.arithmetic

    def arithmetic(self) -> MPCTensor:
        return self

    def binary(self) -> NoReturn:
        unavailable("MPCTensor.binary()", _BINARY)

    def to(self, *args: Any, **kwargs: Any) -> Any:
        target = args[0] if args else kwargs.get("ptype")
        if isinstance(target, ptype):
            if target is ptype.binary:
                unavailable("MPCTensor.to(crypten.mpc.binary)", _BINARY)
            return self
        return self._call("to", *args, **kwargs)

    def new(self, *args: Any, **kwargs: Any) -> MPCTensor:
        """A new encrypted tensor among the same parties (``x.new(torch.randn(2))``)."""
        return MPCTensor(*args, **kwargs)

    @property
    def share(self) -> torch.Tensor:
        """This rank's share (party ``rank``'s ring elements): fetched from its worker."""
        r = _world.rank()
        return _world.on_main(lambda: self._share_of(r))  # type: ignore[no-any-return]

    _tensor = share

    def _share_of(self, r: int) -> torch.Tensor:
        s = self._shared.materialize()
        return pt.get_all([s.shares[r]], delete=False)[0]

    def __repr__(self) -> str:
        try:
            share = repr(self.share)
        except Exception as e:  # (workers gone, e.g. after crypten.uninit())
            share = f"<unavailable: {type(e).__name__}: {e}>"
        return f"MPCTensor(\n\t_tensor={share}\n\tplain_text=HIDDEN\n\tptype={self.ptype}\n)"

    def __format__(self, spec: str) -> str:
        if spec:
            raise EncryptedBoolError(
                f"format spec {spec!r} on an encrypted tensor: decrypt it with "
                ".get_plain_text() first"
            )
        return repr(self)

    # -- what needs the value ---------------------------------------------------------
    def __bool__(self) -> bool:
        raise EncryptedBoolError(
            "an encrypted tensor has no truth value (the parties cannot branch on a secret): "
            "use crypten.where(condition, a, b), or decrypt with .get_plain_text()"
        )

    def __float__(self) -> float:
        raise EncryptedBoolError("decrypt with .get_plain_text() before float()")

    def __int__(self) -> int:
        raise EncryptedBoolError("decrypt with .get_plain_text() before int()")

    def item(self) -> NoReturn:
        raise EncryptedBoolError("decrypt with .get_plain_text() before .item()")

    def tolist(self) -> NoReturn:
        raise EncryptedBoolError("decrypt with .get_plain_text() before .tolist()")

    def numpy(self) -> NoReturn:
        raise EncryptedBoolError("decrypt with .get_plain_text() before .numpy()")

    # -- shape: local, no communication -------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        return self._shared.shape

    def size(self, dim: int | None = None) -> Any:
        return self._shared.size() if dim is None else self._shared.size(dim)

    def dim(self) -> int:
        return self._shared.dim()

    def numel(self) -> int:
        return self._shared.numel()

    nelement = numel

    def __len__(self) -> int:
        return len(self._shared)

    def __iter__(self) -> Iterator[MPCTensor]:
        for i in range(len(self)):
            yield self[i]

    @property
    def device(self) -> torch.device:
        return self._shared.device

    @property
    def dtype(self) -> torch.dtype:
        return self._shared.dtype

    # -- autograd (torch's own, on the shares) ------------------------------------------
    @property
    def requires_grad(self) -> bool:
        return self._shared.requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad: bool = True) -> MPCTensor:
        def compute(_: Any) -> None:
            track_grad(self._shared.requires_grad_(requires_grad))

        _world.collective("requires_grad_", compute)
        return self

    @property
    def grad(self) -> MPCTensor | None:
        """The gradient, encrypted (one that depends on no secret, such as a mean's, comes
        back from torch as a plain tensor: it is shared among the same parties, as CrypTen's
        would be)."""

        def compute(_: Any) -> MPCTensor | None:
            g = self._shared.grad
            if g is None or isinstance(g, SharedTensor):
                return None if g is None else wrap_shared(g)
            return MPCTensor._of(mpc.share(g, session=self._shared.session))

        return _world.collective("grad", compute)  # type: ignore[no-any-return]

    def backward(self, grad_input: Any = None, **kwargs: Any) -> None:
        _world.collective(
            "backward", lambda _: self._shared.backward(unwrap_shared(grad_input), **kwargs)
        )

    # -- CrypTen's forms of torch ops -----------------------------------------------------
    def _reduce_one_hot(self, fn: str, dim: int | None, keepdim: bool, one_hot: bool) -> Any:
        def compute(_: Any) -> Any:
            x = self._shared
            flat = x.reshape(-1) if dim is None else x
            d = 0 if dim is None else dim
            idx = getattr(flat, fn)(dim=d, keepdim=True)
            if not one_hot:
                out = idx if keepdim or dim is None else idx.squeeze(d)
                return wrap_shared(out.reshape(()) if dim is None and not keepdim else out)
            shape = [1] * flat.dim()
            shape[d] = flat.shape[d]
            hot = idx == torch.arange(flat.shape[d]).view(shape)
            return wrap_shared(hot.reshape(x.shape) if dim is None else hot)

        return _world.collective(f"{fn}", compute)

    def argmax(self, dim: int | None = None, keepdim: bool = False, one_hot: bool = True) -> Any:
        """As CrypTen: a one-hot encrypted tensor marking the maximum (``one_hot=False``:
        the encrypted index)."""
        return self._reduce_one_hot("argmax", dim, keepdim, one_hot)

    def argmin(self, dim: int | None = None, keepdim: bool = False, one_hot: bool = True) -> Any:
        return self._reduce_one_hot("argmin", dim, keepdim, one_hot)

    def max(self, dim: int | None = None, keepdim: bool = False, one_hot: bool = True) -> Any:
        """As CrypTen: the maximum; with ``dim``, ``(values, one-hot argmax)``."""
        if dim is None:
            return self._call("max")
        values = self._call("amax", dim=dim, keepdim=keepdim)
        return values, self.argmax(dim, keepdim, one_hot)

    def min(self, dim: int | None = None, keepdim: bool = False, one_hot: bool = True) -> Any:
        if dim is None:
            return self._call("min")
        values = self._call("amin", dim=dim, keepdim=keepdim)
        return values, self.argmin(dim, keepdim, one_hot)

    def where(self, condition: Any, y: Any) -> MPCTensor:
        """``condition * self + (1 - condition) * y`` (``condition`` encrypted 0./1., or a
        public tensor)."""
        return where(condition, self, y)

    def polynomial(self, coeffs: Any) -> MPCTensor:
        """sum_i coeffs[i] * self ** (i + 1), as CrypTen's."""
        coeffs = [float(c) for c in torch.as_tensor(coeffs).reshape(-1).tolist()]

        def compute(_: Any) -> Any:
            x = self._shared
            power, total = x, x * coeffs[0]
            for c in coeffs[1:]:
                power = power * x
                total = total + power * c
            return wrap_shared(total)

        return _world.collective("polynomial", compute)  # type: ignore[no-any-return]

    def pos_pow(self, p: float) -> MPCTensor:
        return self._call("pow", p)

    def square(self) -> MPCTensor:
        return self._call("mul", self._shared)

    def cross_entropy(self, target: Any, skip_forward: bool = False) -> MPCTensor:
        """Mean over the batch of -sum(target * log_softmax(self, 1)): ``target`` one-hot
        (or probabilities), as CrypTen's."""
        return on_shares("cross_entropy", shared_cross_entropy, self, target)

    def binary_cross_entropy(self, target: Any, skip_forward: bool = False) -> MPCTensor:
        """-mean(target log(self) + (1 - target) log(1 - self)), ``self`` in (0, 1)."""
        return on_shares("binary_cross_entropy", shared_bce, self, target)

    def binary_cross_entropy_with_logits(self, target: Any, skip_forward: bool = False) -> Any:
        """The binary cross-entropy of sigmoid(self)."""
        return on_shares(
            "binary_cross_entropy_with_logits",
            shared_bce_with_logits,
            self,
            target,
        )

    def relu6(self) -> MPCTensor:
        return on_shares("relu6", F.relu6, self)

    def hardtanh(self, min_value: float = -1.0, max_value: float = 1.0) -> MPCTensor:
        return on_shares("hardtanh", lambda x: F.hardtanh(x, min_value, max_value), self)

    def dropout(self, p: float = 0.5, training: bool = True, inplace: bool = False) -> MPCTensor:
        return on_shares("dropout", lambda x: F.dropout(x, p, training), self)

    # -- everything else: the SharedTensor's torch method ------------------------------------
    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        def compute(_: Any) -> Any:
            out = getattr(self._shared, name)(*unwrap_shared(args), **unwrap_shared(kwargs))
            return self if out is self._shared else wrap_shared(out)

        return _world.collective(name, compute)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_shared":
            raise AttributeError(name)
        if name in _UNAVAILABLE:
            lookup(_UNAVAILABLE, "MPCTensor", name)
        if name in _FUNCTIONAL:
            fn = _FUNCTIONAL[name]
            return lambda *a, **k: on_shares(
                name, lambda x: fn(x, *unwrap_shared(a), **unwrap_shared(k)), self
            )
        attr = getattr(torch.Tensor, name, None)
        if attr is None:
            raise AttributeError(f"'MPCTensor' object has no attribute {name!r}")
        if callable(attr):
            return lambda *a, **k: self._call(name, *a, **k)
        return _world.collective(name, lambda _: wrap_shared(getattr(self._shared, name)))

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", str(func))
        kwargs = kwargs or {}
        return _world.collective(
            f"torch.{name}",
            lambda _: wrap_shared(func(*unwrap_shared(args), **unwrap_shared(kwargs))),
        )

    __hash__ = object.__hash__
    __add__ = _method("__add__")
    __radd__ = _method("__radd__")
    __sub__ = _method("__sub__")
    __rsub__ = _method("__rsub__")
    __mul__ = _method("__mul__")
    __rmul__ = _method("__rmul__")
    __truediv__ = _method("__truediv__")
    __rtruediv__ = _method("__rtruediv__")
    __matmul__ = _method("__matmul__")
    __rmatmul__ = _method("__rmatmul__")
    __pow__ = _method("__pow__")
    __lt__ = _method("__lt__")
    __le__ = _method("__le__")
    __gt__ = _method("__gt__")
    __ge__ = _method("__ge__")
    __eq__ = _method("__eq__")  # type: ignore[assignment]
    __ne__ = _method("__ne__")  # type: ignore[assignment]
    __neg__ = _method("__neg__")
    __abs__ = _method("abs")

    def __getitem__(self, index: Any) -> MPCTensor:
        return self._call("__getitem__", index)

    def __setitem__(self, index: Any, value: Any) -> None:
        self._call("__setitem__", index, value)

    def __lshift__(self, other: Any) -> NoReturn:
        unavailable("<< on an MPCTensor", _BINARY)

    __rshift__ = __lshift__
    __xor__ = __lshift__
    __and__ = __lshift__
    __or__ = __lshift__
    __invert__ = __lshift__


# CrypTen tensor methods that torch spells as torch.nn.functional functions
_FUNCTIONAL: dict[str, Callable[..., Any]] = {
    "conv1d": lambda *a, **k: conv1d(*a, **k),
    "conv2d": F.conv2d,
    "conv_transpose1d": F.conv_transpose1d,
    "conv_transpose2d": F.conv_transpose2d,
    "avg_pool2d": F.avg_pool2d,
    "max_pool2d": F.max_pool2d,
    "adaptive_avg_pool2d": F.adaptive_avg_pool2d,
    "adaptive_max_pool2d": F.adaptive_max_pool2d,
    "pad": F.pad,
    "batchnorm": F.batch_norm,
    "softplus": F.softplus,
    "gelu": F.gelu,
    "silu": F.silu,
}


def conv1d(
    x: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Any:
    """``F.conv1d`` as a 2-D convolution of height 1 (the engine's convolution is 2-D)."""

    def one(v: Any) -> int:
        return int(v[0]) if isinstance(v, list | tuple) else int(v)

    if isinstance(padding, str):
        raise ValueError("conv1d here takes a numeric padding")
    out = F.conv2d(
        x.unsqueeze(-2),
        weight.unsqueeze(-2),
        bias,
        (1, one(stride)),
        (0, one(padding)),
        (1, one(dilation)),
        groups,
    )
    return out.squeeze(-2)


def unwrap_shared(v: Any) -> Any:
    if isinstance(v, MPCTensor):
        return v._shared
    if isinstance(v, list):
        return [unwrap_shared(x) for x in v]
    if isinstance(v, tuple):
        return tuple(unwrap_shared(x) for x in v)
    if isinstance(v, dict):
        return {k: unwrap_shared(x) for k, x in v.items()}
    return v


def wrap_shared(v: Any) -> Any:
    """SharedTensors in ``v`` as MPCTensors (non-float ones, comparisons' bools, as the
    encrypted 0./1. floats CrypTen gives)."""
    if isinstance(v, SharedTensor):
        if not v.is_floating_point():
            v = v.to(torch.get_default_dtype())
        return MPCTensor._of(v)
    if isinstance(v, list):
        return [wrap_shared(x) for x in v]
    if isinstance(v, tuple):
        items = [wrap_shared(x) for x in v]
        if hasattr(v, "_fields"):  # a NamedTuple
            return type(v)(*items)
        if type(v) is not tuple:  # torch.return_types
            return type(v)(items)
        return tuple(items)
    return v


def shared_cross_entropy(x: Any, y: Any) -> Any:
    return -(y * x.log_softmax(1)).sum(1).mean()


class _BCEWithLogits(torch.autograd.Function):
    """The binary cross-entropy of sigmoid(x), its gradient (sigmoid(x) - y) / n (torch's
    sigmoid backward is not an op of the engine)."""

    @staticmethod
    def forward(ctx: Any, x: Any, y: Any) -> Any:
        s = x.sigmoid()
        ctx.save_for_backward(s, y)
        return shared_bce(s, y)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        s, y = ctx.saved_tensors
        return (s - y) * (grad / s.numel()), None


def shared_bce_with_logits(x: Any, y: Any) -> Any:
    if isinstance(y, torch.Tensor) and not isinstance(y, SharedTensor):
        y = y.to(x.dtype)
    return _BCEWithLogits.apply(x, y)


def shared_bce(x: Any, y: Any) -> Any:
    return -(y * x.log() + (1 - y) * (1 - x).log()).mean()


def on_shares(label: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn`` of the shares of ``args``, once for all ranks."""
    return _world.collective(label, lambda _: wrap_shared(fn(*unwrap_shared(args))))


def encrypt(
    tensor: Any,
    ptype_: ptype = ptype.arithmetic,
    device: Any = None,
    src: int = 0,
    requires_grad: bool = False,
    precision: int | None = None,
) -> MPCTensor:
    """``crypten.cryptensor``: rank ``src``'s ``tensor`` shared by the client among the
    world's parties (:func:`mpc.share`); floats and integers alike become fixed-point
    floats, as in CrypTen."""
    if ptype_ is ptype.binary:
        unavailable("ptype=crypten.mpc.binary", _BINARY)
    if not isinstance(ptype_, ptype):
        raise TypeError(f"ptype must be crypten.mpc.arithmetic, got {ptype_!r}")
    if device is not None and torch.device(device).type != "cpu":
        unavailable(f"device={device!r}", _UNAVAILABLE["cuda"])
    _world.check_src(src)

    def compute(payloads: list[Any]) -> MPCTensor:
        x = payloads[src]
        if x is None:
            raise ValueError(f"rank {src} (the src) gave no tensor to encrypt")
        if isinstance(x, CrypTensor):
            raise TypeError("this tensor is already encrypted")
        if not isinstance(x, torch.Tensor):
            x = torch.tensor(x)
        if not x.is_floating_point():
            x = x.to(torch.get_default_dtype())
        session = _world.setup().session(_world.world_size())
        return MPCTensor._of(
            mpc.share(x, session=session, frac_bits=precision, requires_grad=requires_grad)
        )

    return _world.collective("crypten.cryptensor", compute, tensor)  # type: ignore[no-any-return]


def where(condition: Any, input: Any, other: Any) -> Any:  # noqa: A002
    """CrypTen's ``crypten.where``: ``condition * input + (1 - condition) * other``."""

    def compute(_: Any) -> Any:
        c = unwrap_shared(condition)
        a, b = unwrap_shared(input), unwrap_shared(other)
        if isinstance(c, torch.Tensor) and not isinstance(c, SharedTensor):
            c = c.to(torch.get_default_dtype())
        return wrap_shared(c * a + (1 - c) * b)

    return _world.collective("crypten.where", compute)
