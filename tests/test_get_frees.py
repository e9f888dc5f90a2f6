"""``get()`` of a shared value the client owns frees its shares at the workers, as
PySyft's did (Part 9: ``list(bob._tensors.values())`` is ``[]`` after
``encrypted_x.get()``)."""

from __future__ import annotations

import gc

import pytest
import torch

import mpc
import pointers as pt


@pytest.fixture()
def workers():
    return tuple(pt.VirtualWorker(n) for n in ("bob", "alice", "bill", "carol"))


def _stored(worker) -> int:
    return len(worker.objects)


def test_get_frees_the_shares_at_every_party(workers):
    bob, alice, bill, _ = workers
    before = [_stored(w) for w in (bob, alice, bill)]
    x = mpc.share(torch.tensor([25]), bob, alice, bill)
    assert [_stored(w) for w in (bob, alice, bill)] == [n + 1 for n in before]
    assert torch.equal(x.get(), torch.tensor([25]))
    assert [_stored(w) for w in (bob, alice, bill)] == before


def test_a_value_made_from_it_keeps_working_and_the_got_one_says_why(workers):
    bob, alice, _, carol = workers
    x = mpc.share(torch.tensor([1.5, -2.0]), bob, alice, crypto_provider=carol)
    y = x * 2 + 1
    view = x[1:]
    assert torch.allclose(x.get(), torch.tensor([1.5, -2.0]))
    assert torch.allclose(y.get(), torch.tensor([4.0, -3.0]))
    assert torch.allclose(view.get(), torch.tensor([-2.0]))
    with pytest.raises(mpc.MPCError, match=r"reconstructed with get\(\), which frees .*clone"):
        x + 1
    with pytest.raises(mpc.MPCError, match="frees its shares"):
        x.get()


def test_clone_get_and_get_delete_false_keep_the_shared_value(workers):
    bob, alice, _, carol = workers
    x = mpc.share(torch.tensor([3.0]), bob, alice, crypto_provider=carol)
    assert torch.equal(x.clone().get(), torch.tensor([3.0]))
    assert torch.equal(x.get(delete=False), torch.tensor([3.0]))  # (as a pointer's)
    gc.collect()
    assert torch.equal((x * x).get(), torch.tensor([9.0]))


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def test_get_of_a_shared_model_reconstructs_its_weights(workers):
    bob, alice, _, carol = workers
    model = _model()
    want = {k: v.detach().clone() for k, v in model.state_dict().items()}
    keep = mpc.share(torch.zeros(1), bob, alice, crypto_provider=carol)  # (the session)
    before = _stored(bob), _stored(alice)
    mpc.share(model, bob, alice, crypto_provider=carol)
    assert isinstance(model[0].weight, mpc.SharedTensor)
    assert pt.get(model) is model  # PySyft 0.2's model.get() on a shared model
    for k, v in model.state_dict().items():
        assert type(v) is torch.Tensor and torch.allclose(v, want[k], atol=2**-15), k
    assert isinstance(model[0].weight, torch.nn.Parameter)
    gc.collect()
    assert (_stored(bob), _stored(alice)) == before  # the weights' shares are gone
    del keep


def test_model_get_after_the_hook(workers):
    bob, alice, _, carol = workers
    pt.hook(torch)
    model = _model()
    want = model[2].bias.detach().clone()
    model.share(bob, alice, crypto_provider=carol)
    model.get()
    assert torch.allclose(model[2].bias.detach(), want, atol=2**-15)


def test_get_of_an_owners_model_is_refused(workers):
    bob, alice, _, carol = workers
    model = _model()
    x = torch.randn(1, 3)
    owner = pt.VirtualWorker("owner")
    approval = mpc.approve(model, x, parties=["bob", "alice"], crypto_provider="carol")
    held = mpc.share(mpc.offer(model, owner, approval), bob, alice, crypto_provider=carol)
    with pytest.raises(mpc.HeldError, match="never opens"):
        pt.get(held)
    assert isinstance(held[0].weight, mpc.HeldShared)  # (nothing changed)
