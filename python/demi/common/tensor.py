"""Tensor (demi's, shared with C++) and Parameter."""
from demi._core import Tensor


class Parameter(Tensor):
    """A trainable tensor: assigned to a Cell's attribute, it becomes one of the cell's parameters
    (named by the attribute, trained by optimizers given cell.trainable_params())."""
    _demi_parameter = True

    def __init__(self, default_input, name=None, requires_grad=True):
        super().__init__(default_input)
        self.requires_grad = requires_grad
        if name is not None:
            self.name = name

    def __repr__(self):
        return f"Parameter(name={self.name!r}, shape={list(self.shape)}, dtype={self.dtype}, requires_grad={self.requires_grad})"
