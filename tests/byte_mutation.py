"""One way the fuzz tests corrupt a valid byte string (shared by test modules)."""

from __future__ import annotations

from hypothesis import strategies as st


def mutated(data: st.DataObject, valid: bytes) -> bytes:
    """``valid`` with 1 to 4 bytes overwritten, then cut short half of the time."""
    raw = bytearray(valid)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    return bytes(raw)
