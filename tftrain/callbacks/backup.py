"""StepBackup: checkpoints at each epoch end and every N optimizer steps; a rerun resumes at the step.

Keras 3's `BackupAndRestore(save_freq=N)` restores the epoch, not the step, so it reruns steps already in the weights.
`StepBackup` restores weights, optimizer state, epoch and step from numbered checkpoints committed by their metadata
(`tftrain.checkpoint_files`: a kill leaves a complete one), falls back to the previous one if the newest does not
load, and ends the resumed epoch once its steps are done (its data restart at a pass's start; no batch is replayed).
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from typing import Callable, Optional

import keras
import numpy as np

from tftrain import checkpoint_files
from tftrain.callbacks._steps import optimizer_steps
from tftrain.checkpoint_files import BackupPosition
from tftrain.errors import ConfigError, check_int
from tftrain.files import replaced
from tftrain.runtime.execution_probe import held_optimizers
from tftrain.runtime.precision import built_by_own_step

SPACE_MARGIN = 1 << 20
"""Bytes a save needs beyond the checkpoint's size (HDF5 structure, metadata)."""


class _EndOfResumedEpoch:
    """The `model.stop_training` that ends only the resumed epoch: truthy for `fit`'s loop, and told apart from a
    stop another callback asks for (which sets True) at the epoch's end."""

    def __bool__(self) -> bool:
        return True


_END_OF_RESUMED_EPOCH = _EndOfResumedEpoch()


