"""`ArrayTask`: a task over in-memory NumPy arrays (or dicts of arrays for multi-input models)."""

from __future__ import annotations

from typing import Optional

from tftrain.errors import ConfigError
from tftrain.train.tasks.base import FunctionTask


def _slice(structure, start: int, stop: Optional[int]):
    """`array[start:stop]` for every array of a nested structure (dicts, tuples)."""
    import tensorflow as tf

    return tf.nest.map_structure(lambda a: a[start:stop], structure)


class ArrayTask(FunctionTask):
    """A task over in-memory NumPy arrays (or dicts of arrays for multi-input models).

    The pipeline is `tftrain.data.build_dataset`: shuffled example indices,
    batched, gathered from the arrays in one vectorised op, optionally mapped by
    `preprocess`, prefetched; sharded by `InputContext` in multi-worker runs.
    `--train-examples N` keeps the first N training examples, then
    `--validation-split F` holds out the last F of them (as Keras's
    `fit(validation_split=...)`), unless `validation_data` is given.

    Args:
        build_model: function `() -> keras.Model` (or `(hparams) -> keras.Model`),
            uncompiled; called inside the strategy's scope.
        x: training features: an array `(num_examples, ...)`, or a dict, list or
            tuple of such arrays (one per model input; a list travels as a tuple,
            which Keras feeds to the inputs alike).
        y: training labels (or targets): an array, or a dict / list / tuple per output.
        x_test, y_test: test arrays, evaluated once after training. Defaults
            to None (no test evaluation).
        validation_data: `(x_val, y_val)`, the task's own validation set.
            Defaults to None (use `--validation-split`).
        loss: a Keras loss (name, object, or a dict per output). Required.
        optimizer: see `Task.optimizer`. Defaults to `"adam"`.
        metrics: Keras metrics for `compile`: names, metric objects, functions
            `(y_true, y_pred)`, or a dict of these per output. An item may also
            be a `keras.metrics.Metric` class (`keras.metrics.MeanAbsoluteError`)
            or a function of no arguments returning a metric
            (`functools.partial(keras.metrics.AUC, curve="PR")`): these are
            built by `compile_args`, inside the strategy's scope, so the task
            file does not start TensorFlow when imported (a metric object built
            at module level does, and `--cpu-replicas` then cannot split the
            CPU). Defaults to None.
        preprocess: function `(features, labels) -> (features, labels)` on whole
            batches, run in the pipeline. Defaults to None.
        learning_rate, name, hparams, default_batch_size, defaults, class_weight, loss_weights: see `Task`.
            `name` defaults to `"arrays"`.

    Raises:
        ConfigError: when the arrays differ in length or `loss` is missing.

    Example:
        >>> task = tftrain.ArrayTask(build_model, x, y, x_test, y_test, loss="mse", optimizer="sgd")
        >>> record = tftrain.Trainer(task, epochs=3, validation_split=0.1).fit()
    """

    unused_fields = {"data.cache": "its arrays are in memory already"}

    def __init__(self, build_model, x, y, x_test=None, y_test=None, *, validation_data=None, loss, optimizer="adam",
                 metrics=None, preprocess=None, learning_rate=None, name="arrays", hparams=None,
                 default_batch_size=None, defaults=None, class_weight=None,
                 loss_weights=None):
        super().__init__(build_model, loss=loss, optimizer=optimizer, metrics=metrics, learning_rate=learning_rate,
                         name=name, hparams=hparams, default_batch_size=default_batch_size, defaults=defaults,
                         class_weight=class_weight, loss_weights=loss_weights)
        from tftrain.data.pipeline import num_examples_of

        num_examples_of(x, y)
        for pair in ((x_test, y_test), validation_data):
            if pair is not None and pair[0] is not None:
                num_examples_of(*pair)
        self.x, self.y, self.preprocess = x, y, preprocess
        self.test = (x_test, y_test) if x_test is not None else None
        self.validation = tuple(validation_data) if validation_data is not None else None

    def _splits(self):
        """`((x, y) for training, (x, y) for validation or None)` under the bound config."""
        from tftrain.data.pipeline import num_examples_of

        n = num_examples_of(self.x, self.y)
        if self._data.train_examples is not None:
            n = min(n, self._data.train_examples)
        if self.validation is not None or not self._data.validation_split:
            return (_slice(self.x, 0, n), _slice(self.y, 0, n)), self.validation
        n_val = max(1, int(n * self._data.validation_split))
        if n_val >= n:
            raise ConfigError(
                f"validation_split={self._data.validation_split} of {n} examples leaves none to train on. "
                "Pass a smaller --validation-split."
            )
        train = (_slice(self.x, 0, n - n_val), _slice(self.y, 0, n - n_val))
        return train, (_slice(self.x, n - n_val, n), _slice(self.y, n - n_val, n))

    @property
    def num_train_examples(self) -> int:
        """Training examples after `--train-examples` and the validation split."""
        from tftrain.data.pipeline import num_examples_of

        return num_examples_of(*self._splits()[0])

    @property
    def num_test_examples(self) -> Optional[int]:
        """Test examples, or None without test arrays."""
        from tftrain.data.pipeline import num_examples_of

        return None if self.test is None else num_examples_of(*self.test)

    def bind(self, config):
        """A bound copy (`Task.bind`) with its own, empty memo of the arrays as tensors (`_tensors`)."""
        bound = super().bind(config)
        bound._tensor_memo = {}
        return bound

    def _tensors(self, arrays):
        """`arrays` as TensorFlow tensors, each array converted once per bound task.

        A run builds the training pipeline several times (the probe batches of `--precision auto` and
        `--execution auto`, then training), and `tf.constant` copies the array every time: measured on
        MNIST's 60,000 x 784 float32 training images (188 MB) on 2 cores, 0.1-0.8 s a copy, and the
        first batch of a pipeline over a new copy 0.4-0.7 s later, against 0.04 s over the same tensor.
        A NumPy array is known by its memory (address, shape, strides, dtype): a view such as `x[:n]`
        is its own entry. The memo keeps the array alive, so an address is not reused, until the run
        ends (`release`). Other leaves (tensors, pandas columns) pass through, converted by
        `build_dataset` as before. Eagerly only: a tensor of one graph is not another's."""
        import numpy as np
        import tensorflow as tf

        memo = getattr(self, "_tensor_memo", None)
        if memo is None or not tf.executing_eagerly():  # unbound, or traced (a parameter-server worker's
            return arrays  # dataset function): build_dataset converts them in that graph

        def convert(array):
            if not isinstance(array, np.ndarray):
                return array
            key = (array.__array_interface__["data"][0], array.shape, array.strides, array.dtype.str)
            if key not in memo:
                memo[key] = (array, tf.constant(array))
            return memo[key][1]

        return tf.nest.map_structure(convert, arrays)

    def release(self) -> None:
        """Drops the run's tensor copies of the arrays (`_tensors`)."""
        if getattr(self, "_tensor_memo", None):
            self._tensor_memo.clear()

    def _dataset(self, arrays, global_batch_size, training, input_context=None):
        from tftrain.data.pipeline import build_dataset

        return build_dataset(self._tensors(arrays), global_batch_size, training=training, config=self._data,
                             seed=self._seed, preprocess=self.preprocess, input_context=input_context)

    def train_data(self, global_batch_size, input_context=None):
        """Shuffled, batched training arrays (whole global batches only when sharded)."""
        arrays = self._splits()[0]
        if input_context is not None:  # every worker must run the same number of steps
            used = self.num_train_examples // global_batch_size * global_batch_size
            arrays = (_slice(arrays[0], 0, used), _slice(arrays[1], 0, used))
        return self._dataset(arrays, global_batch_size, True, input_context)

    def validation_data(self, global_batch_size):
        """The validation arrays in order, batched; None when there are none."""
        arrays = self._splits()[1]
        return None if arrays is None else self._dataset(arrays, global_batch_size, False)

    def test_data(self, global_batch_size):
        """The test arrays in order, batched; None when there are none."""
        return None if self.test is None else self._dataset(self.test, global_batch_size, False)

    def describe_data(self) -> list:
        """The split sizes and the pipeline."""
        from tftrain.data.pipeline import num_examples_of

        train, val = self._splits()
        parts = [f"{num_examples_of(*train):,} training"]
        if val is not None:
            how = "its own" if self.validation is not None else f"last {self._data.validation_split:g} held out"
            parts.append(f"{num_examples_of(*val):,} validation ({how})")
        if self.test is not None:
            parts.append(f"{num_examples_of(*self.test):,} test")
        return [f"data:      arrays: {', '.join(parts)} examples; pipeline: shuffled index batches gathered "
                "from memory" + (", prefetched" if self._data.prefetch else "")]
