"""StepBackup: Keras's `BackupAndRestore`, also every N optimizer steps, resuming mid-epoch.

Keras 3's `BackupAndRestore(save_freq=N)` (keras/src/callbacks/backup_and_restore.py,
read in Keras 3.15) saves every N batches and restores the epoch (a resumed run no longer
trains every epoch again, keras-team/keras#19179), but not the step within it: it runs
the interrupted epoch again from its first batch, on weights that already hold the steps
done before the save, so those steps are done twice. A save at an epoch's last batch is
labelled with that epoch (a resume runs the finished epoch again); under
`steps_per_execution` > 1 its count drops one step at each epoch start (saves come
further apart than N); and a resumed run labels its checkpoints epoch 0 until its first
epoch ends (`_current_epoch` starts at 0). `StepBackup` keeps Keras's restore (weights, optimizer
state and epoch; the previous checkpoint when the latest cannot be read) and file
layout, and:

* saves at each epoch end and, given `every_steps`, every that many optimizer steps,
  counted from the batch indices Keras passes (one hook covers one execution of
  `steps_per_execution` steps);
* writes the weights, then metadata naming the epoch, the steps of the epoch done and
  `optimizer.iterations`, each through a temporary file and a rename (the previous pair is
  kept as Keras's `*.bkp` by hard links, not copies: a 39 MB checkpoint's copy took 10-40
  ms of every save); a checkpoint whose
  metadata does not match its weights (a kill between the two renames) gives way to the
  previous one;
* ends the resumed epoch at the execution that completes its steps (it sets
  `model.stop_training` and clears it again in `on_epoch_end`), so an interrupted run
  takes as many optimizer steps in all as an uninterrupted one. The resumed epoch reads
  its data from the start of a pass: the steps are not redone, but which batches they
  see is not replayed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Callable, Optional

import keras
import numpy as np

from tftrain.callbacks._steps import optimizer_steps
from tftrain.errors import check_int
from tftrain.rundir import write_text_atomic

SPACE_MARGIN = 1 << 20
"""Bytes of room a save needs beyond the checkpoint's own size (HDF5 structure, metadata)."""

METADATA_FILE = "training_metadata.json"
"""The checkpoint's metadata file in the backup directory (Keras's name)."""


@dataclasses.dataclass(frozen=True)
class BackupPosition:
    """Where a checkpoint stands in the run.

    Attributes:
        epoch: epochs completed.
        steps_in_epoch: batches (optimizer steps) of the next epoch done (0 at an
            epoch end).
        optimizer_iterations: `optimizer.iterations` when it was saved; None in a
            checkpoint written by Keras's own `BackupAndRestore`.
    """

    epoch: int
    steps_in_epoch: int = 0
    optimizer_iterations: Optional[int] = None


def read_position(path) -> Optional[BackupPosition]:
    """The position a checkpoint's metadata records.

    Args:
        path: a backup directory, or its metadata file.

    Returns:
        A `BackupPosition`, or None when the file is missing or unreadable.
    """
    path = Path(path)
    if path.is_dir():
        path = path / METADATA_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        return BackupPosition(int(meta["epoch"]), int(meta.get("steps_in_epoch", 0)), meta.get("optimizer_iterations"))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _keep_as(src: str, dst: str) -> None:
    """Makes `dst` hold `src`'s current content, replacing it atomically: a hard link (no bytes copied:
    `src` is then replaced by a new file, never written in place), else a copy where links are refused."""
    tmp = dst + ".link"
    try:
        if os.path.lexists(tmp):
            os.remove(tmp)
        os.link(src, tmp)
    except OSError:  # a file system without hard links
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def _reuse_as(src: str, dst: str) -> None:
    """Links `dst` to `src`'s file before `src` is replaced, so that the file lives on at `dst` to be
    rewritten in place; nothing where links are refused or `src` is missing (`dst` is then written anew)."""
    try:
        if os.path.lexists(dst):
            os.remove(dst)
        os.link(src, dst)
    except OSError:
        pass


