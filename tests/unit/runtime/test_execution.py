import pytest

from tftrain.runtime.execution import compile_options


@pytest.mark.parametrize(
    "mode, eager, jit",
    [("eager", True, False), ("graph", False, False), ("xla", False, True)],
)
def test_modes_map_to_compile_arguments(mode, eager, jit):
    assert compile_options(mode, 4) == {"run_eagerly": eager, "jit_compile": jit, "steps_per_execution": 4}


@pytest.mark.parametrize("mode, spe", [("jit", 1), ("graph", 0), ("graph", 1.5)])
def test_bad_values(mode, spe):
    with pytest.raises(ValueError):
        compile_options(mode, spe)


def test_options_are_accepted_by_keras_compile():
    import keras
    import numpy as np

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", **compile_options("graph", 2))
    model.fit(np.ones((8, 3)), np.ones((8, 1)), batch_size=2, epochs=1, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 4


# --- time_training_steps and choose_execution (`--execution auto`) ---------------

def _tiny_model(steps_per_execution=1):
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        **compile_options("graph", steps_per_execution),
    )
    return model


def _batches(batch_size=16, n=64):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = rng.integers(0, 3, size=n).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size, drop_remainder=True)


@pytest.mark.slow
def test_time_training_steps_counts_whole_executions():
    from tftrain.runtime import time_training_steps

    model = _tiny_model(steps_per_execution=4)
    timing = time_training_steps(model, _batches(), steps=6)
    # 6 steps round up to 2 executions of 4, but at least 3 executions are timed.
    assert timing.timed_steps == 12 and len(timing.execution_times_s) == 3
    assert timing.batch_size == 16 and timing.steps_per_execution == 4
    assert timing.step_time_s > 0 and timing.mean_step_time_s > 0 and timing.warmup_s > 0
    assert timing.examples_per_sec == pytest.approx(16 / timing.step_time_s)
    # Warm-up execution + 3 timed ones, 4 optimizer steps each.
    assert int(model.optimizer.iterations.numpy()) == 16


@pytest.mark.parametrize("kwargs", [{"steps": 0}, {"warmup_executions": 0}, {"min_timed_executions": 0}])
def test_time_training_steps_rejects_bad_counts(kwargs):
    from tftrain.runtime import time_training_steps

    with pytest.raises(ValueError, match=next(iter(kwargs))):
        time_training_steps(_tiny_model(), _batches(), **kwargs)


@pytest.mark.slow
def test_choose_execution_restores_state_and_keeps_the_winner_compiled():
    import numpy as np

    from tftrain.runtime import choose_execution

    model = _tiny_model()
    model.fit(_batches(), epochs=1, verbose=0, shuffle=False)  # builds the optimizer; 4 steps
    weights = [w.copy() for w in model.get_weights()]
    optimizer_state = [v.numpy().copy() for v in model.optimizer.variables]

    choice = choose_execution(model, _batches())

    assert choice.execution in ("graph", "xla") and set(choice.timings) == {"graph", "xla"}
    assert model.jit_compile == (choice.execution == "xla")
    assert all(t.examples_per_sec > 0 for t in choice.timings.values())
    # Either mode may win on a loaded machine; the reason says which way the timing went.
    assert ("faster than" in choice.reason or "within the 5% timing noise" in choice.reason), choice.reason
    assert choice.execution in choice.describe()
    for before, after in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(before, after)
    for before, variable in zip(optimizer_state, model.optimizer.variables):
        np.testing.assert_array_equal(before, variable.numpy())
    assert int(model.optimizer.iterations.numpy()) == 4
    # The winner's compiled function is reused: fit does not build a new one.
    function = model.train_function
    model.fit(_batches(), epochs=1, verbose=0, shuffle=False)
    assert model.train_function is function
    assert int(model.optimizer.iterations.numpy()) == 8
    assert choice.to_dict()["execution"] == choice.execution


def _dropout_model(seed):
    """A model whose training depends on Dropout's seed-generator state; same seed, same start."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dropout(0.5), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), **compile_options("graph", 1))
    return model


@pytest.mark.slow
def test_training_after_choose_execution_matches_training_without_it():
    import numpy as np

    from tftrain.runtime import choose_execution

    timed, untimed = _dropout_model(seed=5), _dropout_model(seed=5)
    dropout = timed.layers[1]
    seed_state = [v for v in dropout.variables if "seed" in v.path]
    assert seed_state  # Dropout's seed-generator state, which every timed step advanced
    choice = choose_execution(timed, _batches())
    untimed.jit_compile = timed.jit_compile  # graph and XLA may round differently: compare like with like

    timed.fit(_batches(), epochs=2, verbose=0, shuffle=False)
    untimed.fit(_batches(), epochs=2, verbose=0, shuffle=False)

    assert choice.timings and int(timed.optimizer.iterations.numpy()) == 8
    for a, b in zip(timed.get_weights(), untimed.get_weights()):
        np.testing.assert_array_equal(a, b)


def _fake_step_times(monkeypatch, seconds_per_step):
    """Every call the trial times takes `seconds_per_step(mode, steps_per_execution)` a step, whatever the
    host's load; returns the (xla?, steps per execution) candidates in the order first run."""
    from tftrain.runtime.execution_trial import ExecutionTrial

    record, tried = ExecutionTrial._record, []

    def fake(self, candidate, seconds, steps):
        if (candidate.mode == "xla", candidate.spe) not in tried:
            tried.append((candidate.mode == "xla", candidate.spe))
        return record(self, candidate, seconds_per_step(candidate.mode, candidate.spe) * max(steps, 1), steps)

    monkeypatch.setattr(ExecutionTrial, "_record", fake)
    return tried


