"""Tracing a function into a :class:`~pointers.plans.graph.PlanGraph` with ``make_fx``.

``torch.fx.experimental.proxy_tensor.make_fx`` runs the function once below autograd and
records the aten ops it dispatches. Without dynamic sizes the trace runs on (copies of)
the example tensors and every size is baked in; the plan then checks each call's shapes.
With dynamic sizes (``-1`` in ``args_shape``) the trace runs on fake tensors whose
dynamic dims are symbols, so view/reshape/expand arguments become size arithmetic
(``aten::sym_size.int`` plus ``sym::`` nodes) evaluated on each call's real sizes.

Python branches on a dynamic size take the traced path; the shape environment records
them as guards, and the plan turns each guard written in user code (or in
``torch.nn``) into a ``plan::check`` node, so a call that would have taken another path
fails with a clear error instead of running the wrong ops. Guards raised inside torch's
shape-inference internals are dropped: they only choose how an output's strides are
computed, and the worker re-runs each op on the real sizes anyway.

A plan called with a signature (shapes, dtypes, strides) none of its graphs accepts is
traced again for it (:meth:`pointers.Plan._variant_for`): ``mode="fake"`` traces on fake
tensors of that signature, which allocate nothing and compute nothing, and
``own_errors=True`` lets the function's own exception (a shape mismatch inside it)
propagate as it is rather than as a :class:`PlanBuildError`.
"""

from __future__ import annotations

import logging
import operator
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from pointers.errors import NotAllowedError
from pointers.plans.graph import InputSpec, Node, PlanBuildError, PlanGraph
from pointers.wire.ops import op_name, resolve_op
from pointers.wire.serde import Ref

TRACE_SIZE = 4  # the size a dynamic (-1) dim has while tracing

_SYM_TARGETS: dict[Any, str] = {
    operator.add: "sym::add",
    operator.sub: "sym::sub",
    operator.mul: "sym::mul",
    operator.floordiv: "sym::floordiv",
    operator.truediv: "sym::truediv",
    operator.mod: "sym::mod",
    operator.pow: "sym::pow",
    operator.neg: "sym::neg",
    operator.eq: "sym::eq",
    operator.ne: "sym::ne",
    operator.lt: "sym::lt",
    operator.le: "sym::le",
    operator.gt: "sym::gt",
    operator.ge: "sym::ge",
    operator.and_: "sym::and",
    operator.or_: "sym::or",
    operator.not_: "sym::not",
    operator.getitem: "plan::getitem",
}
for _name, _target in (
    ("sym_max", "sym::max"),
    ("sym_min", "sym::min"),
    ("sym_not", "sym::not"),
    ("sym_float", "sym::float"),
    ("sym_int", "sym::int"),
):
    if hasattr(torch, _name):
        _SYM_TARGETS[getattr(torch, _name)] = _target

_LEAVES = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.layout)

Call = Callable[[list[torch.Tensor], list[torch.Tensor]], Any]


