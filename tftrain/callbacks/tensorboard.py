"""`EpochTensorBoard`: Keras's TensorBoard callback without per-batch work that writes nothing (at
`update_freq="epoch"` Keras 3 still calls `summary.scalar` for every batch's logs, slowing small models)."""

from __future__ import annotations

from typing import Optional

import keras


class EpochTensorBoard(keras.callbacks.TensorBoard):
    """`keras.callbacks.TensorBoard` that, at `update_freq="epoch"`, passes its batch hook no logs unless a default
    summary writer records (checked at each epoch's first batch).

    Example:
        >>> model.fit(x, y, epochs=10, callbacks=[EpochTensorBoard("logs")])
    """

    _records: Optional[bool] = None  # whether a default summary writer records this epoch

    def on_epoch_begin(self, epoch, logs=None):
        self._records = None
        super().on_epoch_begin(epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        if self.update_freq == "epoch" and self._records is None:
            self._records = bool(self.summary.should_record_summaries())
        super().on_train_batch_end(batch, logs if self.update_freq != "epoch" or self._records else {})