def test_choose_execution_takes_the_faster_mode(monkeypatch):
    from tftrain.runtime import execution_probe

    _fake_step_times(monkeypatch, lambda mode, spe: 0.004 if mode == "xla" else 0.001)  # graph 4x faster than XLA
    model = _tiny_model()
    choice = execution_probe.choose_execution(model, _batches())
    assert choice.execution == "graph" and not model.jit_compile
    assert choice.reason.startswith("graph 4.00x faster than xla"), choice.reason
    assert choice.timings["xla"].step_time_s == pytest.approx(0.004)


def test_choose_execution_with_one_candidate():
    from tftrain.runtime import choose_execution

    choice = choose_execution(_tiny_model(), _batches(), candidates=("graph",))
    assert choice.execution == "graph" and list(choice.timings) == ["graph"]
    assert choice.reason == "only graph was timed"


@pytest.mark.parametrize("candidates", [(), ("eager",), ("graph", "jit")])
def test_choose_execution_rejects_bad_candidates(candidates):
    from tftrain.runtime import choose_execution

    with pytest.raises(ValueError, match="candidates"):
        choose_execution(_tiny_model(), _batches(), candidates=candidates)


def test_choose_execution_rejects_eager_models():
    import keras

    from tftrain.runtime import choose_execution

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    with pytest.raises(ValueError, match="run_eagerly"):
        choose_execution(model, _batches())


def test_runtime_runs_one_step_per_call_across_replicas():
    from types import SimpleNamespace

    from tftrain.config import RuntimeConfig
    from tftrain.runtime import Runtime

    def runtime(replicas, execution="auto"):
        parts = dict(threads=SimpleNamespace(describe=lambda: "", applied=True),
                     devices=SimpleNamespace(describe=lambda: ""), precision=SimpleNamespace(describe=lambda: "", policy="float32"),
                     strategy=SimpleNamespace(num_replicas_in_sync=replicas), cluster=None)
        return Runtime(RuntimeConfig(execution=execution, steps_per_execution=8), **parts)

    one, two = runtime(1), runtime(2)
    assert one.steps_per_execution == 8 and one.compile_options()["steps_per_execution"] == 8
    # Keras 3's multi-step loop fails across replicas (keras-team/keras#19246).
    assert two.steps_per_execution == 1 and two.compile_options()["steps_per_execution"] == 1
    assert any("8 requested; Keras 3 runs one step per call across replicas" in line for line in two.describe())
    # auto compiles for graph; choose_execution decides later.
    assert one.compile_options()["jit_compile"] is False and runtime(1, "xla").compile_options()["jit_compile"]


# --- candidates that fail, steps_per_execution by measurement ---------------------

def _string_op_model():
    """A model whose step runs a `tf.strings` op: graph trains it, XLA has no kernel for it
    (the shape of keras-team/keras#18456 on a CPU)."""
    import keras
    import tensorflow as tf

    class RoundTrip(keras.layers.Layer):
        def call(self, x):
            return tf.strings.to_number(tf.strings.as_string(x))

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(3)(RoundTrip()(inputs)))
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  **compile_options("graph", 1))
    return model


def test_a_candidate_xla_cannot_compile_is_skipped_with_xla_s_reason():
    import numpy as np

    from tftrain.runtime import choose_execution

    model = _string_op_model()
    before = [w.copy() for w in model.get_weights()]
    choice = choose_execution(model, _batches())
    assert choice.execution == "graph" and not model.jit_compile and list(choice.timings) == ["graph"]
    assert len(choice.skipped) == 1 and choice.skipped[0].startswith("xla: unsupported operations on XLA_CPU_JIT")
    assert "AsString" in choice.skipped[0] and "skipped xla" in choice.reason
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    model.fit(_batches(), epochs=1, verbose=0)  # trains on in the mode that worked
    assert int(model.optimizer.iterations.numpy()) == 4


def test_a_model_that_fails_in_every_mode_raises_its_own_error():
    import keras
    import tensorflow as tf

    from tftrain.runtime import choose_execution

    class Checked(keras.layers.Layer):
        def call(self, x):  # fails when it runs, in graph and XLA alike: the user's bug, not XLA's
            tf.debugging.assert_less(x, -1e9, message="inputs out of range")
            return x

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(3)(Checked()(inputs)))
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(tf.errors.InvalidArgumentError, match="inputs out of range"):
        choose_execution(model, _batches())
    assert not model.jit_compile


