import pytest
import torch
from network_fixtures import Cluster

import pointers as pt

# Test modules whose `alice` and `bob` run on both worker kinds: in process
# (VirtualWorker) and network workers served by real processes on loopback.
BOTH_WORKER_KINDS = {
    "test_pointers_behaviour",
    "test_pointer_ops",
    "test_remote_training",
    "test_plans",
    "test_mpc_ops",
    "test_mpc_errors",
    "test_mpc_privacy",
    "test_mpc_plan",
    "test_mpc_plan_functions",
    "test_mpc_nonces",
    "test_mpc_functions",
    "test_mpc_truncmul",
    "test_mpc_malicious",
    "test_mpc_malicious_compare",
    "test_mpc_training",
    "test_sealing",
    "test_sealing_attacks",
    "test_low_bits",
    "test_rank_select",
    "test_weight_instances",
    "test_auth_weights",
    "test_share_pieces",
    "test_release_rules",
    "test_fss_attacks",
    "test_opening_attacks",
    "test_opening_bits",
    "test_compare_thresholds",
    "test_mpc_carry_arith",
    "test_mpc_series_product",
    "test_mpc_digit_compare",
    "test_mpc_digit_select",
    "test_mpc_truncated_selection",
    "test_mpc_fss_truncated_selection",
    "test_mpc_trunc_weight",
    "test_federated",
    "test_pysyft_compat",
}
# ... except tests marked ``@pytest.mark.virtual_only("why")`` and these, which reach into
# an in-process worker (its function registry)
VIRTUAL_ONLY = {"test_registered_function_node_runs_at_the_worker"}
# as many workers as the largest mpc setting needs: 5 parties and a crypto provider
NETWORK_WORKERS = ("alice", "bob", "carol", "dave", "erin", "frank")
NETWORK_CLIENTS = ("client", "mallory")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__.rpartition(".")[2]
    marker = metafunc.definition.get_closest_marker("virtual_only")
    if marker is not None and not (marker.args or marker.kwargs.get("reason")):
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: virtual_only needs a reason")
    if (
        "worker_kind" in metafunc.fixturenames
        and module in BOTH_WORKER_KINDS
        and marker is None
        and metafunc.function.__name__ not in VIRTUAL_ONLY
    ):
        kinds = ["virtual", pytest.param("network", marks=pytest.mark.network)]
        metafunc.parametrize("worker_kind", kinds)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked slow run only when asked for (-m slow)."""
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def worker_kind() -> str:
    return "virtual"


@pytest.fixture(scope="session")
def network_cluster(tmp_path_factory: pytest.TempPathFactory):
    """Worker processes alice, bob, carol, dave on loopback (mutual TLS), for the session."""
    cluster = Cluster(tmp_path_factory.mktemp("network"), NETWORK_WORKERS, NETWORK_CLIENTS)
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def make_worker(worker_kind: str, request: pytest.FixtureRequest):
    """name -> a new worker of the test's kind. A network one holds no objects; it is the
    cluster's worker of that name if still unused in this test, else the next unused one
    (so ``make_worker("party0")`` works too; there are as many as NETWORK_WORKERS)."""
    if worker_kind == "virtual":
        yield pt.VirtualWorker
        return
    cluster = request.getfixturevalue("network_cluster")
    free = list(cluster.worker_ids)

    def make(name: str) -> pt.NetworkWorker:
        if not free:
            raise RuntimeError(f"a network test may use at most {len(NETWORK_WORKERS)} workers")
        target = name if name in free else free[0]
        free.remove(target)
        return cluster.fresh(target)

    yield make
    cluster.close_connections()


@pytest.fixture
def alice(make_worker):
    return make_worker("alice")


@pytest.fixture
def bob(make_worker):
    return make_worker("bob")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    yield


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"{n}parties")
def group(request: pytest.FixtureRequest) -> tuple[list, pt.VirtualWorker]:
    """In-process parties (2, then 3) and a crypto provider, shared by a module's tests
    (test_mpc_functions, test_mpc_fourier; modules with a ``group`` of their own keep it)."""
    names = ["alice", "bob", "dave"][: request.param]
    return [pt.VirtualWorker(n) for n in names], pt.VirtualWorker("carol")
