"""`TFRecordTask`: a task over TFRecord files and the user's parse function."""

from __future__ import annotations

from typing import Optional

from tftrain.errors import ConfigError
from tftrain.train.tasks.files import FileSplitTask


class TFRecordTask(FileSplitTask):
    """A task over TFRecord files and the user's parse function; multi-worker input is sharded by record.

    Args:
        train_files: a list of TFRecord paths.
        parse_fn: one serialized record (a scalar string tensor) -> `(features, labels)`.
        validation_files, test_files: file lists. Default to None.
        num_train_examples: records in `train_files`, when known. Defaults to None.
        preprocess: batch map `(features, labels) -> (features, labels)`. Defaults to None.
        build_model, **task_args: `loss` (required), `optimizer`, ...: see `FunctionTask`. `name` defaults to
            `"tfrecord"`.

    Raises:
        ConfigError: `train_files` is empty or `loss` is missing.
    """

    def __init__(self, build_model, train_files, parse_fn, *, validation_files=None, test_files=None,
                 num_train_examples=None, preprocess=None, name="tfrecord", **task_args):
        super().__init__(build_model, name=name, **task_args)
        if not train_files or isinstance(train_files, str):
            raise ConfigError(f"train_files must be a non-empty list of TFRecord paths. Received: {train_files!r}.")
        self.files = {"train": list(train_files), "validation": validation_files, "test": test_files}
        self.parse_fn, self.preprocess, self._num_train_examples = parse_fn, preprocess, num_train_examples

    @property
    def num_train_examples(self) -> Optional[int]:
        """`num_train_examples`, capped by `--train-examples`."""
        n, cap = self._num_train_examples, self._data.train_examples
        return cap if n is None and cap is not None else n if cap is None else min(n, cap)

    def _dataset(self, split, global_batch_size, training, input_context=None, config=None):
        from tftrain.data.pipeline import build_dataset

        files = self.files[split]
        if not files:
            return None
        return build_dataset(list(files), global_batch_size, training=training, config=config or self._data,
                             seed=self._seed, preprocess=self.preprocess, parse_fn=self.parse_fn,
                             input_context=input_context,
                             max_examples=self._data.train_examples if split == "train" else None)

    def validation_data(self, global_batch_size):
        """Batches of `validation_files`; `--validation-split` is refused (records are not counted)."""
        if self._data.validation_split and not self.files["validation"]:
            raise ConfigError("TFRecordTask cannot hold out a fraction of its records: pass validation_files=[...] "
                              "instead of --validation-split.")
        return self._dataset("validation", global_batch_size, False)

    def describe_data(self) -> list:
        counts = ", ".join(f"{len(v)} {k}" for k, v in self.files.items() if v)
        return [f"data:      TFRecord files ({counts}); pipeline: parallel read and parse"
                + (", cache" if self._data.cache else "") + ", shuffle, batch"
                + (", prefetch" if self._data.prefetch else "")]
