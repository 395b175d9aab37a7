"""Gradient accumulation: one optimizer step per N micro-batches, under any `tf.distribute` strategy. Keras's own
`gradient_accumulation_steps` fails on 2+ replicas (its update branch runs in the replica context, where `merge_call`
is not allowed: keras-team/keras#20582); this one branches cross-replica, as `LossScaleOptimizer`, all-reducing once
per optimizer step."""

from __future__ import annotations

import contextlib

import keras
import tensorflow as tf

from tftrain.errors import ConfigError, check_int


@keras.saving.register_keras_serializable(package="tftrain")
class GradientAccumulationOptimizer(keras.optimizers.Optimizer):
    """Updates the weights once every `accumulation_steps` calls (`apply`: one micro-batch), with the mean gradient:
    with a batch-mean loss (Keras's default), N micro-batches of B give one update of N x B. The inner optimizer's
    `iterations` (schedule, weight decay, clipping) count optimizer steps; `micro_steps` counts micro-batches.
    Checkpoints keep the first replica's accumulators, so save at whole optimizer steps.

    Args:
        inner_optimizer: the Keras optimizer that makes each update.
        accumulation_steps: micro-batches per optimizer step, an int >= 1.
        name: the optimizer's name. Defaults to None (Keras names it).

    Raises:
        ConfigError: `accumulation_steps` is not an int >= 1, or the inner optimizer accumulates itself.

    Example:
        >>> optimizer = GradientAccumulationOptimizer(keras.optimizers.Adam(1e-3), accumulation_steps=4)
    """

    def __init__(self, inner_optimizer, accumulation_steps: int, name=None):
        check_accumulation_steps(accumulation_steps)
        if getattr(inner_optimizer, "gradient_accumulation_steps", None):
            raise ConfigError("The inner optimizer accumulates gradients itself (gradient_accumulation_steps="
                              f"{inner_optimizer.gradient_accumulation_steps}); set accumulation in one place only.")
        super().__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = inner_optimizer
        self.accumulation_steps = int(accumulation_steps)

    def build(self, var_list):
        """Creates the micro-step counter and accumulators; builds the inner optimizer."""
        self.micro_steps = self.add_variable(shape=(), dtype="int", initializer="zeros",
                                             aggregation="only_first_replica", name="micro_steps")
        self._accumulators = [self.add_variable_from_reference(v, name="gradient_accumulator") for v in var_list]
        self.inner_optimizer.build(var_list)
        super().build(var_list)

    @property
    def variables(self):
        return self._variables + self.inner_optimizer.variables

    @property
    def iterations(self):
        """Optimizer steps taken: the inner optimizer's `iterations`."""
        return self.inner_optimizer.iterations

    @property
    def learning_rate(self):
        """The inner optimizer's learning rate."""
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value):
        self.inner_optimizer.learning_rate = value

    def scale_loss(self, loss):
        return self.inner_optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list):
        """The inner optimizer's (EMA: copies the averages into the model)."""
        self.inner_optimizer.finalize_variable_values(var_list)

    def apply(self, grads, trainable_variables=None):
        """Adds one micro-batch's gradients; every N-th call updates. Call in a replica context."""
        if not self.built:
            with keras.name_scope(self.name):
                self.build(trainable_variables)
            self.built = True
        variables = list(self._trainable_variables if trainable_variables is None else trainable_variables)
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        accumulators = [self._accumulators[self._get_variable_index(v)] for v in variables]
        # Keras's test: True without a strategy, and under XLA on GPUs.
        if tf.__internal__.distribute.strategy_supports_no_merge_call():
            self._replica_step(grads, accumulators, variables)
        else:
            tf.distribute.get_replica_context().merge_call(self._step, args=(grads, accumulators, variables))

    def _is_update_step(self):
        return tf.equal((self.micro_steps.value + 1) % self.accumulation_steps, 0)

    def _replica_step(self, grads, accumulators, variables):
        """Without merge_call: update on the N-th micro-batch, else accumulate."""

        def update():
            self._apply_mean(grads, accumulators, variables)
            for acc in accumulators:
                acc.assign(tf.zeros_like(acc.value))

        def accumulate():
            for grad, acc in zip(grads, accumulators):
                if grad is not None:
                    _add(acc, grad)  # per-replica accumulator: updates locally

        tf.cond(self._is_update_step(), update, accumulate)
        self.micro_steps.assign_add(1)

    def _step(self, distribution, grads, accumulators, variables):
        """Cross-replica: update on the N-th micro-batch, else accumulate (the branch holds no merge_call)."""

        def update():
            distribution.extended.call_for_each_replica(self._apply_mean, args=(grads, accumulators, variables))
            for acc in accumulators:
                acc.assign(tf.zeros_like(acc.value))

        def accumulate():
            for grad, acc in zip(grads, accumulators):
                if grad is not None:
                    distribution.extended.update(acc.value, _add, args=(grad,), group=False)

        tf.cond(self._is_update_step(), update, accumulate)
        self.micro_steps.assign_add(1)

    def _apply_mean(self, grads, accumulators, variables):
        """Replica context: the inner optimizer's update with this replica's mean gradient."""
        n = self.accumulation_steps
        mean = [None if g is None else (g + tf.cast(acc.value, g.dtype)) / n for g, acc in zip(grads, accumulators)]
        self.inner_optimizer.apply(mean, variables)

    def get_config(self):
        return {"name": self.name, "accumulation_steps": self.accumulation_steps,
                "inner_optimizer": keras.saving.serialize_keras_object(self.inner_optimizer)}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("inner_optimizer"), custom_objects=custom_objects)
        return cls(inner, **config)


