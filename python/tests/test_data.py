import numpy as np
import pytest

import demi as ms
import demi.dataset as ds
from demi.dataset import transforms, vision


def rows(n):
    for i in range(n):
        yield np.full((2, 3), i, np.float32), i


def test_generator_dataset_from_a_callable_an_iterable_and_random_access():
    class RandomAccess:
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return np.full((2, 3), i, np.float32), i

    for source, shuffled in ((lambda: rows(5), False), (list(rows(5)), True), (RandomAccess(), True)):
        data = ds.GeneratorDataset(source, column_names=["image", "label"], shuffle=False if not shuffled else None)
        assert data.get_dataset_size() == 5
        assert data.get_col_names() == ["image", "label"]
        labels = sorted(int(label.item()) for _, label in data.create_tuple_iterator())
        assert labels == [0, 1, 2, 3, 4]
        batched = data.batch(2)
        shapes = [(img.shape, lab.shape, lab.dtype) for img, lab in batched.create_tuple_iterator()]
        assert shapes[0] == ((2, 2, 3), (2,), ms.int64) and shapes[-1][0] == (1, 2, 3)


def test_each_iterator_runs_the_next_epoch():
    data = ds.GeneratorDataset(list(rows(8)), column_names=["image", "label"])  # shuffled (random access)
    first = [int(b.item()) for _, b in data.create_tuple_iterator()]
    second = [int(b.item()) for _, b in data.create_tuple_iterator()]
    assert sorted(first) == sorted(second) == list(range(8))
    assert first != second


def test_dict_iterator_numpy_output_and_map_with_python_function():
    data = ds.GeneratorDataset(lambda: rows(3), column_names=["image", "label"])
    data = data.map(lambda a: a * 2 + 1, "image").map(transforms.TypeCast(ms.int32), "label")
    out = list(data.create_dict_iterator(output_numpy=True))
    assert out[2]["image"][0, 0] == 5 and out[2]["label"].dtype == np.int32


def test_a_sources_own_exception_comes_back_as_itself_with_its_traceback():
    def broken():
        yield np.zeros(2, np.float32), 0
        raise ZeroDivisionError("source failed at row 1")

    data = ds.GeneratorDataset(broken, column_names=["x", "y"]).batch(2)
    with pytest.raises(ZeroDivisionError, match="row 1") as e:
        list(data.create_tuple_iterator())
    assert any(frame.name == "broken" for frame in e.traceback)


def test_bad_sources_and_settings_are_refused_clearly():
    with pytest.raises(ms.DemiError, match="3 columns.*2"):
        list(ds.GeneratorDataset(lambda: iter([(1, 2, 3)]), column_names=["a", "b"]).create_tuple_iterator())
    with pytest.raises(ValueError, match="num_parallel_workers"):
        ds.GeneratorDataset(lambda: rows(2), column_names=["a", "b"], num_parallel_workers=4)
    with pytest.raises(ValueError, match="column_names"):
        ds.GeneratorDataset(lambda: rows(2))
    with pytest.raises(TypeError, match="callable"):
        ds.GeneratorDataset(42, column_names=["a"])
    with pytest.raises(ms.DemiError, match=r"row 1, column 'a': expected float32 \(2\)"):
        bad = iter([(np.zeros(2, np.float32),), (np.zeros(3, np.float32),)])
        list(ds.GeneratorDataset(lambda: bad, column_names=["a"]).batch(2).create_tuple_iterator())


def test_mnist_dataset_gives_mindsporess_hwc_rows(fashion_mnist_dir):
    test = ds.MnistDataset(str(fashion_mnist_dir / "test"), shuffle=False)
    assert test.get_dataset_size() == 10000
    image, label = next(test.create_tuple_iterator())
    assert image.shape == (28, 28, 1) and image.dtype == ms.uint8
    piped = test.map([vision.Rescale(1.0 / 255.0, 0), vision.Normalize(mean=(0.1307,), std=(0.3081,)),
                      vision.HWC2CHW()], "image").batch(4)
    batch, labels = next(piped.create_tuple_iterator())
    assert batch.shape == (4, 1, 28, 28) and batch.dtype == ms.float32
    expected = (image.asnumpy().astype(np.float32) / 255.0 - 0.1307) / 0.3081
    np.testing.assert_allclose(batch.asnumpy()[0, 0], expected[:, :, 0], rtol=1e-5, atol=1e-6)
    assert ds.MnistDataset(str(fashion_mnist_dir / "train")).get_dataset_size() == 60000
    with pytest.raises(ValueError, match="cannot read the directory"):
        ds.MnistDataset(str(fashion_mnist_dir / "nowhere"))


def test_map_workers_give_the_rows_of_one_worker_and_readers_refuse_workers(fashion_mnist_dir):
    def run(workers):
        data = ds.GeneratorDataset(list(rows(16)), column_names=["image", "label"], shuffle=False)
        data = data.map(vision.Rescale(0.5, 1.0), "image", num_parallel_workers=workers).batch(4)
        return [img.asnumpy() for img, _ in data.create_tuple_iterator()]

    for a, b in zip(run(1), run(2)):
        np.testing.assert_array_equal(a, b)
    labels = ds.GeneratorDataset(lambda: rows(3), column_names=["image", "label"]).map(transforms.OneHot(4), "label")
    np.testing.assert_array_equal([l.asnumpy() for _, l in labels.create_tuple_iterator()], np.eye(4)[:3])
    with pytest.raises(ValueError, match="num_parallel_workers=4"):
        ds.MnistDataset(str(fashion_mnist_dir / "test"), num_parallel_workers=4)
    with pytest.raises(ValueError, match="num_parallel_workers=2"):
        ds.GeneratorDataset(lambda: rows(2), column_names=["a", "b"]).batch(2, num_parallel_workers=2)
