"""The code cells of PySyft 0.2's tutorials, as their users wrote them: Parts 1-12 at
v0.2.9 and Part 8 bis at v0.2.4 (OpenMined/PySyft, examples/tutorials/), with only the import
lines changed (``import syft as sy`` -> ``import pointers as sy``, ...). Empty cells are left
out. A cell that cannot run offline is replaced (downloads, files outside the repository): each
replacement says which cell it replaces and why. Run by tests/test_pysyft_notebooks.py."""

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

NOTEBOOKS: dict[str, tuple[str, list[tuple[int, str]]]] = {
    "part01": (
        "v0.2.9: Part 01 - The Basic Tools of Private Deep Learning.ipynb",
        [
            (
                3,
                """# Run this cell to see if things work
import sys

import torch
from torch.nn import Parameter
import torch.nn as nn
import torch.nn.functional as F

import pointers as sy
hook = sy.TorchHook(torch)

torch.tensor([1,2,3,4,5])""",
            ),
            (
                6,
                """x = torch.tensor([1,2,3,4,5])
y = x + x
print(y)""",
            ),
            (8, """bob = sy.VirtualWorker(hook, id="bob")"""),
            (
                10,
                """x = torch.tensor([1,2,3,4,5])
y = torch.tensor([1,1,1,1,1])""",
            ),
            (
                12,
                """x_ptr = x.send(bob)
y_ptr = y.send(bob)""",
            ),
            (13, """x_ptr"""),
            (15, """bob._objects"""),
            (16, """z = x_ptr + x_ptr"""),
            (17, """z"""),
            (18, """bob._objects"""),
            (20, """x_ptr"""),
            (22, """x_ptr.location"""),
            (23, """bob"""),
            (24, """bob == x_ptr.location"""),
            (25, """x_ptr.id_at_location"""),
            (26, """x_ptr.owner"""),
            (
                28,
                """me = sy.local_worker
me""",
            ),
            (29, """me == x_ptr.owner"""),
            (31, """x_ptr"""),
            (32, """x_ptr.get()"""),
            (33, """y_ptr"""),
            (34, """y_ptr.get()"""),
            (35, """z.get()"""),
            (36, """bob._objects"""),
            (
                39,
                """x = torch.tensor([1,2,3,4,5]).send(bob)
y = torch.tensor([1,1,1,1,1]).send(bob)""",
            ),
            (40, """z = x + y"""),
            (41, """z"""),
            (43, """z.get()"""),
            (45, """x"""),
            (46, """y"""),
            (
                47,
                """z = torch.add(x,y)
z""",
            ),
            (48, """z.get()"""),
            (
                50,
                """x = torch.tensor([1,2,3,4,5.], requires_grad=True).send(bob)
y = torch.tensor([1,1,1,1,1.], requires_grad=True).send(bob)""",
            ),
            (51, """z = (x + y).sum()"""),
            (52, """z.backward()"""),
            (53, """x = x.get()"""),
            (54, """x"""),
            (55, """x.grad"""),
        ],
    ),
    "part02": (
        "v0.2.9: Part 02 - Intro to Federated Learning.ipynb",
        [
            (
                2,
                """import torch
from torch import nn
from torch import optim""",
            ),
            (
                3,
                """
# A Toy Dataset
data = torch.tensor([[0,0],[0,1],[1,0],[1,1.]])
target = torch.tensor([[0],[0],[1],[1.]])

# A Toy Model
model = nn.Linear(2,1)

def train():
    # Training Logic
    opt = optim.SGD(params=model.parameters(),lr=0.1)
    for iter in range(20):

        # 1) erase previous gradients (if they exist)
        opt.zero_grad()

        # 2) make a prediction
        pred = model(data)

        # 3) calculate how much we missed
        loss = ((pred - target)**2).sum()

        # 4) figure out which weights caused us to miss
        loss.backward()

        # 5) change those weights
        opt.step()

        # 6) print our progress
        print(loss.data)""",
            ),
            (4, """train()"""),
            (
                6,
                """import pointers as sy
hook = sy.TorchHook(torch)
""",
            ),
            (
                7,
                """# create a couple workers

bob = sy.VirtualWorker(hook, id="bob")
alice = sy.VirtualWorker(hook, id="alice")
""",
            ),
            (
                8,
                """# A Toy Dataset
data = torch.tensor([[0,0],[0,1],[1,0],[1,1.]], requires_grad=True)
target = torch.tensor([[0],[0],[1],[1.]], requires_grad=True)

# get pointers to training data on each worker by
# sending some training data to bob and alice
data_bob = data[0:2]
target_bob = target[0:2]

data_alice = data[2:]
target_alice = target[2:]

# Iniitalize A Toy Model
model = nn.Linear(2,1)

data_bob = data_bob.send(bob)
data_alice = data_alice.send(alice)
target_bob = target_bob.send(bob)
target_alice = target_alice.send(alice)

# organize pointers into a list
datasets = [(data_bob,target_bob),(data_alice,target_alice)]""",
            ),
            (
                9,
                """from pointers.federated.floptimizer import Optims
workers = ['bob', 'alice']
optims = Optims(workers, optim=optim.Adam(params=model.parameters(),lr=0.1))""",
            ),
            (
                10,
                r"""def train():
    # Training Logic
    for iter in range(10):

        # NEW) iterate through each worker's dataset
        for data,target in datasets:

            # NEW) send model to correct worker
            model.send(data.location)

            #Call the optimizer for the worker using get_optim
            opt = optims.get_optim(data.location.id)
            #print(data.location.id)

            # 1) erase previous gradients (if they exist)
            opt.zero_grad()

            # 2) make a prediction
            pred = model(data)

            # 3) calculate how much we missed
            loss = ((pred - target)**2).sum()

            # 4) figure out which weights caused us to miss
            loss.backward()

            # 5) change those weights
            opt.step()

            # NEW) get model (with gradients)
            model.get()

            # 6) print our progress
            print(loss.get().data) # NEW) slight edit... need to call .get() on loss\

# federated averaging""",
            ),
            (11, """train()"""),
        ],
    ),
    "part03": (
        "v0.2.9: Part 03 - Advanced Remote Execution Tools.ipynb",
        [
            (
                1,
                """import torch
import pointers as sy
hook = sy.TorchHook(torch)""",
            ),
            (
                3,
                """bob = sy.VirtualWorker(hook, id='bob')
alice = sy.VirtualWorker(hook, id='alice')""",
            ),
            (
                4,
                """# this is a local tensor
x = torch.tensor([1,2,3,4])
x""",
            ),
            (
                5,
                """# this sends the local tensor to Bob
x_ptr = x.send(bob)

# this is now a pointer
x_ptr""",
            ),
            (
                6,
                """# now we can SEND THE POINTER to alice!!!
pointer_to_x_ptr = x_ptr.send(alice)

pointer_to_x_ptr""",
            ),
            (
                8,
                """# As you can see above, Bob still has the actual data (data is always stored in a LocalTensor type).
bob._objects""",
            ),
            (
                9,
                """# Alice, on the other hand, has x_ptr!! (notice how it points at bob)
alice._objects""",
            ),
            (
                11,
                """# and we can use .get() to get x_ptr back from Alice

x_ptr = pointer_to_x_ptr.get()
x_ptr""",
            ),
            (
                12,
                """# and then we can use x_ptr to get x back from Bob!

x = x_ptr.get()
x""",
            ),
            (14, """bob._objects"""),
            (15, """alice._objects"""),
            (
                16,
                """p2p2x = torch.tensor([1,2,3,4,5]).send(bob).send(alice)

y = p2p2x + p2p2x""",
            ),
            (17, """bob._objects"""),
            (18, """alice._objects"""),
            (19, """y.get().get()"""),
            (20, """bob._objects"""),
            (21, """alice._objects"""),
            (22, """p2p2x.get().get()"""),
            (23, """bob._objects"""),
            (24, """alice._objects"""),
            (
                26,
                """# x is now a pointer to the data which lives on Bob's machine
x = torch.tensor([1,2,3,4,5]).send(bob)""",
            ),
            (
                27,
                """print('  bob:', bob._objects)
print('alice:',alice._objects)""",
            ),
            (28, """x = x.move(alice)"""),
            (
                29,
                """print('  bob:', bob._objects)
print('alice:',alice._objects)""",
            ),
            (30, """x"""),
        ],
    ),
    "part04": (
        "v0.2.9: Part 04 - Federated Learning via Trusted Aggregator.ipynb",
        [
            (
                1,
                """import torch
import pointers as sy
import copy
hook = sy.TorchHook(torch)
from torch import nn, optim""",
            ),
            (
                3,
                """# create a couple workers

bob = sy.VirtualWorker(hook, id="bob")
alice = sy.VirtualWorker(hook, id="alice")
secure_worker = sy.VirtualWorker(hook, id="secure_worker")


# A Toy Dataset
data = torch.tensor([[0,0],[0,1],[1,0],[1,1.]], requires_grad=True)
target = torch.tensor([[0],[0],[1],[1.]], requires_grad=True)

# get pointers to training data on each worker by
# sending some training data to bob and alice
bobs_data = data[0:2].send(bob)
bobs_target = target[0:2].send(bob)

alices_data = data[2:].send(alice)
alices_target = target[2:].send(alice)""",
            ),
            (
                5,
                """# Iniitalize A Toy Model
model = nn.Linear(2,1)""",
            ),
            (
                7,
                """bobs_model = model.copy().send(bob)
alices_model = model.copy().send(alice)

bobs_opt = optim.SGD(params=bobs_model.parameters(),lr=0.1)
alices_opt = optim.SGD(params=alices_model.parameters(),lr=0.1)""",
            ),
            (
                10,
                """for i in range(10):

    # Train Bob's Model
    bobs_opt.zero_grad()
    bobs_pred = bobs_model(bobs_data)
    bobs_loss = ((bobs_pred - bobs_target)**2).sum()
    bobs_loss.backward()

    bobs_opt.step()
    bobs_loss = bobs_loss.get().data

    # Train Alice's Model
    alices_opt.zero_grad()
    alices_pred = alices_model(alices_data)
    alices_loss = ((alices_pred - alices_target)**2).sum()
    alices_loss.backward()

    alices_opt.step()
    alices_loss = alices_loss.get().data

    print("Bob:" + str(bobs_loss) + " Alice:" + str(alices_loss))""",
            ),
            (12, """alices_model.move(secure_worker)"""),
            (13, """bobs_model.move(secure_worker)"""),
            (
                16,
                """with torch.no_grad():
    model.weight.set_(((alices_model.weight.data + bobs_model.weight.data) / 2).get())
    model.bias.set_(((alices_model.bias.data + bobs_model.bias.data) / 2).get())
""",
            ),
            (
                18,
                """iterations = 10
worker_iters = 5

for a_iter in range(iterations):

    bobs_model = model.copy().send(bob)
    alices_model = model.copy().send(alice)

    bobs_opt = optim.SGD(params=bobs_model.parameters(),lr=0.1)
    alices_opt = optim.SGD(params=alices_model.parameters(),lr=0.1)

    for wi in range(worker_iters):

        # Train Bob's Model
        bobs_opt.zero_grad()
        bobs_pred = bobs_model(bobs_data)
        bobs_loss = ((bobs_pred - bobs_target)**2).sum()
        bobs_loss.backward()

        bobs_opt.step()
        bobs_loss = bobs_loss.get().data

        # Train Alice's Model
        alices_opt.zero_grad()
        alices_pred = alices_model(alices_data)
        alices_loss = ((alices_pred - alices_target)**2).sum()
        alices_loss.backward()

        alices_opt.step()
        alices_loss = alices_loss.get().data

    alices_model.move(secure_worker)
    bobs_model.move(secure_worker)
    with torch.no_grad():
        model.weight.set_(((alices_model.weight.data + bobs_model.weight.data) / 2).get())
        model.bias.set_(((alices_model.bias.data + bobs_model.bias.data) / 2).get())

    print("Bob:" + str(bobs_loss) + " Alice:" + str(alices_loss))""",
            ),
            (
                20,
                """preds = model(data)
loss = ((preds - target) ** 2).sum()""",
            ),
            (
                21,
                """print(preds)
print(target)
print(loss.data)""",
            ),
        ],
    ),
    "part05": (
        "v0.2.9: Part 05 - Welcome to the Sandbox.ipynb",
        [
            (
                1,
                """import torch
import pointers as sy
sy.create_sandbox(globals())""",
            ),
            (3, """workers"""),
            (5, """hook"""),
            (6, """bob"""),
            (8, """bob._objects"""),
            (
                10,
                """x = torch.tensor([1,2,3,4,5]).tag("#radio", "#hospital1").describe("The input datapoints to the hospital1 dataset.")
y = torch.tensor([5,4,3,2,1]).tag("#radio", "#hospital2").describe("The input datapoints to the hospital2 dataset.")
z = torch.tensor([1,2,3,4,5]).tag("#fun", "#mnist",).describe("The images in the MNIST training dataset.")""",
            ),
            (11, """x"""),
            (
                12,
                """x = x.send(bob)
y = y.send(bob)
z = z.send(bob)

# this searches for exact match within a tag or within the description
results = bob.search(["#radio"])""",
            ),
            (13, """results"""),
            (14, """print(results[0].description)"""),
            (16, """boston_housing_results = bob.search(["#boston", "#housing"])"""),
            (17, """boston_housing_results"""),
            (19, """grid = sy.PrivateGridNetwork(*workers)"""),
            (20, """results = grid.search("#boston")"""),
            (21, """boston_data = grid.search("#boston","#data")"""),
            (22, """boston_target = grid.search("#boston","#target")"""),
        ],
    ),
    "part06": (
        "v0.2.9: Part 06 - Federated Learning on MNIST using a CNN.ipynb",
        [
            (0, """epochs = 10"""),
            (
                3,
                """import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
# from torchvision import datasets, transforms  (import line changed: torchvision is not
# installed and MNIST cannot be downloaded offline; the cells that load it are replaced)""",
            ),
            (
                5,
                """import pointers as sy  # <-- NEW: import the Pysyft library
hook = sy.TorchHook(torch)  # <-- NEW: hook PyTorch ie add extra functionalities to support Federated Learning
bob = sy.VirtualWorker(hook, id="bob")  # <-- NEW: define remote worker bob
alice = sy.VirtualWorker(hook, id="alice")  # <-- NEW: and alice""",
            ),
            (
                7,
                """class Arguments():
    def __init__(self):
        self.batch_size = 64
        self.test_batch_size = 1000
        self.epochs = epochs
        self.lr = 0.01
        self.momentum = 0.5
        self.no_cuda = False
        self.seed = 1
        self.log_interval = 30
        self.save_model = False

args = Arguments()

use_cuda = not args.no_cuda and torch.cuda.is_available()

torch.manual_seed(args.seed)

device = torch.device("cuda" if use_cuda else "cpu")

kwargs = {'num_workers': 1, 'pin_memory': True} if use_cuda else {}""",
            ),
            (
                9,
                """# REPLACED (offline): this cell downloaded MNIST with torchvision. Stand-in: scikit-learn's
# bundled 8x8 digits, scaled up to MNIST's 1x28x28 and normalised as the cell's transforms
# did (1500 training images, 297 held out). The loaders are built as the cell built them.
from pysyft_notebook_cells import digits_as_mnist

federated_train_loader = sy.FederatedDataLoader( # <-- this is now a FederatedDataLoader
    digits_as_mnist(train=True)
    .federate((bob, alice)), # <-- NEW: we distribute the dataset across all the workers, it's now a FederatedDataset
    batch_size=args.batch_size, shuffle=True, **kwargs)

test_loader = torch.utils.data.DataLoader(
    digits_as_mnist(train=False),
    batch_size=args.test_batch_size, shuffle=True, **kwargs)""",
            ),
            (
                11,
                """class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 20, 5, 1)
        self.conv2 = nn.Conv2d(20, 50, 5, 1)
        self.fc1 = nn.Linear(4*4*50, 500)
        self.fc2 = nn.Linear(500, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(x, 2, 2)
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2, 2)
        x = x.view(-1, 4*4*50)
        x = F.relu(self.fc1(x))
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)""",
            ),
            (
                13,
                r"""def train(args, model, device, federated_train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(federated_train_loader): # <-- now it is a distributed dataset
        model.send(data.location) # <-- NEW: send the model to the right location
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        model.get() # <-- NEW: get the model back
        if batch_idx % args.log_interval == 0:
            loss = loss.get() # <-- NEW: get the loss back
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx * args.batch_size, len(federated_train_loader) * args.batch_size,
                100. * batch_idx / len(federated_train_loader), loss.item()))""",
            ),
            (
                15,
                r"""def test(args, model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item() # sum up batch loss
            pred = output.argmax(1, keepdim=True) # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()

    test_loss /= len(test_loader.dataset)

    print('\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n'.format(
        test_loss, correct, len(test_loader.dataset),
        100. * correct / len(test_loader.dataset)))""",
            ),
            (
                17,
                """%%time
model = Net().to(device)
optimizer = optim.SGD(model.parameters(), lr=args.lr) # TODO momentum is not supported at the moment

for epoch in range(1, args.epochs + 1):
    train(args, model, device, federated_train_loader, optimizer, epoch)
    test(args, model, device, test_loader)

if (args.save_model):
    torch.save(model.state_dict(), "mnist_cnn.pt")

""",
            ),
        ],
    ),
    "part07": (
        "v0.2.9: Part 07 - Federated Learning with Federated Dataset.ipynb",
        [
            (0, """epochs = 50"""),
            (
                3,
                """import torch as th
import pointers as sy
sy.create_sandbox(globals(), verbose=False)""",
            ),
            (
                5,
                """boston_data = grid.search("#boston", "#data")
boston_target = grid.search("#boston", "#target")""",
            ),
            (
                7,
                """n_features = boston_data['alice'][0].shape[1]
n_targets = 1

model = th.nn.Linear(n_features, n_targets)""",
            ),
            (
                9,
                """# Cast the result in BaseDatasets
datasets = []
for worker in boston_data.keys():
    dataset = sy.BaseDataset(boston_data[worker][0], boston_target[worker][0])
    datasets.append(dataset)

# Build the FederatedDataset object
dataset = sy.FederatedDataset(datasets)
print(dataset.workers)
optimizers = {}
for worker in dataset.workers:
    optimizers[worker] = th.optim.Adam(params=model.parameters(),lr=1e-2)""",
            ),
            (
                11,
                """train_loader = sy.FederatedDataLoader(dataset, batch_size=32, shuffle=False, drop_last=False)""",
            ),
            (
                13,
                r"""for epoch in range(1, epochs + 1):
    loss_accum = 0
    for batch_idx, (data, target) in enumerate(train_loader):
        model.send(data.location)

        optimizer = optimizers[data.location.id]
        optimizer.zero_grad()
        pred = model(data)
        loss = ((pred.view(-1) - target)**2).mean()
        loss.backward()
        optimizer.step()

        model.get()
        loss = loss.get()

        loss_accum += float(loss)

        if batch_idx % 8 == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tBatch loss: {:.6f}'.format(
                epoch, batch_idx, len(train_loader),
                       100. * batch_idx / len(train_loader), loss.item()))

    print('Total loss', loss_accum)
""",
            ),
        ],
    ),
    "part08": (
        "v0.2.9: Part 08 - Introduction to Plans.ipynb",
        [
            (
                2,
                """import torch
import torch.nn as nn
import torch.nn.functional as F""",
            ),
            (
                4,
                """import pointers as sy  # import the Pysyft library
hook = sy.TorchHook(torch)  # hook PyTorch ie add extra functionalities

# IMPORTANT: Local worker should not be a client worker
hook.local_worker.is_client_worker = False


server = hook.local_worker""",
            ),
            (
                6,
                """x11 = torch.tensor([-1, 2.]).tag('input_data')
x12 = torch.tensor([1, -2.]).tag('input_data2')
x21 = torch.tensor([-1, 2.]).tag('input_data')
x22 = torch.tensor([1, -2.]).tag('input_data2')

device_1 = sy.VirtualWorker(hook, id="device_1", data=(x11, x12))
device_2 = sy.VirtualWorker(hook, id="device_2", data=(x21, x22))
devices = device_1, device_2""",
            ),
            (
                8,
                """@sy.func2plan()
def plan_double_abs(x):
    x = x + x
    x = torch.abs(x)
    return x""",
            ),
            (10, """plan_double_abs"""),
            (
                12,
                """pointer_to_data = device_1.search('input_data')[0]
pointer_to_data""",
            ),
            (14, """plan_double_abs.is_built"""),
            (
                15,
                """# Sending non-built Plan will fail
try:
    plan_double_abs.send(device_1)
except RuntimeError as error:
    print(error)""",
            ),
            (17, """plan_double_abs.build(torch.tensor([1., -2.]))"""),
            (18, """plan_double_abs.is_built"""),
            (
                20,
                """# This cell is executed successfully
pointer_plan = plan_double_abs.send(device_1)
pointer_plan""",
            ),
            (
                24,
                """pointer_to_result = pointer_plan(pointer_to_data)
print(pointer_to_result)""",
            ),
            (26, """pointer_to_result.get()"""),
            (
                28,
                """class Net(sy.Plan):
    def __init__(self):
        super(Net, self).__init__()
        self.fc1 = nn.Linear(2, 3)
        self.fc2 = nn.Linear(3, 2)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = self.fc2(x)
        return F.log_softmax(x, dim=0)
""",
            ),
            (29, """net = Net()"""),
            (30, """net"""),
            (32, """net.build(torch.tensor([1., 2.]))"""),
            (
                34,
                """pointer_to_net = net.send(device_1)
pointer_to_net""",
            ),
            (36, """pointer_to_data = device_1.search('input_data')[0]"""),
            (
                38,
                """pointer_to_result = pointer_to_net(pointer_to_data)
pointer_to_result""",
            ),
            (40, """pointer_to_result.get()"""),
            (
                43,
                """class Net(sy.Plan):
    def __init__(self):
        super(Net, self).__init__()
        self.fc1 = nn.Linear(2, 3)
        self.fc2 = nn.Linear(3, 2)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = self.fc2(x)
        return F.log_softmax(x, dim=0)""",
            ),
            (
                44,
                """net = Net()

# Build plan
net.build(torch.tensor([1., 2.]))""",
            ),
            (
                46,
                """pointer_to_net_1 = net.send(device_1)
pointer_to_data = device_1.search('input_data')[0]
pointer_to_result = pointer_to_net_1(pointer_to_data)
pointer_to_result.get()""",
            ),
            (
                48,
                """pointer_to_net_2 = net.send(device_2)
pointer_to_data = device_2.search('input_data')[0]
pointer_to_result = pointer_to_net_2(pointer_to_data)
pointer_to_result.get()""",
            ),
            (
                51,
                """@sy.func2plan(args_shape=[(-1, 1)])
def plan_double_abs(x):
    x = x + x
    x = torch.abs(x)
    return x

plan_double_abs.is_built""",
            ),
            (
                53,
                """@sy.func2plan(args_shape=[(1, 2), (-1, 2)])
def plan_sum_abs(x, y):
    s = x + y
    return torch.abs(s)

plan_sum_abs.is_built""",
            ),
            (
                55,
                """@sy.func2plan(args_shape=[(1,)], state=(torch.tensor([1]), ))
def plan_abs(x, state):
    bias, = state.read()
    x = x.abs()
    return x + bias""",
            ),
            (
                56,
                """pointer_plan = plan_abs.send(device_1)
x_ptr = torch.tensor([-1, 0]).send(device_1)
p = pointer_plan(x_ptr)
p.get()""",
            ),
        ],
    ),
    "part08bis": (
        "v0.2.4: Part 08 bis - Introduction to Protocols.ipynb",
        [
            (
                3,
                """import torch as th
import pointers as sy
hook = sy.TorchHook(th)

# IMPORTANT: Local worker should not be a client worker
hook.local_worker.is_client_worker = False""",
            ),
            (
                5,
                """@sy.func2plan(args_shape=[(1,)])
def inc1(x):
    return x + 1

@sy.func2plan(args_shape=[(1,)])
def inc2(x):
    return x + 1

@sy.func2plan(args_shape=[(1,)])
def inc3(x):
    return x + 1

protocol = sy.Protocol([("worker1", inc1), ("worker2", inc2), ("worker3", inc3)])""",
            ),
            (
                7,
                """bob = sy.VirtualWorker(hook, id="bob")
alice = sy.VirtualWorker(hook, id="alice")
charlie = sy.VirtualWorker(hook, id="charlie")""",
            ),
            (
                8,
                """workers = alice, bob, charlie

protocol.deploy(*workers)""",
            ),
            (
                11,
                """x = th.tensor([1.0])
ptr = protocol.run(x)
ptr""",
            ),
            (12, """ptr.get()"""),
            (15, """james = sy.VirtualWorker(hook, id="james")"""),
            (16, """protocol.send(james)"""),
            (
                17,
                """x = th.tensor([1.0]).send(james)
ptr = protocol.run(x)
ptr""",
            ),
            (
                19,
                """ptr = ptr.get()
ptr""",
            ),
            (
                20,
                """ptr = ptr.get()
ptr""",
            ),
            (
                23,
                """protocol = sy.Protocol([("worker1", inc1), ("worker2", inc2), ("worker3", inc3)])
protocol.tag('my_protocol')
protocol.send(james)""",
            ),
            (24, """me = sy.hook.local_worker # get access to me as a local worker"""),
            (
                26,
                """responses = me.request_search(['my_protocol'], location=james)
responses""",
            ),
            (28, """ptr_protocol = responses[0]"""),
            (
                30,
                """protocol_back = ptr_protocol.get()
protocol_back""",
            ),
            (
                32,
                """protocol_back.deploy(alice, bob, charlie)

x = th.tensor([1.0])
ptr = protocol_back.run(x)
ptr.get()""",
            ),
        ],
    ),
    "part09": (
        "v0.2.9: Part 09 - Intro to Encrypted Programs.ipynb",
        [
            (2, """Q = 1234567891011"""),
            (3, """x = 25"""),
            (
                4,
                """import random

def encrypt(x):
    share_a = random.randint(-Q,Q)
    share_b = random.randint(-Q,Q)
    share_c = (x - share_a - share_b) % Q
    return (share_a, share_b,  share_c)""",
            ),
            (5, """encrypt(x)"""),
            (
                7,
                """def decrypt(*shares):
    return sum(shares) % Q""",
            ),
            (8, """a,b,c = encrypt(25)"""),
            (9, """decrypt(a, b, c)"""),
            (11, """decrypt(a, b)"""),
            (
                14,
                """x = encrypt(25)
y = encrypt(5)""",
            ),
            (
                15,
                """def add(x, y):
    z = list()
    # the first worker adds their shares together
    z.append((x[0] + y[0]) % Q)

    # the second worker adds their shares together
    z.append((x[1] + y[1]) % Q)

    # the third worker adds their shares together
    z.append((x[2] + y[2]) % Q)

    return z""",
            ),
            (16, """decrypt(*add(x,y))"""),
            (
                19,
                """import torch
import pointers as sy
hook = sy.TorchHook(torch)

bob = sy.VirtualWorker(hook, id="bob")
alice = sy.VirtualWorker(hook, id="alice")
bill = sy.VirtualWorker(hook, id="bill")""",
            ),
            (21, """x = torch.tensor([25])"""),
            (22, """x"""),
            (23, """encrypted_x = x.share(bob, alice, bill)"""),
            (24, """encrypted_x.get()"""),
            (26, """list(bob._tensors.values())"""),
            (27, """x = torch.tensor([25]).share(bob, alice, bill)"""),
            (
                28,
                """# Bob's share
bobs_share = list(bob._tensors.values())[0]
bobs_share""",
            ),
            (
                29,
                """# Alice's share
alices_share = list(alice._tensors.values())[0]
alices_share""",
            ),
            (
                30,
                """# Bill's share
bills_share = list(bill._tensors.values())[0]
bills_share""",
            ),
            (32, """(bobs_share + alices_share + bills_share)"""),
            (
                35,
                """x = torch.tensor([25]).share(bob,alice)
y = torch.tensor([5]).share(bob,alice)""",
            ),
            (
                36,
                """z = x + y
z.get()""",
            ),
            (
                37,
                """z = x - y
z.get()""",
            ),
            (39, """crypto_provider = sy.VirtualWorker(hook, id="crypto_provider")"""),
            (
                40,
                """x = torch.tensor([25]).share(bob,alice, crypto_provider=crypto_provider)
y = torch.tensor([5]).share(bob,alice, crypto_provider=crypto_provider)""",
            ),
            (
                41,
                """# multiplication

z = x * y
z.get()""",
            ),
            (
                43,
                """x = torch.tensor([[1, 2],[3,4]]).share(bob,alice, crypto_provider=crypto_provider)
y = torch.tensor([[2, 0],[0,2]]).share(bob,alice, crypto_provider=crypto_provider)""",
            ),
            (
                44,
                """# matrix multiplication

z = x.mm(y)
z.get()""",
            ),
            (
                46,
                """x = torch.tensor([25]).share(bob,alice, crypto_provider=crypto_provider)
y = torch.tensor([5]).share(bob,alice, crypto_provider=crypto_provider)""",
            ),
            (
                47,
                """z = x > y
z.get()""",
            ),
            (
                48,
                """z = x <= y
z.get()""",
            ),
            (
                49,
                """z = x == y
z.get()""",
            ),
            (
                50,
                """z = x == y + 20
z.get()""",
            ),
            (
                52,
                """x = torch.tensor([2, 3, 4, 1]).share(bob,alice, crypto_provider=crypto_provider)
x.max().get()""",
            ),
            (
                53,
                """x = torch.tensor([[2, 3], [4, 1]]).share(bob,alice, crypto_provider=crypto_provider)
max_values = x.max(dim=0)
max_values.get()""",
            ),
        ],
    ),
    "part10": (
        "v0.2.9: Part 10 - Federated Learning with Secure Aggregation.ipynb",
        [
            (
                3,
                '''import pickle

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import TensorDataset, DataLoader

class Parser:
    """Parameters for training"""
    def __init__(self):
        self.epochs = 10
        self.lr = 0.001
        self.test_batch_size = 8
        self.batch_size = 8
        self.log_interval = 10
        self.seed = 1

args = Parser()

torch.manual_seed(args.seed)
kwargs = {}''',
            ),
            (
                5,
                """# REPLACED (offline): this cell read Boston housing from '../data/BostonHousing/
# boston_housing.pickle' (not in this repository; Boston is no longer in scikit-learn).
# Stand-in: scikit-learn's bundled diabetes set in Boston's shape (13 features: its 10 and
# three products of them; targets scaled to Boston's range), split 80/20 as numpy arrays.
# The rest of the cell is the tutorial's.
from pysyft_notebook_cells import diabetes_as_boston

((X, y), (X_test, y_test)) = diabetes_as_boston()

X = torch.from_numpy(X).float()
y = torch.from_numpy(y).float()
X_test = torch.from_numpy(X_test).float()
y_test = torch.from_numpy(y_test).float()
# preprocessing
mean = X.mean(0, keepdim=True)
dev = X.std(0, keepdim=True)
mean[:, 3] = 0. # the feature at column 3 is binary,
dev[:, 3] = 1.  # so we don't standardize it
X = (X - mean) / dev
X_test = (X_test - mean) / dev
train = TensorDataset(X, y)
test = TensorDataset(X_test, y_test)
train_loader = DataLoader(train, batch_size=args.batch_size, shuffle=True, **kwargs)
test_loader = DataLoader(test, batch_size=args.test_batch_size, shuffle=True, **kwargs)""",
            ),
            (
                7,
                """class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.fc1 = nn.Linear(13, 32)
        self.fc2 = nn.Linear(32, 24)
        self.fc3 = nn.Linear(24, 1)

    def forward(self, x):
        x = x.view(-1, 13)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = self.fc3(x)
        return x

model = Net()
optimizer = optim.SGD(model.parameters(), lr=args.lr)""",
            ),
            (
                9,
                """import pointers as sy

hook = sy.TorchHook(torch)
bob = sy.VirtualWorker(hook, id="bob")
alice = sy.VirtualWorker(hook, id="alice")
james = sy.VirtualWorker(hook, id="james")

compute_nodes = [bob, alice]""",
            ),
            (
                11,
                """train_distributed_dataset = []

for batch_idx, (data,target) in enumerate(train_loader):
    data = data.send(compute_nodes[batch_idx % len(compute_nodes)])
    target = target.send(compute_nodes[batch_idx % len(compute_nodes)])
    train_distributed_dataset.append((data, target))""",
            ),
            (
                13,
                r"""def train(epoch):
    model.train()
    for batch_idx, (data,target) in enumerate(train_distributed_dataset):
        worker = data.location
        model.send(worker)

        optimizer.zero_grad()
        # update the model
        pred = model(data)
        loss = F.mse_loss(pred.view(-1), target)
        loss.backward()
        optimizer.step()
        model.get()

        if batch_idx % args.log_interval == 0:
            loss = loss.get()
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx * data.shape[0], len(train_loader),
                       100. * batch_idx / len(train_loader), loss.item()))

""",
            ),
            (
                15,
                r"""def test():
    model.eval()
    test_loss = 0
    for data, target in test_loader:
        output = model(data)
        test_loss += F.mse_loss(output.view(-1), target, reduction='sum').item() # sum up batch loss
        pred = output.data.max(1, keepdim=True)[1] # get the index of the max log-probability

    test_loss /= len(test_loader.dataset)
    print('\nTest set: Average loss: {:.4f}\n'.format(test_loss))""",
            ),
            (17, """import time"""),
            (
                18,
                """t = time.time()

for epoch in range(1, args.epochs + 1):
    train(epoch)


total_time = time.time() - t
print('Total', round(total_time, 2), 's')""",
            ),
            (20, """test()"""),
            (
                22,
                """remote_dataset = (list(),list())

train_distributed_dataset = []

for batch_idx, (data,target) in enumerate(train_loader):
    data = data.send(compute_nodes[batch_idx % len(compute_nodes)])
    target = target.send(compute_nodes[batch_idx % len(compute_nodes)])
    remote_dataset[batch_idx % len(compute_nodes)].append((data, target))

def update(data, target, model, optimizer):
    model.send(data.location)
    optimizer.zero_grad()
    pred = model(data)
    loss = F.mse_loss(pred.view(-1), target)
    loss.backward()
    optimizer.step()
    return model

bobs_model = Net()
alices_model = Net()

bobs_optimizer = optim.SGD(bobs_model.parameters(), lr=args.lr)
alices_optimizer = optim.SGD(alices_model.parameters(), lr=args.lr)

models = [bobs_model, alices_model]
params = [list(bobs_model.parameters()), list(alices_model.parameters())]
optimizers = [bobs_optimizer, alices_optimizer]
""",
            ),
            (
                24,
                """# this is selecting which batch to train on
data_index = 0
# update remote models
# we could iterate this multiple times before proceeding, but we're only iterating once per worker here
for remote_index in range(len(compute_nodes)):
    data, target = remote_dataset[remote_index][data_index]
    models[remote_index] = update(data, target, models[remote_index], optimizers[remote_index])
""",
            ),
            (
                26,
                """# create a list where we'll deposit our encrypted model average
new_params = list()""",
            ),
            (
                27,
                """# iterate through each parameter
for param_i in range(len(params[0])):

    # for each worker
    spdz_params = list()
    for remote_index in range(len(compute_nodes)):

        # since SMPC can only work with integers (not floats), we need
        # to use Integers to store decimal information. In other words,
        # we need to use "Fixed Precision" encoding.
        fixed_precision_param = params[remote_index][param_i].fix_precision()

        # now we encrypt it on the remote machine. Note that
        # fixed_precision_param is ALREADY a pointer. Thus, when
        # we call share, it actually encrypts the data that the
        # data is pointing TO. This returns a POINTER to the
        # MPC secret shared object, which we need to fetch.
        encrypted_param = fixed_precision_param.share(bob, alice, crypto_provider=james)

        # now we fetch the pointer to the MPC shared value
        param = encrypted_param.get()

        # save the parameter so we can average it with the same parameter
        # from the other workers
        spdz_params.append(param)

    # average params from multiple workers, fetch them to the local machine
    # decrypt and decode (from fixed precision) back into a floating point number
    new_param = (spdz_params[0] + spdz_params[1]).get().float_precision()/2

    # save the new averaged parameter
    new_params.append(new_param)""",
            ),
            (
                29,
                """with torch.no_grad():
    for model in params:
        for param in model:
            param *= 0

    for model in models:
        model.get()

    for remote_index in range(len(compute_nodes)):
        for param_index in range(len(params[remote_index])):
            params[remote_index][param_index].set_(new_params[param_index])""",
            ),
            (
                31,
                """def train(epoch):
    for data_index in range(len(remote_dataset[0])-1):
        # update remote models
        for remote_index in range(len(compute_nodes)):
            data, target = remote_dataset[remote_index][data_index]
            models[remote_index] = update(data, target, models[remote_index], optimizers[remote_index])

        # encrypted aggregation
        new_params = list()
        for param_i in range(len(params[0])):
            spdz_params = list()
            for remote_index in range(len(compute_nodes)):
                spdz_params.append(params[remote_index][param_i].fix_precision().share(bob, alice, crypto_provider=james).get())

            new_param = (spdz_params[0] + spdz_params[1]).get().float_precision()/2
            new_params.append(new_param)

        # cleanup
        with torch.no_grad():
            for model in params:
                for param in model:
                    param *= 0

            for model in models:
                model.get()

            for remote_index in range(len(compute_nodes)):
                for param_index in range(len(params[remote_index])):
                    params[remote_index][param_index].set_(new_params[param_index])""",
            ),
            (
                32,
                r"""def test():
    models[0].eval()
    test_loss = 0
    for data, target in test_loader:
        output = models[0](data)
        test_loss += F.mse_loss(output.view(-1), target, reduction='sum').item() # sum up batch loss
        pred = output.data.max(1, keepdim=True)[1] # get the index of the max log-probability

    test_loss /= len(test_loader.dataset)
    print('Test set: Average loss: {:.4f}\n'.format(test_loss))""",
            ),
            (
                33,
                """t = time.time()

for epoch in range(args.epochs):
    print(f"Epoch {epoch + 1}")
    train(epoch)
    test()


total_time = time.time() - t
print('Total', round(total_time, 2), 's')""",
            ),
        ],
    ),
    "part11": (
        "v0.2.9: Part 11 - Secure Deep Learning Classification.ipynb",
        [
            (
                0,
                """epochs = 10
n_test_batches = 200""",
            ),
            (
                3,
                """import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
# from torchvision import datasets, transforms  (import line changed: torchvision is not
# installed and MNIST cannot be downloaded offline; the cells that load it are replaced)""",
            ),
            (
                5,
                """import pointers as sy
hook = sy.TorchHook(torch)
client = sy.VirtualWorker(hook, id="client")
bob = sy.VirtualWorker(hook, id="bob")
alice = sy.VirtualWorker(hook, id="alice")
crypto_provider = sy.VirtualWorker(hook, id="crypto_provider")""",
            ),
            (
                7,
                """class Arguments():
    def __init__(self):
        self.batch_size = 64
        self.test_batch_size = 50
        self.epochs = epochs
        self.lr = 0.001
        self.log_interval = 100

args = Arguments()""",
            ),
            (
                9,
                """# REPLACED (offline): this cell downloaded MNIST with torchvision. Stand-in: scikit-learn's
# bundled 8x8 digits, scaled up to MNIST's 1x28x28 and normalised as the cell's transforms
# did (1500 training images).
from pysyft_notebook_cells import digits_as_mnist

train_loader = torch.utils.data.DataLoader(
    digits_as_mnist(train=True),
    batch_size=args.batch_size, shuffle=True)""",
            ),
            (
                11,
                """# REPLACED (offline), the first statement only: MNIST's test set -> the digits stand-in's
# 297 held-out images (see above). The rest of the cell is the tutorial's.
from pysyft_notebook_cells import digits_as_mnist

test_loader = torch.utils.data.DataLoader(
    digits_as_mnist(train=False),
    batch_size=args.test_batch_size, shuffle=True)

private_test_loader = []
for data, target in test_loader:
    private_test_loader.append((
        data.fix_precision().share(alice, bob, crypto_provider=crypto_provider, protocol="fss"),
        target.fix_precision().share(alice, bob, crypto_provider=crypto_provider, protocol="fss")
    ))""",
            ),
            (
                13,
                """class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.fc1 = nn.Linear(784, 500)
        self.fc2 = nn.Linear(500, 10)

    def forward(self, x):
        x = x.view(-1, 784)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.fc2(x)
        return x""",
            ),
            (
                15,
                r"""def train(args, model, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        output = model(data)
        output = F.log_softmax(output, dim=1)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx * args.batch_size, len(train_loader) * args.batch_size,
                100. * batch_idx / len(train_loader), loss.item()))""",
            ),
            (
                16,
                """model = Net()
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

for epoch in range(1, args.epochs + 1):
    train(args, model, train_loader, optimizer, epoch)
""",
            ),
            (
                17,
                r"""def test(args, model, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            output = F.log_softmax(output, dim=1)
            test_loss += F.nll_loss(output, target, reduction='sum').item() # sum up batch loss
            pred = output.argmax(1, keepdim=True) # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()

    test_loss /= len(test_loader.dataset)

    print('\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n'.format(
        test_loss, correct, len(test_loader.dataset),
        100. * correct / len(test_loader.dataset)))""",
            ),
            (18, """test(args, model, test_loader)"""),
            (
                22,
                """model.fix_precision().share(alice, bob, crypto_provider=crypto_provider, protocol="fss")""",
            ),
            (
                24,
                """def test(args, model, test_loader):
    model.eval()
    n_correct_priv = 0
    n_total = 0
    with torch.no_grad():
        for data, target in test_loader[:n_test_batches]:
            output = model(data)
            pred = output.argmax(dim=1)
            n_correct_priv += pred.eq(target.view_as(pred)).sum()
            n_total += args.test_batch_size

            n_correct = n_correct_priv.copy().get().float_precision().long().item()

            print('Test set: Accuracy: {}/{} ({:.0f}%)'.format(
                n_correct, n_total,
                100. * n_correct / n_total))
""",
            ),
            (25, """test(args, model, private_test_loader)"""),
        ],
    ),
    "part12": (
        "v0.2.9: Part 12 - Train an Encrypted Neural Network on Encrypted Data.ipynb",
        [
            (
                2,
                """import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import pointers as sy""",
            ),
            (
                3,
                """# Set everything up
hook = sy.TorchHook(torch)

alice = sy.VirtualWorker(id="alice", hook=hook)
bob = sy.VirtualWorker(id="bob", hook=hook)
james = sy.VirtualWorker(id="james", hook=hook)""",
            ),
            (
                4,
                """# A Toy Dataset
data = torch.tensor([[0,0],[0,1],[1,0],[1,1.]])
target = torch.tensor([[0],[0],[1],[1.]])

# A Toy Model
class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.fc1 = nn.Linear(2, 2)
        self.fc2 = nn.Linear(2, 1)

    def forward(self, x):
        x = self.fc1(x)
        x = F.relu(x)
        x = self.fc2(x)
        return x
model = Net()""",
            ),
            (
                6,
                """# We encode everything
data = data.fix_precision().share(bob, alice, crypto_provider=james, requires_grad=True)
target = target.fix_precision().share(bob, alice, crypto_provider=james, requires_grad=True)
model = model.fix_precision().share(bob, alice, crypto_provider=james, requires_grad=True)""",
            ),
            (7, """print(data)"""),
            (
                9,
                """opt = optim.SGD(params=model.parameters(),lr=0.1).fix_precision()

for iter in range(20):
    # 1) erase previous gradients (if they exist)
    opt.zero_grad()

    # 2) make a prediction
    pred = model(data)

    # 3) calculate how much we missed
    loss = ((pred - target)**2).sum()

    # 4) figure out which weights caused us to miss
    loss.backward()

    # 5) change those weights
    opt.step()

    # 6) print our progress
    print(loss.get().float_precision())""",
            ),
        ],
    ),
}


