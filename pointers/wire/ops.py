"""The allow-list of aten ops a worker may run, and op names on the wire.

An op travels as its qualified aten name (``"aten::add.Tensor"``). A worker runs an op only
if that exact overload is in :data:`ALLOWED_OPS`, built from the groups below (grouped by
purpose, like the secure op registry in ``mpc.registry``). Everything else is refused with
a :class:`~pointers.errors.NotAllowedError` that names the op and the rule, in particular:

* every ``_``-prefixed aten internal, except the few listed in :data:`INTERNALS_ALLOWED`
  with the reason each one is needed;
* sparse and quantized ops (a sparse tensor built from unchecked indices writes out of
  bounds; nothing a user or protocol does needs either);
* ops that touch files, devices or raw memory (``from_file``, ``set_``, ``record_stream``,
  ``as_strided``, ``_local_scalar_dense``, ...);
* ops that return uninitialised memory or grow storage (``empty_strided``, ``resize_``,
  ...): another client's freed data could be read from them. The three that torch itself
  sends during training and tracing (``empty.memory_format``, ``empty_like.default``,
  ``new_empty.default``; dropout, for one, is ``empty_like(x).bernoulli_(1 - p)``) resolve
  to a zero-filling form, :data:`ZERO_FILLED`, so no client ever reads memory it did not
  write;
* ``out=`` variants (overloads with a keyword-only output argument), except the listed ones.

A group entry ``name`` allows every overload of ``aten::name`` that returns tensors and
is not an ``out=`` variant; ``"name.overload"`` allows exactly that overload. The list is
the single source of truth: ``tests/test_op_allowlist.py`` walks every aten overload and
checks that exactly these resolve. The sizes an allowed op allocates are not checked here
(the worker's limits apply to what it stores).
"""

from __future__ import annotations

from typing import Any

import torch

from pointers.errors import NotAllowedError


def _entries(text: str) -> tuple[str, ...]:
    """The entries of a group: whitespace-separated, ``#`` comments to the end of a line."""
    return tuple(w for line in text.splitlines() for w in line.partition("#")[0].split())


