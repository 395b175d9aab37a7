"""A thin adapter between tftrain and keras-tuner.

`make_tuner` builds a keras-tuner tuner (RandomSearch, Hyperband or
BayesianOptimization) whose output directory you choose (recipes use
`<run_dir>/tuning`) and hands it the tftrain strategy through keras-tuner's own
`distribution_strategy` argument: keras-tuner then builds every trial's model inside
`strategy.scope()` itself, so tftrain never opens a scope around it (nested scopes of
different strategies are an error in TensorFlow). keras-tuner distributes one
trial over the replicas of a single worker; it does not run a trial across several
workers, so multi-worker strategies are refused with a `TuningError`. keras-tuner
starts every trial from `keras.backend.clear_session()`.

`TrainingHyperModel` searches learning rate, batch size and either a width (a
model function `width -> keras.Model`) or any named choices (a model function
`{name: value} -> keras.Model`).

Source: https://keras.io/keras_tuner/api/tuners/
"""

from __future__ import annotations

import os
from typing import Callable, Mapping, Optional, Sequence, Tuple, Union

import keras
import keras_tuner as kt
import tensorflow as tf

from tftrain.errors import TuningError, check_int

ALGORITHMS = ("random", "hyperband", "bayesian")
"""Tuner names accepted by `make_tuner`."""


def check_strategy(strategy: Optional[tf.distribute.Strategy]) -> Optional[tf.distribute.Strategy]:
    """Validates a strategy for keras-tuner; returns what to pass as `distribution_strategy`.

    Args:
        strategy: the tftrain strategy, or None.

    Returns:
        None for no strategy or TensorFlow's default strategy (keras-tuner needs
        no scope then), else `strategy`.

    Raises:
        TuningError: for a multi-worker strategy (MultiWorkerMirrored,
            ParameterServer), or when called inside a `strategy.scope()`.
    """
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
        hypermodel: a `keras_tuner.HyperModel` (e.g. `TrainingHyperModel`).
        directory: where keras-tuner keeps trials and checkpoints (recipes pass
            `<run_dir>/tuning`). An existing search there is resumed, not
            overwritten, unless `overwrite=True`.
        algorithm: `"random"` (RandomSearch), `"hyperband"` or `"bayesian"`
            (BayesianOptimization). Defaults to "random".
        objective: metric to maximise or minimise (keras-tuner infers the
            direction from the name). Defaults to "val_accuracy".
        max_trials: most trials (for Hyperband a cap on its brackets' trials).
            Defaults to 10.
        strategy: the `tf.distribute.Strategy` to train each trial with; must be
            single-worker. Defaults to None.
        project_name: sub-folder of `directory`. Defaults to "tuner".
        seed: random seed of the search. Defaults to None.
        max_epochs: Hyperband's largest epoch budget per trial. Defaults to 10.
        overwrite: delete a previous search in the same folder. Defaults to
            False.
        **kwargs: passed to the keras-tuner class.

    Returns:
        The tuner; call `tuner.search(epochs=..., verbose=...)` outside any
        strategy scope.

    Raises:
        TuningError: on an unknown algorithm, a multi-worker strategy, or when
            called inside a strategy scope.

    Example:
        >>> tuner = make_tuner(TrainingHyperModel(mlp, make_ds, val_ds), directory="runs/x/tuning",
        ...                    max_trials=8, strategy=tf.distribute.MirroredStrategy())
        >>> tuner.search(epochs=2)
        >>> tuner.get_best_hyperparameters()[0].values
    """
    if algorithm not in ALGORITHMS:
        raise TuningError(
            f"Invalid tuner {algorithm!r}. Expected one of: {', '.join(ALGORITHMS)}. Received: tuner={algorithm!r}."
        )
    check_int(max_trials, "max_trials", error=TuningError)
    distribution = check_strategy(strategy)
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
    tuner.oracle.max_trials = max_trials  # Oracle stops creating trials at this count
    return tuner


class TrainingHyperModel(kt.HyperModel):
    """Searches learning rate, global batch size and the model's own choices.

    Args:
        model_fn: function `width -> keras.Model` (uncompiled); receives None
            when `widths` is None; with `choices`, a function
            `{name: value} -> keras.Model` instead. keras-tuner calls it inside
            the strategy scope.
        make_dataset: function `global_batch_size -> tf.data.Dataset` of training
            batches.
        validation_data: dataset (or arrays) for `fit(validation_data=...)`, which
            the `val_*` objective reads. Defaults to None.
        loss: Keras loss. Defaults to "sparse_categorical_crossentropy".
        metrics: metric names (strings, so each trial gets fresh metric
            objects). Defaults to ("accuracy",).
        learning_rate: `(low, high)` searched on a log scale, or one float.
            Defaults to (1e-4, 1e-2).
        widths: widths to choose from; None does not search width. Defaults to
            None.
        batch_sizes: global batch sizes to choose from; None uses
            `default_batch_size`. Defaults to None.
        default_batch_size: batch size when `batch_sizes` is None. Defaults to
            128.
        compile_options: extra `compile()` keyword arguments (e.g.
            `tftrain.runtime.compile_options("xla", 4)`). Defaults to None.
        choices: `{name: values}` searched besides learning rate and batch
            size (e.g. a task's `tune_space()`); `model_fn` then receives the
            chosen `{name: value}`. Defaults to None.
        compile_args: function `learning_rate -> dict` of `compile()` keyword
            arguments (optimizer, loss, metrics), replacing Adam with `loss` and
            `metrics`. Defaults to None.

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
        metrics: Sequence[str] = ("accuracy",),
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
        self.metrics = list(metrics)
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
            model = self.model_fn({k: hp.Choice(k, values) for k, values in self.choices.items()})
        else:
            model = self.model_fn(hp.Choice("width", self.widths) if self.widths else None)
        args = (self.compile_args(lr) if self.compile_args is not None else
                {"optimizer": keras.optimizers.Adam(lr), "loss": self.loss, "metrics": list(self.metrics)})
        model.compile(**args, **self.compile_options)
        return model

    def fit(self, hp, model, *args, **kwargs):
        """Trains one trial at its batch size; returns the `History`."""
        batch = hp.Choice("batch_size", self.batch_sizes) if self.batch_sizes else self.default_batch_size
        kwargs.setdefault("validation_data", self.validation_data)
        data = self.make_dataset(batch)
        if isinstance(data, tf.data.Dataset):
            kwargs.setdefault("shuffle", False)  # a dataset shuffles itself
        return model.fit(data, *args, **kwargs)
