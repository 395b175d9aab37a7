"""`ArrayTask`: a task over in-memory NumPy arrays (or dicts of arrays for multi-input models)."""

from __future__ import annotations

from typing import Optional

from tftrain.errors import ConfigError
from tftrain.train.tasks.base import FunctionTask


def _slice(structure, start: int, stop: Optional[int]):
    """`array[start:stop]` for every array of a nested structure."""
    import tensorflow as tf

    return tf.nest.map_structure(lambda a: a[start:stop], structure)


def _arrays_of(name: str, given) -> tuple:
    """`(x, y)`, `(x, y, sample_weight)` or `(x,)` (y None: a model trained through `add_loss`, as `fit(x, None)`) of
    a `validation_data`-like tuple; `ConfigError` on another shape."""
    given = tuple(given)
    if len(given) not in (2, 3) or given[0] is None:
        raise ConfigError(f"{name} must be (x, y) or (x, y, sample_weight), with x given. Received {len(given)} "
                          "item(s).")
    return _parts(name, *given)


def _parts(name: str, x, y, sample_weight=None) -> tuple:
    """`(x, y[, sample_weight])`, or `(x,)` when `y` is None; `ConfigError` on sample weights without labels."""
    if y is None and sample_weight is not None:
        raise ConfigError(f"{name}: sample weights weigh labels, and y is None: pass y, or drop the sample weights.")
    return (x,) + ((y,) if y is not None else ()) + ((sample_weight,) if sample_weight is not None else ())


