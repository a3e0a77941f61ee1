"""mindspore.train's names on demi: Model, callbacks (demi's C++ ones and Python subclasses of Callback),
metrics, checkpoints."""
from demi.train.callback import (Callback, RunContext, LossMonitor, TimeMonitor, ModelCheckpoint,  # noqa: F401
                                 CheckpointConfig)
from demi.train.model import Model  # noqa: F401
from demi._core import Accuracy, Loss, TopKCategoricalAccuracy, Metric  # noqa: F401
