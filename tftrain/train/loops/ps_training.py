"""A Keras training loop for `ParameterServerStrategy` (which Keras 3's `fit` does not drive) with `ClusterCoordinator`,
as https://www.tensorflow.org/tutorials/distribute/parameter_server_training. Steps run asynchronously, so batch
hooks fire once an epoch (or every `sync_every` steps). No `variable_partitioner`: Keras 3 colocates slot variables,
which a `ShardedVariable` refuses. Keras 3's `assign_add` reads then assigns, losing concurrent worker updates, so
the scheduled function is traced under `atomic_assign_add`.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

import keras
import tensorflow as tf

from tftrain import _compat
from tftrain.errors import check_int


def _check_model(model: keras.Model) -> None:
    if getattr(model, "optimizer", None) is None:
        raise ValueError(
            f"Model {model.name!r} must be compiled with an optimizer inside strategy.scope() before "
            "parameter-server training. Call model.compile(optimizer=..., loss=...)."
        )
    optimizers = (model.optimizer, getattr(model.optimizer, "inner_optimizer", None))
    if any(getattr(o, "accumulation_steps", 1) > 1 or getattr(o, "gradient_accumulation_steps", None)
           for o in optimizers if o is not None):
        raise ValueError("Gradient accumulation is not supported by parameter-server training (workers apply their "
                         "steps asynchronously). Compile with an optimizer that updates every step.")


def atomic_assign_add():
    """While open, Keras variables add and subtract with one atomic TensorFlow op."""
    return _compat.atomic_assign_add()


def _build_compiled(model: keras.Model, dataset: tf.data.Dataset) -> None:
    """Creates the compiled loss's and metrics' variables (in the strategy's scope, so on the parameter servers)
    from one batch of `dataset`, on the coordinator: a scheduled function cannot create variables."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(next(iter(dataset.take(1))))
    y_pred = model(x, training=False)
    if getattr(model, "loss", None) is not None:  # an own train_step may compute its loss itself
        model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False)
    model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
    model.reset_metrics()


def fit(
    model: keras.Model,
    per_worker_dataset_fn: Callable,
    *,
    epochs: int,
    steps_per_epoch: int,
    callbacks: Sequence[keras.callbacks.Callback] = (),
    initial_epoch: int = 0,
    verbose: int = 1,
    steps_per_execution: int = 1,
    strategy: Optional[tf.distribute.Strategy] = None,
    coordinator: Optional[tf.distribute.coordinator.ClusterCoordinator] = None,
    sync_every: Optional[int] = None,
    validation_data: Optional[tf.data.Dataset] = None,
) -> keras.callbacks.History:
    """Trains a compiled Keras model with `ParameterServerStrategy`: the workers run the model's own `train_step`
    (its compiled losses, loss weights and metrics per output, `add_loss`, or an override).

    Args:
        model: built and compiled in the strategy's scope; its loss must average over the batch (Keras's default).
        per_worker_dataset_fn: `(InputContext) -> tf.data.Dataset` on every worker: shard, batch per replica, repeat.
            The coordinator also reads one batch of it, to create the metrics' variables.
        steps_per_epoch: optimizer steps per epoch, all workers together.
        initial_epoch: a restoring callback may move it further. Defaults to 0.
        verbose: 0 silent, else one progress line per epoch. Defaults to 1.
        steps_per_execution: training steps per scheduled function. Defaults to 1.
        strategy, coordinator: Default to the model's strategy and a new `ClusterCoordinator`.
        sync_every: steps between the joins (each idles the workers) where batch hooks fire; a callback's
            `steps_done_in(epoch)` shortens a resumed epoch. Defaults to None (once an epoch).
        validation_data: batches evaluated on the chief at each epoch's end into `val_<name>` logs, as
            `Model.fit` names them. Defaults to None.

    Returns:
        The `keras.callbacks.History` of the epochs trained here.

    Raises:
        ValueError: an uncompiled model, a strategy not `ParameterServerStrategy`, or a count not positive.
    """
    _check_model(model)
    strategy = strategy or model.distribute_strategy
    if not isinstance(strategy, tf.distribute.ParameterServerStrategy):
        raise ValueError(
            f"fit() here drives ParameterServerStrategy; the model's strategy is {type(strategy).__name__}. "
            "Use model.fit for other strategies."
        )
    for name, value in (("epochs", epochs), ("steps_per_epoch", steps_per_epoch),
                        ("steps_per_execution", steps_per_execution)):
        check_int(value, name)
    check_int(sync_every, "sync_every", none_ok=True)
    coordinator = coordinator or tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        # Slot variables must exist before a callback restores them, and cannot be made in the scheduled function.
        model.optimizer.build(model.trainable_variables)
        _build_compiled(model, per_worker_dataset_fn(tf.distribute.InputContext()))
    iterator = iter(coordinator.create_per_worker_dataset(
        strategy.distribute_datasets_from_function(per_worker_dataset_fn)
    ))

    worker_fn = _worker_function(model, strategy)
    test_fn = _test_function(model, validation_data) if validation_data is not None else None
    history = keras.callbacks.History()
    callback_list = keras.callbacks.CallbackList(
        [*callbacks, history], add_history=False, add_progbar=verbose != 0,
        model=model, verbose=verbose, epochs=epochs, steps=steps_per_epoch,
    )
    model.stop_training = False
    callback_list.on_train_begin()
    initial_epoch = _compat.initial_epoch(model, initial_epoch)  # a restoring callback's epoch
    logs = {}
    run = functools.partial(_run_steps, coordinator, worker_fn, iterator, steps_per_execution)
    for epoch in range(initial_epoch, epochs):
        callback_list.on_epoch_begin(epoch)
        steps = steps_per_epoch - max((c.steps_done_in(epoch) for c in callbacks if hasattr(c, "steps_done_in")),
                                      default=0)
        logs = _run_epoch(run, steps, sync_every or steps, callback_list, model)
        if validation_data is not None:
            logs = {**logs, **{f"val_{k}": v for k, v in _evaluated(model, test_fn, validation_data).items()}}
        callback_list.on_epoch_end(epoch, logs)
        if model.stop_training:
            break
    callback_list.on_train_end(logs)
    return history


