"""All of the trainer's printing, in one place.

`verbose=0` prints nothing but errors (to stderr); 1 and 2 print the run's plan,
choices and results. Every line is flushed, so a launcher that prefixes each
task's output (`python -m tftrain.launch`) shows it in order.
"""

from __future__ import annotations

import sys
from typing import Iterable, Optional, TextIO


class Console:
    """Prints the trainer's lines at a verbosity.

    Args:
        verbose: 0 prints only errors; 1 or 2 print everything. Defaults to 1.
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

    def section(self, title: str) -> None:
        """A section heading: `== title ==`."""
        self.line(f"== {title} ==")

    def warn(self, text: str) -> None:
        """A warning on stderr, unless silent."""
        if self.verbose:
            self._write(self.err or sys.stderr, f"warning: {text}")

    def error(self, text: str) -> None:
        """An error on stderr, always."""
        self._write(self.err or sys.stderr, text)