def test_xla_failure_reason_reads_xla_s_line_and_ignores_other_errors():
    from tftrain.runtime.execution import xla_failure_reason

    error = ValueError("Graph execution error:\n\nDetected at node f/AsString defined at:\n  File \"x.py\"\n"
                       "Detected unsupported operations when trying to compile graph __inference_1[] on "
                       "XLA_GPU_JIT: CudnnRNN (No registered 'CudnnRNN' OpKernel for XLA_GPU_JIT devices "
                       "compatible with node {{node lstm/CudnnRNN}}){{node lstm/CudnnRNN}}\n")
    assert xla_failure_reason(error) == ("unsupported operations on XLA_GPU_JIT: CudnnRNN (No registered "
                                         "'CudnnRNN' OpKernel for XLA_GPU_JIT devices compatible with node )")
    assert xla_failure_reason(ValueError("shapes (3,) and (4,) are incompatible")) is None


def test_steps_per_execution_is_chosen_by_measurement(monkeypatch):
    from tftrain.runtime import execution_probe

    per_step = {1: 0.004, 8: 0.002, 32: 0.0012, 64: 0.00119}  # 64 is within 5% of 32: the incumbent stays
    tried = _fake_step_times(monkeypatch, lambda mode, spe: per_step[spe] * (2 if mode == "xla" else 1))
    model = _tiny_model(steps_per_execution=8)
    choice = execution_probe.choose_execution(model, _batches(), steps_per_execution=(1, 8, 32, 64))
    assert (choice.execution, choice.steps_per_execution) == ("graph", 32)
    assert model.steps_per_execution == 32 and not model.jit_compile
    # 1 only adds per-call cost: not timed; xla, which lost at 8, meets graph again at graph's winning count.
    assert tried == [(False, 8), (True, 8), (False, 32), (False, 64), (True, 32)]
    assert set(choice.timings) == {"graph", "xla", "graph, 32 steps/execution", "graph, 64 steps/execution",
                                   "xla, 32 steps/execution"}
    assert choice.to_dict()["steps_per_execution"] == 32 and choice.trial["complete"]


def test_a_mode_slower_at_the_base_count_wins_at_a_larger_one(monkeypatch):
    from tftrain.runtime import execution_probe

    # Per-call overhead makes xla slower at 8 steps a call; at 32 it amortises and xla's steps are faster.
    # graph stops at 32 (64 within 5%); xla, timed again at 32, wins and then grows to 64 in turn.
    per_step = {("graph", 8): 0.002, ("xla", 8): 0.0025, ("graph", 32): 0.0015, ("xla", 32): 0.001,
                ("graph", 64): 0.00148, ("xla", 64): 0.0008}
    tried = _fake_step_times(monkeypatch, lambda mode, spe: per_step[mode, spe])
    model = _tiny_model(steps_per_execution=8)
    choice = execution_probe.choose_execution(model, _batches(), steps_per_execution=(8, 32, 64))
    assert tried == [(False, 8), (True, 8), (False, 32), (False, 64), (True, 32), (True, 64)]
    assert (choice.execution, choice.steps_per_execution) == ("xla", 64) and choice.trial["complete"]
    assert "xla, 64 steps/execution" in choice.reason and model.jit_compile


@pytest.mark.slow
def test_a_clearly_slower_candidate_is_given_up_early():
    from tftrain.runtime import time_training_steps

    model = _tiny_model()
    timing = time_training_steps(model, _batches(), steps=50, give_up_above_s=1e-9)
    assert len(timing.execution_times_s) == 2  # stopped after two timed executions, not 50


def test_graph_at_the_model_s_own_count_stays_unless_another_is_more_than_5_percent_faster(monkeypatch):
    from tftrain.runtime import execution_probe

    per_step = {1: 0.004, 8: 0.002, 32: 0.00196}  # 32 only 2% faster: noise, not a reason to change
    _fake_step_times(monkeypatch, lambda mode, spe: per_step[spe] * (0.97 if mode == "xla" else 1))  # XLA 3% faster
    model = _tiny_model(steps_per_execution=8)
    choice = execution_probe.choose_execution(model, _batches(), steps_per_execution=(1, 32))
    assert (choice.execution, choice.steps_per_execution) == ("graph", 8)
    assert model.steps_per_execution == 8 and not model.jit_compile


def test_a_choice_line_gives_one_set_of_figures():
    from tftrain.runtime.execution import ExecutionChoice, StepTiming

    timings = {label: StepTiming(s, 128 / s, s, 128, 8, 64, 0.1, (s,) * 3)
               for label, s in (("graph", 0.00138), ("xla", 0.00190))}
    duel = ExecutionChoice("graph", timings, "graph 1.53x faster than xla side by side (graph 1.24, xla 1.90 ms/step)")
    assert duel.describe() == "graph: graph 1.53x faster than xla side by side (graph 1.24, xla 1.90 ms/step)"
    alone = ExecutionChoice("graph", {"graph": timings["graph"]}, "only graph was timed")
    assert alone.describe() == "graph (graph 1.38 ms/step, 92,754 examples/sec): only graph was timed"
