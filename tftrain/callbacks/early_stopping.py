"""ResumableEarlyStopping: Keras's `EarlyStopping` whose state (best value, patience count, best weights, kept in
memory by Keras) is saved at each epoch end and read back when a resumed run starts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import keras
import numpy as np

from tftrain.epoch_log import logged_value
from tftrain.rundir import write_text_atomic

STATE_FILE = "early_stopping.json"
BEST_WEIGHTS_FILE = "early_stopping_best.npz"


class ResumableEarlyStopping(keras.callbacks.EarlyStopping):
    """`keras.callbacks.EarlyStopping` that saves and restores its state in `state_dir`.

    Place it after the backup callback, in its directory: that callback removes the directory at the end, and
    clears its own `stop_training` before this one may set it. A kill between the backup's epoch-end checkpoint and
    this state's write is caught up from `history_file` (written before the checkpoint).

    Args:
        state_dir: e.g. the run's backup directory. Defaults to None (in memory, as Keras's).
        history_file: the run's `CSVLogger` file. Defaults to None.
        **kwargs: `EarlyStopping`'s arguments.

    Example:
        >>> stop = ResumableEarlyStopping("run/backup", patience=3, restore_best_weights=True)
        >>> model.fit(train, validation_data=val, epochs=50, callbacks=[StepBackup("run/backup"), stop])
    """

    def __init__(self, state_dir=None, history_file=None, **kwargs):
        super().__init__(**kwargs)
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.history_file = Path(history_file) if history_file is not None else None

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        state = self._read(STATE_FILE)
        if state is None:
            return self._catch_up(-1)
        self.best, self.best_epoch, self.wait = state["best"], state["best_epoch"], state["wait"]
        weights = self._read(BEST_WEIGHTS_FILE)
        if self.restore_best_weights and weights is not None:
            self.best_weights = weights
        self._catch_up(state.get("epoch"))

    def _catch_up(self, applied) -> None:
        """Applies, from `history_file`, the checkpoint's last epoch if the state's last (`applied`) is older."""
        from tftrain import _compat

        last = _compat.initial_epoch(self.model, 0) - 1
        if applied is None or last <= applied or self.history_file is None:
            return
        value = logged_value(self.history_file, last, self.monitor)
        if value is not None:
            self.on_epoch_end(last, {self.monitor: value})
            self.model.stop_training = False  # fit trains its first epoch anyway; that epoch's end stops it

    def on_epoch_end(self, epoch, logs=None):
        before = self.best_epoch
        super().on_epoch_end(epoch, logs)
        if self.state_dir is None or self.best is None:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        best_file = self._path(BEST_WEIGHTS_FILE)
        if self.restore_best_weights and self.best_weights is not None and (self.best_epoch != before
                                                                            or not best_file.exists()):
            tmp = self._path(f"tmp-{os.getpid()}-{BEST_WEIGHTS_FILE}")
            np.savez(tmp, *self.best_weights)
            os.replace(tmp, best_file)
        state = {"best": float(self.best), "best_epoch": int(self.best_epoch), "wait": int(self.wait), "epoch": epoch}
        write_text_atomic(self._path(STATE_FILE), json.dumps(state))

    def _path(self, name: str) -> Path:
        return self.state_dir / name

    def _read(self, name: str) -> Optional[object]:
        """The saved state or best weights; None when absent or unreadable."""
        if self.state_dir is None or not self._path(name).is_file():
            return None
        try:
            if name.endswith(".npz"):
                with np.load(self._path(name)) as data:
                    return [data[f"arr_{i}"] for i in range(len(data.files))]
            return json.loads(self._path(name).read_text(encoding="utf-8"))
        except (OSError, ValueError, KeyError):
            return None