class StepBackup(keras.callbacks.Callback):
    """Backs up the training state at each epoch end and every `every_steps` optimizer steps; a rerun resumes at
    that step. Saves fall between executions, so a kill loses at most `every_steps` steps when it is a multiple of
    `steps_per_execution`. Place it after `NanGuard` and before `EarlyStopping`.

    Args:
        backup_dir: its own directory (deleted at the end with `delete_checkpoint`).
        every_steps: batches (micro-batches under accumulation) between checkpoints. Defaults to None (epoch ends).
        steps_per_epoch: used when `params["steps"]` is None (unknown cardinality). Defaults to None.
        delete_checkpoint: delete `backup_dir` when training ends, as `BackupAndRestore` (the Trainer passes False
            and deletes it once its outputs are written). Defaults to True.
        stop_requested: `() -> signal number or None`, read after each execution and epoch
            (`PreemptionWatch.requested`); a signal saves and raises `Preempted` (at an epoch's end, as `fit`
            ends: the callbacks after this one have that epoch's end too). Defaults to None.
        say: prints a skipped checkpoint's line. Defaults to stderr.

    Raises:
        ValueError: `every_steps` is not a positive integer.
        tftrain.errors.RunDirError: at `on_train_begin`, when checkpoints exist and none can be read.

    Example:
        >>> model.fit(dataset, epochs=10, callbacks=[NanGuard(), StepBackup("run/backup", every_steps=100)])
    """

    def __init__(self, backup_dir, every_steps: Optional[int] = None, steps_per_epoch: Optional[int] = None,
                 delete_checkpoint: bool = True, stop_requested: Optional[Callable[[], Optional[int]]] = None,
                 say: Optional[Callable[[str], None]] = None, batch_size: Optional[int] = None):
        check_int(every_steps, "every_steps", none_ok=True)
        super().__init__()
        self.backup_dir = str(backup_dir)
        self.every_steps, self.steps_per_epoch = every_steps, steps_per_epoch
        self.delete_checkpoint = delete_checkpoint
        self.stop_requested, self.batch_size = stop_requested, batch_size
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.restored: Optional[BackupPosition] = None
        self.held_afresh: tuple = ()  # the optimizers a train_step holds that a resume did not load
        self._resume: Optional[BackupPosition] = None
        self._current_epoch = 0
        self._steps = self._since_save = 0
        self._last_batch = -1
        self._number = 0  # the next checkpoint's number
        self._size: Optional[int] = None  # bytes of the newest weights file written here

    def on_train_begin(self, logs=None):
        """Restores the newest usable checkpoint (`restore`)."""
        position = self.restore()
        self.restored = position
        self._resume = position if position is not None and position.steps_in_epoch > 0 else None
        self._since_save, self._size, self._epochs_ended, self._stop_at_end = 0, None, 0, None
        if self._resume is not None and not ((self.params or {}).get("steps") or self.steps_per_epoch):
            self.say(f"resuming inside epoch {position.epoch + 1} after its {position.steps_in_epoch} step(s) on data "
                     "of unknown length: that epoch reads its whole data again on top of them; pass steps_per_epoch "
                     "to fit and StepBackup to resume it exactly")
        self._number = checkpoint_files.next_number(self.backup_dir)

    def restore(self) -> Optional[BackupPosition]:
        """Loads the newest usable checkpoint and sets `fit`'s first epoch; returns its position or None.

        Raises:
            tftrain.errors.RunDirError: checkpoints exist and none can be read.
            ConfigError: checkpoints exist and the model is not built.
        """
        from tftrain import _compat

        checkpoints = checkpoint_files.checkpoints(self.backup_dir)
        # fit builds a model made outside a strategy on its first step; Keras 3's build(shape) of a subclassed
        # model leaves its layers unbuilt, without weights
        unbuilt = not self.model.built or not self.model.weights and not all(l.built for l in self.model.layers)
        if unbuilt and self.model.weights and built_by_own_step(self.model):  # a VAE without call(): its layers
            self.model.built, unbuilt = True, False  # are built, and Keras saves weights only of a model marked built
        if unbuilt and not checkpoints:
            self.say("warning: the model is not built as fit starts (a subclassed model builds on its first batch): "
                     "call it on one batch before fit (model(x[:1])), or a resume cannot load its checkpoints")
        elif unbuilt:
            raise ConfigError(f"the model is not built as fit starts, so the checkpoint in {self.backup_dir} cannot "
                              "be loaded into it (a subclassed model builds on its first batch): call it on one batch "
                              "before fit (model(x[:1]))")
        skipped = []  # (checkpoint, why)
        for checkpoint in checkpoints:
            why = self._load(checkpoint)
            if why is not None:
                skipped.append((checkpoint, why))
                continue
            if skipped:
                self.say(_fallback_line(skipped, checkpoint))
            if self.held_afresh:
                self.say(f"resuming: the optimizers the model's train_step applies ({', '.join(self.held_afresh)}) "
                         "are not built yet, so Keras loads none of their state (e.g. Adam's moments) and they start "
                         "afresh; build each in build_model (e.g. self.d_optimizer.build(self.discriminator."
                         "trainable_variables)) to resume them too")
            _compat.set_initial_epoch(self.model, checkpoint.position.epoch)
            return checkpoint.position
        if skipped:
            from tftrain.errors import RunDirError

            checkpoint, why = skipped[0]
            raise RunDirError(f"no checkpoint in {self.backup_dir} can be read ({checkpoint.name}: {why}): "
                              f"delete {self.backup_dir} to train from the start")
        return None

    def _load(self, checkpoint) -> Optional[str]:
        """Loads `checkpoint`; returns why it cannot be used, or None once loaded."""
        if checkpoint.position is None:
            return "its metadata cannot be read" if checkpoint.metadata.exists() else "its metadata is missing"
        crc = checkpoint.position.crc32
        try:
            if crc is not None and checkpoint_files.crc32(checkpoint.weights) != crc:
                return f"{checkpoint.weights.name} is damaged (its CRC-32 is not the one saved with it)"
        except OSError as error:
            return f"{checkpoint.weights.name} cannot be read: {error.strerror or error}"
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and not optimizer.built:  # its state must exist to be loaded (as in Keras)
            optimizer.build(self.model.trainable_variables)
        held, self.held_afresh = held_optimizers(self.model), ()
        try:
            with warnings.catch_warnings():
                if held or checkpoint.position.optimizer_iterations == 0:  # restore says what was not loaded; a
                    # compiled optimizer that never stepped holds its initial state, built or not when saved
                    warnings.filterwarnings("ignore", "Skipping variable loading for optimizer")
                self.model.load_weights(checkpoint.weights)
            if checkpoint.position.optimizer_iterations == 0:  # the train_step steps only the ones it holds
                self.held_afresh = tuple(name for name, o in held.items() if not int(o.iterations.numpy()))
        except Exception as error:  # noqa: BLE001 (h5py and Keras raise many kinds on a bad file)
            return f"{checkpoint.weights.name} cannot be read: {(str(error).splitlines() or [''])[0][:160]}"
        if checkpoint.position.optimizer_iterations not in (None, optimizer_steps(self.model)):
            return f"{checkpoint.weights.name} does not match its metadata"
        return None

    def steps_done_in(self, epoch: int) -> int:
        """Batches of `epoch` (0-based) the restored checkpoint had done, else 0 (for `ps_training.fit`'s loop)."""
        resumed = self._resume is not None and self._resume.epoch == epoch
        return self._resume.steps_in_epoch if resumed else 0

    def on_epoch_begin(self, epoch, logs=None):
        self._current_epoch = epoch
        self._steps = self.steps_done_in(epoch)
        self._last_batch = -1

    def on_train_batch_end(self, batch, logs=None):
        ran, self._last_batch = batch - self._last_batch, batch  # one hook per execution
        self._steps += ran
        self._since_save += ran
        epoch_steps = (self.params or {}).get("steps") or self.steps_per_epoch
        if epoch_steps and self._steps >= epoch_steps:  # last execution: on_epoch_end saves
            if self._resume is not None and not self.model.stop_training:  # the resumed epoch would read a
                self.model.stop_training = _END_OF_RESUMED_EPOCH  # whole pass
            return
        if self.every_steps and self._since_save >= self.every_steps:
            self._save(self._current_epoch, self._steps)
        self._stop_if_requested(self._current_epoch, self._steps)

    def on_epoch_end(self, epoch, logs=None):
        if self.model.stop_training is _END_OF_RESUMED_EPOCH:  # not a stop another callback asked for since
            self.model.stop_training = False
        self._resume, self._epochs_ended = None, self._epochs_ended + 1
        self._save(epoch + 1, 0)
        if self.stop_requested and self.stop_requested() is not None:  # once every callback has had this epoch's
            self._stop_at_end, self.model.stop_training = epoch + 1, True  # end (TensorBoard, your own): on_train_end

    def on_train_end(self, logs=None):
        from tftrain import _compat

        _compat.clear_initial_epoch(self.model)
        if self._stop_at_end is not None:  # a stop requested at an epoch's end, saved there
            self._stop_if_requested(self._stop_at_end, 0)
        epochs = (self.params or {}).get("epochs", 0)
        ended = self._epochs_ended or (self.restored is not None and self.restored.epoch >= epochs)
        if self.delete_checkpoint and ended and not (self.stop_requested and self.stop_requested()):  # not when
            # a stop is pending (raised once fit returns: its rerun resumes here) or no epoch ran (BatchSizeFinder)
            shutil.rmtree(self.backup_dir, ignore_errors=True)
            watch = getattr(self.stop_requested, "__self__", None)  # a PreemptionWatch's `requested`: a signal
            if hasattr(watch, "training_ended"):  # from now on has nothing left to save
                watch.training_ended = True

    def _stop_if_requested(self, epoch: int, steps_in_epoch: int) -> None:
        """On a requested stop: saves this step (unless just saved) and raises `Preempted`."""
        signum = self.stop_requested() if self.stop_requested else None
        if signum is None:
            return
        if self._since_save:
            self._save(epoch, steps_in_epoch)
        import signal

        from tftrain.errors import Preempted

        at = BackupPosition(epoch, steps_in_epoch, optimizer_steps(self.model)).where()
        raise Preempted(f"stopped by {signal.Signals(signum).name}: checkpoint saved at {at}", signum)

    def _needed_bytes(self) -> int:
        """Bytes the next save needs: the last checkpoint's size, else the variables', plus `SPACE_MARGIN`."""
        if self._size is not None:
            return self._size + SPACE_MARGIN
        variables = [*self.model.weights, *getattr(self.model.optimizer, "variables", [])]
        return sum(int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize for v in variables) + SPACE_MARGIN

    def _check_space(self) -> None:
        """Raises `CheckpointSpaceError` if the next checkpoint will not fit (HDF5 can crash on a full disk)."""
        from tftrain.errors import CheckpointSpaceError

        need, free = self._needed_bytes(), shutil.disk_usage(self.backup_dir).free
        if free < need:
            kept = ("The previous checkpoint is intact: free space on that disk."  # the run's line says how to resume
                    if checkpoint_files.read_position(self.backup_dir) is not None else
                    "No checkpoint was written before it: free space on that disk (a rerun starts over).")
            raise CheckpointSpaceError(
                f"No space for the checkpoint in {self.backup_dir}: it needs about {need / 1e6:,.1f} MB and "
                f"{free / 1e6:,.1f} MB are free. {kept}")

    def _save(self, epoch: int, steps_in_epoch: int) -> None:
        """Writes checkpoint `_number`: the weights file, then the metadata that commits it."""
        os.makedirs(self.backup_dir, exist_ok=True)
        self._check_space()
        with replaced(checkpoint_files.weights_path(self.backup_dir, self._number), durable=True) as tmp:
            self.model.save_weights(tmp)
            self._size, crc = os.path.getsize(tmp), checkpoint_files.crc32(tmp)
        policy = getattr(getattr(self.model, "dtype_policy", None), "name", None)  # the policy it trains in
        position = BackupPosition(epoch, steps_in_epoch, optimizer_steps(self.model), self.batch_size, policy, crc)
        checkpoint_files.commit(self.backup_dir, self._number, position)
        self._number += 1
        self._since_save = 0


def _fallback_line(skipped, used) -> str:
    """`resuming: skipped the newest checkpoint (...); resuming instead from ckpt-4.json at ...: N optimizer steps
    earlier than the newest` (it corrects the run's `resuming:` line, read from the newest checkpoint's metadata)."""
    what = "; ".join(f"{c.name}: {why}" for c, why in skipped)
    newest = max((c.position.optimizer_iterations for c, _ in skipped
                  if c.position is not None and c.position.optimizer_iterations is not None), default=None)
    ours = used.position.optimizer_iterations
    cost = f": {newest - ours} optimizer steps earlier than the newest" if None not in (newest, ours) else ""
    return (f"resuming: skipped the newest checkpoint ({what}); resuming instead from {used.name} at "
            f"{used.position.where()}{cost}")
