"""mindspore.dataset.transforms on demi."""
from demi import _core


def TypeCast(data_type):
    return _core.TypeCast(data_type)


def OneHot(num_classes):
    return _core.OneHot(num_classes)
