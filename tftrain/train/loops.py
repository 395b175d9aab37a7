"""Training loops, each saying in one place what it supports.

A strategy changes what a run can do: `Model.fit` under a single-process
strategy has per-step hooks, can time graph against XLA and can search in
process; a multi-worker job must run the same program in every task, so it
cannot search or time modes in one task alone; the parameter-server loop
(`ClusterCoordinator`) has no per-step hooks and runs only `tf.function`s. The
`Trainer` asks the loop (`loop_for(strategy)`) instead of branching on the
strategy's name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Mapping
from typing import Callable, Optional, Sequence

from tftrain import config as config_lib
from tftrain.errors import ConfigError
from tftrain.train.task import build_metrics


@dataclasses.dataclass(frozen=True)
class FitLoop:
    """`Model.fit` in one process (default, one_device and mirrored strategies).

    Attributes:
        name: the loop's name in messages.
        per_step_hooks: batch-level callbacks fire every `steps_per_execution`
            steps (ThroughputMonitor, ProfilerWindow, `--backup-every-steps`
            can run; elsewhere the NaN guard checks the loss once per epoch).
        times_execution: `--execution auto` may time graph against XLA here.
        in_process_search: `--tune` and `--batch-size auto` can run here.
        checks_input: the ThroughputMonitor times this process's whole input
            pipeline alone (the input-bound verdict).
        validates: `fit` reads the task's validation data for `val_*` metrics
            (and `--early-stopping` can watch `val_loss`).
        needs_steps_per_epoch: the task must know `num_train_examples`.
        executions: execution modes this loop runs.
        accumulates: `--gradient-accumulation-steps N` > 1 can run here.
    """

    name: str = "Model.fit"
    per_step_hooks: bool = True
    times_execution: bool = True
    in_process_search: bool = True
    checks_input: bool = True
    validates: bool = True
    needs_steps_per_epoch: bool = False
    executions: tuple = config_lib.EXECUTIONS
    accumulates: bool = True

    def serves(self, cluster) -> bool:
        """Whether this process only serves the job (never for `Model.fit`)."""
        return False

    def job(self, cluster):
        """A context manager around the run after set-up; here it does nothing."""
        return contextlib.nullcontext()

    def steps_per_execution_for(self, requested: int, batches_per_epoch: Optional[int]) -> int:
        """The steps per execution this loop runs: here the requested ones (its data ends each epoch)."""
        return requested

    def check(self, cfg: config_lib.RecipeConfig) -> None:
        """Refuses flags this loop cannot honour, before any work.

        Raises:
            ConfigError: naming the flag, why, and what to do instead.
        """
        auto_batch = cfg.data.batch_size == config_lib.AUTO_BATCH
        if cfg.train.tune and auto_batch:
            raise ConfigError("--tune searches the batch size itself; drop --batch-size auto "
                              "(or drop --tune to only search the batch size).")
        if cfg.train.tune and os.environ.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1"):  # TensorFlow's test
            raise ConfigError("--tune runs keras-tuner, which needs Keras 3, but TF_USE_LEGACY_KERAS makes tf.keras "
                              "the legacy tf_keras (keras-team/keras-tuner#1027). Unset TF_USE_LEGACY_KERAS, "
                              "or drop --tune.")
        why = f"{cfg.runtime.strategy} runs every task in lockstep"
        if cfg.train.tune and not self.in_process_search:
            raise ConfigError(f"keras-tuner runs each trial in one process; {why}. Tune with a single-process strategy "
                              "(--strategy mirrored, one_device or default), then train the best configuration here.")
        if auto_batch and not self.in_process_search:
            raise ConfigError(f"--batch-size auto searches in one process; {why}. Search on one machine "
                              "(--batch-size auto --strategy mirrored), then pass the result with --batch-size N.")
        if cfg.train.profile is not None and not self.per_step_hooks:
            raise ConfigError(f"--profile needs per-step hooks, which {self.name} lacks. "
                              "Profile a single-process run instead.")
        if cfg.runtime.execution not in self.executions:
            raise ConfigError(f"execution={cfg.runtime.execution!r} is not available with {self.name}. "
                              f"Pass --execution {' or '.join(self.executions)}.")
        self._check_accumulation(cfg)
        self._check_checkpoints(cfg)

    def _check_checkpoints(self, cfg: config_lib.RecipeConfig) -> None:
        """Refuses `--backup-every-steps` without per-step hooks and `--early-stopping` without validation."""
        if cfg.train.backup_every_steps is not None and not self.per_step_hooks:
            raise ConfigError(f"--backup-every-steps needs per-step hooks, which {self.name} lacks (it backs up at "
                              "each epoch end). Drop the flag, or use fewer steps per epoch.")
        if cfg.train.early_stopping is not None and not self.validates:
            raise ConfigError(f"--early-stopping watches val_loss, which {self.name} does not compute. Drop the "
                              "flag, or train with a strategy whose loop validates (default, mirrored, "
                              "multi_worker_mirrored).")

    def _check_accumulation(self, cfg: config_lib.RecipeConfig) -> None:
        """Refuses `--gradient-accumulation-steps` > 1 where this loop cannot honour it, and with `--tune`."""
        steps = cfg.train.gradient_accumulation_steps
        if steps == 1:
            return
        if not self.accumulates:
            raise ConfigError(f"--gradient-accumulation-steps {steps} is not supported by {self.name} (each "
                              "worker applies its own steps asynchronously). Drop it, or use --strategy "
                              "multi_worker_mirrored.")
        if cfg.train.tune:
            raise ConfigError(f"--tune trains its trials without gradient accumulation, so it would pick a batch size "
                              f"for updates of one batch, not {steps}. Tune without --gradient-accumulation-steps "
                              "first, then train the best configuration with it.")

    def compile(self, model, compile_args: dict, runtime) -> None:
        """`model.compile(**compile_args)` with the runtime's execution options, in the strategy's scope."""
        with runtime.strategy.scope():
            model.compile(**compile_args, **runtime.compile_options())

    def fit(self, model, train_data: Callable, *, epochs: int, steps_per_epoch: Optional[int],
            callbacks: Sequence, verbose: int, validation_data=None, runtime=None, metrics=None, say=print):
        """Trains with `Model.fit` on `train_data()`; returns the `History`.

        Args:
            model: the compiled model.
            train_data: function `(input_context=None) -> tf.data.Dataset`.
            epochs: last epoch (BackupAndRestore resumes where it stopped).
            steps_per_epoch: optimizer steps per epoch, used when the dataset
                repeats forever (else the dataset ends each epoch).
            callbacks: Keras callbacks.
            verbose: Keras verbosity.
            validation_data: a dataset for `val_*` metrics, or None.
            runtime: the `Runtime`. Defaults to None.
            metrics: the task's metrics, for loops that update them
                themselves (not `Model.fit`). Defaults to None.
            say: prints one line about a setting the loop changed (the run's
                console under the Trainer). Defaults to `print`.
        """
        import tensorflow as tf

        dataset = train_data()
        endless = int(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY
        return model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch if endless else None,
                         callbacks=list(callbacks), verbose=verbose, validation_data=validation_data, shuffle=False)

    def evaluate(self, model, dataset, metrics=None) -> dict:
        """`Model.evaluate` as a `{name: float}` dict (`"loss"` and each metric; `metrics` unused)."""
        results = model.evaluate(dataset, verbose=0, return_dict=True)
        return {name: float(value) for name, value in results.items()}


@dataclasses.dataclass(frozen=True)
class MultiWorkerLoop(FitLoop):
    """`Model.fit` in every task of a `multi_worker_mirrored` job.

    Each worker builds its own shard of the input (`InputContext`), repeated,
    and every worker runs exactly `steps_per_epoch` steps per epoch, so none
    waits for a step another never takes.
    """

    name: str = "Model.fit (multi-worker)"
    times_execution: bool = False
    in_process_search: bool = False
    checks_input: bool = False  # each worker reads only its shard
    needs_steps_per_epoch: bool = True
    executions: tuple = ("auto", "graph", "eager")

    def steps_per_execution_for(self, requested: int, batches_per_epoch: Optional[int]) -> int:
        """The largest count <= `requested` that divides `batches_per_epoch`: on this endless data
        Keras runs whole executions, past an epoch's end otherwise (keras-team/keras#20861)."""
        if not batches_per_epoch or batches_per_epoch % requested == 0:
            return requested
        return max(d for d in range(1, requested + 1) if batches_per_epoch % d == 0)

    def fit(self, model, train_data, *, epochs, steps_per_epoch, callbacks, verbose, validation_data=None,
            runtime=None, metrics=None, say=print):
        """`Model.fit` on `strategy.distribute_datasets_from_function`; see `FitLoop.fit`.

        `steps_per_epoch` must be known (`Trainer.check_task` refuses a task
        without `num_train_examples` before the run starts). On this endless
        data Keras runs whole executions, so an epoch of 5 steps at
        `steps_per_execution` 3 would run 6 (keras-team/keras#20861): the
        model then runs the largest count <= its `steps_per_execution` that
        divides the epoch.
        """
        spe = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
        if steps_per_epoch % spe:
            model.steps_per_execution = self.steps_per_execution_for(spe, steps_per_epoch)
            say(f"steps per execution: {model.steps_per_execution} ({spe} does not divide the epoch's "
                f"{steps_per_epoch} steps, and Keras would run whole executions past the epoch's end)")
        dataset = runtime.strategy.distribute_datasets_from_function(lambda ctx: train_data(ctx).repeat())
        return model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch, callbacks=list(callbacks),
                         verbose=verbose, validation_data=validation_data, shuffle=False)


