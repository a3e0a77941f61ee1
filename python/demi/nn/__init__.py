"""mindspore.nn's names on demi: Cell (subclass it with __init__ and construct), layers, losses, optimizers,
metrics. Layers, losses and optimizers are demi's C++ ones, with MindSpore's signatures and defaults
(Conv2d pads "same" and has no bias; SoftmaxCrossEntropyWithLogits is sparse=False, reduction="none")."""
from demi import _core
from demi._core import (Cell, Dense, Conv2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, ReLU, Sigmoid, Tanh,  # noqa: F401
                        SiLU, Identity, GELU, LeakyReLU, Flatten, BatchNorm1d, BatchNorm2d, Softmax, LogSoftmax,
                        LossCell, SoftmaxCrossEntropyWithLogits, NLLLoss, L1Loss, MSELoss, SmoothL1Loss,
                        BCEWithLogitsLoss, Optimizer, Accuracy, Loss, TopKCategoricalAccuracy, Metric)

LossBase = LossCell


def SequentialCell(*args):
    """SequentialCell(cell, cell, ...) or SequentialCell([cells])."""
    cells = list(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else list(args)
    for i, c in enumerate(cells):
        if not isinstance(c, Cell):
            raise TypeError(f"SequentialCell: item {i} is {type(c).__name__}, not a Cell")
    return _core.SequentialCell(cells)


def Dropout(keep_prob=None, p=None):
    """MindSpore 2.x's Dropout(p=0.5) (p: the probability of dropping) or 1.x's Dropout(keep_prob)."""
    if keep_prob is not None and p is not None:
        raise ValueError("Dropout: give keep_prob or p, not both")
    if p is None:
        p = 0.5 if keep_prob is None else 1.0 - keep_prob
    if not 0.0 <= p < 1.0:
        raise ValueError(f"Dropout: p must be in [0, 1), got {p}")
    return _core.Dropout(1.0 - p)


class CrossEntropyLoss:
    """MindSpore's CrossEntropyLoss(weight=None, ignore_index=-100, reduction='mean', label_smoothing=0.0):
    logits (N, C) with class ids (N) int32/int64, or class probabilities (N, C). Class weights and label
    smoothing are refused (demi has neither); a label of ignore_index (-100) is an error, not skipped."""

    def __init__(self, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        if weight is not None:
            raise ValueError("CrossEntropyLoss: class weights are not supported by demi")
        if label_smoothing != 0.0:
            raise ValueError("CrossEntropyLoss: label_smoothing is not supported by demi")
        if ignore_index != -100:
            raise ValueError("CrossEntropyLoss: ignore_index is not supported by demi (labels must be class ids)")
        self._sparse = _core.SoftmaxCrossEntropyWithLogits(True, reduction)
        self._dense = _core.SoftmaxCrossEntropyWithLogits(False, reduction)

    def __call__(self, logits, labels):
        dense = labels.dtype in (_core.dtype.float32, _core.dtype.float16, _core.dtype.bfloat16, _core.dtype.float64)
        return (self._dense if dense else self._sparse)(logits, labels)

    def _demi_loss_cell(self):  # what a Model trains with: class ids
        return self._sparse

    def __repr__(self):
        return "CrossEntropyLoss<>"


def _params_of(params, who):
    params = list(params)
    if params and isinstance(params[0], dict):
        raise ValueError(f"{who}: parameter groups (a list of dicts) are not supported yet; pass the parameters")
    return params


def Momentum(params, learning_rate, momentum, weight_decay=0.0, loss_scale=1.0, use_nesterov=False):
    if loss_scale != 1.0:
        raise ValueError("Momentum: loss_scale belongs to the loss-scale manager in demi "
                         "(Model(..., loss_scale_manager=...)), not to the optimizer")
    return _core.Momentum(_params_of(params, "Momentum"), float(learning_rate), float(momentum),
                          float(weight_decay), bool(use_nesterov))


def SGD(params, learning_rate=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, loss_scale=1.0):
    if loss_scale != 1.0:
        raise ValueError("SGD: loss_scale belongs to the loss-scale manager in demi, not to the optimizer")
    if dampening != 0.0:
        raise ValueError("SGD: dampening is not supported by demi")
    params = _params_of(params, "SGD")
    if momentum != 0.0:
        return _core.Momentum(params, float(learning_rate), float(momentum), float(weight_decay), bool(nesterov))
    if nesterov:
        raise ValueError("SGD: nesterov needs a momentum")
    return _core.SGD(params, float(learning_rate), float(weight_decay))


def Adam(params, learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, use_locking=False, use_nesterov=False,
         weight_decay=0.0, loss_scale=1.0):
    if loss_scale != 1.0 or use_nesterov:
        raise ValueError("Adam: loss_scale and use_nesterov are not supported by demi")
    return _core.Adam(_params_of(params, "Adam"), float(learning_rate), beta1, beta2, eps, float(weight_decay))


def AdamWeightDecay(params, learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0):
    return _core.AdamWeightDecay(_params_of(params, "AdamWeightDecay"), float(learning_rate), beta1, beta2, eps,
                                 float(weight_decay))


AdamW = AdamWeightDecay