class ArrayTask(FunctionTask):
    """A task over in-memory NumPy arrays (or dicts of arrays for multi-input models).

    `--validation-split F` holds out the last F of the training examples, as Keras's `fit`, unless `validation_data`
    is given.

    Args:
        build_model: `() -> keras.Model` or `(hparams) -> keras.Model`, uncompiled.
        x: an array `(num_examples, ...)`, or a dict, list or tuple of them, one per input.
        y: labels: an array, or a dict / list / tuple per output; None for a model trained through `add_loss` only.
        x_test, y_test: test arrays, evaluated after training. Defaults to None.
        validation_data: `(x_val, y_val)` or `(x_val, y_val, sample_weight_val)`. Defaults to None
            (`--validation-split`).
        sample_weight: per-example weights of the training examples `(num_examples,)` (a dict / list per output
            for several), as `Model.fit(sample_weight=...)`; `--validation-split` holds out theirs too. Weighted
            metrics go in `weighted_metrics`. Defaults to None.
        test_sample_weight: the test examples' weights, as `Model.evaluate(sample_weight=...)`. Defaults to None.
        preprocess: `(features, labels) -> (features, labels)` on whole batches. Defaults to None.
        **task_args: `loss` (a Keras loss, name, object, or a dict per output; None, the default: the model's own), `metrics` (as
            `Model.compile`'s, plus metric classes and factories: `build_metrics`), `optimizer`, ...: see
            `FunctionTask`. `name` defaults to `"arrays"`.

    Raises:
        ConfigError: the arrays differ in length, or `sample_weight` comes with `class_weight` (as in Keras).

    Example:
        >>> task = tftrain.ArrayTask(build_model, x, y, x_test, y_test, loss="mse", optimizer="sgd")
        >>> record = tftrain.Trainer(task, epochs=3, validation_split=0.1).fit()
    """

    unused_fields = {"data.cache": "its arrays are in memory already"}
    sample_weight = None  # also for a subclass that sets its arrays in `bind`

    def __init__(self, build_model, x, y, x_test=None, y_test=None, *, validation_data=None, sample_weight=None,
                 test_sample_weight=None, preprocess=None, name="arrays", **task_args):
        super().__init__(build_model, name=name, **task_args)
        from tftrain.data.pipeline import num_examples_of

        num_examples_of(x, y, sample_weight)
        if test_sample_weight is not None and x_test is None:
            raise ConfigError("test_sample_weight weighs test examples, and no x_test is given: pass x_test and "
                              "y_test, or drop test_sample_weight.")
        for arrays in ((x_test, y_test, test_sample_weight), validation_data):
            if arrays is not None and arrays[0] is not None:
                num_examples_of(*arrays)
        weighted = sample_weight is not None or (validation_data is not None and len(validation_data) > 2
                                                 and validation_data[2] is not None)
        if weighted and self.class_weight is not None:
            raise ConfigError("ArrayTask takes class_weight or sample_weight, not both (as Model.fit): fold the "
                              "class weights into sample_weight.")
        self.x, self.y, self.preprocess = x, y, preprocess
        self.sample_weight = sample_weight
        _parts("ArrayTask", x, y, sample_weight)
        self.test = _parts("x_test", x_test, y_test, test_sample_weight) if x_test is not None else None
        self.validation = None if validation_data is None else _arrays_of("validation_data", validation_data)

    def _splits(self):
        """`(training arrays, validation arrays or None)`, each `(x, y)` or `(x, y, sample_weight)`."""
        from tftrain.data.pipeline import num_examples_of

        arrays = _parts("ArrayTask", self.x, self.y, self.sample_weight)
        n = num_examples_of(*arrays)
        if self._data.train_examples is not None:
            n = min(n, self._data.train_examples)
        if self.validation is not None or not self._data.validation_split:
            return _slice(arrays, 0, n), self.validation
        n_val = max(1, int(n * self._data.validation_split))
        if n_val >= n:
            raise ConfigError(
                f"validation_split={self._data.validation_split} of {n} examples leaves none to train on. "
                "Pass a smaller --validation-split."
            )
        return _slice(arrays, 0, n - n_val), _slice(arrays, n - n_val, n)

    @property
    def num_train_examples(self) -> int:
        from tftrain.data.pipeline import num_examples_of

        return num_examples_of(*self._splits()[0])

    @property
    def num_test_examples(self) -> Optional[int]:
        from tftrain.data.pipeline import num_examples_of

        return None if self.test is None else num_examples_of(*self.test)

    def bind(self, config):
        """A bound copy with its own, empty tensor memo."""
        bound = super().bind(config)
        bound._tensor_memo = {}
        return bound

    def _tensors(self, arrays):
        """`arrays` as tensors, each NumPy array converted (copied) once per bound task, eagerly only. Keyed by
        (address, shape, strides, dtype) and kept alive until `release`, so an address is not reused."""
        import numpy as np
        import tensorflow as tf

        memo = getattr(self, "_tensor_memo", None)
        if memo is None or not tf.executing_eagerly():  # unbound, or traced (a parameter-server dataset
            return arrays  # function): build_dataset converts them in that graph

        def convert(array):
            if not isinstance(array, np.ndarray):
                return array
            key = (array.__array_interface__["data"][0], array.shape, array.strides, array.dtype.str)
            if key not in memo:
                memo[key] = (array, tf.constant(array))
            return memo[key][1]

        return tf.nest.map_structure(convert, arrays)

    def release(self) -> None:
        """Drops the run's tensor copies of the arrays."""
        if getattr(self, "_tensor_memo", None):
            self._tensor_memo.clear()

    def _dataset(self, arrays, global_batch_size, training, input_context=None):
        from tftrain.data.pipeline import build_dataset

        return build_dataset(self._tensors(arrays), global_batch_size, training=training, config=self._data,
                             seed=self._seed, preprocess=self.preprocess, input_context=input_context)

    def train_data(self, global_batch_size, input_context=None):
        """Shuffled, batched training arrays (whole global batches only when sharded)."""
        arrays = self._splits()[0]
        if input_context is not None:  # every worker must run the same steps
            used = self.num_train_examples // global_batch_size * global_batch_size
            arrays = _slice(arrays, 0, used)
        return self._dataset(arrays, global_batch_size, True, input_context)

    def validation_data(self, global_batch_size):
        arrays = self._splits()[1]
        return None if arrays is None else self._dataset(arrays, global_batch_size, False)

    def test_data(self, global_batch_size):
        return None if self.test is None else self._dataset(self.test, global_batch_size, False)

    def label_arrays(self) -> tuple:
        """The training, validation and test labels; none under `preprocess`, which may change them."""
        if self.preprocess is not None:
            return ()
        train, val = self._splits()
        parts = (("training", train), ("validation", val), ("test", self.test))
        return tuple((what, arrays[1]) for what, arrays in parts if arrays is not None and len(arrays) > 1)

    def describe_data(self) -> list:
        from tftrain.data.pipeline import num_examples_of

        train, val = self._splits()
        parts = [f"{num_examples_of(*train):,} training" + (" (sample-weighted)" if len(train) > 2 else "")
                 + (" (no labels)" if len(train) == 1 else "")]
        if val is not None:
            how = "its own" if self.validation is not None else f"last {self._data.validation_split:g} held out"
            parts.append(f"{num_examples_of(*val):,} validation ({how})")
        if self.test is not None:
            parts.append(f"{num_examples_of(*self.test):,} test")
        return [f"data:      arrays: {', '.join(parts)} examples; pipeline: shuffled index batches gathered "
                "from memory" + (", prefetched" if self._data.prefetch else "")]