_ACCURACY_BY_LOSS = (("sparse_categorical", "SparseCategoricalAccuracy"), ("categorical", "CategoricalAccuracy"),
                     ("binary", "BinaryAccuracy"))


def metric_objects(metrics, loss) -> list:
    """Fresh Keras metric objects for loops that update metrics themselves.

    Args:
        metrics: what `compile` would take: None, or a list of names, metric
            objects (cloned from their config) or functions `(y_true, y_pred)`;
            metric classes and functions of no arguments returning a metric are
            built (`tftrain.train.task.build_metrics`). `"accuracy"` / `"acc"`
            resolves by the loss, as `compile` does (sparse categorical,
            categorical or binary accuracy).
        loss: the compiled loss (name or object), for `"accuracy"`.

    Returns:
        A list of new `keras.metrics.Metric`s.

    Raises:
        ConfigError: for a per-output dict of metrics (not supported here).
    """
    import keras

    if isinstance(metrics, Mapping):
        raise ConfigError("Per-output metrics (a dict) are not supported by the parameter-server loop; "
                          "give a flat list of metrics.")
    loss_name = loss if isinstance(loss, str) else getattr(loss, "name", getattr(loss, "__name__", ""))
    loss_name = str(loss_name).lower().replace("crossentropy", "_crossentropy")
    out = []
    for given in metrics or ():
        m = build_metrics(given)
        if m is not given:  # a metric class or factory: a new metric already
            out.append(m)
        elif isinstance(m, str) and m in ("accuracy", "acc"):
            cls = next((c for key, c in _ACCURACY_BY_LOSS if key in loss_name), "Accuracy")
            out.append(getattr(keras.metrics, cls)(name="accuracy"))
        elif isinstance(m, keras.metrics.Metric):
            out.append(type(m).from_config(m.get_config()))
        elif isinstance(m, str):
            out.append(keras.metrics.get(m))
        else:
            out.append(keras.metrics.MeanMetricWrapper(m, name=getattr(m, "__name__", "metric")))
    return out


