"""A train function that ends each epoch itself, so that Keras can keep one data iterator for the run.

On finite data Keras makes a new iterator at each epoch's start and another at its end (for a next
pass, which the next epoch does not use), and tf.data builds the whole pipeline each time (its
functions, its parallel map and prefetch threads): 10 ms at each end for tftrain's array pipeline,
measured on 2 CPU cores, 30 ms an epoch in all against 9 ms for the same 64 steps on one iterator.
On data that repeats forever Keras keeps its iterator, but runs every execution whole, past an
epoch's end (keras-team/keras#20861), when the epoch is not a whole number of executions.
`EpochEnds` runs Keras's own train function with its count of steps read from a variable
(`StepCount`, which the `ExecutionTrial` shares too), set for the last call of each epoch to the
steps left, so the training data can repeat (`tftrain.train.loops.fit.one_iterator`).

Source: keras/src/backend/tensorflow/trainer.py (`_make_function`) and
keras/src/trainers/epoch_iterator.py in Keras 3.
"""

from __future__ import annotations

import functools

from tftrain import _compat


@functools.total_ordering
class StepCount:
    """The steps per execution Keras's train function loops over, read from a `tf.Variable` when it runs.

    Keras's loop (`keras/src/backend/tensorflow/trainer.py`, `_make_function`) compares
    `model.steps_per_execution` with Python ints while tracing (`== 1`, `min(unrolled, ...)`) and
    converts it to a tensor inside `tf.while_loop`'s condition. Set as `model.steps_per_execution`
    while Keras traces, this object answers the Python comparisons as `largest` (the loop is
    built for up to that many steps) and converts to a read of `variable`, so one trace runs any
    count from 1 to `largest`: assign the count before each call (`set`).

    Args:
        largest: the largest count the function will run (>= 2), an int.
    """

    _registered = False

    def __init__(self, largest: int):
        import tensorflow as tf

        if not StepCount._registered:
            _compat.register_tensor_conversion(
                StepCount, lambda value, dtype=None: tf.cast(value.variable.read_value(), dtype or tf.int32))
            StepCount._registered = True
        self.largest = int(largest)
        with tf.init_scope():
            self.variable = tf.Variable(self.largest, dtype=tf.int32, trainable=False, name="steps_per_execution")
        self.value = self.largest

    def set(self, count: int) -> None:
        """Makes the next calls run `count` steps (1 <= count <= `largest`)."""
        if count != self.value:
            self.variable.assign(count)
            self.value = count

    def __int__(self) -> int:
        return self.largest

    __index__ = __int__

    def __eq__(self, other):
        return self.largest == other

    def __lt__(self, other):
        return self.largest < other

    __hash__ = None


class EpochEnds:
    """Keras's train function at the model's `steps_per_execution`, whose last call of each epoch runs
    only the steps the epoch has left.

    Args:
        model: a compiled Keras model of the TensorFlow backend (`_make_function`),
            not `run_eagerly`, its `steps_per_execution` >= 2, its train function
            not built yet (it is traced at the first call, as Keras's own).
        steps_per_epoch: training steps (batches) an epoch, >= 1.

    Attributes:
        ends_epochs: True (what `FitLoop.fit` asks a train function).
        steps_per_epoch: as given.

    Example:
        >>> ends = EpochEnds(model, steps_per_epoch=125).install()
        >>> model.fit(dataset.repeat(), steps_per_epoch=125, epochs=10, callbacks=[ends.epoch_callback()])
    """

    ends_epochs = True

    def __init__(self, model, steps_per_epoch: int):
        self.model, self.steps_per_epoch, self.epoch_steps = model, int(steps_per_epoch), 0
        self.steps_per_execution = int(model.steps_per_execution)
        self.count = StepCount(self.steps_per_execution)
        self.function = _compat.make_function(model, model.train_step)

    @staticmethod
    def applies(model, batches: int) -> bool:
        """Whether an epoch of `batches` ends inside an execution of `model`'s train function and
        `EpochEnds` can end it (Keras's TensorFlow trainer, graph or XLA, its train function not built:
        one built already, such as a remembered XLA choice's compiled one, is kept)."""
        spe = int(getattr(model, "steps_per_execution", 1) or 1)
        return (spe > 1 and batches > 0 and batches % spe != 0 and model.train_function is None
                and not model.run_eagerly and _compat.make_function_available(model))

    def install(self) -> "EpochEnds":
        """Makes this the model's `train_function`; returns self."""
        self.model.train_function = self
        return self

    def epoch_callback(self):
        """A Keras callback that marks each epoch's start (a resumed epoch is ended early by `StepBackup`,
        so the steps run do not say where the next begins)."""
        return epoch_start_callback(self)

    def __call__(self, iterator):
        """Runs `steps_per_execution` steps from `iterator`, or the epoch's last steps where fewer are left;
        the logs."""
        steps = steps_this_call(self, self.steps_per_execution)
        self.count.set(steps)
        self.model.steps_per_execution = self.count  # read when Keras traces the function
        try:
            logs = self.function(iterator)
        finally:
            self.model.steps_per_execution = self.steps_per_execution
        self.epoch_steps += steps
        return logs


def steps_this_call(function, steps_per_execution: int) -> int:
    """The steps the next call of `function`, which ends epochs (its `steps_per_epoch` and `epoch_steps`,
    the steps run so far in this epoch), runs: `steps_per_execution`, or the epoch's last steps where fewer
    are left. An epoch whose steps all ran ended without its marker callback: the count starts again."""
    if function.epoch_steps >= function.steps_per_epoch:
        function.epoch_steps = 0
    return min(steps_per_execution, function.steps_per_epoch - function.epoch_steps)


def epoch_start_callback(function):
    """A Keras callback that sets `function.epoch_steps` to 0 at each epoch's start."""
    import keras

    class EpochStart(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            function.epoch_steps = 0

    return EpochStart()
