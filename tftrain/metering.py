"""Throughput and step-time math, free of TensorFlow so it is tested alone (`tftrain.callbacks` feeds it).

`StepMeter` turns timed executions (N steps in S seconds, shared evenly: `steps_per_execution`) into global
examples/sec and median and p90 step times per window, epoch and run, leaving out warm-up steps.
`time_batches` and `input_bound_verdict` time the input pipeline alone against the step time.
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
PYTHON_INPUT_ADVICE = (
    "a Python generator or PyDataset runs in one thread: give a PyDataset workers=N (use_multiprocessing=True for "
    "CPU-heavy batches), vectorise (batch) its preprocessing, or move it into a tf.data pipeline"
)
"""The advice for input that is not a `tf.data.Dataset` (`INPUT_BOUND_ADVICE` is tf.data's)."""


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0..100) of `values`, interpolated linearly (NumPy's default).

    Raises:
        ValueError: when `values` is empty or `q` is outside [0, 100].
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
    """Throughput and step time over a set of measured steps (times in seconds).

    Attributes:
        examples: global examples (steps x global batch size); None when the batch size is unknown.
        examples_per_sec: global examples per second, or None.
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
        batch_size: global batch size; None (default) reports steps/sec and step times only.
        warmup_steps: executions starting within this many steps are left out (they trace). Defaults to 3.
        window: the most recent measured steps `window_stats` uses. Defaults to 100.

    Raises:
        ValueError: a non-positive `batch_size` or `window`, or a negative `warmup_steps`.
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
        """Records one execution of `steps` steps (0: ignored) taking `seconds`; ValueError if either is negative."""
        if steps < 0 or seconds < 0:
            raise ValueError(f"steps and seconds must be >= 0. Received: steps={steps!r}, seconds={seconds!r}.")
        if steps == 0:
            return
        self._executions.append(_Execution(self.epoch, self.total_steps, int(steps), float(seconds)))
        self.total_steps += int(steps)

    def reconcile_epoch(self, epoch: int, steps: int) -> int:
        """Sets `epoch`'s recorded steps to the true `steps` (on its last execution); returns true - recorded.
        Hooks see nominal execution sizes, so they over-count an epoch whose data ends mid-execution."""
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
        """Figures over every measured step, or `epoch`'s; None when none was measured (all warm-up)."""
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
    """Mean seconds per batch of the input alone (`batches`, e.g. a `tf.data.Dataset`), or None if it ran out.

    Skips `warmup_batches` (default 1), then times `num_batches` with `clock` (default `time.perf_counter`).

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
    """Result of the input-bound check (times in seconds per step).

    Attributes:
        input_fraction: input time / step time, capped at 1 (an upper bound: prefetching overlaps them).
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
    advice: str = INPUT_BOUND_ADVICE,
) -> InputCheck:
    """Words whether much of a step waits for data (https://www.tensorflow.org/guide/data_performance_analysis).

    Args:
        input_time_per_step_s: seconds per batch for the input alone (`time_batches`).
        threshold: the fraction from which the run is input-bound, in (0, 1]. Defaults to 0.5.
        advice: what to try when input-bound. Defaults to `INPUT_BOUND_ADVICE` (tf.data's).

    Raises:
        ValueError: `step_time_s` <= 0, a negative input time, or `threshold` outside (0, 1].
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
        verdict = f"input-bound: {fraction:.0%} of each step waits for data; {advice}"
    else:
        verdict = (
            f"not input-bound: the input pipeline needs {fraction:.0%} of each step's time "
            f"({input_time_per_step_s * 1e3:.2f} ms of {step_time_s * 1e3:.2f} ms); speed up the model step first"
        )
    return InputCheck(float(input_time_per_step_s), float(step_time_s), fraction, bound, verdict)
