"""`ParameterServerLoop`: the coordinator loop of a `parameter_server` job, and the metrics it updates itself."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Optional

from tftrain.errors import ConfigError
from tftrain.train.loops.fit import FitLoop
from tftrain.train.tasks.base import build_metrics


_ACCURACY_BY_LOSS = (("sparse_categorical", "SparseCategoricalAccuracy"), ("categorical", "CategoricalAccuracy"),
                     ("binary", "BinaryAccuracy"))


def metric_objects(metrics, loss) -> list:
    """Fresh Keras metrics from a flat `compile`-style list, `"accuracy"` resolved by `loss` as `compile` does;
    `ConfigError` for a per-output dict."""
    import keras

    if isinstance(metrics, Mapping):
        raise ConfigError("Per-output metrics (a dict) are not supported by the parameter-server loop; "
                          "give a flat list of metrics.")
    loss_name = loss if isinstance(loss, str) else getattr(loss, "name", getattr(loss, "__name__", ""))
    loss_name = str(loss_name).lower().replace("crossentropy", "_crossentropy")
    out = []
    for given in metrics or ():
        m = build_metrics(given)
        if m is not given:  # built from a metric class or factory
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


def _backup_every(callbacks) -> Optional[int]:
    """The `StepBackup`'s steps between checkpoints (None: epoch ends only)."""
    from tftrain.callbacks.backup import StepBackup

    return next((c.every_steps for c in callbacks if isinstance(c, StepBackup) and c.every_steps), None)


@dataclasses.dataclass(frozen=True)
class ParameterServerLoop(FitLoop):
    """The coordinator loop of a `parameter_server` job (`ps_training`): steps run asynchronously on the workers,
    so no per-step hooks, no in-process search, graph mode only."""

    name: str = "the parameter-server coordinator loop"
    per_step_hooks: bool = False
    times_execution: bool = False
    in_process_search: bool = False
    checks_input: bool = False
    validates: bool = False
    needs_steps_per_epoch: bool = True
    executions: tuple = ("auto", "graph")
    accumulates: bool = False
    no_search_reason: str = ("its workers run steps asynchronously under the chief's coordinator, and keras-tuner "
                             "and the batch-size search time trials in one process")
    weighs_classes: bool = True  # on each worker's dataset; the step weighs the loss
    keeps_best: bool = False  # the coordinator loop keeps its own metrics

    def serves(self, cluster) -> bool:
        """Worker and ps tasks serve; the chief (coordinator) trains."""
        return cluster is not None and cluster.task_type in ("worker", "ps")

    def job(self, cluster):
        """On the chief: tells every worker and ps task at the end whether the run failed (their exit code)."""
        from tftrain.runtime.server import telling_servers

        return telling_servers(cluster)

    def check_model(self, compile_args: dict, overridden_steps: tuple) -> None:
        """Raises `ConfigError` for no loss, a loss per output, or a model's own `train_step` (never run here)."""
        loss = compile_args.get("loss")
        if loss is None:  # ps_training's step computes the compiled loss only
            raise ConfigError("The parameter-server loop trains on the compiled loss; this task gives none (loss=None, "
                              "a model with its own add_loss). Pass loss=..., or train it with another strategy "
                              "(e.g. multi_worker_mirrored).")
        if isinstance(loss, (Mapping, list, tuple)) or compile_args.get("loss_weights") is not None:
            raise ConfigError("The parameter-server loop takes one loss for the whole model, not one per output. "
                              "Train a multi-output model with another strategy (e.g. multi_worker_mirrored).")
        if "train_step" in overridden_steps:
            raise ConfigError("The parameter-server loop runs its own training step, so this model's train_step "
                              "would not run. Train it with another strategy (e.g. multi_worker_mirrored).")

    def compile(self, model, compile_args: dict, runtime) -> None:
        """Compiles optimizer and loss only: the loop updates metrics and schedules `tf.function`s itself."""
        self.check_model(compile_args, ())
        with runtime.strategy.scope():
            model.compile(optimizer=compile_args.get("optimizer"), loss=compile_args.get("loss"))

    def fit(self, model, train_data, *, epochs, steps_per_epoch, callbacks, verbose, validation_data=None,
            runtime=None, metrics=None, say=print, class_weight=None):
        """`ps_training.fit` on per-worker datasets (see `FitLoop.fit`); `class_weight` weighs the loss, not the
        metrics, as `Model.fit`. Under `--backup-every-steps N` the coordinator joins every N steps for the backup."""
        from tftrain.train.loops import ps_training
        from tftrain.train.loops.multi_worker import class_weighted

        with runtime.strategy.scope():
            metrics = metric_objects(metrics, model.loss)
        weigh = class_weighted(class_weight)
        return ps_training.fit(
            model, lambda ctx: weigh(train_data(ctx)).repeat(), epochs=epochs, steps_per_epoch=steps_per_epoch,
            metrics=metrics, callbacks=callbacks, verbose=verbose,
            steps_per_execution=runtime.requested_steps_per_execution, sync_every=_backup_every(callbacks),
        )

    def evaluate(self, model, dataset, metrics=None) -> dict:
        """`ps_training.evaluate` on the chief (every example exactly once)."""
        from tftrain.train.loops import ps_training

        return ps_training.evaluate(model, dataset, metric_objects(metrics, model.loss))
