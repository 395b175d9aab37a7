"""`choose_execution`: graph against XLA (and several steps per execution) timed on separate probe
steps of a model, its weights, optimizer and metric state restored after (`ModelState`), for scripts
and benchmarks; `time_training_steps` and `time_graph_step` time a compiled model's steps (the graph
function `time_graph_step` traced is handed to the run's trial: `traced_graph`). The
`Trainer` times its candidates on the run's own training steps instead
(`tftrain.runtime.execution_trial`).

Source: https://keras.io/api/models/model_training_apis/#compile-method and
https://www.tensorflow.org/xla
"""

from __future__ import annotations

import math
import statistics
import time
import weakref
from typing import Optional, Sequence

from tftrain.errors import check_int
from tftrain.runtime.execution import (AUTO_CANDIDATES, ExecutionChoice, StepTiming, _batch_size_of, best_label,
                                       choice_reason, failure_line, label_of)
from tftrain.runtime.input_release import released_off_thread

def time_training_steps(
    model,
    dataset,
    steps: int = 20,
    warmup_executions: int = 1,
    batch_size: Optional[int] = None,
    callbacks: Sequence = (),
    min_timed_executions: int = 3,
    give_up_above_s: Optional[float] = None,
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
        give_up_above_s: stop once two or more executions are timed and their
            median exceeds this many seconds per optimizer step (a candidate
            clearly slower than one already timed). Defaults to None (time all).

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

    for name, value in (("steps", steps), ("warmup_executions", warmup_executions),
                        ("min_timed_executions", min_timed_executions)):
        check_int(value, name)
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
            timed = [b - a for a, b in zip(stamps[warmup_executions:], stamps[warmup_executions + 1:])]
            if give_up_above_s is not None and len(timed) >= 2 and statistics.median(timed) / spe > give_up_above_s:
                self.model.stop_training = True

    with released_off_thread() as release:
        model.fit(dataset.repeat(), epochs=1, steps_per_epoch=total_steps, verbose=0, shuffle=False,
                  callbacks=[*callbacks, _Stamp(), release])
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


class _Trials:
    """Runs the candidates of `choose_execution` one at a time on one state snapshot.

    Each trial rebuilds the train function for a mode and a `steps_per_execution`,
    times it (`time_training_steps`, given up once clearly slower than the best so
    far), keeps the compiled function and restores the weights; an XLA trial that
    raises is skipped with XLA's reason (`xla_failure_reason`) and the state restored,
    while a graph trial's error is the model's own (plain Keras fails alike) and is raised.
    """

    GIVE_UP_RATIO = 1.3
    """A candidate whose median step time exceeds the best's by this factor stops being timed."""

    def __init__(self, model, dataset, base_spe: int, timing_args: dict):
        self.model, self.dataset, self.base_spe, self.timing_args = model, dataset, base_spe, timing_args
        self.snapshot: list = []
        self.timings: dict = {}
        self.functions: dict = {}
        self.settings: dict = {}
        self.skipped: list = []
        self.errors: list = []  # XLA failures, raised when no candidate ran

    def run(self, mode: str, spe: int) -> None:
        label = label_of(mode, spe, self.base_spe)
        model = self.model
        model.jit_compile = mode == "xla"
        if mode == "xla" and not model.jit_compile:  # Keras refused: a layer does not support XLA
            self.skipped.append("xla: the model does not support jit_compile")
            return
        model.steps_per_execution = spe
        best = self.best()
        give_up = self.timings[best].step_time_s * self.GIVE_UP_RATIO if best else None
        try:
            model.make_train_function(force=True)
            self.timings[label] = _timed_and_restored(model, self.dataset, self.snapshot, give_up_above_s=give_up,
                                                      **self.timing_args)
        except Exception as error:  # noqa: BLE001 (an XLA candidate that cannot compile or run is skipped)
            if mode == "graph":  # graph is what plain Keras runs: its failure is the model's own
                raise
            self.skipped.append(f"{label}: {failure_line(error)}")
            self.errors.append(error)
            return
        self.functions[label], self.settings[label] = model.train_function, (mode, spe)

    def best(self) -> Optional[str]:
        """The fastest candidate so far (`best_label`)."""
        return best_label(self.timings, {label: spe for label, (_, spe) in self.settings.items()})

    def restore(self) -> None:
        if self.snapshot:
            self.snapshot[0].restore()


def _search_steps_per_execution(trials: _Trials, mode: str, counts: Sequence[int]) -> None:
    """Times `mode` at the larger counts in `counts`, in order, while each beats the best so far (a
    larger count stops paying once Python's per-call cost is gone). Smaller counts are not timed:
    fewer steps per call only add that cost, so they serve where a larger count does not fit."""
    for spe in sorted(c for c in counts if c > trials.base_spe):
        before = trials.best()
        trials.run(mode, spe)
        if trials.best() == before:
            break


def choose_execution(
    model,
    dataset,
    candidates: Sequence[str] = AUTO_CANDIDATES,
    steps: int = 20,
    warmup_executions: int = 1,
    min_timed_executions: int = 3,
    steps_per_execution: Sequence[int] = (),
) -> ExecutionChoice:
    """Times graph and XLA (and, if asked, several `steps_per_execution`) training steps
    of `model` on `dataset`; keeps the fastest.

    Each candidate mode is timed at the model's own `steps_per_execution`: its train
    function is rebuilt in that mode, `warmup_executions` executions trace and compile
    it, then `steps` optimizer steps are timed (`time_training_steps`). With
    `steps_per_execution` counts, the faster mode is then timed at the larger counts
    while they keep winning. Another candidate replaces
    the first (the first mode at the model's own count) only when more than 5% faster:
    smaller differences are timing noise. A candidate more than
    1.3x slower than the best so far is given up after two timed executions. A
    candidate that fails to compile or run (an op XLA has no kernel for, a step XLA
    cannot compile) is skipped: `ExecutionChoice.skipped` names XLA's reason; an
    error in graph mode is the model's own and is raised, as plain Keras would. The
    weights, optimizer and metric state are restored to what they were before the
    first timed step, and the model is left set up for the fastest candidate with
    its already compiled train function, so the next `fit` starts at once.

    Args:
        model: a compiled Keras model (TensorFlow backend), not `run_eagerly`.
        dataset: a `tf.data.Dataset` of training batches: the batches the model
            will be trained on (batch size matters: the faster mode can change
            with it). A few dozen batches are enough; it is repeated as needed.
        candidates: modes to time, from `"graph"` and `"xla"`. Defaults to
            `("graph", "xla")`.
        steps: optimizer steps timed per candidate. Defaults to 20.
        warmup_executions: untimed executions per candidate (the first traces and
            compiles). Defaults to 1.
        min_timed_executions: executions timed per candidate at least (see
            `time_training_steps`). Defaults to 3.
        steps_per_execution: other optimizer-step counts per `tf.function` call
            to try for the faster mode, each >= 1; only those above the model's
            own are timed. Defaults to () (keep the model's own).

    Returns:
        An `ExecutionChoice`; `model.jit_compile` and `model.steps_per_execution`
        match it. With more than one replica (e.g. `MirroredStrategy` over 2
        devices) nothing is timed and the choice is graph: Keras 3 cannot compile
        a cross-replica step with XLA.

    Raises:
        ValueError: on an unknown or empty list of candidates, an eager model,
            or when no candidate could be timed because Keras refused XLA for
            the model and graph was not a candidate.
        Exception: what the model's step raised in graph mode (a bug in the
            model, not a mode XLA cannot compile), or in XLA mode when XLA was the
            only candidate.

    Example:
        >>> model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", steps_per_execution=8)
        >>> choice = choose_execution(model, train_ds.take(50), steps_per_execution=(1, 32, 64))
        >>> print(choice.describe())
        >>> model.fit(train_ds, epochs=10)  # runs in the chosen mode
    """
    candidates = _check_candidates(model, candidates, steps_per_execution)
    replicas = model.distribute_strategy.num_replicas_in_sync
    if replicas > 1:  # Keras 3 cannot compile a cross-replica step with XLA
        return ExecutionChoice("graph", {}, f"XLA does not run across {replicas} replicas; graph is the only mode")
    _build_optimizer(model)
    base_spe = int(getattr(model, "steps_per_execution", 1) or 1)
    trials = _Trials(model, dataset, base_spe, {"steps": steps, "warmup_executions": warmup_executions,
                                                "min_timed_executions": min_timed_executions})
    try:
        for mode in candidates:
            trials.run(mode, base_spe)
        if trials.timings and steps_per_execution:
            _search_steps_per_execution(trials, trials.settings[trials.best()][0], steps_per_execution)
    finally:
        trials.restore()
    return _settle(model, trials, base_spe)


def time_graph_step(model, dataset, steps: int = 16, batch_size: Optional[int] = None) -> float:
    """Median seconds per optimizer step of `model`'s training step in graph mode at its own
    `steps_per_execution`, its weights, optimizer and metric state restored afterwards; the model's
    `jit_compile` is left as it was (the graph train function is dropped when it was XLA).

    Args:
        model: a compiled Keras model (TensorFlow backend), not `run_eagerly`.
        dataset: training batches (repeated as needed).
        steps: optimizer steps timed. Defaults to 16.
        batch_size: examples per step; None reads it from the dataset's element spec,
            which needs a static batch dimension. Defaults to None.

    Returns:
        Seconds per optimizer step (float).

    Raises:
        Exception: what the model's graph step raised.
    """
    jit = model.jit_compile
    _build_optimizer(model)
    trials = _Trials(model, dataset, int(getattr(model, "steps_per_execution", 1) or 1),
                     {"steps": steps, "warmup_executions": 1, "min_timed_executions": 3, "batch_size": batch_size})
    try:
        trials.run("graph", trials.base_spe)
    finally:
        trials.restore()
        model.jit_compile = jit
        if jit:
            model.train_function = None  # rebuilt in XLA by the next fit
    if not jit:  # traced and compiled: an ExecutionTrial's graph candidate at this count runs it (`traced_graph`)
        _TRACED_GRAPH[model] = (model.train_function, trials.base_spe, trials.timings["graph"].warmup_s)
    return trials.timings["graph"].step_time_s


_TRACED_GRAPH: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
"""model -> (the graph train function `time_graph_step` left on it, its steps per execution, the seconds
of its first execution, which traced it)."""


def traced_graph(model, steps_per_execution: int) -> Optional[tuple]:
    """`(function, first_call_s)`: the graph train function `time_graph_step` traced for `model` at
    `steps_per_execution` and the seconds its first execution took (tracing included), while it is still
    the model's `train_function` (anything that changes the count or the mode drops that); else None."""
    function, count, first_call_s = _TRACED_GRAPH.get(model, (None, None, None))
    if function is None or function is not model.train_function or count != steps_per_execution:
        return None
    return function, first_call_s


def check_compiles(model, dataset, batch_size: Optional[int] = None) -> StepTiming:
    """Builds `model`'s train function in its current mode (`jit_compile`, `steps_per_execution`)
    and runs two executions on `dataset`, then restores the weights, optimizer and metric state.
    The compiled function stays on the model, so the next `fit` starts at once (measured: its first
    execution of a Transformer under XLA took 0.7 s against a median of 0.6 s after such a check).

    Args:
        model: a compiled Keras model (TensorFlow backend).
        dataset: a `tf.data.Dataset` of training batches (repeated as needed).
        batch_size: examples per step; None reads it from the dataset's element spec,
            which needs a static batch dimension. Defaults to None.

    Returns:
        The `StepTiming` of the two executions: `warmup_s` is the first, which compiled.

    Raises:
        Exception: what compiling or running the step raised (see `xla_failure_reason`).
    """
    _build_optimizer(model)
    model.make_train_function(force=True)
    return _timed_and_restored(model, dataset, [], steps=1, warmup_executions=1, min_timed_executions=1,
                               batch_size=batch_size)


def _check_candidates(model, candidates, steps_per_execution) -> tuple:
    candidates = tuple(dict.fromkeys(candidates))
    if not candidates or any(c not in AUTO_CANDIDATES for c in candidates):
        raise ValueError(
            f"Invalid candidates {candidates!r}. Expected a non-empty subset of: "
            f"{', '.join(AUTO_CANDIDATES)}."
        )
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in steps_per_execution):
        raise ValueError(f"steps_per_execution counts must be integers >= 1. Received: {tuple(steps_per_execution)!r}.")
    if getattr(model, "run_eagerly", False):
        raise ValueError("choose_execution needs a model compiled with run_eagerly=False (graph mode).")
    return candidates


