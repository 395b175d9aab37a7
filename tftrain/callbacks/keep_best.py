"""KeepBest: the N best epochs' weights by a monitored metric, and the last epoch's, as TensorFlow
checkpoints that survive the run and its resumptions (`--keep-best N --monitor METRIC`).

`<directory>/last/` is a `tf.train.CheckpointManager` keeping one checkpoint (the last epoch);
`<directory>/best/epoch-<E>.*` are the N best (`tf.train.Checkpoint.write`), ranked in
`<directory>/keep_best.json`, which a resumed run reads back. Each checkpoint holds the model's
weights (`tf.train.Checkpoint(model=model)`): read one with
`tf.train.Checkpoint(model=model).read(path).expect_partial()`, or `--init-from` the run directory.

Whether the metric improves as it falls or rises comes from its name (`monitor_direction`), not from
the compiled model's metric objects as in Keras's `ModelCheckpoint` / `EarlyStopping`: the rule holds
for a model of several outputs (`val_<output>_mae`), and the sanity pass can apply it before the first
step (`check_monitor`).

Under `multi_worker_mirrored` every worker runs the callback on the same epoch logs (Keras all-reduces
the metrics), so every worker ranks alike and saves at the same epochs: saving may involve collective
ops, so a worker that is not the chief still saves, to its own temporary directory, and reads the
chief's ranking when the run resumes (`ranking_from`).

Source: https://www.tensorflow.org/guide/checkpoint,
https://www.tensorflow.org/tutorials/distribute/multi_worker_with_keras#model_saving_and_loading
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterable, List, Optional

import keras
import tensorflow as tf

from tftrain.errors import ConfigError, check_int

STATE_FILE = "keep_best.json"
"""The ranking of the kept checkpoints (best first), in the checkpoints directory."""

MODES = ("auto", "min", "max")
"""`mode` values: `"auto"` takes the direction from the metric's name (`monitor_direction`)."""

RISING = frozenset({
    "accuracy", "acc", "binary_accuracy", "categorical_accuracy", "sparse_categorical_accuracy",
    "top_k_categorical_accuracy", "sparse_top_k_categorical_accuracy",
    "auc", "precision", "recall", "precision_at_recall", "recall_at_precision",
    "sensitivity_at_specificity", "specificity_at_sensitivity",
    "f1", "f1_score", "fbeta", "fbeta_score", "r2_score",
    "iou", "io_u", "mean_iou", "mean_io_u", "binary_iou", "binary_io_u", "one_hot_iou", "one_hot_io_u",
    "one_hot_mean_iou", "one_hot_mean_io_u",
    "cosine_similarity", "pearson_correlation", "concordance_correlation",
    "true_positives", "true_negatives",
})
"""Keras's built-in metrics (default names and `compile` aliases) that improve as they rise."""

FALLING = frozenset({
    "mae", "mse", "rmse", "msle", "mape",
    "mean_absolute_error", "mean_squared_error", "root_mean_squared_error", "mean_squared_logarithmic_error",
    "mean_absolute_percentage_error",
    "crossentropy", "binary_crossentropy", "categorical_crossentropy", "sparse_categorical_crossentropy",
    "binary_focal_crossentropy", "categorical_focal_crossentropy",
    "hinge", "squared_hinge", "categorical_hinge",
    "kl_divergence", "kld", "kullback_leibler_divergence", "poisson", "logcosh", "log_cosh", "huber",
    "false_positives", "false_negatives",
})
"""Keras's built-in metrics (default names and `compile` aliases) that improve as they fall; besides
these, any `mean_*_error` and `*crossentropy`."""

_FALLING_PATTERN = re.compile(r"(mean_\w+_error|\w*crossentropy)")


def monitor_direction(monitor: str, mode: str = "auto") -> Optional[str]:
    """Whether the epoch log's metric `monitor` improves as it falls (`"min"`) or rises (`"max"`).

    `mode` `"min"` or `"max"` is returned as it is. Under `"auto"` the name
    decides, without a model: a leading `val_` is dropped; a name that is or
    ends with `loss` falls; else the name, or its part after an output's
    prefix (`<output>_`, at any `_`), is looked up among Keras's built-in
    metrics and their aliases (`RISING`, `FALLING`, any `mean_*_error` or
    `*crossentropy`), the longest known part deciding.

    Args:
        monitor: the metric's key in the epoch logs (e.g. `"val_loss"`,
            `"val_label_sparse_categorical_accuracy"`, `"value_mae"`).
        mode: `"auto"`, `"min"` or `"max"`. Defaults to `"auto"`.

    Returns:
        `"min"`, `"max"`, or None when `mode` is `"auto"` and the name is not
        a known metric's.

    Raises:
        ConfigError: when `mode` is not one of `MODES`.

    Example:
        >>> monitor_direction("val_label_sparse_categorical_accuracy")
        'max'
        >>> monitor_direction("value_mae"), monitor_direction("my_metric"), monitor_direction("my_metric", "max")
        ('min', None, 'max')
    """
    if mode not in MODES:
        raise ConfigError(f"Invalid monitor mode {mode!r}. Expected one of: {', '.join(MODES)}. "
                          f"Received: mode={mode!r}")
    if mode != "auto":
        return mode
    name = monitor.lower().removeprefix("val_")
    if name.endswith("loss"):
        return "min"
    parts = name.split("_")
    for suffix in ("_".join(parts[i:]) for i in range(len(parts))):  # the whole name first: the longest part
        if suffix in RISING:
            return "max"
        if suffix in FALLING or _FALLING_PATTERN.fullmatch(suffix):
            return "min"
    return None


