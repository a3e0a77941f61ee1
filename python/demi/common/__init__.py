from demi.common import dtype, initializer  # noqa: F401
from demi.common.tensor import Tensor, Parameter  # noqa: F401
