"""ProfilerWindow: a TensorBoard profile of training steps [start, stop); unlike `TensorBoard(profile_batch=...)`
it counts optimizer steps, not executions, and fails loudly without the plugin or if the window is never reached.
`ProfilerServer` serves TensorBoard's "Capture profile". Source: https://www.tensorflow.org/guide/profiler
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

import keras
import tensorflow as tf

from tftrain.callbacks._steps import steps_per_execution, train_steps
from tftrain.callbacks.profile_steps import ProfileSteps, check_window_fits
from tftrain.errors import ProfilerError, check_int


class ProfilerWindow(keras.callbacks.Callback):
    """Captures a TensorBoard profile of optimizer steps `[start, stop)` of `fit` into
    `<log_dir>/train/plugins/profile/`. Steps count from this `fit`'s start (micro-batches under accumulation);
    a window not on execution boundaries is widened, with a warning.

    Args:
        log_dir: TensorBoard log directory. Defaults to "logs".
        start: first step traced. Defaults to 10 (past tracing and compilation).
        stop: first step not traced. Defaults to 15.
        resumes: count the model's own steps (`optimizer.iterations`) instead of this `fit`'s, so a `fit`
            resumed from a checkpoint goes on counting and a window it starts past is not traced again
            (said in one line). Defaults to False.
        **options: `ProfileSteps`'s keyword arguments.

    Raises:
        ProfilerError: an invalid window or missing plugin (construction); a run shorter than `start` (`fit`'s
            first epoch, before a step); a window never reached or no `.xplane.pb` written (its end).

    Example:
        >>> model.fit(ds, epochs=2, callbacks=[ProfilerWindow("logs", start=10, stop=15)])
    """

    def __init__(self, log_dir="logs", start: int = 10, stop: int = 15, *, resumes: bool = False, **options):
        super().__init__()
        self._kwargs = options
        self.log_dir = log_dir
        self.start, self.stop, self.resumes = start, stop, resumes
        self.profile = ProfileSteps(log_dir, start, stop, **self._kwargs)  # validates early
        self._base = 0
        self.passed: Optional[int] = None  # the step a resumed fit started from, past the window

    @classmethod
    def on_demand(cls, port: int, *, listen_on_all_interfaces: bool = False, verbose: int = 1) -> "ProfilerServer":
        """`ProfilerServer(port, ...)`: starts TensorFlow's profiler server when `fit` begins."""
        return ProfilerServer(port, listen_on_all_interfaces=listen_on_all_interfaces, verbose=verbose)

    def on_train_begin(self, logs=None):
        if self.profile.window.started_at is not None:  # a second fit(): fresh window
            self.profile = ProfileSteps(self.log_dir, self.start, self.stop, **self._kwargs)
        done, self.passed, self._checked = train_steps(self.model), None, False
        self._base = 0 if self.resumes else done
        if self.resumes and done >= self.stop:
            self.passed = done
            self.profile.say(f"profile: steps [{self.start}, {self.stop}) ran before step {done}, where this run "
                             "resumed; not traced again")
        self.profile.steps_done = done - self._base

    def on_epoch_begin(self, epoch, logs=None):
        if not self._checked and self.passed is None:  # the first epoch: fit's initial_epoch is known here
            self._checked = True
            steps, epochs = self.params.get("steps"), self.params.get("epochs")
            planned = (steps * epochs if self.resumes else steps * (epochs - epoch)) if steps and epochs else None
            check_window_fits(self.start, self.stop, planned)

    def on_train_batch_begin(self, batch, logs=None):
        if self.passed is None and self.profile.needs_steps:
            self.profile.begin(steps_per_execution(self.model))

    def on_train_batch_end(self, batch, logs=None):
        if self.passed is None and self.profile.needs_steps:
            self.profile.end(train_steps(self.model) - self._base)

    def on_train_end(self, logs=None):
        if self.passed is None:
            self.profile.close()

    @property
    def captured(self) -> Optional[Tuple[int, int]]:
        """Steps `[first, stop)` traced by the last `fit`, or None."""
        return self.profile.window.captured

    @property
    def trace_files(self) -> List[Path]:
        """The `.xplane.pb` files the last capture wrote."""
        return list(self.profile.trace_files)


class ProfilerServer(keras.callbacks.Callback):
    """Starts TensorFlow's profiler server when `fit` begins, for TensorBoard's "Capture profile"
    (`localhost:<port>`); arguments as `start_profiler_server`.

    Raises:
        ProfilerError: at construction, a bad port or no `listen_on_all_interfaces`.

    Example:
        >>> model.fit(data, callbacks=[ProfilerServer(6009, listen_on_all_interfaces=True)])
    """

    def __init__(self, port: int, *, listen_on_all_interfaces: bool = False, verbose: int = 1):
        super().__init__()
        _check_server_request(port, listen_on_all_interfaces)
        self.server_port, self.listen_on_all_interfaces, self.verbose = port, listen_on_all_interfaces, verbose

    def on_train_begin(self, logs=None):
        start_profiler_server(self.server_port, listen_on_all_interfaces=self.listen_on_all_interfaces,
                              verbose=self.verbose)


def _check_server_request(port, listen_on_all_interfaces) -> None:
    check_int(port, "port", maximum=65535, error=ProfilerError)
    if not listen_on_all_interfaces:
        raise ProfilerError(
            "TensorFlow's profiler server listens on every network interface ([::]:PORT) and cannot be "
            "bound to 127.0.0.1, so anyone who can reach this machine could pull traces from it. "
            "Pass listen_on_all_interfaces=True on a trusted network, or profile a fixed window "
            "(ProfilerWindow(log_dir, start, stop)), which opens no port."
        )


_SERVERS: dict = {}


def start_profiler_server(port: int, *, listen_on_all_interfaces: bool = False, verbose: int = 1) -> str:
    """Starts TensorFlow's profiler server for on-demand capture from TensorBoard (a no-op again on the same port).
    It listens on every interface (`[::]:port`) and cannot be bound to 127.0.0.1 nor stopped, hence the flag.

    Args:
        listen_on_all_interfaces: must be True. Defaults to False.
        verbose: 1 prints the address. Defaults to 1.

    Returns:
        The address for TensorBoard's "Capture profile" dialog, e.g. `"localhost:6009"`.

    Raises:
        ProfilerError: a bad port, no `listen_on_all_interfaces`, or a taken port.
    """
    _check_server_request(port, listen_on_all_interfaces)
    address = f"localhost:{port}"
    if port not in _SERVERS:
        try:
            tf.profiler.experimental.server.start(port)
        except Exception as e:  # noqa: BLE001 - TF raises various types for a taken port
            raise ProfilerError(f"Could not start the profiler server on port {port}: {e}. Pick a free port.") from None
        _SERVERS[port] = address
        if verbose:
            print(
                f"profile:   profiler server on port {port} (all interfaces); in TensorBoard's Profile tab "
                f"click 'Capture profile' and enter {address}"
            )
    return address
