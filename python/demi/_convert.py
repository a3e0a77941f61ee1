"""Python values as arrays demi can take (called by demi._core when a tensor is made from Python data)."""
import numpy as np

# numpy dtypes demi has no tensor type for, and the one each becomes (the nearest that holds every value).
_WIDEN = {np.dtype(np.int8): np.int32, np.dtype(np.int16): np.int32, np.dtype(np.uint16): np.int32,
          np.dtype(np.uint32): np.int64, np.dtype(np.uint64): np.int64}


def as_array(obj, dtype=None):
    """A C-contiguous numpy array of `obj` in a dtype demi has: numpy's conversion, except that Python
    floats (and lists of them) become float32 and Python ints int64, as MindSpore's Tensor makes them."""
    from demi import _core
    if isinstance(obj, np.ndarray):
        array = obj
    elif isinstance(obj, (bool, np.bool_)):
        array = np.asarray(obj, dtype=np.bool_)
    elif isinstance(obj, float):
        array = np.asarray(obj, dtype=np.float32)
    else:
        array = np.asarray(obj)
        if array.dtype == np.float64 and not isinstance(obj, np.generic):
            array = array.astype(np.float32)  # a Python list of floats
    if array.dtype == object:
        raise TypeError(f"cannot make a tensor of {type(obj).__name__}: its values are not numbers")
    if array.dtype in _WIDEN:
        array = array.astype(_WIDEN[array.dtype])
    if dtype is not None and dtype != _core.dtype.bfloat16:
        array = array.astype(to_numpy_dtype(dtype))
    elif dtype == _core.dtype.bfloat16:
        array = array.astype(np.float32)  # numpy has no bfloat16: the tensor is cast after the copy
    # (np.ascontiguousarray would make a 0-d array 1-d)
    return array if array.flags.c_contiguous else np.array(array, order="C")


def to_numpy_dtype(dtype):
    from demi import _core
    table = {_core.dtype.float32: np.float32, _core.dtype.float16: np.float16, _core.dtype.float64: np.float64,
             _core.dtype.int32: np.int32, _core.dtype.int64: np.int64, _core.dtype.uint8: np.uint8,
             _core.dtype.bool_: np.bool_, _core.dtype.bfloat16: np.float32}
    return table[dtype]
