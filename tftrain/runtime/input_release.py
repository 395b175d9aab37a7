"""`released_off_thread`: a `Model.fit` call's input iterator freed on a background thread.

TensorFlow's tf.data iterator destructor waits for the pipeline's autotuning thread to
wake (its sleep grows to about 2.5 s), so a long `fit` on one iterator can return
seconds late. The wait releases the GIL, so freeing the iterator on a daemon thread
costs the main thread nothing. At exit each such thread is joined (up to
`EXIT_WAIT_S`), since a process that exits mid-destructor aborts. If Keras's `fit`
names its locals otherwise, nothing is taken and `fit` frees its iterator itself.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
from typing import Iterator, List

FIT_LOCALS = ("iterator", "epoch_iterator")
"""The locals of Keras's `TensorFlowTrainer.fit` (keras/src/backend/tensorflow/trainer.py) holding its iterator."""


EXIT_WAIT_S = 60.0
"""Seconds the interpreter's exit waits for each release still running."""

_pending: List[threading.Thread] = []


def _fit_iterator_taker():
    """A callback that, at `on_train_end`, takes `fit`'s `FIT_LOCALS` into its `taken` list."""
    # Keras is imported here: this module loads without TensorFlow.
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
    """Yields a callback for one `Model.fit` call; on leaving the block, its iterator is freed off-thread.

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
