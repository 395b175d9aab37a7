"""KeepBest (`--keep-best N --monitor METRIC`): the N best epochs' and the last epoch's weights as TensorFlow
checkpoints that survive resumptions: `last/`, `best/epoch-<E>.*` and the ranking `keep_best.json`. Read one with
`tf.train.Checkpoint(model=model).read(path).expect_partial()` (https://www.tensorflow.org/guide/checkpoint).
The direction comes from the metric's name, so it is checked before the first step. Under `multi_worker_mirrored`
every worker saves (saving may use collectives); non-chiefs to a temporary directory, ranking from the chief's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import shutil
from pathlib import Path
from typing import Iterable, List, Optional

import keras
import tensorflow as tf

from tftrain.epoch_log import logged_value
from tftrain.errors import ConfigError, check_int
from tftrain.files import write_text_atomic

STATE_FILE = "keep_best.json"
"""The kept checkpoints' ranking (best first), in the checkpoints directory."""

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
"""Keras's built-in metrics (names and `compile` aliases) that improve as they rise."""

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
"""Keras's built-in metrics (names and aliases) that improve as they fall; also `mean_*_error`, `*crossentropy`."""

_FALLING_PATTERN = re.compile(r"(mean_\w+_error|\w*crossentropy)")


def monitor_direction(monitor: str, mode: str = "auto") -> Optional[str]:
    """Whether `monitor` improves as it falls (`"min"`) or rises (`"max"`); `mode` `"min"` / `"max"` is returned
    as is. Under `"auto"`, without a leading `val_` and a trailing element index (`f1_score_2`): `*loss` falls, else
    the longest suffix in `RISING`, `FALLING`, `mean_*_error` or `*crossentropy` decides (so `<output>_accuracy`
    rises).

    Returns:
        `"min"`, `"max"`, or None when `"auto"` does not know the name.

    Raises:
        ConfigError: `mode` is not one of `MODES`.

    Example:
        >>> monitor_direction("val_label_sparse_categorical_accuracy")
        'max'
    """
    if mode not in MODES:
        raise ConfigError(f"Invalid monitor mode {mode!r}. Expected one of: {', '.join(MODES)}. "
                          f"Received: mode={mode!r}")
    if mode != "auto":
        return mode
    name = re.sub(r"_\d+$", "", monitor.lower().removeprefix("val_"))  # one element of a vector (`ScalarLogs`)
    if name.endswith("loss"):
        return "min"
    parts = name.split("_")
    for suffix in ("_".join(parts[i:]) for i in range(len(parts))):  # longest first
        if suffix in RISING:
            return "max"
        if suffix in FALLING or _FALLING_PATTERN.fullmatch(suffix):
            return "min"
    return None


def check_monitor(monitor: str, mode: str, logs_keys: Iterable[str]) -> None:
    """Raises `ConfigError` when `monitor` is not in `logs_keys` or its direction is unknown under `mode`."""
    keys = list(dict.fromkeys(logs_keys))
    if monitor.startswith("val_") and monitor not in keys and not any(k.startswith("val_") for k in keys):
        raise ConfigError(f"--monitor {monitor!r} is a validation metric, and the run has no validation data: pass "
                          f"--validation-split F (e.g. 0.1), give the task validation data, or pass --monitor "
                          f"{monitor[4:]}.")
    if monitor not in keys:
        raise ConfigError(f"--monitor {monitor!r} is not among the epoch logs' keys ({', '.join(keys) or 'none'}). "
                          "Pass --monitor KEY with one of them.")
    if monitor_direction(monitor, mode) is None:
        raise ConfigError(_unknown_direction(monitor))


def _unknown_direction(monitor: str) -> str:
    return (f"--monitor {monitor!r}: the metric's direction is unknown (it is neither a loss nor one of Keras's "
            "built-in metrics); pass --monitor-mode min or max (mode= in Python), or check the name.")


