"""SIGTERM (schedulers), SIGUSR1 (SLURM's `--signal=USR1@SECONDS`) and SIGHUP become a request to checkpoint and stop.

While training (`polling()`) a signal is only recorded, and `StepBackup` saves and raises `Preempted` (or leaving
`polling()` does, for one received after the loop's last check); while a file
is written (`holding()`) it waits; elsewhere it raises `Preempted` at once, naming `phase`. Ctrl-C (SIGINT) stays
`KeyboardInterrupt` until such a stop is on its way; then the first waits for its save too. After a signal, closing
leaves the other signals ignored so a second one cannot kill the exiting process. Main thread only.
Source: https://slurm.schedmd.com/sbatch.html#OPT_signal
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Optional

import keras

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
"""The signals taken as a request to checkpoint and stop."""


class PreemptionWatch:
    """While open, turns `SIGNALS` into a request to stop (see the module).

    Attributes:
        phase: what the run is doing, named by `Preempted` outside training. Defaults to `"start-up"`.

    Example:
        >>> watch = PreemptionWatch()
        >>> with watch, watch.polling():
        ...     model.fit(data, epochs=10, callbacks=[StepBackup("run/backup", stop_requested=watch.requested)])
    """

    def __init__(self):
        self._signum: Optional[int] = None
        self._raised = self._waited = False
        self._polled = self._held = 0
        self._previous: dict = {}
        self.phase = "start-up"
        self.training_ended = False
        """Set by a `StepBackup` that removed its checkpoint as `fit` ended: a signal after it stops nothing."""

    def requested(self) -> Optional[int]:
        """The signal number received while open, or None."""
        return self._signum

    def _handle(self, signum, frame):
        if self._signum is None:
            self._signum = signum
        if not (self._polled or self._held):
            self._raise()

    def _interrupt(self, signum, frame):
        """Ctrl-C: Python's `KeyboardInterrupt` (or the handler before), unless a stop is on its way: the first
        then waits for its save, as a second SIGTERM does, and says so; a second stops at once."""
        if self._signum is not None and not self._waited:
            self._waited = True
            print(f"Ctrl-C: the run stops for {signal.Signals(self._signum).name} once its checkpoint is saved; Ctrl-C "
                  "again stops at once", file=sys.stderr, flush=True)
            return
        previous = self._previous.get(signal.SIGINT)
        if callable(previous):
            return previous(signum, frame)
        if previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    def _raise(self) -> None:
        if self._raised or self._signum is None:
            return
        self._raised = True
        raise self.stop()

    def stop(self, run_dir: str = ""):
        """The `Preempted` for the recorded signal, naming `phase` (and `run_dir`, where it was written). Raised
        from a handler inside TensorFlow or Keras code it may come out wrapped in their error: `Trainer.fit` raises
        this instead."""
        from tftrain.errors import Preempted

        return Preempted(f"stopped by {signal.Signals(self._signum).name} during {self.phase}", self._signum, run_dir)

    @contextlib.contextmanager
    def polling(self, stop_after: bool = True):
        """While open, a signal is only recorded: the training loop reads `requested()` and stops. With
        `stop_after`, one the loop did not act on (received after its last check) raises `Preempted` on leaving,
        unless a `StepBackup` had already ended training and removed its checkpoint (`training_ended`)."""
        self._polled += 1
        try:
            yield self
        finally:
            self._polled -= 1
        if stop_after and not (self._held or self._polled):
            if self.training_ended and self._signum is not None and not self._raised:
                # the run is done and nothing is left to save: stopping now would only lose the script's rest
                print(f"{signal.Signals(self._signum).name} came after training ended and its checkpoint was "
                      "removed: the script goes on; a second signal stops it", file=sys.stderr, flush=True)
                self._signum = None  # on leaving, the handlers before come back
                return
            self.phase = "training" if self.phase == "start-up" else self.phase
            self._raise()

    @contextlib.contextmanager
    def holding(self, stop_after: bool = True):
        """While open, a signal waits; with `stop_after`, the outermost exit raises `Preempted` for it."""
        self._held += 1
        try:
            yield self
        finally:
            self._held -= 1
        if stop_after and not (self._held or self._polled):
            self._raise()

    def install(self) -> None:
        """(Re)installs the handlers; call again after a multi-worker strategy starts (it takes SIGTERM in C)."""
        if threading.current_thread() is threading.main_thread():
            for s in (*SIGNALS, signal.SIGINT):
                previous = signal.signal(s, self._interrupt if s == signal.SIGINT else self._handle)
                self._previous.setdefault(s, previous)

    def __enter__(self) -> "PreemptionWatch":
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        stopping = self._signum is not None  # ending on that signal: later ones must not kill it
        for s, handler in self._previous.items():  # Ctrl-C is the user's again (a notebook's kernel goes on)
            ignored = stopping and s != signal.SIGINT
            signal.signal(s, signal.SIG_IGN if ignored else handler if handler is not None else signal.SIG_DFL)
        self._previous = {}


class AgreedStop(keras.callbacks.Callback):
    """In a MultiWorkerMirrored job, stops all workers at one agreed step when any is told to stop (a lone worker's
    save would hang the others' collectives). TensorFlow's `PreemptionCheckpointHandler` (empty checkpoint) agrees on
    the step; there `requested` returns the signal and `StepBackup`, placed after this, saves and raises `Preempted`.

    Args:
        watch: the process's open `PreemptionWatch`.
        cluster_resolver: the strategy's cluster resolver.
        directory: the handler's (empty) checkpoint directory.

    Source: https://www.tensorflow.org/api_docs/python/tf/distribute/experimental/PreemptionCheckpointHandler
    """

    def __init__(self, watch: PreemptionWatch, cluster_resolver, directory: str):
        super().__init__()
        self.watch, self.cluster_resolver, self.directory = watch, cluster_resolver, directory
        self.handler = None
        self._agreed = False

    def requested(self) -> Optional[int]:
        """The signal once the workers agreed on this step (SIGTERM if only another got one), else None."""
        if not self._agreed:
            return None
        return self.watch.requested() or signal.SIGTERM

    def _stop_here(self) -> None:  # the handler's exit_fn: on every worker, at the agreed step
        self._agreed = True

    def on_train_begin(self, logs=None):
        import tensorflow as tf

        config = tf.distribute.experimental.TerminationConfig(
            termination_watcher_fn=lambda: self.watch.requested() is not None, exit_fn=self._stop_here,
            grace_period=0)
        self.handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            self.cluster_resolver, tf.train.Checkpoint(), self.directory, termination_config=config)

    def on_train_batch_end(self, batch, logs=None):
        if self.handler is not None and not self._agreed:
            from tftrain import _compat

            with _compat.silenced_deprecations():  # the handler's own call of its deprecated counter
                self.handler.save_checkpoint_if_preempted()

    def on_train_end(self, logs=None):
        self.close()

    def close(self) -> None:
        """Stops the handler's watcher threads (they keep it alive)."""
        handler, self.handler = self.handler, None
        if handler is None:
            return
        from tftrain import _compat

        _compat.stop_preemption_handler(handler)
