"""Real datasets: the bundled MNIST, MNIST-format IDX folders, Keras-layout `.npz`. MNIST (LeCun, Cortes,
Burges; http://yann.lecun.com/exdb/mnist/) ships as `mnist.npz`, sha256-checked on load, so everything runs offline."""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path
from typing import NamedTuple, Optional, Union

import numpy as np

from tftrain.errors import DataError

BUNDLED_MNIST = Path(__file__).with_name("mnist.npz")
"""Path of the bundled MNIST file (Keras `mnist.npz` layout)."""

BUNDLED_MNIST_SHA256 = "06af5dfe73b70e3bc1c36439982b18a8d76803db9b544f6fdf838a37fbb01b64"

IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
"""Keras array name -> IDX file name (read with or without a `.gz` suffix)."""

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class ImageClassificationData(NamedTuple):
    """Train and test splits: uint8 images `(N, height, width)`, pixels 0..255, and uint8 labels `(N,)`."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def sha256_of(path: Union[str, os.PathLike], chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 digest of a file, read in `chunk_bytes` chunks (default 1 MiB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(chunk_bytes), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_idx(path: Union[str, os.PathLike]) -> np.ndarray:
    """Reads one IDX file (gzip if named `.gz`) into an array of the file's dtype and shape.

    Raises:
        DataError: the header is not IDX or the data length disagrees with it.
    """
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"Cannot read IDX file {path!r}: {e}.") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DataError(f"{path!r} is not an IDX file (bad magic number). Expected MNIST-format files.")
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(
            f"IDX file {path!r} is truncated or corrupt: header says shape {shape} "
            f"({expected} bytes) but it holds {len(raw) - header} bytes."
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _find_idx(folder: Path, stem: str) -> Path:
    for name in (stem + ".gz", stem):
        if (folder / name).is_file():
            return folder / name
    raise DataError(
        f"Data folder {str(folder)!r} has no {stem}.gz (or {stem}). It must hold the four "
        f"MNIST-format files: {', '.join(s + '.gz' for s in IDX_FILES.values())}."
    )


def validate_arrays(data: ImageClassificationData, source: str, image_shape=(28, 28), num_classes: int = 10) -> None:
    """Checks shapes, dtypes and label range; raises `DataError` naming the array."""
    for split in ("train", "test"):
        x, y = getattr(data, f"x_{split}"), getattr(data, f"y_{split}")
        if x.ndim != 3 or tuple(x.shape[1:]) != tuple(image_shape):
            raise DataError(
                f"{source}: x_{split} has shape {x.shape}; expected (N, {image_shape[0]}, {image_shape[1]}) images."
            )
        if y.ndim != 1 or y.shape[0] != x.shape[0]:
            raise DataError(
                f"{source}: y_{split} has shape {y.shape}; expected ({x.shape[0]},), one label per image."
            )
        if x.dtype != np.uint8:
            raise DataError(f"{source}: x_{split} has dtype {x.dtype}; expected uint8 pixels 0..255.")
        if y.size and (y.min() < 0 or y.max() >= num_classes):
            raise DataError(
                f"{source}: y_{split} holds labels {int(y.min())}..{int(y.max())}; expected 0..{num_classes - 1}."
            )


def load_mnist(path: Optional[Union[str, os.PathLike]] = None) -> ImageClassificationData:
    """Loads MNIST or any MNIST-format dataset (e.g. Fashion-MNIST).

    Args:
        path: a folder of the four `IDX_FILES` (`.gz` optional) or a `.npz` with `x_train`, `y_train`, `x_test`,
            `y_test` (as `keras.datasets.mnist`). Defaults to None (the bundled MNIST).

    Returns:
        `ImageClassificationData`: uint8 images `(N, 28, 28)`, uint8 labels 0..9.

    Raises:
        DataError: a missing path, a bundled file failing its sha256, a file not IDX/npz, or wrong shapes.
    """
    if path is None:
        digest = sha256_of(BUNDLED_MNIST)
        if digest != BUNDLED_MNIST_SHA256:
            raise DataError(
                f"The bundled MNIST file is corrupt (sha256 {digest[:12]}..., expected "
                f"{BUNDLED_MNIST_SHA256[:12]}...). Reinstall tftrain."
            )
        data = _load_npz(BUNDLED_MNIST)
        source = "bundled MNIST"
    else:
        p = Path(path).expanduser()
        if p.is_dir():
            data = ImageClassificationData(**{k: read_idx(_find_idx(p, stem)) for k, stem in IDX_FILES.items()})
        elif p.is_file() and p.suffix == ".npz":
            data = _load_npz(p)
        elif p.exists():
            raise DataError(
                f"Data path {str(path)!r} is neither a folder of MNIST-format IDX files nor a .npz file."
            )
        else:
            raise DataError(
                f"Data path {str(path)!r} does not exist. Pass --data-dir with a folder of "
                "MNIST-format IDX files or a Keras-layout .npz, or omit it for the bundled MNIST."
            )
        source = f"data at {str(path)!r}"
    validate_arrays(data, source)
    return data


def _load_npz(path: Path) -> ImageClassificationData:
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in IDX_FILES if k not in f.files]
            if missing:
                raise DataError(
                    f"{str(path)!r} lacks array(s) {', '.join(missing)}; expected x_train, y_train, x_test, y_test."
                )
            return ImageClassificationData(**{k: f[k] for k in IDX_FILES})
    except (OSError, ValueError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"Cannot read {str(path)!r} as a .npz file: {e}.") from None
