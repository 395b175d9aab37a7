"""`choose_execution` for scripts: the Trainer's own `ExecutionTrial` (graph against XLA, then larger
steps per execution, then the other mode at the winner's count, in interleaved duels) run on separate probe steps of a model whose weights,
optimizer and metric state are restored after (`ModelState`). `time_training_steps`,
`time_graph_step` and `check_compiles` time a compiled model's steps.

Source: https://keras.io/api/models/model_training_apis/#compile-method and https://www.tensorflow.org/xla
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Optional, Sequence

from tftrain.errors import check_int
from tftrain.runtime.execution import AUTO_CANDIDATES, ExecutionChoice, StepTiming, _batch_size_of
from tftrain.runtime.execution_trial import ExecutionTrial, remember_traced_graph
from tftrain.runtime.input_release import released_off_thread
from tftrain.runtime.trial_rules import steps_to_time

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
    """Times `model.fit` steps on `dataset` after warm-up, without a progress bar; the model trains.

    One `fit` epoch on `dataset.repeat()` of `warmup_executions` untimed executions (tracing, compiling)
    then `ceil(steps / steps_per_execution)` timed ones (at least `min_timed_executions`), each stamped
    by a batch-end callback, which waits for the step's results.

    Args:
        model: a compiled Keras model (TensorFlow backend).
        dataset: a `tf.data.Dataset` of `(features, labels)` batches of one batch size.
        steps: optimizer steps to time, >= 1. Defaults to 20.
        warmup_executions: untimed executions first, >= 1. Defaults to 1.
        batch_size: examples per step; None reads the dataset's element spec. Defaults to None.
        callbacks: extra Keras callbacks. Defaults to ().
        min_timed_executions: executions timed at least, >= 1 (the figure is their median). Defaults to 3.
        give_up_above_s: stop once two or more timed executions have a median above this many seconds a
            step. Defaults to None.

    Returns:
        A `StepTiming`.

    Raises:
        ValueError: on a count < 1, or a batch size the dataset does not say.
        RuntimeError: when Keras ran no batch hooks.
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


def choose_execution(
    model,
    dataset,
    candidates: Sequence[str] = AUTO_CANDIDATES,
    steps_per_execution: Sequence[int] = (),
) -> ExecutionChoice:
    """Chooses graph or XLA (and, if asked, a larger `steps_per_execution`) for `model` by training it on
    `dataset` with the Trainer's `ExecutionTrial`, then restores its state; the model is left on the choice.

    The first candidate at the model's own `steps_per_execution` meets each other in a duel, their calls
    interleaved; the winner then meets its mode at each larger count while the larger count wins, and each
    other mode again at the winner's count (a mode that wins there grows its count in turn). A
    challenger wins only when more than 5% faster (timing noise), and a duel ends early once one side is
    1.3x slower (`tftrain.runtime.trial_rules`). An XLA candidate that fails to compile or run is skipped
    with XLA's reason; a graph error is the model's own and is raised, as plain Keras would. The
    weights, optimizer and metric state are restored to what they were before the first step, and the
    winner's train function stays on the model, so the next `fit` starts at once.

    Args:
        model: a compiled Keras model (TensorFlow backend), not `run_eagerly`.
        dataset: a `tf.data.Dataset` of training batches of a fixed batch size, those the model will train
            on (the faster mode can change with the batch); repeated as needed.
        candidates: modes to time, from `"graph"` and `"xla"`, the first being the first incumbent.
            Defaults to `("graph", "xla")`.
        steps_per_execution: other counts of steps per call to try for the faster mode, each >= 1; only
            those above the model's own are timed, and each must divide the largest. Defaults to ().

    Returns:
        An `ExecutionChoice`; `model.jit_compile` and `model.steps_per_execution` match it. With more than
        one replica nothing is timed and the choice is graph (Keras 3 cannot compile a cross-replica step
        with XLA).

    Raises:
        ValueError: on an unknown or empty list of candidates, bad counts, or an eager model.
        Exception: what the model's step raised in graph mode, or in XLA mode when XLA was the first
            candidate.

    Example:
        >>> model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", steps_per_execution=8)
        >>> choice = choose_execution(model, train_ds.take(50), steps_per_execution=(32, 64))
        >>> print(choice.describe())
        >>> model.fit(train_ds, epochs=10)  # runs in the chosen mode
    """
    import keras

    candidates = _check_candidates(model, candidates, steps_per_execution)
    replicas = model.distribute_strategy.num_replicas_in_sync
    if replicas > 1:  # Keras 3 cannot compile a cross-replica step with XLA
        return ExecutionChoice("graph", {}, f"XLA does not run across {replicas} replicas; graph is the only mode")
    _build_optimizer(model)
    base, jit = int(getattr(model, "steps_per_execution", 1) or 1), model.jit_compile
    counts = tuple(sorted({c for c in steps_per_execution if c > base}))
    trial = ExecutionTrial(model, candidates, counts, examples_per_step=_batch_size_of(dataset))
    state = []  # taken when fit begins: its metrics are built by then, and no step has run
    hooks = keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: state.append(ModelState(model)),
        on_train_batch_end=lambda batch, logs: setattr(model, "stop_training", trial.choice is not None))
    trial.install()
    try:
        with released_off_thread() as release:  # twice the steps the duels take: it stops once they end
            model.fit(dataset.repeat(), epochs=1, verbose=0, shuffle=False, callbacks=[hooks, release],
                      steps_per_epoch=2 * (steps_to_time(len(candidates), base, counts) + max((base, *counts))))
        choice = trial.finish()
    except BaseException:
        model.jit_compile, model.steps_per_execution, model.train_function = jit, base, None
        raise
    finally:
        if state:
            state[0].restore()
    model.jit_compile, model.steps_per_execution = choice.execution == "xla", choice.steps_per_execution
    model.train_function = trial.chosen.function
    return choice


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
    jit, spe = model.jit_compile, int(getattr(model, "steps_per_execution", 1) or 1)
    _build_optimizer(model)
    model.jit_compile = False
    try:
        model.make_train_function(force=True)
        timing = _timed_and_restored(model, dataset, [], steps=steps, warmup_executions=1, min_timed_executions=3,
                                     batch_size=batch_size)
    finally:
        model.jit_compile = jit
        if jit:
            model.train_function = None  # rebuilt in XLA by the next fit
    if not jit:  # traced and compiled: an ExecutionTrial's graph candidate at this count runs it
        remember_traced_graph(model, model.train_function, spe, timing.warmup_s)
    return timing.step_time_s


