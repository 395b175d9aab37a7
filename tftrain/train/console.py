"""All of the trainer's printing, in one place; every line is flushed, so a launcher that
prefixes each task's output shows it in order."""

from __future__ import annotations

import sys
from typing import Iterable, Optional, TextIO


class Console:
    """Prints the trainer's lines at a verbosity.

    Args:
        verbose: 0 prints only errors and the result line; 1 the plan and decisions; 2 also the
            full configuration (`detail`). Defaults to 1.
        out: stream for ordinary lines. Defaults to `sys.stdout`.
        err: stream for warnings and errors. Defaults to `sys.stderr`.
    """

    def __init__(self, verbose: int = 1, out: Optional[TextIO] = None, err: Optional[TextIO] = None):
        self.verbose = verbose
        self.out = out
        self.err = err

    def _write(self, stream: TextIO, text: str) -> None:
        print(text, file=stream, flush=True)

    def line(self, text: str = "") -> None:
        """One line (or several joined by newlines) on stdout, unless silent."""
        if self.verbose:
            self._write(self.out or sys.stdout, text)

    def lines(self, texts: Iterable[str]) -> None:
        """Each of `texts` as a line, unless silent."""
        for text in texts:
            self.line(text)

    def detail(self, text: str = "") -> None:
        """A line printed only at verbosity 2 (the full configuration)."""
        if self.verbose >= 2:
            self._write(self.out or sys.stdout, text)

    def result(self, text: str) -> None:
        """The run's result line on stdout, at every verbosity."""
        self._write(self.out or sys.stdout, text)

    def section(self, title: str) -> None:
        """A section heading: `== title ==`."""
        self.line(f"== {title} ==")

    def warn(self, text: Optional[str]) -> None:
        """A warning on stderr, unless silent or `text` is empty."""
        if self.verbose and text:
            self._write(self.err or sys.stderr, f"warning: {text}")

    def error(self, text: str) -> None:
        """An error on stderr, always."""
        self._write(self.err or sys.stderr, text)


def keras_progress(verbose: int, stream: Optional[TextIO] = None) -> tuple:
    """`(verbose for Model.fit, [callbacks])`: under `--verbose 1` a step-capped bar on a terminal,
    one line per epoch to a file or pipe (where a bar's control characters are noise)."""
    stream = stream or sys.stdout
    if verbose != 1:
        return verbose, []
    if not (hasattr(stream, "isatty") and stream.isatty()):
        return 2, []
    return 1, [_step_clamped_progbar()]


def _step_clamped_progbar():
    """Keras's progress bar capped at the epoch's steps (keras-team/keras#20861: "120/117" under
    `steps_per_execution`). Built on demand: this module loads before Keras."""
    import keras

    class StepClampedProgbar(keras.callbacks.ProgbarLogger):
        def _update_progbar(self, batch, logs=None):
            if self.target is not None:
                batch = min(batch, self.target - 1)
            super()._update_progbar(batch, logs)

    return StepClampedProgbar()
