"""Datasets and the tf.data input pipelines. Names load on first use, so `datasets` and
`image_folder.list_image_files` do not start TensorFlow; `pipeline` does."""

import importlib

_EXPORTS = {
    "BUNDLED_MNIST": "datasets",
    "ImageClassificationData": "datasets",
    "load_mnist": "datasets",
    "read_idx": "datasets",
    "IMAGE_EXTENSIONS": "image_folder",
    "ImageFiles": "image_folder",
    "image_folder_dataset": "image_folder",
    "list_image_files": "image_folder",
    "random_flip_and_translate": "image_folder",
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
