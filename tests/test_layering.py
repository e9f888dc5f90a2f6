"""The layers import only downwards (docs/index.md has the map):

- ``pointers`` never imports ``mpc``;
- ``mpc.math`` (ring, prg, encoding, bits) imports neither ``pointers`` nor the rest of ``mpc``;
- importing ``pointers`` loads neither ``mpc`` nor the federated application layer, nor
  gRPC (network workers load on first use);
- ``pointers``' modules stand in one order (:data:`POINTERS_ORDER`, lowest first): each
  imports only modules below it, at module level and in ``if TYPE_CHECKING:`` blocks alike,
  and inside functions too; no import circles;
- ``mpc``'s modules stand in layers (:data:`MPC_LAYERS`): the math, the protocol steps
  that run at the workers, the session, the client side of the protocols and shared
  tensors, then the ops and the user-facing modules; each imports only from its layer and
  those below it, with no import circles; a step at a worker imports of ``pointers`` only
  what a worker gives it;
- no module imports a private name (``_name``) of another module, but a package's private
  submodule from inside the package;
- nothing is injected at import time: a module-level call (an import-time side effect)
  stands only in the few places :data:`IMPORT_TIME_CALLS` names.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", _modules("pointers"), ids=lambda p: str(p.relative_to(ROOT)))
def test_pointers_never_imports_mpc(path: Path) -> None:
    bad = sorted(m for m in _imports(path) if m == "mpc" or m.startswith("mpc."))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


@pytest.mark.parametrize("path", _modules("mpc/math"), ids=lambda p: str(p.relative_to(ROOT)))
def test_mpc_math_imports_no_pointers_and_no_protocols(path: Path) -> None:
    bad = sorted(
        m
        for m in _imports(path)
        if m == "pointers"
        or m.startswith("pointers.")
        or (m.startswith("mpc") and not m.startswith("mpc.math") and m != "mpc")
    )
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_importing_pointers_loads_only_its_core() -> None:
    code = (
        "import sys, pointers\n"
        "loaded = [m for m in sys.modules if m == 'mpc' or m.startswith('mpc.')"
        " or m.startswith('pointers.federated') or m.startswith('grpc')]\n"
        "print(loaded)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# -- the order of pointers' modules ---------------------------------------------------------
#: ``pointers``' modules, lowest first: a module imports only modules before it in this list.
#: This holds for every import at module level, ``if TYPE_CHECKING:`` blocks included (a
#: type a lower module needs from a higher one is a ``typing.Protocol`` of its own), and
#: inside functions (a lazy import would otherwise hide a circle). What a lower module
#: calls above it is handed in (``pointer_tensor.use_chains``, by ``pointers/__init__``). The
#: package ``__init__`` modules stand after their submodules (they re-export them).
POINTERS_ORDER = [
    "pointers.errors",
    "pointers.worker.faults",  # (tests' cheating parties: errors and torch only)
    # the wire: messages, serialisation, the op allow-list
    "pointers.wire.serde",
    "pointers.wire.files",
    "pointers.wire.ops",
    "pointers.wire.messages",
    "pointers.wire",
    # plans as data (the graph, tracing, its wire form)
    "pointers.plans.graph",
    "pointers.plans.trace",
    "pointers.plans.wire",
    # what a worker is made of, and what its clients see of it
    "pointers.worker.memory",
    "pointers.worker.sealing",
    "pointers.worker.policy",
    "pointers.worker.holding",
    "pointers.worker.owners",
    "pointers.worker.store",
    "pointers.worker.functions",
    "pointers.worker.execution",
    "pointers.worker.client",
    "pointers.worker.program",
    # pointers (to any WorkerClient)
    "pointers.pointer_tensor",
    # in-process workers
    "pointers.worker.base",
    "pointers.worker.lanes",
    "pointers.worker.chains",
    "pointers.worker",
    # the user-facing layers
    "pointers.module",
    "pointers.plans.pointer_plan",
    "pointers.plans.plan",
    "pointers.plans.protocol",
    "pointers.plans",
    "pointers.federated.datasets",
    "pointers.federated.fedavg",
    "pointers.compat",
    "pointers.hook",
    "pointers.federated.floptimizer",
    "pointers.federated",
    "pointers.pysyft_sandbox",
    # network workers (the order within is the package docstring's)
    "pointers.network.certs",
    "pointers.network.transport",
    "pointers.network.framing",
    "pointers.network.context",
    "pointers.network.lease",
    "pointers.network.replies",
    "pointers.network.calls",
    "pointers.network.connection",
    "pointers.network.client",
    "pointers.network.config",
    "pointers.network.limits",
    "pointers.network.quotas",
    "pointers.network.nslock",
    "pointers.network.waiting",
    "pointers.network.served",
    "pointers.network.data_frames",
    "pointers.network.dataplane",
    "pointers.network.peerlink",
    "pointers.network.peers",
    "pointers.network.sessions",
    "pointers.network.server",
    "pointers.network.cluster",
    "pointers.network",
    "pointers",
    "pointers.__main__",
    "pointers.demo",
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


_POINTERS = {_module_name(p): p for p in _modules("pointers")}


def _resolve(name: str) -> str | None:
    """The ``pointers`` module an imported name belongs to (None: outside pointers)."""
    while name and name not in _POINTERS:
        name = name.rpartition(".")[0]
    return name or None


def _split_imports(path: Path) -> tuple[set[str], set[str]]:
    """The ``pointers`` modules ``path`` imports at module level (``if TYPE_CHECKING:``
    blocks included), and those it imports inside functions only."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top: set[str] = set()
    lazy: set[str] = set()

    def names(node: ast.Import | ast.ImportFrom) -> set[str]:
        if isinstance(node, ast.Import):
            found = {_resolve(a.name) for a in node.names}
        else:
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            # ``from pointers import compat`` imports the module pointers.compat
            found = {_resolve(f"{base}.{a.name}") for a in node.names}
        return {m for m in found if m is not None and m != module}

    def visit(nodes: list[ast.stmt], in_function: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                (lazy if in_function else top).update(names(node))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(node.body, True)
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    children = getattr(node, field, None)
                    if isinstance(children, list):
                        visit(
                            [c for c in children if isinstance(c, ast.stmt | ast.excepthandler)],
                            in_function,
                        )

    visit(ast.parse(path.read_text()).body, False)
    return top, lazy - top


def test_the_order_names_every_pointers_module_once() -> None:
    assert len(POINTERS_ORDER) == len(set(POINTERS_ORDER))
    assert set(POINTERS_ORDER) == set(_POINTERS), (
        f"missing from POINTERS_ORDER: {sorted(set(_POINTERS) - set(POINTERS_ORDER))}; "
        f"not modules: {sorted(set(POINTERS_ORDER) - set(_POINTERS))}"
    )


@pytest.mark.parametrize("module", POINTERS_ORDER)
def test_pointers_modules_import_only_downwards(module: str) -> None:
    rank = {m: k for k, m in enumerate(POINTERS_ORDER)}
    top, lazy = _split_imports(_POINTERS[module])
    up = sorted(m for m in top if rank[m] > rank[module])
    assert not up, f"{module} imports {up}, above it in POINTERS_ORDER"
    lazy_up = sorted(m for m in lazy if rank[m] > rank[module])
    assert not lazy_up, f"{module} imports {lazy_up} inside a function, above it in the order"


def _assert_no_circle(graph: dict[str, set[str]]) -> None:
    """Fail naming the first import circle of ``graph`` (module -> the modules it imports)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circle = path[path.index(nxt) :] + [nxt]
                raise AssertionError(f"import circle: {' -> '.join(circle)}")
            if nxt not in state:
                walk(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module, [module])


def test_pointers_has_no_import_circles() -> None:
    """No circle among all imports: module-level (``TYPE_CHECKING`` included) and lazy."""
    graph: dict[str, set[str]] = {}
    for module, path in _POINTERS.items():
        top, lazy = _split_imports(path)
        graph[module] = top | lazy
    _assert_no_circle(graph)


def test_mpc_ops_has_no_import_circles() -> None:
    """The op implementations (``mpc/ops``) import each other without a circle, lazy
    imports included: shared helpers live in modules below the ops that use them
    (common, masking, local, then bilinear and backward, nonlinear, functions, ...)."""
    ops = {_module_name(p): p for p in _modules("mpc/ops") if p.name != "__init__.py"}
    graph = {
        m: {n for n in ops if n != m and any(i == n or i.startswith(n + ".") for i in _imports(p))}
        for m, p in ops.items()
    }
    _assert_no_circle(graph)


# -- mpc's layers ----------------------------------------------------------------------------


def _is_step_module(module: str) -> bool:
    """A module of the protocol steps that run at the workers (and what they are built
    of): :mod:`mpc.protocols.step` and its helpers, each protocol's ``steps`` (and the
    comparison's selections, its public thresholds and its arithmetic last level, FSS's ReLU), the table of all
    steps, ``mpc.material``."""
    parts = module.split(".")
    if parts[:2] == ["mpc", "material"] or module == "mpc.protocols":
        return True  # (the packages' __init__ modules of mpc.protocols hold docstrings)
    if parts[:2] == ["mpc", "protocols"] and _MPC[module].name == "__init__.py":
        return True
    if parts[:2] != ["mpc", "protocols"] or len(parts) < 3:
        return False
    if len(parts) == 3:
        return parts[2] in ("step", "streams", "rules", "sizes", "functions")
    return parts[-1] == "steps" or module in (
        "mpc.protocols.comparison.selection",
        "mpc.protocols.comparison.thresholds",
        "mpc.protocols.comparison.arith",
        "mpc.protocols.comparison.arith_select",
        "mpc.protocols.fss.relu",
        "mpc.protocols.fss.trunc_select",
    )


#: ``mpc``'s layers, lowest first (the first that holds a module is its layer; the last
#: holds all others): a module imports only from its own layer and those below it.
MPC_LAYERS: list[tuple[str, Callable[[str], bool]]] = [
    # the arithmetic: no pointers, no protocols (and the errors and the config)
    ("math", lambda m: m in ("mpc.errors", "mpc.config") or m.startswith("mpc.math")),
    # what runs at the workers: the protocol steps, declared once each
    ("steps", _is_step_module),
    # a group of parties and its seeds; the rounds and bytes; the op table
    ("session", lambda m: m in ("mpc.accounting", "mpc.registry", "mpc.session")),
    # the client side: each protocol's run, and the shared tensor they make
    ("runs", lambda m: m.startswith("mpc.protocols") or m == "mpc.shared"),
    # the ops on shared tensors and everything users call
    ("above", lambda m: True),
]

#: import edges that close a circle in modules their owners are rewriting (each to go):
#: mpc.hf imports mpc.generation.generate inside a function (which builds on mpc.hf);
#: mpc.crypten.mpc imports the package ``mpc.crypten`` (its init) inside a function
MPC_CIRCLE_EDGES_ALLOWED = {
    ("mpc.crypten.mpc", "mpc.crypten"),
}

_MPC = {_module_name(p): p for p in _modules("mpc")}
_ALL = {**_POINTERS, **_MPC}


def _layer(module: str) -> int:
    return next(k for k, (_, holds) in enumerate(MPC_LAYERS) if holds(module))


def _resolve_in(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported_modules(path: Path) -> set[str]:
    """The modules of ``mpc`` and ``pointers`` that ``path`` imports anywhere (module
    level, functions, type checking blocks): ``from package import submodule`` counts the
    submodule, ``from module import name`` the module."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(_resolve_in(a.name, _ALL) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            out.update(_resolve_in(f"{base}.{a.name}", _ALL) for a in node.names)
    return {m for m in out if m is not None and m != module}


