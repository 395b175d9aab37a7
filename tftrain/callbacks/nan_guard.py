"""NanGuard: stop training with one line (where, dtype policy, loss scale) when the loss turns NaN or infinite.
It judges the loss, not gradients: loss scaling skips overflowing gradients by design; a bad loss is a broken pass."""

from __future__ import annotations

import math

import keras

from tftrain.callbacks._steps import optimizer_steps
from tftrain.errors import TrainingDiverged


class NanGuard(keras.callbacks.Callback):
    """Raises `TrainingDiverged` at the first execution whose `logs["loss"]` is NaN or infinite; without a
    `"loss"` (a model's own `train_step` may name it otherwise), every logged figure whose name ends in `loss`.

    Keras's `loss` is the epoch's running mean, so one bad step keeps it bad. Raising skips later callbacks for the
    batch: placed before `BackupAndRestore` or `StepBackup`, the last checkpoint stays finite.

    Args:
        say: prints, once, that the logs hold no loss to watch. Defaults to None (silent).

    Raises:
        TrainingDiverged: from `on_train_batch_end`, with `describe_divergence`'s line.

    Example:
        >>> model.fit(dataset, epochs=10, callbacks=[NanGuard(), keras.callbacks.BackupAndRestore("backup")])
    """

    def __init__(self, say=None):
        super().__init__()
        self._epoch, self._last_batch, self.say = 0, -1, say

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._last_batch = epoch, -1

    def on_train_batch_end(self, batch, logs=None):
        first, self._last_batch = self._last_batch + 2, batch  # batches from 1, as the progress bar
        logs = logs or {}
        names = ["loss"] if "loss" in logs else [k for k in logs if k.endswith("loss")]
        if not names and logs and self.say is not None:
            self.say(f"the NaN guard watches no loss: the training logs have none ({', '.join(sorted(logs))}), so a "
                     "diverging run is not stopped")
            self.say = None
        for name in names:
            value = float(logs[name])
            if not math.isfinite(value):
                raise TrainingDiverged(describe_divergence(self.model, value, (first, batch + 1), self._epoch, name))


def describe_divergence(model, loss: float, batches: tuple = (1, 1), epoch: int = 0, name: str = "loss") -> str:
    """`NanGuard`'s line, e.g. `"loss became nan at epoch 1, batch 8 (optimizer step 8; dtype policy float32)"`.

    Args:
        batches: `(first, last)` batch of the epoch (from 1) the execution ran. Defaults to (1, 1).
        epoch: 0-based (printed from 1). Defaults to 0.
        name: the logged figure that diverged. Defaults to `"loss"`.
    """
    optimizer = model.optimizer
    first, last = batches
    where = f"batch {last}" if first == last else f"batches {first}-{last}"
    kind = "nan" if math.isnan(loss) else "infinite"
    policy = getattr(getattr(model, "dtype_policy", None), "name", None) or keras.config.dtype_policy().name
    scale = (f", loss scale {float(optimizer.dynamic_scale.numpy())}"
             if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) else "")
    return (f"{name} became {kind} at epoch {epoch + 1}, {where} (optimizer step {optimizer_steps(model)}; "
            f"dtype policy {policy}{scale})")
