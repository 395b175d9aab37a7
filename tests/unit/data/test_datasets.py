import gzip
import shutil

import numpy as np
import pytest

from tftrain.data import datasets
from tftrain.errors import DataError


@pytest.fixture(scope="module")
def mnist():
    return datasets.load_mnist()


def test_bundled_mnist_is_the_real_data(mnist):
    assert mnist.x_train.shape == (60000, 28, 28) and mnist.x_test.shape == (10000, 28, 28)
    assert mnist.x_train.dtype == np.uint8 and mnist.y_train.dtype == np.uint8
    assert mnist.y_train[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert mnist.y_test[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    assert round(float(mnist.x_train.mean()), 3) == 33.318


def test_corrupt_bundled_file_fails_checksum(tmp_path, monkeypatch):
    bad = tmp_path / "mnist.npz"
    shutil.copy(datasets.BUNDLED_MNIST, bad)
    with open(bad, "r+b") as f:
        f.seek(1000)
        f.write(b"\x00\x01\x02")
    monkeypatch.setattr(datasets, "BUNDLED_MNIST", bad)
    with pytest.raises(DataError, match="corrupt"):
        datasets.load_mnist()


def _write_idx(path, array):
    codes = {np.dtype(np.uint8): 0x08}
    header = bytes([0, 0, codes[array.dtype], array.ndim])
    header += b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.tobytes())


def write_idx_folder(folder, data, n_train=300, n_test=100):
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        "x_train": data.x_train[:n_train], "y_train": data.y_train[:n_train],
        "x_test": data.x_test[:n_test], "y_test": data.y_test[:n_test],
    }
    for key, stem in datasets.IDX_FILES.items():
        _write_idx(folder / f"{stem}.gz", arrays[key])
    return arrays


def test_idx_folder_round_trip(tmp_path, mnist):
    arrays = write_idx_folder(tmp_path / "idx", mnist)
    loaded = datasets.load_mnist(tmp_path / "idx")
    for key, value in arrays.items():
        np.testing.assert_array_equal(getattr(loaded, key), value)


def test_uncompressed_idx_files_are_accepted(tmp_path, mnist):
    write_idx_folder(tmp_path / "idx", mnist)
    for gz in (tmp_path / "idx").iterdir():
        with gzip.open(gz) as f:
            gz.with_suffix("").write_bytes(f.read())
        gz.unlink()
    assert datasets.load_mnist(tmp_path / "idx").x_train.shape == (300, 28, 28)


def test_npz_file(tmp_path, mnist):
    path = tmp_path / "small.npz"
    np.savez(path, x_train=mnist.x_train[:50], y_train=mnist.y_train[:50],
             x_test=mnist.x_test[:20], y_test=mnist.y_test[:20])
    assert datasets.load_mnist(path).x_test.shape == (20, 28, 28)


def test_missing_path(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        datasets.load_mnist(tmp_path / "nope")


def test_folder_missing_a_file(tmp_path, mnist):
    write_idx_folder(tmp_path / "idx", mnist)
    (tmp_path / "idx" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte"):
        datasets.load_mnist(tmp_path / "idx")


def test_wrong_image_shape(tmp_path):
    folder = tmp_path / "idx"
    folder.mkdir()
    rng = np.random.default_rng(0)
    shapes = {"x_train": (10, 32, 32), "y_train": (10,), "x_test": (5, 32, 32), "y_test": (5,)}
    for key, stem in datasets.IDX_FILES.items():
        _write_idx(folder / f"{stem}.gz", rng.integers(0, 10, shapes[key], dtype=np.uint8))
    with pytest.raises(DataError, match=r"x_train has shape \(10, 32, 32\)"):
        datasets.load_mnist(folder)


def test_label_count_mismatch(tmp_path, mnist):
    arrays = write_idx_folder(tmp_path / "idx", mnist)
    _write_idx(tmp_path / "idx" / "train-labels-idx1-ubyte.gz", arrays["y_train"][:-1])
    with pytest.raises(DataError, match="one label per image"):
        datasets.load_mnist(tmp_path / "idx")


def test_truncated_idx_file(tmp_path, mnist):
    write_idx_folder(tmp_path / "idx", mnist)
    path = tmp_path / "idx" / "train-images-idx3-ubyte.gz"
    with gzip.open(path) as f:
        raw = f.read()
    with gzip.open(path, "wb") as f:
        f.write(raw[:-100])
    with pytest.raises(DataError, match="truncated"):
        datasets.load_mnist(tmp_path / "idx")


def test_not_idx(tmp_path):
    path = tmp_path / "x"
    path.write_bytes(b"hello world")
    with pytest.raises(DataError, match="not an IDX file"):
        datasets.read_idx(path)


def test_npz_missing_array(tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, x_train=np.zeros((2, 28, 28), np.uint8))
    with pytest.raises(DataError, match="lacks array"):
        datasets.load_mnist(path)


def test_npz_with_pickled_objects_is_refused(tmp_path):
    path = tmp_path / "pickled.npz"
    obj = np.array([{"a": 1}], dtype=object)
    np.savez(path, x_train=obj, y_train=obj, x_test=obj, y_test=obj)
    with pytest.raises(DataError, match="Cannot read"):
        datasets.load_mnist(path)
