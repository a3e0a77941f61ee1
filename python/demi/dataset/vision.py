"""mindspore.dataset.vision's transforms on demi (C++; images HWC unless a transform says otherwise)."""
from demi import _core


def Rescale(rescale, shift):
    return _core.Rescale(float(rescale), float(shift))


def Normalize(mean, std, is_hwc=True):
    return _core.Normalize([float(m) for m in mean], [float(s) for s in std], is_hwc)


def HWC2CHW():
    return _core.HWC2CHW()

