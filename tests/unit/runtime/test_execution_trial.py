"""ExecutionTrial: candidates timed on the run's own training steps inside one `Model.fit`."""

import math

import numpy as np
import pytest

from tftrain.runtime.execution_trial import ExecutionTrial
from tftrain.runtime.trial_rules import steps_to_time


def _data(n=2048, batch=8):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 0.0], "float32"))[:, None]
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def _model(spe=8, layer=None):
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    hidden = layer(inputs) if layer is not None else inputs
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(8, activation="relu")(hidden)))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", steps_per_execution=spe)
    return model


@pytest.mark.slow
def test_the_trial_trains_every_step_once_in_order_as_plain_fit_does():
    plain, tried = _model(), _model()
    plain.fit(_data(n=4096), epochs=2, verbose=0, shuffle=False)
    choices = []
    trial = ExecutionTrial(tried, ("graph",), (32, 64), examples_per_step=8, on_settled=choices.append)
    trial.install()
    tried.fit(_data(n=4096), epochs=2, verbose=0, shuffle=False)
    assert int(tried.optimizer.iterations.numpy()) == int(plain.optimizer.iterations.numpy()) == 1024
    for a, b in zip(plain.get_weights(), tried.get_weights()):  # graph at any count runs the same steps
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    choice = trial.finish()
    assert choices == [choice] and choice.trial["complete"] and choice.trial["steps"] <= 1024
    assert set(choice.timings) >= {"graph", "graph, 32 steps/execution"}
    assert choice.steps_per_execution in (8, 32, 64) and tried.steps_per_execution == 64


def test_every_count_of_a_mode_runs_through_one_keras_train_function():
    # Keras's function bakes its count in when traced; a new one per count cost 0.4-1.2 s of tracing and
    # Grappler (and, under XLA, a compile). The trial's reads its count from a variable at run time.
    model = _model()
    made = []
    make = model._make_function
    model._make_function = lambda step: made.append(step) or make(step)
    trial = ExecutionTrial(model, ("graph",), (32, 64), examples_per_step=8)
    trial.install()
    model.fit(_data(n=4096), epochs=2, verbose=0, shuffle=False)
    choice = trial.finish()
    assert {"graph", "graph, 32 steps/execution"} <= set(choice.timings) and len(made) == 1
    for label, timing in choice.timings.items():  # each call ran its own count's steps
        assert timing.timed_steps % timing.steps_per_execution == 0, (label, timing)
        assert timing.timed_steps // timing.steps_per_execution == len(timing.execution_times_s), (label, timing)


def test_batch_callbacks_see_executions_of_the_largest_count():
    import keras

    ends = []
    model = _model()
    ExecutionTrial(model, ("graph",), (32,), examples_per_step=8).install()
    model.fit(_data(n=512), epochs=1, verbose=0, shuffle=False,
              callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: ends.append(batch))])
    assert ends == [31, 63]  # 64 batches in executions of 32 steps, whichever candidate ran them


@pytest.mark.slow
def test_an_xla_candidate_that_cannot_compile_is_skipped_and_training_goes_on():
    import keras
    import tensorflow as tf

    class RoundTrip(keras.layers.Layer):  # XLA has no kernel for tf.strings ops on a CPU
        def call(self, x):
            return tf.strings.to_number(tf.strings.as_string(x))

    model = _model(spe=1, layer=RoundTrip())
    trial = ExecutionTrial(model, ("graph", "xla"), examples_per_step=8)
    trial.install()
    history = model.fit(_data(n=1024), epochs=2, verbose=0, shuffle=False)
    choice = trial.finish()
    assert choice.execution == "graph" and "xla" not in choice.timings
    assert choice.skipped[0].startswith("xla: unsupported operations on XLA_CPU_JIT: AsString")
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"][-1])


