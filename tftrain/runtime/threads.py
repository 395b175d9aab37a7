"""CPU thread settings (intra-op, inter-op), which TensorFlow reads once at start-up; `set_threads` turns a late
call's `RuntimeError` into one warning. Source: https://www.tensorflow.org/api_docs/python/tf/config/threading"""

from __future__ import annotations

import dataclasses
import warnings

import tensorflow as tf

from tftrain.errors import RuntimeStartedWarning, check_int
from tftrain.host import usable_cores

_warned = False


cpu_count = usable_cores
"""`tftrain.host.usable_cores`, under the name other modules import."""


@dataclasses.dataclass(frozen=True)
class ThreadSettings:
    """Thread counts in effect (0 = TensorFlow's default).

    Attributes:
        applied: False when TensorFlow had already started and the request was not applied.
        source: where the counts come from, e.g. the doctor's measurement; "" by default.
    """

    intra_op: int
    inter_op: int
    applied: bool
    cores: int
    source: str = ""

    def describe(self) -> str:
        """One line, e.g. `intra-op 2, inter-op default (2 cores)`, then the source when there is one."""
        name = lambda n: "default" if n == 0 else str(n)  # noqa: E731
        return (f"intra-op {name(self.intra_op)}, inter-op {name(self.inter_op)} ({self.cores} cores)"
                + (f"; {self.source}" if self.source else ""))


def current_threads(applied: bool = True) -> ThreadSettings:
    """The thread counts TensorFlow will use (0 = its default)."""
    return ThreadSettings(
        intra_op=tf.config.threading.get_intra_op_parallelism_threads(),
        inter_op=tf.config.threading.get_inter_op_parallelism_threads(),
        applied=applied,
        cores=cpu_count(),
    )


def set_threads(intra_op: int = 0, inter_op: int = 0) -> ThreadSettings:
    """Sets intra-op and inter-op parallelism, if TensorFlow has not started yet.

    Args:
        intra_op: threads per op; 0 (default) keeps TensorFlow's (one per core).
        inter_op: concurrent ops; 0 (default) keeps TensorFlow's.

    Returns:
        The `ThreadSettings` in effect (if TensorFlow had started: `applied` False, one `RuntimeStartedWarning`).

    Raises:
        ValueError: when a count is negative.
    """
    check_int(intra_op, "intra_op", minimum=0)
    check_int(inter_op, "inter_op", minimum=0)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    except RuntimeError:
        if (tf.config.threading.get_intra_op_parallelism_threads(),
                tf.config.threading.get_inter_op_parallelism_threads()) == (intra_op, inter_op):
            return current_threads(applied=True)  # already as asked
        in_effect = current_threads(applied=False)
        global _warned
        if not _warned:
            _warned = True
            warnings.warn(
                f"Thread counts intra_op={intra_op}, inter_op={inter_op} were not applied: "
                f"TensorFlow had already initialised. In effect: {in_effect.describe()}. "
                "Set threads before any TensorFlow op runs (first thing in the program).",
                RuntimeStartedWarning,
                stacklevel=2,
            )
        return in_effect
    return current_threads(applied=True)