# Purpose -> entries, one group per purpose (as ``mpc.registry`` groups its handlers); a
# comment says why an op is here where that is not obvious.
ALLOW_GROUPS: dict[str, tuple[str, ...]] = {
    # On values (pointer users, plans) and on int64 ring elements (mpc share arithmetic),
    # with the in-place forms torch.optim's updates use.
    "elementwise arithmetic": _entries("""
        abs abs_ neg neg_ sgn sign
        add add_ sub sub_ rsub mul mul_ div div_          # SGD: add_; momentum: mul_, add_
        floor_divide floor_divide_ remainder remainder_ fmod fmod_
        reciprocal reciprocal_ pow pow_ square sqrt sqrt_ rsqrt rsqrt_
        exp exp_ expm1 log log_ log1p log2 sin cos erf
        floor floor_ ceil ceil_ round round_ trunc trunc_ frac
        clamp clamp_ clamp_min clamp_min_ clamp_max clamp_max_ maximum minimum
        lerp lerp_ addcmul addcmul_ addcdiv addcdiv_      # Adam, AdamW, RMSprop
        maximum.out               # Adam(amsgrad=True): torch.maximum(m, v, out=m)
        nan_to_num where masked_fill masked_fill_ fill_ zero_ copy_
    """),
    # The mpc comparison protocol works on the bits of int64 ring elements.
    "bitwise": _entries("""
        bitwise_and bitwise_and_ bitwise_or bitwise_or_ bitwise_xor bitwise_xor_
        bitwise_not bitwise_not_ bitwise_left_shift bitwise_left_shift_
        bitwise_right_shift bitwise_right_shift_
    """),
    "comparisons and logic": _entries("""
        eq eq_ ne ne_ lt lt_ le le_ gt gt_ ge ge_
        logical_and logical_or logical_xor logical_not isnan isinf isfinite
    """),
    # Losses, metrics, federated averaging's means, the mpc prefix sums.
    "reductions, scans and sorting": _entries("""
        sum mean prod max min amax amin argmax argmin
        std var std_mean var_mean norm linalg_vector_norm logsumexp
        cumsum cumsum_ cumprod all any count_nonzero sort argsort topk
    """),
    # Views stay inside their tensor's storage (as_strided, which can point anywhere in a
    # storage, is not here).
    "shape and view": _entries("""
        view reshape expand expand_as view_as reshape_as
        permute transpose transpose_ t t_ movedim
        squeeze squeeze_ unsqueeze unsqueeze_ flatten unflatten
        select slice narrow split split_with_sizes chunk unbind
        cat stack hstack vstack flip roll repeat
        diagonal tril triu unfold constant_pad_nd
        clone contiguous detach alias type_as
        lift_fresh lift_fresh_copy    # tensor constants in traced plans
        _unsafe_view                  # see INTERNALS_ALLOWED
        _to_copy                      # see INTERNALS_ALLOWED
    """),
    # The CPU kernels check every index against the bounds.
    "indexing": _entries("""
        index index_put index_put_ index_select index_add index_add_
        gather take_along_dim scatter scatter_ scatter_add scatter_add_
    """),
    "linear algebra and convolution": _entries("""
        mm bmm matmul addmm addmm_ addmv mv dot outer addbmm baddbmm linear einsum
        convolution convolution_backward
        conv1d conv2d conv3d conv_transpose1d conv_transpose2d
    """),
    # The forward ops and the backward ops autograd sends when a remote model trains
    # (Linear, Conv, activations, pooling, normalisation, dropout, losses).
    "nn functional and backward": _entries("""
        relu relu_ threshold threshold_ threshold_backward
        leaky_relu leaky_relu_ leaky_relu_backward elu elu_ elu_backward
        gelu gelu_backward silu silu_ silu_backward
        sigmoid sigmoid_ sigmoid_backward tanh tanh_ tanh_backward
        hardtanh hardtanh_ hardtanh_backward softplus softplus_backward
        log_sigmoid_forward log_sigmoid_backward
        _softmax _softmax_backward_data              # see INTERNALS_ALLOWED
        _log_softmax _log_softmax_backward_data      # see INTERNALS_ALLOWED
        max_pool1d max_pool2d max_pool2d_with_indices max_pool2d_with_indices_backward
        avg_pool1d avg_pool2d avg_pool2d_backward adaptive_avg_pool1d adaptive_avg_pool2d
        _adaptive_avg_pool2d _adaptive_avg_pool2d_backward    # see INTERNALS_ALLOWED
        native_batch_norm native_batch_norm_backward
        native_layer_norm native_layer_norm_backward
        native_group_norm native_group_norm_backward
        embedding embedding_dense_backward
        dropout native_dropout native_dropout_backward
        bernoulli bernoulli_          # dropout masks (torch's generator: never for secrets)
        nll_loss_forward nll_loss_backward nll_loss2d_forward nll_loss2d_backward
        mse_loss mse_loss_backward smooth_l1_loss smooth_l1_loss_backward
        huber_loss huber_loss_backward binary_cross_entropy binary_cross_entropy_backward
        binary_cross_entropy_with_logits
    """),
    # Every element initialised; the sizes come from the message.
    "creation": _entries("""
        zeros ones full zeros_like ones_like full_like new_zeros new_ones new_full
        arange linspace eye scalar_tensor
        # Resolved to a zero-filling form (ZERO_FILLED): torch sends them for scratch
        # tensors it then overwrites (dropout is empty_like(x).bernoulli_(1 - p)), plans
        # may hold them, and a worker never hands out memory that another client freed.
        empty.memory_format empty_like.default new_empty.default
    """),
    # Size queries that traced plans with symbolic shapes run at the worker.
    "sizes": _entries("sym_size.int sym_numel.default sym_stride.int"),
}  # fmt: skip

# The ``_``-prefixed ops in the groups above, and why each is needed.
INTERNALS_ALLOWED: dict[str, str] = {
    "_unsafe_view": "reshape, matmul and flatten reach dispatch and plan traces as it",
    "_to_copy": "x.to(dtype), x.float() and friends reach dispatch as it",
    "_softmax": "F.softmax's kernel",
    "_softmax_backward_data": "the gradient of F.softmax",
    "_log_softmax": "F.log_softmax's and F.cross_entropy's kernel",
    "_log_softmax_backward_data": "the gradient of F.log_softmax",
    "_adaptive_avg_pool2d": "the kernel of nn.AdaptiveAvgPool1d/2d",
    "_adaptive_avg_pool2d_backward": "the gradient of nn.AdaptiveAvgPool1d/2d",
}

# Ops that would return uninitialised memory; they resolve to a form that zero-fills.
ZERO_FILLED: frozenset[str] = frozenset(
    {"aten::empty.memory_format", "aten::empty_like.default", "aten::new_empty.default"}
)


def op_name(op: torch._ops.OpOverload) -> str:
    """The wire name of an op overload: ``aten::name.overload``."""
    return f"{op._schema.name}.{op._overloadname}"


