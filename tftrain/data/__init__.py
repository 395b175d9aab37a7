"""Datasets and the tf.data input pipeline.

`tftrain.data.datasets` needs only NumPy; `tftrain.data.pipeline` imports
TensorFlow. The names below are imported on first use, so loading data or checking
a data folder does not start TensorFlow.
"""

import importlib

_EXPORTS = {
    "BUNDLED_MNIST": "datasets",
    "ImageClassificationData": "datasets",
    "load_mnist": "datasets",
    "read_idx": "datasets",
    "BatchSize": "pipeline",
    "build_dataset": "pipeline",
    "integer_labels": "pipeline",
    "resolve_batch_size": "pipeline",
    "scale_pixels": "pipeline",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"tftrain.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'tftrain.data' has no attribute {name!r}")
