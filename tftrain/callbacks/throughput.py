"""ThroughputMonitor: examples/sec, step time and an input-bound check for `fit` (math: `tftrain.metering`)."""

from __future__ import annotations

import os
import time
from typing import Callable, Iterable, List, Optional

import keras
import numpy as np
import tensorflow as tf

from tftrain import metering
from tftrain.errors import ConfigError
from tftrain.callbacks._steps import skips_steps, steps_per_execution, train_steps
from tftrain.runtime.execution import static_batch_size

SCALAR_PREFIX = "throughput/"
"""Prefix of the TensorBoard scalars (e.g. `throughput/examples_per_sec`)."""


def _check_input_data(input_data) -> None:
    """Refuses in-memory arrays: no input pipeline to time."""
    if isinstance(input_data, (tuple, list, dict, np.ndarray)):
        raise ConfigError(
            f"ThroughputMonitor input_data is {type(input_data).__name__} of arrays, which has no input pipeline "
            "to time. Pass the tf.data.Dataset (or other iterable of batches) given to fit(), or leave input_data out."
        )


class ThroughputMonitor(keras.callbacks.Callback):
    """Measures examples/sec and step time during `fit`, and checks for input-bound; figures go to `epochs`,
    `result()` and TensorBoard (`throughput/*`). Executions are timed end to end, an epoch's first from the epoch's
    start (its input set-up); examples = steps x global batch. Step counts come from the hooks, reconciled each epoch with the optimizer's (not per step: a device round trip;
    not under dynamic loss scaling, whose skipped steps it misses).

    Args:
        batch_size: global batch size. Defaults to None (`input_data`'s static batch size, else no examples/sec).
        log_dir: TensorBoard log directory. Defaults to None (no scalars).
        input_data: the training input, timed alone at the end for the input-bound verdict; arrays raise
            `ConfigError`. Defaults to None (no check).
        warmup_steps: steps left out at the start. Defaults to 3.
        window: steps in `window_stats`' sliding window. Defaults to 100.
        input_batches: batches the input check times. Defaults to 50.
        input_bound_threshold: input share of step time that is input-bound. Defaults to 0.5.
        subdir: TensorBoard run under `log_dir`. Defaults to "train".
        verbose: 1 prints one line per epoch and the verdict. Defaults to 0.
        clock: monotonic clock in seconds. Defaults to `time.perf_counter`.

    Example:
        >>> monitor = ThroughputMonitor(batch_size=256, log_dir="logs", input_data=train_ds)
        >>> model.fit(train_ds, epochs=3, callbacks=[monitor])
        >>> monitor.result()["examples_per_sec"], monitor.result()["input"]["verdict"]
    """

    def __init__(
        self,
        batch_size: Optional[int] = None,
        log_dir=None,
        input_data: Optional[Iterable] = None,
        *,
        warmup_steps: int = 3,
        window: int = 100,
        input_batches: int = 50,
        input_bound_threshold: float = metering.DEFAULT_INPUT_BOUND_THRESHOLD,
        subdir: str = "train",
        verbose: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ):
        super().__init__()
        _check_input_data(input_data)
        if batch_size is None and input_data is not None:
            batch_size = static_batch_size(input_data)
        self.meter = metering.StepMeter(batch_size, warmup_steps, window)  # validates
        if input_batches < 1:
            raise ValueError(f"input_batches must be >= 1. Received: input_batches={input_batches!r}.")
        self.batch_size = self.meter.batch_size
        self.log_dir = log_dir
        self.input_data = input_data
        self.input_batches = input_batches
        self.input_bound_threshold = input_bound_threshold
        self.subdir = subdir
        self.verbose = verbose
        self.clock = clock
        self.epochs: List[dict] = []
        self.input_check: Optional[metering.InputCheck] = None
        self._writer = None
        self._iterations = 0
        self._begin = 0
        self._t: Optional[float] = None
        self.hook_seconds = 0.0
        """Seconds spent in this callback's batch hooks (its overhead)."""

    # -- hooks -----------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self.meter = metering.StepMeter(self.batch_size, self.meter.warmup_steps, self.meter.window)
        self.epochs = []
        self.input_check = None
        self.hook_seconds = 0.0
        self._iterations = train_steps(self.model)
        if self.log_dir is not None and self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(os.fspath(self.log_dir), self.subdir))

    def on_epoch_begin(self, epoch, logs=None):
        self.meter.start_epoch(epoch)
        self._t = self.clock()  # the first execution's time holds the epoch's input set-up (Keras makes it anew)

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = batch

    def on_train_batch_end(self, batch, logs=None):
        now = self.clock()
        # from the hook indices (equal ones, from older Keras, mean steps_per_execution); on_epoch_end corrects it
        nominal = batch - self._begin + 1 if batch > self._begin else steps_per_execution(self.model)
        self.meter.record(nominal, now - self._t)
        self._t = now
        self.hook_seconds += self.clock() - now

    def on_epoch_end(self, epoch, logs=None):
        iterations = train_steps(self.model)
        if not skips_steps(self.model):  # else the hooks' count: every step that ran
            self.meter.reconcile_epoch(epoch, iterations - self._iterations)
        self._iterations = iterations
        stats = self.meter.stats(epoch)
        if stats is None:
            return
        row = {"epoch": int(epoch), **stats.to_dict()}
        self.epochs.append(row)
        self._write(stats, step=epoch)
        if self.verbose:
            print(f"throughput: epoch {epoch + 1}: {_describe(stats)}")

    def on_train_end(self, logs=None):
        stats = self.meter.stats()
        if stats is not None and self.input_data is not None:
            num = max(1, min(self.input_batches, stats.steps))
            per_batch = metering.time_batches(self.input_data, num, warmup_batches=1, clock=self.clock)
            if per_batch is not None:
                advice = metering.INPUT_BOUND_ADVICE if isinstance(self.input_data, tf.data.Dataset) else \
                    metering.PYTHON_INPUT_ADVICE
                self.input_check = metering.input_bound_verdict(
                    per_batch, stats.step_time_median_s, self.input_bound_threshold, advice
                )
        if self._writer is not None:
            if self.input_check is not None:
                with self._writer.as_default():
                    tf.summary.scalar(SCALAR_PREFIX + "input_fraction", self.input_check.input_fraction,
                                      step=max(0, len(self.epochs) - 1))
            self._writer.flush()
        if self.verbose:
            if stats is not None:
                print(f"throughput: overall: {_describe(stats)}")
            if self.input_check is not None:
                print(f"throughput: {self.input_check.verdict}")

    # -- results ---------------------------------------------------------------
    def _write(self, stats: metering.ThroughputStats, step: int) -> None:
        if self._writer is None:
            return
        with self._writer.as_default():
            for key, value in stats.to_dict().items():
                if key in ("examples_per_sec", "steps_per_sec", "step_time_median_s", "step_time_p90_s") and value is not None:
                    tf.summary.scalar(SCALAR_PREFIX + key, value, step=step)

    def result(self) -> dict:
        """The last `fit`'s figures as JSON-ready data: `batch_size`, `warmup_steps`, `total_steps`, overall figures
        (None if all steps were warm-up), `window`, `epochs`, `input`, `monitor_overhead_s`."""
        overall = self.meter.stats()
        window = self.meter.window_stats()
        keys = ("examples_per_sec", "steps_per_sec", "step_time_median_s", "step_time_p90_s",
                "steps", "seconds", "examples")
        out = {"batch_size": self.batch_size, "warmup_steps": self.meter.warmup_steps,
               "total_steps": self.meter.total_steps}
        out.update({k: (getattr(overall, k) if overall else None) for k in keys})
        out["window"] = window.to_dict() if window else None
        out["epochs"] = list(self.epochs)
        out["input"] = self.input_check.to_dict() if self.input_check else None
        out["monitor_overhead_s"] = self.hook_seconds
        return out


def _describe(stats: metering.ThroughputStats) -> str:
    rate = f"{stats.examples_per_sec:,.0f} examples/sec, " if stats.examples_per_sec is not None else \
        "examples/sec unknown (the batches have no fixed size: pass batch_size=), "
    return (
        f"{rate}{stats.steps_per_sec:,.1f} steps/sec, step time median {stats.step_time_median_s * 1e3:.2f} ms, "
        f"p90 {stats.step_time_p90_s * 1e3:.2f} ms over {stats.steps} steps"
    )