def _worker_function(model, strategy):
    @tf.function
    def worker_fn(iterator, num_steps):  # returns what the last step reports, as `fit` logs it
        for _ in tf.range(num_steps - 1):
            strategy.run(model.train_step, args=(next(iterator),))
        return strategy.run(model.train_step, args=(next(iterator),))

    return worker_fn


def _run_epoch(run_steps, steps: int, sync_every: int, callback_list, model) -> dict:
    """Runs `steps` in chunks of `sync_every`, firing `on_train_batch_end` after each; returns the last logs."""
    model.reset_metrics()
    done, logs = 0, {}
    while done < steps and not (done and model.stop_training):
        chunk = min(sync_every, steps - done)
        reported = run_steps(chunk)
        done += chunk
        logs = _logs(model, reported)
        callback_list.on_train_batch_end(done - 1, logs)
    return logs


def _logs(model, reported=None) -> dict:
    """The compiled metrics' results (every worker's steps); where the last step (`reported`, a `RemoteValue`)
    reports other figures (an own `train_step`), those, as `fit` would log them."""
    from tftrain.callbacks.scalar_logs import scalar_logs

    def flat(values: dict) -> dict:  # nested dicts (a `compile_metrics` result) as `fit`'s logs flatten them
        out = {}
        for name, value in values.items():
            out.update(flat(value) if isinstance(value, dict) else {name: value})
        return out

    logs = model.get_metrics_result()
    own = reported.fetch() if reported is not None else None
    if isinstance(own, dict) and set(flat(own)) != set(logs):
        logs = flat(own)
    return {name: float(value) for name, value in scalar_logs(logs).items()}


def _run_steps(coordinator, worker_fn, iterator, steps_per_execution: int, steps: int):
    """Schedules `steps` in executions of `steps_per_execution`, waits for them; returns the last's `RemoteValue`."""
    done, last = 0, None
    with atomic_assign_add():  # the first `schedule` traces `worker_fn`
        while done < steps:
            n = min(steps_per_execution, steps - done)
            last = coordinator.schedule(worker_fn, args=(iterator, tf.constant(n)))
            done += n
    coordinator.join()
    return last


def evaluate(model: keras.Model, dataset: tf.data.Dataset) -> dict:
    """Evaluates a parameter-server model on the chief with its own `test_step`, so every example counts once.

    Args:
        dataset: batches of `(x, y)` or `(x, y, sample_weight)`, not distributed.

    Returns:
        `{"loss": float, <metric name>: float, ...}` as `Model.evaluate` names them, over all examples.

    Raises:
        ValueError: the model is not compiled.
    """
    _check_model(model)
    return _evaluated(model, _test_function(model, dataset), dataset)


def _test_function(model, dataset: tf.data.Dataset):
    """`model.test_step` traced once for `dataset`'s batches, their batch dimension unknown as `evaluate` traces it
    (Keras weighs each output's loss by the static batch size, so a partial last batch weighs as `evaluate`'s)."""
    return tf.function(model.test_step, input_signature=[dataset.element_spec])


def _evaluated(model, test_step, dataset) -> dict:
    model.reset_metrics()
    for batch in dataset:
        test_step(batch)
    return _logs(model)
