"""NanGuard: stop training with one line (where, dtype policy, loss scale) when the loss turns NaN or infinite.
It judges the loss, not gradients: loss scaling skips overflowing gradients by design; a bad loss is a broken pass."""

from __future__ import annotations

import math

import keras

from tftrain.callbacks._steps import optimizer_steps
from tftrain.errors import TrainingDiverged


class NanGuard(keras.callbacks.Callback):
    """Raises `TrainingDiverged` at the first execution whose `logs["loss"]` is NaN or infinite.

    Keras's `loss` is the epoch's running mean, so one bad step keeps it bad. Raising skips later callbacks for the
    batch: placed before `BackupAndRestore` or `StepBackup`, the last checkpoint stays finite. No `"loss"`: no check.

    Raises:
        TrainingDiverged: from `on_train_batch_end`, with `describe_divergence`'s line.

    Example:
        >>> model.fit(dataset, epochs=10, callbacks=[NanGuard(), keras.callbacks.BackupAndRestore("backup")])
    """

    def __init__(self):
        super().__init__()
        self._epoch, self._last_batch = 0, -1

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._last_batch = epoch, -1

    def on_train_batch_end(self, batch, logs=None):
        first, self._last_batch = self._last_batch + 2, batch  # batches from 1, as the progress bar
        loss = (logs or {}).get("loss")
        if loss is None or math.isfinite(float(loss)):
            return
        raise TrainingDiverged(describe_divergence(self.model, float(loss), (first, batch + 1), self._epoch))


def describe_divergence(model, loss: float, batches: tuple = (1, 1), epoch: int = 0) -> str:
    """`NanGuard`'s line, e.g. `"loss became nan at epoch 1, batch 8 (optimizer step 8; dtype policy float32)"`.

    Args:
        batches: `(first, last)` batch of the epoch (from 1) the execution ran. Defaults to (1, 1).
        epoch: 0-based (printed from 1). Defaults to 0.
    """
    optimizer = model.optimizer
    first, last = batches
    where = f"batch {last}" if first == last else f"batches {first}-{last}"
    kind = "nan" if math.isnan(loss) else "infinite"
    policy = getattr(getattr(model, "dtype_policy", None), "name", None) or keras.config.dtype_policy().name
    scale = (f", loss scale {float(optimizer.dynamic_scale.numpy())}"
             if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) else "")
    return (f"loss became {kind} at epoch {epoch + 1}, {where} (optimizer step {optimizer_steps(model)}; "
            f"dtype policy {policy}{scale})")
