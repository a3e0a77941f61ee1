"""mindspore.amp on demi: build_train_network (the seed's way 2), auto_mixed_precision, loss scalers."""
from demi import _core
from demi._core import (DynamicLossScaleManager, FixedLossScaleManager, DynamicLossScaler,  # noqa: F401
                        StaticLossScaler, LossScaleManager)
from demi.train.model import amp_options, loss_cell_of

_LEVELS = ("O0", "O1", "O2", "O3", "auto")


class TrainOneStep:
    """One update per call: train_step(data, label). It returns the loss (a float32 Tensor) or, where the
    loss-scale manager may skip an update (dynamic scaling, or drop_overflow_update), MindSpore's
    TrainOneStepWithLossScaleCell result (loss, overflow, loss_scale). The step runs in C++ without the GIL."""

    def __init__(self, step, network):
        self._step = step
        self.network = network
        manager = step.loss_scale_manager()
        self._with_scale = manager is not None and manager.get_drop_overflow_update()
        self.last = None

    def __call__(self, data, label):
        r = self._step(data, label)
        self.last = r
        loss = _core.Tensor(r.loss, _core.dtype.float32)
        if self._with_scale:
            return loss, _core.Tensor(r.overflow), _core.Tensor(r.loss_scale, _core.dtype.float32)
        return loss

    def set_train(self, mode=True):
        self.network.set_train(mode)
        return self


def build_train_network(network, optimizer, loss_fn=None, level="O0", boost_level="O0", **kwargs):
    """Attaches the level's precision policy to network and returns its train step. kwargs:
    loss_scale_manager, keep_batchnorm_fp32, and demi's amp_dtype (demi.bfloat16; float16 by default)."""
    level = _level(level)
    if boost_level != "O0":
        raise ValueError("build_train_network: boost_level is not supported by demi")
    low, manager, keep_bn = amp_options(kwargs, "build_train_network")
    step = _core.build_train_network(network, optimizer, loss_cell_of(loss_fn, "build_train_network"), level, low,
                                     manager, keep_bn)
    return TrainOneStep(step, network)


def auto_mixed_precision(network, amp_level="O0", dtype=_core.dtype.float16):
    """Attaches the level's precision policy to network (in place) and returns it."""
    _core.auto_mixed_precision(network, _level(amp_level), dtype)
    return network


def all_finite(inputs):
    return _core.all_finite(list(inputs))


def _level(level):
    if level not in _LEVELS:
        raise ValueError(f"amp level must be one of {', '.join(_LEVELS)}, got {level!r}")
    if level == "auto":
        raise ValueError("amp level 'auto' is not supported by demi (O0-O3; demi's adaptive AMP is `demi train --amp-adapt`)")
    return level
