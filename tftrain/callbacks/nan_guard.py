"""NanGuard: stop training with one line when the loss turns NaN or infinite.

Keras's `TerminateOnNaN` stops (or raises) naming the batch index within the epoch. A
diverged run needs more to be diagnosed: where in the run, under which dtype policy
and, under `mixed_float16`, at which loss scale. Dynamic loss scaling skips the steps
whose *gradients* overflow by design (the loss stays finite and the scale halves); a
non-finite *loss* means the forward pass itself broke, so the loss is what is judged.
"""

from __future__ import annotations

import math

import keras

from tftrain.callbacks._steps import optimizer_steps
from tftrain.errors import TrainingDiverged


class NanGuard(keras.callbacks.Callback):
    """Raises `TrainingDiverged` at the first execution whose loss is NaN or infinite.

    Reads `logs["loss"]` at each `on_train_batch_end` (one hook per execution of
    `steps_per_execution` steps; Keras hands the callbacks Python floats, so this adds
    no device round trip). Keras's `loss` is the epoch's running mean, so one
    non-finite step keeps it non-finite. It raises instead of setting
    `stop_training`, so no callback after it runs for that batch: placed before
    `BackupAndRestore` (or `StepBackup`), the last checkpoint keeps the last finite
    state. The message reads, e.g.,
    `loss became nan at epoch 2, batch 37 (optimizer step 53; dtype policy mixed_float16, loss scale 16384.0)`:
    epoch and batch as the progress bar counts them (from 1; with several steps per
    execution, the execution's range of batches), and the optimizer step
    (`optimizer.iterations` after that execution, the x axis of TensorBoard's
    batch-level scalars; dynamic loss scaling does not count the steps it skipped).
    Models whose `train_step` logs no `"loss"` are not checked.

    Raises:
        TrainingDiverged: from `on_train_batch_end`, when the loss is not finite.

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
    """The one line `NanGuard` raises: where, the optimizer step, the dtype policy and the loss scale.

    Args:
        model: the compiled model.
        loss: the non-finite loss value.
        batches: `(first, last)` batch of the epoch (from 1) the failing execution
            ran. Defaults to (1, 1).
        epoch: the 0-based epoch (printed from 1, as Keras's progress bar). Defaults to 0.

    Returns:
        e.g. `"loss became nan at epoch 1, batch 8 (optimizer step 8; dtype policy float32)"`.
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
