"""KeepBest: the N best epochs' weights by a monitored metric, and the last epoch's, as TensorFlow
checkpoints that survive the run and its resumptions (`--keep-best N --monitor METRIC`).

`<directory>/last/` is a `tf.train.CheckpointManager` keeping one checkpoint (the last epoch);
`<directory>/best/epoch-<E>.*` are the N best (`tf.train.Checkpoint.write`), ranked in
`<directory>/keep_best.json`, which a resumed run reads back. Each checkpoint holds the model's
weights (`tf.train.Checkpoint(model=model)`): read one with
`tf.train.Checkpoint(model=model).read(path).expect_partial()`, or `--init-from` the run directory.
Keras's own `ModelCheckpoint(save_best_only=True)` keeps one file and its mode rule is the one used
here (`MonitorCallback`: "auto" takes the direction from the metric).

Source: https://www.tensorflow.org/guide/checkpoint
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Optional

import tensorflow as tf
from keras.src.callbacks.monitor_callback import MonitorCallback

from tftrain.errors import check_int

STATE_FILE = "keep_best.json"
"""The ranking of the kept checkpoints (best first), in the checkpoints directory."""


class KeepBest(MonitorCallback):
    """Keeps the `keep` best epochs' weights by `monitor`, and the last epoch's.

    Args:
        directory: the checkpoints directory (created); `best/`, `last/` and
            `keep_best.json` go there.
        keep: how many of the best epochs to keep, >= 1.
        monitor: the epoch log's metric to rank by (e.g. `"val_loss"`,
            `"val_accuracy"`, `"loss"`). Defaults to `"val_loss"`.
        mode: `"min"`, `"max"` or `"auto"` (Keras's rule: from the metric's
            direction, `loss` minimised). Defaults to `"auto"`.
        say: prints one line (the missing metric's warning). Defaults to `print`.

    Attributes:
        kept: `[{"epoch": 1-based epoch, "value": float, "checkpoint": path}]`, best first.
        last: the last epoch's checkpoint path, or None before the first epoch ends.

    Raises:
        ValueError: when `keep` < 1.

    Example:
        >>> best = KeepBest("run/checkpoints", keep=3, monitor="val_accuracy")
        >>> model.fit(train, validation_data=val, epochs=20, callbacks=[best])
        >>> tf.train.Checkpoint(model=model).read(best.kept[0]["checkpoint"]).expect_partial()
    """

    def __init__(self, directory, keep: int, monitor: str = "val_loss", mode: str = "auto", say=print):
        super().__init__(monitor=monitor, mode=mode)
        check_int(keep, "keep")
        self.directory, self.keep, self.say = Path(directory), keep, say
        self.kept: List[dict] = []
        self.last: Optional[str] = None
        self._warned = False

    def on_train_begin(self, logs=None):
        self._checkpoint = tf.train.Checkpoint(model=self.model)
        self._last = tf.train.CheckpointManager(self._checkpoint, str(self.directory / "last"), max_to_keep=1,
                                               checkpoint_name="epoch")
        self.kept, self.last = read_state(self.directory), self._last.latest_checkpoint

    def on_epoch_end(self, epoch, logs=None):
        self.last = self._last.save(checkpoint_number=epoch + 1)
        value = (logs or {}).get(self.monitor)
        if value is None:
            if not self._warned:
                names = ", ".join(sorted(logs or {}))
                self.say(f"keep-best: the epoch logs have no {self.monitor!r} (they have {names}); pass --monitor "
                         "with one of them. Only the last checkpoint is kept.")
                self._warned = True
            return
        value = float(value)
        if self.monitor_op is None:  # as Keras's EarlyStopping: the model's metrics exist once an epoch ran
            self._set_monitor_op()
        if len(self.kept) >= self.keep and not self._better(value, self.kept[-1]["value"]):
            return
        path = self._checkpoint.write(str(self.directory / "best" / f"epoch-{epoch + 1}"))
        ranked = sorted(self.kept + [{"epoch": epoch + 1, "value": value, "checkpoint": path}],
                        key=lambda k: k["value"], reverse=not self._minimises())
        for dropped in ranked[self.keep:]:
            _delete(dropped["checkpoint"])
        self.kept = ranked[:self.keep]
        _write_state(self.directory, self.kept)

    def _better(self, value: float, than: float) -> bool:
        return bool(self.monitor_op(value, than))

    def _minimises(self) -> bool:
        return self._better(0.0, 1.0)

    def summary(self) -> dict:
        """Plain data for `metrics.json`: monitor, mode (`min` / `max`), kept, last."""
        mode = self.mode if self.monitor_op is None else ("min" if self._minimises() else "max")
        return {"monitor": self.monitor, "mode": mode, "kept": self.kept, "last": self.last}


def read_state(directory) -> List[dict]:
    """The kept checkpoints ranked in `directory/keep_best.json` whose files still exist, best first;
    [] when there is none (or it cannot be read)."""
    try:
        kept = json.loads((Path(directory) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [k for k in kept if isinstance(k, dict) and tf.io.gfile.exists(f"{k.get('checkpoint')}.index")]


def best_checkpoint(directory) -> Optional[str]:
    """The best kept checkpoint's path in a checkpoints directory, else None."""
    kept = read_state(directory)
    return kept[0]["checkpoint"] if kept else None


def _write_state(directory: Path, kept: List[dict]) -> None:
    tmp = directory / f"{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(kept, indent=1))
    os.replace(tmp, directory / STATE_FILE)


def _delete(prefix: str) -> None:
    for path in tf.io.gfile.glob(f"{prefix}.*"):
        tf.io.gfile.remove(path)
