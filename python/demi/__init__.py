"""demi: mixed-precision training with MindSpore's Python API, run by demi's C++ core.

    import demi as ms                 # where a program had `import mindspore as ms`
    from demi import nn, Model, LossMonitor, TimeMonitor
    import demi.dataset as ds

Training loops (Model.train, a build_train_network step) run in C++ without the GIL; Python is entered only
for a Python construct, Python callbacks and Python data sources. docs/DESIGN.md ("Python") says what
follows MindSpore and where demi differs.
"""
from demi import _core
from demi._core import DemiError, __version__  # noqa: F401
from demi.common.dtype import (float32, float16, bfloat16, float64, int32, int64, uint8, bool_,  # noqa: F401
                               float_, half, double, int_)
from demi.common import dtype  # noqa: F401
from demi.common.tensor import Tensor, Parameter  # noqa: F401
from demi import context  # noqa: F401
from demi.context import GRAPH_MODE, PYNATIVE_MODE, set_context, get_context, set_device  # noqa: F401
from demi import nn, ops, dataset, amp, train  # noqa: F401
from demi.amp import FixedLossScaleManager, DynamicLossScaleManager  # noqa: F401
from demi.train import Model, LossMonitor, TimeMonitor, ModelCheckpoint, CheckpointConfig, Callback  # noqa: F401
from demi.grad import value_and_grad, grad  # noqa: F401
from demi.checkpoint import save_checkpoint, load_checkpoint, load_param_into_net  # noqa: F401


def set_seed(seed):
    """Seeds demi's generators: initial weights, dropout masks, dataset shuffles and augmentations."""
    _core.set_seed(int(seed))


def from_numpy(array):
    """A tensor of a numpy array's values (a copy: demi's storage is its own; asnumpy() is the zero-copy way)."""
    return Tensor(array)


def jit(function=None, **kwargs):
    """MindSpore's @jit: demi runs the function as it is (GRAPH_MODE's memory plans, fusions and the capture
    of Python cells apply below it). Its options (capture_mode, jit_level, ...) are refused, not ignored."""
    if kwargs:
        raise ValueError(f"jit: {', '.join(sorted(kwargs))} not supported by demi (it takes no options)")
    if function is None:
        return lambda f: f
    return function
