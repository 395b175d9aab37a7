"""Counting real optimizer steps in Keras callbacks, whose batch hooks run once per execution. The optimizer's
`iterations` is the truth, except steps dynamic loss scaling skips (`skips_steps`); reading it waits for the
execution to finish, so a clock read right after it times finished work."""

from __future__ import annotations

from typing import Optional

from tftrain.errors import ConfigError


def optimizer_steps(model) -> int:
    """`model.optimizer.iterations` (steps skipped by dynamic loss scaling not counted): what a checkpoint of
    the model holds, not the optimizers its own `train_step` may hold (`held_steps`).

    Raises:
        ConfigError: the model is not compiled with an optimizer.
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        raise ConfigError("The model has no optimizer. Call model.compile(optimizer=...) before fit().")
    return int(optimizer.iterations.numpy())


def held_steps(model) -> Optional[int]:
    """When the compiled optimizer has not stepped and the model's `train_step` applies optimizers it holds
    (`held_optimizers`, a GAN's two): the fewest steps one of those took (where a critic steps several times
    a batch, the generator's counts the batches); else None."""
    from tftrain.runtime.execution_probe import held_optimizers

    compiled = getattr(model, "optimizer", None)
    if compiled is not None and int(compiled.iterations.numpy()):
        return None
    counts = [int(o.iterations.numpy()) for o in held_optimizers(model).values()]
    return min((c for c in counts if c), default=None)


def train_steps(model) -> int:
    """Batches run so far: `optimizer_steps`, or the micro-batch count under gradient accumulation (ours or Keras's).

    Raises:
        ConfigError: the model is not compiled with an optimizer.
    """
    optimizer = getattr(model, "optimizer", None)
    while optimizer is not None:
        if getattr(optimizer, "micro_steps", None) is not None:
            return int(optimizer.micro_steps.numpy())
        if getattr(optimizer, "gradient_accumulation_steps", None):
            from tftrain import _compat

            return _compat.micro_batches_seen(optimizer)  # Keras's: `iterations` is floor-divided
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return optimizer_steps(model)


def steps_per_execution(model) -> int:
    """The model's `steps_per_execution` (1 when unset)."""
    return max(1, int(getattr(model, "steps_per_execution", 1) or 1))



def skips_steps(model) -> bool:
    """True under dynamic loss scaling, whose skipped steps `iterations` does not count."""
    optimizer = getattr(model, "optimizer", None)
    return hasattr(optimizer, "inner_optimizer") and hasattr(optimizer, "dynamic_scale")
