"""The code cells of CrypTen's tutorials 1-4 and 7, as their users wrote them, with only the import
lines and the launcher's data changed; run by tests/test_crypten_notebooks.py.

Source: facebookresearch/CrypTen, tutorials/ at commit 775868a0 (the tutorials last changed in
0effc899, April 2021): Tutorial_1_Basics_of_CrypTen_Tensors, Tutorial_2_Inside_CrypTensors,
Tutorial_3_Introduction_to_Access_Control, Tutorial_4_Classification_with_Encrypted_Neural_Networks
and Tutorial_7_Training_an_Encrypted_Neural_Network (the training tutorial). CrypTen is
Copyright (c) Facebook, Inc. and its affiliates, under the MIT licence:

    Permission is hereby granted, free of charge, to any person obtaining a copy of this software
    and associated documentation files (the "Software"), to deal in the Software without
    restriction, including without limitation the rights to use, copy, modify, merge, publish,
    distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the
    Software is furnished to do so, subject to the following conditions: The above copyright
    notice and this permission notice shall be included in all copies or substantial portions of
    the Software. THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
    IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A
    PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE
    LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR
    OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
    DEALINGS IN THE SOFTWARE.

Each cell is (its index in the notebook, its source); markdown and empty cells are left out.
Every changed line ends with a ``# CHANGED`` comment that gives the original:
``import crypten`` -> ``import mpc.crypten as crypten`` and the like, and tutorial 3's import
of CrypTen's examples/mpc_linear_svm (ported in tests/crypten_linear_svm.py). The launcher,
``@mpc.run_multiprocess(world_size=2)``, runs as written. Cells that cannot run offline are
replaced, and say so: the ``%run ./mnist_utils.py`` cells of tutorials 4 and 7, which download
MNIST (:func:`mnist_utils` writes the same files from scikit-learn's digits), and one cell added
to tutorial 4 in place of the pre-trained model file CrypTen's repository ships
(:func:`train_alice_model`).
"""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Any

import torch
import torch.nn.functional as F

