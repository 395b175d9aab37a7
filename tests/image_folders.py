"""Image folders for tests and benchmarks, written from the bundled MNIST.

`write_mnist_image_folder` lays digits out as Keras's image-folder convention
expects (`root/<digit>/<i>.<ext>`), encoded with TensorFlow's own PNG and JPEG
encoders (no extra dependency), alternating the formats file by file so both
decoders are exercised.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence, Union

ENCODERS = {"png": "encode_png", "jpg": "encode_jpeg", "jpeg": "encode_jpeg"}
"""File extension (lower case) -> `tf.io` encoder."""


def mnist_digits(per_class: int, split: str = "train", seed: int = 0):
    """`per_class` MNIST images of each digit 0..9, picked at random with `seed`.

    Args:
        per_class: images per digit, 1..5,421 (the rarest digit's count in the
            training split; 892 in the test split).
        split: `"train"` or `"test"`. Defaults to "train".
        seed: seed of the pick. Defaults to 0.

    Returns:
        `{digit: uint8 array (per_class, 28, 28)}`.

    Raises:
        ValueError: when `split` is not "train" or "test", or a digit has fewer
            than `per_class` images.
    """
    import numpy as np

    from tftrain.data.datasets import load_mnist

    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test'. Received: split={split!r}.")
    data = load_mnist(None)
    x, y = (data.x_train, data.y_train) if split == "train" else (data.x_test, data.y_test)
    rng = np.random.default_rng(seed)
    out = {}
    for digit in range(10):
        (indices,) = np.nonzero(y == digit)
        if len(indices) < per_class:
            raise ValueError(f"MNIST {split} has {len(indices)} images of digit {digit}; asked for {per_class}.")
        out[digit] = x[np.sort(rng.choice(indices, per_class, replace=False))]
    return out


def write_mnist_image_folder(
    root: Union[str, os.PathLike],
    per_class: int = 20,
    formats: Sequence[str] = ("png", "jpg"),
    split: str = "train",
    seed: int = 0,
) -> Path:
    """Writes MNIST digits as image files, one sub-folder per digit.

    File `i` of each digit is `root/<digit>/<i>.<formats[i % len(formats)]>`, a
    28 x 28 grayscale image, so with the default formats half the files of every
    class are PNG and half JPEG. An extension keeps its case (e.g. "PNG" writes
    `.PNG` files, to test case-insensitive listing).

    Args:
        root: the folder to write into (created; existing files are overwritten).
        per_class: images per digit. Defaults to 20.
        formats: file extensions to cycle through, each one of png, jpg, jpeg in
            any case. Defaults to ("png", "jpg").
        split: MNIST split the digits come from, "train" or "test". Defaults to
            "train".
        seed: seed of the pick of digits. Defaults to 0.

    Returns:
        `Path(root)`.

    Raises:
        ValueError: when a format has no TensorFlow encoder, or `mnist_digits`
            refuses `per_class` or `split`.

    Example:
        >>> folder = write_mnist_image_folder(tmp_path / "digits", per_class=4)
        >>> sorted(p.name for p in (folder / "0").iterdir())
        ['0.png', '1.jpg', '2.png', '3.jpg']
    """
    import tensorflow as tf

    unknown = [f for f in formats if f.lower() not in ENCODERS]
    if not formats or unknown:
        raise ValueError(f"formats must be some of {', '.join(ENCODERS)}. Received: formats={tuple(formats)!r}.")
    root = Path(root)
    for digit, images in mnist_digits(per_class, split, seed).items():
        folder = root / str(digit)
        folder.mkdir(parents=True, exist_ok=True)
        for i, image in enumerate(images):
            ext = formats[i % len(formats)]
            encode = getattr(tf.io, ENCODERS[ext.lower()])
            (folder / f"{i}.{ext}").write_bytes(encode(image[:, :, None]).numpy())
    return root
