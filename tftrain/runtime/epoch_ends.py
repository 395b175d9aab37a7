"""A train function that ends each epoch itself, so that Keras can keep one data iterator for the run.

On finite data Keras makes new iterators at each epoch's start and end, and tf.data rebuilds the
whole pipeline each time; on data that repeats forever it keeps one, but runs every execution
whole, past an epoch's end (keras-team/keras#20861). `EpochEnds` runs Keras's train function with
its step count read from a variable (`StepCount`), set for each epoch's last call to the steps
left, so the data can repeat (`tftrain.train.loops.fit.one_iterator`).

Source: Keras 3, keras/src/backend/tensorflow/trainer.py (`_make_function`), trainers/epoch_iterator.py.
"""

from __future__ import annotations

import functools

from tftrain import _compat


@functools.total_ordering
class StepCount:
    """The steps per execution Keras's train function loops over, read from a `tf.Variable` when it runs.

    Set as `model.steps_per_execution` while Keras traces, it compares with Python ints as `largest`
    (the loop is built for that many steps) and converts to a tensor as a read of `variable`, so one
    trace runs any count from 1 to `largest` (>= 2): `set` it before each call.
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
        model: a compiled Keras model of the TensorFlow backend, not `run_eagerly`, its
            `steps_per_execution` >= 2 and its train function not built yet.
        steps_per_epoch: training steps (batches) an epoch, >= 1.

    Example:
        >>> ends = EpochEnds(model, steps_per_epoch=125).install()
        >>> model.fit(dataset.repeat(), steps_per_epoch=125, epochs=10, callbacks=[ends.epoch_callback()])
    """

    ends_epochs = True  # what FitLoop.fit asks a train function

    def __init__(self, model, steps_per_epoch: int):
        self.model, self.steps_per_epoch, self.epoch_steps = model, int(steps_per_epoch), 0
        self.steps_per_execution = int(model.steps_per_execution)
        self.count = StepCount(self.steps_per_execution)
        self.function = _compat.make_function(model, model.train_step)

    @staticmethod
    def applies(model, batches: int) -> bool:
        """Whether an epoch of `batches` ends inside an execution and `EpochEnds` can end it (a train
        function built already, e.g. a remembered XLA choice's, is kept)."""
        spe = int(getattr(model, "steps_per_execution", 1) or 1)
        return (spe > 1 and batches > 0 and batches % spe != 0 and model.train_function is None
                and not model.run_eagerly and _compat.make_function_available(model))

    def install(self) -> "EpochEnds":
        """Makes this the model's `train_function`; returns self."""
        self.model.train_function = self
        return self

    def epoch_callback(self):
        """A callback marking each epoch's start (a resumed epoch ends early, so step counts cannot tell)."""
        return epoch_start_callback(self)

    def __call__(self, iterator):
        """Runs `steps_per_execution` steps, or the epoch's last steps where fewer are left; returns the logs."""
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
    """The steps `function`'s next call runs: `steps_per_execution`, or fewer at its epoch's end. A full
    epoch whose start callback did not run starts the count again."""
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
