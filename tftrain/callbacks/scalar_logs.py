"""`ScalarLogs`: a metric with a value per class (`keras.metrics.F1Score(average=None)`) logged as one scalar per
element, `<name>_<i>`, which TensorBoard's scalars, `history.csv`, `--monitor` and `metrics.json` take."""

from __future__ import annotations

import keras


def scalar_logs(logs: dict) -> dict:
    """`logs` with each value of more than one element replaced, in place in the order, by `<name>_<i>` floats
    (flattened in C order); a one-element array becomes a float. Other values are kept as they are.

    Raises:
        ValueError: an element's name is another entry's (`F1Score(average=None)` beside Keras's `f1_score_1`).
    """
    import numpy as np

    out = {}
    for name, value in logs.items():
        try:
            array = np.asarray(value, dtype="float64")
        except (TypeError, ValueError):  # not a number (a string column)
            out[name] = value
            continue
        if array.ndim == 0:
            out[name] = value
        elif array.size == 1:
            out[name] = float(array.reshape(()))
        else:
            elements = {f"{name}_{i}": float(v) for i, v in enumerate(array.reshape(-1))}
            taken = sorted(set(elements) & set(logs))
            if taken:
                raise ValueError(f"the metric {name!r} has {array.size} values, logged as {name}_0 to "
                                 f"{name}_{array.size - 1}, and {taken[0]!r} is another metric's name; give one of "
                                 "them another name (the metric's name= argument)")
            out.update(elements)
    return out


class ScalarLogs(keras.callbacks.Callback):
    """Rewrites the logs Keras passes on (one dict for every callback, `History` included) with `scalar_logs`;
    placed first, every later callback sees scalars.

    Example:
        >>> model.fit(x, y, callbacks=[ScalarLogs(), keras.callbacks.TensorBoard("logs")])
    """

    @staticmethod
    def _rewrite(logs) -> None:
        # Keras hands on scalars as floats: only an array (a metric per class) costs a rewrite, at each batch too.
        if logs and any(getattr(value, "ndim", 0) for value in logs.values()):
            flat = scalar_logs(logs)
            logs.clear()
            logs.update(flat)

    def on_train_batch_end(self, batch, logs=None):
        self._rewrite(logs)

    def on_test_batch_end(self, batch, logs=None):
        self._rewrite(logs)

    def on_epoch_end(self, epoch, logs=None):
        self._rewrite(logs)

    def on_test_end(self, logs=None):
        self._rewrite(logs)

    def on_train_end(self, logs=None):
        self._rewrite(logs)