def _mpc_imports(module: str) -> set[str]:
    """The ``mpc`` modules ``module`` imports anywhere (its package ``mpc`` aside)."""
    return {m for m in _imported_modules(_MPC[module]) if m.startswith("mpc.")}


@pytest.mark.parametrize("module", sorted(_MPC))
def test_mpc_modules_import_only_their_layer_and_below(module: str) -> None:
    rank = _layer(module)
    up = sorted(m for m in _mpc_imports(module) if _layer(m) > rank)
    assert not up, f"{module} (layer {MPC_LAYERS[rank][0]!r}) imports {up}, above it in MPC_LAYERS"


def test_mpc_has_no_import_circles() -> None:
    stale = sorted(e for e in MPC_CIRCLE_EDGES_ALLOWED if e[1] not in _mpc_imports(e[0]))
    assert not stale, f"MPC_CIRCLE_EDGES_ALLOWED names imports that are gone: {stale}"
    graph = {
        m: {n for n in _mpc_imports(m) if (m, n) not in MPC_CIRCLE_EDGES_ALLOWED} for m in _MPC
    }
    _assert_no_circle(graph)


#: what a protocol step may use of ``pointers``: what a worker gives a registered function
STEP_POINTERS = {
    "pointers.errors",
    "pointers.worker.functions",
    "pointers.worker.sealing",
    "pointers.worker.policy",
    "pointers.worker.holding",
}


