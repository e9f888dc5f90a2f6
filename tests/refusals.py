"""What the attack tests share: a step that a client sends and a worker must refuse."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pointers.errors import RemoteError
from pointers.wire.messages import Describe


def refused(worker: Any, attempt: Callable[[], Any], match: str) -> None:
    """``attempt`` (what the client sends) is refused by ``worker`` with an error that
    matches ``match``: in process at once, on a network worker at the next call that
    waits for an answer (a Describe), where its earlier errors surface."""
    with pytest.raises(RemoteError, match=match):
        attempt()
        worker.request(Describe([]))