def test_a_run_that_ends_before_the_duels_do_settles_on_the_incumbent():
    model = _model()
    trial = ExecutionTrial(model, ("graph", "xla"), (32, 64), examples_per_step=8)
    trial.install()
    model.fit(_data(n=512), epochs=1, verbose=0, shuffle=False)  # 64 steps: not enough for three duels
    choice = trial.finish()
    assert not choice.trial["complete"] and choice.execution in ("graph", "xla")
    assert int(model.optimizer.iterations.numpy()) == 64


def test_counts_must_divide_the_largest_and_modes_must_be_known():
    with pytest.raises(ValueError, match="divide the largest"):
        ExecutionTrial(_model(), ("graph",), (12,), examples_per_step=8)
    with pytest.raises(ValueError, match="modes must be"):
        ExecutionTrial(_model(), ("eager",), examples_per_step=8)


def test_steps_to_time_grows_with_every_duel():
    assert steps_to_time(1, 8) < steps_to_time(2, 8) < steps_to_time(2, 8, (32,)) < steps_to_time(2, 8, (32, 64))
    assert steps_to_time(2, 8, (32, 64)) % 64 == 0  # in whole executions of the largest count


def test_with_gradient_accumulation_the_trial_counts_batches_not_updates():
    import keras

    from tftrain.train.accumulation import GradientAccumulationOptimizer

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=GradientAccumulationOptimizer(keras.optimizers.SGD(0.01), 4), loss="mse",
                  steps_per_execution=8)
    trial = ExecutionTrial(model, ("graph",), (32,), examples_per_step=8)
    trial.install()
    model.fit(_data(n=2048), epochs=1, verbose=0, shuffle=False)  # 256 batches, 64 updates
    assert trial._step() == 256 and int(model.optimizer.iterations.numpy()) == 64
    timing = trial.finish().timings["graph"]
    assert timing.timed_steps == 8 * len(timing.execution_times_s)  # whole calls of 8 batches each


def test_a_run_that_ends_during_a_duel_of_counts_has_its_mode_decided():
    model = _model()
    trial = ExecutionTrial(model, ("graph",), (32, 64), examples_per_step=8)
    trial.install()
    model.fit(_data(n=512), epochs=1, verbose=0, shuffle=False)  # 64 steps: 8 against 32 is still running
    choice = trial.finish()
    assert not choice.trial["complete"] and choice.trial["modes_decided"]  # remembered by the Trainer
    assert "not decided: training ended first" in choice.reason


def test_a_run_too_short_to_repay_compiling_xla_does_not_time_it_and_says_from_which_length_it_would():
    # 64 steps of a ~1 ms step: even 2.5x faster XLA saves under 0.05 s, less than graph's first call took.
    model = _model()
    trial = ExecutionTrial(model, ("graph", "xla"), examples_per_step=8, planned_steps=64)
    trial.install()
    model.fit(_data(n=512), epochs=1, verbose=0, shuffle=False)
    choice = trial.finish()
    assert choice.execution == "graph" and "xla" not in choice.timings
    assert "xla not timed: even 2.5x faster it would save at most" in choice.reason
    # Remembered for runs as short; a run of at least time_again_from_steps times XLA.
    assert choice.trial["modes_decided"] and choice.time_again_from_steps > 64
    assert f"a run of {choice.time_again_from_steps} steps or more times it" in choice.reason


def _timing(step_ms, warmup_s, spe=8):
    from tftrain.runtime.execution import StepTiming

    return StepTiming(step_ms / 1e3, 8e3 / step_ms, step_ms / 1e3, 8, spe, 64, warmup_s)


