"""``mpc.share``: secret-share a tensor or every parameter and buffer of a model."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, cast, overload

import torch
from torch import nn

from mpc.authenticated import AuthenticatedTensor, share_authenticated_any
from mpc.compat import check_protocol, share_remote, unwrap_fixed_precision
from mpc.config import MPCConfig
from mpc.errors import MPCError
from mpc.offered import buffer_is_secret, is_offered, share_offered
from mpc.ops.backward import track_grad
from mpc.ops.norms import rms_norm
from mpc.protocols.weights.run import mark_fixed
from mpc.registry import hook
from mpc.session import Session, session_for
from mpc.shared import SharedTensor, share_tensor
from pointers.pointer_tensor import PointerTensor


@overload
def share(
    x: torch.Tensor,
    *parties: Any,
    crypto_provider: Any | None = ...,
    frac_bits: int | None = ...,
    config: MPCConfig | None = ...,
    session: Session | None = ...,
    requires_grad: bool = ...,
    protocol: str | None = ...,
    public_buffers: Iterable[str] = ...,
    shared_buffers: Iterable[str] = ...,
    security: str | None = ...,
) -> SharedTensor: ...
@overload
def share(
    x: nn.Module,
    *parties: Any,
    crypto_provider: Any | None = ...,
    frac_bits: int | None = ...,
    config: MPCConfig | None = ...,
    session: Session | None = ...,
    requires_grad: bool = ...,
    protocol: str | None = ...,
    public_buffers: Iterable[str] = ...,
    shared_buffers: Iterable[str] = ...,
    security: str | None = ...,
) -> nn.Module: ...


def share(
    x: Any,
    *parties: Any,
    crypto_provider: Any | None = None,
    frac_bits: int | None = None,
    config: MPCConfig | None = None,
    session: Session | None = None,
    requires_grad: bool = False,
    protocol: str | None = None,
    public_buffers: Iterable[str] = (),
    shared_buffers: Iterable[str] = (),
    security: str | None = None,
) -> Any:
    """Secret-share ``x`` (a tensor, or a model's parameters and buffers) among ``parties``.

    Floats are encoded in fixed point (``frac_bits``, default 16), integers exactly.
    Products and comparisons need a ``crypto_provider`` (a worker that deals correlated
    randomness and colludes with no party); without one only linear ops are available.
    Every call with the same parties, crypto provider and config shares one
    :class:`Session` (one set of seeds); ``session=`` names one explicitly.

    A shared model's parameters keep their ``requires_grad``, and ``requires_grad=True``
    makes a shared tensor a leaf that autograd fills ``.grad`` of: ``loss.backward()`` and
    ``torch.optim`` then train on shared values (see docs/encrypted-training.md).

    Which tensors of a model are secret (:func:`buffer_is_secret`): every parameter, and
    every floating-point buffer the model saves (its ``state_dict``: e.g. a running mean).
    Integer and bool buffers (position ids, token-type ids, causal masks) and buffers the
    module does not save (``persistent=False`` floats computed from the config, such as
    rotary ``inv_freq``) are structure, and stay plain public tensors. ``public_buffers``
    and ``shared_buffers`` override the rule for buffers named as in
    ``model.named_buffers()``; a name the model lacks is refused before anything is shared.

    PySyft-compatible (:mod:`mpc.compat`): ``protocol="fss"`` (with 2 parties and no
    ``config``: the comparison by function secret sharing, ``comparison="fss"``; with more
    parties, the default comparison) or ``"snn"`` (the default comparison), and
    ``x.fix_precision()`` tensors or models (shared with their precision).

    ``security="malicious"`` (short for ``config=MPCConfig(security="malicious")``) shares
    with MACs: an :class:`mpc.authenticated.AuthenticatedTensor`, whose outputs reach the
    client only after a check that catches any party that deviates (docs/security.md).
    """
    check_protocol(protocol)
    x, frac_bits = unwrap_fixed_precision(x, frac_bits)
    remote = isinstance(x, nn.Module) and _is_offered(x)
    if session is None:
        if len(parties) == 1 and isinstance(parties[0], list | tuple):
            parties = tuple(parties[0])
        if config is None:
            kw: dict[str, Any] = {} if frac_bits is None else {"frac_bits": frac_bits}
            if protocol == "fss" and len(parties) == 2:  # PySyft's FSS (2 parties)
                kw["comparison"] = "fss"
            config = MPCConfig(**kw)
        if security is not None and security != config.security:
            config = dataclasses.replace(config, security=security)
        session = session_for(list(parties), crypto_provider, config)
    elif parties:
        raise TypeError("pass either parties or session, not both")
    elif security is not None and security != session.config.security:
        raise MPCError(f"security={security!r}, but the session's is {session.config.security!r}")
    else:
        gone = session.restarted()
        if gone:
            raise MPCError(
                f"worker(s) {gone} of {session!r} restarted since its seeds were dealt, and "
                "their shares and seeds died with the old process: share without session= "
                "(the group then gets a new session), or make a new mpc.Session"
            )
    if session.config.security == "malicious":
        if remote or public_buffers or shared_buffers or requires_grad:
            raise MPCError(
                "the malicious mode shares the client's own tensors and models, not trained "
                "(remote models, public_buffers, shared_buffers and requires_grad are refused)"
            )
        return share_authenticated_any(x, session, frac_bits)
    if remote:  # the owner's worker splits its registered values: held weights (mpc.held)
        if public_buffers or shared_buffers or requires_grad:
            raise MPCError(
                "a model shared from its owner's worker takes the owner's rule for its "
                "buffers and is not trained on (public_buffers, shared_buffers and "
                "requires_grad are refused)"
            )
        return share_offered(x, session, frac_bits)
    if isinstance(x, nn.Module):
        return _share_module(x, session, set(public_buffers), set(shared_buffers))
    if public_buffers or shared_buffers:
        raise TypeError("public_buffers and shared_buffers name buffers of a model")
    if isinstance(x, PointerTensor):  # the worker holding it splits it (mpc.compat)
        return share_remote(x, session, frac_bits, requires_grad)
    shared = share_tensor(x, session, frac_bits)
    if requires_grad:
        track_grad(shared.requires_grad_(True))
    return shared


@hook("module_get")
def get(x: Any) -> Any:
    """Reconstruct a shared tensor, or every shared parameter and buffer of a model (in
    place: each becomes a plain ``nn.Parameter`` with the same ``requires_grad``; a shared
    ``.grad`` comes back too). Returns the tensor's value, or the model.

    ``pointers.get(model)`` and ``model.get()`` (after ``pointers.hook(torch)``) on a
    shared model call this, as PySyft 0.2's did. Each shared tensor's shares are freed
    (:meth:`SharedTensor.get`). An optimizer built on the shared parameters still holds
    those: build a new one to go on in the clear. A model shared by its owner from its
    worker (held parameters) never opens: that raises before anything changes.
    """
    if isinstance(x, SharedTensor | AuthenticatedTensor):
        return x.get()
    if not isinstance(x, nn.Module):
        raise TypeError(f"mpc.get expects a SharedTensor or an nn.Module, got {type(x).__name__}")
    for t in [*x.parameters(), *x.buffers()]:
        if isinstance(t, SharedTensor) and type(t) is not SharedTensor:
            t.get()  # (a held or owned value's own refusal: it never opens here)
            raise MPCError(f"the model's {type(t).__name__} parameters do not open here")
    done: dict[int, Any] = {}  # a tied parameter comes back once, still tied
    for m in x.modules():
        for name, p in list(m._parameters.items()):
            if isinstance(p, SharedTensor):
                if id(p) not in done:
                    new = nn.Parameter(p.get(), requires_grad=p.requires_grad)
                    if isinstance(p.grad, SharedTensor):
                        new.grad = p.grad.get()
                    done[id(p)] = new
                m._parameters[name] = done[id(p)]
        for name, b in list(m._buffers.items()):
            if isinstance(b, SharedTensor):
                if id(b) not in done:
                    done[id(b)] = b.get()
                m._buffers[name] = done[id(b)]
    return x


def share_method(self: Any, *parties: Any, **kwargs: Any) -> Any:
    """``x.share(alice, bob, crypto_provider=carol)`` after ``pointers.hook(torch)``."""
    return share(self, *parties, **kwargs)


# eval-mode batch norm's statistics are folded into its weights; they stay public
_FOLDED = ("running_mean", "running_var", "num_batches_tracked")


def _is_offered(model: nn.Module) -> bool:
    if is_offered(model):
        return True
    if any(isinstance(p, PointerTensor) for p in model.parameters()):
        raise MPCError(
            "the model's parameters are pointers to a worker: a model at a worker is shared "
            "by its owner, who registers its values there (mpc.offer, or serve --offer) and "
            "hands the client mpc.offered(model, owner); bring a model you sent back with "
            ".get() to share it from here"
        )
    return False


def _share_module(
    model: nn.Module,
    session: Session,
    public: set[str] | None = None,
    secret: set[str] | None = None,
) -> nn.Module:
    """Replace every parameter and secret buffer by its sharing (in place; see
    :func:`buffer_is_secret`, overridden by the qualified buffer names in ``public`` and
    ``secret``); eval-mode batch norm is folded into a per-channel scale and shift first
    (the model owner knows them). A parameter tied to several modules (a language model's
    input and output embeddings) is shared once, and stays tied."""
    public, secret = public or set(), secret or set()
    names = {n for n, _ in model.named_buffers(remove_duplicate=False)}
    unknown = sorted((public | secret) - names)
    if unknown:
        raise MPCError(f"the model has no buffer(s) {unknown} (see model.named_buffers())")
    both = sorted(public & secret)
    if both:
        raise MPCError(f"buffer(s) {both} are named both public and shared")
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not m.training:
            _fold_batch_norm(m)
        _fuse_activation(m)
    done: dict[int, Any] = {}  # id of a plain tensor -> its sharing (tied weights)
    for prefix, m in model.named_modules(remove_duplicate=False):
        for name, p in list(m._parameters.items()):
            if p is None or isinstance(p, SharedTensor):
                continue
            if id(p) not in done:
                shared = nn.Parameter(
                    share_tensor(p.detach(), session), requires_grad=p.requires_grad
                )
                # (nn.Parameter of a tensor subclass is that subclass's own instance)
                done[id(p)] = track_grad(cast(SharedTensor, shared))
                mark_fixed(done[id(p)])  # its products keep one mask (mpc.protocols.weights)
            m._parameters[name] = done[id(p)]
        for name, b in list(m._buffers.items()):
            if b is None or isinstance(b, SharedTensor) or name in _FOLDED:
                continue
            qualified = f"{prefix}.{name}" if prefix else name
            if qualified in public:
                continue
            if qualified in secret or buffer_is_secret(m, name, b):
                if id(b) not in done:
                    done[id(b)] = share_tensor(b, session)
                m._buffers[name] = done[id(b)]
    return model


# Activations that transformers writes out as a formula (a cube, a tanh and products: 23
# rounds on shares) although they are exactly the tanh GELU, which runs fused (6 rounds,
# a quarter of the bytes): such a module of a shared model calls the fused op instead.
# Matched by module and class name (the core library never imports transformers).
_TANH_GELUS = {
    ("transformers.activations", "NewGELUActivation"),
    ("transformers.activations", "FastGELUActivation"),
    ("transformers.activations", "AccurateGELUActivation"),
}


# RMSNorms written as Llama's, weight * x * rsqrt(mean(x^2) + eps) (pow, mean, rsqrt and
# two products: 25 rounds on shares): on shared inputs they call the fused op
# (mpc.ops.norms.rms_norm: 9 rounds, 8 for a decoding step's row)
_RMS_NORMS = {
    ("transformers.models.llama.modeling_llama", "LlamaRMSNorm"),
    ("transformers.models.mistral.modeling_mistral", "MistralRMSNorm"),
    ("transformers.models.qwen2.modeling_qwen2", "Qwen2RMSNorm"),
}


def _tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    return nn.functional.gelu(x, approximate="tanh")


def _fused_rms_norm(m: nn.Module) -> Any:
    plain = m.forward

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        if isinstance(hidden_states, SharedTensor):
            return rms_norm(hidden_states, m.weight, float(cast(float, m.variance_epsilon)))
        return plain(hidden_states)

    return forward


def _fuse_activation(m: nn.Module) -> None:
    kind = (type(m).__module__, type(m).__name__)
    if kind in _TANH_GELUS:
        m.forward = _tanh_gelu  # type: ignore[method-assign]
    elif kind in _RMS_NORMS and not getattr(m.forward, "mpc_fused", False):
        fused = _fused_rms_norm(m)
        fused.mpc_fused = True
        m.forward = fused  # type: ignore[method-assign]


def fuse_activations(model: nn.Module) -> None:
    """Make ``model``'s activations that transformers writes out as the tanh GELU's formula,
    and its Llama-style RMSNorms (on shared inputs), call the fused ops (in place; what
    :func:`share` does to a model it shares). A model its
    owner shares from its worker is fused where its programs are recorded, on both sides."""
    for m in model.modules():
        _fuse_activation(m)


def _fold_batch_norm(bn: nn.modules.batchnorm._BatchNorm) -> None:
    # (running statistics: what an eval-mode batch norm normalises with)
    mean, var = cast(torch.Tensor, bn.running_mean), cast(torch.Tensor, bn.running_var)
    with torch.no_grad():
        inv = torch.rsqrt(var + bn.eps)
        w = bn.weight if bn.weight is not None else torch.ones_like(inv)
        b = bn.bias if bn.bias is not None else torch.zeros_like(inv)
        scale = w * inv
        shift = b - mean * scale
        bn.weight = nn.Parameter(scale.clone(), requires_grad=False)
        bn.bias = nn.Parameter(shift.clone(), requires_grad=False)
        mean.zero_()
        var.fill_(1.0 - bn.eps)