NOTEBOOKS: dict[str, tuple[str, list[tuple[int, str]]]] = {
    "tutorial1": (
        "Tutorial_1_Basics_of_CrypTen_Tensors.ipynb",
        [
            (
                1,
                """import mpc.crypten as crypten  # CHANGED (import), was: import crypten
import torch

crypten.init()""",
            ),
            (
                3,
                """# Create torch tensor
x = torch.tensor([1.0, 2.0, 3.0])

# Encrypt x
x_enc = crypten.cryptensor(x)

# Decrypt x
x_dec = x_enc.get_plain_text()
crypten.print(x_dec)


# Create python list
y = [4.0, 5.0, 6.0]

# Encrypt x
y_enc = crypten.cryptensor(y)

# Decrypt x
y_dec = y_enc.get_plain_text()
crypten.print(y_dec)""",
            ),
            (
                5,
                r"""#Arithmetic operations between CrypTensors and plaintext tensors
x_enc = crypten.cryptensor([1.0, 2.0, 3.0])

y = 2.0
y_enc = crypten.cryptensor(2.0)


# Addition
z_enc1 = x_enc + y      # Public
z_enc2 = x_enc + y_enc  # Private
crypten.print("\nPublic  addition:", z_enc1.get_plain_text())
crypten.print("Private addition:", z_enc2.get_plain_text())


# Subtraction
z_enc1 = x_enc - y      # Public
z_enc2 = x_enc - y_enc  # Private
crypten.print("\nPublic  subtraction:", z_enc1.get_plain_text())
print("Private subtraction:", z_enc2.get_plain_text())

# Multiplication
z_enc1 = x_enc * y      # Public
z_enc2 = x_enc * y_enc  # Private
print("\nPublic  multiplication:", z_enc1.get_plain_text())
print("Private multiplication:", z_enc2.get_plain_text())

# Division
z_enc1 = x_enc / y      # Public
z_enc2 = x_enc / y_enc  # Private
print("\nPublic  division:", z_enc1.get_plain_text())
print("Private division:", z_enc2.get_plain_text())""",
            ),
            (
                7,
                r"""#Construct two example CrypTensors
x_enc = crypten.cryptensor([1.0, 2.0, 3.0, 4.0, 5.0])

y = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])
y_enc = crypten.cryptensor(y)

# Print values:
print("x: ", x_enc.get_plain_text())
print("y: ", y_enc.get_plain_text())

# Less than
z_enc1 = x_enc < y      # Public
z_enc2 = x_enc < y_enc  # Private
print("\nPublic  (x < y) :", z_enc1.get_plain_text())
print("Private (x < y) :", z_enc2.get_plain_text())

# Less than or equal
z_enc1 = x_enc <= y      # Public
z_enc2 = x_enc <= y_enc  # Private
print("\nPublic  (x <= y):", z_enc1.get_plain_text())
print("Private (x <= y):", z_enc2.get_plain_text())

# Greater than
z_enc1 = x_enc > y      # Public
z_enc2 = x_enc > y_enc  # Private
print("\nPublic  (x > y) :", z_enc1.get_plain_text())
print("Private (x > y) :", z_enc2.get_plain_text())

# Greater than or equal
z_enc1 = x_enc >= y      # Public
z_enc2 = x_enc >= y_enc  # Private
print("\nPublic  (x >= y):", z_enc1.get_plain_text())
print("Private (x >= y):", z_enc2.get_plain_text())

# Equal
z_enc1 = x_enc == y      # Public
z_enc2 = x_enc == y_enc  # Private
print("\nPublic  (x == y):", z_enc1.get_plain_text())
print("Private (x == y):", z_enc2.get_plain_text())

# Not Equal
z_enc1 = x_enc != y      # Public
z_enc2 = x_enc != y_enc  # Private
print("\nPublic  (x != y):", z_enc1.get_plain_text())
print("Private (x != y):", z_enc2.get_plain_text())""",
            ),
            (
                9,
                r"""torch.set_printoptions(sci_mode=False)

#Construct example input CrypTensor
x = torch.tensor([0.1, 0.3, 0.5, 1.0, 1.5, 2.0, 2.5])
x_enc = crypten.cryptensor(x)

# Reciprocal
z = x.reciprocal()          # Public
z_enc = x_enc.reciprocal()  # Private
print("\nPublic  reciprocal:", z)
print("Private reciprocal:", z_enc.get_plain_text())

# Logarithm
z = x.log()          # Public
z_enc = x_enc.log()  # Private
print("\nPublic  logarithm:", z)
print("Private logarithm:", z_enc.get_plain_text())

# Exp
z = x.exp()          # Public
z_enc = x_enc.exp()  # Private
print("\nPublic  exponential:", z)
print("Private exponential:", z_enc.get_plain_text())

# Sqrt
z = x.sqrt()          # Public
z_enc = x_enc.sqrt()  # Private
print("\nPublic  square root:", z)
print("Private square root:", z_enc.get_plain_text())

# Tanh
z = x.tanh()          # Public
z_enc = x_enc.tanh()  # Private
print("\nPublic  tanh:", z)
print("Private tanh:", z_enc.get_plain_text())""",
            ),
            (
                11,
                r"""x_enc = crypten.cryptensor(2.0)
y_enc = crypten.cryptensor(4.0)

a, b = 2, 3

# Normal Control-flow code will raise an error
try:
    if x_enc < y_enc:
        z = a
    else:
        z = b
except RuntimeError as error:
    print(f"RuntimeError caught: \"{error}\"\n")


# Instead use a mathematical expression
use_a = (x_enc < y_enc)
z_enc = use_a * a + (1 - use_a) * b
print("z:", z_enc.get_plain_text())


# Or use the `where` function
z_enc = crypten.where(x_enc < y_enc, a, b)
print("z:", z_enc.get_plain_text())""",
            ),
            (
                13,
                r"""x_enc = crypten.cryptensor([1.0, 2.0, 3.0])
y_enc = crypten.cryptensor([4.0, 5.0, 6.0])

# Indexing
z_enc = x_enc[:-1]
print("Indexing:\n", z_enc.get_plain_text())

# Concatenation
z_enc = crypten.cat([x_enc, y_enc])
print("\nConcatenation:\n", z_enc.get_plain_text())

# Stacking
z_enc = crypten.stack([x_enc, y_enc])
print('\nStacking:\n', z_enc.get_plain_text())

# Reshaping
w_enc = z_enc.reshape(-1, 6)
print('\nReshaping:\n', w_enc.get_plain_text())""",
            ),
        ],
    ),
    "tutorial2": (
        "Tutorial_2_Inside_CrypTensors.ipynb",
        [
            (
                1,
                """#import the libraries
import mpc.crypten as crypten  # CHANGED (import), was: import crypten
import torch

#initialize crypten
crypten.init()
#Disables OpenMP threads -- needed by @mpc.run_multiprocess which uses fork
torch.set_num_threads(1)""",
            ),
            (
                3,
                """#Constructing CrypTensors with ptype attribute

#arithmetic secret-shared tensors
x_enc = crypten.cryptensor([1.0, 2.0, 3.0], ptype=crypten.mpc.arithmetic)
print("x_enc internal type:", x_enc.ptype)

#binary secret-shared tensors
y = torch.tensor([1, 2, 1], dtype=torch.int32)
y_enc = crypten.cryptensor(y, ptype=crypten.mpc.binary)
print("y_enc internal type:", y_enc.ptype)""",
            ),
            (
                5,
                r"""import mpc.crypten.mpc as mpc  # CHANGED (import), was: import crypten.mpc as mpc
import mpc.crypten.communicator as comm  # CHANGED (import), was: import crypten.communicator as comm

@mpc.run_multiprocess(world_size=2)
def examine_arithmetic_shares():
    x_enc = crypten.cryptensor([1, 2, 3], ptype=crypten.mpc.arithmetic)

    rank = comm.get().get_rank()
    crypten.print(f"\nRank {rank}:\n {x_enc}\n", in_order=True)

x = examine_arithmetic_shares()""",
            ),
            (
                7,
                r"""@mpc.run_multiprocess(world_size=2)
def examine_binary_shares():
    x_enc = crypten.cryptensor([2, 3], ptype=crypten.mpc.binary)

    rank = comm.get().get_rank()
    crypten.print(f"\nRank {rank}:\n {x_enc}\n", in_order=True)

x = examine_binary_shares()""",
            ),
            (
                9,
                r"""from mpc.crypten.mpc import MPCTensor  # CHANGED (import), was: from crypten.mpc import MPCTensor

@mpc.run_multiprocess(world_size=2)
def examine_conversion():
    x = torch.tensor([1, 2, 3])
    rank = comm.get().get_rank()

    # create an MPCTensor with arithmetic secret sharing
    x_enc_arithmetic = MPCTensor(x, ptype=crypten.mpc.arithmetic)

    # To binary
    x_enc_binary = x_enc_arithmetic.to(crypten.mpc.binary)
    x_from_binary = x_enc_binary.get_plain_text()

    # print only once
    crypten.print("to(crypten.binary):")
    crypten.print(f"  ptype: {x_enc_binary.ptype}\n  plaintext: {x_from_binary}\n")


    # To arithmetic
    x_enc_arithmetic = x_enc_arithmetic.to(crypten.mpc.arithmetic)
    x_from_arithmetic = x_enc_arithmetic.get_plain_text()

    # print only once
    crypten.print("to(crypten.arithmetic):")
    crypten.print(f"  ptype: {x_enc_arithmetic.ptype}\n  plaintext: {x_from_arithmetic}\n")


z = examine_conversion()""",
            ),
            (
                11,
                """@mpc.run_multiprocess(world_size=3)
def examine_sources():
    # Create a different tensor on each rank
    rank = comm.get().get_rank()
    x = torch.tensor(rank)
    crypten.print(f"Rank {rank}: {x}", in_order=True)

    #
    world_size = comm.get().get_world_size()
    for i in range(world_size):
        x_enc = crypten.cryptensor(x, src=i)
        z = x_enc.get_plain_text()

        # Only print from one process to avoid duplicates
        crypten.print(f"Source {i}: {z}")

x = examine_sources()""",
            ),
        ],
    ),
    "tutorial3": (
        "Tutorial_3_Introduction_to_Access_Control.ipynb",
        [
            (
                1,
                """import mpc.crypten as crypten  # CHANGED (import), was: import crypten
import torch

crypten.init()
torch.set_num_threads(1)""",
            ),
            (
                3,
                """num_features = 100
num_train_examples = 1000
num_test_examples = 100
epochs = 40
lr = 3.0

# Set random seed for reproducibility
torch.manual_seed(1)

features = torch.randn(num_features, num_train_examples)
w_true = torch.randn(1, num_features)
b_true = torch.randn(1)

labels = w_true.matmul(features).add(b_true).sign()

test_features = torch.randn(num_features, num_test_examples)
test_labels = w_true.matmul(test_features).add(b_true).sign()""",
            ),
            (
                5,
                """ALICE = 0
BOB = 1""",
            ),
            (
                7,
                """from crypten_linear_svm import train_linear_svm, evaluate_linear_svm  # CHANGED (import), was: from examples.mpc_linear_svm.mpc_linear_svm import train_linear_svm, evaluate_linear_svm""",
            ),
            (
                9,
                """from mpc.crypten import mpc  # CHANGED (import), was: from crypten import mpc

# Specify file locations to save each piece of data
filenames = {
    "features": "/tmp/features.pth",
    "labels": "/tmp/labels.pth",
    "features_alice": "/tmp/features_alice.pth",
    "features_bob": "/tmp/features_bob.pth",
    "samples_alice": "/tmp/samples_alice.pth",
    "samples_bob": "/tmp/samples_bob.pth",
    "w_true": "/tmp/w_true.pth",
    "b_true": "/tmp/b_true.pth",
    "test_features": "/tmp/test_features.pth",
    "test_labels": "/tmp/test_labels.pth",
}


@mpc.run_multiprocess(world_size=2)
def save_all_data():
    # Save features, labels for Data Labeling example
    crypten.save(features, filenames["features"])
    crypten.save(labels, filenames["labels"])

    # Save split features for Feature Aggregation example
    features_alice = features[:50]
    features_bob = features[50:]

    crypten.save_from_party(features_alice, filenames["features_alice"], src=ALICE)
    crypten.save_from_party(features_bob, filenames["features_bob"], src=BOB)

    # Save split dataset for Dataset Aggregation example
    samples_alice = features[:, :500]
    samples_bob = features[:, 500:]
    crypten.save_from_party(samples_alice, filenames["samples_alice"], src=ALICE)
    crypten.save_from_party(samples_bob, filenames["samples_bob"], src=BOB)

    # Save true model weights and biases for Model Hiding example
    crypten.save_from_party(w_true, filenames["w_true"], src=ALICE)
    crypten.save_from_party(b_true, filenames["b_true"], src=ALICE)

    crypten.save_from_party(test_features, filenames["test_features"], src=BOB)
    crypten.save_from_party(test_labels, filenames["test_labels"], src=BOB)

save_all_data()""",
            ),
            (
                11,
                '''from mpc.crypten import mpc  # CHANGED (import), was: from crypten import mpc

@mpc.run_multiprocess(world_size=2)
def data_labeling_example():
    """Apply data labeling access control model"""
    # Alice loads features, Bob loads labels
    features_enc = crypten.load_from_party(filenames["features"], src=ALICE)
    labels_enc = crypten.load_from_party(filenames["labels"], src=BOB)

    # Execute training
    w, b = train_linear_svm(features_enc, labels_enc, epochs=epochs, lr=lr)

    # Evaluate model
    evaluate_linear_svm(test_features, test_labels, w, b)

data_labeling_example()''',
            ),
            (
                13,
                '''@mpc.run_multiprocess(world_size=2)
def feature_aggregation_example():
    """Apply feature aggregation access control model"""
    # Alice loads some features, Bob loads other features
    features_alice_enc = crypten.load_from_party(filenames["features_alice"], src=ALICE)
    features_bob_enc = crypten.load_from_party(filenames["features_bob"], src=BOB)

    # Concatenate features
    features_enc = crypten.cat([features_alice_enc, features_bob_enc], dim=0)

    # Encrypt labels
    labels_enc = crypten.cryptensor(labels)

    # Execute training
    w, b = train_linear_svm(features_enc, labels_enc, epochs=epochs, lr=lr)

    # Evaluate model
    evaluate_linear_svm(test_features, test_labels, w, b)

feature_aggregation_example()''',
            ),
            (
                15,
                '''@mpc.run_multiprocess(world_size=2)
def dataset_augmentation_example():
    """Apply dataset augmentation access control model"""
    # Alice loads some samples, Bob loads other samples
    samples_alice_enc = crypten.load_from_party(filenames["samples_alice"], src=ALICE)
    samples_bob_enc = crypten.load_from_party(filenames["samples_bob"], src=BOB)

    # Concatenate features
    samples_enc = crypten.cat([samples_alice_enc, samples_bob_enc], dim=1)

    labels_enc = crypten.cryptensor(labels)

    # Execute training
    w, b = train_linear_svm(samples_enc, labels_enc, epochs=epochs, lr=lr)

    # Evaluate model
    evaluate_linear_svm(test_features, test_labels, w, b)

dataset_augmentation_example()''',
            ),
            (
                17,
                '''@mpc.run_multiprocess(world_size=2)
def model_hiding_example():
    """Apply model hiding access control model"""
    # Alice loads the model
    w_true_enc = crypten.load_from_party(filenames["w_true"], src=ALICE)
    b_true_enc = crypten.load_from_party(filenames["b_true"], src=ALICE)

    # Bob loads the features to be evaluated
    test_features_enc = crypten.load_from_party(filenames["test_features"], src=BOB)

    # Evaluate model
    evaluate_linear_svm(test_features_enc, test_labels, w_true_enc, b_true_enc)

model_hiding_example()''',
            ),
            (
                19,
                """import os

for fn in filenames.values():
    if os.path.exists(fn): os.remove(fn)""",
            ),
        ],
    ),
    "tutorial4": (
        "Tutorial_4_Classification_with_Encrypted_Neural_Networks.ipynb",
        [
            (
                1,
                """import mpc.crypten as crypten  # CHANGED (import), was: import crypten
import torch

crypten.init()
torch.set_num_threads(1)""",
            ),
            (
                2,
                """# REPLACED (offline): this cell ran CrypTen's tutorials/mnist_utils.py, which downloads MNIST
# with torchvision. Stand-in: scikit-learn's bundled 8x8 digits scaled up to 28x28, normalised,
# split and saved as the script does, to the same files.
from crypten_notebook_cells import mnist_utils
mnist_utils("--option train_v_test")""",
            ),
            (
                4,
                """# Define Alice's network
import torch.nn as nn
import torch.nn.functional as F

class AliceNet(nn.Module):
    def __init__(self):
        super(AliceNet, self).__init__()
        self.fc1 = nn.Linear(784, 128)
        self.fc2 = nn.Linear(128, 128)
        self.fc3 = nn.Linear(128, 10)

    def forward(self, x):
        out = self.fc1(x)
        out = F.relu(out)
        out = self.fc2(out)
        out = F.relu(out)
        out = self.fc3(out)
        return out

crypten.common.serial.register_safe_class(AliceNet)""",
            ),
            (
                6,
                """def compute_accuracy(output, labels):
    pred = output.argmax(1)
    correct = pred.eq(labels)
    correct_count = correct.sum(0, keepdim=True).float()
    accuracy = correct_count.mul_(100.0 / output.size(0))
    return accuracy""",
            ),
            (
                8,
                """ALICE = 0
BOB = 1""",
            ),
            (
                9,
                """# ADDED (offline), before cell 10 (in place of markdown cell 9): CrypTen's repository ships
# models/tutorial4_alice_model.pth, AliceNet trained on MNIST. Stand-in: AliceNet trained here
# on Alice's stand-in digits (/tmp/alice_train.pth), saved whole to the same path.
from crypten_notebook_cells import train_alice_model
train_alice_model(AliceNet(), "models/tutorial4_alice_model.pth")""",
            ),
            (
                10,
                """# Load pre-trained model to Alice
dummy_model = AliceNet()
plaintext_model = torch.load('models/tutorial4_alice_model.pth')

print(plaintext_model)

# Encrypt the model from Alice:

# 1. Create a dummy input with the same shape as the model input
dummy_input = torch.empty((1, 784))

# 2. Construct a CrypTen network with the trained model and dummy_input
private_model = crypten.nn.from_pytorch(plaintext_model, dummy_input)

# 3. Encrypt the CrypTen network with src=ALICE
private_model.encrypt(src=ALICE)

#Check that model is encrypted:
print("Model successfully encrypted:", private_model.encrypted)""",
            ),
            (
                12,
                r"""import mpc.crypten.mpc as mpc  # CHANGED (import), was: import crypten.mpc as mpc
import mpc.crypten.communicator as comm  # CHANGED (import), was: import crypten.communicator as comm

labels = torch.load('/tmp/bob_test_labels.pth').long()
count = 100 # For illustration purposes, we'll use only 100 samples for classification

@mpc.run_multiprocess(world_size=2)
def encrypt_model_and_data():
    # Load pre-trained model to Alice
    model = crypten.load_from_party('models/tutorial4_alice_model.pth', src=ALICE)

    # Encrypt model from Alice
    dummy_input = torch.empty((1, 784))
    private_model = crypten.nn.from_pytorch(model, dummy_input)
    private_model.encrypt(src=ALICE)

    # Load data to Bob
    data_enc = crypten.load_from_party('/tmp/bob_test.pth', src=BOB)
    data_enc2 = data_enc[:count]
    data_flatten = data_enc2.flatten(start_dim=1)

    # Classify the encrypted data
    private_model.eval()
    output_enc = private_model(data_flatten)

    # Compute the accuracy
    output = output_enc.get_plain_text()
    accuracy = compute_accuracy(output, labels[:count])
    crypten.print("\tAccuracy: {0:.4f}".format(accuracy.item()))

encrypt_model_and_data()""",
            ),
            (
                14,
                r"""@mpc.run_multiprocess(world_size=2)
def encrypt_model_and_data():
    # Load pre-trained model to Alice
    plaintext_model = crypten.load_from_party('models/tutorial4_alice_model.pth', src=ALICE)

    # Encrypt model from Alice
    dummy_input = torch.empty((1, 784))
    private_model = crypten.nn.from_pytorch(plaintext_model, dummy_input)
    private_model.encrypt(src=ALICE)

    # Load data to Bob
    data_enc = crypten.load_from_party('/tmp/bob_test.pth', src=BOB)
    data_enc2 = data_enc[:count]
    data_flatten = data_enc2.flatten(start_dim=1)

    # Classify the encrypted data
    private_model.eval()
    output_enc = private_model(data_flatten)

    # Verify the results are encrypted:
    crypten.print("Output tensor encrypted:", crypten.is_encrypted_tensor(output_enc))

    # Decrypting the result
    output = output_enc.get_plain_text()

    # Obtaining the labels
    pred = output.argmax(dim=1)
    crypten.print("Decrypted labels:\n", pred)

encrypt_model_and_data()""",
            ),
            (
                16,
                """import os

filenames = ['/tmp/alice_train.pth',
             '/tmp/alice_train_labels.pth',
             '/tmp/bob_test.pth',
             '/tmp/bob_test_labels.pth']

for fn in filenames:
    if os.path.exists(fn): os.remove(fn)""",
            ),
        ],
    ),
    "tutorial7": (
        "Tutorial_7_Training_an_Encrypted_Neural_Network.ipynb",
        [
            (
                1,
                """import mpc.crypten as crypten  # CHANGED (import), was: import crypten
import torch

crypten.init()
torch.set_num_threads(1)""",
            ),
            (
                2,
                """# REPLACED (offline): this cell ran CrypTen's tutorials/mnist_utils.py, which downloads MNIST
# with torchvision. Stand-in: scikit-learn's bundled 8x8 digits scaled up to 28x28, normalised,
# split and saved as the script does, to the same files.
from crypten_notebook_cells import mnist_utils
mnist_utils("--option features --reduced 100 --binary")""",
            ),
            (
                4,
                """import torch.nn as nn
import torch.nn.functional as F

#Define an example network
class ExampleNet(nn.Module):
    def __init__(self):
        super(ExampleNet, self).__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=5, padding=0)
        self.fc1 = nn.Linear(16 * 12 * 12, 100)
        self.fc2 = nn.Linear(100, 2) # For binary classification, final layer needs only 2 outputs

    def forward(self, x):
        out = self.conv1(x)
        out = F.relu(out)
        out = F.max_pool2d(out, 2)
        out = out.view(-1, 16 * 12 * 12)
        out = self.fc1(out)
        out = F.relu(out)
        out = self.fc2(out)
        return out

crypten.common.serial.register_safe_class(ExampleNet)""",
            ),
            (
                6,
                """# Define source argument values for Alice and Bob
ALICE = 0
BOB = 1""",
            ),
            (
                7,
                """# Load Alice's data
data_alice_enc = crypten.load_from_party('/tmp/alice_train.pth', src=ALICE)""",
            ),
            (
                8,
                """# We'll now set up the data for our small example below
# For illustration purposes, we will create toy data
# and encrypt all of it from source ALICE
x_small = torch.rand(100, 1, 28, 28)
y_small = torch.randint(1, (100,))

# Transform labels into one-hot encoding
label_eye = torch.eye(2)
y_one_hot = label_eye[y_small]

# Transform all data to CrypTensors
x_train = crypten.cryptensor(x_small, src=ALICE)
y_train = crypten.cryptensor(y_one_hot)

# Instantiate and encrypt a CrypTen model
model_plaintext = ExampleNet()
dummy_input = torch.empty(1, 1, 28, 28)
model = crypten.nn.from_pytorch(model_plaintext, dummy_input)
model.encrypt()""",
            ),
            (
                9,
                """# Example: Stochastic Gradient Descent in CrypTen

model.train() # Change to training mode
loss = crypten.nn.MSELoss() # Choose loss functions

# Set parameters: learning rate, num_epochs
learning_rate = 0.001
num_epochs = 2

# Train the model: SGD on encrypted data
for i in range(num_epochs):

    # forward pass
    output = model(x_train)
    loss_value = loss(output, y_train)

    # set gradients to zero
    model.zero_grad()

    # perform backward pass
    loss_value.backward()

    # update parameters
    model.update_parameters(learning_rate)

    # examine the loss after each epoch
    print("Epoch: {0:d} Loss: {1:.4f}".format(i, loss_value.get_plain_text()))""",
            ),
            (
                11,
                r'''import mpc.crypten.mpc as mpc  # CHANGED (import), was: import crypten.mpc as mpc
import mpc.crypten.communicator as comm  # CHANGED (import), was: import crypten.communicator as comm

# Convert labels to one-hot encoding
# Since labels are public in this use case, we will simply use them from loaded torch tensors
labels = torch.load('/tmp/train_labels.pth')
labels = labels.long()
labels_one_hot = label_eye[labels]

@mpc.run_multiprocess(world_size=2)
def run_encrypted_training():
    # Load data:
    x_alice_enc = crypten.load_from_party('/tmp/alice_train.pth', src=ALICE)
    x_bob_enc = crypten.load_from_party('/tmp/bob_train.pth', src=BOB)

    crypten.print(x_alice_enc.size())
    crypten.print(x_bob_enc.size())

    # Combine the feature sets: identical to Tutorial 3
    x_combined_enc = crypten.cat([x_alice_enc, x_bob_enc], dim=2)

    # Reshape to match the network architecture
    x_combined_enc = x_combined_enc.unsqueeze(1)


    # Commenting out due to intermittent failure in PyTorch codebase
    """
    # Initialize a plaintext model and convert to CrypTen model
    pytorch_model = ExampleNet()
    model = crypten.nn.from_pytorch(pytorch_model, dummy_input)
    model.encrypt()
    # Set train mode
    model.train()

    # Define a loss function
    loss = crypten.nn.MSELoss()

    # Define training parameters
    learning_rate = 0.001
    num_epochs = 2
    batch_size = 10
    num_batches = x_combined_enc.size(0) // batch_size

    rank = comm.get().get_rank()
    for i in range(num_epochs):
        crypten.print(f"Epoch {i} in progress:")

        for batch in range(num_batches):
            # define the start and end of the training mini-batch
            start, end = batch * batch_size, (batch + 1) * batch_size

            # construct CrypTensors out of training examples / labels
            x_train = x_combined_enc[start:end]
            y_batch = labels_one_hot[start:end]
            y_train = crypten.cryptensor(y_batch, requires_grad=True)

            # perform forward pass:
            output = model(x_train)
            loss_value = loss(output, y_train)

            # set gradients to "zero"
            model.zero_grad()

            # perform backward pass:
            loss_value.backward()

            # update parameters
            model.update_parameters(learning_rate)

            # Print progress every batch:
            batch_loss = loss_value.get_plain_text()
            crypten.print(f"\tBatch {(batch + 1)} of {num_batches} Loss {batch_loss.item():.4f}")
    """

run_encrypted_training()''',
            ),
            (
                13,
                """import os

filenames = ['/tmp/alice_train.pth',
             '/tmp/bob_train.pth',
             '/tmp/alice_test.pth',
             '/tmp/bob_test.pth',
             '/tmp/train_labels.pth',
             '/tmp/test_labels.pth']

for fn in filenames:
    if os.path.exists(fn): os.remove(fn)""",
            ),
        ],
    ),
}


