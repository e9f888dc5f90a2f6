"""PySyft 0.2 users feel at home (issue 16): the names and behaviours its tutorials rely on.

Each ``test_part_*`` is one PySyft 0.2 tutorial part, in our own words and code (digits
where the tutorial used MNIST), asserting what the tutorial states.
"""

import pytest
import torch
from torch import nn, optim

import pointers as pt

pt.hook(torch)


# -- the two bugs -------------------------------------------------------------------------


def test_send_keeps_requires_grad_and_get_brings_the_grad(bob):
    x = torch.tensor([1.0, 2.0], requires_grad=True).send(bob)
    y = torch.tensor([3.0, 4.0], requires_grad=True).send(bob)
    assert x.requires_grad and y.requires_grad
    z = (x + y).sum()
    z.backward()
    x = x.get()
    assert x.requires_grad
    assert torch.equal(x.grad, torch.ones(2))
    assert torch.equal(x.detach(), torch.tensor([1.0, 2.0]))


def test_send_without_requires_grad_stays_without(bob):
    x = torch.tensor([1.0, 2.0]).send(bob)
    assert not x.requires_grad
    assert not x.get().requires_grad


def test_module_moves_after_a_backward(bob, alice):
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    opt = optim.SGD(model.parameters(), lr=0.1)
    model.send(bob)
    loss = model(torch.ones(3, 2).send(bob)).sum()
    loss.backward()
    opt.step()
    model.send(alice)  # a second send moves it: once failed with ObjectGoneError
    assert model.weight.location.id == alice.id
    assert model.weight.grad.location.id == alice.id
    opt.zero_grad()
    model(torch.ones(3, 2).send(alice)).sum().backward()
    opt.step()
    model.get()
    assert torch.equal(model.weight.grad, torch.full((1, 2), 3.0))
    assert not isinstance(model.weight, pt.PointerTensor)


# -- names PySyft users type ----------------------------------------------------------------


def test_local_worker_objects_owner_location(bob):
    hook = pt.hook(torch)
    assert hook.local_worker is pt.local_worker
    assert pt.local_worker.is_client_worker and not bob.is_client_worker
    assert "Tensor.send" in hook or "Module.copy" in hook or isinstance(hook, list)
    x = torch.tensor([1.0, 2.0]).send(bob)
    assert x.owner is pt.local_worker
    assert x.location is bob
    assert x.id_at_location in bob._objects
    assert torch.equal(bob._objects[x.id_at_location], torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError):
        bob._objects[x.id_at_location] = torch.zeros(2)  # a read-only view


def test_module_copy_and_move(bob, alice):
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    local_copy = model.copy()
    assert local_copy is not model and torch.equal(local_copy.weight, model.weight)
    expected = model.weight.detach().clone()
    model.send(bob)
    remote_copy = model.copy()
    assert remote_copy.weight.location.id == bob.id
    assert remote_copy.weight.id_at_location != model.weight.id_at_location
    model.move(alice)
    assert model.weight.location.id == alice.id
    assert torch.equal(remote_copy.get().weight.detach(), expected)
    assert torch.equal(model.get().weight.detach(), expected)


def _mpc_workers(make_worker):
    return make_worker("alice"), make_worker("bob"), make_worker("carol")


def test_shared_copy_max_and_protocol_names(make_worker):
    mpc = pytest.importorskip("mpc")
    alice, bob, carol = _mpc_workers(make_worker)
    x = torch.tensor([[1.0, 5.0], [3.0, 2.0]]).share(alice, bob, crypto_provider=carol)
    assert torch.equal(x.copy().get(), torch.tensor([[1.0, 5.0], [3.0, 2.0]]))
    # PySyft's x.max(dim=0).get(): the values; torch's pair for unpacking
    assert torch.equal(x.max(dim=0).get(), torch.tensor([3.0, 5.0]))
    values, indices = x.max(dim=0)
    assert torch.equal(values.get(), torch.tensor([3.0, 5.0]))
    assert torch.equal(indices.get(), torch.tensor([1, 0]))
    # ("snn": 2 rounds for so few elements, the bit by digit look-ups)
    for protocol, rounds in (("fss", 1), ("snn", 2)):
        y = torch.tensor([1.0, -2.0]).share(alice, bob, crypto_provider=carol, protocol=protocol)
        with mpc.stats() as s:
            above = y > 0
        assert above.get().tolist() == [True, False]
        assert s.rounds == rounds  # "fss" with 2 parties: function secret sharing
        assert y.session.config.comparison == ("fss" if protocol == "fss" else "default")
    with pytest.raises(mpc.MPCError, match="protocol='spdz'"):
        torch.tensor([1.0]).share(alice, bob, crypto_provider=carol, protocol="spdz")


