"""dtypes, as mindspore.common.dtype (mstype) names them."""
from demi._core import dtype as _dtype

float32 = _dtype.float32
float16 = _dtype.float16
bfloat16 = _dtype.bfloat16
float64 = _dtype.float64
int32 = _dtype.int32
int64 = _dtype.int64
uint8 = _dtype.uint8
bool_ = _dtype.bool_
float_ = float32
half = float16
double = float64
int_ = int32
