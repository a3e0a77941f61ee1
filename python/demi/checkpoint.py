"""Checkpoints of a network's parameters: save_checkpoint, load_checkpoint, load_param_into_net (safetensors
files, written atomically)."""
import os

from demi import _core


def save_checkpoint(save_obj, ckpt_file_name):
    """Writes the cell's parameters and buffers to ckpt_file_name (safetensors, whatever the extension)."""
    if not isinstance(save_obj, _core.Cell):
        raise TypeError(f"save_checkpoint: demi saves a Cell, got {type(save_obj).__name__}")
    _core.save_checkpoint(save_obj, os.fspath(ckpt_file_name))


def load_checkpoint(ckpt_file_name, net=None, strict_load=False):
    """{name: Tensor} of a checkpoint; with net, also loaded into it."""
    params = dict(_core.load_checkpoint(os.fspath(ckpt_file_name)))
    if net is not None:
        load_param_into_net(net, params, strict_load)
    return params


def load_param_into_net(net, parameter_dict, strict_load=False):
    """Copies the named tensors into the network's parameters; returns (param_not_load, ckpt_not_load)."""
    return _core.load_param_into_net(net, list(parameter_dict.items()), strict_load)
