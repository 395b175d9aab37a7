"""ProfilerWindow: a TensorBoard profile of training steps [start, stop).

Keras's own `TensorBoard(profile_batch=...)` counts executions (batch hooks), not
optimizer steps, so under `steps_per_execution` > 1 it profiles the wrong steps; and
when the profile plugin is missing or the window is never reached it fails silently.
`ProfilerWindow` counts real optimizer steps, skips the first steps (tracing and
compilation) by default, and fails loudly with the cause and the fix.

Three entry points, one mechanism (`ProfileSteps`, in `tftrain.callbacks.profile_steps` with the
window's arithmetic and the plugin checks; those names import from here too):

- `ProfilerWindow(log_dir, start, stop)`: a Keras callback for `model.fit`.
- `ProfileSteps(log_dir, start, stop)`: a context manager for custom training loops.
- `ProfilerServer(port, ...)` (also `ProfilerWindow.on_demand`) / `start_profiler_server`: start TensorFlow's
  profiler server so TensorBoard's "Capture profile" button can trace a running job.

The trace lands in `<log_dir>/<subdir>/plugins/profile/<timestamp>/<host>.xplane.pb`,
where TensorBoard's Profile tab finds it (`tensorboard --logdir <log_dir>`). Each traced
execution carries a step marker, so the tab's Overview and Input Pipeline pages measure
step time, one step per execution under `steps_per_execution` (`_trace_steps`).

Source: https://www.tensorflow.org/guide/profiler
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

import keras
import tensorflow as tf

from tftrain.callbacks._steps import steps_per_execution, train_steps
from tftrain.callbacks.profile_steps import (  # noqa: F401 (re-exported: the names moved there)
    PLUGIN_INSTALL, PLUGIN_PACKAGES, TRACER_DEFAULTS, ProfileSteps, StepWindow, check_profile_plugin,
    check_window_fits, profile_plugin_installed, tensorboard_command, xplane_files)
from tftrain.errors import ProfilerError, check_int


class ProfilerWindow(keras.callbacks.Callback):
    """Captures a TensorBoard profile of optimizer steps `[start, stop)` of `fit`.

    Steps are real optimizer steps counted from the start of this `fit` call,
    read from `model.optimizer.iterations`, so the window is right under
    `steps_per_execution` > 1 too (where Keras's `profile_batch` counts
    executions). Under gradient accumulation a step is a micro-batch (one
    `train_step`; see `tftrain.callbacks._steps.train_steps`). A window that does
    not fall on execution boundaries is widened to them, with a warning. The trace goes to `<log_dir>/train/plugins/profile/`,
    next to the scalars of a `keras.callbacks.TensorBoard(log_dir)` callback.

    Args:
        log_dir: TensorBoard log directory. Defaults to "logs".
        start: first step to trace. Defaults to 10, skipping the first steps,
            which trace and compile the training function.
        stop: first step not traced. Defaults to 15.
        **options: `ProfileSteps`'s keyword arguments, passed on as they are
            (`host_tracer_level`, `python_tracer_level`, `device_tracer_level`,
            `subdir`, `require_plugin`, `step_markers`, `verbose`, `say`), with
            its defaults.

    Raises:
        ProfilerError: at construction on an invalid window or a missing
            profile plugin; at the start of `fit` when the run is shorter than
            the window's start; at its end when the window was never reached or
            no `.xplane.pb` was written.

    Example:
        >>> model.fit(ds, epochs=2, callbacks=[
        ...     keras.callbacks.TensorBoard("logs"),
        ...     ProfilerWindow("logs", start=10, stop=15)])
        profile:   traced steps [10, 15) into logs/train/plugins/profile/2026_...
                   open it with: tensorboard --logdir logs  (Profile tab)
    """

    def __init__(self, log_dir="logs", start: int = 10, stop: int = 15, **options):
        super().__init__()
        self._kwargs = options
        self.log_dir = log_dir
        self.start, self.stop = start, stop
        self.profile = ProfileSteps(log_dir, start, stop, **self._kwargs)  # validates early
        self._base = 0

    @classmethod
    def on_demand(cls, port: int, *, listen_on_all_interfaces: bool = False, verbose: int = 1) -> "ProfilerServer":
        """A callback that starts TensorFlow's profiler server when `fit` begins.

        Capture then happens from TensorBoard (Profile tab -> "Capture profile",
        address `localhost:<port>`) while training runs. See
        `start_profiler_server` for why `listen_on_all_interfaces` is required.

        Args:
            port: TCP port for the profiler server, 1..65535.
            listen_on_all_interfaces: must be True; acknowledges that
                TensorFlow's server listens on every network interface.
                Defaults to False.
            verbose: 1 prints the capture address. Defaults to 1.

        Returns:
            A `ProfilerServer` callback (no fixed window).

        Raises:
            ProfilerError: on a bad port or without `listen_on_all_interfaces`.
        """
        return ProfilerServer(port, listen_on_all_interfaces=listen_on_all_interfaces, verbose=verbose)

    def on_train_begin(self, logs=None):
        if self.profile.window.started_at is not None:  # a second fit(): fresh window
            self.profile = ProfileSteps(self.log_dir, self.start, self.stop, **self._kwargs)
        steps, epochs = self.params.get("steps"), self.params.get("epochs")
        check_window_fits(self.start, self.stop, steps * epochs if steps and epochs else None)
        self._base = train_steps(self.model)

    def on_train_batch_begin(self, batch, logs=None):
        if self.profile.needs_steps:
            self.profile.begin(steps_per_execution(self.model))

    def on_train_batch_end(self, batch, logs=None):
        if self.profile.needs_steps:
            self.profile.end(train_steps(self.model) - self._base)

    def on_train_end(self, logs=None):
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
    """Starts TensorFlow's profiler server when `fit` begins, for captures from TensorBoard (Profile tab ->
    "Capture profile", address `localhost:<port>`) while training runs; see `start_profiler_server` for why
    `listen_on_all_interfaces` is required.

    Args:
        port: TCP port, 1..65535.
        listen_on_all_interfaces: must be True; acknowledges that TensorFlow's
            server listens on every network interface. Defaults to False.
        verbose: 1 prints the capture address. Defaults to 1.

    Raises:
        ProfilerError: on a bad port or without `listen_on_all_interfaces` (at construction).

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
    """Starts TensorFlow's profiler server for on-demand capture from TensorBoard.

    TensorFlow's server (`tf.profiler.experimental.server.start`) listens on
    `[::]:port`, every network interface, and offers no way to bind it to
    127.0.0.1; it also cannot be stopped before the process exits. tftrain
    therefore starts it only when the caller acknowledges that with
    `listen_on_all_interfaces=True`. Starting it twice on the same port is a
    no-op.

    Args:
        port: TCP port, 1..65535.
        listen_on_all_interfaces: must be True (see above). Defaults to False.
        verbose: 1 prints the address to enter in TensorBoard. Defaults to 1.

    Returns:
        The address to enter in TensorBoard's "Capture profile" dialog,
        e.g. `"localhost:6009"`.

    Raises:
        ProfilerError: on a bad port, without `listen_on_all_interfaces`, or when
            the port is taken.
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