# -- fixed precision ------------------------------------------------------------------------


def test_fix_precision_round_trip():
    x = torch.tensor([1.5, -2.25, 0.001])
    f = x.fix_precision(precision_fractional=3)
    assert isinstance(f, pt.FixedPrecisionTensor) and f.frac_bits == 10
    assert f.dtype == torch.int64
    assert torch.allclose(f.float_precision(), x, atol=1e-3)
    assert torch.equal(torch.tensor([0.5]).fix_precision().float_precision(), torch.tensor([0.5]))
    labels = torch.tensor([1, 7]).fix_precision()  # integers stay exact (PySyft's labels)
    assert labels.frac_bits == 0 and torch.equal(labels.float_precision(), torch.tensor([1, 7]))
    with pytest.raises(TypeError, match="float or integer tensor"):
        torch.tensor([True]).fix_precision()


def test_fix_precision_share_and_back(make_worker):
    pytest.importorskip("mpc")
    alice, bob, carol = _mpc_workers(make_worker)
    x = torch.tensor([1.5, -2.0]).fix_precision().share(alice, bob, crypto_provider=carol)
    assert x.frac_bits == 16
    y = torch.tensor([2.0, 0.5]).fix_precision().share(alice, bob, crypto_provider=carol)
    assert torch.allclose((x * y).get().float_precision(), torch.tensor([3.0, -1.0]), atol=1e-3)
    model = nn.Linear(2, 1).fix_precision(precision_fractional=4)
    expected = model(torch.ones(1, 2)).detach()
    model.share(alice, bob, crypto_provider=carol)
    assert model.weight.frac_bits == 14
    x = torch.ones(1, 2).fix_precision(precision_fractional=4)
    out = model(x.share(alice, bob, crypto_provider=carol)).get().float_precision()
    assert torch.allclose(out, expected, atol=1e-2)
    opt = optim.SGD(model.parameters(), lr=0.1)
    assert opt.fix_precision() is opt


# -- sandbox ----------------------------------------------------------------------------------


@pytest.mark.virtual_only("the sandbox makes in-process workers")
def test_sandbox_workers_hold_tagged_digits_and_a_regression_set():
    pytest.importorskip("sklearn")
    names: dict = {}
    box = pt.create_sandbox(names, verbose=False)
    assert [w.id for w in box.workers] == ["bob", "theo", "jason", "alice", "andy", "jon"]
    assert names["bob"] is box.bob and "hook" in names and names["torch"] is torch
    total = 0
    for w in box.workers:
        (data,) = w.search("#digits", "#data")
        (target,) = w.search("#digits", "#target")
        assert data.shape[1] == 64 and data.shape[0] == target.shape[0]
        total += data.shape[0]
        assert len(w.search("#diabetes", "#data")) == 1
        assert isinstance(pt.BaseDataset(data, target), pt.WorkerDataset)
    assert total == 1797


# -- one end-to-end test per PySyft 0.2 tutorial part ------------------------------------------


def test_part_1_basic_tools(bob):
    # send, remote ops, get; remote autograd brings x.grad back
    x = torch.tensor([1, 2, 3, 4, 5]).send(bob)
    y = torch.tensor([1, 1, 1, 1, 1]).send(bob)
    assert x.location is bob and x.id_at_location in bob._objects
    z = x + y
    assert torch.equal(z.get(), torch.tensor([2, 3, 4, 5, 6]))
    assert torch.equal(torch.add(x, y).get(), torch.tensor([2, 3, 4, 5, 6]))
    x = torch.tensor([1.0, 2, 3, 4, 5], requires_grad=True).send(bob)
    y = torch.tensor([1.0, 1, 1, 1, 1], requires_grad=True).send(bob)
    z = (x + y).sum()
    z.backward()
    x = x.get()
    assert torch.equal(x.grad, torch.ones(5))


def _toy():
    data = torch.tensor([[0, 0], [0, 1.0], [1, 0], [1, 1.0]], requires_grad=True)
    target = torch.tensor([[0], [0], [1], [1.0]], requires_grad=True)
    return data, target


def test_part_2_federated_learning(bob, alice):
    torch.manual_seed(0)
    data, target = _toy()
    datasets = [
        (data[0:2].send(bob), target[0:2].send(bob)),
        (data[2:].send(alice), target[2:].send(alice)),
    ]
    model = nn.Linear(2, 1)
    opt = optim.SGD(params=model.parameters(), lr=0.1)
    losses = []
    for _ in range(10):
        for d, t in datasets:
            model.send(d.location)
            opt.zero_grad()
            loss = ((model(d) - t) ** 2).sum()
            loss.backward()
            opt.step()
            model.get()
            losses.append(loss.get().item())
    assert losses[-1] < losses[0] / 4  # the tutorial's loss goes down


