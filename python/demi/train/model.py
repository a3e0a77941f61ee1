"""Model: the seed's way 1. Training, evaluation and prediction run in C++ without the GIL; Python is entered
only for a Python construct, Python callbacks and a Python data source."""
from demi import _core
from demi.dataset import Dataset

_METRIC_NAMES = {"accuracy": _core.Accuracy, "acc": _core.Accuracy, "loss": _core.Loss,
                 "top_1_accuracy": lambda: _core.TopKCategoricalAccuracy(1),
                 "top_5_accuracy": lambda: _core.TopKCategoricalAccuracy(5)}


def _metrics_of(metrics):
    if metrics is None:
        return {}
    if isinstance(metrics, dict):
        out = {}
        for name, m in metrics.items():
            if not isinstance(m, _core.Metric):
                raise TypeError(f"Model: metric {name!r} is {type(m).__name__}, not a demi metric (nn.Accuracy(), ...)")
            out[name] = m
        return out
    out = {}
    for name in metrics:
        if name not in _METRIC_NAMES:
            raise ValueError(f"Model: unknown metric {name!r} (known: {', '.join(sorted(_METRIC_NAMES))})")
        out[name] = _METRIC_NAMES[name]()
    return out


def loss_cell_of(loss_fn, who):
    if loss_fn is None:
        raise ValueError(f"{who}: demi needs loss_fn (a network that returns its own loss is not supported yet)")
    if hasattr(loss_fn, "_demi_loss_cell"):
        return loss_fn._demi_loss_cell()
    if not isinstance(loss_fn, _core.LossCell):
        raise TypeError(f"{who}: loss_fn is {type(loss_fn).__name__}, not a demi loss (nn.SoftmaxCrossEntropyWithLogits, ...)")
    return loss_fn


def amp_options(kwargs, who):
    """(low dtype, loss-scale manager, keep_batchnorm_fp32) from the keyword arguments MindSpore's Model and
    build_train_network take (loss_scale_manager, keep_batchnorm_fp32) and demi's amp_dtype; anything else
    is refused."""
    kwargs = dict(kwargs)
    dtype = kwargs.pop("amp_dtype", _core.dtype.float16)
    if dtype not in (_core.dtype.float16, _core.dtype.bfloat16):
        raise ValueError(f"{who}: amp_dtype must be demi.float16 or demi.bfloat16, got {dtype}")
    manager = kwargs.pop("loss_scale_manager", None)
    keep_bn = kwargs.pop("keep_batchnorm_fp32", None)
    if kwargs:
        raise ValueError(f"{who}: {', '.join(sorted(kwargs))} not supported by demi")
    return dtype, manager, keep_bn


class Model:
    """Model(network, loss_fn, optimizer, metrics=None, amp_level="O0", loss_scale_manager=...,
    keep_batchnorm_fp32=...). demi's extra: amp_dtype=demi.bfloat16 for bfloat16 mixed precision (float16
    by default, as MindSpore)."""

    def __init__(self, network, loss_fn=None, optimizer=None, metrics=None, eval_network=None, eval_indexes=None,
                 amp_level="O0", boost_level="O0", **kwargs):
        if eval_network is not None or eval_indexes is not None:
            raise ValueError("Model: eval_network and eval_indexes are not supported by demi (it evaluates the "
                             "network with the metrics)")
        if boost_level != "O0":
            raise ValueError("Model: boost_level is not supported by demi")
        if optimizer is None:
            raise ValueError("Model: demi needs an optimizer")
        low, manager, keep_bn = amp_options(kwargs, "Model")
        self._network = network
        self._model = _core.Model(network, loss_cell_of(loss_fn, "Model"), optimizer, _metrics_of(metrics),
                                  amp_level, low, manager, keep_bn)

    def train(self, epoch, train_dataset, callbacks=None, dataset_sink_mode=False, sink_size=-1, initial_epoch=0):
        if initial_epoch != 0:
            raise ValueError("Model.train: initial_epoch is not supported by demi (resume from a checkpoint)")
        if not isinstance(train_dataset, Dataset):
            raise TypeError(f"Model.train: train_dataset is {type(train_dataset).__name__}, not a demi.dataset")
        if callbacks is not None and not isinstance(callbacks, (list, tuple)):
            callbacks = [callbacks]
        self._model.train(epoch, train_dataset._core, callbacks, dataset_sink_mode, sink_size)

    def eval(self, valid_dataset, callbacks=None, dataset_sink_mode=False):
        if not isinstance(valid_dataset, Dataset):
            raise TypeError(f"Model.eval: valid_dataset is {type(valid_dataset).__name__}, not a demi.dataset")
        if callbacks:
            raise ValueError("Model.eval: callbacks are not supported by demi's eval")
        return dict(self._model.eval(valid_dataset._core, dataset_sink_mode))

    def predict(self, *predict_data):
        if len(predict_data) != 1:
            raise ValueError("Model.predict: demi's networks take one input tensor here")
        return self._model.predict(predict_data[0])

    @property
    def train_network(self):
        return self._network

    @property
    def predict_network(self):
        return self._network

    def last_summary(self):
        """demi's measurements of the last train(): samples_per_second, final_loss, peak_train_bytes, ..."""
        return self._model.last_summary()
