"""A thin adapter to keras-tuner (https://keras.io/keras_tuner/api/tuners/). The strategy goes through its
`distribution_strategy`, so keras-tuner opens each trial's scope (never nested); multi-worker strategies are refused."""

from __future__ import annotations

import copy
import os
from typing import Callable, Mapping, Optional, Sequence, Tuple, Union

import keras
import keras_tuner as kt
import tensorflow as tf

from tftrain.data.pipeline import lists_as_tuples
from tftrain.errors import TuningError, check_int

ALGORITHMS = ("random", "hyperband", "bayesian")
"""Tuner names accepted by `make_tuner`."""


class StopSearch(keras.callbacks.Callback):
    """Ends the search at the next batch once `requested()` is true (a stop signal): raises keras-tuner's
    `FatalError`, which ends `search` where another error would only fail the trial; the trial stays unfinished,
    so a resumed search runs it again."""

    def __init__(self, requested: Callable[[], object]):
        super().__init__()
        self.requested = requested

    def _check(self, *args, **kwargs):
        if self.requested():
            raise kt.errors.FatalError("stopped by a signal")

    def __deepcopy__(self, memo):  # keras-tuner copies a trial's callbacks: the copy asks the same `requested`
        return StopSearch(self.requested)

    on_train_batch_end = on_test_batch_end = on_epoch_end = _check


def check_strategy(strategy: Optional[tf.distribute.Strategy]) -> Optional[tf.distribute.Strategy]:
    """The `distribution_strategy` to pass (None for the default); `TuningError` if multi-worker or in a scope."""
    if tf.distribute.has_strategy():
        raise TuningError(
            "Build and run the tuner outside strategy.scope(): keras-tuner opens the scope for each trial "
            "itself, and nested scopes fail. Pass the strategy as strategy=... instead."
        )
    if strategy is None:
        return None
    multi_worker = (tf.distribute.MultiWorkerMirroredStrategy, tf.distribute.experimental.ParameterServerStrategy)
    if isinstance(strategy, multi_worker):
        name = (
            "MultiWorkerMirroredStrategy" if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            else "ParameterServerStrategy"
        )
        raise TuningError(
            f"keras-tuner runs each trial on one worker; it cannot use {name}. "
            "Tune with a single-worker strategy (--strategy mirrored, one_device or default), "
            "then train the best configuration multi-worker."
        )
    if strategy is tf.distribute.get_strategy():  # the default strategy
        return None
    return strategy


def _choice(hp, name: str, values):
    """`hp.Choice(name, values)`, except that booleans stay booleans (keras-tuner's Choice gives 0 and 1)."""
    values = list(values)
    if values and all(isinstance(v, bool) for v in values):
        return hp.Boolean(name, default=values[0]) if len(set(values)) > 1 else hp.Fixed(name, values[0])
    return hp.Choice(name, values)


def make_tuner(
    hypermodel: kt.HyperModel,
    *,
    directory,
    algorithm: str = "random",
    objective: str = "val_accuracy",
    max_trials: int = 10,
    strategy: Optional[tf.distribute.Strategy] = None,
    project_name: str = "tuner",
    seed: Optional[int] = None,
    max_epochs: int = 10,
    overwrite: bool = False,
    **kwargs,
) -> kt.Tuner:
    """Builds a keras-tuner tuner that trains under the tftrain strategy.

    Args:
        directory: keras-tuner's trials; a search there is resumed unless `overwrite=True`.
        algorithm: `"random"`, `"hyperband"` or `"bayesian"`. Defaults to "random".
        objective: metric to optimise: a name (its direction as `--keep-best` reads it, so per output too:
            `val_<output>_accuracy` rises), or a `kt.Objective`. Defaults to "val_accuracy".
        strategy: a single-worker `tf.distribute.Strategy`. Defaults to None.
        max_epochs: Hyperband's largest epoch budget per trial. Defaults to 10.
        **kwargs: passed to the keras-tuner class.

    Returns:
        The tuner; call `tuner.search(...)` outside any strategy scope.

    Raises:
        TuningError: an unknown algorithm, a multi-worker strategy, or called inside a strategy scope.

    Example:
        >>> tuner = make_tuner(TrainingHyperModel(mlp, make_ds, val_ds), directory="runs/x/tuning",
        ...                    max_trials=8, strategy=tf.distribute.MirroredStrategy())
        >>> tuner.search(epochs=2)
    """
    if algorithm not in ALGORITHMS:
        raise TuningError(
            f"Invalid tuner {algorithm!r}. Expected one of: {', '.join(ALGORITHMS)}. Received: tuner={algorithm!r}."
        )
    check_int(max_trials, "max_trials", error=TuningError)
    distribution = check_strategy(strategy)
    if isinstance(objective, str):
        from tftrain.callbacks.keep_best import monitor_direction

        direction = monitor_direction(objective)
        objective = kt.Objective(objective, direction) if direction else objective
    common = dict(
        objective=objective,
        seed=seed,
        directory=os.fspath(directory),
        project_name=project_name,
        overwrite=overwrite,
        distribution_strategy=distribution,
        **kwargs,
    )
    if algorithm == "random":
        return kt.RandomSearch(hypermodel, max_trials=max_trials, **common)
    if algorithm == "bayesian":
        try:
            return kt.BayesianOptimization(hypermodel, max_trials=max_trials, **common)
        except ImportError:
            raise TuningError(
                "The bayesian tuner needs scipy and scikit-learn. Run `pip install keras-tuner[bayesian]` "
                "(or `pip install tftrain[bayesian]`), or use --tuner random."
            ) from None
    tuner = kt.Hyperband(hypermodel, max_epochs=max_epochs, **common)
    tuner.oracle.max_trials = max_trials
    return tuner