def is_out_variant(op: torch._ops.OpOverload) -> bool:
    """Whether an overload writes into a keyword-only output argument (``out=``)."""
    return any(
        a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
        for a in op._schema.arguments
    )


def _returns_tensors(op: torch._ops.OpOverload) -> bool:
    return any("Tensor" in str(r.type) for r in op._schema.returns)


def _expand(entries: tuple[str, ...]) -> set[str]:
    out = set()
    for entry in entries:
        base, _, overload = entry.partition(".")
        packet = getattr(torch.ops.aten, base, None)
        if packet is None:  # not in this torch version (the allow-list test flags it)
            continue
        if overload:
            if overload in packet.overloads():
                out.add(f"aten::{entry}")
            continue
        for ov in packet.overloads():
            op = getattr(packet, ov)
            if _returns_tensors(op) and not is_out_variant(op):
                out.add(op_name(op))
    return out


ALLOWED_OPS: frozenset[str] = frozenset().union(*(_expand(g) for g in ALLOW_GROUPS.values()))


class ZeroFilled:
    """An op that would return uninitialised memory, run so that its result is zeros."""

    __slots__ = ("op",)

    def __init__(self, op: torch._ops.OpOverload) -> None:
        self.op = op

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.op(*args, **kwargs).zero_()  # dense, so every byte it owns is zeroed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.op, name)

    def __repr__(self) -> str:
        return f"ZeroFilled({op_name(self.op)})"


ResolvedOp = torch._ops.OpOverload | ZeroFilled

_EMPTY_FAMILY = frozenset(
    {
        "empty",
        "empty_like",
        "new_empty",
        "empty_strided",
        "new_empty_strided",
        "empty_permuted",
        "resize_",
        "resize_as_",
        "resize_as_sparse_",
    }
)
_RAW_MEMORY = frozenset(
    {
        "from_file",
        "set_",
        "record_stream",
        "as_strided",
        "as_strided_",
        "as_strided_scatter",
        "share_memory_",
        "item",
    }
)
_SPARSE_WORDS = frozenset(
    {"coalesce", "indices", "values", "crow_indices", "col_indices", "ccol_indices"}
)


_NOT_LISTED = "it is not on the list of ops a worker runs"


def refusal_rule(base: str) -> str:
    """The rule that keeps ``aten::base`` off the allow-list, in words."""
    if base in _EMPTY_FAMILY:
        return (
            "ops that return uninitialised memory or resize storage are refused "
            "(empty.memory_format, empty_like and new_empty run zero-filled)"
        )
    if "sparse" in base or base in _SPARSE_WORDS:
        return "sparse ops are refused"
    if "quantiz" in base or base.startswith(("q_", "fake_quant")) or base == "int_repr":
        return "quantized ops are refused"
    if base in _RAW_MEMORY or base == "_local_scalar_dense":
        return "ops that touch files, devices or raw memory are refused"
    if base.startswith("_"):
        return "underscore-prefixed aten internals are refused"
    return _NOT_LISTED


def _lookup(base: str, overload: str) -> torch._ops.OpOverload | None:
    try:
        op = getattr(getattr(torch.ops.aten, base), overload)
    except (AttributeError, RuntimeError):
        return None
    return op if isinstance(op, torch._ops.OpOverload) else None


_resolved: dict[str, ResolvedOp] = {}


def resolve_op(name: str) -> ResolvedOp:
    """Resolve a wire name to a callable aten op overload, enforcing the allow-list.

    Ops in :data:`ZERO_FILLED` resolve to a :class:`ZeroFilled` wrapper."""
    op = _resolved.get(name)
    if op is not None:
        return op
    ns, sep, rest = name.partition("::")
    base, dot, overload = rest.partition(".")
    if ns != "aten" or not sep or not dot or not base or not overload:
        raise NotAllowedError(f"op {name!r} is not an allowed aten op")
    if name not in ALLOWED_OPS:
        known = _lookup(base, overload)
        if known is None:
            raise NotAllowedError(f"unknown op {name!r}")
        rule = refusal_rule(base)
        if rule == _NOT_LISTED and is_out_variant(known):
            rule = "out= variants are refused unless listed"
        raise NotAllowedError(
            f"op {name!r} is refused by the worker's allow-list: {rule} "
            "(pointers/wire/ops.py lists the ops a worker runs)"
        )
    op = getattr(getattr(torch.ops.aten, base), overload)
    resolved: ResolvedOp = ZeroFilled(op) if name in ZERO_FILLED else op
    _resolved[name] = resolved
    return resolved
