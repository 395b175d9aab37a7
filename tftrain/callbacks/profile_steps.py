"""`ProfileSteps`: a TensorBoard profile of training steps [start, stop) for any loop, with `StepWindow` (its
arithmetic) and the plugin and window checks; `profiler` builds the callbacks. See tensorflow.org/guide/profiler."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import tensorflow as tf

from tftrain.callbacks._trace_steps import group_steps_by_markers, step_marker_name
from tftrain.errors import ProfileNotWritten, ProfilerError

PLUGIN_PACKAGES = ("tensorboard_plugin_profile", "xprof")
"""Packages providing TensorBoard's Profile tab (either one)."""

PLUGIN_INSTALL = "pip install tensorboard-plugin-profile"

TRACER_DEFAULTS = (2, 0, 1)
"""TensorFlow's default (host, python, device) tracer levels."""

_IGNORES_LEVELS = ("2.21.",)
"""TensorFlow versions that ignore `ProfilerOptions` tracer levels in-process."""


def profile_plugin_installed() -> bool:
    """True when TensorBoard's profile plugin is importable."""
    return any(importlib.util.find_spec(name) is not None for name in PLUGIN_PACKAGES)


def check_profile_plugin() -> None:
    """Raises `ProfilerError`, naming the package, without TensorBoard's profile plugin."""
    if not profile_plugin_installed():
        raise ProfilerError(
            "TensorBoard's profile plugin is not installed, so TensorBoard would show no Profile tab. "
            f"Run `{PLUGIN_INSTALL}` in this environment (or pass require_plugin=False to capture anyway)."
        )


def tensorboard_command(log_dir) -> str:
    """The shell command opening `log_dir` in TensorBoard."""
    return f"tensorboard --logdir {os.fspath(log_dir)}"


def xplane_files(log_dir) -> List[Path]:
    """Every `.xplane.pb` trace under `log_dir` (any run, any depth), sorted."""
    root = Path(log_dir)
    return sorted(root.glob("**/plugins/profile/*/*.xplane.pb")) if root.is_dir() else []


def _window(start: int, stop: int) -> str:
    """A window as the command line and Python each take it."""
    return f"--profile {start},{stop}, or start={start}, stop={stop} in Python"


def check_window_fits(start: int, stop: int, total_steps: Optional[int]) -> None:
    """Raises `ProfilerError`, suggesting a window, if `total_steps` (None: unknown, passes) never reaches `start`."""
    if total_steps is not None and start >= total_steps:
        first = min(2, max(0, total_steps - 1))
        raise ProfilerError(
            f"The profile window [{start}, {stop}) starts after the end of training, which runs "
            f"{total_steps} optimizer step(s). Pass a window inside the run "
            f"(e.g. {_window(first, min(total_steps, first + 5))}) or train longer."
        )


