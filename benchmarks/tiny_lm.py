"""A tiny GPT-2 trained in plaintext on text that ships with Python: the docstrings of
standard-library modules, as lower-case words and punctuation (nothing is downloaded).
Its greedy continuations are real text with real repetition, so a draft rule that needs
no second model (prompt lookup) is sometimes right and sometimes wrong: what
:mod:`benchmarks.speculative` and the tests measure speculative verification on.

Deterministic for a given torch build: the modules, their order, the seed and the
batches are fixed. About a minute of CPU for the default 2,000 steps.
"""

from __future__ import annotations

import collections
import importlib
import inspect
import re
import warnings
from typing import Any

import torch

# standard-library modules whose docstrings make the corpus (in this order)
MODULES = (
    "string textwrap collections functools itertools json re os pathlib inspect typing "
    "dataclasses argparse logging heapq bisect random statistics fractions decimal datetime "
    "calendar shutil tempfile csv zipfile base64 hashlib copy pprint enum contextlib abc io "
    "threading queue subprocess socket math operator weakref types"
).split()
UNKNOWN = "<unk>"


def stdlib_words() -> list[str]:
    """The corpus: every docstring of the modules above and of their public functions
    and classes, as lower-case words and the punctuation . , ( ) :"""
    docs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a deprecated alias is read like any attribute)
        for name in MODULES:
            module = importlib.import_module(name)
            objects = [module] + [getattr(module, a, None) for a in sorted(dir(module))]
            for o in objects:
                if o is module or inspect.isfunction(o) or inspect.isclass(o):
                    doc = getattr(o, "__doc__", None)
                    if isinstance(doc, str):
                        docs.append(doc)
    return re.findall(r"[a-z]+|[.,():]", " ".join(docs).lower())


class TinyLM:
    """The trained model, its vocabulary and the corpus as token ids."""

    def __init__(self, model: Any, vocab: list[str], data: torch.Tensor, loss: float) -> None:
        self.model, self.vocab, self.data, self.loss = model, vocab, data, loss

    def text(self, ids: list[int]) -> str:
        return " ".join(self.vocab[i] for i in ids)

    def prompt(self, start: int, length: int) -> torch.Tensor:
        """``length`` tokens of the corpus from word ``start`` (1, length)."""
        return self.data[start : start + length].unsqueeze(0)


def train(
    steps: int = 2000, vocab: int = 2048, seed: int = 0, window: int = 48, positions: int = 256
) -> TinyLM:
    """Train ``GPT2LMHeadModel`` (2 layers, width 64, 2 heads, a table of ``positions``
    positions: a speculative generation's cache takes more rows than it has tokens) on the
    corpus's ``vocab - 1`` most frequent words (the rest: one unknown id), AdamW at 3e-3,
    batches of 32 windows of ``window`` words (the positions a generation may reach);
    returns it in eval mode."""
    import transformers
    from transformers.utils import logging

    logging.set_verbosity_error()
    words = stdlib_words()
    common = [w for w, _ in collections.Counter(words).most_common(vocab - 1)]
    index = {w: i + 1 for i, w in enumerate(common)}
    data = torch.tensor([index.get(w, 0) for w in words])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        cfg = transformers.GPT2Config(
            vocab_size=vocab, n_embd=64, n_layer=2, n_head=2, n_positions=positions,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        g = torch.Generator().manual_seed(seed)
        loss = torch.tensor(0.0)
        for _ in range(steps):
            starts = torch.randint(0, len(data) - window - 1, (32,), generator=g)
            batch = torch.stack([data[i : i + window] for i in starts])
            loss = model(input_ids=batch, labels=batch).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    return TinyLM(model.eval(), [UNKNOWN, *common], data, float(loss.detach()))


__all__ = ["TinyLM", "stdlib_words", "train"]
