"""Throughput and step-time math, kept free of TensorFlow so it is tested alone.

`StepMeter` turns a stream of timed executions ("this call ran N optimizer steps in
S seconds") into examples/sec and step-time figures: the median and 90th percentile
step time over a window, per epoch and overall, leaving out the warm-up steps that
trace and compile the training function. One execution may cover several steps
(Keras `steps_per_execution`); its time is shared evenly between them. Examples are
global: steps x global batch size (all replicas together).

`time_batches` and `input_bound_verdict` implement the input-bound check: time the
input pipeline alone delivering the same batches, and compare that with the step time.

Nothing here imports TensorFlow; the callbacks in `tftrain.callbacks` feed it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from typing import Callable, Iterable, List, Optional, Sequence

DEFAULT_INPUT_BOUND_THRESHOLD = 0.5
"""Input fraction of the step time from which a run is called input-bound."""

INPUT_BOUND_ADVICE = (
    "try cache() after decoding, a parallel map (num_parallel_calls=AUTOTUNE), prefetch(AUTOTUNE), "
    "vectorised (batched) preprocessing, or more tf.data threads"
)


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile of `values` with linear interpolation (NumPy's default).

    Args:
        values: a non-empty sequence of numbers.
        q: percentile in [0, 100].

    Returns:
        The percentile as a float.

    Raises:
        ValueError: when `values` is empty or `q` is outside [0, 100].

    Example:
        >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
        2.5
    """
    if not len(values):
        raise ValueError("percentile of an empty sequence is undefined.")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100]. Received: q={q!r}.")
    ordered = sorted(float(v) for v in values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclasses.dataclass(frozen=True)
class ThroughputStats:
    """Throughput and step time over a set of measured steps.

    Attributes:
        steps: optimizer steps measured.
        seconds: wall time of those steps, in seconds.
        examples: global examples processed (steps x global batch size), or None
            when the batch size is unknown.
        examples_per_sec: global examples per second, or None.
        steps_per_sec: optimizer steps per second.
        step_time_median_s: median step time, in seconds.
        step_time_p90_s: 90th-percentile step time, in seconds.
    """

    steps: int
    seconds: float
    examples: Optional[int]
    examples_per_sec: Optional[float]
    steps_per_sec: float
    step_time_median_s: float
    step_time_p90_s: float

    def to_dict(self) -> dict:
        """The figures as a plain dict (JSON-ready)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class _Execution:
    epoch: int
    first_step: int
    steps: int
    seconds: float


class StepMeter:
    """Collects timed executions and reports throughput and step-time figures.

    Args:
        batch_size: global batch size (examples per optimizer step, all replicas
            together); None reports steps/sec and step times only. Defaults to
            None.
        warmup_steps: leave out executions that start before this many steps
            (counted from the first recorded step): they trace, compile and fill
            buffers. Defaults to 3.
        window: number of most recent measured steps used by `window_stats`.
            Defaults to 100.

    Raises:
        ValueError: on a non-positive `batch_size` or `window`, or a negative
            `warmup_steps`.

    Example:
        >>> meter = StepMeter(batch_size=128, warmup_steps=1)
        >>> meter.record(steps=1, seconds=2.0)   # tracing: left out
        >>> meter.record(steps=4, seconds=0.4)   # steps_per_execution=4
        >>> meter.stats().step_time_median_s
        0.1
    """

    def __init__(self, batch_size: Optional[int] = None, warmup_steps: int = 3, window: int = 100):
        if batch_size is not None and (isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer or None. Received: batch_size={batch_size!r}.")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0. Received: warmup_steps={warmup_steps!r}.")
        if window < 1:
            raise ValueError(f"window must be >= 1. Received: window={window!r}.")
        self.batch_size = None if batch_size is None else int(batch_size)
        self.warmup_steps = int(warmup_steps)
        self.window = int(window)
        self.epoch = 0
        self.total_steps = 0
        self._executions: List[_Execution] = []

    def start_epoch(self, epoch: int) -> None:
        """Marks the start of epoch `epoch`; later records belong to it."""
        self.epoch = int(epoch)

    def record(self, steps: int, seconds: float) -> None:
        """Records one execution.

        Args:
            steps: optimizer steps the execution ran (0 is ignored).
            seconds: its wall time, in seconds.

        Raises:
            ValueError: on negative `steps` or `seconds`.
        """
        if steps < 0 or seconds < 0:
            raise ValueError(f"steps and seconds must be >= 0. Received: steps={steps!r}, seconds={seconds!r}.")
        if steps == 0:
            return
        self._executions.append(_Execution(self.epoch, self.total_steps, int(steps), float(seconds)))
        self.total_steps += int(steps)

    def reconcile_epoch(self, epoch: int, steps: int) -> int:
        """Corrects an epoch's step count to the true one (e.g. from the optimizer).

        Hooks that see only nominal execution sizes over-count the last execution
        of an epoch when the data runs out inside it; the difference is taken off
        (or added to) that epoch's last execution.

        Args:
            epoch: the epoch.
            steps: its true number of steps.

        Returns:
            The correction applied (true - recorded), in steps.
        """
        indices = [i for i, e in enumerate(self._executions) if e.epoch == epoch]
        recorded = sum(self._executions[i].steps for i in indices)
        diff = int(steps) - recorded
        if diff and indices:
            last = self._executions[indices[-1]]
            fixed = last.steps + diff
            if fixed > 0:
                self._executions[indices[-1]] = dataclasses.replace(last, steps=fixed)
            else:
                del self._executions[indices[-1]]
            self.total_steps += diff
        return diff

    @property
    def measured_steps(self) -> int:
        """Steps recorded after the warm-up."""
        return sum(e.steps for e in self._measured())

    def _measured(self, epoch: Optional[int] = None) -> List[_Execution]:
        return [
            e for e in self._executions
            if e.first_step >= self.warmup_steps and (epoch is None or e.epoch == epoch)
        ]

    def stats(self, epoch: Optional[int] = None) -> Optional[ThroughputStats]:
        """Figures over every measured step (or those of one epoch).

        Args:
            epoch: only this epoch's steps; None uses all. Defaults to None.

        Returns:
            A `ThroughputStats`, or None when no step was measured (all warm-up).
        """
        return self._summarise(self._measured(epoch))

    def window_stats(self) -> Optional[ThroughputStats]:
        """Figures over the last `window` measured steps (whole executions)."""
        chosen, steps = [], 0
        for e in reversed(self._measured()):
            if steps >= self.window:
                break
            chosen.append(e)
            steps += e.steps
        return self._summarise(list(reversed(chosen)))

    def step_times(self, epoch: Optional[int] = None) -> List[float]:
        """Per-step times in seconds (each execution's time shared by its steps)."""
        out = []
        for e in self._measured(epoch):
            out += [e.seconds / e.steps] * e.steps
        return out

    def _summarise(self, executions: List[_Execution]) -> Optional[ThroughputStats]:
        if not executions:
            return None
        steps = sum(e.steps for e in executions)
        seconds = sum(e.seconds for e in executions)
        per_step = []
        for e in executions:
            per_step += [e.seconds / e.steps] * e.steps
        examples = None if self.batch_size is None else steps * self.batch_size
        return ThroughputStats(
            steps=steps,
            seconds=seconds,
            examples=examples,
            examples_per_sec=(examples / seconds if examples is not None and seconds > 0 else None),
            steps_per_sec=steps / seconds if seconds > 0 else float("inf"),
            step_time_median_s=percentile(per_step, 50),
            step_time_p90_s=percentile(per_step, 90),
        )


def time_batches(
    batches: Iterable,
    num_batches: int,
    warmup_batches: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> Optional[float]:
    """Seconds the input alone takes to deliver one batch, on average.

    Iterates `batches` (a `tf.data.Dataset`, a generator, any iterable), drops the
    first `warmup_batches` (iterator start-up, buffer fill), then times the next
    `num_batches`.

    Args:
        batches: the input, e.g. the training `tf.data.Dataset`.
        num_batches: batches to time, >= 1.
        warmup_batches: batches fetched before the clock starts. Defaults to 1.
        clock: a monotonic clock in seconds. Defaults to `time.perf_counter`.

    Returns:
        Mean seconds per batch, or None when the input ran out before one timed
        batch.

    Raises:
        ValueError: when `num_batches` < 1 or `warmup_batches` < 0.
    """
    if num_batches < 1 or warmup_batches < 0:
        raise ValueError(
            f"num_batches must be >= 1 and warmup_batches >= 0. "
            f"Received: num_batches={num_batches!r}, warmup_batches={warmup_batches!r}."
        )
    iterator = iter(batches)
    for _ in itertools.islice(iterator, warmup_batches):
        pass
    count = 0
    start = clock()
    for _ in itertools.islice(iterator, num_batches):
        count += 1
    elapsed = clock() - start
    return elapsed / count if count else None


@dataclasses.dataclass(frozen=True)
class InputCheck:
    """Result of the input-bound check.

    Attributes:
        input_time_per_step_s: seconds the input pipeline alone needs per batch.
        step_time_s: median training step time, in seconds.
        input_fraction: `input_time_per_step_s / step_time_s`, capped at 1: the
            share of each step the input needs. Without prefetching the step
            waits that long; with prefetching input overlaps compute, so this is
            an upper bound on the wait.
        input_bound: True when `input_fraction` >= the threshold.
        verdict: one plain-words line.
    """

    input_time_per_step_s: float
    step_time_s: float
    input_fraction: float
    input_bound: bool
    verdict: str

    def to_dict(self) -> dict:
        """The figures as a plain dict (JSON-ready)."""
        return dataclasses.asdict(self)


def input_bound_verdict(
    input_time_per_step_s: float,
    step_time_s: float,
    threshold: float = DEFAULT_INPUT_BOUND_THRESHOLD,
) -> InputCheck:
    """Compares input time with step time and words the verdict.

    The TensorFlow Profiler guide calls a step input-bound when a large share of it
    is spent waiting for data (https://www.tensorflow.org/guide/data_performance_analysis).
    Here that share is estimated from two measurements: the input pipeline alone
    delivering a batch, and a full training step.

    Args:
        input_time_per_step_s: seconds per batch for the input alone (see
            `time_batches`).
        step_time_s: training step time in seconds (e.g. the median).
        threshold: fraction from which the run counts as input-bound, in (0, 1].
            Defaults to 0.5.

    Returns:
        An `InputCheck`.

    Raises:
        ValueError: on a non-positive `step_time_s`, negative input time or a
            threshold outside (0, 1].

    Example:
        >>> check = input_bound_verdict(0.03, 0.04)
        >>> check.input_bound, check.verdict[:42]
        (True, 'input-bound: 75% of each step waits for da')
    """
    if step_time_s <= 0 or input_time_per_step_s < 0:
        raise ValueError(
            f"step_time_s must be > 0 and input_time_per_step_s >= 0. "
            f"Received: step_time_s={step_time_s!r}, input_time_per_step_s={input_time_per_step_s!r}."
        )
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1]. Received: threshold={threshold!r}.")
    fraction = min(1.0, input_time_per_step_s / step_time_s)
    bound = fraction >= threshold
    if bound:
        verdict = f"input-bound: {fraction:.0%} of each step waits for data; {INPUT_BOUND_ADVICE}"
    else:
        verdict = (
            f"not input-bound: the input pipeline needs {fraction:.0%} of each step's time "
            f"({input_time_per_step_s * 1e3:.2f} ms of {step_time_s * 1e3:.2f} ms); speed up the model step first"
        )
    return InputCheck(float(input_time_per_step_s), float(step_time_s), fraction, bound, verdict)