def trace_plan(
    call: Call,
    example_args: Sequence[torch.Tensor],
    state: Sequence[torch.Tensor],
    *,
    name: str,
    dynamic_dims: Sequence[Sequence[int]] | None = None,
    arg_names: Sequence[str] | None = None,
    mode: str = "real",
    own_errors: bool = False,
    copy_inputs: bool = True,
) -> PlanGraph:
    """Trace ``call(inputs, state)`` into a plan.

    ``dynamic_dims[k]`` lists the dims of argument ``k`` that may have any size.
    ``arg_names`` name the arguments in error messages. ``mode="fake"``: trace on fake
    tensors with the examples' shapes, strides and dtypes (the examples may be meta
    tensors; no dynamic dims). ``own_errors``: an exception the function raises (other
    than a read of a tensor's value) propagates unchanged. ``copy_inputs=False``: a real
    trace runs on the examples themselves (fresh tensors the caller made for it).
    """
    n_in = len(example_args)
    for k, a in enumerate(example_args):
        if not isinstance(a, torch.Tensor) or type(a) is not torch.Tensor:
            raise PlanBuildError(
                f"plan {name!r}: build argument {k} must be a local tensor, got {type(a).__name__}"
            )
    if mode not in ("real", "fake") or (mode == "fake" and dynamic_dims):
        raise ValueError("mode is 'real' or 'fake' (and a fake trace has no dynamic dims)")
    dyn = [set(d) for d in dynamic_dims] if dynamic_dims else [set() for _ in example_args]
    if len(dyn) != n_in:
        raise PlanBuildError(f"plan {name!r}: dynamic_dims must have one entry per argument")
    for k, (a, dims) in enumerate(zip(example_args, dyn)):
        if any(type(d) is not int or not 0 <= d < a.dim() for d in dims):
            raise PlanBuildError(
                f"plan {name!r}: dynamic dims {sorted(dims)} of argument {k} "
                f"do not fit its {a.dim()} dims"
            )
    names = list(arg_names or [])
    names += [f"arg{k}" for k in range(len(names), n_in)]

    def flat(*tensors: torch.Tensor) -> Any:
        return call(list(tensors[:n_in]), list(tensors[n_in:]))

    state_copies = [s.detach().clone() for s in state]
    env = None
    try:
        from torch.fx.experimental.proxy_tensor import make_fx

        if mode == "fake":
            with _quiet_fake_tensor_log():
                gm = make_fx(flat, tracing_mode="fake")(*_fake_static(example_args, state))
        elif any(dyn):
            env, fakes = _fake_inputs(example_args, dyn, state_copies)
            with _quiet_fake_tensor_log():
                gm = make_fx(flat, tracing_mode="symbolic")(*fakes)
        else:
            inputs = [a.detach().clone() for a in example_args] if copy_inputs else example_args
            gm = make_fx(flat, tracing_mode="real")(*inputs, *state_copies)
    except PlanBuildError:
        raise
    except Exception as e:
        error = _trace_error(name, e)
        if own_errors and not error.data_dependent:
            raise  # the function's own error, as an eager call raises it
        raise error from e
    specs = [
        InputSpec(tuple(None if d in dims else s for d, s in enumerate(a.shape)), a.dtype)
        for a, dims in zip(example_args, dyn)
    ]
    return _Converter(gm, name, specs, [s.detach() for s in state], env, names).convert()


def _fake_inputs(
    example_args: Sequence[torch.Tensor],
    dyn: list[set[int]],
    state: Sequence[torch.Tensor],
) -> tuple[Any, list[torch.Tensor]]:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    env = ShapeEnv(duck_shape=False)
    mode = FakeTensorMode(shape_env=env, static_shapes=False, allow_non_fake_inputs=True)

    def fake(t: torch.Tensor, dims: set[int]) -> torch.Tensor:
        if dims:  # a dynamic dim is traced at a size that is not 0 or 1 (those specialise)
            t = torch.zeros(
                [max(s, 2) if d in dims else s for d, s in enumerate(t.shape)], dtype=t.dtype
            )
        ctx: Any = StatelessSymbolicContext(
            dynamic_sizes=[
                DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(t.dim())
            ]
        )
        return mode.from_tensor(t, symbolic_context=ctx)

    fakes = [fake(a.detach(), dims) for a, dims in zip(example_args, dyn)]
    fakes += [fake(s, set()) for s in state]
    return env, fakes


