"""Remembered `--execution auto` choices: time graph against XLA once per model and machine.

The answer depends only on what the step computes and where (model config and dtype policy,
optimizer, loss, batch shapes, `steps_per_execution`, devices, threads, TF / Keras versions), so
it is kept under a hash of those in `cache_dir() / "execution.json"`. `--no-remember-execution`
(`runtime.remember_execution`) times every run again.

Limits: the key sees a model through its Keras config, so an edit to a custom layer's `call()`
that keeps its config keeps the old choice, as does a choice timed in a noisy spell; pass
`--no-remember-execution` then, or delete the file.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Optional

import filelock

from tftrain import _compat
from tftrain.host import cpu_model, usable_cores

CACHE_ENV = "TFTRAIN_CACHE_DIR"
"""Environment variable naming the cache folder (overrides the user cache folder)."""

FILE_NAME = "execution.json"
"""The memory's file inside the cache folder."""

MAX_ENTRIES = 256
"""Choices kept; the oldest are dropped beyond this."""

LOCK_TIMEOUT_S = 10.0
"""Seconds a write waits for another process's lock before it is skipped."""


def cache_dir() -> Path:
    """`$TFTRAIN_CACHE_DIR`, else `platformdirs.user_cache_dir("tftrain")`."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    import platformdirs

    return Path(platformdirs.user_cache_dir("tftrain"))


def _model_description(model) -> Optional[str]:
    """The model's config as JSON, layer and optimizer names replaced by their order (Keras numbers
    them per process); None when Keras cannot serialise it (the model is then timed every run)."""
    try:
        description = json.loads(model.to_json())
    except Exception:  # noqa: BLE001 (NotImplementedError, TypeError, ...: no stable description)
        return None
    # compile_config holds the learning rate schedule (which --epochs changes); the loss and
    # optimizer class key the step instead.
    description.pop("compile_config", None)
    optimizer = getattr(model, "optimizer", None)
    names = {model.name, getattr(optimizer, "name", None),
             *(layer.name for layer in _compat.flatten_layers(model))}
    canonical: dict = {}

    def rename(value):
        if isinstance(value, dict):
            return {k: rename(v) for k, v in value.items()}
        if isinstance(value, list):
            return [rename(v) for v in value]
        if isinstance(value, str) and value in names:
            return canonical.setdefault(value, f"layer{len(canonical)}")
        return value

    return json.dumps(rename(description), sort_keys=True)


def _loss_description(loss) -> str:
    """The loss as Keras serialises it (names, classes, configs; no memory addresses), else its type."""
    import keras

    try:
        return json.dumps(keras.saving.serialize_keras_object(loss), sort_keys=True, default=str)
    except Exception:  # noqa: BLE001 (an object Keras cannot serialise)
        return f"{type(loss).__module__}.{type(loss).__qualname__}"


def _gpu_details() -> list:
    """Each GPU's name and compute capability (empty without GPUs)."""
    import tensorflow as tf

    details = []
    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            info = tf.config.experimental.get_device_details(gpu)
        except Exception:  # noqa: BLE001 (a driver that reports nothing)
            info = {}
        details.append([info.get("device_name"), info.get("compute_capability")])
    return details


