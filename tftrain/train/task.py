"""What a user supplies: a `Task` (model, compile arguments, data), and adapters.

A task says how to build the model (called inside the strategy's scope), how to
compile it, and how to read its training / validation / test data given the
global batch size (and, for multi-worker training, a `tf.distribute.InputContext`).
Everything else (runtime, run directory, batch plan, execution mode, callbacks,
the training loop, reports) is the `Trainer`'s. The shape follows TF Model
Garden's `official/core/base_task.py` (`build_model`, `build_inputs(params,
input_context)`), in Keras terms.

Adapters cover the common cases in a few lines:

* `ArrayTask`: NumPy arrays, or dicts of arrays for multi-input models;
* `DatasetTask`: functions returning the user's own `tf.data.Dataset`;
* `TFRecordTask`: TFRecord files and the user's parse function;
* `ImageFolderTask`: a folder of images with one sub-folder per class.

Before calling any method, the `Trainer` binds the task to the run's config
(`Task.bind`): a shallow copy whose `config` is the run's `RecipeConfig` and
whose `hparams` holds the values of the task's own hyperparameters.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from typing import Any, Callable, Mapping, Optional, Sequence

from tftrain import config as config_lib
from tftrain.errors import ConfigError


class Task:
    """Base class of a training task: override what differs.

    Class attributes a subclass may set:
        name: short name, used in run directory names (`runs/<name>-<time>`)
            and reports. Defaults to `"task"`.
        hparams: the task's own hyperparameters, a frozen dataclass instance
            whose fields are declared with `tftrain.hparam`; each field becomes
            a flag of `python -m tftrain.run` and a key of the recipe file's
            `task:` section. Defaults to None (none).
        loss, metrics: what `compile_args` passes to `Model.compile` (any Keras
            loss and metrics: names, objects, dicts per output). `metrics` may
            also hold `keras.metrics.Metric` classes and functions of no
            arguments that return a metric: `compile_args` builds them (see
            `build_metrics`). Defaults to None.
        optimizer: a Keras optimizer name (`"adam"`, `"sgd"`, ...), an
            optimizer instance (cloned for each compile), or a function
            `(learning_rate) -> Optimizer` (called without arguments when no
            learning rate is set). Defaults to `"adam"`.
        learning_rate: the task's default learning rate; `--learning-rate`
            overrides it; None keeps the optimizer's own default. Defaults to
            None.
        example_unit: what one example is called in printed figures
            (`"images"` gives images/sec). Defaults to `"examples"`.
        default_batch_size: global batch size when the config gives neither
            `batch_size` nor `per_replica_batch_size`; None means 128 per
            replica. Defaults to None.
        defaults: flat config overrides the task brings (e.g.
            `{"epochs": 5, "steps_per_execution": 8}`), applied under the
            recipe file and the flags. Defaults to {}.
        unused_fields: flat config keys the task's data ignores (e.g.
            `{"data.cache": "its arrays are in memory already"}`) -> why; their
            flags are left out of its command line, and a recipe file that sets
            one is refused. Defaults to {}.

    Set by `bind` (read them in the methods):
        config: the run's `RecipeConfig`.

    Example:
        >>> class Regression(tftrain.Task):
        ...     name, loss, optimizer = "regression", "mse", "sgd"
        ...     num_train_examples = 4096
        ...     def build_model(self):
        ...         return keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        ...     def train_data(self, global_batch_size, input_context=None):
        ...         return make_dataset(global_batch_size, input_context)
    """

    name: str = "task"
    hparams: Any = None
    loss: Any = None
    metrics: Any = None
    optimizer: Any = "adam"
    learning_rate: Optional[float] = None
    default_batch_size: Optional[int] = None
    example_unit: str = "examples"
    defaults: Mapping[str, Any] = {}
    unused_fields: Mapping[str, str] = {}
    config: Optional[config_lib.RecipeConfig] = None

    # -- what the Trainer calls ------------------------------------------------
    def check_unused_fields(self, config: config_lib.RecipeConfig) -> None:
        """Refuses a value other than tftrain's default for a field in `unused_fields`.

        Raises:
            ConfigError: naming the field, why this task ignores it, and the fix.
        """
        given, default = config.to_dict(), config_lib.RecipeConfig().to_dict()
        for key, why in self.unused_fields.items():
            section, name = key.split(".")
            if given[section][name] != default[section][name]:
                raise ConfigError(f"{key} (--{name.replace('_', '-')}) does nothing for task {self.name!r}: {why}. "
                                  "Remove it.")

    def default_config(self) -> config_lib.RecipeConfig:
        """The task's default `RecipeConfig`: tftrain's defaults, then `defaults`, with `hparams`."""
        return config_lib.RecipeConfig(task=self.hparams).override(dict(self.defaults))

    def bind(self, config: config_lib.RecipeConfig) -> "Task":
        """Returns a shallow copy of this task bound to `config` (its `hparams` from `config.task`).

        The Trainer binds before TensorFlow starts: an override may read files and
        check them, but must build no dataset and run no TensorFlow op.

        Raises:
            ConfigError: when `config.task` is not the task's hyperparameter type.
        """
        if self.hparams is not None and not isinstance(config.task, type(self.hparams)):
            raise ConfigError(
                f"The config's task hyperparameters must be a {type(self.hparams).__name__}; "
                f"received {type(config.task).__name__}. Build the config with task.default_config()."
            )
        bound = copy.copy(self)
        bound.config = config
        bound.hparams = config.task
        return bound

    def build_model(self):
        """Returns a new, uncompiled `keras.Model`; called inside `strategy.scope()`."""
        raise NotImplementedError(f"{type(self).__name__} must define build_model(self) -> keras.Model.")

    def compile_args(self, steps_per_epoch: Optional[int]) -> dict:
        """Keyword arguments for `Model.compile`: `optimizer`, `loss`, `metrics`.

        Args:
            steps_per_epoch: optimizer steps per epoch, or None when unknown
                (a learning-rate schedule then stays constant).

        Returns:
            A dict; the Trainer adds the runtime's compile options
            (`steps_per_execution`, `jit_compile`, `run_eagerly`). Its metrics
            are `build_metrics(self.metrics)`: the Trainer calls this inside the
            strategy's scope, where the metrics' variables belong.
        """
        return {"optimizer": self.make_optimizer(steps_per_epoch), "loss": self.loss,
                "metrics": build_metrics(self.metrics)}

    def make_optimizer(self, steps_per_epoch: Optional[int]):
        """A fresh optimizer from `optimizer`, at `run_learning_rate(steps_per_epoch)`.

        Raises:
            ConfigError: when `optimizer` is not a known name, instance or function.
        """
        return self._optimizer_from_spec(self.run_learning_rate(steps_per_epoch))

    def _optimizer_from_spec(self, rate):
        import keras

        spec = self.optimizer
        if isinstance(spec, keras.optimizers.Optimizer):
            config = spec.get_config()
            if rate is not None:
                config["learning_rate"] = rate
            return type(spec).from_config(config)
        if isinstance(spec, str):
            try:
                cls = type(keras.optimizers.get(spec))
            except ValueError:
                raise ConfigError(
                    f"Unknown optimizer {spec!r}. Expected a Keras optimizer name (adam, sgd, rmsprop, adamw, ...), "
                    "an optimizer instance or a function (learning_rate) -> optimizer."
                ) from None
            return cls() if rate is None else cls(learning_rate=rate)
        if callable(spec):
            return spec() if rate is None else spec(rate)
        raise ConfigError(f"optimizer must be a name, an optimizer or a function. Received: {spec!r}.")

    def run_learning_rate(self, steps_per_epoch: Optional[int]):
        """The run's learning rate: `--learning-rate`, else the task's; under `--lr-schedule
        cosine` (and known steps) a `keras.optimizers.schedules.CosineDecay` from it (or from
        the optimizer's default rate) to 0 over the run's optimizer steps; None when nothing
        sets a rate and the schedule is constant."""
        import keras

        train = self.config.train if self.config is not None else config_lib.TrainConfig()
        rate = train.learning_rate if train.learning_rate is not None else self.learning_rate
        if train.lr_schedule != "cosine" or not steps_per_epoch:
            return rate
        if rate is None:  # the schedule decays from the optimizer's own default rate
            rate = float(keras.ops.convert_to_numpy(self._optimizer_from_spec(None).learning_rate))
        return keras.optimizers.schedules.CosineDecay(rate, decay_steps=train.epochs * steps_per_epoch)

    def train_data(self, global_batch_size: int, input_context=None):
        """The training batches, an epoch's worth (the Trainer iterates it once per epoch).

        Args:
            global_batch_size: examples per optimizer step, all replicas together.
            input_context: a `tf.distribute.InputContext` in multi-worker runs:
                shard by `input_context.input_pipeline_id` and batch by
                `input_context.get_per_replica_batch_size(global_batch_size)`.
                Defaults to None (one input pipeline, global batches).

        Returns:
            A `tf.data.Dataset` of `(features, labels)` batches (drop the last
            partial batch so every step has the same shape).
        """
        raise NotImplementedError(f"{type(self).__name__} must define train_data(self, global_batch_size, input_context=None).")

    def validation_data(self, global_batch_size: int):
        """Validation batches for `fit`'s `val_*` metrics and model selection, or None (default)."""
        return None

    def test_data(self, global_batch_size: int):
        """Test batches evaluated once after training, or None (default)."""
        return None

    @property
    def num_train_examples(self) -> Optional[int]:
        """Training examples per epoch (for steps per epoch and schedules), or None if unknown."""
        return None

    @property
    def num_test_examples(self) -> Optional[int]:
        """Test examples, or None if unknown (recorded in metrics.json)."""
        return None

    def probe_data(self, global_batch_size: int, num_batches: int):
        """The first `num_batches` training batches, for timing (`--execution auto`).

        Defaults to `train_data(global_batch_size).take(num_batches)`; a task
        whose pipeline caches should override it to skip the cache (tf.data warns
        about a partly read cache).
        """
        return self.train_data(global_batch_size).take(num_batches)

    def input_bound_hint(self) -> str:
        """What to try when training waits for this task's input, printed under the
        input verdict; "" for none (default)."""
        return ""

    def tune_space(self) -> Mapping[str, Sequence]:
        """Task hyperparameters `--tune` chooses from, `{name: values}`. Defaults to {}.

        Only hyperparameters of the model: every trial reads the run's data (a
        knob that changes the data, such as an image size, does not belong here).
        """
        return {}

    def describe_data(self) -> list:
        """Lines saying where the data comes from and what tftrain does to it. Defaults to []."""
        return []


def _call_builder(build_model: Callable, hparams):
    """`build_model(hparams)` when the function requires an argument, or takes one and the task has
    hyperparameters; else `build_model()` (so `def build(width=32)` keeps its own default)."""
    try:
        params = [p for p in inspect.signature(build_model).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    except (TypeError, ValueError):
        params = []
    required = any(p.default is p.empty and p.kind != p.VAR_POSITIONAL for p in params)
    return build_model(hparams) if required or (params and hparams is not None) else build_model()


def _parameters(fn) -> Optional[list]:
    """`fn`'s parameters, or None when it has no signature (some built-ins)."""
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None


def _required(params: list) -> list:
    """Names of the parameters without a default (`*args` and `**kwargs` are never required)."""
    return [p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _is_metric_factory(fn) -> bool:
    """Whether `fn` takes no arguments: no required parameter and no `*args` (a function with
    `*args` may be a metric function `(y_true, y_pred)`)."""
    params = _parameters(fn)
    return params is not None and not _required(params) and all(p.kind != p.VAR_POSITIONAL for p in params)


def metric_class_name(cls) -> str:
    """How a user writes a metric class: `keras.metrics.AUC` for a Keras metric class, else the
    class's own name (e.g. `MyMetric`)."""
    import keras

    return f"keras.metrics.{cls.__name__}" if getattr(keras.metrics, cls.__name__, None) is cls else cls.__name__


def _is_metric_class(item) -> bool:
    if not isinstance(item, type):
        return False
    import keras

    return issubclass(item, keras.metrics.Metric)


def check_metrics(metrics) -> None:
    """Refuses a `keras.metrics.Metric` class in `metrics` that cannot be built without arguments,
    before anything is built.

    Args:
        metrics: what `Task.metrics` holds (see `build_metrics`).

    Raises:
        ConfigError: naming the class, its required arguments and the fix.
    """
    if isinstance(metrics, Mapping):
        metrics = list(metrics.values())
    if isinstance(metrics, (list, tuple)):
        for item in metrics:
            check_metrics(item)
    elif _is_metric_class(metrics) and _required(_parameters(metrics) or []):
        name, needed = metric_class_name(metrics), _required(_parameters(metrics))
        raise ConfigError(f"Metric class {name} cannot be built without arguments ({', '.join(needed)}). Pass "
                          f"functools.partial({name}, {', '.join(f'{n}=...' for n in needed)}) instead.")


def build_metrics(metrics):
    """`metrics` with each metric class and metric factory replaced by a new metric.

    Call it where the metrics' variables should live: the Trainer calls
    `compile_args`, and so this, inside the strategy's scope. A task file that
    passes a class or a factory instead of a metric object does not start
    TensorFlow when imported, so `--cpu-replicas` and thread settings still apply.

    Args:
        metrics: what `Model.compile` takes (None, a list, a dict per output);
            besides names, metric objects and functions `(y_true, y_pred)`, an
            item may be a `keras.metrics.Metric` subclass
            (`keras.metrics.MeanAbsoluteError`, built with no arguments) or a
            function of no arguments returning a metric
            (`functools.partial(keras.metrics.AUC, curve="PR")`,
            `lambda: keras.metrics.AUC(curve="PR")`).

    Returns:
        The same structure (lists and tuples as lists), classes and factories
        built; names, metric objects and functions are returned unchanged.

    Raises:
        ConfigError: when a class needs arguments, or a function of no
            arguments returns something other than a `keras.metrics.Metric`.

    Example:
        >>> build_metrics([keras.metrics.MeanAbsoluteError, "mse"])
        [<MeanAbsoluteError name=mean_absolute_error>, 'mse']
    """
    if isinstance(metrics, Mapping):
        return {key: build_metrics(value) for key, value in metrics.items()}
    if isinstance(metrics, (list, tuple)):
        return [build_metrics(item) for item in metrics]
    return _build_metric(metrics)


def _build_metric(item):
    """One metric: a class or factory built; anything else (a name, a metric, a function) as given."""
    import keras

    if isinstance(item, str) or isinstance(item, keras.metrics.Metric) or not callable(item):
        return item
    if _is_metric_class(item):
        check_metrics(item)
        return item()
    if isinstance(item, type) or not _is_metric_factory(item):
        return item  # a metric function (y_true, y_pred), or a class Keras calls as one
    built = item()
    if not isinstance(built, keras.metrics.Metric):
        raise ConfigError(f"Metric {item!r} takes no arguments, so it was called to build a metric, but it returned "
                          f"{type(built).__name__}. Pass a keras.metrics.Metric class or object, a function of no "
                          "arguments returning one, a metric name, or a function (y_true, y_pred).")
    return built


class _FunctionTask(Task):
    """A task whose model comes from a function and whose compile arguments are given."""

    def __init__(self, build_model, *, loss, optimizer="adam", metrics=None, learning_rate=None, name="task",
                 hparams=None, default_batch_size=None, defaults=None):
        if not callable(build_model):
            raise ConfigError(f"build_model must be a function returning a keras.Model. Received: {build_model!r}.")
        if loss is None:
            raise ConfigError("Pass loss=... (a Keras loss name or object, e.g. loss='mse').")
        self._build_model = build_model
        check_metrics(metrics)
        self.loss, self.optimizer, self.metrics = loss, optimizer, metrics
        self.learning_rate, self.name = learning_rate, name
        self.hparams, self.default_batch_size = hparams, default_batch_size
        self.defaults = dict(defaults or {})
        config_lib.check_hparams(hparams)

    def build_model(self):
        """Calls the `build_model` function (with `hparams` when it takes an argument)."""
        return _call_builder(self._build_model, self.hparams)

    @property
    def _data(self) -> config_lib.DataConfig:
        return self.config.data if self.config is not None else config_lib.DataConfig()

    @property
    def _seed(self) -> Optional[int]:
        return self.config.seed if self.config is not None else None


def _slice(structure, start: int, stop: Optional[int]):
    """`array[start:stop]` for every array of a nested structure (dicts, tuples)."""
    import tensorflow as tf

    return tf.nest.map_structure(lambda a: a[start:stop], structure)


class ArrayTask(_FunctionTask):
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
        x: training features: an array `(num_examples, ...)`, or a dict / tuple
            of such arrays (one per model input).
        y: training labels (or targets): an array, or a dict / tuple per output.
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
        learning_rate, name, hparams, default_batch_size, defaults: see `Task`.
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
                 default_batch_size=None, defaults=None):
        super().__init__(build_model, loss=loss, optimizer=optimizer, metrics=metrics, learning_rate=learning_rate,
                         name=name, hparams=hparams, default_batch_size=default_batch_size, defaults=defaults)
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

    def _dataset(self, arrays, global_batch_size, training, input_context=None):
        from tftrain.data.pipeline import build_dataset

        return build_dataset(arrays, global_batch_size, training=training, config=self._data, seed=self._seed,
                             preprocess=self.preprocess, input_context=input_context)

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


class DatasetTask(_FunctionTask):
    """A task over the user's own `tf.data` pipelines.

    tftrain adds only what is asked (and says so): sharding by `InputContext`
    in multi-worker runs (`shard`), batching to the global or per-replica batch
    size (`batch`), prefetching (`prefetch`), shuffling (`shuffle`).

    Args:
        build_model: function `() -> keras.Model` (or `(hparams) -> ...`).
        train: function returning the training `tf.data.Dataset`: unbatched
            `(features, labels)` examples when `batch` is True, called as
            `train()`; batches when `batch` is False, called as
            `train(batch_size)` with the batch size this input pipeline must
            produce (global, or per replica under multi-worker training).
        validation: the same for validation data, or None. Defaults to None.
        test: the same for test data, or None. Defaults to None.
        batch: batch the examples (training batches drop the remainder).
            Defaults to True.
        shard: shard the examples across input pipelines in multi-worker runs.
            Defaults to True.
        prefetch: prefetch batches (AUTOTUNE), unless the run says
            `--no-prefetch`. Defaults to True.
        shuffle: shuffle training examples each epoch (`--shuffle-buffer`, 0:
            10,000 examples), after `--validation-split` holds its part out.
            Defaults to False. With `--validation-split`, let tftrain shuffle:
            the split takes the last examples of `train()`, so a `train()` that
            shuffles by itself would mix validation examples into training.
        num_train_examples: training examples per epoch; needed for
            `--validation-split`, schedules and multi-process strategies.
            Defaults to None (the dataset's cardinality when known).
        loss, optimizer, metrics, learning_rate, name, hparams,
        default_batch_size, defaults: see `ArrayTask`. `name` defaults to
            `"dataset"`.

    Raises:
        ConfigError: when `loss` is missing or a function is not callable.

    Example:
        >>> task = tftrain.DatasetTask(build_model, lambda: tf.data.Dataset.from_tensor_slices((x, y)),
        ...                            loss="mse", shuffle=True)
    """

    unused_fields = {"data.cache": "its tf.data pipeline is the user's own (add .cache() there)"}

    def __init__(self, build_model, train, validation=None, test=None, *, batch=True, shard=True, prefetch=True,
                 shuffle=False, num_train_examples=None, loss, optimizer="adam", metrics=None, learning_rate=None,
                 name="dataset", hparams=None, default_batch_size=None, defaults=None):
        super().__init__(build_model, loss=loss, optimizer=optimizer, metrics=metrics, learning_rate=learning_rate,
                         name=name, hparams=hparams, default_batch_size=default_batch_size, defaults=defaults)
        for label, fn in (("train", train), ("validation", validation), ("test", test)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"{label} must be a function returning a tf.data.Dataset. Received: {fn!r}.")
        self.train_fn, self.validation_fn, self.test_fn = train, validation, test
        self.batch, self.shard, self.prefetch, self.shuffle = batch, shard, prefetch, shuffle
        self._num_train_examples = num_train_examples

    def _examples(self):
        """(train examples, held-out validation examples or None) before batching."""
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
        """Binds the config; refuses a validation split of already batched data."""
        if config.data.validation_split and self.validation_fn is None and not self.batch:
            raise ConfigError("--validation-split holds out examples; with batch=False DatasetTask gets batches. "
                              "Give DatasetTask validation=<function> instead.")
        return super().bind(config)

    def _known_count(self) -> Optional[int]:
        """`num_train_examples`, else the training dataset's cardinality when known (read once)."""
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
        """Training examples per epoch after `--train-examples` and the split, or None."""
        n = self._known_count()
        if n is None:
            return None
        if self._data.train_examples is not None:
            n = min(n, self._data.train_examples)
        if self._data.validation_split and self.validation_fn is None:
            n -= max(1, int(n * self._data.validation_split))
        return n

    def _finish(self, ds, global_batch_size, training, input_context=None):
        """Shards, shuffles, batches and prefetches `ds` as asked."""
        import tensorflow as tf

        per_pipeline = global_batch_size
        if input_context is not None:
            if self.shard:
                ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
            per_pipeline = input_context.get_per_replica_batch_size(global_batch_size)
        if training and self.shuffle:
            ds = ds.shuffle(self._data.shuffle_buffer or 10_000, seed=self._seed, reshuffle_each_iteration=True)
        ds = ds.batch(per_pipeline, drop_remainder=training)
        if self.prefetch and self._data.prefetch:
            ds = ds.prefetch(tf.data.AUTOTUNE)
        return _with_shard_policy(ds, input_context, self._data.private_threads)

    def _batched(self, fn, global_batch_size, input_context=None):
        """The user's already batched dataset at this pipeline's batch size, sharded / prefetched as asked."""
        import tensorflow as tf

        size = input_context.get_per_replica_batch_size(global_batch_size) if input_context else global_batch_size
        ds = fn(size)
        if input_context is not None and self.shard:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        if self.prefetch and self._data.prefetch:
            ds = ds.prefetch(tf.data.AUTOTUNE)
        return _with_shard_policy(ds, input_context, self._data.private_threads)

    def train_data(self, global_batch_size, input_context=None):
        """The user's training data with what was asked added."""
        if not self.batch:
            return self._batched(self.train_fn, global_batch_size, input_context)
        return self._finish(self._examples()[0], global_batch_size, True, input_context)

    def validation_data(self, global_batch_size):
        """The user's validation data, or the held-out split; None when neither."""
        if self.validation_fn is not None:
            if not self.batch:
                return self._batched(self.validation_fn, global_batch_size)
            return self._finish(self.validation_fn(), global_batch_size, False)
        held_out = self._examples()[1] if self.batch else None
        return None if held_out is None else self._finish(held_out, global_batch_size, False)

    def test_data(self, global_batch_size):
        """The user's test data, batched as asked; None when not given."""
        if self.test_fn is None:
            return None
        if not self.batch:
            return self._batched(self.test_fn, global_batch_size)
        return self._finish(self.test_fn(), global_batch_size, False)

    def describe_data(self) -> list:
        """What tftrain adds to the user's pipeline."""
        added = [name for name, on in (("shard (multi-worker)", self.shard), ("shuffle", self.shuffle and self.batch),
                                       ("batch", self.batch), ("prefetch", self.prefetch and self._data.prefetch))
                 if on]
        n = self.num_train_examples
        held_out = ""
        if self._data.validation_split and self.validation_fn is None and n is not None:
            held_out = f", {self._held_out_count():,} held out for validation (the last {self._data.validation_split:g})"
        return [f"data:      your tf.data pipeline ({f'{n:,}' if n else 'unknown number of'} training examples"
                f"{held_out}); tftrain adds: {', '.join(added) or 'nothing'}"]

    def _held_out_count(self) -> int:
        """Examples `--validation-split` holds out of the (known) training count."""
        n = self._known_count()
        if self._data.train_examples is not None:
            n = min(n, self._data.train_examples)
        return max(1, int(n * self._data.validation_split))


def _with_shard_policy(ds, input_context, private_threads: int = 0):
    """Sets the auto-shard policy: OFF when sharded by an InputContext, else DATA (never a warning);
    and a private thread pool of `private_threads` threads when > 0 (`--private-threads`)."""
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.OFF if input_context is not None
        else tf.data.experimental.AutoShardPolicy.DATA
    )
    if private_threads:
        options.threading.private_threadpool_size = private_threads
    return ds.with_options(options)


class TFRecordTask(_FunctionTask):
    """A task over TFRecord files and the user's parse function.

    The pipeline is `tftrain.data.build_dataset` over files: parallel reads,
    parallel parse, cache (`--cache`), shuffle, batch, `preprocess`, prefetch.
    Multi-worker input is sharded by record (every worker reads every file and
    keeps its share); without an InputContext, the strategy shards by file when
    there are several.

    Args:
        build_model: function `() -> keras.Model` (or `(hparams) -> ...`).
        train_files: TFRecord file paths (list of str).
        parse_fn: maps one serialized record (a scalar string tensor) to
            `(features, labels)`.
        validation_files, test_files: file lists, or None. Default to None.
        num_train_examples: records in `train_files`, when known (schedules,
            steps per epoch, multi-process strategies). Defaults to None.
        preprocess: batch map `(features, labels) -> (features, labels)`.
            Defaults to None.
        loss, optimizer, metrics, learning_rate, name, hparams,
        default_batch_size, defaults: see `ArrayTask`. `name` defaults to
            `"tfrecord"`.

    Raises:
        ConfigError: when `train_files` is empty or `loss` is missing.
    """

    def __init__(self, build_model, train_files, parse_fn, *, validation_files=None, test_files=None,
                 num_train_examples=None, preprocess=None, loss, optimizer="adam", metrics=None, learning_rate=None,
                 name="tfrecord", hparams=None, default_batch_size=None, defaults=None):
        super().__init__(build_model, loss=loss, optimizer=optimizer, metrics=metrics, learning_rate=learning_rate,
                         name=name, hparams=hparams, default_batch_size=default_batch_size, defaults=defaults)
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

    def train_data(self, global_batch_size, input_context=None):
        """Parsed, cached, shuffled training batches (of the first `--train-examples` records)."""
        return self._dataset("train", global_batch_size, True, input_context)

    def probe_data(self, global_batch_size, num_batches):
        """The first training batches without the cache (a partly read cache makes tf.data warn)."""
        config = dataclasses.replace(self._data, cache=False)
        return self._dataset("train", global_batch_size, True, config=config).take(num_batches)

    def validation_data(self, global_batch_size):
        """Batches of `validation_files`; `--validation-split` is refused (records are not counted)."""
        if self._data.validation_split and not self.files["validation"]:
            raise ConfigError("TFRecordTask cannot hold out a fraction of its records: pass validation_files=[...] "
                              "instead of --validation-split.")
        return self._dataset("validation", global_batch_size, False)

    def test_data(self, global_batch_size):
        """Batches of `test_files`, or None."""
        return self._dataset("test", global_batch_size, False)

    def describe_data(self) -> list:
        """The file counts and the pipeline."""
        counts = ", ".join(f"{len(v)} {k}" for k, v in self.files.items() if v)
        return [f"data:      TFRecord files ({counts}); pipeline: parallel read and parse"
                + (", cache" if self._data.cache else "") + ", shuffle, batch"
                + (", prefetch" if self._data.prefetch else "")]


def _random_subset(files, count: int, seed: int):
    """`count` files drawn at random (seeded), so a small subset still holds every class."""
    import numpy as np

    if count >= len(files):
        return files
    keep = np.sort(np.random.default_rng(seed).permutation(len(files))[:count])
    return dataclasses.replace(files, paths=tuple(files.paths[i] for i in keep),
                               labels=tuple(files.labels[i] for i in keep))


class ImageFolderTask(_FunctionTask):
    """A task over a folder of images with one sub-folder per class.

    The folder convention of `keras.utils.image_dataset_from_directory`; the
    pipeline is `tftrain.data.image_folder_dataset`: JPEG / PNG decoded and
    resized in parallel, cached in memory after the first epoch (`--cache`),
    shuffled, batched, augmented on whole batches (training only), prefetched.
    `--validation-split F` holds out a seeded random F of the files;
    `--train-examples N` keeps a seeded random N of the training files.

    Args:
        build_model: function `() -> keras.Model` (or `(hparams) -> ...`) taking
            float32 images `(batch, height, width, num_channels)` with pixels
            0..255.
        directory: the training folder (`--data-dir` replaces it when given).
        image_size: `(height, width)` every image is resized to.
        test_directory: a folder of the same classes evaluated after training.
            Defaults to None.
        augment: batch map `(images, labels) -> (images, labels)` for training,
            e.g. `tftrain.data.random_flip_and_translate()`. Defaults to None.
        num_channels: 1 (grayscale) or 3 (RGB). Defaults to 3.
        split_seed: seed of the validation split's file order. Defaults to 1337.
        loss: Defaults to `"sparse_categorical_crossentropy"`.
        metrics: see `ArrayTask`. Defaults to `["accuracy"]`.
        optimizer, learning_rate, name, hparams, default_batch_size, defaults:
            see `ArrayTask`. `name` defaults to `"image_folder"`.

    Raises:
        DataError: (when bound) when a folder is missing or holds no images.
    """

    def __init__(self, build_model, directory, *, image_size, test_directory=None, augment=None, num_channels=3,
                 split_seed=1337, loss="sparse_categorical_crossentropy", optimizer="adam", metrics=("accuracy",),
                 learning_rate=None, name="image_folder", hparams=None, default_batch_size=None, defaults=None):
        super().__init__(build_model, loss=loss, optimizer=optimizer, metrics=list(metrics or ()),
                         learning_rate=learning_rate, name=name, hparams=hparams,
                         default_batch_size=default_batch_size, defaults=defaults)
        self.directory, self.test_directory = directory, test_directory
        self.image_size, self.augment, self.num_channels = tuple(image_size), augment, num_channels
        self.split_seed = split_seed
        self.example_unit = "images"
        self._files = None

    def bind(self, config):
        """Binds the config and lists the files of `--data-dir` (or `directory`), split as asked."""
        from tftrain.data.image_folder import list_image_files

        bound = super().bind(config)
        directory = config.data.data_dir or self.directory
        split = config.data.validation_split
        kwargs = {"validation_split": split, "seed": self.split_seed}
        train = list_image_files(directory, subset="training" if split else None, **kwargs)
        if config.data.train_examples is not None:
            train = _random_subset(train, config.data.train_examples, self.split_seed)
        val = list_image_files(directory, subset="validation", **kwargs) if split else None
        bound._files = {"train": train, "validation": val, "test": None}
        if self.test_directory:
            bound.set_test_directory(self.test_directory)
        return bound

    def set_test_directory(self, directory) -> None:
        """Lists a test folder (on a bound task); its classes must be the training folder's.

        Raises:
            DataError: when the test folder's class sub-folders differ.
        """
        from tftrain.data.image_folder import list_image_files
        from tftrain.errors import DataError

        test = list_image_files(directory)
        if test.class_names != self.class_names:
            raise DataError(
                f"Test folder {str(directory)!r} has classes {list(test.class_names)[:5]}..., the training folder "
                f"{list(self.class_names)[:5]}...: labels would not match. Give both folders the same sub-folders."
            )
        self.test_directory = directory
        self._files = {**self._files, "test": test}

    @property
    def class_names(self) -> tuple:
        """The class names (sorted sub-folder names) of the bound training folder."""
        return self._files["train"].class_names

    @property
    def num_train_examples(self) -> Optional[int]:
        """Training images after the split and `--train-examples` (None before `bind`)."""
        return None if self._files is None else len(self._files["train"])

    @property
    def num_test_examples(self) -> Optional[int]:
        """Test images, or None."""
        test = None if self._files is None else self._files["test"]
        return None if test is None else len(test)

    def _dataset(self, split, global_batch_size, training, input_context=None, config=None):
        from tftrain.data.image_folder import image_folder_dataset

        files = self._files[split]
        if files is None:
            return None
        return image_folder_dataset(files, self.image_size, global_batch_size, training=training,
                                    config=config or self._data, seed=self._seed,
                                    augment=self.augment if training else None, input_context=input_context,
                                    num_channels=self.num_channels)

    def train_data(self, global_batch_size, input_context=None):
        """Decoded, cached, shuffled, augmented training batches."""
        return self._dataset("train", global_batch_size, True, input_context)

    def validation_data(self, global_batch_size):
        """The held-out images in order, or None."""
        return self._dataset("validation", global_batch_size, False)

    def test_data(self, global_batch_size):
        """The test folder's images in order, or None."""
        return self._dataset("test", global_batch_size, False)

    def probe_data(self, global_batch_size, num_batches):
        """The first training batches without the cache (a partly read cache makes tf.data warn)."""
        config = dataclasses.replace(self._data, cache=False)
        return self._dataset("train", global_batch_size, True, config=config).take(num_batches)

    def input_bound_hint(self) -> str:
        """Decoding is this pipeline's costly stage: what to do about it."""
        if not self._data.cache:
            return ("decoding and resizing the image files is the likely cost: turn --cache back on, so epochs after "
                    "the first read decoded images from memory")
        return ("decoding and resizing the image files is the likely cost (the first epoch decodes every file; "
                "later ones read the cache): store the images at the training size, train more epochs per run, "
                "or raise --private-threads")

    def describe_data(self) -> list:
        """Image counts per split, classes, and the pipeline."""
        files = self._files
        counts = ", ".join(f"{len(v):,} {k}" for k, v in files.items() if v is not None)
        h, w = self.image_size
        return [f"data:      image folder: {counts} images, {len(self.class_names)} classes, resized to {h}x{w}; "
                "pipeline: parallel decode" + (", cache" if self._data.cache else "") + ", shuffle, batch"
                + (", augment" if self.augment else "") + (", prefetch" if self._data.prefetch else "")]


__all__ = ["ArrayTask", "DatasetTask", "ImageFolderTask", "TFRecordTask", "Task"]
