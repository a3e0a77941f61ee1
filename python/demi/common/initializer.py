"""mindspore.common.initializer's classes on demi: weight_init=Normal(0.02) and the like (also the names as
strings: "normal", "zeros", "he_uniform", ...)."""
from demi._core import Initializer


def Normal(sigma=0.01, mean=0.0):
    return Initializer.Normal(sigma, mean)


def TruncatedNormal(sigma=0.01):
    return Initializer.TruncatedNormal(sigma)


def Uniform(scale=0.07):
    return Initializer.Uniform(scale)


def HeUniform(negative_slope=0.0):
    return Initializer.HeUniform(negative_slope)


def HeNormal(negative_slope=0.0):
    return Initializer.HeNormal(negative_slope)


def XavierUniform(gain=1.0):
    return Initializer.XavierUniform(gain)


def Zero():
    return Initializer.Zero()


def One():
    return Initializer.One()


def Constant(value):
    return Initializer.Constant(float(value))
