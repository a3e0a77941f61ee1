"""value_and_grad and grad: reverse-mode differentiation of a Python function by demi's autograd."""
from demi import _core


def _positions(grad_position, nargs):
    if grad_position is None:
        return None
    if isinstance(grad_position, int):
        grad_position = (grad_position,)
    for p in grad_position:
        if not -nargs <= p < nargs:
            raise ValueError(f"grad_position {p} is out of range for {nargs} arguments")
    return tuple(p % nargs for p in grad_position)


def value_and_grad(fn, grad_position=0, weights=None, has_aux=False):
    """MindSpore's value_and_grad: a function returning (fn's value, the gradients of its first output)
    with respect to the arguments at grad_position and/or `weights` (e.g. optimizer.parameters). With
    has_aux, fn returns (loss, aux, ...) and the gradient is the loss's. grads: a tuple per requested group,
    (inputs' grads, weights' grads) when both are asked for."""
    weights = None if weights is None else list(weights)
    if grad_position is None and weights is None:
        raise ValueError("value_and_grad: grad_position and weights cannot both be None")

    def wrapper(*args):
        positions = _positions(grad_position, len(args))
        args = list(args)
        if positions is not None:
            for p in positions:
                if not isinstance(args[p], _core.Tensor):
                    raise TypeError(f"value_and_grad: argument {p} is {type(args[p]).__name__}, not a Tensor")
                args[p] = args[p].copy()
                args[p].requires_grad = True
        for w in weights or ():
            w._set_grad(None)
        out = fn(*args)
        value = out
        if isinstance(out, tuple):
            if not has_aux and len(out) != 1:
                raise ValueError("value_and_grad: fn returned several outputs; pass has_aux=True to take the "
                                 "gradient of the first")
            value = out[0]
        if not isinstance(value, _core.Tensor) or value.size != 1:
            raise ValueError("value_and_grad: the (first) output must be a one-element Tensor (a loss)")
        _core.backward(value)

        def take(ts):
            gs = tuple(t.grad if t.grad is not None else _core.zeros(list(t.shape), t.dtype) for t in ts)
            for t in ts:
                t._set_grad(None)
            return gs

        grads_in = None if positions is None else take([args[p] for p in positions])
        grads_w = None if weights is None else take(weights)
        if grads_in is not None and len(grads_in) == 1 and isinstance(grad_position, int):
            grads_in = grads_in[0]
        if grads_w is None:
            grads = grads_in
        elif grads_in is None:
            grads = grads_w
        else:
            grads = (grads_in, grads_w)
        return out, grads

    return wrapper


def grad(fn, grad_position=0, weights=None, has_aux=False):
    vg = value_and_grad(fn, grad_position, weights, has_aux)

    def wrapper(*args):
        out, grads = vg(*args)
        return (grads, out[1:]) if has_aux else grads

    return wrapper