class TrainingHyperModel(kt.HyperModel):
    """Searches learning rate, global batch size and the model's own choices.

    Args:
        model_fn: `width -> keras.Model` (uncompiled; width None without `widths`), or `{name: value} -> keras.Model`
            with `choices`.
        make_dataset: `global_batch_size -> tf.data.Dataset` of training batches.
        validation_data: dataset, arrays, or `global_batch_size -> tf.data.Dataset`; its first batch is cut to split
            evenly over the replicas. Defaults to None.
        metrics: as `compile()`'s: metric names (strings: fresh objects each trial), or a dict or list of them per
            output. Defaults to ("accuracy",).
        learning_rate: `(low, high)` searched on a log scale, or one float. Defaults to (1e-4, 1e-2).
        widths: widths to choose from. Defaults to None (not searched).
        batch_sizes: global batch sizes to choose from. Defaults to None (`default_batch_size`, 128).
        choices: `{name: values}` searched besides learning rate and batch size. Defaults to None.
        compile_args: `learning_rate -> dict` of `compile()` arguments replacing Adam, `loss`, `metrics`. Default None.

    Example:
        >>> hm = TrainingHyperModel(lambda w: mlp(width=w), make_ds, val_ds,
        ...                         widths=(128, 256, 512), batch_sizes=(64, 128, 256))
    """

    def __init__(
        self,
        model_fn: Callable[[Optional[int]], keras.Model],
        make_dataset: Callable[[int], "tf.data.Dataset"],
        validation_data=None,
        *,
        loss="sparse_categorical_crossentropy",
        metrics: Union[Sequence, Mapping] = ("accuracy",),
        learning_rate: Union[float, Tuple[float, float]] = (1e-4, 1e-2),
        widths: Optional[Sequence[int]] = None,
        batch_sizes: Optional[Sequence[int]] = None,
        default_batch_size: int = 128,
        compile_options: Optional[dict] = None,
        name: Optional[str] = None,
        choices: Optional[Mapping[str, Sequence]] = None,
        compile_args: Optional[Callable[[float], dict]] = None,
    ):
        super().__init__(name=name)
        if isinstance(learning_rate, (tuple, list)):
            low, high = learning_rate
            if not 0 < low < high:
                raise TuningError(
                    f"learning_rate range must satisfy 0 < low < high. Received: learning_rate={learning_rate!r}."
                )
        elif not learning_rate > 0:
            raise TuningError(f"learning_rate must be positive. Received: learning_rate={learning_rate!r}.")
        for label, values in (("widths", widths), ("batch_sizes", batch_sizes)):
            if values is not None and (not values or any(int(v) != v or v < 1 for v in values)):
                raise TuningError(f"{label} must be positive integers. Received: {label}={values!r}.")
        self.model_fn = model_fn
        self.make_dataset = make_dataset
        self.validation_data = validation_data
        self.loss = loss
        self.metrics = dict(metrics) if isinstance(metrics, Mapping) else list(metrics)
        self.learning_rate = learning_rate
        self.widths = None if widths is None else [int(w) for w in widths]
        self.batch_sizes = None if batch_sizes is None else [int(b) for b in batch_sizes]
        self.default_batch_size = default_batch_size
        self.compile_options = dict(compile_options or {})
        self.choices = None if choices is None else {k: list(v) for k, v in choices.items()}
        self.compile_args = compile_args

    def build(self, hp):
        """Builds and compiles one trial's model."""
        if isinstance(self.learning_rate, (tuple, list)):
            lr = hp.Float("learning_rate", self.learning_rate[0], self.learning_rate[1], sampling="log")
        else:
            lr = hp.Fixed("learning_rate", float(self.learning_rate))
        if self.choices is not None:
            model = self.model_fn({k: _choice(hp, k, values) for k, values in self.choices.items()})
        else:
            model = self.model_fn(hp.Choice("width", self.widths) if self.widths else None)
        args = (self.compile_args(lr) if self.compile_args is not None else
                {"optimizer": keras.optimizers.Adam(lr), "loss": self.loss, "metrics": copy.deepcopy(self.metrics)})
        model.compile(**{**self.compile_options, **args})  # what compile_args sets itself wins
        return model

    def fit(self, hp, model, *args, **kwargs):
        """Trains one trial at its batch size and validates at the same size."""
        batch = hp.Choice("batch_size", self.batch_sizes) if self.batch_sizes else self.default_batch_size
        validation = kwargs.get("validation_data", self.validation_data)
        if callable(validation):
            validation = validation(batch)
        kwargs["validation_data"] = evenly_first(validation, batch, model.distribute_strategy.num_replicas_in_sync)
        data = self.make_dataset(batch)
        if isinstance(data, tf.data.Dataset):
            kwargs.setdefault("shuffle", False)  # a dataset shuffles itself
        return model.fit(data, *args, **kwargs)


