"""The `Task` base, the metric helpers, and `FunctionTask`, the adapters' base."""

from __future__ import annotations

import copy
import inspect
import numbers
from typing import Any, Callable, Mapping, Optional, Sequence

from tftrain import config as config_lib
from tftrain.errors import ConfigError


class Task:
    """Base class of a training task: override what differs.

    Class attributes a subclass may set:
        name: short name for run directories and reports. Defaults to `"task"`.
        hparams: frozen dataclass of `tftrain.hparam` fields, each a flag and a `task:` key. Defaults to None.
        loss, metrics, loss_weights, weighted_metrics: for `Model.compile` (`metrics` and `weighted_metrics` may
            hold classes: `build_metrics`). Default None.
        optimizer: an optimizer name, instance (cloned per compile) or `(learning_rate) -> Optimizer`. Default "adam".
        learning_rate: overridden by `--learning-rate`; None keeps the optimizer's default. Defaults to None.
        example_unit: the unit of printed rates (`"images"`: images/sec). Defaults to `"examples"`.
        default_batch_size: global batch size when the config sets none. Defaults to None (128 per replica).
        defaults: flat config overrides, under the recipe file and the flags. Defaults to {}.
        class_weight: `{class index: weight}`, as `Model.fit(class_weight=...)`. Defaults to None.
        unused_fields: `{flat config key: why}` the task ignores; flags hidden, setting one refused. Defaults to {}.

    Set by `bind`:
        config: the run's `RecipeConfig`.

    Example:
        >>> class Regression(tftrain.Task):
        ...     name, loss = "regression", "mse"
        ...     def build_model(self): ...  # a new, uncompiled keras.Model
        ...     def train_data(self, global_batch_size, input_context=None): ...  # a tf.data.Dataset
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
    class_weight: Optional[Mapping[int, float]] = None
    loss_weights: Any = None
    weighted_metrics: Any = None
    config: Optional[config_lib.RecipeConfig] = None

    # -- what the Trainer calls ------------------------------------------------
    def check_unused_fields(self, config: config_lib.RecipeConfig) -> None:
        """Raises `ConfigError` when a field in `unused_fields` is not at tftrain's default."""
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
        """A shallow copy bound to `config` (`hparams` from `config.task`). Runs before TensorFlow starts: an
        override may check files but must build no dataset and run no TensorFlow op.

        Raises:
            ConfigError: `config.task` is not the task's hyperparameter type.
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

    def release(self) -> None:
        """Drops what the bound task keeps for its pipelines, at the end of the run. Defaults to nothing."""

    def build_model(self):
        """Returns a new, uncompiled `keras.Model`; called inside `strategy.scope()`."""
        raise NotImplementedError(f"{type(self).__name__} must define build_model(self) -> keras.Model.")

    def compile_args(self, steps_per_epoch: Optional[int]) -> dict:
        """`Model.compile` arguments: `optimizer`, `loss`, `metrics` (`loss_weights`, `weighted_metrics` if set). In the
        strategy's scope (the metrics' variables); `steps_per_epoch` None keeps a learning-rate schedule constant."""
        args = {"optimizer": self.make_optimizer(steps_per_epoch), "loss": self.loss,
                "metrics": build_metrics(self.metrics)}
        if self.loss_weights is not None:
            args["loss_weights"] = self.loss_weights
        if self.weighted_metrics is not None:
            args["weighted_metrics"] = build_metrics(self.weighted_metrics)
        return args

    def make_optimizer(self, steps_per_epoch: Optional[int]):
        """A fresh optimizer at `run_learning_rate(steps_per_epoch)`; `ConfigError` on an unknown `optimizer`."""
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
            if rate is not None:
                return spec(rate)
            try:
                inspect.signature(spec).bind()
            except (TypeError, ValueError):  # it needs the rate, and neither the task nor --learning-rate gives one
                raise ConfigError("The task's optimizer is a function of the learning rate, and no learning rate is "
                                  "given: set the task's learning_rate, or pass --learning-rate.") from None
            return spec()
        raise ConfigError(f"optimizer must be a name, an optimizer or a function. Received: {spec!r}.")

    def run_learning_rate(self, steps_per_epoch: Optional[int]):
        """`--learning-rate`, else the task's, else None; under `--lr-schedule cosine` with known steps, a
        `CosineDecay` from `starting_learning_rate()` to 0 over the run."""
        import keras

        train = self.config.train if self.config is not None else config_lib.TrainConfig()
        rate = train.learning_rate if train.learning_rate is not None else self.learning_rate
        if train.lr_schedule != "cosine" or not steps_per_epoch:
            return rate
        rate = self.starting_learning_rate()
        return keras.optimizers.schedules.CosineDecay(rate, decay_steps=train.epochs * steps_per_epoch)

    def starting_learning_rate(self) -> Optional[float]:
        """`--learning-rate`, else the task's, else the optimizer's own default."""
        import keras

        train = self.config.train if self.config is not None else config_lib.TrainConfig()
        rate = train.learning_rate if train.learning_rate is not None else self.learning_rate
        if rate is None:
            rate = self._optimizer_from_spec(None).learning_rate
        return float(keras.ops.convert_to_numpy(rate))

    def train_data(self, global_batch_size: int, input_context=None):
        """One epoch of training batches: a `tf.data.Dataset` of `(features, labels)`, last partial batch dropped.
        Multi-worker, `input_context` (default None) is an `InputContext`: shard by its `input_pipeline_id` and
        batch by `get_per_replica_batch_size`."""
        raise NotImplementedError(f"{type(self).__name__} must define train_data(self, global_batch_size, input_context=None).")

    def validation_data(self, global_batch_size: int):
        """Validation batches, or None (default)."""
        return None

    def test_data(self, global_batch_size: int):
        """Test batches evaluated once after training, or None (default)."""
        return None

    @property
    def num_train_examples(self) -> Optional[int]:
        """Training examples per epoch, or None if unknown."""
        return None

    @property
    def num_test_examples(self) -> Optional[int]:
        """Test examples, or None if unknown."""
        return None

    def probe_data(self, global_batch_size: int, num_batches: int):
        """The first `num_batches` training batches, for timing; skip any cache (tf.data warns on a partly read one)."""
        return self.train_data(global_batch_size).take(num_batches)

    def input_bound_hint(self) -> str:
        """What to try when training waits for input; "" (default) for nothing."""
        return ""

    def label_arrays(self) -> tuple:
        """`(what, labels)` pairs ("training", "validation", "test") of labels held in memory as they reach the
        model, checked whole before training (`data_checks.check_label_range`). Defaults to () (none)."""
        return ()

    def data_error_hint(self, error: BaseException) -> str:
        """What in the data caused `error` (a failed run's), e.g. the files that do not decode; "" (default):
        nothing known. Read only after a failure, so it may take as long as an epoch's input."""
        return ""

    def tune_space(self) -> Mapping[str, Sequence]:
        """Model hyperparameters `--tune` chooses from, `{name: values}` (not data knobs). Defaults to {}."""
        return {}

    def describe_data(self) -> list:
        """Lines saying where the data comes from and what tftrain does to it. Defaults to []."""
        return []

    def describe_sharding(self, num_input_pipelines: int) -> Optional[str]:
        """One line on how `num_input_pipelines` split the training data; None (default): the general rule."""
        return None


def _call_builder(build_model: Callable, hparams):
    """`build_model(hparams)` if it requires an argument, or takes one and hparams exist; else `build_model()`."""
    try:
        params = [p for p in inspect.signature(build_model).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    except (TypeError, ValueError):
        params = []
    required = any(p.default is p.empty and p.kind != p.VAR_POSITIONAL for p in params)
    return build_model(hparams) if required or (params and hparams is not None) else build_model()


def _parameters(fn) -> Optional[list]:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None


def _required(params: list) -> list:
    return [p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _is_metric_factory(fn) -> bool:
    """Whether `fn` takes no arguments (`*args` may mean a metric function `(y_true, y_pred)`)."""
    params = _parameters(fn)
    return params is not None and not _required(params) and all(p.kind != p.VAR_POSITIONAL for p in params)


def metric_class_name(cls) -> str:
    """How a user writes a metric class: `keras.metrics.AUC`, or the class's own name."""
    import keras

    return f"keras.metrics.{cls.__name__}" if getattr(keras.metrics, cls.__name__, None) is cls else cls.__name__


def _is_metric_class(item) -> bool:
    if not isinstance(item, type):
        return False
    import keras

    return issubclass(item, keras.metrics.Metric)


def check_metrics(metrics) -> None:
    """Raises `ConfigError` for a metric class in `metrics` that needs arguments."""
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
    """`metrics` with each metric class and no-argument factory replaced by a new metric (so a task file need not
    start TensorFlow on import); call in the strategy's scope. Lists and tuples become lists; the rest unchanged.

    Raises:
        ConfigError: a class needs arguments, or a factory returns no `keras.metrics.Metric`.

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


class FunctionTask(Task):
    """A task whose model comes from a function and whose compile arguments are given (the adapters' keyword
    arguments `loss` (None: the model's own, from `add_loss` or its `train_step`, as in `compile`), `optimizer`, `metrics`, `learning_rate`, `hparams`, `default_batch_size`, `defaults`,
    `class_weight`, `loss_weights`, `weighted_metrics`: see `Task`)."""

    def __init__(self, build_model, *, loss=None, optimizer="adam", metrics=None, learning_rate=None, name="task",
                 hparams=None, default_batch_size=None, defaults=None, class_weight=None, loss_weights=None,
                 weighted_metrics=None):
        self.class_weight = check_class_weight(class_weight)
        self.loss_weights = loss_weights
        check_metrics(weighted_metrics)
        self.weighted_metrics = weighted_metrics
        if not callable(build_model):
            raise ConfigError(f"build_model must be a function returning a keras.Model. Received: {build_model!r}.")
        self._build_model = build_model
        check_metrics(metrics)
        self.loss, self.optimizer, self.metrics = loss, optimizer, metrics
        self.learning_rate, self.name = learning_rate, name
        self.hparams, self.default_batch_size = hparams, default_batch_size
        self.defaults = dict(defaults or {})
        config_lib.check_hparams(hparams)

    def build_model(self):
        return _call_builder(self._build_model, self.hparams)

    @property
    def _data(self) -> config_lib.DataConfig:
        return self.config.data if self.config is not None else config_lib.DataConfig()

    @property
    def _seed(self) -> Optional[int]:
        return self.config.seed if self.config is not None else None


def check_compile_args(args) -> dict:
    """`args`, a task's `compile_args`, unless it is not a dict or sets an option the run sets from its flags
    (`run_eagerly`, `jit_compile`, `steps_per_execution`): then `ConfigError` naming the flag to pass instead."""
    if not isinstance(args, Mapping):
        raise ConfigError(f"compile_args must return a dict of Model.compile arguments. Received: {args!r}.")
    for key, (name, flag) in {"run_eagerly": ("execution", lambda v: "eager" if v else "graph"),
                              "jit_compile": ("execution", lambda v: {True: "xla", False: "graph"}.get(v, "auto")),
                              "steps_per_execution": ("steps_per_execution", lambda v: v)}.items():
        if key in args:
            value = flag(args[key])
            raise ConfigError(f"compile_args sets {key}={args[key]!r}, which tftrain sets from "
                              f"--{name.replace('_', '-')}: drop it from compile_args and pass "
                              f"--{name.replace('_', '-')} {value} (or give the task defaults={{{name!r}: {value!r}}}).")
    return dict(args)


def check_class_weight(class_weight) -> Optional[dict]:
    """`class_weight` as `{int: float}`, or None; `ConfigError` unless it maps ints >= 0 to numbers >= 0."""
    if class_weight is None:
        return None
    example = "e.g. class_weight={0: 1.0, 1: 5.0}"
    if not isinstance(class_weight, Mapping) or not class_weight:
        raise ConfigError(f"class_weight must be a non-empty dict of class index to weight, {example}. "
                          f"Received: {class_weight!r}.")
    out = {}
    for key, weight in class_weight.items():
        if isinstance(key, bool) or not isinstance(key, numbers.Integral) or key < 0 \
                or isinstance(weight, bool) or not isinstance(weight, numbers.Real) or weight < 0:
            raise ConfigError(f"class_weight maps class indices (ints >= 0) to weights (numbers >= 0), {example}. "
                              f"Received the entry {key!r}: {weight!r}.")
        out[int(key)] = float(weight)
    return out


def with_shard_policy(ds, input_context, private_threads: int = 0):
    """`ds` with auto-shard OFF if sharded by an InputContext, else DATA; a private pool if `private_threads` > 0."""
    import tensorflow as tf

    from tftrain.data.pipeline import dataset_options

    policy = tf.data.experimental.AutoShardPolicy
    return ds.with_options(dataset_options(policy.OFF if input_context is not None else policy.DATA,
                                           private_threads=private_threads))
