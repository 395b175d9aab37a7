"""Counting real optimizer steps from inside Keras callbacks.

Keras 3 calls the batch hooks once per execution: with `steps_per_execution=N` one
`on_train_batch_end` covers up to N optimizer steps, and the last execution of an
epoch may cover fewer. The optimizer's `iterations` counter is the ground truth.
Reading it also waits for the execution to finish, so a clock read right after it
times finished work, not just dispatched work.
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


def steps_per_execution(model) -> int:
    """The model's `steps_per_execution` (1 when unset)."""
    return max(1, int(getattr(model, "steps_per_execution", 1) or 1))
