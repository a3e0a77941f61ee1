"""MindSpore's context: set_context(mode=GRAPH_MODE, device_target="CPU", ...), get_context(key)."""
from demi import _core

GRAPH_MODE = 0
PYNATIVE_MODE = 1
_MODES = {GRAPH_MODE: _core.ExecMode.GRAPH_MODE, PYNATIVE_MODE: _core.ExecMode.PYNATIVE_MODE}


def set_context(mode=None, device_target=None, device_id=None, **kwargs):
    """Sets the execution context. mode: GRAPH_MODE (demi's default: every train step replays a static
    memory plan, learned fusions applied) or PYNATIVE_MODE (every op as it comes); device_target: "CPU",
    the only one demi has (another is an error naming it); demi's python_capture (True by default): in
    GRAPH_MODE a Python construct is recorded once and replayed without Python (docs/DESIGN.md, "Python");
    max_device_memory and other device settings are refused, never ignored."""
    threads = kwargs.pop("num_threads", None)
    capture = kwargs.pop("python_capture", None)
    if kwargs:
        raise ValueError(f"set_context: demi does not support {', '.join(sorted(kwargs))} "
                         "(it takes mode, device_target, device_id, num_threads)")
    if mode is not None and mode not in _MODES:
        raise ValueError(f"set_context: mode must be GRAPH_MODE (0) or PYNATIVE_MODE (1), got {mode!r}")
    _core.set_context(_MODES[mode] if mode is not None else None, device_target, device_id, threads)
    if capture is not None:
        _core.set_python_capture(bool(capture))


def set_device(device_target, device_id=None):
    set_context(device_target=device_target, device_id=device_id)


def get_context(attr_key):
    if attr_key == "python_capture":
        return _core.python_capture()
    value = _core.get_context(attr_key)
    if attr_key == "mode":
        return GRAPH_MODE if value == _core.ExecMode.GRAPH_MODE else PYNATIVE_MODE
    return value