def _add(accumulator, grad):
    return accumulator.assign_add(tf.cast(grad, accumulator.dtype))


def check_accumulation_steps(steps) -> None:
    """Raises `ConfigError` unless `steps` is an int >= 1."""
    check_int(steps, "gradient_accumulation_steps", error=ConfigError)


def accumulate_gradients(optimizer, steps: int):
    """`optimizer` (or its name) updating once every `steps` micro-batches (itself when 1); a `LossScaleOptimizer`
    stays outermost, unscaling each micro-batch first. `ConfigError` on `steps` < 1 or one that accumulates itself."""
    check_accumulation_steps(steps)
    if steps == 1:
        return optimizer
    optimizer = keras.optimizers.get(optimizer)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return keras.optimizers.LossScaleOptimizer(
            GradientAccumulationOptimizer(optimizer.inner_optimizer, steps), initial_scale=optimizer.initial_scale,
            dynamic_growth_steps=optimizer.dynamic_growth_steps)
    return GradientAccumulationOptimizer(optimizer, steps)


@contextlib.contextmanager
def saved_with_inner_optimizer(model):
    """Within the block, `model`'s optimizer is the wrapped one (a `LossScaleOptimizer` around it kept), so
    `model.save` writes a `model.keras` plain Keras loads, without the accumulators (zero after each step)."""
    holder = model
    optimizer = getattr(model, "optimizer", None)
    if isinstance(getattr(optimizer, "inner_optimizer", None), GradientAccumulationOptimizer):
        holder, optimizer = optimizer, optimizer.inner_optimizer  # LossScaleOptimizer(wrapper)
    if not isinstance(optimizer, GradientAccumulationOptimizer):
        yield model
        return
    attribute = "optimizer" if holder is model else "inner_optimizer"
    # Keras saves the optimizer given to compile(), from its compile config.
    from tftrain import _compat

    compile_config = _compat.compile_config(model)
    compiled_with = compile_config.get("optimizer")
    setattr(holder, attribute, optimizer.inner_optimizer)
    if compiled_with is optimizer:
        compile_config["optimizer"] = optimizer.inner_optimizer
    try:
        yield model
    finally:
        setattr(holder, attribute, optimizer)
        if compiled_with is optimizer:
            compile_config["optimizer"] = optimizer