class KeepBest(keras.callbacks.Callback):
    """Keeps the `keep` best epochs' weights by `monitor`, and the last epoch's.

    Args:
        keep: how many best epochs to keep, >= 1.
        monitor: the epoch log's metric. Defaults to `"val_loss"`.
        mode: `"min"`, `"max"` or `"auto"` (`monitor_direction`). Defaults to `"auto"`.
        say: prints a missing metric's one-line warning. Defaults to `print`.
        ranking_from: where a resumed non-chief reads `keep_best.json`. Defaults to None (`directory`).
        history_file: the run's `CSVLogger` file (the chief's), from which a damaged `keep_best.json`'s ranking is
            rebuilt.
            Defaults to None (the kept checkpoints are then not ranked again).

    Attributes:
        kept: `[{"epoch": 1-based, "value": float, "checkpoint": path}]`, best first.
        last: the last epoch's checkpoint path, or None.

    Raises:
        ValueError: `keep` < 1.
        ConfigError: `mode` is invalid, or `"auto"` and `monitor`'s direction is unknown.

    Example:
        >>> best = KeepBest("run/checkpoints", keep=3, monitor="val_accuracy")
        >>> model.fit(train, validation_data=val, epochs=20, callbacks=[best])
    """

    def __init__(self, directory, keep: int, monitor: str = "val_loss", mode: str = "auto", say=print,
                 ranking_from=None, history_file=None):
        super().__init__()
        check_int(keep, "keep")
        direction = monitor_direction(monitor, mode)
        if direction is None:
            raise ConfigError(_unknown_direction(monitor))
        self.directory, self.keep, self.monitor, self.mode, self.say = Path(directory), keep, monitor, direction, say
        self.ranking_from = Path(ranking_from) if ranking_from is not None else None
        self.history_file = Path(history_file) if history_file is not None else None
        self.kept: List[dict] = []
        self.last: Optional[str] = None
        self._warned = False
        self._ended, self._offset = 0, None  # the last 1-based epoch this instance ranked; this fit's shift
        self._logs, self._valued = None, False  # this fit's last epoch logs; whether one held the monitor

    def on_train_begin(self, logs=None):
        self._offset, self._logs, self._valued = None, None, False
        from tftrain.runtime.precision import user_model

        # the user's model, not the float32-output wrapper a mixed-policy run trains: read back into it as built
        self._checkpoint = tf.train.Checkpoint(model=user_model(self.model))
        pointer = self.directory / "last" / "checkpoint"  # TensorFlow prints a damaged one's bytes to the terminal
        if pointer.is_file() and not _text(pointer):  # the checkpoint it names is unknown: the folder goes whole
            shutil.rmtree(pointer.parent, ignore_errors=True)
            self.say(f"keep-best: {pointer} was damaged; the last epoch's checkpoint is written again at this run's "
                     "next epoch end")
        self._last = tf.train.CheckpointManager(self._checkpoint, str(self.directory / "last"), max_to_keep=1,
                                               checkpoint_name="epoch")
        self.kept, self.last = self._read_ranking(), self._last.latest_checkpoint

    def _read_ranking(self) -> List[dict]:
        """This directory's ranking, or `ranking_from`'s with paths moved into this directory. A damaged
        `keep_best.json` is ranked again from the checkpoints and the epoch log: here with one line, deleting those
        beyond `keep`; read from `ranking_from`, without touching it (its own worker repairs it)."""
        if self.ranking_from is None or self.ranking_from.resolve() == self.directory.resolve():
            if not state_damaged(self.directory):
                return self._readable(read_state(self.directory))
            kept, unranked = self._ranking_rebuilt(self.directory)
            self._rank(kept)
            left = f"; not ranked (no {self.monitor} in the epoch log), left in place: " + ", ".join(
                k["checkpoint"] for k in unranked) if unranked else ""
            self.say(f"keep-best: {self.directory / STATE_FILE} was damaged; its ranking is rebuilt from the kept "
                     f"checkpoints and the epoch log: epochs {', '.join(str(k['epoch']) for k in self.kept) or 'none'}"
                     + left)
            return self.kept
        if state_damaged(self.ranking_from):  # the same ranking the chief rebuilds: its best are never deleted
            kept = self._ranking_rebuilt(self.ranking_from)[0]
            kept = sorted(kept, key=lambda k: k["value"], reverse=self.mode == "max")[:self.keep]
        else:
            kept = read_state(self.ranking_from)
        return [{**k, "checkpoint": str(self.directory / "best" / f"epoch-{k['epoch']}")} for k in kept]

    def _readable(self, kept: List[dict]) -> List[dict]:
        """`kept` less the checkpoints that cannot be read whole (deleted, with one line), the ranking written
        again if any was; files of `best/` no ranked checkpoint owns (a kill inside a deletion) are removed."""
        damaged = [k for k in kept if not _reads_whole(k["checkpoint"])]
        for k in damaged:
            _delete(k["checkpoint"])
        owned = {Path(k["checkpoint"]).name for k in kept if k not in damaged}
        for path in self.directory.glob("best/epoch-*"):
            if path.name.split(".")[0] not in owned:  # also a killed write's `epoch-N_temp` folder
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        if damaged:
            kept = [k for k in kept if k not in damaged]
            _write_state(self.directory, kept)
            self.say(f"keep-best: the kept checkpoint(s) of epoch(s) {', '.join(str(k['epoch']) for k in damaged)} "
                     f"in {self.directory / 'best'} could not be read (damaged); removed from the ranking")
        return kept

    def _ranking_rebuilt(self, directory: Path):
        """`(ranked, unranked)`: the `best/epoch-E` checkpoints in `directory` with a finite `monitor` value in
        `history_file`, unsorted, and those without one."""
        kept, unranked = [], []
        for index in sorted(directory.glob("best/epoch-*.index")):
            epoch = int(re.search(r"epoch-(\d+)", index.name).group(1))
            value = logged_value(self.history_file, epoch - 1, self.monitor) if self.history_file else None
            (unranked if value is None or not math.isfinite(value) else kept).append(
                {"epoch": epoch, "value": value, "checkpoint": str(index.with_suffix(""))})
        return kept, unranked

    def on_epoch_end(self, epoch, logs=None):
        with quiet_retracing():
            self._epoch_end(epoch, logs)

    def _epoch_end(self, epoch, logs):
        from tftrain import _compat

        if self._offset is None:  # a later fit of this callback that numbers its epochs from the start again
            resumed = _compat.initial_epoch(self.model, 0) > 0  # (a restore's epochs are those trained again)
            self._offset = self._ended - epoch if self._ended > epoch and not resumed else 0
        epoch += self._offset
        self._ended = epoch + 1
        self.last = self._last.save(checkpoint_number=epoch + 1)
        redone = [k for k in self.kept if k["epoch"] >= epoch + 1]  # ranked before a kill, trained again
        if redone:
            for k in redone:
                _delete(k["checkpoint"])
            self.kept = [k for k in self.kept if k["epoch"] < epoch + 1]
            _write_state(self.directory, self.kept)
        value, self._logs = (logs or {}).get(self.monitor), logs or {}
        unvalidated = self.monitor.startswith("val_") and not any(k.startswith("val_") for k in logs or {})
        if value is None:  # an epoch without validation (validation_freq) says nothing of the name
            if not unvalidated:
                self._warn_missing()
            return
        self._valued = True
        value = float(value)
        if not math.isfinite(value):  # a diverged epoch ranks nowhere (a NaN would sort first)
            return
        if len(self.kept) >= self.keep and not self._better(value, self.kept[-1]["value"]):
            return
        path = self._checkpoint.write(str(self.directory / "best" / f"epoch-{epoch + 1}"))
        self._rank(self.kept + [{"epoch": epoch + 1, "value": value, "checkpoint": path}])

    def on_train_end(self, logs=None):
        if self._logs is not None and not self._valued:  # epochs ended, none with the monitor (no validation)
            self._warn_missing()

    def _warn_missing(self) -> None:
        if not self._warned:
            self._warned = True
            self.say(f"keep-best: the epoch logs have no {self.monitor!r} (they have {', '.join(sorted(self._logs))}); "
                     "pass --monitor (monitor= in Python) with one of them. Only the last checkpoint is kept.")

    def _rank(self, candidates: List[dict]) -> None:
        """Keeps the `keep` best of `candidates` (best first), deletes the others' checkpoints, writes the ranking."""
        ranked = sorted(candidates, key=lambda k: k["value"], reverse=self.mode == "max")
        for dropped in ranked[self.keep:]:
            _delete(dropped["checkpoint"])
        self.kept = ranked[:self.keep]
        _write_state(self.directory, self.kept)

    def _better(self, value: float, than: float) -> bool:
        return value < than if self.mode == "min" else value > than

    def summary(self) -> dict:
        """Plain data for `metrics.json`: monitor, mode (`min` / `max`), kept, last."""
        return {"monitor": self.monitor, "mode": self.mode, "kept": self.kept, "last": self.last}


