"""The seed's MindSpore program on demi: only the imports changed (mindspore -> demi), the device target set
to the CPU demi runs on, and Conv2d given pad_mode="valid" — the seed's own sizes need it: with MindSpore's
default pad_mode="same" its Flatten gives 32*16*16 = 8192 features where its Dense expects 32*15*15 = 7200
(seed_as_written.py shows demi refusing that). Way 1 (Model with amp_level="O2") then way 2
(amp.build_train_network and a hand loop).

    python examples/python/seed_simple_cnn.py [--epochs 2] [--samples 1000]
"""
import argparse

import numpy as np

import demi as ms
from demi import context

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--samples", type=int, default=1000)
args = parser.parse_args()

context.set_context(mode=context.GRAPH_MODE, device_target="CPU", device_id=0)
print(f"demi version: {ms.__version__}")

# 1. A random data set standing in for images (the seed's).
import demi.dataset as ds  # noqa: E402


def get_data(num, img_size=(32, 32), num_classes=10):
    for _ in range(num):
        img = np.random.randn(3, *img_size).astype(np.float32)
        label = np.random.randint(0, num_classes)
        yield img, label


def create_dataset(num_data=1000, batch_size=32):
    dataset = ds.GeneratorDataset(source=lambda: get_data(num_data), column_names=["image", "label"])
    dataset = dataset.batch(batch_size)
    return dataset


train_ds = create_dataset(args.samples)
print("Dataset created successfully.")

# 2. The network.
import demi.nn as nn  # noqa: E402


class SimpleCNN(nn.Cell):
    def __init__(self, num_classes=10):
        super(SimpleCNN, self).__init__()
        self.conv1 = nn.Conv2d(3, 32, kernel_size=3, stride=1, padding=0, pad_mode="valid")
        self.relu = nn.ReLU()
        self.max_pool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(32 * 15 * 15, num_classes)

    def construct(self, x):
        x = self.conv1(x)
        x = self.relu(x)
        x = self.max_pool(x)
        x = self.flatten(x)
        x = self.fc(x)
        return x


net = SimpleCNN()

# 3. Way 1: Model with amp_level="O2" and a loss-scale manager.
from demi import nn, Model, LossMonitor, TimeMonitor  # noqa: E402

loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
loss_scale_manager = ms.FixedLossScaleManager(1024.0, drop_overflow_update=False)
model = Model(net, loss_fn, optimizer, metrics={"Accuracy": nn.Accuracy()}, amp_level="O2",
              loss_scale_manager=loss_scale_manager)
print("Model configured with AMP level O2.")

print("Starting training...")
callbacks = [TimeMonitor(), LossMonitor(per_print_times=10)]
model.train(epoch=args.epochs, train_dataset=train_ds, callbacks=callbacks, dataset_sink_mode=True)
print("Training finished.")

# 4. Way 2: build_train_network and a hand-written loop.
from demi import amp  # noqa: E402

net2 = SimpleCNN()
optimizer2 = nn.Momentum(net2.trainable_params(), learning_rate=0.01, momentum=0.9)
train_step = amp.build_train_network(net2, optimizer2, loss_fn, level="O2",
                                     loss_scale_manager=ms.FixedLossScaleManager(1024.0, drop_overflow_update=False))
for epoch in range(args.epochs):
    losses = []
    for step, (data, label) in enumerate(train_ds.create_tuple_iterator(), 1):
        loss = train_step(data, label)
        losses.append(loss.asnumpy())
    print(f"way 2: epoch {epoch + 1}: {step} steps, mean loss {np.mean(losses):.4f}")
print("Way 2 finished.")