def test_a_remembered_xla_choice_is_kept_only_when_the_run_repays_its_compile():
    from tftrain.runtime.execution import ExecutionChoice
    from tftrain.runtime.trial_rules import weigh_remembered_xla

    timings = {"graph": _timing(2.0, 1.0), "graph, 32 steps/execution": _timing(1.8, 0.1, 32),
               "xla": _timing(1.2, 3.0), "xla, 32 steps/execution": _timing(0.8, 0.1, 32)}
    choice = ExecutionChoice("xla", timings, "1.5x faster", remembered="2026-12-01T10:00:00", steps_per_execution=32)
    # XLA's compile: 3.0 - 1.0 = 2 s; it saves (1.8 - 0.8) ms a step against graph's fastest count.
    assert weigh_remembered_xla(choice, 2_500) is choice
    assert weigh_remembered_xla(choice, None) is choice
    short = weigh_remembered_xla(choice, 1_000)
    assert (short.execution, short.steps_per_execution) == ("graph", 32) and short.remembered == choice.remembered
    assert short.reason.startswith("xla would save 1.0 s over this run's 1000 steps, less than compiling it again")


def test_a_call_that_compiles_for_a_new_input_shape_counts_in_the_step_time():
    from tftrain.runtime.trial_rules import step_time as _step_time

    # Measured (seconds, steps) per call on a GRU over padded sequences: XLA compiled again for a new
    # length in its second call; graph's calls relax the shape and do not.
    xla = [(0.050, 8), (1.158, 8), (0.049, 8)]
    graph = [(0.167, 8), (0.203, 8), (0.160, 8)]
    assert _step_time(xla) == pytest.approx(1.257 / 24) and _step_time(xla) > _step_time(graph)
    assert _step_time([(0.8, 8), (0.2, 2)]) == pytest.approx(0.1)  # a partial last call is left out


def _recurrent_model():
    import keras

    inner = keras.Sequential([keras.Input((3, 4)), keras.layers.Bidirectional(keras.layers.GRU(2))])
    inputs = keras.Input((3, 4))
    model = keras.Model(inputs, keras.layers.Dense(1)(inner(inputs)))  # the GRU two levels down
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", steps_per_execution=8)
    return model


@pytest.mark.parametrize("recurrent,planned_steps,timed", [(True, 500, False), (True, 600, True),
                                                           (False, 300, False), (False, 360, True)])
def test_xla_is_timed_only_when_its_gain_can_repay_its_estimated_compile(recurrent, planned_steps, timed):
    from tftrain.runtime.trial_rules import XLA_MAX_SPEEDUP, xla_compile_ratio

    model = _recurrent_model() if recurrent else _model()
    ratio = xla_compile_ratio(model)
    assert ratio == (3.25 if recurrent else 2.0)  # a recurrent layer's loop is compiled whole
    trial = ExecutionTrial(model, ("graph", "xla"), examples_per_step=8, planned_steps=planned_steps)
    trial.incumbent.warmup_s, trial.incumbent.samples = 1.0, [(0.08, 8)] * 3  # graph: 10 ms a step, 1 s first call
    # The break-even: 0.6 x 10 ms x steps = ratio x 1 s, at about 542 steps (recurrent) or 334.
    break_even = math.ceil(ratio / ((1 - 1 / XLA_MAX_SPEEDUP) * 0.01))
    # A run resumed at step 1000 whose trial ran 24 steps before the XLA duel.
    trial.first_step, trial._step, trial.planned_steps = 1000, lambda: 1024, 1000 + planned_steps
    why = trial._not_worth_timing(trial.challengers[0])
    assert (why is None) == timed
    if not timed:  # the break-even, after the trial's 24 steps, is where a fresh run times XLA
        assert f"less than compiling it may take (about {ratio:.1f} s, {ratio}x graph's first call; a run of " \
            f"{24 + break_even} steps" in why
        assert trial.time_again_from == 24 + break_even


@pytest.mark.parametrize("traced_first_call_s,timed", [(None, True), (1.0, False)])
def test_xla_s_compile_is_estimated_from_the_call_that_traced_graph(traced_first_call_s, timed):
    # Graph's first call in the trial took 10 ms: it ran the function the precision timing traced,
    # whose first call took 1 s. 300 steps of 10 ms repay 0.02 s of compile, not 2 s.
    trial = ExecutionTrial(_model(), ("graph", "xla"), examples_per_step=8, planned_steps=300)
    trial.traced_graph = None if traced_first_call_s is None else (trial.model.train_function, traced_first_call_s)
    trial.incumbent.warmup_s, trial.incumbent.samples = 0.01, [(0.08, 8)] * 3
    trial.first_step, trial._step = 0, lambda: 24
    why = trial._not_worth_timing(trial.challengers[0])
    assert (why is None) == timed
    if not timed:
        assert "less than compiling it may take (about 2.0 s, 2.0x graph's first call" in why
        assert trial.incumbent.warmup_s == 0.01  # what the timings record: the trial's own call