# -- the offline stand-ins the replaced cells call --------------------------------------------


def digits_as_mnist() -> tuple[
    tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]
]:
    """MNIST's stand-in, as CrypTen's mnist_utils reads it (``dataset.data``: N x 28 x 28,
    ``dataset.targets``): scikit-learn's bundled 8x8 digits scaled up to 28x28 (0-255), the
    first 1500 of a fixed shuffle to train and the other 297 to test."""
    from sklearn.datasets import load_digits

    d = load_digits()
    images = torch.tensor(d.data, dtype=torch.float32).view(-1, 1, 8, 8) * (255 / 16)
    images = F.interpolate(images, size=(28, 28), mode="bilinear", align_corners=False)[:, 0]
    target = torch.tensor(d.target, dtype=torch.int64)
    order = torch.randperm(len(target), generator=torch.Generator().manual_seed(0))
    train, test = order[:1500], order[1500:]
    return (images[train], target[train]), (images[test], target[test])


def mnist_utils(argv: str) -> None:
    """``%run ./mnist_utils.py ARGV`` on the digits stand-in: the options of CrypTen's
    tutorials/mnist_utils.py that tutorials 4 and 7 use (``train_v_test`` and ``features``,
    ``--reduced``, ``--binary``, ``--ratio``, ``--dest``), normalised by the data's mean and
    standard deviation and written to the same files."""
    parser = argparse.ArgumentParser("mnist_utils stand-in")
    parser.add_argument("--option", choices={"features", "train_v_test"}, required=True)
    parser.add_argument("--ratio", type=float, default=0.72)
    parser.add_argument("--dest", default="/tmp")
    parser.add_argument("--reduced", type=int, default=None)
    parser.add_argument("--binary", action="store_true")
    args = parser.parse_args(shlex.split(argv))
    (train, train_labels), (test, test_labels) = digits_as_mnist()
    everything = torch.cat([train, test])
    mean, std = everything.mean(), everything.std()
    train, test = (train - mean) / std, (test - mean) / std
    if args.binary:
        train_labels, test_labels = (train_labels != 0).long(), (test_labels != 0).long()
    if args.reduced is not None:
        n = args.reduced
        train, test, train_labels, test_labels = (
            train[:n],
            test[:n],
            train_labels[:n],
            test_labels[:n],
        )

    def save(t: torch.Tensor, name: str) -> None:
        torch.save(t.clone(), os.path.join(args.dest, name))

    if args.option == "train_v_test":
        save(train, "alice_train.pth")
        save(test, "bob_test.pth")
        save(train_labels, "alice_train_labels.pth")
        save(test_labels, "bob_test_labels.pth")
    else:
        split = int(args.ratio * train.shape[1])
        save(train[:, :, :split], "alice_train.pth")
        save(train[:, :, split:], "bob_train.pth")
        save(test[:, :, :split], "alice_test.pth")
        save(test[:, :, split:], "bob_test.pth")
        save(train_labels, "train_labels.pth")
        save(test_labels, "test_labels.pth")


def train_alice_model(model: Any, path: str, epochs: int = 10) -> None:
    """The stand-in for CrypTen's models/tutorial4_alice_model.pth: ``model`` (AliceNet)
    trained on Alice's stand-in digits (/tmp/alice_train.pth, written by
    ``mnist_utils("--option train_v_test")``) and saved whole to ``path``."""
    torch.manual_seed(0)
    x = torch.load("/tmp/alice_train.pth").flatten(start_dim=1)
    y = torch.load("/tmp/alice_train_labels.pth").long()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(epochs):
        for i in torch.randperm(len(y)).split(64):
            opt.zero_grad()
            F.cross_entropy(model(x[i]), y[i]).backward()
            opt.step()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    torch.save(model, path)