class StepWindow:
    """When to trace steps `[start, stop)` (0-based; `ProfilerError` unless 0 <= start < stop), given optimizer
    steps done (no TensorFlow). Executions cannot be split: the window widens to those overlapping it (`captured`)."""

    def __init__(self, start: int, stop: int):
        for name, value in (("start", start), ("stop", stop)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ProfilerError(f"Profile window {name} must be an integer step. Received: {name}={value!r}.")
        if start < 0 or stop <= start:
            raise ProfilerError(
                f"Invalid profile window [{start}, {stop}). Expected 0 <= start < stop, e.g. {_window(10, 15)}. "
                f"Received: start={start}, stop={stop}."
            )
        self.start = start
        self.stop = stop
        self.started_at: Optional[int] = None
        self.stopped_at: Optional[int] = None

    @property
    def active(self) -> bool:
        """True between `mark_started` and `mark_stopped`."""
        return self.started_at is not None and self.stopped_at is None

    @property
    def done(self) -> bool:
        """True once the window has been traced."""
        return self.stopped_at is not None

    def should_start(self, steps_done: int, next_steps: int) -> bool:
        """Whether to start before an execution of `next_steps` steps that follows `steps_done`."""
        return (
            self.started_at is None
            and steps_done < self.stop
            and steps_done + max(1, next_steps) > self.start
        )

    def should_stop(self, steps_done: int) -> bool:
        """Whether to stop after an execution that brought the count to `steps_done`."""
        return self.active and steps_done >= self.stop

    def mark_started(self, steps_done: int) -> None:
        """Records that tracing started before step `steps_done`."""
        self.started_at = steps_done

    def mark_stopped(self, steps_done: int) -> None:
        """Records that tracing stopped after step `steps_done - 1`."""
        self.stopped_at = steps_done

    @property
    def captured(self) -> Optional[Tuple[int, int]]:
        """Steps `[first, stop)` actually traced, or None before the window closes."""
        if self.started_at is None or self.stopped_at is None:
            return None
        return self.started_at, self.stopped_at


class ProfileSteps:
    """Profiles optimizer steps `[start, stop)` of any training loop (`ProfilerWindow` drives it from Keras hooks).

    Args:
        start: first step traced (0-based). Defaults to 10 (past tracing and warm-up).
        stop: first step not traced. Defaults to 15.
        host_tracer_level: 1 annotations, 2 also high-level ops, 3 also low-level ops. Defaults to 2.
        python_tracer_level: 1 traces Python calls (slower), 0 off. Defaults to 0.
        device_tracer_level: 1 traces GPU/TPU kernels, 0 off. Defaults to 1. (TF 2.21 ignores levels in-process.)
        subdir: the TensorBoard run under `log_dir`, as Keras's `TensorBoard`. Defaults to "train".
        require_plugin: raise `ProfilerError` without the profile plugin. Defaults to True.
        step_markers: mark traced executions so the Overview counts one step each (`_trace_steps`). Defaults to True.
        verbose: 1 prints where the trace went and how to open it. Defaults to 1.
        say: called once when the window is not on execution boundaries. Defaults to a warning.

    Raises:
        ProfilerError: an invalid window or level, or a missing plugin.

    Example:
        >>> with ProfileSteps("logs", start=10, stop=15) as prof:
        ...     for batch in dataset:
        ...         with prof.step():
        ...             train_step(batch)
    """

    def __init__(
        self,
        log_dir,
        start: int = 10,
        stop: int = 15,
        *,
        host_tracer_level: int = 2,
        python_tracer_level: int = 0,
        device_tracer_level: int = 1,
        subdir: str = "train",
        require_plugin: bool = True,
        step_markers: bool = True,
        verbose: int = 1,
        say: Optional[Callable[[str], None]] = None,
    ):
        self.window = StepWindow(start, stop)
        self.say = say or (lambda line: warnings.warn(line, stacklevel=4))
        self._told_alignment = False
        for name, value, top in (
            ("host_tracer_level", host_tracer_level, 3),
            ("python_tracer_level", python_tracer_level, 1),
            ("device_tracer_level", device_tracer_level, 1),
        ):
            if value not in range(top + 1):
                raise ProfilerError(f"{name} must be one of {list(range(top + 1))}. Received: {name}={value!r}.")
        if require_plugin:
            check_profile_plugin()
        self.log_dir = Path(log_dir)
        self.trace_dir = self.log_dir / subdir if subdir else self.log_dir
        levels = (host_tracer_level, python_tracer_level, device_tracer_level)
        self.options = None if levels == TRACER_DEFAULTS else tf.profiler.experimental.ProfilerOptions(
            host_tracer_level=host_tracer_level,
            python_tracer_level=python_tracer_level,
            device_tracer_level=device_tracer_level,
        )
        if self.options is not None and tf.__version__.startswith(_IGNORES_LEVELS):
            warnings.warn(
                f"TensorFlow {tf.__version__} ignores tracer levels set from Python (it logs "
                "'host_tracer_level expects an i value') and traces at its defaults: host 2, python 0, device 1.",
                stacklevel=3,
            )
        self.step_markers = step_markers
        self.verbose = verbose
        self.steps_done = 0
        self.trace_files: List[Path] = []
        self._before: set = set()
        self._marker = None
        self._pending_steps = 1
        self.execution_sizes: set = set()

    # -- the two calls around each execution -----------------------------------
    def begin(self, num_steps: int = 1) -> None:
        """Call before an execution that runs `num_steps` optimizer steps."""
        self._pending_steps = max(1, int(num_steps))
        if self.window.should_start(self.steps_done, self._pending_steps):
            self._start()
        if self.window.active and self.step_markers:
            self.execution_sizes.add(self._pending_steps)
            name = step_marker_name(self._pending_steps)
            self._marker = tf.profiler.experimental.Trace(name, step_num=self.steps_done, _r=1)
            self._marker.__enter__()

    def end(self, steps_done: Optional[int] = None) -> None:
        """Call after the execution; `steps_done` (e.g. `optimizer.iterations`) defaults to adding `begin`'s."""
        if self._marker is not None:
            self._marker.__exit__(None, None, None)
            self._marker = None
        self.steps_done = self.steps_done + self._pending_steps if steps_done is None else int(steps_done)
        if self.window.should_stop(self.steps_done):
            self._stop()

    @contextlib.contextmanager
    def step(self, num_steps: int = 1):
        """Wraps one call that runs `num_steps` training steps."""
        self.begin(num_steps)
        try:
            yield self
        finally:
            self.end()

    @property
    def needs_steps(self) -> bool:
        """False once the window is done: callers may stop counting steps."""
        return not self.window.done

    # -- start / stop ----------------------------------------------------------
    def _start(self) -> None:
        self._before = {path: path.stat().st_mtime_ns for path in xplane_files(self.trace_dir)}
        latest = max((path.parent.stat().st_mtime for path in self._before), default=0.0)
        if int(latest) == int(time.time()):  # TensorFlow names a capture's folder by the second: wait for the next
            time.sleep(1 - time.time() % 1)  # one, or this capture would overwrite that one
        try:
            tf.profiler.experimental.start(str(self.trace_dir), options=self.options)
        except (tf.errors.AlreadyExistsError, tf.errors.UnavailableError) as e:
            raise ProfilerError(
                f"Could not start the profiler: another profiling session is running in this process ({e.message}). "
                "Stop it first (tf.profiler.experimental.stop()), or remove the other profiler "
                "(e.g. TensorBoard(profile_batch=...)); TensorFlow allows one session at a time."
            ) from None
        self.window.mark_started(self.steps_done)
        n = self._pending_steps  # assumes equal executions through the window
        end = self.steps_done + -(-(self.window.stop - self.steps_done) // n) * n
        if self.steps_done > self.window.start:  # an execution holding the start begins before it: a resume
            self._told_alignment = True
            self.say(f"profile: the run resumed at step {self.steps_done}, inside the window [{self.window.start}, "
                     f"{self.window.stop}); tracing steps [{self.steps_done}, {end}) (the steps before are in the "
                     "attempt before's trace, if it finished one)")
        elif (self.steps_done, end) != (self.window.start, self.window.stop):
            self._told_alignment = True
            self.say(f"profile: steps [{self.window.start}, {self.window.stop}) fall inside executions of {n} "
                     f"steps (steps_per_execution); tracing steps [{self.steps_done}, {end}).")

    def _stop(self) -> None:
        if self._marker is not None:
            self._marker.__exit__(None, None, None)
            self._marker = None
        tf.profiler.experimental.stop()
        self.window.mark_stopped(self.steps_done)
        if self.steps_done > self.window.stop and not self._told_alignment:
            self.say(f"profile: steps [{self.window.start}, {self.window.stop}) end inside an execution of several "
                     f"steps (steps_per_execution); traced up to step {self.steps_done}.")
        self.trace_files = [p for p in xplane_files(self.trace_dir) if self._before.get(p) != p.stat().st_mtime_ns]
        if not self.trace_files:
            raise ProfileNotWritten(
                f"The profiler stopped but wrote no .xplane.pb file under {self.trace_dir}/plugins/profile. "
                "Check that the log directory is writable and has free space, and that nothing else "
                "stopped the profiler (one session per process)."
            )
        if self.step_markers:
            for path in self.trace_files:
                group_steps_by_markers(path)
        if self.verbose:
            self._print_captured()

    def _print_captured(self) -> None:
        first, stop = self.window.captured
        n = max(self.execution_sizes, default=1)
        per_step = "" if not self.step_markers or n == 1 else (
            f"\n           the Overview counts one step per execution of {n} steps "
            f"('{step_marker_name(n)} {first}' = steps {first}..{first + n - 1}): divide its step time by {n}"
        )
        print(
            f"profile:   traced steps [{first}, {stop}) into {self.trace_files[0].parent}{per_step}\n"
            f"           open it with: {tensorboard_command(self.log_dir)}  (Profile tab)",
            file=sys.stdout,
        )

    def close(self, planned_steps: Optional[int] = None) -> None:
        """Stops a trace still running and checks the window was reached.

        Args:
            planned_steps: steps the loop ran, for the message. Defaults to `steps_done`.

        Raises:
            ProfilerError: training ended before the window's start step.
            ProfileNotWritten: the trace wrote no `.xplane.pb` file.
        """
        if self.window.active:
            if self.window.stop > self.steps_done:
                warnings.warn(
                    f"Training ended at step {self.steps_done}, inside the profile window "
                    f"[{self.window.start}, {self.window.stop}); traced steps "
                    f"[{self.window.started_at}, {self.steps_done}).",
                    stacklevel=2,
                )
            self._stop()
        if self.window.started_at is None:
            ran = self.steps_done if planned_steps is None else planned_steps
            first = min(2, max(0, ran - 1))
            raise ProfilerError(
                f"The profile window [{self.window.start}, {self.window.stop}) was never reached: training ran "
                f"only {ran} optimizer step(s), so nothing was traced. Pass a window inside the run "
                f"(e.g. {_window(first, max(first + 1, min(ran, first + 5)))}) or train longer."
            )

    def __enter__(self) -> "ProfileSteps":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            if self.window.active:
                self._marker = None
                tf.profiler.experimental.stop()
                self.window.mark_stopped(self.steps_done)
            return
        self.close()
