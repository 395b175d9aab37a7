"""Counting real optimizer steps from inside Keras callbacks.

Keras 3 calls the batch hooks once per execution: with `steps_per_execution=N` one
`on_train_batch_end` covers up to N optimizer steps, and the last execution of an
epoch may cover fewer. The optimizer's `iterations` counter is the ground truth,
except under dynamic loss scaling (mixed_float16), whose skipped steps it misses
(`skips_steps`). Reading it also waits for the execution to finish, so a clock
read right after it times finished work.
"""

from __future__ import annotations

from tftrain.errors import ConfigError


def optimizer_steps(model) -> int:
    """Optimizer steps the model has run so far (`model.optimizer.iterations`).

    Steps skipped by dynamic loss scaling (non-finite gradients under
    `mixed_float16`) do not increment the counter, so they are not counted.

    Raises:
        ConfigError: when the model is not compiled with an optimizer.
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        raise ConfigError("The model has no optimizer. Call model.compile(optimizer=...) before fit().")
    return int(optimizer.iterations.numpy())


def train_steps(model) -> int:
    """Training steps (batches, one per `train_step`) the model has run so far.

    `optimizer_steps`, except under gradient accumulation, where one optimizer
    step takes N micro-batches: then the micro-batch counter, so that the hooks'
    step indices, examples/sec and profile windows count every batch. That
    counter is `micro_steps` of `tftrain.train.accumulation.GradientAccumulationOptimizer`
    (also inside a `LossScaleOptimizer`), or the raw iteration counter of a Keras
    optimizer built with `gradient_accumulation_steps`.

    Raises:
        ConfigError: when the model is not compiled with an optimizer.
    """
    optimizer = getattr(model, "optimizer", None)
    while optimizer is not None:
        if getattr(optimizer, "micro_steps", None) is not None:
            return int(optimizer.micro_steps.numpy())
        if getattr(optimizer, "gradient_accumulation_steps", None):
            from tftrain import _compat

            return _compat.micro_batches_seen(optimizer)  # Keras's own accumulation: `iterations` is floor-divided
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return optimizer_steps(model)


def steps_per_execution(model) -> int:
    """The model's `steps_per_execution` (1 when unset)."""
    return max(1, int(getattr(model, "steps_per_execution", 1) or 1))



def skips_steps(model) -> bool:
    """True when the optimizer may skip updates (dynamic loss scaling, mixed_float16).

    A `LossScaleOptimizer` does not advance `iterations` on a step whose
    gradients were not finite, so `iterations` then under-counts the steps that ran.
    """
    optimizer = getattr(model, "optimizer", None)
    return hasattr(optimizer, "inner_optimizer") and hasattr(optimizer, "dynamic_scale")