def check_compiles(model, dataset, batch_size: Optional[int] = None) -> StepTiming:
    """Builds `model`'s train function in its current mode and runs two executions on `dataset`, then
    restores the model's state; the compiled function stays on the model for the next `fit`.

    Returns:
        The `StepTiming` of the two executions (`warmup_s`: the first, which compiled).

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
    after the snapshot; build it now so its slots (Adam's moments) are restored too. A model marked built
    without its weights (a subclassed model's `build(shape)`) is left to `fit`'s own build."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built and model.built and model.trainable_variables:
        with model.distribute_strategy.scope():
            optimizer.build(model.trainable_variables)


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


def held_optimizers(model) -> dict:
    """`{name: optimizer}` a model holds besides `model.optimizer`, directly or in a list, tuple or dict
    attribute (named `attr`, `attr[0]`, `attr['key']`): those its own `train_step` applies (a GAN's two).
    Keras builds each on its first step (`ModelState` then replaces it), and loads one's state from a
    weights file only into a built one."""
    held = {}
    for name, _, _, optimizer in _held(model):
        if all(optimizer is not other for other in held.values()):  # one held under two names: the first
            held[name] = optimizer
    return held


def _held(model):
    """(name, attribute, key or None, optimizer) for every place a held optimizer is kept (one may be in two)."""
    import keras

    compiled = getattr(model, "optimizer", None)
    for attribute, value in list(vars(model).items()):
        if attribute.startswith("_self_"):  # TensorFlow's tracking of the same attributes
            continue
        items = (value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple))
                 else [(None, value)])
        for key, item in items:
            if isinstance(item, keras.optimizers.Optimizer) and item is not compiled:
                yield (attribute if key is None else f"{attribute}[{key!r}]"), attribute, key, item


class ModelState:
    """Saved values of a model's weights, optimizer state and metric state.

    Covers `model.variables` (trainable and non-trainable weights, random-seed
    state such as dropout's), `model.optimizer.variables` (slots, `iterations`,
    loss scale), those of the built `held_optimizers` and `model.metrics_variables`,
    each variable once. The one snapshot behind `choose_execution` and
    `tftrain.tuning.find_batch_size`.

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
                  *(o.variables for o in held_optimizers(model).values()), getattr(model, "metrics_variables", ()))
        seen, self.variables = set(), []
        for group in groups:
            for v in group:
                if id(v) not in seen:
                    seen.add(id(v))
                    self.variables.append(v)
        self.values = [np.array(keras.ops.convert_to_numpy(v), copy=True) for v in self.variables]
        self.model = model
        self.unbuilt = [(attribute, key, o, o.get_config()) for _, attribute, key, o in _held(model) if not o.built]

    def restore(self) -> None:
        """Assigns the saved values back; a held optimizer built since (on its first step: its slots cannot be
        put back) is replaced by a new one of its class and config, and the train function made again."""
        for v, value in zip(self.variables, self.values):
            v.assign(value)
        fresh_of = {}  # one new optimizer for each built since, put in every place it is kept
        for attribute, key, optimizer, config in self.unbuilt:
            if optimizer.built:
                fresh = fresh_of.setdefault(id(optimizer), type(optimizer).from_config(config))
                value = getattr(self.model, attribute)
                if key is None:
                    setattr(self.model, attribute, fresh)
                elif isinstance(value, tuple):
                    setattr(self.model, attribute, (*value[:key], fresh, *value[key + 1:]))
                else:
                    value[key] = fresh
                self.model.train_function = None