def check_monitor(monitor: str, mode: str, logs_keys: Iterable[str]) -> None:
    """Refuses a `--monitor` the epoch logs will not have, or whose direction is unknown.

    Args:
        monitor: the metric `--keep-best` ranks by.
        mode: `"auto"`, `"min"` or `"max"` (`--monitor-mode`).
        logs_keys: the keys the epoch logs will have (training and `val_` ones).

    Raises:
        ConfigError: one line naming the monitor, the logs' keys and the fix
            (`--monitor KEY`, or `--monitor-mode min|max`).

    Example:
        >>> check_monitor("val_value_mae", "auto", ["loss", "value_mae", "val_loss", "val_value_mae"])
    """
    keys = list(dict.fromkeys(logs_keys))
    if monitor not in keys:
        raise ConfigError(f"--monitor {monitor!r} is not among the epoch logs' keys ({', '.join(keys) or 'none'}). "
                          "Pass --monitor KEY with one of them.")
    if monitor_direction(monitor, mode) is None:
        raise ConfigError(_unknown_direction(monitor))


def _unknown_direction(monitor: str) -> str:
    return (f"--monitor {monitor!r}: the metric's direction is unknown (it is neither a loss nor one of Keras's "
            "built-in metrics); pass --monitor-mode min or max.")


class KeepBest(keras.callbacks.Callback):
    """Keeps the `keep` best epochs' weights by `monitor`, and the last epoch's.

    Args:
        directory: the checkpoints directory (created); `best/`, `last/` and
            `keep_best.json` go there.
        keep: how many of the best epochs to keep, >= 1.
        monitor: the epoch log's metric to rank by (e.g. `"val_loss"`,
            `"val_accuracy"`, `"val_<output>_mae"`). Defaults to `"val_loss"`.
        mode: `"min"`, `"max"` or `"auto"` (from the metric's name:
            `monitor_direction`). Defaults to `"auto"`.
        say: prints one line (the missing metric's warning). Defaults to `print`.
        ranking_from: the checkpoints directory whose `keep_best.json` a
            resumed run starts its ranking from, when it is not `directory`: a
            worker that is not the chief saves to its own temporary directory
            but must rank (and so save) as the chief does. None reads
            `directory`. Defaults to None.

    Attributes:
        kept: `[{"epoch": 1-based epoch, "value": float, "checkpoint": path}]`, best first.
        last: the last epoch's checkpoint path, or None before the first epoch ends.
        mode: `"min"` or `"max"`, as resolved.

    Raises:
        ValueError: when `keep` < 1.
        ConfigError: when `mode` is `"auto"` and the direction of `monitor`
            is unknown, or `mode` is not one of `MODES`.

    Example:
        >>> best = KeepBest("run/checkpoints", keep=3, monitor="val_accuracy")
        >>> model.fit(train, validation_data=val, epochs=20, callbacks=[best])
        >>> tf.train.Checkpoint(model=model).read(best.kept[0]["checkpoint"]).expect_partial()
    """

    def __init__(self, directory, keep: int, monitor: str = "val_loss", mode: str = "auto", say=print,
                 ranking_from=None):
        super().__init__()
        check_int(keep, "keep")
        direction = monitor_direction(monitor, mode)
        if direction is None:
            raise ConfigError(_unknown_direction(monitor))
        self.directory, self.keep, self.monitor, self.mode, self.say = Path(directory), keep, monitor, direction, say
        self.ranking_from = Path(ranking_from) if ranking_from is not None else None
        self.kept: List[dict] = []
        self.last: Optional[str] = None
        self._warned = False

    def on_train_begin(self, logs=None):
        self._checkpoint = tf.train.Checkpoint(model=self.model)
        self._last = tf.train.CheckpointManager(self._checkpoint, str(self.directory / "last"), max_to_keep=1,
                                               checkpoint_name="epoch")
        self.kept, self.last = self._read_ranking(), self._last.latest_checkpoint

    def _read_ranking(self) -> List[dict]:
        """This directory's ranking, or `ranking_from`'s with each checkpoint path in this directory
        (this task never deletes another's files)."""
        if self.ranking_from is None or self.ranking_from.resolve() == self.directory.resolve():
            return read_state(self.directory)
        return [{**k, "checkpoint": str(self.directory / "best" / f"epoch-{k['epoch']}")}
                for k in read_state(self.ranking_from)]

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
        if len(self.kept) >= self.keep and not self._better(value, self.kept[-1]["value"]):
            return
        path = self._checkpoint.write(str(self.directory / "best" / f"epoch-{epoch + 1}"))
        ranked = sorted(self.kept + [{"epoch": epoch + 1, "value": value, "checkpoint": path}],
                        key=lambda k: k["value"], reverse=self.mode == "max")
        for dropped in ranked[self.keep:]:
            _delete(dropped["checkpoint"])
        self.kept = ranked[:self.keep]
        _write_state(self.directory, self.kept)

    def _better(self, value: float, than: float) -> bool:
        return value < than if self.mode == "min" else value > than

    def summary(self) -> dict:
        """Plain data for `metrics.json`: monitor, mode (`min` / `max`), kept, last."""
        return {"monitor": self.monitor, "mode": self.mode, "kept": self.kept, "last": self.last}


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
