"""Tests for the plaintext digits data and CNN used by the encrypted-inference demo."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("sklearn")

from mpc.examples.digits import (  # noqa: E402
    accuracy,
    load_digits_split,
    make_digits_cnn,
    train_digits_cnn,
)

ALLOWED_LAYERS = (nn.Conv2d, nn.ReLU, nn.MaxPool2d, nn.Flatten, nn.Linear)


@pytest.fixture(scope="module")
def split() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return load_digits_split()


@pytest.fixture(scope="module")
def trained() -> tuple[nn.Module, float]:
    return train_digits_cnn(seed=0)


def test_split_shapes_dtypes_and_range(split) -> None:
    x_train, y_train, x_test, y_test = split
    assert x_train.dtype == x_test.dtype == torch.float32
    assert y_train.dtype == y_test.dtype == torch.int64
    assert x_train.shape[1:] == x_test.shape[1:] == (1, 8, 8)
    assert x_train.shape[0] == y_train.shape[0]
    assert x_test.shape[0] == y_test.shape[0]
    assert y_train.dim() == y_test.dim() == 1
    assert x_train.shape[0] + x_test.shape[0] == 1797
    assert x_test.shape[0] == 450  # ceil(0.25 * 1797)
    for x in (x_train, x_test):
        assert x.min().item() >= 0.0
        assert x.max().item() <= 1.0
    assert x_train.max().item() == 1.0  # raw pixel value 16 maps to exactly 1
    assert set(y_train.tolist()) == set(y_test.tolist()) == set(range(10))


def test_split_is_stratified(split) -> None:
    _, y_train, _, y_test = split
    train_frac = torch.bincount(y_train, minlength=10).double() / len(y_train)
    test_frac = torch.bincount(y_test, minlength=10).double() / len(y_test)
    assert torch.allclose(train_frac, test_frac, atol=0.01)


def test_split_test_fraction() -> None:
    _, y_train, _, y_test = load_digits_split(test_fraction=0.5)
    assert abs(len(y_test) - len(y_train)) <= 1


def test_split_is_deterministic(split) -> None:
    again = load_digits_split(seed=0)
    for a, b in zip(split, again):
        assert torch.equal(a, b)
    other = load_digits_split(seed=1)
    assert not torch.equal(split[1], other[1])


def test_model_uses_only_supported_layers() -> None:
    model = make_digits_cnn()
    assert isinstance(model, nn.Sequential)
    for layer in model:
        assert isinstance(layer, ALLOWED_LAYERS), type(layer)
    out = model(torch.zeros(5, 1, 8, 8))
    assert out.shape == (5, 10)


def test_model_trains_to_high_accuracy(trained, split) -> None:
    model, test_acc = trained
    assert not model.training
    assert test_acc >= 0.95
    _, _, x_test, y_test = split
    assert accuracy(model, x_test, y_test) == pytest.approx(test_acc)
    x_train, y_train, _, _ = split
    assert accuracy(model, x_train, y_train) >= 0.95


def test_accuracy_counts_correct_predictions() -> None:
    # A "model" whose logits are the inputs themselves.
    model = nn.Flatten()
    x = torch.eye(4)
    assert accuracy(model, x, torch.tensor([0, 1, 2, 3])) == 1.0
    assert accuracy(model, x, torch.tensor([0, 1, 0, 0])) == 0.5
    # Evaluation does not leave the model in a different mode.
    model.train()
    accuracy(model, x, torch.tensor([0, 1, 2, 3]))
    assert model.training


def test_training_is_deterministic() -> None:
    model_a, acc_a = train_digits_cnn(epochs=2, seed=3)
    model_b, acc_b = train_digits_cnn(epochs=2, seed=3)
    assert acc_a == acc_b
    state_a, state_b = model_a.state_dict(), model_b.state_dict()
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        assert torch.equal(state_a[key], state_b[key]), key
    model_c, _ = train_digits_cnn(epochs=2, seed=4)
    assert not torch.equal(model_a[0].weight, model_c[0].weight)


def test_training_preserves_global_rng_state() -> None:
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    train_digits_cnn(epochs=1, seed=0)
    assert torch.equal(torch.get_rng_state(), before)
    # The global stream continues exactly as if training had not happened.
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    train_digits_cnn(epochs=1, seed=0)
    assert torch.equal(torch.rand(3), expected)
