"""`DatasetTask`: a task over the user's own `tf.data` pipelines."""

from __future__ import annotations

from typing import Optional

from tftrain.errors import ConfigError
from tftrain.train.tasks.base import FunctionTask, with_shard_policy


class DatasetTask(FunctionTask):
    """A task over the user's own `tf.data` pipelines, which tftrain only shards, batches, shuffles and prefetches.

    Args:
        build_model: `() -> keras.Model` or `(hparams) -> keras.Model`.
        train: with `batch`, `train()` returns unbatched `(features, labels)`; without, `train(batch_size)` returns
            batches of this pipeline's size (per replica under multi-worker training).
        validation, test: the same for validation and test data. Defaults to None.
        batch: batch the examples (training drops the remainder). Defaults to True.
        shard: shard across input pipelines in multi-worker runs. Defaults to True.
        prefetch: prefetch batches unless `--no-prefetch`. Defaults to True.
        shuffle: shuffle training examples each epoch (`--shuffle-buffer`, 0: 10,000) after `--validation-split`
            holds out `train()`'s last examples (a self-shuffling `train()` would leak them). Defaults to False.
        num_train_examples: for `--validation-split`, schedules, multi-process runs. Defaults to None (cardinality).
        **task_args: `loss` (required), `optimizer`, ...: see `FunctionTask`. `name` defaults to `"dataset"`.

    Raises:
        ConfigError: `loss` is missing or a function is not callable.

    Example:
        >>> task = tftrain.DatasetTask(build_model, lambda: tf.data.Dataset.from_tensor_slices((x, y)),
        ...                            loss="mse", shuffle=True)
    """

    unused_fields = {"data.cache": "its tf.data pipeline is the user's own (add .cache() there)"}

    def __init__(self, build_model, train, validation=None, test=None, *, batch=True, shard=True, prefetch=True,
                 shuffle=False, num_train_examples=None, name="dataset", **task_args):
        super().__init__(build_model, name=name, **task_args)
        for label, fn in (("train", train), ("validation", validation), ("test", test)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"{label} must be a function returning a tf.data.Dataset. Received: {fn!r}.")
        self.train_fn, self.validation_fn, self.test_fn = train, validation, test
        self.batch, self.shard, self.prefetch, self.shuffle = batch, shard, prefetch, shuffle
        self._num_train_examples = num_train_examples

    def _examples(self):
        import tensorflow as tf

        ds, n = self.train_fn(), self._known_count()
        if self._data.train_examples is not None:
            ds, n = ds.take(self._data.train_examples), min(n, self._data.train_examples) if n else None
        split = self._data.validation_split
        if not split or self.validation_fn is not None:
            return ds, None
        if n is None:
            raise ConfigError(
                "--validation-split needs unbatched examples of known count: pass num_train_examples=N and "
                "batch=True to DatasetTask, or give it validation=<function>."
            )
        n_val = max(1, int(n * split))
        return ds.take(n - n_val), ds.skip(n - n_val).apply(tf.data.experimental.assert_cardinality(n_val))

    def bind(self, config):
        if config.data.validation_split and self.validation_fn is None and not self.batch:
            raise ConfigError("--validation-split holds out examples; with batch=False DatasetTask gets batches. "
                              "Give DatasetTask validation=<function> instead.")
        return super().bind(config)

    def _known_count(self) -> Optional[int]:
        """`num_train_examples`, else the training dataset's cardinality if known."""
        if self._num_train_examples is not None:
            return self._num_train_examples
        if not self.batch:
            return None
        if not hasattr(self, "_cardinality"):
            count = int(self.train_fn().cardinality())
            self._cardinality = count if count >= 0 else None
        return self._cardinality

    @property
    def num_train_examples(self) -> Optional[int]:
        n = self._known_count()
        if n is None:
            return None
        if self._data.train_examples is not None:
            n = min(n, self._data.train_examples)
        if self._data.validation_split and self.validation_fn is None:
            n -= max(1, int(n * self._data.validation_split))
        return n

    def _finish(self, ds, global_batch_size, training, input_context=None, shard=None):
        """Shards, shuffles, batches and prefetches `ds` as asked (`shard` None: the task's)."""
        import tensorflow as tf

        per_pipeline = global_batch_size
        if input_context is not None:
            if self.shard if shard is None else shard:
                ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
            per_pipeline = input_context.get_per_replica_batch_size(global_batch_size)
        if training and self.shuffle:
            ds = ds.shuffle(self._data.shuffle_buffer or 10_000, seed=self._seed, reshuffle_each_iteration=True)
        ds = ds.batch(per_pipeline, drop_remainder=training)
        if self.prefetch and self._data.prefetch:
            ds = ds.prefetch(tf.data.AUTOTUNE)
        return with_shard_policy(ds, input_context, self._data.private_threads)

    def _batched(self, fn, global_batch_size, input_context=None):
        import tensorflow as tf

        size = input_context.get_per_replica_batch_size(global_batch_size) if input_context else global_batch_size
        ds = fn(size)
        if input_context is not None and self.shard:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        if self.prefetch and self._data.prefetch:
            ds = ds.prefetch(tf.data.AUTOTUNE)
        return with_shard_policy(ds, input_context, self._data.private_threads)

    def train_data(self, global_batch_size, input_context=None):
        if not self.batch:
            return self._batched(self.train_fn, global_batch_size, input_context)
        return self._finish(self._examples()[0], global_batch_size, True, input_context)

    def validation_data(self, global_batch_size):
        if self.validation_fn is not None:
            if not self.batch:
                return self._batched(self.validation_fn, global_batch_size)
            return self._finish(self.validation_fn(), global_batch_size, False)
        held_out = self._examples()[1] if self.batch else None
        return None if held_out is None else self._finish(held_out, global_batch_size, False)

    def test_data(self, global_batch_size):
        if self.test_fn is None:
            return None
        if not self.batch:
            return self._batched(self.test_fn, global_batch_size)
        return self._finish(self.test_fn(), global_batch_size, False)

    def describe_data(self) -> list:
        added = [name for name, on in (("shard (multi-worker)", self.shard), ("shuffle", self.shuffle and self.batch),
                                       ("batch", self.batch), ("prefetch", self.prefetch and self._data.prefetch))
                 if on]
        n = self.num_train_examples
        held_out = ""
        if self._data.validation_split and self.validation_fn is None and n is not None:
            held_out = f", {self._held_out_count():,} held out for validation (the last {self._data.validation_split:g})"
        return [f"data:      your tf.data pipeline ({f'{n:,}' if n else 'unknown number of'} training examples"
                f"{held_out}); tftrain adds: {', '.join(added) or 'nothing'}"] + self._batched_already()

    def _batched_already(self) -> list:
        """A warning line if `batch=True` but every leaf's first dimension is unknown (as after `batch`); else []."""
        if not self.batch:
            return []
        import tensorflow as tf

        spec = self.train_fn().element_spec
        shapes = [s.shape for s in tf.nest.flatten(spec) if hasattr(s, "shape")]
        if not shapes or any(not shape.rank or shape[0] is not None for shape in shapes):
            return []
        return [f"warning:   the training examples' first dimension is unknown ({shapes[0]}), as a batched "
                "dataset's is: DatasetTask(batch=True) batches them again (the count above is then of batches). "
                "If train() returns batches, pass batch=False and let it take the batch size: train(batch_size)."]

    def _held_out_count(self) -> int:
        n = self._known_count()
        if self._data.train_examples is not None:
            n = min(n, self._data.train_examples)
        return max(1, int(n * self._data.validation_split))
