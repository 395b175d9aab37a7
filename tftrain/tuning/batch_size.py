"""find_batch_size: the largest global batch that fits, and the fastest one.

Each trial trains the real model a few steps; the model's state is restored in
`finally:`. "Fits" means no out-of-memory error on accelerators; on the CPU,
where running out of memory kills the process, peak memory under a budget.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from typing import Callable, Optional, Union

import keras
import tensorflow as tf

from tftrain.callbacks._steps import steps_per_execution
from tftrain.callbacks.throughput import ThroughputMonitor
from tftrain.data.pipeline import lists_as_tuples, num_examples_of
from tftrain.errors import ConfigError, one_line
from tftrain.runtime.execution_probe import ModelState
from tftrain.tuning.search import (
    NO_DATA,
    OK,
    OOM,
    OVER_BUDGET,
    TIMEOUT,
    SearchResult,
    Trial,
    propose_accumulation,
    search_batch_size,
    validate_search_args,
)
from tftrain.tuning.trial_memory import PeakMemory, memory_budget_bytes


@dataclasses.dataclass(frozen=True)
class BatchSizeResult(SearchResult):
    """Outcome of `find_batch_size`: a `SearchResult` plus the run's context.

    `memory_budget_bytes` None means OOM errors only; `micro_batch_size` is None and
    `gradient_accumulation_steps` 1 unless `target_batch_size` did not fit.
    """

    device_kind: str = "cpu"
    memory_budget_bytes: Optional[int] = None
    seconds: float = 0.0
    learning_rate: Optional[float] = None
    base_learning_rate: Optional[float] = None
    target_batch_size: Optional[int] = None
    micro_batch_size: Optional[int] = None
    gradient_accumulation_steps: int = 1

    def describe(self) -> str:
        best = (
            f"best examples/sec at {self.best_throughput} ({self.best_examples_per_sec:,.0f}/s)"
            if self.best_examples_per_sec else f"best at {self.best_throughput}"
        )
        rates = [t for t in self.trials if t.fits and t.examples_per_sec]
        top = max(rates, key=lambda t: t.examples_per_sec) if rates else None
        if top is not None and top.batch_size != self.best_throughput:
            best += (f", the smallest batch within the min_gain tolerance of the fastest trial "
                     f"({top.batch_size}: {top.examples_per_sec:,.0f}/s)")
        largest = (
            f"largest fitting {self.largest_fitting}" if self.largest_fitting is not None
            else f"largest fitting >= {self.largest_tried_ok} (stopped on a throughput plateau)"
        )
        lr = (
            f"; learning rate scaled {self.base_learning_rate:g} -> {self.learning_rate:g} (linear rule)"
            if self.learning_rate is not None else ""
        )
        return (
            f"batch size {self.batch_size} ({self.objective}, {self.mode}): {best}; {largest}; "
            f"{len(self.trials)} trials in {self.seconds:.1f} s, growth ended by {self.limit}{lr}{self._accumulation()}"
        )

    def _accumulation(self) -> str:
        if self.gradient_accumulation_steps == 1:
            return ""
        micro, steps = self.micro_batch_size, self.gradient_accumulation_steps
        why = "does not fit" if self.limit == "failure" else f"was not tried (the search ended by {self.limit})"
        return (f"; the batch of {self.target_batch_size} asked for {why}: accumulate {steps} micro-batches of "
                f"{micro} (effective {micro * steps}; batch_size={micro}, gradient_accumulation_steps={steps}, or "
                f"--batch-size {micro} --gradient-accumulation-steps {steps})")


def _constant_learning_rate(optimizer) -> Optional[float]:
    """The optimizer's constant learning rate (of the inner optimizer under loss scaling), or None under a schedule."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    value = optimizer.get_config().get("learning_rate")
    return float(value) if isinstance(value, (int, float)) else None


# -- trials ----------------------------------------------------------------------

class _TrialMonitor(ThroughputMonitor):
    """ThroughputMonitor that also stops a trial past its time limit."""

    def __init__(self, batch_size, warmup_steps, timeout_s):
        super().__init__(batch_size=batch_size, warmup_steps=warmup_steps)
        self.timeout_s = timeout_s
        self.timed_out = False
        self._started = None

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self._started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        if self.timeout_s is not None and time.perf_counter() - self._started > self.timeout_s:
            self.timed_out = True
            self.model.stop_training = True


def _is_oom(error: Exception) -> bool:
    if isinstance(error, tf.errors.ResourceExhaustedError):
        return True
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "OOM when allocating" in text


