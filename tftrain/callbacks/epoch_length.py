"""EpochLengthWatch: says once when an epoch runs other than the planned number of steps, which a task's
count of its training examples (`num_train_examples`) sets: a learning-rate schedule, the backup interval and
the profile window are counted in planned epochs."""

from __future__ import annotations

from typing import Callable, Optional

import keras

from tftrain.callbacks._steps import train_steps


class EpochLengthWatch(keras.callbacks.Callback):
    """Warns once, after the first whole epoch (one that starts where the plan says), when it ran more than
    `slack` steps more or fewer than `planned`; silent on a resumed epoch that starts mid-way.

    Args:
        planned: steps an epoch should run (micro-batches under gradient accumulation).
        why: what the plan came from, for the line (e.g. "the task's num_train_examples, 12,800").
        say: prints the one-line warning. Defaults to `print`.
        slack: steps more or fewer that pass (a partial last batch; an epoch's micro-batches short of a whole
            optimizer step). Defaults to 1.
    """

    def __init__(self, planned: int, why: str, say: Callable[[str], None] = print, slack: int = 1):
        super().__init__()
        self.planned, self.why, self.say, self.slack = int(planned), why, say, max(1, int(slack))
        self.begin: Optional[int] = None
        self.done, self.ran = False, 0

    def on_epoch_begin(self, epoch, logs=None):
        step = train_steps(self.model)
        self.begin = step if not self.done and step == epoch * self.planned else None
        self.ran = 0

    def on_train_batch_end(self, batch, logs=None):
        self.ran = batch + 1  # the last step of the execution, counted as a whole one even when the data ended

    def on_epoch_end(self, epoch, logs=None):
        if self.begin is None:
            return
        # Each count runs over in one case: the batch hooks' by the rest of a last execution the data cut short,
        # the optimizer's by one when Keras finds a dataset of unknown length exhausted at 1 step per execution.
        self.done, ran = True, min(self.ran, train_steps(self.model) - self.begin)
        if abs(ran - self.planned) > self.slack:
            self.say(f"epoch {epoch + 1} ran {ran} steps where the plan counts {self.planned} from {self.why}: a "
                     "learning-rate schedule, --backup-every-steps and --profile count the planned steps, so a "
                     f"cosine schedule {'reaches 0 early' if ran > self.planned else 'stops short of 0'}. "
                     "Give the task its true number of training examples (num_train_examples).")
