"""mindspore.ops's functional names on demi (the ops a construct calls), and a few Primitive classes."""
from demi import _core
from demi._core import relu, sigmoid, tanh, silu, add, sub, mul, div, transpose as _transpose  # noqa: F401


def gelu(x, approximate="none"):
    return _core.gelu(x, approximate == "tanh")


def softmax(x, axis=-1, dim=None):
    return _core.softmax(x, axis if dim is None else dim)


def log_softmax(x, axis=-1):
    return _core.log_softmax(x, axis)


def matmul(a, b):
    return _core.matmul(a, b)


def reshape(x, shape):
    return _core.reshape(x, list(shape))


def flatten(x, start_dim=1):
    return x.flatten(start_dim)


def transpose(x, input_perm):
    return _core.transpose(x, list(input_perm))


permute = transpose


def concat(tensors, axis=0):
    return _core.concat(list(tensors), axis)


cat = concat


def split(x, split_size_or_sections, axis=0):
    if not isinstance(split_size_or_sections, int):
        raise ValueError("split: demi splits into equal sections (an int)")
    return tuple(_core.split(x, axis, x.shape[axis] // split_size_or_sections))


def _axes(axis):
    if axis is None or axis == ():
        return []
    return [axis] if isinstance(axis, int) else list(axis)


def mean(x, axis=None, keep_dims=False):
    return _core.mean(x, _axes(axis), keep_dims)


def sum(x, axis=None, keepdims=False):  # noqa: A001 (MindSpore's name)
    return _core.sum(x, _axes(axis), keepdims)


def argmax(x, axis=None, keepdims=False):
    if keepdims:
        raise ValueError("argmax: keepdims is not supported by demi")
    return x.argmax(axis)


def cast(x, dtype):
    return _core.cast(x, dtype)


def expand_dims(x, axis):
    shape = list(x.shape)
    axis = axis if axis >= 0 else axis + len(shape) + 1
    return _core.reshape(x, shape[:axis] + [1] + shape[axis:])


unsqueeze = expand_dims


def squeeze(x, axis=None):
    shape = list(x.shape)
    if axis is None:
        return _core.reshape(x, [d for d in shape if d != 1])
    axes = {a % len(shape) for a in _axes(axis)}
    for a in axes:
        if shape[a] != 1:
            raise ValueError(f"squeeze: axis {a} of shape {tuple(shape)} is not 1")
    return _core.reshape(x, [d for i, d in enumerate(shape) if i not in axes])


def zeros(shape, dtype=None):
    return _core.zeros(list(shape) if not isinstance(shape, int) else [shape], dtype or _core.dtype.float32)


def ones(shape, dtype=None):
    return _core.ones(list(shape) if not isinstance(shape, int) else [shape], dtype or _core.dtype.float32)


class _Primitive:
    def __repr__(self):
        return f"{type(self).__name__}<>"


class ReLU(_Primitive):
    def __call__(self, x):
        return _core.relu(x)


class Reshape(_Primitive):
    def __call__(self, x, shape):
        return reshape(x, shape)


class MatMul(_Primitive):
    def __init__(self, transpose_a=False, transpose_b=False):
        self.transpose_a, self.transpose_b = transpose_a, transpose_b

    def __call__(self, a, b):
        return _core.matmul(a, b, self.transpose_a, self.transpose_b)


class Transpose(_Primitive):
    def __call__(self, x, perm):
        return transpose(x, perm)


class Softmax(_Primitive):
    def __init__(self, axis=-1):
        self.axis = axis

    def __call__(self, x):
        return _core.softmax(x, self.axis)


class Concat(_Primitive):
    def __init__(self, axis=0):
        self.axis = axis

    def __call__(self, tensors):
        return concat(tensors, self.axis)


class Argmax(_Primitive):
    def __init__(self, axis=-1, output_type=None):
        self.axis = axis

    def __call__(self, x):
        return x.argmax(self.axis)
