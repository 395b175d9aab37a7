"""The `Trainer`'s callbacks stage and backup interval; a mixin of `Trainer`."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from tftrain import rundir as rundir_lib
from tftrain.errors import ConfigError

INPUT_CHECK_BATCHES = 50
"""Batches the ThroughputMonitor's input check reads from the training pipeline alone."""


@dataclasses.dataclass(frozen=True)
class RunCallbacks:
    """The callbacks of one run's `fit` in their order (`all`), and tftrain's own that the run reads after."""

    all: tuple
    backup: Any  # StepBackup
    keep_best: Any = None  # KeepBest under --keep-best
    early_stopping: Any = None  # ResumableEarlyStopping under --early-stopping
    monitor: Any = None  # ThroughputMonitor where the loop has per-step hooks
    profiler: Any = None  # ProfilerWindow under --profile
    agreed_stop: Any = None  # AgreedStop of a MultiWorkerMirrored task
    mlflow: Any = None  # MlflowLog of the chief under --mlflow


class CallbackStages:
    """`Trainer`'s stages that make the callbacks of `fit` and plan the backup interval."""

    def make_callbacks(self) -> RunCallbacks:
        """NanGuard, CSVLogger, KeepBest, StepBackup, TensorBoard, ChanceWatch, the per-step monitors,
        EarlyStopping, MLflow, then the user's callbacks.

        The order matters: the guard raises before a checkpoint can save a diverged state; the epoch
        log and the kept best epochs come before the backup, so a kill between them repeats a logged
        epoch (whose second log replaces the first) rather than losing one; the backup clears its own
        early end of a resumed epoch before EarlyStopping may stop.
        """
        import keras

        from tftrain.callbacks import ChanceWatch, EpochTensorBoard, NanGuard, ScalarLogs
        from tftrain.train import mlflow_log

        out = self.out_dir
        agreed = self._agreed_stop()
        backup, keep_best = self._make_backup(agreed), self._keep_best()
        history = keras.callbacks.CSVLogger(str(out.path / rundir_lib.HISTORY_FILE), append=True)
        callbacks = [ScalarLogs(), NanGuard(say=self.console.warn), history, *([keep_best] if keep_best else []),
                     *([agreed] if agreed else []), backup, EpochTensorBoard(str(out.log_dir)),
                     ChanceWatch(say=self.console.warn)]
        monitor, profiler, nvtx = self._step_callbacks() if self.loop.per_step_hooks else (None, None, [])
        callbacks += [c for c in (monitor, profiler, self._epoch_length_watch()) if c is not None] + nvtx
        early_stopping = self._early_stopping()
        mlflow = mlflow_log.make(self.config.train.mlflow, out.path, self.task.name, self.is_chief,
                                 warn=self.console.warn)
        callbacks += [c for c in (early_stopping, mlflow) if c] + self.user_callback_objects()
        return RunCallbacks(tuple(callbacks), backup, keep_best, early_stopping, monitor, profiler, agreed, mlflow)

    def user_callback_objects(self) -> list:
        """The user's callbacks: those passed to the Trainer, then those `--callbacks` names (made once)."""
        if self._made_user_callbacks is None:
            self._made_user_callbacks = [c for make in self._user_callbacks for c in make()]
        return self.callbacks + self._made_user_callbacks

    def _agreed_stop(self):
        """Opens the `PreemptionWatch` if none; returns the `AgreedStop` of a MultiWorkerMirrored
        task (every worker stops at the same step), else None."""
        from tftrain.callbacks.preemption import AgreedStop, PreemptionWatch

        if self.preemption is None:  # the Trainer opens one for the run; a caller of this stage alone gets its own
            self.preemption = PreemptionWatch()
        if self.cluster is None or not self.loop.per_step_hooks:  # one process, or the coordinator alone
            return None
        return AgreedStop(self.preemption, self.runtime.strategy.cluster_resolver,
                          str(self.out_dir.backup_dir / "agreed_stop"))

    def _make_backup(self, agreed=None):
        """The `StepBackup`: keeps the previous checkpoint (a task may die mid-save), outlives `fit`
        until the run is written, and saves and stops when the preemption watch or `agreed` says so."""
        from tftrain.callbacks import StepBackup

        batches = self.steps_per_epoch * self.accumulation_steps if self.steps_per_epoch else None
        stop = agreed.requested if agreed is not None else (self.preemption.requested if self.preemption else None)
        batch_size = (self.resolved or self.config).data.batch_size  # the checkpoint records it: int once planned
        backup = StepBackup(self.out_dir.backup_dir, every_steps=self.backup_every(), steps_per_epoch=batches,
                            delete_checkpoint=False, stop_requested=stop, say=self.console.line,
                            batch_size=batch_size if isinstance(batch_size, int) else None)
        if backup.every_steps:
            self.console.line(f"backup:    every {backup.every_steps // self.accumulation_steps} optimizer steps "
                              f"and at each epoch end, in {self.run_dir.backup_dir}")
        return backup

    def _early_stopping(self):
        """`--early-stopping P`: EarlyStopping on `--monitor` (default val_loss) keeping the best weights, its state
        in the backup and replayed from the chief's `history.csv` (every worker of a job then stops at the same
        epoch)."""
        from tftrain.callbacks import ResumableEarlyStopping

        patience = self.config.train.early_stopping
        if patience is None:
            return None
        return ResumableEarlyStopping(self.out_dir.backup_dir, self.run_dir.path / rundir_lib.HISTORY_FILE,
                                      say=self.console.line, monitor=self.early_stopping_monitor(),
                                      mode=self.config.train.monitor_mode if self.config.train.monitor else "auto",
                                      patience=patience,
                                      restore_best_weights=True, verbose=min(1, self.config.train.verbose))

    def _keep_best(self):
        """`--keep-best N`: `KeepBest` in `checkpoints/`, before the backup. A worker that is not the
        chief saves the same epochs (saving may take collective ops) to its temporary directory."""
        keep = self.config.train.keep_best
        if not keep:
            return None
        from tftrain.callbacks import KeepBest
        from tftrain.train.init_weights import CHECKPOINTS_DIR

        validates = self.task.validation_data(self.batch.global_batch_size) is not None
        monitor = self.config.train.monitor or ("val_loss" if validates else "loss")
        keep_best = KeepBest(self.out_dir.path / CHECKPOINTS_DIR, keep, monitor=monitor,
                             mode=self.config.train.monitor_mode, say=self.console.line,
                             ranking_from=None if self.is_chief else self.run_dir.path / CHECKPOINTS_DIR,
                             history_file=self.run_dir.path / rundir_lib.HISTORY_FILE)
        self.console.line(f"keep-best: the {keep} best epochs by {monitor} and the last, in "
                          f"{self.run_dir.path / CHECKPOINTS_DIR}")
        return keep_best

    def _step_callbacks(self) -> tuple:
        """`(ThroughputMonitor, ProfilerWindow or None, [NvtxSteps])` of a loop with per-step hooks."""
        from tftrain.callbacks import ProfilerWindow, ThroughputMonitor

        gb = self.batch.global_batch_size
        # The input check times this process's pipeline alone: skipped where a worker reads only its shard.
        input_data = self.task.probe_data(gb, INPUT_CHECK_BATCHES) if self.loop.checks_input else None
        monitor = ThroughputMonitor(gb, log_dir=self.out_dir.log_dir, input_data=input_data)
        window = self.config.train.profile_window
        if window is None:
            return monitor, None, self._nvtx_callbacks()
        start, stop = (step * self.accumulation_steps for step in window)  # optimizer steps -> micro-batches
        profiler = ProfilerWindow(self.out_dir.log_dir, start, stop, resumes=True,
                                  verbose=min(1, self.config.train.verbose), say=self.console.line)
        return monitor, profiler, self._nvtx_callbacks()

    def _epoch_length_watch(self):
        """`EpochLengthWatch` where an epoch's length comes from the task's count of its examples and the loop
        has per-step hooks, else None."""
        from tftrain.callbacks.epoch_length import EpochLengthWatch

        n = self.task.num_train_examples
        if not self.steps_per_epoch or n is None or not self.loop.per_step_hooks:
            return None
        why = f"the task's {n:,} training examples at batch {self.batch.global_batch_size}"
        return EpochLengthWatch(self.steps_per_epoch * self.accumulation_steps, why, say=self.console.warn,
                                slack=self.accumulation_steps)

    def _nvtx_callbacks(self) -> list:
        """`NvtxSteps` under `--nvtx` on a GPU (`tftrain.runtime.nvtx`), else none."""
        if self.runtime.nvtx is None or not self.runtime.nvtx.active:
            return []
        from tftrain.callbacks import NvtxSteps

        return [NvtxSteps()]

    def _check_backup_every(self) -> None:
        """Raises `ConfigError` when `--backup-every-steps` cannot work (no steps per epoch, < one execution)."""
        n = self.config.train.backup_every_steps
        if n is None:
            return
        if self.task.num_train_examples is None:
            raise ConfigError("--backup-every-steps resumes mid-epoch, which needs the steps per epoch: give the task "
                              "num_train_examples (the number of training examples per epoch).")
        if self.backup_every() == 0:
            unit = self._backup_unit() // self.accumulation_steps
            raise ConfigError(f"--backup-every-steps {n} is less than one execution of {unit} optimizer steps "
                              f"(--steps-per-execution): a checkpoint is written between executions. Pass a multiple "
                              f"of {unit}.")

    def backup_every(self) -> Optional[int]:
        """Batches between mid-epoch checkpoints: `--backup-every-steps` in micro-batches, rounded
        down to whole executions and optimizer steps; None without the flag."""
        n = self.config.train.backup_every_steps
        if n is None:
            return None
        unit = self._backup_unit()
        return n * self.accumulation_steps // unit * unit

    def _backup_unit(self) -> int:
        """Batches a checkpoint position must be a multiple of (`ExecutionPlanner.checkpoint_unit`)."""
        return self.execution.checkpoint_unit(self.run_facts(), self.runtime.steps_per_execution)