def test_the_reason_quotes_the_duel_that_decided_not_every_call_of_the_run():
    # graph at 8 steps/execution ran 14 ms a step in an earlier duel and 10 ms in the last, where
    # graph at 32 ran 9.7 ms: 3% faster side by side, so 8 is kept; over every call 32 looks 1.24x faster.
    trial = ExecutionTrial(_model(), ("graph",), (32,), examples_per_step=8)
    incumbent, challenger = trial.incumbent, trial._candidate("graph", 32)
    incumbent.warmup_s, challenger.warmup_s = 1.0, 0.5
    incumbent.samples, incumbent.window = [(0.112, 8)] * 4 + [(0.08, 8)] * 4, [(0.08, 8)] * 4
    challenger.samples, challenger.window = [(0.3104, 32)] * 2, [(0.3104, 32)] * 2
    trial.challenger, trial.larger = challenger, []
    trial.timed = {incumbent.label: incumbent, challenger.label: challenger}
    trial._judge()
    trial._settle(complete=True)
    assert trial.choice.steps_per_execution == 8
    assert trial.choice.reason.startswith("graph kept: graph, 32 steps/execution only 3% faster side by side (graph "
                                          "10.00, graph, 32 steps/execution 9.70 ms/step), within the 5% timing noise")


def test_a_challenger_faster_side_by_side_but_slower_over_all_its_calls_is_not_taken():
    # A Python generator's pipeline (the sweep of 2026-12-03): xla won its duel 1.58x side by side and ran 4.82 ms a
    # step over all its calls against graph's 0.62; the line printed both. The incumbent, the cheaper, stays.
    trial = ExecutionTrial(_model(), ("graph", "xla"), examples_per_step=8)
    trial._next_duel()
    incumbent, challenger = trial.incumbent, trial.challenger
    incumbent.samples = [(0.005, 8)] * 8 + [(0.08, 8)] * 3
    incumbent.window = [(0.08, 8)] * 3
    challenger.samples = challenger.window = [(0.05, 8)] * 3
    incumbent.warmup_s = challenger.warmup_s = 0.5
    trial.timed = {incumbent.label: incumbent, challenger.label: challenger}
    trial._judge()
    trial._settle(complete=True)
    assert trial.choice.execution == "graph"
    assert "graph kept: xla was faster side by side but slower over all its timed calls (6.25 against 3.18 " \
           "ms/step)" in trial.choice.reason
    # Faster over all its calls too, it is taken.
    trial = ExecutionTrial(_model(), ("graph", "xla"), examples_per_step=8)
    trial._next_duel()
    trial.incumbent.samples = trial.incumbent.window = [(0.08, 8)] * 3
    trial.challenger.samples = trial.challenger.window = [(0.05, 8)] * 3
    trial.incumbent.warmup_s = trial.challenger.warmup_s = 0.5
    trial.timed = {trial.incumbent.label: trial.incumbent, trial.challenger.label: trial.challenger}
    trial._judge()
    trial._settle(complete=True)
    assert trial.choice.execution == "xla"


