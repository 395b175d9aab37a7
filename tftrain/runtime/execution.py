"""Execution modes: eager, graph (`tf.function`), XLA (`jit_compile`), and `auto`.

`compile_options` turns a mode name into `Model.compile` arguments.
`time_training_steps` measures a compiled model's optimizer-step time on real
batches, and `choose_execution` uses it to pick graph or XLA for one model and one
batch size by timing both (the `auto` mode): which is faster depends on the model
and the machine (on a 2-core CPU, XLA speeds an MLP up and slows a small CNN down
several times), so it is measured instead of guessed.

Source: https://keras.io/api/models/model_training_apis/#compile-method and
https://www.tensorflow.org/xla
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Mapping, Optional, Sequence

EXECUTIONS = ("eager", "graph", "xla")
"""Execution modes `compile_options` accepts."""

AUTO_CANDIDATES = ("graph", "xla")
"""Modes `choose_execution` times by default."""


def compile_options(execution: str = "graph", steps_per_execution: int = 1) -> dict:
    """Keyword arguments for `keras.Model.compile` that select an execution mode.

    Args:
        execution: `"eager"` (`run_eagerly=True`: Python runs every step, easiest
            to debug, slowest), `"graph"` (each step traced into a `tf.function`)
            or `"xla"` (the `tf.function` compiled by XLA, `jit_compile=True`).
            `"auto"` is resolved by `choose_execution` after compiling, so it is
            not accepted here. Defaults to `"graph"`.
        steps_per_execution: optimizer steps per `tf.function` call, >= 1; larger
            values amortise Python overhead for small models. Keras batch hooks
            then fire once per execution. Defaults to 1.

    Returns:
        `{"run_eagerly": bool, "jit_compile": bool, "steps_per_execution": int}`.

    Raises:
        ValueError: on an unknown mode or `steps_per_execution` < 1.

    Example:
        >>> model.compile(optimizer="adam", loss="mse", **compile_options("xla", 8))
    """
    if execution not in EXECUTIONS:
        raise ValueError(
            f"Invalid execution {execution!r}. Expected one of: {', '.join(EXECUTIONS)}. "
            f"Received: execution={execution!r}."
        )
    if isinstance(steps_per_execution, bool) or not isinstance(steps_per_execution, int) or steps_per_execution < 1:
        raise ValueError(
            f"steps_per_execution must be an integer >= 1. Received: steps_per_execution={steps_per_execution!r}."
        )
    return {
        "run_eagerly": execution == "eager",
        "jit_compile": execution == "xla",
        "steps_per_execution": steps_per_execution,
    }


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """Measured optimizer-step time of a compiled model.

    Attributes:
        step_time_s: median seconds per optimizer step over the timed executions
            (an execution runs `steps_per_execution` steps).
        examples_per_sec: `batch_size / step_time_s`.
        mean_step_time_s: total seconds of the timed executions / timed steps:
            unlike the median, it includes occasional stalls (e.g. an input
            pipeline refilling its shuffle buffer).
        batch_size: examples per optimizer step (the global batch).
        steps_per_execution: the model's `steps_per_execution`.
        timed_steps: optimizer steps timed (after warm-up).
        warmup_s: seconds of the warm-up executions, which include tracing and,
            for XLA, compiling.
        execution_times_s: seconds of each timed execution, in order.
    """

    step_time_s: float
    examples_per_sec: float
    mean_step_time_s: float
    batch_size: int
    steps_per_execution: int
    timed_steps: int
    warmup_s: float
    execution_times_s: tuple = ()

    def to_dict(self) -> dict:
        """Plain-data form (for JSON)."""
        return dataclasses.asdict(self)


def static_batch_size(data) -> Optional[int]:
    """The static batch dimension of a dataset's first component, or None.

    Args:
        data: a `tf.data.Dataset` (or anything with an `element_spec`).

    Returns:
        The leading dimension of the first component of `data.element_spec`
        (examples per batch), or None when it is unknown (e.g. batched without
        `drop_remainder=True`) or `data` has no element spec (NumPy arrays, a
        Python generator).
    """
    import tensorflow as tf

    spec = getattr(data, "element_spec", None)
    if spec is None:
        return None
    first = tf.nest.flatten(spec)[0]
    shape = getattr(first, "shape", None)
    if shape is None or shape.rank is None or shape.rank < 1 or shape[0] is None:
        return None
    return int(shape[0])


def _batch_size_of(dataset) -> int:
    """`static_batch_size`, or a ValueError that says how to make it known."""
    size = static_batch_size(dataset)
    if size is None:
        raise ValueError(
            "The dataset's batch dimension is unknown; batch it with drop_remainder=True "
            "(build_dataset(..., training=True) does), or pass batch_size=."
        )
    return size


def time_training_steps(
    model,
    dataset,
    steps: int = 20,
    warmup_executions: int = 1,
    batch_size: Optional[int] = None,
    callbacks: Sequence = (),
    min_timed_executions: int = 3,
) -> StepTiming:
    """Times `model.fit` steps on `dataset`, after warm-up, without a progress bar.

    Runs one `fit` epoch of `warmup_executions + ceil(steps / steps_per_execution)`
    executions (at least `min_timed_executions` timed) on `dataset.repeat()`, stamping the end of each
    execution from a batch-end callback (which makes Keras wait for the step's
    results, so the stamps are real). The warm-up executions, which trace and
    compile the train function, are excluded. The model's weights and optimizer
    state change: see `choose_execution` for a version that restores them.

    Args:
        model: a compiled Keras model (TensorFlow backend).
        dataset: a `tf.data.Dataset` of `(features, labels)` training batches of a
            fixed batch size; it is repeated as needed.
        steps: optimizer steps to time, >= 1 (rounded up to whole executions).
            Defaults to 20.
        warmup_executions: executions run before timing, >= 1. Defaults to 1.
        batch_size: examples per step; None reads it from the dataset's element
            spec. Defaults to None.
        callbacks: extra Keras callbacks for the `fit` call. Defaults to ().
        min_timed_executions: executions timed at least, >= 1 (the figure is
            their median). Defaults to 3.

    Returns:
        A `StepTiming`.

    Raises:
        ValueError: when `steps`, `warmup_executions` or `min_timed_executions`
            < 1, or the batch size cannot be read from the dataset.
        RuntimeError: when Keras ran no batch hooks, so nothing could be timed.

    Example:
        >>> timing = time_training_steps(model, train_ds, steps=50)
        >>> print(f"{timing.examples_per_sec:,.0f} examples/sec")
    """
    import keras

    for name, value, minimum in (("steps", steps, 1), ("warmup_executions", warmup_executions, 1),
                                 ("min_timed_executions", min_timed_executions, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}. Received: {name}={value!r}.")
    batch = batch_size if batch_size is not None else _batch_size_of(dataset)
    spe = int(getattr(model, "steps_per_execution", 1) or 1)
    timed_executions = max(min_timed_executions, math.ceil(steps / spe))
    total_steps = (warmup_executions + timed_executions) * spe

    stamps = []

    class _Stamp(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            stamps.append(time.perf_counter())

        def on_train_batch_end(self, batch, logs=None):
            stamps.append(time.perf_counter())

    model.fit(dataset.repeat(), epochs=1, steps_per_epoch=total_steps, verbose=0, shuffle=False,
              callbacks=[*callbacks, _Stamp()])
    if len(stamps) < warmup_executions + 2:  # pragma: no cover (Keras skipped batch hooks)
        raise RuntimeError(f"Timing recorded {len(stamps) - 1} executions; expected {total_steps // spe}.")
    per_execution = [b - a for a, b in zip(stamps[warmup_executions:], stamps[warmup_executions + 1:])]
    step_time = statistics.median(per_execution) / spe
    return StepTiming(
        step_time_s=step_time,
        examples_per_sec=batch / step_time if step_time > 0 else float("inf"),
        mean_step_time_s=sum(per_execution) / (len(per_execution) * spe),
        batch_size=batch,
        steps_per_execution=spe,
        timed_steps=len(per_execution) * spe,
        warmup_s=stamps[warmup_executions] - stamps[0],
        execution_times_s=tuple(per_execution),
    )


@dataclasses.dataclass(frozen=True)
class ExecutionChoice:
    """What `choose_execution` measured and chose.

    Attributes:
        execution: the chosen mode (`"graph"` or `"xla"`).
        timings: mode -> `StepTiming` for every mode timed.
        reason: one sentence on why (the speed-up, or why a mode was skipped).
        remembered: None when this run timed the modes; else when an earlier run
            timed them (ISO 8601 local time), the choice coming from
            `tftrain.runtime.execution_memory` with nothing timed in this run.
            Defaults to None.
    """

    execution: str
    timings: Mapping[str, StepTiming]
    reason: str
    remembered: Optional[str] = None

    def describe(self) -> str:
        """One line, e.g. `xla (graph 4.1 ms/step, 31,000 ex/s; xla 2.5 ms/step, ...)`."""
        figures = "; ".join(
            f"{mode} {t.step_time_s * 1e3:.2f} ms/step, {t.examples_per_sec:,.0f} examples/sec"
            for mode, t in self.timings.items()
        )
        line = f"{self.execution} ({figures}): {self.reason}" if figures else f"{self.execution}: {self.reason}"
        if self.remembered:
            line += f" [remembered: timed by a run at {self.remembered}; --no-remember-execution times it again]"
        return line

    def to_dict(self) -> dict:
        """Plain-data form (for metrics.json)."""
        return {
            "execution": self.execution,
            "reason": self.reason,
            "timings": {mode: t.to_dict() for mode, t in self.timings.items()},
            "remembered": self.remembered,
        }


def choose_execution(
    model,
    dataset,
    candidates: Sequence[str] = AUTO_CANDIDATES,
    steps: int = 20,
    warmup_executions: int = 1,
    min_timed_executions: int = 3,
) -> ExecutionChoice:
    """Times graph and XLA training steps of `model` on `dataset`; keeps the faster.

    For each candidate mode, rebuilds the model's train function in that mode,
    runs `warmup_executions` executions (tracing and compiling), then times
    `steps` optimizer steps (see `time_training_steps`). Afterwards the model's
    weights and optimizer state are restored to what they were before the first
    timed step, and the model is left set up for the faster mode, with that
    mode's already compiled train function, so the next `fit` starts at once.

    Args:
        model: a compiled Keras model (TensorFlow backend), not `run_eagerly`.
        dataset: a `tf.data.Dataset` of training batches: the batches the model
            will be trained on (batch size matters: the faster mode can change
            with it). A few dozen batches are enough; it is repeated as needed.
        candidates: modes to time, from `"graph"` and `"xla"`. Defaults to
            `("graph", "xla")`.
        steps: optimizer steps timed per mode. Defaults to 20.
        warmup_executions: untimed executions per mode (the first traces and
            compiles). Defaults to 1.
        min_timed_executions: executions timed per mode at least (see
            `time_training_steps`). Defaults to 3.

    Returns:
        An `ExecutionChoice`; `model.jit_compile` matches its `execution`. With
        more than one replica (e.g. `MirroredStrategy` over 2 devices) nothing is
        timed and the choice is graph: Keras 3 cannot compile a cross-replica
        step with XLA.

    Raises:
        ValueError: on an unknown or empty list of candidates, an eager model,
            or when no candidate could be timed (only `"xla"` on a model that
            does not support it).

    Example:
        >>> model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        >>> choice = choose_execution(model, train_ds.take(50))
        >>> print(choice.describe())
        >>> model.fit(train_ds, epochs=10)  # runs in the chosen mode
    """
    candidates = tuple(dict.fromkeys(candidates))
    if not candidates or any(c not in AUTO_CANDIDATES for c in candidates):
        raise ValueError(
            f"Invalid candidates {candidates!r}. Expected a non-empty subset of: "
            f"{', '.join(AUTO_CANDIDATES)}."
        )
    if getattr(model, "run_eagerly", False):
        raise ValueError("choose_execution needs a model compiled with run_eagerly=False (graph mode).")

    replicas = model.distribute_strategy.num_replicas_in_sync
    if replicas > 1:  # Keras 3 cannot compile a cross-replica step with XLA
        return ExecutionChoice("graph", {}, f"XLA does not run across {replicas} replicas; graph is the only mode")
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built and model.built:
        # Outside a strategy scope Keras builds the optimizer only while tracing the first
        # step, after the snapshot; build it now so its slots (Adam's moments) are restored too.
        with model.distribute_strategy.scope():
            optimizer.build(model.trainable_variables)
    snapshot = []
    timings = {}
    functions = {}
    skipped = []
    try:
        for mode in candidates:
            model.jit_compile = mode == "xla"
            if mode == "xla" and not model.jit_compile:  # Keras refused: a layer does not support XLA
                skipped.append("xla (the model does not support jit_compile)")
                continue
            model.make_train_function(force=True)
            timings[mode] = _timed_and_restored(
                model, dataset, snapshot, steps=steps, warmup_executions=warmup_executions,
                min_timed_executions=min_timed_executions,
            )
            functions[mode] = model.train_function
    except BaseException:
        if snapshot:
            snapshot[0].restore()
        raise

    if not timings:
        raise ValueError(f"No execution mode could be timed: skipped {', '.join(skipped)}. "
                         "Add \"graph\" to the candidates.")
    best = min(timings, key=lambda m: timings[m].step_time_s)
    model.jit_compile = best == "xla"
    model.train_function = functions[best]
    if len(timings) == 1:
        reason = f"only {best} was timed" + (f"; skipped {', '.join(skipped)}" if skipped else "")
    else:
        others = [m for m in timings if m != best]
        slowest = max(timings[m].step_time_s for m in others)
        reason = f"{slowest / timings[best].step_time_s:.2f}x faster than {' and '.join(others)}"
    return ExecutionChoice(best, dict(timings), reason)


def _timed_and_restored(model, dataset, snapshot, **timing_args) -> StepTiming:
    """Times one mode; takes the state snapshot on the first call, restores it after."""
    import keras

    class _Snapshot(keras.callbacks.Callback):
        # The model and its optimizer are built by now (choose_execution builds the
        # optimizer first), and no step has run yet.
        def on_train_begin(self, logs=None):
            if not snapshot:
                snapshot.append(ModelState(model))

    try:
        return time_training_steps(model, dataset, callbacks=[_Snapshot()], **timing_args)
    finally:
        if snapshot:
            snapshot[0].restore()


class ModelState:
    """Saved values of a model's weights, optimizer state and metric state.

    Covers `model.variables` (trainable and non-trainable weights, random-seed
    state such as dropout's), `model.optimizer.variables` (slots, `iterations`,
    loss scale) and `model.metrics_variables`, each variable once. The one
    snapshot behind `choose_execution` and `tftrain.tuning.find_batch_size`.

    Args:
        model: a built Keras model; its optimizer, when compiled, must be built.

    Example:
        >>> state = ModelState(model)
        >>> model.fit(...)       # changes weights and optimizer state
        >>> state.restore()      # back to where it was
    """

    def __init__(self, model):
        import keras
        import numpy as np

        optimizer = getattr(model, "optimizer", None)
        groups = (model.variables, optimizer.variables if optimizer is not None else (),
                  getattr(model, "metrics_variables", ()))
        seen, self.variables = set(), []
        for group in groups:
            for v in group:
                if id(v) not in seen:
                    seen.add(id(v))
                    self.variables.append(v)
        self.values = [np.array(keras.ops.convert_to_numpy(v), copy=True) for v in self.variables]

    def restore(self) -> None:
        """Assigns the saved values back."""
        for v, value in zip(self.variables, self.values):
            v.assign(value)
