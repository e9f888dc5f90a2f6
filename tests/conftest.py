import pytest
import torch

import pointers as pt


@pytest.fixture
def alice() -> pt.VirtualWorker:
    return pt.VirtualWorker("alice")


@pytest.fixture
def bob() -> pt.VirtualWorker:
    return pt.VirtualWorker("bob")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    yield