# -- the offline stand-ins the replaced cells load ---------------------------------------------


def digits_as_mnist(train: bool) -> TensorDataset:
    """MNIST's stand-in: scikit-learn's 8x8 digits (bundled), scaled up to 1x28x28, in [0, 1]
    as ``transforms.ToTensor()`` gives, then ``Normalize((0.1307,), (0.3081,))``; the first
    1500 of a fixed shuffle to train, the other 297 to test."""
    from sklearn.datasets import load_digits

    d = load_digits()
    images = torch.tensor(d.data, dtype=torch.float32).view(-1, 1, 8, 8) / 16
    images = F.interpolate(images, size=(28, 28), mode="bilinear", align_corners=False)
    images = (images - 0.1307) / 0.3081
    target = torch.tensor(d.target, dtype=torch.int64)
    order = torch.randperm(len(target), generator=torch.Generator().manual_seed(0))
    part = order[:1500] if train else order[1500:]
    return TensorDataset(images[part], target[part])


def diabetes_as_boston() -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """Boston housing's stand-in, in the shape of its pickle ``((X, y), (X_test, y_test))``:
    scikit-learn's diabetes set (bundled) with 13 features (its 10 and the products of its
    first three pairs of features), targets divided by 7 (Boston's range), split 354/88."""
    from sklearn.datasets import load_diabetes

    d = load_diabetes()
    x = d.data
    x = np.concatenate([x, x[:, 0:1] * x[:, 1:2], x[:, 2:3] * x[:, 3:4], x[:, 4:5] * x[:, 5:6]], 1)
    y = d.target / 7
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order], y[order]
    return (x[:354], y[:354]), (x[354:], y[354:])
