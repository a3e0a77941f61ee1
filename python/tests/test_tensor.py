import numpy as np
import pytest

import demi as ms
from demi import ops


def test_numpy_round_trip_keeps_values_shape_and_dtype():
    for dtype in (np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_):
        a = (np.arange(24).reshape(2, 3, 4) % 5).astype(dtype)
        t = ms.Tensor(a)
        assert t.shape == (2, 3, 4)
        back = t.asnumpy()
        assert back.dtype == a.dtype
        np.testing.assert_array_equal(back, a)


def test_asnumpy_shares_the_tensors_memory():
    t = ms.Tensor(np.zeros(4, np.float32))
    a = t.asnumpy()
    b = t.asnumpy()
    assert np.shares_memory(a, b)
    del t
    a[0] = 1  # the array keeps the storage alive
    assert b[0] == 1


def test_python_scalars_and_lists_take_mindspores_dtypes():
    assert ms.Tensor(1.5).dtype == ms.float32
    assert ms.Tensor(3).dtype == ms.int64
    assert ms.Tensor([1.0, 2.0]).dtype == ms.float32
    assert ms.Tensor(True).dtype == ms.bool_
    assert ms.Tensor(np.array([1, 2], np.int8)).dtype == ms.int32
    assert ms.Tensor([1, 2], ms.float16).dtype == ms.float16
    b = ms.Tensor([1.0, 2.5], ms.bfloat16)
    assert b.dtype == ms.bfloat16 and b.asnumpy().dtype == np.float32  # numpy has no bfloat16


def test_arithmetic_and_comparisons_match_numpy():
    a = np.array([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]], np.float32)
    b = np.array([0.5, 2.0, -1.0], np.float32)
    ta, tb = ms.Tensor(a), ms.Tensor(b)
    np.testing.assert_allclose((ta + tb).asnumpy(), a + b)
    np.testing.assert_allclose((ta - 1).asnumpy(), a - 1)
    np.testing.assert_allclose((2 * ta).asnumpy(), 2 * a)
    np.testing.assert_allclose((ta / tb).asnumpy(), a / b)
    np.testing.assert_array_equal((ta > 0).asnumpy(), a > 0)
    np.testing.assert_array_equal((ta == tb).asnumpy(), a == b)
    assert ta.sum().item() == pytest.approx(a.sum())
    np.testing.assert_array_equal(ta.argmax(1).asnumpy(), a.argmax(1))
    assert (ta.argmax(1) == ms.Tensor(a.argmax(1))).asnumpy().sum() == 2
    np.testing.assert_allclose(ops.softmax(ta, axis=-1).asnumpy(),
                               np.exp(a) / np.exp(a).sum(-1, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(ops.reshape(ta, (3, 2)).asnumpy(), a.reshape(3, 2))
    np.testing.assert_allclose(ops.transpose(ta, (1, 0)).asnumpy(), a.T)
    np.testing.assert_allclose(ta.astype(ms.float16).asnumpy(), a.astype(np.float16))
    assert len(ta) == 2 and ta[1, 2].item() == -6.0


def test_bad_input_is_a_clear_error():
    with pytest.raises(ms.DemiError, match=r"\(2, 3\).*\(4\)|\(4\).*\(2, 3\)"):
        ms.Tensor(np.ones((2, 3), np.float32)) + ms.Tensor(np.ones(4, np.float32))
    with pytest.raises(ms.DemiError, match="item"):
        ms.Tensor([1.0, 2.0]).item()
    with pytest.raises(TypeError):
        ms.Tensor(["a", object()])


def test_value_and_grad_matches_finite_differences():
    rng = np.random.default_rng(0)
    w = ms.Parameter(ms.Tensor(rng.standard_normal((3, 4)).astype(np.float64)), name="w")
    x = ms.Tensor(rng.standard_normal((5, 3)).astype(np.float64))

    def f(x):
        return ops.mean(ops.tanh(ops.matmul(x, w)))

    out, grads = ms.value_and_grad(f, 0, [w])(x)
    assert out.size == 1 and out.item() == pytest.approx(f(x).item())
    gx, (gw,) = grads
    eps = 1e-6
    a = x.asnumpy().copy()
    num = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        p, m = a.copy(), a.copy()
        p[i] += eps
        m[i] -= eps
        num[i] = (f(ms.Tensor(p)).item() - f(ms.Tensor(m)).item()) / (2 * eps)
    np.testing.assert_allclose(gx.asnumpy(), num, rtol=1e-6, atol=1e-9)
    assert gw.shape == (3, 4)
    assert w.grad is None  # value_and_grad leaves no gradient behind


def test_grad_and_dropout():
    x = ms.Tensor(np.array([1.0, -2.0, 3.0], np.float32))
    g = ms.grad(lambda t: ops.sum(t * t))(x)
    np.testing.assert_allclose(g.asnumpy(), [2.0, -4.0, 6.0])
    from demi import nn
    drop = nn.Dropout(p=0.5)
    y = drop(ms.Tensor(np.ones(1000, np.float32))).asnumpy()
    assert set(np.unique(y)) <= {0.0, 2.0} and 350 < (y == 0).sum() < 650  # kept values scaled by 1/(1-p)
    drop.set_train(False)
    np.testing.assert_array_equal(drop(x).asnumpy(), x.asnumpy())
