"""ResumableEarlyStopping: Keras's `EarlyStopping` whose state (best value, patience count, best weights, kept in
memory by Keras) survives a resumed run."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Optional

import keras
import numpy as np

from tftrain.epoch_log import logged_value
from tftrain.files import replaced, write_text_atomic

STATE_FILE = "early_stopping.json"
BEST_WEIGHTS_FILE = "early_stopping_best.npz"


class ResumableEarlyStopping(keras.callbacks.EarlyStopping):
    """`keras.callbacks.EarlyStopping` that saves its best weights in `state_dir` and, when a resumed run starts,
    takes up where the restored checkpoint's epoch left it.

    Place it after the backup callback, in its directory: that callback restores the checkpoint in
    `on_train_begin` and removes the directory at the end. The best value, best epoch, patience count and stop
    are replayed from `history_file` over the checkpoint's epochs by Keras's own rule (so a kill anywhere, or a
    fallback to an older checkpoint, leaves them as an unbroken run's), else read from `state_dir`'s
    `early_stopping.json`. The best
    weights are used only if saved at that best epoch. A run the checkpoint shows stopped trains no more epochs.

    Args:
        state_dir: e.g. the run's backup directory. Defaults to None (in memory, as Keras's).
        history_file: the run's `CSVLogger` file. Defaults to None.
        say: prints a line when the best epoch's weights are lost. Defaults to `print`.
        **kwargs: `EarlyStopping`'s arguments; `mode="auto"` (the default) also knows `keep_best.monitor_direction`'s
            names, e.g. the per-output `val_<output>_mae` Keras does not.

    Example:
        >>> stop = ResumableEarlyStopping("run/backup", patience=3, restore_best_weights=True)
        >>> model.fit(train, validation_data=val, epochs=50, callbacks=[StepBackup("run/backup"), stop])
    """

    def __init__(self, state_dir=None, history_file=None, say=print, **kwargs):
        from tftrain.callbacks.keep_best import monitor_direction

        if kwargs.get("mode", "auto") == "auto":  # Keras's "auto" knows no per-output name (val_<output>_mae)
            kwargs["mode"] = monitor_direction(kwargs.get("monitor", "val_loss")) or "auto"
        super().__init__(**kwargs)
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.history_file = Path(history_file) if history_file is not None else None
        self.say = say

    def on_train_begin(self, logs=None):
        from tftrain import _compat

        super().on_train_begin(logs)
        last = _compat.initial_epoch(self.model, 0) - 1  # the restored checkpoint's last epoch; -1: none
        if last < 0 or self.state_dir is None:
            return
        if not self._replayed(last):
            state = self._read(STATE_FILE)
            if not isinstance(state, dict) or state.get("epoch") != last:
                self.say(f"early stopping: neither {self.history_file} nor {self._path(STATE_FILE)} holds "
                         f"{self.monitor} for epochs 1-{last + 1}; patience counts from this epoch on")
                return
            self.best, self.best_epoch, self.wait = state["best"], state["best_epoch"], state["wait"]
            self.stopped_epoch = state.get("stopped_epoch", 0)
        if self.restore_best_weights:
            self._restore_best_weights(last)
        if self.stopped_epoch == last and last > 0:  # the run had stopped at its checkpoint's epoch
            _compat.set_initial_epoch(self.model, self.params.get("epochs", last + 1))

    def on_train_end(self, logs=None):
        from tftrain import _compat

        super().on_train_end(logs)
        _compat.clear_initial_epoch(self.model)

    def _replayed(self, last: int) -> bool:
        """Runs Keras's own rule (`EarlyStopping.on_epoch_end`, weights aside) over `history_file`'s `monitor` for
        epochs 0..`last`; False if a value is missing or the direction is not known yet (`mode="auto"` on a
        metric whose direction Keras reads from the built metrics)."""
        values = [logged_value(self.history_file, epoch, self.monitor) if self.history_file else None
                  for epoch in range(last + 1)]
        if None in values:
            return False
        restore, stop = self.restore_best_weights, self.model.stop_training
        self.restore_best_weights = False
        try:
            for epoch, value in enumerate(values):
                self.model.stop_training = False
                keras.callbacks.EarlyStopping.on_epoch_end(self, epoch, {self.monitor: value})
        except ValueError:  # Keras cannot tell the direction yet: the saved state stands in
            self.wait, self.stopped_epoch, self.best, self.best_epoch = 0, 0, None, 0
            return False
        finally:
            self.restore_best_weights, self.model.stop_training = restore, stop
        return True

    def _restore_best_weights(self, last: int) -> None:
        """The best epoch's weights: from `state_dir` if saved at that epoch, the restored model's if it is the
        checkpoint's epoch. Else one line says they are lost, and the checkpoint's weights stand in for them."""
        saved = self._read(BEST_WEIGHTS_FILE)
        if saved is not None and saved[1] == self.best_epoch:
            self.best_weights = saved[0]
            return
        if self.best is not None and self.best_epoch != last:
            self.say(f"early stopping: the weights of the best epoch ({self.best_epoch + 1}) are not in "
                     f"{self._path(BEST_WEIGHTS_FILE)} (missing, damaged or of a discarded checkpoint); epoch "
                     f"{last + 1}'s weights stand in for them unless a later epoch improves on it")
        self.best_weights = self.model.get_weights()

    def on_epoch_end(self, epoch, logs=None):
        before = self.best_epoch
        super().on_epoch_end(epoch, logs)
        if self.state_dir is None or self.best is None:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        best_file = self._path(BEST_WEIGHTS_FILE)
        if self.restore_best_weights and self.best_weights is not None and (self.best_epoch != before
                                                                            or not best_file.exists()):
            with replaced(best_file, durable=True) as tmp:  # ends in .npz, so NumPy adds no suffix
                np.savez(tmp, *self.best_weights, best_epoch=np.int64(self.best_epoch))
        state = {"best": float(self.best), "best_epoch": int(self.best_epoch), "wait": int(self.wait), "epoch": epoch,
                 "stopped_epoch": int(self.stopped_epoch)}
        write_text_atomic(self._path(STATE_FILE), json.dumps(state), durable=True)

    def _path(self, name: str) -> Path:
        return self.state_dir / name

    def _read(self, name: str) -> Optional[object]:
        """The saved state, or the best weights and their epoch (None if not saved with them); None when absent
        or unreadable."""
        if self.state_dir is None or not self._path(name).is_file():
            return None
        try:
            if name.endswith(".npz"):
                with np.load(self._path(name)) as data:
                    epoch = int(data["best_epoch"]) if "best_epoch" in data.files else None
                    return [data[f"arr_{i}"] for i in range(len(data.files) - (epoch is not None))], epoch
            return json.loads(self._path(name).read_text(encoding="utf-8"))
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            return None