def evenly_first(validation, batch_size: int, num_replicas: int):
    """`validation_data` (arrays batched) with a first batch that splits evenly over the replicas."""
    if num_replicas <= 1 or validation is None or isinstance(validation, tf.distribute.DistributedDataset):
        return validation
    if not isinstance(validation, tf.data.Dataset):
        validation = tf.data.Dataset.from_tensor_slices(lists_as_tuples(tuple(validation))).batch(batch_size)
    if not tf.executing_eagerly():
        return even_first_batch(validation, num_replicas)
    first = next(iter(validation.take(1)), None)
    if first is None or _rows(first) % num_replicas == 0:
        return validation
    batches = int(validation.cardinality())  # one more now: the first batch's rest; known, Keras ends an epoch
    cut = even_first_batch(validation, num_replicas)  # without warning that the input "ran out of data"
    return cut.apply(tf.data.experimental.assert_cardinality(batches + 1)) if batches >= 0 else cut


def _rows(batch):
    """A batch's batch dimension (int64 tensor)."""
    return tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]


def even_first_batch(dataset: "tf.data.Dataset", num_replicas: int) -> "tf.data.Dataset":
    """`dataset` with its first batch cut into its largest part divisible by `num_replicas` (maybe empty) and the
    rest; cardinality becomes unknown. Keras 3 under a strategy fails on an uneven first batch ("Inputs to operation
    AddN ... must have the same size"); later batches may be uneven.

    Example:
        >>> ds = tf.data.Dataset.range(5).batch(8)   # one batch of 5
        >>> [len(b) for b in even_first_batch(ds, 2)]
        [4, 1]
    """
    check_int(num_replicas, "num_replicas", error=TuningError)
    leaves = tf.nest.flatten(dataset.element_spec)
    static = leaves[0].shape[0] if leaves and leaves[0].shape.rank else None
    if num_replicas == 1 or (static is not None and static % num_replicas == 0):
        return dataset

    def cut(index, batch):
        size = _rows(batch)
        at = tf.where(index == 0, size // num_replicas * num_replicas, size)
        head = tf.nest.map_structure(lambda t: t[:at], batch)
        tail = tf.nest.map_structure(lambda t: t[at:], batch)
        parts = tf.data.Dataset.from_tensors(head).concatenate(tf.data.Dataset.from_tensors(tail)).enumerate()
        # The head always (an empty first head still splits evenly); the tail when it has rows.
        return parts.filter(lambda i, part: (i == 0) | (_rows(part) > 0)).map(lambda i, part: part)

    return dataset.enumerate().flat_map(cut)