@pytest.mark.parametrize("module", sorted(m for m in _MPC if _layer(m) <= 1))
def test_a_step_uses_of_pointers_only_what_a_worker_gives_it(module: str) -> None:
    found = {m for m in _imported_modules(_MPC[module]) if m.split(".")[0] == "pointers"}
    bad = sorted(m for m in found if m not in STEP_POINTERS)
    assert not bad, f"{module} runs at the workers but imports {bad}"


# -- private names ---------------------------------------------------------------------------


def _private_imports(path: Path) -> list[str]:
    """``from X import _name`` in ``path`` where ``_name`` is not a submodule of a package
    ``path`` belongs to (a package's private module is its own)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            up = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(up + ([node.module] if node.module else []))
        for a in node.names:
            if not a.name.startswith("_") or a.name.startswith("__"):
                continue
            sub = f"{base}.{a.name}"
            if sub in _ALL and (module == base or module.startswith(base + ".")):
                continue  # (a private submodule, imported inside its package)
            out.append(f"{a.name} from {base}")
    return out


@pytest.mark.parametrize(
    "path", _modules("pointers") + _modules("mpc"), ids=lambda p: str(p.relative_to(ROOT))
)
def test_no_private_name_is_imported_from_another_module(path: Path) -> None:
    bad = _private_imports(path)
    assert not bad, f"{path.relative_to(ROOT)} imports private names: {bad}"


# -- import-time side effects ----------------------------------------------------------------

#: the modules that may call something at module level, and why: nothing else runs code
#: as it is imported (a registration happens here, in the package's ``__init__``, or is
#: handed in explicitly)
IMPORT_TIME_CALLS = {
    # pointers hands a pointer's chain methods down to pointers.pointer_tensor (from
    # pointers.worker.chains, above it) and adds PySyft 0.2's names
    "pointers/__init__.py": {"use_chains", "_install_compat"},
    # gRPC's and torch's logging, quieted once
    "pointers/network/__init__.py": {"_quiet_grpc_core"},
    "pointers/plans/trace.py": {"logging.getLogger"},
    # the sizes of the two steps declared by hand (an owner's release, secure aggregation)
    "mpc/protocols/functions.py": {"sizes.declare"},
    "mpc/secure_aggregation.py": {"declare"},
}


def _module_level_calls(path: Path) -> set[str]:
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            f = node.value.func
            while isinstance(f, ast.Call):
                f = f.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call):
                f = f.value.func  # (logging.getLogger(...).addFilter(...))
            out.add(ast.unparse(f))
    return out


@pytest.mark.parametrize(
    "path", _modules("pointers") + _modules("mpc"), ids=lambda p: str(p.relative_to(ROOT))
)
def test_nothing_is_injected_at_import_time(path: Path) -> None:
    allowed = IMPORT_TIME_CALLS.get(str(path.relative_to(ROOT)), set())
    calls = _module_level_calls(path) - allowed
    assert not calls, (
        f"{path.relative_to(ROOT)} calls {sorted(calls)} as it is imported: pass what a "
        "lower module needs in explicitly, or register it in its package's __init__ "
        "(IMPORT_TIME_CALLS)"
    )