def _arrays_dataset_fn(x, y) -> Callable[[int], tf.data.Dataset]:
    # No .cache(): partly read cached datasets make tf.data warn once per trial.
    base = tf.data.Dataset.from_tensor_slices((lists_as_tuples(x), lists_as_tuples(y)))  # [x_a, x_b]: two inputs

    def make(batch_size: int) -> tf.data.Dataset:
        return base.repeat().batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    return make


def _dataset_source(data, multiple_of: int, max_val: Optional[int]) -> tuple:
    """`(make_dataset, max_val)`; arrays cap `max_val` at their length. Raises ConfigError on other data."""
    if isinstance(data, tuple) and len(data) == 2 and not callable(data[0]):
        x, y = data
        examples = max(multiple_of, (num_examples_of(x, y) // multiple_of) * multiple_of)  # x: maybe a dict
        max_val = examples if max_val is None else min(max_val, examples)
        return _arrays_dataset_fn(x, y), max_val
    if callable(data):
        return data, max_val
    raise ConfigError(
        "data must be (x, y) arrays or a function batch_size -> tf.data.Dataset. "
        f"Received: {type(data).__name__}."
    )


def _base_learning_rate(model, scale_learning_rate: bool, base_batch_size: Optional[int]) -> Optional[float]:
    """The constant learning rate; ConfigError if `scale_learning_rate` lacks a base batch or meets a schedule."""
    if scale_learning_rate and not base_batch_size:
        raise ConfigError(
            "scale_learning_rate needs base_batch_size: the batch size the current learning rate was tuned for."
        )
    base_lr = _constant_learning_rate(model.optimizer)
    if scale_learning_rate and base_lr is None:
        raise ConfigError(
            "scale_learning_rate works with a constant learning rate; this optimizer uses a schedule. "
            "Scale the schedule yourself or pass scale_learning_rate=False."
        )
    return base_lr


class _TrialRunner:
    """One trial; one predicted (linearly from the last fitting one) to exceed the budget is not run."""

    def __init__(self, model, make_dataset, warmup: int, total_steps: int, budget: Optional[int],
                 timeout_s: Optional[float], memory: PeakMemory, verbose: int):
        self.model, self.make_dataset = model, make_dataset
        self.warmup, self.total_steps = warmup, total_steps
        self.budget, self.timeout_s, self.memory, self.verbose = budget, timeout_s, memory, verbose
        self.last_ok: list = []

    def __call__(self, batch_size: int) -> Trial:
        t0 = time.perf_counter()
        if self.budget is not None and self.last_ok and self.last_ok[-1].peak_memory_bytes:
            prev = self.last_ok[-1]
            predicted = prev.peak_memory_bytes * batch_size / prev.batch_size
            if predicted > self.budget:
                return _report(Trial(batch_size, OVER_BUDGET, note=(
                    f"predicted {predicted / 2**20:,.0f} MiB from batch {prev.batch_size} > budget "
                    f"{self.budget / 2**20:,.0f} MiB; not run")), self.verbose)
        dataset = self.make_dataset(batch_size)
        if isinstance(dataset, tf.data.Dataset):
            if int(dataset.cardinality()) == 0:
                return _report(Trial(batch_size, NO_DATA, note="the dataset yields no batch of this size"), self.verbose)
            dataset = dataset.repeat()
        monitor = _TrialMonitor(batch_size, self.warmup, self.timeout_s)
        status, note = OK, ""
        try:
            with self.memory:
                self.model.fit(dataset, epochs=1, steps_per_epoch=self.total_steps, verbose=0, callbacks=[monitor],
                          shuffle=False)
        except Exception as e:  # noqa: BLE001 - OOM arrives as several error types
            if not _is_oom(e):
                raise
            status, note = OOM, str(e).strip().splitlines()[0][:200]
        finally:
            self.model.stop_training = False
            gc.collect()
        stats = monitor.meter.stats()
        used = self.memory.used if status == OK else None
        if status == OK:
            if monitor.timed_out:
                status, note = TIMEOUT, f"still running after {self.timeout_s:g} s"
            elif monitor.meter.total_steps == 0:
                status, note = NO_DATA, "the dataset yielded no batch"
            elif self.budget is not None and used is not None and used > self.budget:
                status, note = OVER_BUDGET, f"used {used / 2**20:,.0f} MiB > budget {self.budget / 2**20:,.0f} MiB"
        trial = Trial(
            batch_size,
            status,
            examples_per_sec=stats.examples_per_sec if stats else None,
            step_time_s=stats.step_time_median_s if stats else None,
            peak_memory_bytes=used,
            seconds=time.perf_counter() - t0,
            note=note,
        )
        if trial.fits:
            self.last_ok.append(trial)
        return _report(trial, self.verbose)


def find_batch_size(
    model: keras.Model,
    data: Union[tuple, Callable[[int], "tf.data.Dataset"]],
    *,
    mode: str = "power",
    objective: str = "throughput",
    init_val: int = 32,
    max_val: Optional[int] = None,
    steps_per_trial: int = 5,
    warmup_steps: Optional[int] = None,
    max_trials: int = 20,
    margin: float = 0.05,
    min_gain: float = 0.05,
    patience: int = 2,
    memory_budget: Union[int, str, None] = "auto",
    trial_timeout_s: Optional[float] = 60.0,
    multiple_of: Optional[int] = None,
    scale_learning_rate: bool = False,
    base_batch_size: Optional[int] = None,
    verbose: int = 1,
    target_batch_size: Optional[int] = None,
) -> BatchSizeResult:
    """Finds the global batch size that fits and the one with the best examples/sec.

    Trains `model` for `warmup_steps + steps_per_trial` steps per batch size tried
    (order: `search_batch_size`), then restores its weights, optimizer and metric state.

    Args:
        model: a compiled, built Keras model; trials run under its strategy.
        data: `(x, y)` arrays, or a function `batch_size -> tf.data.Dataset` yielding
            batches of exactly `batch_size` global examples.
        mode: `"power"` or `"binsearch"`. Defaults to "power".
        objective: `"throughput"` or `"largest"`: which becomes `batch_size`. Defaults to "throughput".
        init_val: first batch size. Defaults to 32.
        max_val: Defaults to None (the example count for arrays, else no cap).
        steps_per_trial: timed steps per trial. Defaults to 5.
        warmup_steps: untimed steps first. Defaults to None (one execution).
        max_trials: Defaults to 20.
        margin: fraction taken off the largest fitting size in binsearch mode, when a failure bounded it. Defaults
            to 0.05.
        min_gain: relative examples/sec gain below which a trial is no improvement. Defaults to 0.05.
        patience: trials without improvement that end a throughput search. Defaults to 2.
        memory_budget: bytes a trial may use above the start's; `"auto"`: half the
            available memory on the CPU, none on GPUs. Defaults to "auto".
        trial_timeout_s: seconds after which a trial counts as too slow. Defaults to 60.0.
        multiple_of: Defaults to None (the replica count).
        scale_learning_rate: afterwards scale the learning rate by `batch_size /
            base_batch_size` (Goyal et al. 2017, https://arxiv.org/abs/1706.02677). Defaults to False.
        base_batch_size: required with `scale_learning_rate`. Defaults to None.
        verbose: 1 prints each trial and the result. Defaults to 1.
        target_batch_size: the global batch wanted per optimizer step (objective
            `"largest"`); when it does not fit, the result proposes a micro-batch
            and accumulation steps. Defaults to None.

    Raises:
        ConfigError: when the model is not compiled or does not build, or on an invalid argument.
        BatchSizeSearchError: when no batch size fits.

    Example:
        >>> result = find_batch_size(model, (x_train, y_train), objective="largest", mode="binsearch")
        >>> model.fit(x_train, y_train, batch_size=result.batch_size)
    """
    started = time.perf_counter()
    _check_model(model)
    strategy = model.distribute_strategy
    multiple_of = strategy.num_replicas_in_sync if multiple_of is None else multiple_of
    make_dataset, max_val = _dataset_source(data, multiple_of, max_val)
    init_val, max_val = _bounds(init_val, max_val, multiple_of, target_batch_size, objective)
    validate_search_args(mode, objective, init_val, max_val, max_trials, margin, min_gain, multiple_of)
    if steps_per_trial < 1:
        raise ConfigError(f"steps_per_trial must be >= 1. Received: steps_per_trial={steps_per_trial!r}.")
    _build(model, make_dataset, init_val)
    base_lr = _base_learning_rate(model, scale_learning_rate, base_batch_size)
    device_kind = "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
    budget = memory_budget_bytes(memory_budget, device_kind)
    warmup = steps_per_execution(model) if warmup_steps is None else int(warmup_steps)
    run_trial = _TrialRunner(model, make_dataset, warmup, warmup + steps_per_trial, budget, trial_timeout_s,
                             PeakMemory(device_kind), verbose)
    with _restored(model):
        search = search_batch_size(run_trial, mode=mode, objective=objective, init_val=init_val, max_val=max_val,
                                   max_trials=max_trials, margin=margin, min_gain=min_gain, multiple_of=multiple_of,
                                   patience=patience)

    learning_rate = None
    if scale_learning_rate:
        learning_rate = base_lr * search.batch_size / base_batch_size
        model.optimizer.learning_rate = learning_rate
    result = BatchSizeResult(
        **{f.name: getattr(search, f.name) for f in dataclasses.fields(SearchResult)},
        device_kind=device_kind, memory_budget_bytes=budget, seconds=time.perf_counter() - started,
        learning_rate=learning_rate, base_learning_rate=base_lr if scale_learning_rate else None,
        **_accumulation_fields(target_batch_size, search.largest_fitting, multiple_of),
    )
    if verbose:
        print(f"batch size search: {result.describe()}")
    return result


@contextlib.contextmanager
def _restored(model):
    """Saves the model's state (the optimizer built first, so its slots are saved) and restores it on exit."""
    if not model.optimizer.built:
        with model.distribute_strategy.scope():
            model.optimizer.build(model.trainable_variables)
    state, stop_training = ModelState(model), model.stop_training
    try:
        yield
    finally:
        state.restore()
        model.stop_training = stop_training


def _check_model(model) -> None:
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", True):
        raise ConfigError("find_batch_size needs a compiled model. Call model.compile(optimizer=..., loss=...) first.")


def _build(model, make_dataset, batch_size: int) -> None:
    """Builds an unbuilt model (a subclassed one) by calling it on one batch's features, as `fit`'s first
    step would: its weights must exist to be restored after the search.

    Raises:
        ConfigError: the model does not build on the features (its own `train_step` takes other inputs).
    """
    if model.built:
        return
    batch = next(iter(make_dataset(batch_size)))
    features = batch[0] if isinstance(batch, (tuple, list)) else batch
    try:
        with model.distribute_strategy.scope():
            model(features, training=False)
    except Exception as error:  # noqa: BLE001 (the model's own error, in one line)
        raise ConfigError(f"find_batch_size builds the model on a batch's features, which failed ({one_line(error)}). "
                          "Build it first: model.build(input_shape), or call it once on the inputs it takes.") from None


def _bounds(init_val: int, max_val: Optional[int], multiple_of: int, target: Optional[int],
            objective: str) -> tuple:
    """`(init_val, max_val)` rounded to `multiple_of`, capped at `target`, with init_val <= max_val."""
    if init_val % multiple_of:
        init_val = max(multiple_of, (init_val // multiple_of) * multiple_of)
    if target is not None:
        _check_target(target, objective, multiple_of)
        max_val = target if max_val is None else min(max_val, target)
    if max_val is not None and max_val < init_val:
        init_val = max(multiple_of, (max_val // multiple_of) * multiple_of)
    return init_val, max_val


def _check_target(target, objective: str, multiple_of: int) -> None:
    if objective != "largest":
        raise ConfigError(f"target_batch_size needs objective='largest'. Received: objective={objective!r}.")
    if isinstance(target, bool) or not isinstance(target, int) or target < 1 or target % multiple_of:
        raise ConfigError(f"target_batch_size must be a positive multiple of {multiple_of} (the replica count). "
                          f"Received: target_batch_size={target!r}.")


def _accumulation_fields(target: Optional[int], largest: Optional[int], multiple_of: int) -> dict:
    if target is None or largest is None or largest >= target:
        return {"target_batch_size": target}
    micro, steps = propose_accumulation(target, largest, multiple_of)
    return {"target_batch_size": target, "micro_batch_size": micro, "gradient_accumulation_steps": steps}


def _report(trial: Trial, verbose: int) -> Trial:
    if verbose:
        rate = f", {trial.examples_per_sec:,.0f} examples/sec" if trial.examples_per_sec else ""
        step = f", step {trial.step_time_s * 1e3:.2f} ms" if trial.step_time_s else ""
        mem = f", +{trial.peak_memory_bytes / 2**20:,.0f} MiB" if trial.peak_memory_bytes is not None else ""
        note = f" ({trial.note})" if trial.note else ""
        print(f"  batch {trial.batch_size:>7}: {trial.status}{rate}{step}{mem}{note}")
    return trial

