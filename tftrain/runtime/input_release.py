"""`released_off_thread`: a `Model.fit` call's input iterator freed on a background thread, not in `fit`.

When `Model.fit` returns, Python frees its local tf.data iterator, and TensorFlow's iterator
destructor waits for the pipeline's autotuning thread (tf.data's `RootDataset` model thread) to
wake from its sleep: that sleep doubles from 10 ms up to about 2.5 s while the iterator lives. So
a `fit` on one iterator that ran for more than a few seconds (tftrain's repeated training data,
`tftrain.train.loops.fit.one_iterator`, and the execution probe's `dataset.repeat()`) returns up
to 2.5 s late, the main thread idle: measured 2.3-2.5 s at the end of about half of the `fit`
calls of a small CNN (8,192 examples, batch 128, 3-10 epochs, 2 CPU cores, TensorFlow 2.21), with
a native stack of `RootDataset::Iterator::~Iterator` waiting in
`UnboundedThreadPool::LogicalThreadWrapper::~LogicalThreadWrapper`.

The wait releases the GIL, so the same destructor run on another thread costs the main thread
nothing (measured: no gap over 1 ms on the main thread while a background thread waited 2.5 s).
`released_off_thread` keeps the iterator alive past `fit` (a callback takes its references from
`fit`'s frame at `on_train_end`) and frees it on a daemon thread; at interpreter exit every such
thread still running is joined (for up to `EXIT_WAIT_S` each), so TensorFlow is not torn down under
a destructor (a process that exits while one runs aborts: "terminate called ...", exit 134).
When Keras's `fit` names its locals otherwise, nothing is taken and `fit` frees its iterator as
before.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
from typing import Iterator, List

FIT_LOCALS = ("iterator", "epoch_iterator")
"""The locals of Keras's `TensorFlowTrainer.fit` (keras/src/backend/tensorflow/trainer.py) that hold
its tf.data iterator: the epoch iterator and the one it yields."""


EXIT_WAIT_S = 60.0
"""Seconds the interpreter's exit waits for each release still running: its destructor waits for the
autotuning thread's sleep (at most about 2.5 s), longer only on a loaded machine; a process that exits
while one runs aborts ("terminate called ...", exit 134)."""

_pending: List[threading.Thread] = []


def _fit_iterator_taker():
    """A Keras callback that, at `on_train_end`, takes references to `fit`'s input iterator
    (`FIT_LOCALS` of the nearest calling frame named `fit` that has them) into its `taken` list, so
    that `fit`'s return does not free it. (Keras is imported here: this module loads without
    TensorFlow.)"""
    import keras

    class TakeFitIterator(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.taken: list = []

        def on_train_end(self, logs=None):
            from tftrain import _compat

            self.taken = _compat.fit_locals(FIT_LOCALS)

    return TakeFitIterator()


@contextlib.contextmanager
def released_off_thread() -> Iterator["keras.callbacks.Callback"]:
    """A callback for one `Model.fit` call; on leaving the block, that call's input iterator is
    freed on a daemon thread (see the module docstring for why).

    Yields:
        A `keras.callbacks.Callback` to pass to `fit` in the block.

    Example:
        >>> with released_off_thread() as release:
        ...     model.fit(dataset.repeat(), steps_per_epoch=100, epochs=5, callbacks=[release])
    """
    taker = _fit_iterator_taker()
    try:
        yield taker
    finally:
        taken, taker.taken = taker.taken, []
        if taken:
            thread = threading.Thread(target=taken.clear, name="tftrain-input-release", daemon=True)
            _pending[:] = [t for t in _pending if t.is_alive()] + [thread]
            thread.start()


@atexit.register
def _join_pending():
    for thread in list(_pending):
        thread.join(EXIT_WAIT_S)
        if thread.is_alive():  # a destructor that never returns (a pipeline blocked in the user's own code)
            print(f"tftrain: an input pipeline was still being freed after {EXIT_WAIT_S:.0f} s at exit",
                  file=sys.stderr, flush=True)