def execution_key(model, dataset, candidates) -> Optional[str]:
    """A hex SHA-256 of everything the graph-vs-XLA answer depends on (of `dataset`, its element
    spec), or None when the model has no stable description."""
    import keras
    import tensorflow as tf

    description = _model_description(model)
    if description is None:
        return None
    optimizer = getattr(model, "optimizer", None)
    parts = {
        "model": description,
        "optimizer": type(optimizer).__name__ if optimizer is not None else None,
        "loss": _loss_description(getattr(model, "loss", None)),
        "batch": repr(dataset.element_spec),
        "steps_per_execution": int(getattr(model, "steps_per_execution", 1) or 1),
        "candidates": list(candidates),
        "devices": [d.name for d in tf.config.list_logical_devices()],
        "threads": [tf.config.threading.get_intra_op_parallelism_threads(),
                    tf.config.threading.get_inter_op_parallelism_threads()],
        "replicas": model.distribute_strategy.num_replicas_in_sync,
        "versions": [tf.__version__, keras.__version__],
        "machine": [cpu_model(), usable_cores(), _gpu_details()],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class ExecutionMemory:
    """Remembered `ExecutionChoice`s in one JSON file, keyed by `execution_key`.

    A missing or corrupt file is an empty memory. Writes lock `<file>.lock` around read, change and
    atomic rename, so concurrent processes keep each other's entries (reads need no lock); a write
    that fails or waits past `LOCK_TIMEOUT_S` is skipped silently: the memory only saves time.

    Args:
        path: the JSON file. Defaults to `cache_dir() / "execution.json"`.

    Example:
        >>> memory = ExecutionMemory()
        >>> choice = memory.get(key) or memory.put(key, choose_execution(model, probe))
    """

    def __init__(self, path=None):
        self.path = Path(path) if path is not None else cache_dir() / FILE_NAME

    @property
    def lock_path(self) -> Path:
        """The lock file beside the memory's file."""
        return self.path.with_name(f"{self.path.name}.lock")

    def _entries(self) -> dict:
        try:
            entries = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return entries if isinstance(entries, dict) else {}

    def _update(self, change: Callable[[dict], Optional[dict]]) -> None:
        """Applies `change` (entries -> entries to write, or None) under the lock."""
        from tftrain.rundir import write_text_atomic

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with filelock.FileLock(self.lock_path, timeout=LOCK_TIMEOUT_S):
                entries = change(self._entries())
                if entries is not None:
                    write_text_atomic(self.path, json.dumps(entries, indent=1))
        except (OSError, filelock.Timeout):  # unwritable, or locked too long: the memory only saves time
            pass

    def get(self, key: Optional[str]):
        """The remembered `ExecutionChoice` for `key` (its `remembered` names when it was timed), or None."""
        from tftrain.runtime.execution import ExecutionChoice, StepTiming

        entry = self._entries().get(key) if key else None
        try:
            timings = {mode: StepTiming(**{**t, "execution_times_s": tuple(t["execution_times_s"])})
                       for mode, t in entry["timings"].items()}
            choice = ExecutionChoice(entry["execution"], timings, entry["reason"], remembered=entry["saved_at"],
                                     steps_per_execution=entry.get("steps_per_execution"),
                                     skipped=tuple(entry.get("skipped", ())),
                                     time_again_from_steps=entry.get("time_again_from_steps"))
        except Exception:  # noqa: BLE001 (no entry, or one of another shape: time it again)
            return None
        return choice if choice.execution in ("graph", "xla") and choice.execution in timings else None

    def put(self, key: Optional[str], choice):
        """Remembers `choice` under `key` (None: nothing), keeping the newest `MAX_ENTRIES`; returns `choice`."""
        if key:
            self.put_entry(key, {**choice.to_dict(), "saved_at": datetime.datetime.now().isoformat(timespec="seconds")})
        return choice

    def get_entry(self, key: str) -> Optional[dict]:
        """The raw entry under `key`, or None (for other measurements, e.g. `thread_choice`'s)."""
        entry = self._entries().get(key)
        return entry if isinstance(entry, dict) else None

    def put_entry(self, key: str, entry: dict) -> None:
        """Writes the raw JSON-ready `entry` under `key`, as `put` does."""

        def add(entries: dict) -> dict:
            entries.pop(key, None)
            entries[key] = entry
            return dict(list(entries.items())[-MAX_ENTRIES:])

        self._update(add)

    def forget(self, key: Optional[str]) -> None:
        """Removes the choice under `key` (if any), so that the next run times it again."""
        if not key:
            return

        def remove(entries: dict) -> Optional[dict]:
            if key not in entries:
                return None  # nothing to write
            del entries[key]
            return entries

        self._update(remove)