def test_part_3_advanced_remote_execution(bob, alice):
    # move a pointer from bob to alice, party to party; the client never holds it
    x = torch.tensor([1, 2, 3, 4, 5]).send(bob)
    x = x.move(alice)
    assert x.location is alice and len(bob._objects) == 0
    assert torch.equal((x + x).get(), torch.tensor([2, 4, 6, 8, 10]))


def test_part_4_trusted_aggregator(make_worker):
    bob, alice, secure_worker = (make_worker(n) for n in ("bob", "alice", "carol"))
    torch.manual_seed(0)
    data, target = _toy()
    bobs = (data[0:2].send(bob), target[0:2].send(bob))
    alices = (data[2:].send(alice), target[2:].send(alice))
    model = nn.Linear(2, 1)
    first = last = None
    for _ in range(10):
        bobs_model, alices_model = model.copy().send(bob), model.copy().send(alice)
        for m, (d, t) in ((bobs_model, bobs), (alices_model, alices)):
            opt = optim.SGD(m.parameters(), lr=0.1)
            for _ in range(5):
                opt.zero_grad()
                loss = ((m(d) - t) ** 2).sum()
                loss.backward()
                opt.step()
            last = loss.get().item()
            first = last if first is None else first
        alices_model.move(secure_worker)
        bobs_model.move(secure_worker)
        with torch.no_grad():  # averaged at the secure worker, then fetched
            w = ((alices_model.weight + bobs_model.weight) / 2).get()
            b = ((alices_model.bias + bobs_model.bias) / 2).get()
            model.weight.set_(w)
            model.bias.set_(b)
    assert last < first


@pytest.mark.virtual_only("the sandbox makes in-process workers")
def test_part_5_federated_datasets_on_digits():
    pytest.importorskip("sklearn")
    box = pt.sandbox()
    parts = []
    for w in (box.bob, box.alice):
        (data,) = w.search("#digits", "#data")
        (target,) = w.search("#digits", "#target")
        parts.append(pt.BaseDataset(data, target))
    fed = pt.FederatedDataset(parts)
    loader = pt.FederatedDataLoader(fed, batch_size=32, shuffle=True)
    torch.manual_seed(0)
    model = nn.Linear(64, 10)
    opt = optim.SGD(model.parameters(), lr=0.5)
    for _ in range(5):
        for x, y in loader:
            model.send(x.location)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x / 16), y)
            loss.backward()
            opt.step()
            model.get()
    data, target = box.datasets["#digits"]
    accuracy = (model(data / 16).argmax(1) == target).float().mean().item()
    assert accuracy > 0.8


def test_part_9_encrypted_programs(make_worker):
    pytest.importorskip("mpc")
    bob, alice, crypto = (make_worker(n) for n in ("bob", "alice", "carol"))
    x = torch.tensor([25.0]).fix_precision().share(bob, alice, crypto_provider=crypto)
    y = torch.tensor([5.0]).fix_precision().share(bob, alice, crypto_provider=crypto)
    assert (x + y).get().float_precision().item() == 30.0
    assert (x - y).get().float_precision().item() == 20.0
    assert abs((x * y).get().float_precision().item() - 125.0) < 1e-2
    assert (x > y).get().tolist() == [True]  # comparisons give bools (PySyft: 1.0)
    assert (x < y).get().tolist() == [False]


# -- PySyft's hook object, worker signature, optimizers ---------------------------------------


@pytest.mark.virtual_only("PySyft's VirtualWorker signature")
def test_virtual_worker_takes_pysyft_signature():
    hook = pt.TorchHook(torch)
    assert hook.local_worker is pt.local_worker
    x11 = pt.tag(torch.tensor([-1.0, 2.0]), "input_data")
    bob = pt.VirtualWorker(hook, id="bob", data=(x11,), is_client_worker=False, verbose=False)
    assert isinstance(bob, pt.VirtualWorker) and bob.id == "bob" and not bob.is_client_worker
    (found,) = bob.search("input_data")
    assert torch.equal(found.get(), torch.tensor([-1.0, 2.0]))
    assert pt.VirtualWorker(hook, "alice").id == "alice"
    assert pt.VirtualWorker("carol").id == "carol"
    assert len(pt.VirtualWorker(hook, id="dave", data={}).objects) == 0
    with pytest.raises(TypeError, match="pointers.hook"):
        pt.VirtualWorker(object(), id="erin")


