"""Generation with the crypto provider's material dealt ahead (the offline phase): a
token then runs the parties' programs only, gives the plaintext model's greedy token, and
material not used is dropped with its generation (mpc.generation.decoding.deal_steps)."""

from __future__ import annotations

import pytest
import torch
from test_generation import (
    MAX_LENGTH,
    PROMPT,
    VOCAB,
    Deployment,
    plaintext,
    prompt_of,
    tiny,
    workers,
)

import mpc
import mpc.hf
from mpc.generation.decoding import one_hot_rows

pytest.importorskip("transformers")


def test_a_held_model_generates_with_every_step_dealt_ahead() -> None:
    d = Deployment()
    prompt = prompt_of(16)
    expected = plaintext(d.plain, prompt, 5)
    assert torch.equal(
        mpc.generate(d.held, prompt, 5, max_length=MAX_LENGTH, preprocess=True), expected
    )
    progs = d.programs()  # (generate's: a new prefill starts a new generation)
    token = progs.prefill(d.rows(prompt)).get()
    progs.preprocess(3)
    assert progs.prepared == 3
    before = d.carol.stats.messages_received
    tokens = [token]
    for _ in range(3):
        tokens.append(progs.step(d.rows(tokens[-1])).get())
    assert d.carol.stats.messages_received == before  # the dealer's part ran ahead
    assert progs.prepared == 0
    assert torch.equal(torch.cat(tokens, dim=1), expected[:, :4])
    # a fourth step finds no set dealt: the dealer runs with it, as without preprocess
    tokens.append(progs.step(d.rows(tokens[-1])).get())
    assert d.carol.stats.messages_received > before
    assert torch.equal(torch.cat(tokens, dim=1), expected[:, :5])


def test_a_new_prefill_drops_the_sets_its_generation_did_not_use() -> None:
    d = Deployment()
    progs = d.programs()
    token = progs.prefill(d.rows(prompt_of(12))).get()
    progs.preprocess(4)
    progs.step(d.rows(token)).get()
    later = progs.plan.later
    unused = [(party, b[slot]) for b in later.prepared for party, slot in later.dealt]
    assert unused and all(obj in dict(d.parties[0].store.view()) or party != "alice"
                          for party, obj in unused)  # fmt: skip
    prompt = prompt_of(13)
    first = progs.prefill(d.rows(prompt)).get()
    assert progs.prepared == 0
    by_id = {w.id: w for w in d.parties}
    for party, obj in unused:  # the dealer's deliveries of those sets are deleted there
        assert obj not in dict(by_id[party].store.view())
    progs.preprocess(2)  # (the new generation's sets take what its prefill kept)
    second = progs.step(d.rows(first)).get()
    assert torch.equal(torch.cat([first, second], dim=1), plaintext(d.plain, prompt, 2))


def test_a_model_the_client_shared_deals_its_steps_after_the_first() -> None:
    model = tiny("gpt2")
    prompt = prompt_of(18)
    expected = plaintext(model, prompt, 5)
    parties, carol = workers()
    mpc.share(model, *parties, crypto_provider=carol)  # (in place)
    assert torch.equal(mpc.generate(model, prompt, 5, preprocess=True), expected)
    progs = mpc.generation.programs(model, PROMPT, MAX_LENGTH)
    session = mpc.hf.session_of(model)
    token = progs.prefill(one_hot_rows(prompt, VOCAB, session)).get()
    with pytest.raises(mpc.MPCError, match="after the generation's first step"):
        progs.preprocess(2)
    tokens = [token, progs.step(one_hot_rows(token, VOCAB, session)).get()]
    progs.preprocess(2)
    before = carol.stats.messages_received
    for _ in range(2):
        tokens.append(progs.step(one_hot_rows(tokens[-1], VOCAB, session)).get())
    assert carol.stats.messages_received == before
    assert torch.equal(torch.cat(tokens, dim=1), expected[:, :4])


def test_bad_preprocess_requests_are_refused() -> None:
    d = Deployment()
    progs = d.programs()
    with pytest.raises(mpc.MPCError, match="after the generation's prefill"):
        progs.preprocess(2)
    progs.prefill(d.rows(prompt_of(15))).get()
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="steps must be an int"):
            progs.preprocess(bad)  # type: ignore[arg-type]
    with pytest.raises(mpc.MPCError, match="number of passes"):
        mpc.generate(d.held, prompt_of(15), 2, max_length=MAX_LENGTH, drafts=1, preprocess=True)
