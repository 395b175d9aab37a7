"""A Keras training loop for `ParameterServerStrategy`, driven by `ClusterCoordinator`.

Keras 3's `Model.fit` does not drive `tf.distribute.ParameterServerStrategy`, so
this module provides the loop TensorFlow's parameter-server tutorial prescribes,
around a Keras model, its Keras optimizer and Keras metrics:

* the model is built and compiled (optimizer, loss) inside `strategy.scope()` on
  the chief, so its variables live on the ps tasks (placed round-robin);
* the chief (coordinator) `schedule`s a `tf.function` that runs
  `steps_per_execution` training steps on whichever worker is free, reading a
  per-worker dataset (`ClusterCoordinator.create_per_worker_dataset`); the workers
  update the variables asynchronously;
* at each epoch end the coordinator `join`s, reads the metrics (whose variables
  live on the ps tasks too) and runs Keras callbacks (`History`, progress bar,
  `BackupAndRestore`, `TensorBoard`, `EarlyStopping`, ...). Batch-level hooks fire
  once per epoch, after its last step, because steps run asynchronously on the
  workers; given `sync_every`, the coordinator also joins every that many steps and
  fires them there (a mid-epoch checkpoint: `tftrain.callbacks.StepBackup`, whose
  resumed epoch then runs only its remaining steps);
* `evaluate` runs on the chief, reading the variables from the ps tasks, so every
  test example is seen exactly once.

`variable_partitioner` (sharding one variable across ps tasks) is not used:
Keras 3's optimizer creates its slot variables with
`strategy.extended.colocate_vars_with(variable)`, which a `ShardedVariable`
refuses ("ShardedVariable doesn't support being used as a reference"), and
`GradientTape` cannot watch a Keras variable that wraps one. Whole variables are
spread over the ps tasks instead.

Keras 3 adds to a variable by reading it and assigning the sum (`Variable.assign_add` is
`assign(self + value)`), which loses updates when two workers add to one ps variable at
once: with two workers `optimizer.iterations` counted 104-111 of 128 steps and an epoch
reported `accuracy: 1.0022` (its correct count lost more than its total). The scheduled
function is therefore traced with `atomic_assign_add` in force, so that every addition it
makes (the step counter, the metrics' totals and counts, the optimizer's slots) is
TensorFlow's own `AssignAddVariableOp`, applied atomically on the ps task.

Source: https://www.tensorflow.org/tutorials/distribute/parameter_server_training
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

import keras
import tensorflow as tf

from tftrain import _compat
from tftrain.errors import check_int


def _check_model(model: keras.Model) -> None:
    if getattr(model, "optimizer", None) is None or getattr(model, "loss", None) is None:
        raise ValueError(
            f"Model {model.name!r} must be compiled with an optimizer and a loss inside "
            "strategy.scope() before parameter-server training. Call model.compile(optimizer=..., loss=...)."
        )
    optimizers = (model.optimizer, getattr(model.optimizer, "inner_optimizer", None))
    if any(getattr(o, "accumulation_steps", 1) > 1 or getattr(o, "gradient_accumulation_steps", None)
           for o in optimizers if o is not None):
        raise ValueError("Gradient accumulation is not supported by parameter-server training (workers apply their "
                         "steps asynchronously). Compile with an optimizer that updates every step.")


def atomic_assign_add():
    """While open, Keras variables add and subtract with one atomic TensorFlow op (`_compat.atomic_assign_add`)."""
    return _compat.atomic_assign_add()


def _loss(model: keras.Model, y, y_pred, sample_weight=None):
    """The compiled loss plus the model's regularization losses: a `keras.losses.Loss` object reduces
    itself (weighing by `sample_weight`), a loss function's per-example values are weighed and averaged
    over the batch (Keras's default reduction, "sum_over_batch_size")."""
    loss_fn = keras.losses.get(model.loss) if isinstance(model.loss, str) else model.loss
    if isinstance(loss_fn, keras.losses.Loss):  # the mean: a reduction of "none" gives one value per example
        loss = keras.ops.mean(loss_fn(y, y_pred, sample_weight=sample_weight))
    else:
        values = loss_fn(y, y_pred)  # one value per example (per time step, ...)
        if sample_weight is not None:
            weights = tf.cast(sample_weight, values.dtype)
            for _ in range(values.shape.rank - weights.shape.rank):
                weights = weights[..., None]
            values = values * weights
        loss = keras.ops.mean(values)
    if model.losses:
        loss = loss + tf.add_n([tf.cast(x, loss.dtype) for x in model.losses])
    return loss


def fit(
    model: keras.Model,
    per_worker_dataset_fn: Callable,
    *,
    epochs: int,
    steps_per_epoch: int,
    metrics: Sequence[keras.metrics.Metric] = (),
    callbacks: Sequence[keras.callbacks.Callback] = (),
    initial_epoch: int = 0,
    verbose: int = 1,
    steps_per_execution: int = 1,
    strategy: Optional[tf.distribute.Strategy] = None,
    coordinator: Optional[tf.distribute.coordinator.ClusterCoordinator] = None,
    sync_every: Optional[int] = None,
) -> keras.callbacks.History:
    """Trains a compiled Keras model with `ParameterServerStrategy`.

    Args:
        model: a Keras model built and compiled (optimizer and loss) inside the
            strategy's scope. The loss must average over the batch (the Keras
            default, `"sum_over_batch_size"`): each step runs one whole batch on
            one worker.
        per_worker_dataset_fn: function `(tf.distribute.InputContext) ->
            tf.data.Dataset` run on every worker; it should shard by
            `input_context.input_pipeline_id`, batch by
            `input_context.get_per_replica_batch_size(global_batch_size)` and
            repeat forever (workers take steps as they become free, so one may
            read more than its share in an epoch).
        epochs: last epoch to train (as in `Model.fit`).
        steps_per_epoch: optimizer steps per epoch, all workers together.
        metrics: Keras metrics updated on the workers with `(y, y_pred)`;
            create them inside `strategy.scope()`. Their names become the log
            keys. Defaults to none (only `"loss"` is logged).
        callbacks: Keras callbacks. Defaults to none.
        initial_epoch: epoch to start from (e.g. restored from a checkpoint);
            `BackupAndRestore` may move it further. Defaults to 0.
        verbose: 0 silent, 1 or 2: one progress line per epoch. Defaults to 1.
        steps_per_execution: training steps per scheduled function; larger values
            cut the coordinator's per-step RPC overhead. Defaults to 1.
        strategy: the `ParameterServerStrategy`. Defaults to the model's
            (`model.distribute_strategy`).
        coordinator: a `ClusterCoordinator` to reuse. Defaults to a new one.
        sync_every: optimizer steps between the joins at which batch-level hooks
            fire within an epoch (`on_train_batch_end` with the batch index this
            process reached in the epoch, and the metrics so far); each join
            waits for every scheduled step, so it costs the workers' idle time.
            A callback with `steps_done_in(epoch)` (`StepBackup` after a
            mid-epoch resume) makes that epoch run only its remaining steps.
            None fires them once an epoch, after its last step. Defaults to None.

    Returns:
        The `keras.callbacks.History` of the epochs trained here (`history.epoch`,
        `history.history["loss"]`, one list per metric name).

    Raises:
        ValueError: when the model is not compiled, the strategy is not a
            `ParameterServerStrategy`, or a count is not positive.

    Example:
        >>> with strategy.scope():
        ...     model = make_model()
        ...     model.compile(optimizer=keras.optimizers.Adam(), loss="sparse_categorical_crossentropy")
        ...     accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        >>> history = fit(model, dataset_fn, epochs=3, steps_per_epoch=468, metrics=[accuracy])
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
    metrics = list(metrics)
    with strategy.scope():
        # Slot variables must exist on the ps tasks before a callback (BackupAndRestore)
        # restores them, and cannot be created inside the scheduled function.
        model.optimizer.build(model.trainable_variables)
        loss_tracker = keras.metrics.Mean(name="loss")
    iterator = iter(coordinator.create_per_worker_dataset(
        strategy.distribute_datasets_from_function(per_worker_dataset_fn)
    ))

    worker_fn = _worker_function(model, strategy, loss_tracker, metrics)
    history = keras.callbacks.History()
    callback_list = keras.callbacks.CallbackList(
        [*callbacks, history], add_history=False, add_progbar=verbose != 0,
        model=model, verbose=verbose, epochs=epochs, steps=steps_per_epoch,
    )
    model.stop_training = False
    callback_list.on_train_begin()
    initial_epoch = _compat.initial_epoch(model, initial_epoch)  # a restoring callback's epoch, as Model.fit reads it
    logs = {}
    run = functools.partial(_run_steps, coordinator, worker_fn, iterator, steps_per_execution)
    for epoch in range(initial_epoch, epochs):
        callback_list.on_epoch_begin(epoch)
        steps = steps_per_epoch - max((c.steps_done_in(epoch) for c in callbacks if hasattr(c, "steps_done_in")),
                                      default=0)
        logs = _run_epoch(run, steps, sync_every or steps, (loss_tracker, *metrics), callback_list, model)
        callback_list.on_epoch_end(epoch, logs)
        if model.stop_training:
            break
    callback_list.on_train_end(logs)
    return history


def _worker_function(model, strategy, loss_tracker, metrics):
    """The scheduled `tf.function`: `num_steps` training steps on the worker that runs it."""
    optimizer = model.optimizer

    def train_step(batch):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)  # sample weights: a class_weight map
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = _loss(model, y, y_pred, sample_weight)
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        loss_tracker.update_state(loss, sample_weight=tf.shape(y)[0])
        for metric in metrics:
            metric.update_state(y, y_pred)

    @tf.function
    def worker_fn(iterator, num_steps):
        for _ in tf.range(num_steps):
            strategy.run(train_step, args=(next(iterator),))

    return worker_fn


def _run_epoch(run_steps, steps: int, sync_every: int, metrics, callback_list, model) -> dict:
    """Runs an epoch's `steps` in chunks of `sync_every`, firing `on_train_batch_end` after each chunk
    with the metrics so far (the last one's are the epoch's); a hook that sets `model.stop_training`
    ends the epoch there. Returns the last logs."""
    for metric in metrics:
        metric.reset_state()
    done, logs = 0, {}
    while done < steps and not (done and model.stop_training):
        chunk = min(sync_every, steps - done)
        run_steps(chunk)
        done += chunk
        logs = {m.name: float(m.result()) for m in metrics}
        callback_list.on_train_batch_end(done - 1, logs)
    return logs


def _run_steps(coordinator, worker_fn, iterator, steps_per_execution: int, steps: int) -> None:
    """Schedules `steps` training steps, `steps_per_execution` a closure, and waits for all of them."""
    done = 0
    with atomic_assign_add():  # the first `schedule` traces `worker_fn`
        while done < steps:
            n = min(steps_per_execution, steps - done)
            coordinator.schedule(worker_fn, args=(iterator, tf.constant(n)))
            done += n
    coordinator.join()


def evaluate(model: keras.Model, dataset: tf.data.Dataset, metrics: Sequence[keras.metrics.Metric] = ()) -> dict:
    """Evaluates a parameter-server model on the chief (the coordinator).

    The chief runs the forward pass itself, reading the variables from the ps
    tasks, so every example of `dataset` counts exactly once.

    Args:
        model: the compiled model (its loss is reported as `"loss"`).
        dataset: batches of `(x, y)` or `(x, y, sample_weight)`, not distributed.
        metrics: fresh Keras metrics created outside `strategy.scope()` (their
            variables then live on the chief). Defaults to none.

    Returns:
        `{"loss": float, <metric name>: float, ...}`, averaged over all examples.

    Raises:
        ValueError: when the model is not compiled.

    Example:
        >>> evaluate(model, test_ds, [keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
        {'loss': 0.071, 'accuracy': 0.9779}
    """
    _check_model(model)
    loss_tracker = keras.metrics.Mean(name="loss")
    metrics = list(metrics)

    @tf.function
    def eval_step(batch):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
        y_pred = model(x, training=False)
        loss_tracker.update_state(_loss(model, y, y_pred, sample_weight), sample_weight=tf.shape(y)[0])
        for metric in metrics:
            metric.update_state(y, y_pred, sample_weight=sample_weight)

    for batch in dataset:
        eval_step(batch)
    return {m.name: float(m.result()) for m in (loss_tracker, *metrics)}
