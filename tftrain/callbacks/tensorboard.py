"""`EpochTensorBoard`: Keras's TensorBoard callback, without per-batch work that writes nothing.

At `update_freq="epoch"` Keras 3's `on_train_batch_end` still calls `summary.scalar` for every log of
every batch, although no default writer records them; that Python time slows small models.
"""

from __future__ import annotations

from typing import Optional

import keras


class EpochTensorBoard(keras.callbacks.TensorBoard):
    """`keras.callbacks.TensorBoard` that, at `update_freq="epoch"`, hands its batch hook no logs unless
    a default summary writer records (checked at each epoch's first batch). Otherwise as Keras's.

    Example:
        >>> model.fit(x, y, epochs=10, callbacks=[EpochTensorBoard("logs")])
    """

    _records: Optional[bool] = None  # whether a default summary writer records, at this epoch's first batch

    def on_epoch_begin(self, epoch, logs=None):
        self._records = None
        super().on_epoch_begin(epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        if self.update_freq == "epoch" and self._records is None:
            self._records = bool(self.summary.should_record_summaries())  # once an epoch, not a batch
        super().on_train_batch_end(batch, logs if self.update_freq != "epoch" or self._records else {})
