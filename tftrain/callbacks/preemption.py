"""Preemption notices: SIGTERM and SIGUSR1 become a request to checkpoint and stop.

Schedulers stop a job with SIGTERM (SLURM at `scancel`, preemption or the time limit;
Kubernetes when it evicts a pod), and SLURM's `--signal=USR1@SECONDS` sends SIGUSR1
that many seconds before the time limit. Python's default for SIGTERM ends the
process wherever it is, losing the steps since the last checkpoint. `PreemptionWatch`
replaces the handlers while training runs so that a signal only records the request;
`StepBackup` reads it after each execution (and at each epoch end), saves the
training state at that step and raises `tftrain.errors.Preempted`.

Signal handlers can only be set from the main thread; elsewhere the watch does
nothing and the process's own handlers stay. A second signal while the first is
being handled ends the process as the previous handler would.

Source: https://slurm.schedmd.com/sbatch.html#OPT_signal ;
https://kubernetes.io/docs/concepts/containers/container-lifecycle-hooks/#hook-handler-execution
"""

from __future__ import annotations

import signal
import threading
from typing import Optional

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
"""The signals taken as a request to checkpoint and stop."""


class PreemptionWatch:
    """A context manager that, while open, turns `SIGNALS` into a request read by `requested()`.

    Example:
        >>> watch = PreemptionWatch()
        >>> backup = StepBackup("run/backup", stop_requested=watch.requested)
        >>> with watch:
        ...     model.fit(data, epochs=10, callbacks=[backup])  # raises Preempted after saving
    """

    def __init__(self):
        self._signum: Optional[int] = None
        self._previous: dict = {}

    def requested(self) -> Optional[int]:
        """The signal number received while open, or None."""
        return self._signum

    def _handle(self, signum, frame):
        if self._signum is not None:  # a second notice: do what the previous handler would
            previous = self._previous.get(signum, signal.SIG_DFL)
            if callable(previous):
                previous(signum, frame)
                return
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
            return
        self._signum = signum

    def __enter__(self) -> "PreemptionWatch":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}
