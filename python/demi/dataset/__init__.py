"""mindspore.dataset's names on demi: GeneratorDataset over a Python source, MnistDataset, Cifar10Dataset,
NumpySlicesDataset, and the pipeline (map, batch, shuffle, ...) running in demi's C++ pipeline. A Python
source is called with the GIL for one row at a time and its row copied into demi tensors; batching,
shuffling and C++ transforms never enter Python. Images are HWC, as MindSpore's (vision.HWC2CHW makes the
CHW a network takes)."""
import os

from demi import _core
from demi.dataset import transforms, vision  # noqa: F401

__all__ = ["Dataset", "GeneratorDataset", "MnistDataset", "Cifar10Dataset", "NumpySlicesDataset", "vision",
           "transforms"]


def _one_worker(who, num_parallel_workers):
    """Readers and batch run on one thread in demi (map's workers are the parallel part): more is refused."""
    if num_parallel_workers not in (None, 1):
        raise ValueError(f"{who}: num_parallel_workers={num_parallel_workers} is not supported by demi here "
                         "(give map(..., num_parallel_workers=N) the parallel work)")


def _refuse(who, **given):
    bad = [k for k, v in given.items() if v is not None]
    if bad:
        raise ValueError(f"{who}: {', '.join(bad)} {'is' if len(bad) == 1 else 'are'} not supported by demi")


class Dataset:
    """A pipeline over demi's C++ dataset. Each iterator made of it runs the next epoch (each with its own
    shuffle and random transforms: the same rows for the same seed)."""

    def __init__(self, core):
        self._core = core
        self._epochs = 0  # epochs handed to iterators so far

    # ---- pipeline ----
    def map(self, operations, input_columns=None, output_columns=None, num_parallel_workers=None, **kwargs):
        _refuse("map", output_columns=output_columns, **kwargs)
        if input_columns is None:
            input_columns = []
        elif isinstance(input_columns, str):
            input_columns = [input_columns]
        ops = [_transform(op) for op in (operations if isinstance(operations, (list, tuple)) else [operations])]
        return Dataset(self._core.map(ops, list(input_columns), num_parallel_workers or 1))

    def batch(self, batch_size, drop_remainder=False, num_parallel_workers=None, **kwargs):
        _refuse("batch", **kwargs)
        _one_worker("batch", num_parallel_workers)
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch: batch_size must be a positive int, got {batch_size!r}")
        return Dataset(self._core.batch(batch_size, drop_remainder))

    def shuffle(self, buffer_size):
        return Dataset(self._core.shuffle(buffer_size, None))

    def repeat(self, count=None):
        return Dataset(self._core.repeat(-1 if count is None else count))

    def take(self, count=-1):
        return self if count == -1 else Dataset(self._core.take(count))

    def skip(self, count):
        return Dataset(self._core.skip(count))

    def project(self, columns):
        return Dataset(self._core.project([columns] if isinstance(columns, str) else list(columns)))

    # ---- facts ----
    def get_dataset_size(self):
        return self._core.get_dataset_size()

    def get_col_names(self):
        return list(self._core.get_col_names())

    # ---- iteration ----
    # do_copy (MindSpore's hint to copy rows out of its pipeline) changes nothing here: every row a demi
    # iterator hands out is a tensor of its own (batch stacks into new storage), with either value.
    def create_tuple_iterator(self, columns=None, num_epochs=-1, output_numpy=False, do_copy=True):
        return _TupleIterator(self, columns, num_epochs, output_numpy, as_dict=False)

    def create_dict_iterator(self, num_epochs=-1, output_numpy=False, do_copy=True):
        return _TupleIterator(self, None, num_epochs, output_numpy, as_dict=True)

    def __iter__(self):
        return iter(_TupleIterator(self, None, 1, False, as_dict=False, as_list=True))

    def _next_epoch(self):
        epoch = self._epochs
        self._epochs += 1
        return epoch

    def __repr__(self):
        return f"Dataset({self._core.describe()})"


class _TupleIterator:
    """Rows of one epoch after another (num_epochs of them, -1: without end); each `for` over it runs one
    epoch. The pipeline runs on the caller's thread, without the GIL except inside a Python source."""

    def __init__(self, dataset, columns, num_epochs, output_numpy, as_dict, as_list=False):
        self._dataset = dataset
        self._names = dataset.get_col_names()
        self._pick = None if columns is None else [self._names.index(c) for c in columns]
        self._epochs_left = num_epochs
        self._numpy = output_numpy
        self._dict = as_dict
        self._list = as_list
        self._it = None

    def __iter__(self):
        return self

    def __next__(self):
        if self._it is None:
            if self._epochs_left == 0:
                raise StopIteration
            self._epochs_left -= 1 if self._epochs_left > 0 else 0
            self._it = self._dataset._core.create_iterator(self._dataset._next_epoch())
        row = self._it.next()
        if row is None:
            self._it = None
            raise StopIteration
        if self._numpy:
            row = tuple(t.asnumpy() for t in row)
        if self._dict:
            return dict(zip(self._names, row))
        if self._pick is not None:
            row = tuple(row[i] for i in self._pick)
        return list(row) if self._list else row


def _transform(op):
    if isinstance(op, _core.Transform) or callable(op):
        return op
    raise TypeError(f"map: {type(op).__name__} is not a transform (demi.dataset.vision/transforms) or a callable")


