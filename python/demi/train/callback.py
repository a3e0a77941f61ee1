"""Callbacks: demi's C++ LossMonitor, TimeMonitor and ModelCheckpoint (they print what MindSpore's print),
and Callback, the base of Python callbacks, called with MindSpore's method names (on_train_step_end, ...,
and the older step_end, epoch_end, begin, end) and a RunContext whose original_args() are cb_params."""
import types

from demi import _core

LossMonitor = _core.LossMonitor
TimeMonitor = _core.TimeMonitor

# demi's event -> the MindSpore methods that receive it (the 2.x name, then the older one).
_EVENTS = {
    "on_train_begin": ("on_train_begin", "begin"),
    "on_train_end": ("on_train_end", "end"),
    "on_train_epoch_begin": ("on_train_epoch_begin", "epoch_begin"),
    "on_train_epoch_end": ("on_train_epoch_end", "epoch_end"),
    "on_train_step_begin": ("on_train_step_begin", "step_begin"),
    "on_train_step_end": ("on_train_step_end", "step_end"),
}


class RunContext:
    """What a callback sees: original_args() gives cb_params (cur_epoch_num, cur_step_num, epoch_num,
    batch_num, net_outputs: the step's loss as a Tensor, loss_scale, overflow, metrics); request_stop() ends
    training after this step (or epoch)."""

    def __init__(self, ctx):
        self._ctx = ctx
        self._params = types.SimpleNamespace(
            cur_epoch_num=ctx.epoch, epoch_num=ctx.epochs, cur_step_num=ctx.cur_step_num,
            batch_num=ctx.steps_per_epoch, step_in_epoch=ctx.step_in_epoch, batch_size=ctx.batch_size,
            net_outputs=_core.Tensor(ctx.loss, _core.dtype.float32), loss_scale=ctx.loss_scale,
            overflow=ctx.overflow, skipped=ctx.skipped, metrics=dict(ctx.metrics))

    def original_args(self):
        return self._params

    def request_stop(self):
        self._ctx.stop_requested = True

    def get_stop_requested(self):
        return self._ctx.stop_requested


class Callback:
    """Subclass it and define any of on_train_begin, on_train_epoch_begin, on_train_step_begin,
    on_train_step_end, on_train_epoch_end, on_train_end (or begin, epoch_begin, step_begin, step_end,
    epoch_end, end), each taking run_context."""

    def _demi_event(self, event, ctx):
        run_context = None
        for name in _EVENTS[event]:
            method = getattr(type(self), name, None)
            if method is not None and method is not getattr(Callback, name, None):
                run_context = run_context or RunContext(ctx)
                getattr(self, name)(run_context)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class CheckpointConfig:
    """MindSpore's CheckpointConfig: save_checkpoint_steps=1, save_checkpoint_seconds=0,
    keep_checkpoint_max=5, keep_checkpoint_per_n_minutes=0; the rest is refused, never ignored."""

    def __init__(self, save_checkpoint_steps=1, save_checkpoint_seconds=0, keep_checkpoint_max=5,
                 keep_checkpoint_per_n_minutes=0, integrated_save=True, async_save=False, saved_network=None,
                 append_info=None, enc_key=None, enc_mode="AES-GCM", exception_save=False, **kwargs):
        if save_checkpoint_seconds or keep_checkpoint_per_n_minutes or async_save or saved_network is not None \
                or append_info is not None or enc_key is not None or exception_save or kwargs:
            raise ValueError("CheckpointConfig: demi saves by steps (save_checkpoint_steps) and keeps the last "
                             "keep_checkpoint_max; time-based saving, async saving, encryption and extra info are "
                             "not supported")
        self.save_checkpoint_steps = save_checkpoint_steps
        self.keep_checkpoint_max = keep_checkpoint_max


def ModelCheckpoint(prefix="CKP", directory=None, config=None, **kwargs):
    """Saves <directory>/<prefix>-<epoch>_<step>.safetensors every config.save_checkpoint_steps steps (and at
    the end of training), keeping the last config.keep_checkpoint_max; writes are atomic."""
    if kwargs:
        raise ValueError(f"ModelCheckpoint: {', '.join(sorted(kwargs))} not supported by demi")
    config = config or CheckpointConfig()
    return _core.ModelCheckpoint(prefix, directory or ".", config.save_checkpoint_steps, 0, config.keep_checkpoint_max)