def _build_optimizer(model) -> None:
    """Outside a strategy scope Keras builds the optimizer only while tracing the first step,
    after the snapshot; build it now so its slots (Adam's moments) are restored too."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built and model.built:
        with model.distribute_strategy.scope():
            optimizer.build(model.trainable_variables)


def _settle(model, trials: _Trials, base_spe: int) -> ExecutionChoice:
    """Leaves `model` on the fastest candidate; the `ExecutionChoice` that says why."""
    best = trials.best()
    if best is None:
        model.jit_compile, model.steps_per_execution = False, base_spe
        if trials.errors:
            raise trials.errors[0]
        raise ValueError(f"No execution mode could be timed: skipped {', '.join(trials.skipped)}. "
                         "Add \"graph\" to the candidates.")
    mode, spe = trials.settings[best]
    model.jit_compile, model.steps_per_execution = mode == "xla", spe
    model.train_function = trials.functions[best]
    reason = choice_reason(trials.timings, best, trials.skipped)
    return ExecutionChoice(mode, dict(trials.timings), reason, steps_per_execution=spe,
                           skipped=tuple(trials.skipped))


def _timed_and_restored(model, dataset, snapshot, **timing_args) -> StepTiming:
    """Times one candidate; takes the state snapshot on the first call, restores it after."""
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