def test_graph_at_one_count_runs_the_function_the_precision_timing_traced():
    from tftrain.runtime.execution_probe import time_graph_step

    model = _model(spe=8)
    traces = []
    step = model.train_step
    model.train_step = lambda data: traces.append(1) or step(data)  # runs once per trace, in Python
    time_graph_step(model, _data(n=256), steps=16)
    assert len(traces) == 1
    trial = ExecutionTrial(model, ("graph",), examples_per_step=8)
    trial.install()
    model.fit(_data(n=512), epochs=1, verbose=0, shuffle=False)
    assert len(traces) == 1 and trial.finish().execution == "graph"  # not traced again
    assert trial.traced_graph[1] > 0  # the seconds of the timing's first call, which traced it
    model.steps_per_execution, model.train_function = 4, None  # a new count drops the traced function
    assert ExecutionTrial(model, ("graph",), examples_per_step=8).traced_graph is None


@pytest.mark.parametrize("calls,ended", [(2, False), (8, True)])
def test_a_duel_ends_early_only_over_enough_steps(calls, ended):
    # One step a call: two calls 1.5x apart are noise on a loaded host; eight calls each are not.
    trial = ExecutionTrial(_model(spe=1), ("graph", "xla"), examples_per_step=8)
    trial._next_duel()
    incumbent, challenger = trial.incumbent, trial.challenger
    incumbent.window = incumbent.samples = [(0.002, 1)] * calls
    challenger.window = challenger.samples = [(0.003, 1)] * calls
    trial._judge()
    assert (trial.challenger is None) == ended and trial.incumbent is incumbent


def test_the_choosing_cost_is_what_the_run_paid_beyond_a_run_at_the_chosen_setting():
    # graph (first call 0.5 s, then 10 ms a step) against xla (first call 3.0 s, compiling, then 6.25 ms a step).
    # The trial spans, after graph's first call: graph 24 steps (0.24 s), xla's first call of 8 steps (3.0 s), xla
    # 24 steps (0.15 s): 64 steps in all. A run at xla fixed pays xla's first call (8 steps) and 6.25 ms for
    # each of the other 56: 3.35 s; the automatic run paid its first call of 0.5 s and then 3.39 s.
    trial = ExecutionTrial(_model(), ("graph", "xla"), examples_per_step=8)
    trial._next_duel()
    incumbent, challenger = trial.incumbent, trial.challenger
    incumbent.samples = incumbent.window = [(0.08, 8)] * 3
    challenger.samples = challenger.window = [(0.05, 8)] * 3
    incumbent.warmup_s, challenger.warmup_s = 0.5, 3.0
    trial.timed = {incumbent.label: incumbent, challenger.label: challenger}
    trial.started, trial.first_compiled = (100.0, 8), incumbent
    trial.clock, trial._step = (lambda: 103.39), (lambda: 64)
    trial._judge()
    trial._settle(complete=True)
    assert trial.choice.execution == "xla"
    cost = trial.choice.trial["cost_s"]
    assert cost == pytest.approx(3.39 - 56 * 0.00625 + 0.5 - 3.0, abs=1e-3)  # 0.54 s: not xla's own compile
    assert cost == pytest.approx((0.5 + 3.39) - (3.0 + 56 * 0.00625), abs=1e-3)
    # A winner whose compiling call took less than the first one's (graph at 32 retraced in 0.2 s after graph at
    # 8's first call of 0.5 s, which also built the optimizer): nothing is taken off.
    trial = ExecutionTrial(_model(), ("graph",), (32,), examples_per_step=8)
    incumbent, challenger = trial.incumbent, trial._candidate("graph", 32)
    incumbent.samples = incumbent.window = [(0.08, 8)] * 3
    challenger.samples = challenger.window = [(0.16, 32)] * 2
    incumbent.warmup_s, challenger.warmup_s = 0.5, 0.2
    trial.challenger, trial.larger = challenger, []
    trial.timed = {incumbent.label: incumbent, challenger.label: challenger}
    trial.started, trial.first_compiled = (100.0, 8), incumbent
    trial.clock, trial._step = (lambda: 100.76), (lambda: 128)
    trial._judge()
    trial._settle(complete=True)
    assert trial.choice.steps_per_execution == 32
    assert trial.choice.trial["cost_s"] == pytest.approx(0.76 - 120 * 0.005, abs=1e-3)
