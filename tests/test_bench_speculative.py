"""python -m benchmarks.speculative end to end on a barely trained tiny GPT-2: both modes
give plaintext greedy decoding's tokens, and the table prints the prefill apart."""

from __future__ import annotations

import pytest

from benchmarks import speculative


@pytest.mark.slow
def test_the_benchmark_runs_and_every_token_is_greedy(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--train-steps", "20", "--prompts", "1", "--tokens", "4", "--drafts", "2"]
    assert speculative.main(args) == 0
    out = capsys.readouterr().out
    assert "every token equals plaintext greedy decoding: yes" in out
    assert "(prefill" in out and "2 drafts a pass" in out


def test_too_few_tokens_are_refused() -> None:
    with pytest.raises(SystemExit):
        speculative.main(["--tokens", "1"])
