"""Stop signals: SIGTERM, SIGUSR1 and SIGHUP become a request to checkpoint and stop.

Schedulers stop a job with SIGTERM (SLURM at `scancel`, preemption or the time limit;
Kubernetes when it evicts a pod), SLURM's `--signal=USR1@SECONDS` sends SIGUSR1 that many
seconds before the time limit, and a closed terminal or SSH session sends SIGHUP. Python's
default ends the process wherever it is. `PreemptionWatch` replaces the handlers while a run is
open:

* while training runs (`polling()`), a signal only records the request; `StepBackup` reads it
  after each execution (and at each epoch end), saves the training state at that step and raises
  `tftrain.errors.Preempted`;
* while a file the run needs is being written (`holding()`: the model, `metrics.json`), the
  request waits until the write is done, then `Preempted` is raised;
* anywhere else (start-up, evaluation, export) the handler raises `Preempted` at once, naming
  the phase (`phase`).

Further signals while the first is handled only wait for it: a save under way is never cut short, and
once a signal was received the watch leaves the signals ignored when it closes (the process is ending
with 128 + that signal; a second notice must not kill it on its way out).
Signal handlers can only be set from the main thread; elsewhere the watch does nothing and the
process's own handlers stay.

Source: https://slurm.schedmd.com/sbatch.html#OPT_signal ;
https://kubernetes.io/docs/concepts/containers/container-lifecycle-hooks/#hook-handler-execution
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Optional

import keras

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
"""The signals taken as a request to checkpoint and stop."""


class PreemptionWatch:
    """A context manager that, while open, turns `SIGNALS` into a request to stop (see the module).

    Attributes:
        phase: what the run is doing, named by `Preempted`'s message when a signal stops it outside
            training and writes (e.g. `"evaluation"`). Defaults to `"start-up"`.

    Example:
        >>> watch = PreemptionWatch()
        >>> backup = StepBackup("run/backup", stop_requested=watch.requested)
        >>> with watch, watch.polling():
        ...     model.fit(data, epochs=10, callbacks=[backup])  # raises Preempted after saving
    """

    def __init__(self):
        self._signum: Optional[int] = None
        self._raised = False
        self._polled = self._held = 0
        self._previous: dict = {}
        self.phase = "start-up"

    def requested(self) -> Optional[int]:
        """The signal number received while open, or None."""
        return self._signum

    def _handle(self, signum, frame):
        if self._signum is None:
            self._signum = signum
        if not (self._polled or self._held):
            self._raise()

    def _raise(self) -> None:
        if self._raised or self._signum is None:
            return
        from tftrain.errors import Preempted

        self._raised = True
        raise Preempted(f"stopped by {signal.Signals(self._signum).name} during {self.phase}", self._signum)

    @contextlib.contextmanager
    def polling(self):
        """While open, a signal is only recorded: the training loop reads `requested()` and stops."""
        self._polled += 1
        try:
            yield self
        finally:
            self._polled -= 1

    @contextlib.contextmanager
    def holding(self, stop_after: bool = True):
        """While open, a signal waits. With `stop_after` (the default), at the end of the outermost one a
        recorded signal raises `Preempted`; without it the caller reads `requested()` and decides."""
        self._held += 1
        try:
            yield self
        finally:
            self._held -= 1
        if stop_after and not (self._held or self._polled):
            self._raise()

    def install(self) -> None:
        """(Re)installs the handlers: TensorFlow's coordination service takes SIGTERM at the C level when a
        multi-worker strategy starts; installing again gives it back to Python."""
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                previous = signal.signal(s, self._handle)
                self._previous.setdefault(s, previous)

    def __enter__(self) -> "PreemptionWatch":
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        stopping = self._signum is not None  # the process is ending on that signal: later ones must not kill it
        for s, handler in self._previous.items():
            signal.signal(s, signal.SIG_IGN if stopping else handler if handler is not None else signal.SIG_DFL)
        self._previous = {}


class AgreedStop(keras.callbacks.Callback):
    """In a MultiWorkerMirrored job: the workers agree on one step to stop at when any of them is
    told to stop, so that every worker saves the same step (a lone worker's save would hang the
    others' collectives).

    TensorFlow's own mechanism does the agreeing: `tf.distribute.experimental.PreemptionCheckpointHandler`
    polls `watch.requested` once a second on each worker (SIGTERM or SIGUSR1, received by
    `PreemptionWatch`; once the strategy is built TensorFlow's coordination service takes SIGTERM at the
    C level, and the watch, opened after it, gives it back to Python), and through the coordination
    service every worker learns the step to stop at. Its own checkpoint is an empty one: at that step
    `requested` returns the signal, and `StepBackup` (after this callback in the list) saves the
    training state in the run directory and raises `Preempted`, on every worker at the same step.

    Args:
        watch: the process's `PreemptionWatch` (open while training runs).
        cluster_resolver: the strategy's cluster resolver.
        directory: where the handler keeps its (empty) checkpoint; on workers other than the chief
            the handler uses a temporary folder of its own.

    Source: https://www.tensorflow.org/api_docs/python/tf/distribute/experimental/PreemptionCheckpointHandler
    """

    def __init__(self, watch: PreemptionWatch, cluster_resolver, directory: str):
        super().__init__()
        self.watch, self.cluster_resolver, self.directory = watch, cluster_resolver, directory
        self.handler = None
        self._agreed = False

    def requested(self) -> Optional[int]:
        """The signal to stop for once the workers agreed this is the step (SIGTERM when only another
        worker received one), else None."""
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
        """Stops the handler's watcher threads (what its `__del__` does; its threads hold it alive, so
        dropping it would not); the Trainer also calls this when `fit` raises."""
        handler, self.handler = self.handler, None
        if handler is None:
            return
        from tftrain import _compat

        _compat.stop_preemption_handler(handler)
