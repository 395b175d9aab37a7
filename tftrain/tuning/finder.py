"""BatchSizeFinder: run `find_batch_size` from inside `model.fit` (also `tftrain.callbacks.BatchSizeFinder`).

Keras fixes the dataset before any callback runs, so the callback cannot switch
the running `fit` to the new size: by default it stops that `fit`, and you start
the real one with `finder.batch_size`.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import keras

from tftrain.runtime.execution_probe import ModelState
from tftrain.tuning.batch_size import BatchSizeResult, find_batch_size


class BatchSizeFinder(keras.callbacks.Callback):
    """Finds a global batch size when `fit` begins (see `find_batch_size`).

    `data` and `**search_kwargs` go to `find_batch_size`. `stop_training` ends this `fit` after the search
    without training an epoch (no other callback sees one), leaving the model as it was; defaults to True.
    List it after a callback that restores a checkpoint (`StepBackup`), which would otherwise move the first
    epoch again. `result` is the `BatchSizeResult` (None before `fit`).

    Example:
        >>> finder = BatchSizeFinder(make_dataset, mode="binsearch")
        >>> model.fit(make_dataset(32), epochs=1, callbacks=[finder])   # searches, then stops
        >>> model.fit(make_dataset(finder.batch_size), epochs=10)
    """

    def __init__(self, data: Union[tuple, Callable], *, stop_training: bool = True, **search_kwargs):
        super().__init__()
        self.data = data
        self.stop_after_search = stop_training
        self.search_kwargs = search_kwargs
        self.result: Optional[BatchSizeResult] = None
        self._state: Optional[ModelState] = None

    @property
    def batch_size(self) -> Optional[int]:
        """The chosen global batch size, or None before the search ran."""
        return None if self.result is None else self.result.batch_size

    def on_train_begin(self, logs=None):
        from tftrain import _compat

        history = getattr(self.model, "history", None)  # this fit's, which the search's own fits replace
        self.result = find_batch_size(self.model, self.data, **self.search_kwargs)
        self.model.history = history
        if self.stop_after_search:  # no epoch left: fit goes on to on_train_end
            _compat.set_initial_epoch(self.model, (self.params or {}).get("epochs", 1))
            self._state = ModelState(self.model)  # for a step a later callback's restore lets run
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        from tftrain import _compat

        if self._state is not None:
            self._state.restore()
            self._state = None
            _compat.clear_initial_epoch(self.model)