class _Retracing(logging.Filter):
    def filter(self, record) -> bool:
        return "triggered tf.function retracing" not in record.getMessage()


@contextlib.contextmanager
def quiet_retracing():
    """While open, TensorFlow's retracing warning is dropped: a checkpoint's saver traces a function per save of
    variables placed on parameter servers (TensorFlow 2.21), which warns from the fifth epoch on, and keras-tuner's
    trials trace theirs per batch size, as they should."""
    logger, quiet = tf.get_logger(), _Retracing()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def read_state(directory) -> List[dict]:
    """The ranked checkpoints of `directory/keep_best.json` whose files exist, best first, each `checkpoint` in
    `directory` (wherever the run directory was when written); [] if none."""
    try:
        kept = json.loads((Path(directory) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return []
    kept = [{**k, "checkpoint": str(Path(directory) / "best" / f"epoch-{k['epoch']}")} for k in kept
            if isinstance(k, dict) and isinstance(k.get("epoch"), int)]
    return [k for k in kept if tf.io.gfile.exists(f"{k['checkpoint']}.index")]


def state_damaged(directory) -> bool:
    """Whether `directory/keep_best.json` exists and does not read as a list of rankings."""
    path = Path(directory) / STATE_FILE
    if not path.is_file():
        return False
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        return True
    return not isinstance(kept, list) or not all(isinstance(k, dict) and {"epoch", "value", "checkpoint"} <= set(k)
                                                 for k in kept)


def best_checkpoint(directory) -> Optional[str]:
    """The best kept checkpoint's path in a checkpoints directory, else None."""
    kept = read_state(directory)
    return kept[0]["checkpoint"] if kept else None


def _write_state(directory: Path, kept: List[dict]) -> None:
    """Writes the ranking, each checkpoint's path relative to `directory` (a moved run directory reads it whole)."""
    write_text_atomic(directory / STATE_FILE, json.dumps(
        [{**k, "checkpoint": f"best/epoch-{k['epoch']}"} for k in kept], indent=1), durable=True)


def _delete(prefix: str) -> None:
    """Deletes checkpoint `prefix`'s files, its data before its index (a kill in between leaves no data file that
    no index names)."""
    for path in sorted(tf.io.gfile.glob(f"{prefix}.*"), key=lambda p: p.endswith(".index")):
        tf.io.gfile.remove(path)


def _text(path: Path) -> bool:
    """Whether `path` reads as UTF-8 text, not empty, without NUL bytes."""
    try:
        text = path.read_bytes().decode("utf-8")
        return bool(text.strip()) and "\0" not in text
    except (OSError, UnicodeDecodeError):
        return False


def _reads_whole(prefix: str) -> bool:
    """Whether every tensor of checkpoint `prefix` reads back (its checksums match)."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
        return True
    except Exception:  # noqa: BLE001 (DataLossError, NotFoundError, ... on a damaged file)
        return False
