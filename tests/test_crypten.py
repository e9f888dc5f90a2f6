"""The CrypTen-shaped layer, ``import mpc.crypten as crypten``, as CrypTen's users write it:
results against plaintext torch, ranks of ``run_multiprocess``, communication counts against
``mpc.stats``, and a clear error naming our equivalent for every CrypTen name we lack.
The tutorials themselves run in test_crypten_notebooks.py."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import mpc
import mpc.crypten as crypten
import mpc.crypten.communicator as comm
from mpc.crypten import _world
from mpc.crypten.mpc import MPCTensor, run_multiprocess

UNIT = 2.0**-16  # one unit of the default fixed point


@pytest.fixture(autouse=True)
def initialized() -> Iterator[None]:
    crypten.init()
    yield
    crypten.uninit()


def enc(values: Any, **kwargs: Any) -> MPCTensor:
    return crypten.cryptensor(torch.as_tensor(values, dtype=torch.float32), **kwargs)


# -- tensors -----------------------------------------------------------------------------------


small = st.floats(-100, 100, allow_nan=False, width=32)


@settings(max_examples=10, deadline=None)
@given(st.lists(small, min_size=4, max_size=4), st.lists(small, min_size=4, max_size=4))
def test_arithmetic_and_comparisons_match_torch(a: list[float], b: list[float]) -> None:
    x, y = torch.tensor(a), torch.tensor(b)
    xe, ye = enc(x), enc(y)
    # each input off by half a unit at most, a product truncated once (one unit), two terms
    # in each matmul entry
    bound = float(2 * UNIT * (1 + x.abs().max() + y.abs().max()))
    for got, want in [
        (xe + ye, x + y),
        (xe - y, x - y),
        (y - xe, y - x),
        (xe * ye, x * y),
        (xe * 2.5, x * 2.5),
        (-xe, -x),
        (xe.reshape(2, 2) @ ye.reshape(2, 2), x.reshape(2, 2) @ y.reshape(2, 2)),
    ]:
        assert torch.allclose(got.get_plain_text(), want, rtol=1e-6, atol=bound), (got, want)
    apart = (x - y).abs() > 2 * UNIT  # (equal after encoding otherwise)
    for got, want in [(xe < ye, x < y), (xe >= y, x >= y), (ye > xe, y > x)]:
        out = got.get_plain_text()
        assert out.dtype == torch.float32 and set(out.tolist()) <= {0.0, 1.0}
        assert torch.equal(out[apart], want.float()[apart])


def test_integers_and_lists_encrypt_as_fixed_point_floats() -> None:
    x = crypten.cryptensor([1, 2, 3])
    assert torch.equal(x.get_plain_text(), torch.tensor([1.0, 2.0, 3.0]))
    assert crypten.cryptensor(2).get_plain_text().dtype == torch.float32
    assert crypten.is_encrypted_tensor(x) and not crypten.is_encrypted_tensor(torch.ones(1))
    assert isinstance(x, crypten.CrypTensor) and x.ptype is crypten.mpc.arithmetic
    assert x.size() == torch.Size([3]) and x.dim() == 1 and len(x) == 3 and x.numel() == 3
    assert isinstance(x._shared, mpc.SharedTensor)  # the engine's own shared tensor
    # the share printed is party 0's: with party 1's it adds up to the encoding
    total = (x.share + x._shared.shares[1].get(delete=False)).tolist()
    assert total == [1 << 16, 2 << 16, 3 << 16]
    assert "plain_text=HIDDEN" in repr(x) and str(x.share[0].item()) in repr(x)


def test_one_hot_argmax_and_max_as_crypten() -> None:
    x = torch.tensor([[0.5, 3.0, -1.0], [2.0, -4.0, 1.5]])
    xe = enc(x)
    hot = F.one_hot(x.argmax(1), 3).float()
    assert torch.equal(xe.argmax(dim=1).get_plain_text(), hot)
    assert torch.equal(xe.argmax(dim=1, one_hot=False).get_plain_text(), x.argmax(1).float())
    assert torch.equal(xe.argmax().get_plain_text(), F.one_hot(x.argmax(), 6).float().view(2, 3))
    values, where = xe.max(dim=1)
    assert torch.equal(values.get_plain_text(), x.amax(1))
    assert torch.equal(where.get_plain_text(), hot)
    assert xe.max().get_plain_text().item() == 3.0
    assert torch.equal(xe.argmin(dim=0).get_plain_text(), F.one_hot(x.argmin(0), 2).float().T)


def test_where_polynomial_and_torch_functions() -> None:
    x = torch.tensor([-1.5, 0.25, 2.0])
    xe = enc(x)
    got = crypten.where(xe > 0, xe, 0.0).get_plain_text()
    assert torch.allclose(got, x.clamp(min=0), atol=UNIT)
    assert torch.allclose(xe.where(xe > 0, 1.0).get_plain_text(), torch.where(x > 0, x, 1.0))
    assert torch.allclose(xe.polynomial([1.0, -2.0, 0.5]).get_plain_text(),
                          x - 2 * x**2 + 0.5 * x**3, atol=20 * UNIT)  # fmt: skip
    assert torch.allclose(F.relu(xe).get_plain_text(), F.relu(x), atol=UNIT)
    assert torch.allclose(torch.cat([xe, x]).get_plain_text(), torch.cat([x, x]), atol=UNIT)
    assert torch.allclose((torch.ones(3) + xe).get_plain_text(), 1 + x, atol=UNIT)  # torch first
    kernel = torch.tensor([[[0.5, -1.0]]])
    got = xe.view(1, 1, 3).conv1d(kernel).get_plain_text()  # CrypTen's method form of F.conv1d
    assert torch.allclose(got, F.conv1d(x.view(1, 1, 3), kernel), atol=3 * UNIT)


def test_no_truth_value_and_reading_needs_decryption() -> None:
    xe = enc([1.0, 2.0])
    with pytest.raises(RuntimeError, match=r"crypten\.where.*get_plain_text"):
        bool(xe < 2.0)
    for read in (lambda: float(xe[0]), lambda: xe.tolist(), lambda: xe.item(), lambda: xe.numpy()):
        with pytest.raises(RuntimeError, match="get_plain_text"):
            read()
    with pytest.raises(RuntimeError, match="get_plain_text"):
        f"{xe:.2f}"


# -- CrypTen names without an equivalent: an error that names ours ---------------------------------


@pytest.mark.parametrize(
    "attempt, names",
    [
        (lambda: crypten.rand(3), "crypten.cryptensor(torch.rand"),
        (lambda: crypten.manual_seed(0), "CSPRNG"),
        (lambda: crypten.cfg, "mpc.MPCConfig"),
        (lambda: crypten.models, "from_pytorch"),
        (lambda: crypten.trace(), "mpc.plan"),
        (lambda: crypten.mpc.provider, "crypto_provider"),
        (lambda: crypten.mpc.ttp_required(), "dealer"),
        (lambda: crypten.nn.from_onnx(None), "from_pytorch"),
        (lambda: crypten.nn.Gemm, "torch module"),
        (lambda: comm.get().send(torch.ones(1), 1), "pointers.send"),
        (lambda: comm.get().broadcast_obj(1, 0), "run_multiprocess"),
        (lambda: enc([1.0]).encoder, "frac_bits"),
        (lambda: enc([1.0]) ^ 1, "comparison protocol"),
        (lambda: enc([1.0]).binary(), "comparison protocol"),
        (lambda: enc([1.0]).to(crypten.mpc.binary), "comparison protocol"),
        (lambda: crypten.cryptensor([1], ptype=crypten.mpc.binary), "arithmetic ptype"),
        (lambda: crypten.init(config_file="c.yaml"), "config=mpc.MPCConfig"),
        (lambda: crypten.init(device="cuda"), "CPU"),
        (lambda: crypten.cryptensor([1.0], device="cuda"), "CPU"),
        (lambda: crypten.save(enc([1.0]), "/dev/null"), "get_plain_text"),
        (lambda: crypten.load_from_party("f", encrypted=True), "shares stay"),
    ],
)
def test_crypten_names_we_lack_name_our_equivalent(attempt: Any, names: str) -> None:
    with pytest.raises(crypten.NotAvailableError, match=names.replace("(", r"\(")):
        attempt()


def test_unknown_names_are_plain_attribute_errors() -> None:
    for owner in (crypten, crypten.mpc, crypten.nn, comm.get(), enc([1.0])):
        with pytest.raises(AttributeError) as e:
            owner.no_such_name  # noqa: B018
        assert not isinstance(e.value, crypten.NotAvailableError)
    assert not hasattr(crypten, "rand")  # (an AttributeError too: hasattr works)


def test_uninitialized_says_to_call_init() -> None:
    crypten.uninit()
    with pytest.raises(RuntimeError, match=r"call crypten.init\(\) first"):
        crypten.cryptensor([1.0])
    with pytest.raises(RuntimeError, match="crypten.init"):
        comm.get()
    assert not crypten.is_initialized()


def test_bad_arguments_are_refused_before_anything_is_shared() -> None:
    with pytest.raises(ValueError, match=r"src must be a rank in \[0, 2\)"):
        crypten.cryptensor([1.0], src=2)
    with pytest.raises(ValueError, match="2 to 5 parties"):
        crypten.init(parties=1)
    with pytest.raises(ValueError, match="crypto_provider"):
        crypten.init(parties=[object(), object()])
    with pytest.raises(TypeError, match="already encrypted"):
        crypten.cryptensor(enc([1.0]))
    with pytest.raises(ValueError, match="same size"):
        crypten.nn.MSELoss()(enc([[1.0, 2.0]]), enc([1.0]))


# -- models, losses, optimizers ----------------------------------------------------------------


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def test_from_pytorch_encrypt_forward_decrypt() -> None:
    plain = net()
    before = {k: v.clone() for k, v in plain.state_dict().items()}
    model = crypten.nn.from_pytorch(plain, torch.empty(1, 4))
    assert not model.encrypted
    model.encrypt()
    assert model.encrypted and isinstance(model.module[0].weight, mpc.SharedTensor)
    x = torch.randn(5, 4)
    out = model(crypten.cryptensor(x))
    assert crypten.is_encrypted_tensor(out)
    assert torch.allclose(out.get_plain_text(), plain(x), atol=1e-3)
    assert all(torch.equal(before[k], v) for k, v in plain.state_dict().items())  # untouched
    assert torch.allclose(model(x).get_plain_text(), plain(x), atol=1e-3)  # a plain input too
    model.decrypt()
    assert not model.encrypted and not isinstance(model.module[0].weight, mpc.SharedTensor)
    for (k, v), w in zip(model.module.state_dict().items(), before.values()):
        assert torch.allclose(v, w, atol=UNIT), k
    shared = mpc.share(net(), *_world.setup().session(2).parties[:2])
    with pytest.raises(ValueError, match="already shared"):
        crypten.nn.from_pytorch(shared, None)


def test_crypten_layers_and_update_parameters_match_torch_sgd() -> None:
    torch.manual_seed(1)
    model = crypten.nn.Sequential(
        crypten.nn.Linear(4, 6), crypten.nn.ReLU(), crypten.nn.Linear(6, 2)
    )
    plain = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    plain.load_state_dict(model.state_dict())
    model.encrypt()
    x, y = torch.randn(8, 4), F.one_hot(torch.randint(0, 2, (8,)), 2).float()
    x_enc, y_enc = crypten.cryptensor(x), crypten.cryptensor(y)
    model.train()
    for _ in range(3):
        loss = crypten.nn.MSELoss()(model(x_enc), y_enc)
        model.zero_grad()
        loss.backward()
        model.update_parameters(0.1)
        want = F.mse_loss(plain(x), y)
        plain.zero_grad()
        want.backward()
        with torch.no_grad():
            for p in plain.parameters():
                p -= 0.1 * p.grad
        assert abs(loss.get_plain_text().item() - want.item()) < 1e-3
    for (k, p), q in zip(model.decrypt().state_dict().items(), plain.state_dict().values()):
        assert torch.allclose(p, q, atol=1e-3), k
    model.eval()
    with pytest.raises(RuntimeError, match="training mode"):
        model.update_parameters(0.1)


@pytest.mark.parametrize(
    "loss, torch_loss, target",
    [
        (crypten.nn.MSELoss, F.mse_loss, "any"),
        (crypten.nn.L1Loss, F.l1_loss, "any"),
        (crypten.nn.BCELoss, F.binary_cross_entropy, "bits"),
        (crypten.nn.BCEWithLogitsLoss, F.binary_cross_entropy_with_logits, "bits"),
        (crypten.nn.CrossEntropyLoss, F.cross_entropy, "one-hot"),
    ],
)
def test_losses_and_their_gradients_match_torch(loss: Any, torch_loss: Any, target: str) -> None:
    torch.manual_seed(2)
    x = torch.randn(6, 3)
    if loss is crypten.nn.BCELoss:
        x = torch.sigmoid(x)
    y = {
        "any": torch.randn(6, 3),
        "bits": torch.randint(0, 2, (6, 3)).float(),
        "one-hot": F.one_hot(torch.randint(0, 3, (6,)), 3).float(),
    }[target]
    x_enc = crypten.cryptensor(x, requires_grad=True)
    value = loss()(x_enc, crypten.cryptensor(y))
    value.backward()
    leaf = x.clone().requires_grad_(True)
    want = torch_loss(leaf, y)
    want.backward()
    assert abs(value.get_plain_text().item() - want.item()) < 2e-3
    assert torch.allclose(x_enc.grad.get_plain_text(), leaf.grad, atol=2e-3)


def test_sgd_with_momentum_matches_torch() -> None:
    torch.manual_seed(3)
    model = crypten.nn.from_pytorch(nn.Linear(3, 2), None)
    plain = nn.Linear(3, 2)
    plain.load_state_dict(model.module.state_dict())
    model.encrypt()
    opt = crypten.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref = torch.optim.SGD(plain.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    for _ in range(3):
        opt.zero_grad()
        crypten.nn.MSELoss()(model(crypten.cryptensor(x)), crypten.cryptensor(y)).backward()
        opt.step()
        ref.zero_grad()
        F.mse_loss(plain(x), y).backward()
        ref.step()
    for p, q in zip(model.decrypt().parameters(), plain.parameters()):
        assert torch.allclose(p, q, atol=1e-3)


def test_register_safe_class_lets_torch_load_a_whole_model(tmp_path: Path) -> None:
    module = type(sys)("crypten_safe_class_test")
    sys.modules[module.__name__] = module
    try:
        exec(  # a class pickled by its module and name, as a notebook's is
            "import torch\nclass Net(torch.nn.Module):\n"
            "    def __init__(self):\n        super().__init__()\n"
            "        self.fc = torch.nn.Linear(2, 1)\n",
            module.__dict__,
        )
        torch.save(module.Net(), tmp_path / "net.pth")
        with pytest.raises(Exception, match="Weights only load failed"):
            torch.load(tmp_path / "net.pth")
        crypten.common.serial.register_safe_class(module.Net)
        loaded = crypten.load_from_party(tmp_path / "net.pth", src=0)
        assert isinstance(loaded, module.Net) and isinstance(loaded.fc, nn.Linear)
    finally:
        sys.modules.pop(module.__name__)


# -- run_multiprocess: ranks as CrypTen runs them ---------------------------------------------------


def test_ranks_sources_and_return_values() -> None:
    @run_multiprocess(world_size=3)
    def main(scale: float) -> tuple[int, int, list[float]]:
        rank = comm.get().get_rank()
        x = torch.tensor([float(rank), 10.0 * rank]) * scale  # a different tensor per rank
        mine = [crypten.cryptensor(x, src=i).get_plain_text().tolist() for i in range(3)]
        return rank, comm.get().get_world_size(), mine

    out = main(2.0)
    assert [r for r, _, _ in out] == [0, 1, 2] and {n for _, n, _ in out} == {3}
    for _, _, seen in out:  # every rank decrypts each source's own value
        assert seen == [[0.0, 0.0], [2.0, 20.0], [4.0, 40.0]]
    assert comm.get().get_rank() == 0 and comm.get().get_world_size() == 2  # outside: rank 0


def test_encrypt_takes_the_src_ranks_model() -> None:
    @run_multiprocess(world_size=2)
    def main() -> list[float]:
        rank = comm.get().get_rank()
        torch.manual_seed(rank)  # (each rank's own weights; torch's RNG is one per process)
        layer = nn.Linear(2, 1)
        with torch.no_grad():
            layer.weight.fill_(float(rank + 1))
        model = crypten.nn.from_pytorch(layer, torch.empty(1, 2)).encrypt(src=1)
        out = model(crypten.cryptensor(torch.ones(1, 2)))
        return [
            out.get_plain_text().item(),
            float(model.module.bias.get(delete=False)),
        ]  # (a SharedTensor)

    (a, bias), (b, bias_1) = main()
    assert a == b and bias == bias_1 and abs(a - (4.0 + bias)) < 1e-3  # rank 1's weights: 2, 2


def test_crypten_modules_built_by_each_rank_share_one_set_of_weights() -> None:
    @run_multiprocess(world_size=2)
    def main() -> Any:
        rank = comm.get().get_rank()
        model = crypten.nn.Linear(2, 1)
        with torch.no_grad():
            model.weight.fill_(float(rank + 1))
            model.bias.zero_()
        model.encrypt(src=0)
        opt = crypten.optim.SGD(model.parameters(), lr=0.5)  # one per rank, same parameters
        x, y = crypten.cryptensor(torch.ones(1, 2)), crypten.cryptensor(torch.zeros(1, 1))
        opt.zero_grad()
        crypten.nn.MSELoss()(model(x), y).backward()
        opt.step()  # one step, though every rank calls it
        return model.weight.get(delete=False)  # (a SharedTensor, which every rank reads)

    w0, w1 = main()
    # rank 0's weights (1, 1): loss (2 - 0)^2, gradient 2 * 2 = 4 each, one step of 0.5
    assert torch.allclose(w0, torch.tensor([[-1.0, -1.0]]), atol=1e-3) and torch.equal(w0, w1)


def test_printing_from_ranks() -> None:
    @run_multiprocess(world_size=3)
    def main() -> None:
        rank = comm.get().get_rank()
        crypten.print(f"only rank 0 ({rank})")
        crypten.print(f"rank {rank} in order", in_order=True)
        crypten.print(f"rank {rank} of 1 and 2", dst=[1, 2])

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main()
    lines = buf.getvalue().splitlines()
    assert "only rank 0 (0)" in lines and not any("only rank 0 (1)" in ln for ln in lines)
    ordered = [ln for ln in lines if "in order" in ln]
    assert ordered == ["rank 0 in order", "rank 1 in order", "rank 2 in order"]
    assert sorted(ln for ln in lines if "of 1 and 2" in ln) == [
        "rank 1 of 1 and 2",
        "rank 2 of 1 and 2",
    ]


def test_decrypting_to_one_rank() -> None:
    @run_multiprocess(world_size=2)
    def main() -> Any:
        return crypten.cryptensor([3.0]).get_plain_text(dst=1)

    assert main()[0] is None and main()[1].tolist() == [3.0]


def test_an_error_in_one_rank_is_raised_and_stops_the_others() -> None:
    @run_multiprocess(world_size=3)
    def main() -> None:
        if comm.get().get_rank() == 2:
            raise KeyError("rank 2's own error")
        crypten.cryptensor([1.0]).get_plain_text()

    with pytest.raises(KeyError, match="rank 2's own error"):
        main()


def test_ranks_making_different_calls_are_told_so() -> None:
    @run_multiprocess(world_size=2)
    def skips() -> None:
        if comm.get().get_rank() == 0:
            crypten.cryptensor([1.0])

    with pytest.raises(crypten.CollectiveMismatchError, match="same crypten calls"):
        skips()

    @run_multiprocess(world_size=2)
    def differs() -> None:
        x = crypten.cryptensor([1.0])
        if comm.get().get_rank() == 0:
            x.get_plain_text()
        else:
            (x + 1).get_plain_text()

    with pytest.raises(crypten.CollectiveMismatchError, match="where rank 1 called"):
        differs()

    @run_multiprocess(world_size=2)
    def nested() -> None:
        run_multiprocess(world_size=2)(lambda: None)()

    with pytest.raises(crypten.CollectiveMismatchError, match="inside"):
        nested()


# -- communication statistics ----------------------------------------------------------------


def test_communication_stats_count_what_mpc_stats_counts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    x, y = enc(torch.randn(64)), enc(torch.randn(64))
    crypten.reset_communication_stats()
    with mpc.stats() as rec:
        (x * y > 0).get_plain_text()
    st = comm.get().get_communication_stats()
    assert st["rounds"] == rec.rounds > 0
    assert (
        st["bytes_per_party"] == rec.bytes_per_party
        and st["bytes"] == rec.bytes_per_party["party0"]
    )
    assert st["dealer_bytes"] == rec.dealer_bytes > 0 and st["time"] > 0
    crypten.print_communication_stats()
    out = capsys.readouterr().out
    assert f"Rounds: {rec.rounds}\n" in out and f"Bytes: {st['bytes']} (party party0)" in out
    crypten.reset_communication_stats()
    assert comm.get().get_communication_stats()["rounds"] == 0


# -- CrypTen's linear SVM (tutorial 3's training) against plaintext, from the same start ------------


def test_linear_svm_trains_as_in_plaintext(capsys: pytest.CaptureFixture[str]) -> None:
    from crypten_linear_svm import evaluate_linear_svm, train_linear_svm

    torch.manual_seed(1)
    features, w_true, b_true = torch.randn(20, 200), torch.randn(1, 20), torch.randn(1)
    labels = w_true.matmul(features).add(b_true).sign()
    torch.manual_seed(5)
    w, b = train_linear_svm(enc(features), enc(labels), epochs=8, lr=1.0)
    encrypted = capsys.readouterr().out
    torch.manual_seed(5)
    w_plain, b_plain = train_linear_svm(features, labels, epochs=8, lr=1.0)
    assert encrypted == capsys.readouterr().out  # each epoch's accuracy, to the digit
    assert torch.allclose(w.get_plain_text(), w_plain, atol=1e-3)
    assert torch.allclose(b.get_plain_text(), b_plain, atol=1e-3)
    evaluate_linear_svm(features, labels, w, b)
    assert capsys.readouterr().out.startswith("Test accuracy ")


# -- served workers ------------------------------------------------------------------------------


@pytest.mark.network
def test_parties_given_as_served_workers(network_cluster: Any) -> None:
    parties = [network_cluster.fresh("alice"), network_cluster.fresh("bob")]
    crypten.init(parties=parties, crypto_provider=network_cluster.fresh("carol"))
    try:
        x = enc([1.0, -2.0, 3.0])
        assert torch.allclose(
            (x * x - 1).get_plain_text(), torch.tensor([0.0, 3.0, 8.0]), atol=1e-3
        )

        @run_multiprocess(world_size=2)
        def main() -> Any:
            rank = comm.get().get_rank()
            return (comm.get().get_name(), crypten.cryptensor([rank + 1.0], src=1).get_plain_text())

        (name0, v0), (name1, v1) = main()
        assert (name0, name1) == ("alice", "bob") and v0.item() == v1.item() == 2.0
        with pytest.raises(ValueError, match="2 to 2 parties"):
            run_multiprocess(world_size=3)(lambda: None)()
    finally:
        network_cluster.close_connections()


def test_requires_grad_after_encryption_fills_grad() -> None:
    x = torch.tensor([0.5, -1.0, 2.0])
    x_enc = enc(x).requires_grad_()
    assert x_enc.requires_grad and x_enc.grad is None
    (x_enc * x_enc).sum().backward()
    assert torch.allclose(x_enc.grad.get_plain_text(), 2 * x, atol=4 * UNIT)


def test_a_gradient_that_depends_on_no_secret_comes_back_encrypted() -> None:
    x_enc = enc([1.0, 2.0, 3.0, 4.0]).requires_grad_()
    x_enc.mean().backward()  # d mean / dx = 1/4: torch computes it in the clear
    assert crypten.is_encrypted_tensor(x_enc.grad)
    assert torch.allclose(x_enc.grad.get_plain_text(), torch.full((4,), 0.25), atol=UNIT)
