"""What tftrain needs from Keras and TensorFlow that has no public API, in one place.

Each entry names what it relies on and the versions it was checked on: TensorFlow 2.21 with
Keras 3.15 (`CHECKED`). `check_versions()` says in one line when the installed pair is outside them.
"""

from __future__ import annotations

from typing import Optional

CHECKED = {"tensorflow": ("2.21",), "keras": ("3.15",)}
"""The minor versions each private use below was checked on."""


def set_initial_epoch(model, epoch: int) -> None:
    """Tells a running `Model.fit` (called from `on_train_begin`) to start at `epoch`, as Keras's own
    `keras.callbacks.BackupAndRestore` does: `fit` reads `model._initial_epoch` after `on_train_begin`
    (keras/src/backend/tensorflow/trainer.py and keras/src/callbacks/backup_and_restore.py, Keras 3.15).
    There is no public way for a callback to move the first epoch of a `fit` already called."""
    model._initial_epoch = epoch


def initial_epoch(model, default: int) -> int:
    """The epoch a restoring callback set with `set_initial_epoch` (or Keras's `BackupAndRestore`), else `default`."""
    return getattr(model, "_initial_epoch", None) or default


def check_versions(versions: Optional[dict] = None) -> Optional[str]:
    """One line naming an installed version outside `CHECKED`, or None when both are checked.

    Args:
        versions: `{"tensorflow": "2.21.0", "keras": "3.15.1"}`; defaults to the installed ones.
    """
    if versions is None:
        import keras
        import tensorflow as tf

        versions = {"tensorflow": tf.__version__, "keras": keras.__version__}
    for name, version in versions.items():
        minor = ".".join(str(version).split(".")[:2])
        if minor not in CHECKED.get(name, (minor,)):
            return (f"{name} {version} is not a version tftrain was checked on ({', '.join(CHECKED[name])}); "
                    f"its use of {name}'s internals (tftrain/_compat.py) may not hold: install {name}=="
                    f"{CHECKED[name][-1]}.*")
    return None