@dataclasses.dataclass(frozen=True)
class ParameterServerLoop(FitLoop):
    """The coordinator loop of a `parameter_server` job (`tftrain.train.ps_training`).

    Steps run asynchronously on the workers through a `ClusterCoordinator`:
    no per-step hooks (no throughput figures, no profile window), graph mode
    only, no in-process search. Metrics are updated by the loop itself.
    """

    name: str = "the parameter-server coordinator loop"
    per_step_hooks: bool = False
    times_execution: bool = False
    in_process_search: bool = False
    checks_input: bool = False
    validates: bool = False
    needs_steps_per_epoch: bool = True
    executions: tuple = ("auto", "graph")
    accumulates: bool = False

    def serves(self, cluster) -> bool:
        """Worker and ps tasks serve; the chief (coordinator) trains."""
        return cluster is not None and cluster.task_type in ("worker", "ps")

    def job(self, cluster):
        """On the chief: tells every worker and ps task at the end whether the run finished or
        failed, so they exit 0 or 1 (`tftrain.runtime.server.telling_servers`)."""
        from tftrain.runtime.server import telling_servers

        return telling_servers(cluster)

    def compile(self, model, compile_args: dict, runtime) -> None:
        """Compiles optimizer and loss only, in the strategy's scope: the loop updates metrics
        itself, and the coordinator schedules its own `tf.function`s."""
        if isinstance(compile_args.get("loss"), Mapping):
            raise ConfigError("The parameter-server loop takes one loss for the whole model, not a dict per output. "
                              "Train a multi-output model with another strategy.")
        with runtime.strategy.scope():
            model.compile(optimizer=compile_args.get("optimizer"), loss=compile_args.get("loss"))

    def fit(self, model, train_data, *, epochs, steps_per_epoch, callbacks, verbose, validation_data=None,
            runtime=None, metrics=None, say=print):
        """`tftrain.train.ps_training.fit` on per-worker datasets; see `FitLoop.fit`."""
        from tftrain.train import ps_training

        with runtime.strategy.scope():
            metrics = metric_objects(metrics, model.loss)
        return ps_training.fit(
            model, lambda ctx: train_data(ctx).repeat(), epochs=epochs, steps_per_epoch=steps_per_epoch,
            metrics=metrics, callbacks=callbacks, verbose=verbose,
            steps_per_execution=runtime.requested_steps_per_execution,
        )

    def evaluate(self, model, dataset, metrics=None) -> dict:
        """`tftrain.train.ps_training.evaluate` on the chief (every example exactly once)."""
        from tftrain.train import ps_training

        return ps_training.evaluate(model, dataset, metric_objects(metrics, model.loss))


def loop_for(strategy: str) -> FitLoop:
    """The training loop for a strategy name (`RuntimeConfig.strategy`)."""
    if strategy == "multi_worker_mirrored":
        return MultiWorkerLoop()
    if strategy == "parameter_server":
        return ParameterServerLoop()
    return FitLoop()