def _source_kind(source):
    if hasattr(source, "__getitem__") and hasattr(source, "__len__"):
        return "random_access"
    if hasattr(source, "__iter__"):
        return "iterable"
    if callable(source):
        return "callable"
    raise TypeError(f"GeneratorDataset: the source must be callable (returning an iterator), iterable, or random "
                    f"access (__getitem__ and __len__); got {type(source).__name__}")


def GeneratorDataset(source, column_names=None, column_types=None, schema=None, num_samples=None,
                     num_parallel_workers=1, shuffle=None, sampler=None, num_shards=None, shard_id=None,
                     python_multiprocessing=True, max_rowsize=None):
    """Rows from a Python source: a callable returning an iterator each epoch (the seed's
    `lambda: get_data(num)`), an iterable, or a random-access object (shuffled by default, as MindSpore's).
    Each row is a tuple with one value per column (numpy arrays, numbers, demi Tensors). One worker: a
    Python source runs under the GIL, where more threads gain nothing (num_parallel_workers > 1 is refused)."""
    _refuse("GeneratorDataset", column_types=column_types, schema=schema, sampler=sampler, num_shards=num_shards,
            shard_id=shard_id)
    if column_names is None:
        raise ValueError("GeneratorDataset: column_names is required by demi (e.g. ['image', 'label'])")
    if isinstance(column_names, str):
        column_names = [column_names]
    if num_parallel_workers not in (None, 1):
        raise ValueError(f"GeneratorDataset: num_parallel_workers={num_parallel_workers}: a Python source runs on "
                         "one thread under the GIL in demi (batching and prefetching already run in C++); use 1")
    kind = _source_kind(source)
    if shuffle and kind != "random_access":
        raise ValueError("GeneratorDataset: shuffle needs a random-access source (__getitem__ and __len__)")
    ds = Dataset(_core.generator_dataset(source, list(column_names), kind, -1))
    if kind == "random_access" and shuffle is not False:
        ds = ds.shuffle(max(1, len(source)))
    if num_samples is not None:
        ds = ds.take(num_samples)
    return ds


def NumpySlicesDataset(data, column_names=None, num_samples=None, num_parallel_workers=1, shuffle=None, **kwargs):
    _refuse("NumpySlicesDataset", **kwargs)
    _one_worker("NumpySlicesDataset", num_parallel_workers)
    if isinstance(data, dict):
        column_names, columns = list(data.keys()), list(data.values())
    elif isinstance(data, (list, tuple)) and data and not isinstance(data[0], (int, float)):
        columns = list(data)
    else:
        columns = [data]
    if column_names is None:
        column_names = [f"column_{i}" for i in range(len(columns))]
    elif isinstance(column_names, str):
        column_names = [column_names]
    ds = Dataset(_core.numpy_slices_dataset([_core.Tensor(c) for c in columns], list(column_names)))
    if shuffle is not False:
        ds = ds.shuffle(max(1, ds.get_dataset_size()))
    if num_samples is not None:
        ds = ds.take(num_samples)
    return ds


def _usage_of(who, dataset_dir, usage, train_prefix, test_prefix):
    if usage is not None:
        if usage not in ("train", "test", "all"):
            raise ValueError(f"{who}: usage must be 'train', 'test' or 'all', got {usage!r}")
        return usage
    try:
        names = os.listdir(dataset_dir)
    except OSError as e:
        raise ValueError(f"{who}: cannot read the directory {dataset_dir!r}: {e.strerror}") from None
    has_train = any(n.startswith(train_prefix) for n in names)
    has_test = any(n.startswith(test_prefix) for n in names)
    if has_train and has_test:
        return "all"
    if has_test:
        return "test"
    return "train"  # also when there is neither: the C++ reader names the files it looked for


def _file_dataset(core, shuffle, num_samples):
    ds = Dataset(core).map([_core.CHW2HWC()], ["image"])
    if shuffle is not False:
        ds = ds.shuffle(max(1, ds.get_dataset_size()))
    if num_samples is not None:
        ds = ds.take(num_samples)
    return ds


def MnistDataset(dataset_dir, usage=None, num_samples=None, num_parallel_workers=None, shuffle=None, sampler=None,
                 num_shards=None, shard_id=None, cache=None):
    """MNIST (or Fashion-MNIST) IDX files in dataset_dir: rows (image uint8 (28, 28, 1), label int32), shuffled
    unless shuffle=False. usage None reads what the directory holds (train, test or both, as MindSpore's 'all')."""
    _refuse("MnistDataset", sampler=sampler, num_shards=num_shards, shard_id=shard_id, cache=cache)
    _one_worker("MnistDataset", num_parallel_workers)
    usage = _usage_of("MnistDataset", dataset_dir, usage, "train-", "t10k-")
    return _file_dataset(_core.mnist_dataset(os.fspath(dataset_dir), usage), shuffle, num_samples)


def Cifar10Dataset(dataset_dir, usage=None, num_samples=None, num_parallel_workers=None, shuffle=None, sampler=None,
                   num_shards=None, shard_id=None, cache=None):
    """CIFAR-10 binary batches in dataset_dir: rows (image uint8 (32, 32, 3), label int32)."""
    _refuse("Cifar10Dataset", sampler=sampler, num_shards=num_shards, shard_id=shard_id, cache=cache)
    _one_worker("Cifar10Dataset", num_parallel_workers)
    usage = _usage_of("Cifar10Dataset", dataset_dir, usage, "data_batch", "test_batch")
    return _file_dataset(_core.cifar10_dataset(os.fspath(dataset_dir), usage), shuffle, num_samples)
