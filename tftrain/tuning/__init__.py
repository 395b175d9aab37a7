"""Batch-size search and the keras-tuner adapter.

`search_batch_size` is the algorithm (no TensorFlow); `find_batch_size` runs it
on a real model. Names are imported on first use, so keras-tuner is optional.
"""

from tftrain.tuning.search import SearchResult, Trial, search_batch_size

__all__ = [
    "BatchSizeFinder",
    "BatchSizeResult",
    "ModelState",
    "SearchResult",
    "TrainingHyperModel",
    "Trial",
    "find_batch_size",
    "make_tuner",
    "search_batch_size",
]

_LAZY = {
    "BatchSizeFinder": "tftrain.tuning.finder",
    "BatchSizeResult": "tftrain.tuning.batch_size",
    "ModelState": "tftrain.runtime.execution_probe",
    "find_batch_size": "tftrain.tuning.batch_size",
    "TrainingHyperModel": "tftrain.tuning.keras_tuner",
    "make_tuner": "tftrain.tuning.keras_tuner",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tftrain.tuning' has no attribute {name!r}")
