"""CPU thread settings: intra-op and inter-op parallelism.

TensorFlow reads these once, when its runtime initialises (the first op, or the
first device listing). Setting them afterwards raises TensorFlow's `RuntimeError`;
`set_threads` turns that into a single warning naming the values actually in effect,
so a late call never crashes a user's program. The tf.data private thread pool is a
per-dataset option: see `DataConfig.private_threads` and `tftrain.data.pipeline`.

Source: https://www.tensorflow.org/api_docs/python/tf/config/threading
"""

from __future__ import annotations

import dataclasses
import warnings

import tensorflow as tf

from tftrain.errors import RuntimeStartedWarning, check_int
from tftrain.host import usable_cores

_warned = False


cpu_count = usable_cores
"""Cores this process may run on (CPU affinity and cgroups' cpusets respected): `tftrain.host.usable_cores`,
kept under this name for existing imports."""


@dataclasses.dataclass(frozen=True)
class ThreadSettings:
    """Thread counts in effect.

    Attributes:
        intra_op: threads one op may use; 0 means TensorFlow's default (one per
            core).
        inter_op: ops that may run concurrently; 0 means TensorFlow's default.
        applied: False when the requested values could not be applied because
            TensorFlow had already initialised.
        cores: cores available to this process.
        source: where the counts come from, e.g. `"measured by python -m
            tftrain.doctor: 1.12x TensorFlow's defaults"`; "" when set by
            the caller or left at the defaults. Defaults to "".
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
    """Returns the thread counts TensorFlow will use (0 = its default)."""
    return ThreadSettings(
        intra_op=tf.config.threading.get_intra_op_parallelism_threads(),
        inter_op=tf.config.threading.get_inter_op_parallelism_threads(),
        applied=applied,
        cores=cpu_count(),
    )


def set_threads(intra_op: int = 0, inter_op: int = 0) -> ThreadSettings:
    """Sets intra-op and inter-op parallelism, if TensorFlow has not started yet.

    Args:
        intra_op: threads per op, >= 0; 0 keeps TensorFlow's default (one per
            core). Defaults to 0.
        inter_op: concurrent ops, >= 0; 0 keeps TensorFlow's default. Defaults
            to 0.

    Returns:
        The `ThreadSettings` actually in effect. When TensorFlow has already
        initialised and the request differs from what is in effect, nothing
        changes, `applied` is False, and a `RuntimeStartedWarning` (a
        `RuntimeWarning`) is issued once per process naming the values in effect.

    Raises:
        ValueError: when a count is negative.

    Example:
        >>> from tftrain.runtime import set_threads
        >>> set_threads(intra_op=2, inter_op=1)  # before building any model
    """
    check_int(intra_op, "intra_op", minimum=0)
    check_int(inter_op, "inter_op", minimum=0)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    except RuntimeError:
        if (tf.config.threading.get_intra_op_parallelism_threads(),
                tf.config.threading.get_inter_op_parallelism_threads()) == (intra_op, inter_op):
            return current_threads(applied=True)  # already what was asked: nothing to warn about
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