def _fake_static(examples: Sequence[torch.Tensor], state: Sequence[torch.Tensor]) -> list[Any]:
    """Fake tensors with the examples' shapes, strides and dtypes (on the CPU), and the
    state's: nothing is allocated or computed while tracing on them."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        fakes = [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype) for a in examples]
    return fakes + [mode.from_tensor(s.detach()) for s in state]


class _QuietFilter(logging.Filter):
    """Drops the fake-tensor module's log of a failing op in a thread that traces a plan
    (the failure is raised to the caller anyway; the log would only repeat it)."""

    def __init__(self) -> None:
        super().__init__()
        self.local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(self.local, "quiet", False)


_QUIET = _QuietFilter()
logging.getLogger("torch._subclasses.fake_tensor").addFilter(_QUIET)


class _quiet_fake_tensor_log:  # noqa: N801 - used as a context manager
    def __enter__(self) -> None:
        self.before = getattr(_QUIET.local, "quiet", False)
        _QUIET.local.quiet = True

    def __exit__(self, *exc: Any) -> None:
        _QUIET.local.quiet = self.before


def _trace_error(name: str, e: Exception) -> PlanBuildError:
    text = f"{type(e).__name__}: {e}"
    lowered = text.lower()
    if "_local_scalar_dense" in text or "data-dependent" in lowered or "data dependent" in lowered:
        error = PlanBuildError(
            f"plan {name!r} reads a tensor's value while it is traced (an `if` or loop on "
            "tensor data, .item(), bool(tensor), or a comparison used as a Python value). "
            "A plan records tensor ops, not Python decisions on data: use torch.where or a "
            f"mask instead. (torch raised {type(e).__name__})"
        )
        error.data_dependent = True
        return error
    return PlanBuildError(f"tracing plan {name!r} failed: {text[:2000]}")


class _Converter:
    """One fx graph -> PlanGraph: slots, guards, dead-code removal, allow-list checks."""

    def __init__(
        self,
        gm: fx.GraphModule,
        name: str,
        specs: list[InputSpec],
        state: list[torch.Tensor],
        env: Any,
        arg_names: list[str],
    ) -> None:
        self.gm = gm
        self.name = name
        self.specs = specs
        self.state = state
        self.n_state = len(state)
        self.env = env
        self.arg_names = arg_names
        self.slot: dict[fx.Node, int] = {}
        self.tensors: list[torch.Tensor] = []
        self.nodes: list[Node] = []
        self.first_node = 0
        self._dim_slot: dict[tuple[int, int], int] = {}

    def convert(self) -> PlanGraph:
        graph = self.gm.graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        n_in = len(self.specs)
        if len(placeholders) != n_in + self.n_state:
            raise PlanBuildError(f"plan {self.name!r}: the trace has an unexpected signature")
        for k, ph in enumerate(placeholders):
            self.slot[ph] = k
        output = next(n for n in graph.nodes if n.op == "output")
        live = self._live(graph, output)
        self.tensors = list(self.state)
        seen: dict[int, int] = {}
        for node in graph.nodes:
            if node.op == "get_attr" and node in live:
                value = _get_attr(self.gm, str(node.target))
                if not isinstance(value, torch.Tensor):
                    raise PlanBuildError(
                        f"plan {self.name!r} uses {type(value).__name__} {node.target!r}; "
                        "a plan holds only tensor constants"
                    )
                if id(value) not in seen:
                    if (
                        value.device.type == "meta"
                        or type(value) is not torch.Tensor
                        and not (isinstance(value, torch.nn.Parameter))
                    ):
                        raise PlanBuildError(
                            f"plan {self.name!r} captured a {type(value).__name__} constant "
                            f"{node.target!r} without data; pass it as state instead"
                        )
                    seen[id(value)] = n_in + len(self.tensors)
                    self.tensors.append(value.detach().clone())  # a plan is a snapshot
                self.slot[node] = seen[id(value)]
        self.first_node = n_in + len(self.tensors)
        if self.env is not None:
            self._emit_guards(placeholders[:n_in])
        for node in graph.nodes:
            if node.op == "call_function" and node in live:
                target = self._target(node)
                args = tuple(self._arg(a) for a in node.args)
                kwargs = {k: self._arg(v) for k, v in node.kwargs.items()}
                self.slot[node] = self._append(Node(target, args, kwargs))
            elif node.op == "call_module" or node.op == "call_method":
                raise PlanBuildError(f"plan {self.name!r}: unexpected {node.op} in the trace")
        result = output.args[0]
        tuple_output = isinstance(result, tuple | list)
        items = list(result) if tuple_output else [result]
        outputs = []
        for k, item in enumerate(items):
            val = item.meta.get("val") if isinstance(item, fx.Node) else item
            if not isinstance(item, fx.Node) or not isinstance(val, torch.Tensor | type(None)):
                raise PlanBuildError(
                    f"plan {self.name!r} returns a value of type {type(val).__name__} at output {k}; a plan "
                    "returns a tensor or a tuple of tensors"
                )
            outputs.append(self.slot[item])
        if not outputs:
            raise PlanBuildError(f"plan {self.name!r} returns nothing; a plan returns tensors")
        return PlanGraph(
            self.name, self.specs, self.n_state, self.tensors, self.nodes, outputs, tuple_output
        )

    def _append(self, node: Node) -> int:
        self.nodes.append(node)
        return self.first_node + len(self.nodes) - 1

    @staticmethod
    def _live(graph: fx.Graph, output: fx.Node) -> set[fx.Node]:
        live: set[fx.Node] = set()
        for node in reversed(graph.nodes):
            impure = (
                node.op == "call_function"
                and isinstance(node.target, torch._ops.OpOverload)
                and node.target._schema.is_mutable
            )
            if node is output or impure or any(u in live for u in node.users):
                live.add(node)
        return live

    def _target(self, node: fx.Node) -> str:
        t = node.target
        if isinstance(t, torch._ops.OpOverload):
            wire = op_name(t)
            try:
                resolve_op(wire)
            except NotAllowedError as e:
                raise PlanBuildError(
                    f"plan {self.name!r} uses the op {wire!r}, which workers do not allow: {e}"
                ) from e
            return wire
        sym = _SYM_TARGETS.get(t)
        if sym is not None:
            return sym
        shown = getattr(t, "__qualname__", None) or repr(t)
        raise PlanBuildError(
            f"plan {self.name!r} calls {shown}, which a plan cannot hold (a plan holds aten "
            "ops and size arithmetic)"
        )

    def _arg(self, a: Any) -> Any:
        if isinstance(a, fx.Node):
            return Ref(self.slot[a])
        if isinstance(a, torch.Size):
            return [int(s) for s in a]
        if isinstance(a, tuple):
            return tuple(self._arg(x) for x in a)
        if isinstance(a, list):
            return [self._arg(x) for x in a]
        if isinstance(a, torch.memory_format) or type(a) in _LEAVES:
            return a
        raise PlanBuildError(
            f"plan {self.name!r}: an op argument of type {type(a).__name__} cannot be stored "
            "in a plan"
        )

    # -- guards ------------------------------------------------------------------------------
    def _emit_guards(self, inputs: list[fx.Node]) -> None:
        import sympy

        self._symbols: dict[Any, tuple[int, int]] = {}
        for i, ph in enumerate(inputs):
            val = ph.meta.get("val")
            for d, s in enumerate(getattr(val, "shape", ())):
                expr = getattr(getattr(s, "node", None), "expr", None)
                if isinstance(expr, sympy.Symbol):
                    self._symbols.setdefault(expr, (i, d))
        conditions: list[tuple[Any, str]] = []
        for sym, expr in getattr(self.env, "replacements", {}).items():
            if sym in self._symbols:
                conditions.append((sympy.Eq(sym, expr), "the trace treated this size as fixed"))
        for guard in getattr(self.env, "guards", []):
            where = _user_location(guard)
            if where is not None:
                conditions.append((guard.expr, f"a branch at {where}"))
        done: set[str] = set()
        for cond, why in conditions:
            if cond is sympy.true or str(cond) in done:
                continue
            done.add(str(cond))
            pretty = self._pretty(cond)
            ref = self._emit(cond, pretty)
            message = (
                f"plan {self.name!r} was traced assuming {pretty} ({why}); this call's sizes "
                "break that assumption, so the traced ops would not match (a plan that has "
                "its Python function is traced again for such sizes)"
            )
            self._append(Node("plan::check", (ref, message), {}))

    def _pretty(self, expr: Any) -> str:
        import sympy

        names = {
            s: sympy.Symbol(f"{self.arg_names[i]}.shape[{d}]")
            for s, (i, d) in self._symbols.items()
        }
        return str(expr.xreplace(names))

    def _emit(self, e: Any, pretty: str) -> Any:
        import sympy
        from torch.utils._sympy import functions as tf

        if e is sympy.true or e is sympy.false:
            return bool(e)
        if isinstance(e, sympy.Integer):
            return int(e)
        if isinstance(e, sympy.Symbol):
            if e not in self._symbols:
                raise PlanBuildError(
                    f"plan {self.name!r} relies on {pretty}, which involves a size that is "
                    "not an input size; a plan cannot check it"
                )
            key = self._symbols[e]
            if key not in self._dim_slot:
                self._dim_slot[key] = self._append(
                    Node("aten::sym_size.int", (Ref(key[0]), key[1]), {})
                )
            return Ref(self._dim_slot[key])
        folds: list[tuple[Any, str]] = [
            (sympy.Add, "sym::add"),
            (sympy.Mul, "sym::mul"),
            (sympy.And, "sym::and"),
            (sympy.Or, "sym::or"),
            (sympy.Max, "sym::max"),
            (sympy.Min, "sym::min"),
            (getattr(tf, "Max", sympy.Max), "sym::max"),
            (getattr(tf, "Min", sympy.Min), "sym::min"),
        ]
        binary: list[tuple[Any, str]] = [
            (sympy.Eq, "sym::eq"),
            (sympy.Ne, "sym::ne"),
            (sympy.StrictLessThan, "sym::lt"),
            (sympy.LessThan, "sym::le"),
            (sympy.StrictGreaterThan, "sym::gt"),
            (sympy.GreaterThan, "sym::ge"),
            (tf.FloorDiv, "sym::floordiv"),
            (sympy.Mod, "sym::mod"),
            (getattr(tf, "Mod", sympy.Mod), "sym::mod"),
            (getattr(tf, "PythonMod", sympy.Mod), "sym::mod"),
        ]
        for cls, target in folds:
            if isinstance(e, cls):
                acc = self._emit(e.args[0], pretty)
                for a in e.args[1:]:
                    acc = Ref(self._append(Node(target, (acc, self._emit(a, pretty)), {})))
                return acc
        for cls, target in binary:
            if isinstance(e, cls) and len(e.args) == 2:
                a, b = (self._emit(x, pretty) for x in e.args)
                return Ref(self._append(Node(target, (a, b), {})))
        if isinstance(e, sympy.Not):
            return Ref(self._append(Node("sym::not", (self._emit(e.args[0], pretty),), {})))
        if isinstance(e, sympy.Pow) and isinstance(e.exp, sympy.Integer) and e.exp >= 0:
            a, b = self._emit(e.base, pretty), int(e.exp)
            return Ref(self._append(Node("sym::pow", (a, b), {})))
        raise PlanBuildError(
            f"plan {self.name!r} relies on the size condition {pretty}, which a plan cannot "
            "check; avoid branching on sizes that vary, or fix them in args_shape"
        )


def _get_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_USER_LEVEL_TORCH = (
    os.path.join(_TORCH_DIR, "nn") + os.sep,
    os.path.join(_TORCH_DIR, "functional.py"),
)


def _user_location(guard: Any) -> str | None:
    """Where a guard comes from, if that is code whose branches shape the trace (user code
    or torch.nn); None for torch's shape-inference internals."""
    frame = getattr(getattr(guard, "sloc", None), "framework_loc", None)
    filename = getattr(frame, "filename", None)
    if filename is None:
        return "an unknown location"
    if filename.startswith(_TORCH_DIR) and not filename.startswith(_USER_LEVEL_TORCH):
        return None
    return f"{os.path.basename(filename)}:{getattr(frame, 'lineno', '?')}"
