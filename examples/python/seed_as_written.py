"""The seed's program exactly as it was written, imports changed to demi (and the device target to the CPU):
its Conv2d keeps MindSpore's default pad_mode="same", so Flatten gives 32*16*16 = 8192 features where its
Dense was declared for 32*15*15 = 7200. MindSpore fails there; demi refuses it with an error naming the
layer ('fc'), the op, both shapes and the likely cause. seed_simple_cnn.py is the program that trains."""
import numpy as np

import demi as ms
import demi.dataset as ds
import demi.nn as nn
from demi import context, Model, LossMonitor, TimeMonitor

context.set_context(mode=context.GRAPH_MODE, device_target="CPU", device_id=0)


def get_data(num, img_size=(32, 32), num_classes=10):
    for _ in range(num):
        img = np.random.randn(3, *img_size).astype(np.float32)
        label = np.random.randint(0, num_classes)
        yield img, label


train_ds = ds.GeneratorDataset(source=lambda: get_data(1000), column_names=["image", "label"]).batch(32)


class SimpleCNN(nn.Cell):
    def __init__(self, num_classes=10):
        super(SimpleCNN, self).__init__()
        self.conv1 = nn.Conv2d(3, 32, kernel_size=3, stride=1, padding=0)
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
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
model = Model(net, loss_fn, optimizer, metrics={"Accuracy": nn.Accuracy()}, amp_level="O2",
              loss_scale_manager=ms.FixedLossScaleManager(1024.0, drop_overflow_update=False))
model.train(epoch=2, train_dataset=train_ds, callbacks=[TimeMonitor(), LossMonitor(per_print_times=10)],
            dataset_sink_mode=True)
