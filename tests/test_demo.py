"""Acceptance of issue 3: encrypted inference of the digits CNN agrees with plaintext."""

import pytest

pytest.importorskip("sklearn")

from mpc.examples.demo import encrypted_inference  # noqa: E402


@pytest.mark.parametrize("parties", [2, 3])
def test_encrypted_digits_inference_agrees_with_plaintext(parties, capsys):
    result = encrypted_inference(parties=parties, batch=450)
    assert result["agreement"] >= 0.99
    assert result["accuracy"] >= 0.95
    assert abs(result["accuracy"] - result["plain_accuracy"]) <= 0.01
    out = capsys.readouterr().out
    assert "rounds" in out and "agreement" in out
