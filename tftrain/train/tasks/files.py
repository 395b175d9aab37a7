"""The base of the file tasks (`TFRecordTask`, `ImageFolderTask`)."""

from __future__ import annotations

import dataclasses

from tftrain.train.tasks.base import FunctionTask


class FileSplitTask(FunctionTask):
    """A task whose splits are files read by `_dataset`, which returns None for a split without files."""

    def _dataset(self, split, global_batch_size, training, input_context=None, config=None):
        raise NotImplementedError

    def train_data(self, global_batch_size, input_context=None):
        return self._dataset("train", global_batch_size, True, input_context)

    def validation_data(self, global_batch_size):
        return self._dataset("validation", global_batch_size, False)

    def test_data(self, global_batch_size):
        return self._dataset("test", global_batch_size, False)

    def probe_data(self, global_batch_size, num_batches):
        """The first training batches, without the cache (a partly read one makes tf.data warn)."""
        config = dataclasses.replace(self._data, cache=False)
        return self._dataset("train", global_batch_size, True, config=config).take(num_batches)