class StepBackup(keras.callbacks.BackupAndRestore):
    """Backs up the training state at each epoch end and every `every_steps` optimizer steps;
    a rerun resumes at the step it was saved at.

    A run killed at any moment loses at most `every_steps` optimizer steps when
    `every_steps` is a multiple of the model's `steps_per_execution` (a checkpoint
    can only be written between executions; the Trainer rounds it down to one). The
    checkpoint deferred at an epoch's last execution is written by `on_epoch_end`,
    after validation. With finite data whose steps per epoch are not a multiple of
    `steps_per_execution`, the resumed epoch's last execution runs whole, where the
    uninterrupted epoch's ran short: up to `steps_per_execution - 1` extra steps.

    Place it after `NanGuard`, whose exception keeps a diverged state from being
    saved, and before `EarlyStopping`, which must see `stop_training` as this callback
    leaves it.

    Args:
        backup_dir: the backup directory (its own: Keras deletes it when training ends).
        every_steps: batches (optimizer steps; micro-batches under gradient
            accumulation) between checkpoints within an epoch, >= 1; None saves at
            epoch ends only. Defaults to None.
        steps_per_epoch: batches per epoch, used when Keras cannot tell
            (`params["steps"]` is None: data of unknown cardinality). Defaults to None.
        double_checkpoint: keep the previous checkpoint as `*.bkp`. Defaults to True.
        delete_checkpoint: delete `backup_dir` when training ends, as Keras does.
            False keeps it until the caller has written what the training was
            for (the Trainer removes it once `metrics.json` and the model are on
            disk, so a kill in between resumes without training again).
            Defaults to True.
        stop_requested: `() -> signal number or None`, read after each execution
            and at each epoch end (`PreemptionWatch.requested`); when it returns
            a signal, the state at that step is saved and `Preempted` is raised.
            Defaults to None (never asked).
        say: prints one line (a skipped damaged checkpoint). Defaults to
            printing on stderr.

    Raises:
        ValueError: when `every_steps` is not a positive integer.

    Example:
        >>> model.fit(dataset, epochs=10, callbacks=[NanGuard(), StepBackup("run/backup", every_steps=100)])
    """

    def __init__(self, backup_dir, every_steps: Optional[int] = None, steps_per_epoch: Optional[int] = None,
                 double_checkpoint: bool = True, delete_checkpoint: bool = True,
                 stop_requested: Optional[Callable[[], Optional[int]]] = None,
                 say: Optional[Callable[[str], None]] = None):
        check_int(every_steps, "every_steps", none_ok=True)
        super().__init__(str(backup_dir), save_freq="epoch", double_checkpoint=double_checkpoint,
                         delete_checkpoint=delete_checkpoint)
        self.every_steps, self.steps_per_epoch = every_steps, steps_per_epoch
        self.stop_requested = stop_requested
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.restored: Optional[BackupPosition] = None
        self._resume: Optional[BackupPosition] = None
        self._steps = self._since_save = 0
        self._last_batch = -1
        self._ended_early = False
        self._weights = None  # the model's WeightsFile, made at the first save
        self._wrote_latest = False  # the newest weights file is this process's (a template for the next)

    def on_train_begin(self, logs=None):
        """Restores weights, optimizer state and epoch (Keras), then the step within the epoch; a newest
        checkpoint that cannot be read, or whose metadata lags its weights, gives way to the previous
        one, with one line (`say`) naming what was skipped and where the run resumes."""
        try:
            self._load_model()
        except (OSError, ValueError) as error:  # a truncated or corrupt newest checkpoint
            if not os.path.exists(self._prev_weights_path):
                raise
            damaged = self._training_metadata_path if isinstance(error, json.JSONDecodeError) else self._weights_path
            skipped = f"{damaged} cannot be read ({(str(error).splitlines() or [''])[0][:200]})"
            self._restore_previous(skipped, load=False)
            self._load_model()
        position = read_position(self._training_metadata_path)
        if position is not None and position.optimizer_iterations not in (None, optimizer_steps(self.model)):
            position = self._restore_previous(f"{self._training_metadata_path} does not match its weights") \
                or position
        self.restored = position
        self._resume = position if position is not None and position.steps_in_epoch > 0 else None
        self._since_save, self._wrote_latest = 0, False

    def _restore_previous(self, skipped: str, load: bool = True) -> Optional[BackupPosition]:
        """Puts the previous checkpoint in the newest one's place (and loads it, with `load`) when it is
        whole; says which checkpoint was `skipped` and where the run resumes."""
        previous = read_position(self._prev_training_metadata_path)
        if previous is None or not os.path.exists(self._prev_weights_path):
            return None
        shutil.copyfile(self._prev_weights_path, self._weights_path)  # as Keras's fallback does: load the copy
        shutil.copyfile(self._prev_training_metadata_path, self._training_metadata_path)
        if load:
            self.model.load_weights(self._weights_path)
            self.model._initial_epoch = previous.epoch  # as BackupAndRestore._load_model sets it
        at = f"the end of epoch {previous.epoch}" if not previous.steps_in_epoch else \
            f"epoch {previous.epoch + 1}, batch {previous.steps_in_epoch}"
        steps = f" (optimizer step {previous.optimizer_iterations})" if previous.optimizer_iterations is not None else ""
        self.say(f"resuming: skipped the newest checkpoint ({skipped}); resuming from the previous one at {at}{steps}")
        return previous

    def steps_done_in(self, epoch: int) -> int:
        """Batches of `epoch` (0-based) done before this process: the restored checkpoint's
        `steps_in_epoch` when it was written within that epoch, else 0. Loops that run an
        epoch's steps themselves (`tftrain.train.loops.ps_training.fit`) run only the rest."""
        resumed = self._resume is not None and self._resume.epoch == epoch
        return self._resume.steps_in_epoch if resumed else 0

    def on_epoch_begin(self, epoch, logs=None):
        self._current_epoch = epoch  # Keras leaves it at 0 in a resumed run until an epoch ends
        self._steps = self.steps_done_in(epoch)
        self._last_batch = -1

    def on_train_batch_end(self, batch, logs=None):
        ran, self._last_batch = batch - self._last_batch, batch  # one hook per execution
        self._steps += ran
        self._since_save += ran
        epoch_steps = (self.params or {}).get("steps") or self.steps_per_epoch
        if epoch_steps and self._steps >= epoch_steps:  # the epoch's last execution: on_epoch_end saves
            if self._resume is not None:  # the resumed epoch reads a whole pass: end it here
                self.model.stop_training = self._ended_early = True
            return
        if self.every_steps and self._since_save >= self.every_steps:
            self._save(self._current_epoch, self._steps)
        self._stop_if_requested(self._current_epoch, self._steps)

    def on_epoch_end(self, epoch, logs=None):
        if self._ended_early:
            self.model.stop_training = self._ended_early = False
        self._resume = None
        self._save(epoch + 1, 0)
        self._stop_if_requested(epoch + 1, 0)

    def _stop_if_requested(self, epoch: int, steps_in_epoch: int) -> None:
        """Saves this step's state (unless just saved) and raises `Preempted` when a stop was requested."""
        signum = self.stop_requested() if self.stop_requested else None
        if signum is None:
            return
        if self._since_save:
            self._save(epoch, steps_in_epoch)
        import signal

        from tftrain.errors import Preempted

        at = f"the end of epoch {epoch}" if not steps_in_epoch else f"epoch {epoch + 1}, batch {steps_in_epoch}"
        raise Preempted(f"stopped by {signal.Signals(signum).name}: checkpoint saved at {at} "
                        f"(optimizer step {optimizer_steps(self.model)})", signum)

    def _needed_bytes(self) -> int:
        """Bytes the next save writes: the newest checkpoint's size, else the variables' bytes (weights and
        optimizer state), plus `SPACE_MARGIN` for HDF5's own structure and the metadata."""
        try:
            return os.path.getsize(self._weights_path) + SPACE_MARGIN
        except OSError:
            variables = [*self.model.weights, *getattr(self.model.optimizer, "variables", [])]
            return sum(int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize for v in variables) + SPACE_MARGIN

    def _check_space(self) -> None:
        """Raises `CheckpointSpaceError` before writing when the disk cannot hold the new checkpoint (HDF5 can
        crash the process on a full disk, and a half-written file helps no one)."""
        from tftrain.errors import CheckpointSpaceError

        need, free = self._needed_bytes(), shutil.disk_usage(self.backup_dir).free
        if free < need:
            raise CheckpointSpaceError(
                f"No space for the checkpoint in {self.backup_dir}: it needs about {need / 1e6:,.1f} MB and "
                f"{free / 1e6:,.1f} MB are free. The previous checkpoint is intact: free space (or use a --run-dir "
                "on another disk) and rerun the same command to resume.")

    def _save(self, epoch: int, steps_in_epoch: int) -> None:
        """Keeps the previous pair, then writes the weights and the metadata naming them, each whole."""
        os.makedirs(self.backup_dir, exist_ok=True)
        self._check_space()
        tmp = self._weights_path[: -len(".weights.h5")] + ".tmp.weights.h5"
        latest = self._weights_path if self._wrote_latest and os.path.exists(self._weights_path) else None
        if latest and self.double_checkpoint:
            _reuse_as(self._prev_weights_path, tmp)  # the oldest weights file, rewritten in place (WeightsFile)
        if self.double_checkpoint:
            for src, dst in ((self._weights_path, self._prev_weights_path),
                             (self._training_metadata_path, self._prev_training_metadata_path)):
                if os.path.exists(src):
                    _keep_as(src, dst)
        self._weights_file().save(tmp, template=latest)
        meta = {"epoch": epoch, "steps_in_epoch": steps_in_epoch, "optimizer_iterations": optimizer_steps(self.model)}
        os.replace(tmp, self._weights_path)
        write_text_atomic(self._training_metadata_path, json.dumps(meta))
        self._since_save, self._wrote_latest = 0, True

    def _weights_file(self):
        """The model's `WeightsFile`: Keras's format, Keras's own walk only for the first save of a run."""
        from tftrain.callbacks.weights_file import WeightsFile

        if self._weights is None or self._weights.model is not self.model:
            self._weights, self._wrote_latest = WeightsFile(self.model), False
        return self._weights
