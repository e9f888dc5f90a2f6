"""Where a transformer's rounds go: the rounds of each forward pass of a shared model, by
module kind (attention, layer norm, MLP, and the rest: the embedding's product, the LM
head and the argmax after it), and the dealer's material likewise.

Rounds and the dealer's material (``dealt``) are counted by the client as the protocols
run (:mod:`mpc.accounting`), also while
a program is recorded, so the hooks below see them whichever way the model runs: op by op,
or recorded into programs (a generation's step is recorded on its first run, or on
stand-ins for a held model, with the same rounds as every later run of it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch import nn

import mpc

KINDS = ("attention", "layer norm", "MLP")
REST = "embedding, head and argmax"


def kind_of(module: nn.Module) -> str | None:
    """The kind a module's rounds count under (by its class name: GPT-2's, BERT's and
    Llama's modules; BERT's ``Intermediate`` and ``Output`` are its MLP), None for a module
    whose rounds count with its parent's."""
    name = type(module).__name__
    if name.endswith(("Attention", "SelfOutput")):  # (BERT's attention output: its dense)
        return "attention"
    if "LayerNorm" in name or name.endswith("RMSNorm"):
        return "layer norm"
    if name.endswith(("MLP", "Intermediate", "Output")):
        return "MLP"
    return None


@dataclass
class Pass:
    """The rounds of one forward pass of the model by module kind, and the bytes of the
    dealer's material: by kind, and in all from the pass's start to the block's end (the
    pass and what follows it: a generation's step records its LM head and argmax after
    the pass)."""

    by_kind: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    dealt_by_kind: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    dealt: int = 0

    def table(self, total: int) -> dict[str, int]:
        """Rounds by kind, of ``total`` (what one run of the computation took: the pass
        and what surrounds it, such as the embedding's product before it and the argmax
        after it) the rest under :data:`REST`, and ``"total"``."""
        rest = total - sum(self.by_kind.values())
        if rest < 0:
            raise ValueError(f"the pass alone took more than {total} rounds")
        return {**self.by_kind, REST: rest, "total": total}

    def dealt_table(self) -> dict[str, int]:
        """The dealer's bytes by kind, the rest (from the pass's start to the block's end)
        under :data:`REST`, and ``"total"``."""
        return {
            **self.dealt_by_kind,
            REST: self.dealt - sum(self.dealt_by_kind.values()),
            "total": self.dealt,
        }


@dataclass
class Breakdown:
    passes: list[Pass] = field(default_factory=list)

    @property
    def last(self) -> Pass:
        """The last pass (a generation's step, recorded after its prefill)."""
        if not self.passes:
            raise ValueError("no forward pass of the model ran")
        return self.passes[-1]


@contextmanager
def by_module(model: nn.Module) -> Iterator[Breakdown]:
    """Inside the block, count the rounds of each forward pass of ``model`` by module kind
    (:func:`kind_of`). A module's rounds count under the innermost kind that holds them (a
    layer norm inside BERT's attention output counts as a layer norm)."""
    out = Breakdown()
    # per open module: [kind, rounds and dealt at its start, its children's rounds, dealt]
    stack: list[list[Any]] = []
    hooks: list[Any] = []
    began_dealt: list[int] = []  # per pass: the recorder's dealt at its start
    with mpc.stats() as rec:

        def model_pre(module: nn.Module, *args: Any, **kwargs: Any) -> None:
            out.passes.append(Pass())
            began_dealt.append(rec.dealt)

        def pre(module: nn.Module, *args: Any, **kwargs: Any) -> None:
            stack.append([kind_of(module), rec.rounds, rec.dealt, 0, 0])

        def post(module: nn.Module, *args: Any, **kwargs: Any) -> None:
            kind, began, began_d, children, children_d = stack.pop()
            spent, spent_d = rec.rounds - began, rec.dealt - began_d
            if out.passes:
                out.passes[-1].by_kind[kind] += spent - children
                out.passes[-1].dealt_by_kind[kind] += spent_d - children_d
            if stack:
                stack[-1][3] += spent
                stack[-1][4] += spent_d

        # (a pass starts at the base model: generation calls it alone, and its own LM head
        # on the last rows after it)
        base = getattr(model, "base_model", None)
        base = base if isinstance(base, nn.Module) else model
        hooks.append(base.register_forward_pre_hook(model_pre))
        for m in model.modules():
            if m is not model and kind_of(m) is not None:
                hooks.append(m.register_forward_pre_hook(pre))
                hooks.append(m.register_forward_hook(post))
        try:
            yield out
        finally:
            for h in hooks:
                h.remove()
            for p, began in zip(out.passes, began_dealt, strict=True):
                p.dealt = rec.dealt - began


def describe(table: dict[str, int], fmt: Callable[[int], str] = str) -> str:
    """``attention 420, layer norm 299, MLP 108, embedding, head and argmax 35 (862 in
    all)`` (each count written by ``fmt``)."""
    parts = [f"{k} {fmt(v)}" for k, v in table.items() if k != "total"]
    return ", ".join(parts) + f" ({fmt(table['total'])} in all)"


__all__ = ["KINDS", "REST", "Breakdown", "Pass", "by_module", "describe", "kind_of"]
