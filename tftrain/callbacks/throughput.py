"""ThroughputMonitor: examples/sec, step time and an input-bound check for `fit`.

The math lives in `tftrain.metering` (`StepMeter`, `time_batches`,
`input_bound_verdict`); this callback only times executions, counts real optimizer
steps and writes the figures.
"""

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
"""TensorBoard scalar names start with this (e.g. `throughput/examples_per_sec`)."""


def _check_input_data(input_data) -> None:
    """Refuses in-memory arrays as `input_data`: they have no input pipeline to time."""
    if isinstance(input_data, (tuple, list, dict, np.ndarray)):
        raise ConfigError(
            f"ThroughputMonitor input_data is {type(input_data).__name__} of arrays, which has no input pipeline "
            "to time. Pass the tf.data.Dataset (or other iterable of batches) given to fit(), or leave input_data out."
        )


class ThroughputMonitor(keras.callbacks.Callback):
    """Measures examples/sec and step time during `fit`, and checks for input-bound.

    Each Keras batch hook covers one execution, which under
    `steps_per_execution` may run several optimizer steps. The monitor takes each
    execution's size from the hook's step indices and, once per epoch, reconciles
    the epoch's count with `model.optimizer.iterations` (the true count: when the
    data runs out, the last execution is shorter than its indices say). Under
    dynamic loss scaling (mixed_float16) `iterations` misses the steps skipped for
    non-finite gradients, so there the hooks' count stands (it over-counts only a
    last execution cut short by the end of the data). Reading that variable costs
    a device round trip, so it is not done per step. Keras 3
    waits for each execution to finish before calling the batch-end hook, so the
    hooks time finished work. Each execution is timed from the end of the
    previous one (callback and Python overhead between executions included, as
    in real training). Under gradient accumulation a step is a micro-batch (one
    `train_step`), so examples/sec counts every example. Warm-up steps (tracing, compilation) are left out. Examples are global: steps x `batch_size`, where `batch_size` is
    the global batch size (all replicas together), the size of the batches the
    dataset yields to `fit`.

    Per epoch and at the end it computes examples/sec, steps/sec and the median
    and 90th-percentile step time; writes them as TensorBoard scalars
    (`throughput/*`, x axis = epoch) when `log_dir` is given; and keeps them in
    `epochs` and `result()`. Given `input_data`, at the end it times the input
    pipeline alone delivering batches and reports the input-bound verdict.

    Args:
        batch_size: global batch size; None tries `input_data`'s static batch
            dimension, else reports steps/sec and step times only. Defaults to
            None.
        log_dir: TensorBoard log directory; None writes no scalars. Defaults to
            None.
        input_data: the training input (e.g. the `tf.data.Dataset` passed to
            `fit`) for the input-bound check; None skips it. Defaults to None.
            In-memory arrays (`(x, y)`, a dict, an array) raise `ConfigError`:
            they have no pipeline to time.
        warmup_steps: optimizer steps left out at the start of training.
            Defaults to 3.
        window: steps in the sliding window of `window_stats`. Defaults to 100.
        input_batches: batches timed by the input-bound check (at most the
            steps measured). Defaults to 50.
        input_bound_threshold: input share of the step time from which the run
            is called input-bound. Defaults to 0.5.
        subdir: TensorBoard run the scalars go to, under `log_dir`. Defaults to
            "train" (next to Keras's own training scalars).
        verbose: 1 prints one line per epoch and the verdict, 0 is silent.
            Defaults to 0.
        clock: monotonic clock in seconds (tests pass a fake one). Defaults to
            `time.perf_counter`.

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
        """Seconds spent inside this callback's batch hooks (its own overhead)."""

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
        self._t = None

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = batch
        if self._t is None:  # first execution of the epoch: time it from here
            self._t = self.clock()

    def on_train_batch_end(self, batch, logs=None):
        now = self.clock()
        # Nominal size from the hook indices (Keras 3 passes the execution's first and
        # last step); on_epoch_end corrects it. Older Keras passed the first step twice.
        nominal = batch - self._begin + 1 if batch > self._begin else steps_per_execution(self.model)
        self.meter.record(nominal, now - self._t)
        self._t = now
        self.hook_seconds += self.clock() - now

    def on_epoch_end(self, epoch, logs=None):
        iterations = train_steps(self.model)
        if not skips_steps(self.model):  # else keep the hooks' count: every step that ran
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
                self.input_check = metering.input_bound_verdict(
                    per_batch, stats.step_time_median_s, self.input_bound_threshold
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
        """All figures of the last `fit` as plain data (JSON-ready).

        Returns:
            `{"batch_size", "warmup_steps", "total_steps" (warm-up included),
            "examples_per_sec", "steps_per_sec",
            "step_time_median_s", "step_time_p90_s", "steps", "seconds",
            "examples", "window": {...}, "epochs": [...], "input": {...} or None,
            "monitor_overhead_s"}`; the overall figures are None when every step
            was warm-up.
        """
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
    rate = f"{stats.examples_per_sec:,.0f} examples/sec, " if stats.examples_per_sec is not None else ""
    return (
        f"{rate}{stats.steps_per_sec:,.1f} steps/sec, step time median {stats.step_time_median_s * 1e3:.2f} ms, "
        f"p90 {stats.step_time_p90_s * 1e3:.2f} ms over {stats.steps} steps"
    )

