"""A cheating party on served workers: a party process started with a fault (``serve
--fault``, for tests only, refused unless the deployment sets POINTERS_ALLOW_FAULTS=1)
deviates at one protocol step; the MAC check catches it before any output reaches the
client. The in-process attacks on every step are tests/test_malicious_attacks.py."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import torch

import mpc
import pointers as pt
from pointers.network.cluster import LocalCluster
from pointers.worker.faults import ALLOW_ENV, Fault, parse_fault, with_faults

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def cheating_cluster() -> Any:
    """alice adds 2^16 to her share of the first leaf of every comparison's borrow tree."""
    old = os.environ.get(ALLOW_ENV)
    os.environ[ALLOW_ENV] = "1"
    cluster = LocalCluster(
        ["alice", "bob", "carol"],
        worker_args={"alice": ["--fault", "mpc.auth_cmp_leaves:0:65536"]},
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        if old is None:
            os.environ.pop(ALLOW_ENV, None)
        else:
            os.environ[ALLOW_ENV] = old


def test_a_served_cheating_party_is_caught(cheating_cluster: LocalCluster) -> None:
    alice, bob, carol = (cheating_cluster.connect(n) for n in ("alice", "bob", "carol"))
    s = mpc.Session([alice, bob], carol, security="malicious")
    x = mpc.share(torch.tensor([1.5, -2.0, 0.25]), session=s)
    y = mpc.share(torch.tensor([2.0, 3.0, -1.0]), session=s)
    # the steps alice runs as written still give the right value
    torch.testing.assert_close((x * y).get(), torch.tensor([3.0, -6.0, -0.25]))
    # a comparison runs her deviating step: caught, and nothing reaches the client
    with pytest.raises(mpc.MACCheckError, match="check failed"):
        out = torch.relu(x).get()
        pytest.fail(f"the client got {out}")
    with pytest.raises(mpc.MACCheckError):
        x.get()  # (the session releases nothing after a failed check)


def test_serve_refuses_a_fault_unless_the_deployment_allows_it() -> None:
    env = {k: v for k, v in os.environ.items() if k != ALLOW_ENV}
    proc = subprocess.run(
        [sys.executable, "-m", "pointers", "serve", "--id", "alice", "--insecure"]
        + ["--fault", "mpc.auth_beaver_combine:0:1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert f"{ALLOW_ENV}=1" in proc.stderr


def test_fault_specs_and_their_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_fault("mpc.auth_open:1:0x10000:0,2") == Fault("mpc.auth_open", 1, 65536, (0, 2))
    for bad in ("mpc.auth_open", "mpc.auth_open:x:1", "mpc.auth_open:0:0", "a:0:1:0:0"):
        with pytest.raises(ValueError):
            parse_fault(bad)
    table = {"f": lambda ctx, t: [t, t * 2]}
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    assert with_faults(table, ()) == table  # (no fault: nothing to allow)
    with pytest.raises(pt.NotAllowedError, match=ALLOW_ENV):
        with_faults(table, (Fault("f", 1, 5),))
    monkeypatch.setenv(ALLOW_ENV, "1")
    with pytest.raises(ValueError, match="no such function"):
        with_faults(table, (Fault("g", 0, 5),))
    f = with_faults(table, (Fault("f", 1, 5, (1,)),))["f"]
    a, b = f(None, torch.tensor([1, 2]))
    assert a.tolist() == [1, 2] and b.tolist() == [2, 9]
