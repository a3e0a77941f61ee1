from demi.common import dtype  # noqa: F401
from demi.common.tensor import Tensor, Parameter  # noqa: F401
