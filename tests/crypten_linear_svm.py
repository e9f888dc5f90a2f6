"""CrypTen's examples/mpc_linear_svm/mpc_linear_svm.py (facebookresearch/CrypTen at commit
775868a0), which CrypTen's Tutorial 3 imports: ``train_linear_svm`` and
``evaluate_linear_svm`` as written, with only the import lines changed (each marked
``# CHANGED``). The file's ``run_mpc_linear_svm`` driver is left out (no tutorial uses it);
``examples.meters.AverageMeter``, used only with ``print_time=True``, is replaced by a
stand-in of the same interface.

Copyright (c) Facebook, Inc. and its affiliates. This source code is licensed under the MIT
license (the notice is in tests/crypten_notebook_cells.py's docstring)."""

# ruff: noqa: UP031, UP032

import logging
import time

import torch

import mpc.crypten as crypten  # CHANGED (import), was: import crypten


class AverageMeter:  # CHANGED: stand-in for `from examples.meters import AverageMeter`
    """The running mean of the values added."""

    def __init__(self) -> None:
        self.total, self.count = 0.0, 0

    def add(self, value: float) -> None:
        self.total, self.count = self.total + value, self.count + 1

    def value(self) -> float:
        return self.total / max(self.count, 1)


def train_linear_svm(features, labels, epochs=50, lr=0.5, print_time=False):
    # Initialize random weights
    w = features.new(torch.randn(1, features.size(0)))
    b = features.new(torch.randn(1))

    if print_time:
        pt_time = AverageMeter()
        end = time.time()

    for epoch in range(epochs):
        # Forward
        label_predictions = w.matmul(features).add(b).sign()

        # Compute accuracy
        correct = label_predictions.mul(labels)
        accuracy = correct.add(1).div(2).mean()
        if crypten.is_encrypted_tensor(accuracy):
            accuracy = accuracy.get_plain_text()

        # Print Accuracy once
        if crypten.communicator.get().get_rank() == 0:
            print(f"Epoch {epoch} --- Training Accuracy %.2f%%" % (accuracy.item() * 100))

        # Backward
        loss_grad = -labels * (1 - correct) * 0.5  # Hinge loss
        b_grad = loss_grad.mean()
        w_grad = loss_grad.matmul(features.t()).div(loss_grad.size(1))

        # Update
        w -= w_grad * lr
        b -= b_grad * lr

        if print_time:
            iter_time = time.time() - end
            pt_time.add(iter_time)
            logging.info("    Time %.6f (%.6f)" % (iter_time, pt_time.value()))
            end = time.time()

    return w, b


def evaluate_linear_svm(features, labels, w, b):
    """Compute accuracy on a test set"""
    predictions = w.matmul(features).add(b).sign()
    correct = predictions.mul(labels)
    accuracy = correct.add(1).div(2).mean().get_plain_text()
    if crypten.communicator.get().get_rank() == 0:
        print("Test accuracy %.2f%%" % (accuracy.item() * 100))
