"""ChanceWatch: says once when validation accuracy sits at chance while training accuracy climbs. Usual causes:
BatchNormalization statistics a momentum near 1 leaves near their initial values, or preprocessing that differs."""

from __future__ import annotations

from typing import Callable, Optional

import keras

CHANCE_MARGIN = 0.05
"""Validation accuracy within this much of chance (1 / classes) is at chance."""

LEARNED_MARGIN = 0.25
"""Training accuracy this much above chance counts as learning."""


class ChanceWatch(keras.callbacks.Callback):
    """Warns once, from the second epoch, when `val_accuracy` is within `CHANCE_MARGIN` of chance (1 / the output's
    last dimension) while `accuracy` is over `LEARNED_MARGIN` above it. Silent for one output unit or missing metrics.

    Args:
        say: prints the one-line warning. Defaults to `print`.
    """

    def __init__(self, say: Callable[[str], None] = print):
        super().__init__()
        self.say, self.warned = say, False
        self.chance: Optional[float] = None

    def on_train_begin(self, logs=None):
        outputs = getattr(self.model, "outputs", None) or []
        shape = tuple(outputs[0].shape) if len(outputs) == 1 else ()
        units = shape[-1] if shape else None
        self.chance = 1.0 / units if units and units > 1 else None

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        val, train = logs.get("val_accuracy"), logs.get("accuracy")
        if self.warned or self.chance is None or epoch < 1 or val is None or train is None:
            return
        if float(val) <= self.chance + CHANCE_MARGIN and float(train) >= self.chance + LEARNED_MARGIN:
            self.warned = True
            classes = round(1 / self.chance)
            self.say(f"validation accuracy {float(val):.3f} sits at chance ({self.chance:.3f} for {classes} "
                     f"classes) while training accuracy reached {float(train):.3f}: the model does not carry what "
                     "it learned to evaluation. Check that training and evaluation preprocess alike, and "
                     "BatchNormalization's moving statistics (a momentum near 1 needs thousands of steps to follow "
                     "the data when training from random weights).")