def test_optimizer_built_after_send_steps_on_pointers(bob):
    # Part 4: optim.SGD(params=model.parameters()) on a model already at bob
    torch.manual_seed(0)
    data, target = _toy()
    model = nn.Linear(2, 1)
    local = model.copy()
    model.send(bob)
    opt = optim.SGD(params=model.parameters(), lr=0.1)
    local_opt = optim.SGD(params=local.parameters(), lr=0.1)
    d, t = data.detach().send(bob), target.detach().send(bob)
    for _ in range(3):
        for m, o, x, y in ((model, opt, d, t), (local, local_opt, data.detach(), target.detach())):
            o.zero_grad()
            ((m(x) - y) ** 2).sum().backward()
            o.step()
    assert model.weight.location is bob
    model.get()
    assert torch.allclose(model.weight, local.weight) and torch.allclose(model.bias, local.bias)


def test_optims_one_optimizer_per_worker(bob, alice):
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    optims = pt.Optims(["bob", alice], optim=optim.Adam(params=model.parameters(), lr=0.1))
    assert optims.count() == 2
    ob, oa = optims.get_optim("bob"), optims.get_optim(alice)
    assert ob is not oa and isinstance(ob, optim.Adam) and ob.defaults["lr"] == 0.1
    assert ob.param_groups[0]["params"][0] is model.weight
    model.send(bob)
    ob.zero_grad()
    model(torch.ones(1, 2).send(bob)).sum().backward()
    ob.step()
    model.get()
    assert len(ob.state) == 2 and len(oa.state) == 0  # moments kept per worker
    with pytest.raises(KeyError, match="carol"):
        optims.get_optim("carol")
    with pytest.raises(TypeError, match="optimizer"):
        pt.Optims(["bob"], optim=None)


@pytest.mark.virtual_only("the sandbox makes in-process workers")
def test_sandbox_grid_search():
    pytest.importorskip("sklearn")
    names: dict = {}
    pt.create_sandbox(names, verbose=False)
    found = names["grid"].search("#diabetes", "#data")
    assert sorted(found) == sorted(w.id for w in names["workers"])
    assert sum(p[0].shape[0] for p in found.values()) == 442
    assert names["grid"].search("#nothing") == {}


# -- pointer chains, protocols as objects, sharing a remote tensor: on both worker kinds ----


def test_pointer_chain_or_a_clear_refusal(bob, alice, worker_kind):
    x = torch.tensor([1.0, 2.0]).send(bob)
    if worker_kind == "network":  # a network worker is never a client of another
        with pytest.raises(pt.PointerError, match="in-process workers only"):
            x.send(alice)
        assert torch.equal(x.get(), torch.tensor([1.0, 2.0]))  # nothing lost
        return
    chained = x.send(alice)
    assert torch.equal((chained * 2).get().get(), torch.tensor([2.0, 4.0]))


def test_protocol_sent_searched_and_fetched(make_worker):
    alice, bob, james = (make_worker(n) for n in ("alice", "bob", "carol"))
    # -1: any length, also after a round trip through bytes (which leaves the functions)
    inc = pt.func2plan(args_shape=[(-1,)])(lambda x: x + 1)
    dbl = pt.func2plan(args_shape=[(-1,)])(lambda x: x * 2)
    protocol = pt.Protocol([("first", inc), ("second", dbl)]).tag("#inc-dbl")
    ptr = protocol.send(james)
    (found,) = pt.Protocol.search(james, "#inc-dbl")
    assert found.id_at_location == ptr.id_at_location
    fetched = found.get()
    fetched.deploy(alice, bob)
    x = torch.tensor([1.0, 3.0]).send(james)
    out = fetched.run(x)  # the data owner's result
    assert out.location.id == james.id
    if isinstance(james, pt.VirtualWorker):  # PySyft's chain: james's pointer to it at bob
        out = out.get()
        assert out.location.id == bob.id
    assert torch.equal(out.get(), torch.tensor([4.0, 8.0]))


def test_share_a_remote_tensor(make_worker):
    mpc = pytest.importorskip("mpc")
    bob, alice, james = (make_worker(n) for n in ("bob", "alice", "carol"))
    x = torch.tensor([1.5, -2.0, 0.25]).send(bob)
    shared = x.fix_precision(precision_fractional=3).share(bob, alice, crypto_provider=james)
    assert shared.frac_bits == 10
    y = torch.tensor([2.0, 2.0, 2.0]).share(bob, alice, crypto_provider=james)
    # bob's value is bob's: not the client's to compute on or open (its release rule)
    with pytest.raises(mpc.ReleaseRuleError):
        (shared * y).get()
    dan = make_worker("dan")
    z = torch.tensor([0.5, 0.5, 0.5]).send(dan).fix_precision(precision_fractional=3)
    other = z.share(bob, alice, crypto_provider=james)
    assert torch.allclose((shared + other).get(), torch.tensor([2.0, -1.5, 0.75]), atol=1e-2)
    assert torch.equal(x.get(), torch.tensor([1.5, -2.0, 0.25]))
