"""Datasets and the tf.data input pipeline."""

from tftrain.data.datasets import BUNDLED_MNIST, ImageClassificationData, load_mnist, read_idx
from tftrain.data.pipeline import BatchSize, build_dataset, resolve_batch_size, scale_pixels

__all__ = [
    "BUNDLED_MNIST",
    "BatchSize",
    "ImageClassificationData",
    "build_dataset",
    "load_mnist",
    "read_idx",
    "resolve_batch_size",
    "scale_pixels",
]
