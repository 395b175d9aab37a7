"""Automatic settings never fail a run plain Keras trains (issue: unbuilt models, steps XLA
cannot compile, custom train steps under mixed precision), and steps per execution are measured."""

import re

import numpy as np
import pytest

import tftrain
from tests.conftest import REPO, run_module


def _arrays(n=512):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 4)).astype("float32")
    return x, (x @ np.array([1.0, -2.0, 0.5, 0.0], "float32"))[:, None]


def _unbuilt():
    import keras

    return keras.Sequential([keras.layers.Dense(10), keras.layers.Dense(1)])  # no Input (keras-team/keras#20712)


def _string_op_model():
    """Graph trains it; XLA has no kernel for its `tf.strings` ops (keras-team/keras#18456's shape on a CPU)."""
    import keras
    import tensorflow as tf

    class RoundTrip(keras.layers.Layer):
        def call(self, x):
            return tf.strings.to_number(tf.strings.as_string(x))

    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(1)(RoundTrip()(inputs)))


def _task(build, **kw):
    x, y = _arrays()
    return tftrain.ArrayTask(build, x, y, x[:64], y[:64], loss="mse", optimizer="sgd", learning_rate=0.05,
                             name="auto", **kw)


def _fit(tmp_path, build, name, **overrides):
    overrides = {"epochs": 2, "verbose": 0, "seed": 0, "batch_size": 8, "run_dir": str(tmp_path / name),
                 **overrides}
    return tftrain.Trainer(_task(build), **overrides).fit()


@pytest.mark.parametrize("overrides", [
    {"execution": "graph"},
    {"execution": "auto"},
    {"execution": "graph", "precision": "mixed_bfloat16"},
    {"execution": "auto", "precision": "mixed_bfloat16"},
], ids=["graph", "auto", "graph-bf16", "auto-bf16"])
@pytest.mark.slow
def test_an_unbuilt_sequential_trains_under_every_mode_and_precision(tmp_path, overrides, fresh_execution_memory,
                                                                     xla_always_timed):
    first = _fit(tmp_path, _unbuilt, "a", **overrides)
    assert np.isfinite(first.test["loss"]) and (tmp_path / "a" / "model.keras").is_file()
    if overrides["execution"] == "auto":  # the second run reuses the remembered choice
        again = _fit(tmp_path, _unbuilt, "b", **overrides)
        assert again.execution_choice["remembered"] and np.isfinite(again.test["loss"])


@pytest.mark.slow
def test_the_end_of_data_of_unknown_length_inside_a_candidate_s_steps_is_no_failure_of_it(tmp_path,
                                                                                       fresh_execution_memory,
                                                                                       xla_always_timed):
    import keras
    import tensorflow as tf

    x, y = _arrays(160)
    task = tftrain.DatasetTask(lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]),
                               lambda: tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda *_: True),
                               loss="mse", name="unknown", default_batch_size=8)  # 20 steps an epoch, not known
    record = tftrain.Trainer(task, epochs=2, verbose=0, execution="auto", run_dir=str(tmp_path / "run")).fit()
    assert not [s for s in record.execution_choice["skipped"] if "OutOfRange" in s], record.execution_choice


@pytest.mark.slow
def test_execution_auto_skips_xla_when_it_has_no_kernel_and_trains_in_graph(tmp_path, fresh_execution_memory,
                                                                            xla_always_timed):
    record = _fit(tmp_path, _string_op_model, "run", execution="auto")
    choice = record.execution_choice
    assert record.execution == "graph" and list(choice["timings"]) == ["graph"]
    assert choice["skipped"] and "AsString" in choice["skipped"][0] and choice["skipped"][0].startswith("xla: ")
    assert np.isfinite(record.test["loss"])


@pytest.mark.slow
def test_a_remembered_xla_choice_that_fails_now_is_forgotten_and_timed_again(tmp_path, monkeypatch,
                                                                              fresh_execution_memory, xla_always_timed):
    from tftrain.runtime import execution_memory
    from tftrain.runtime.execution import ExecutionChoice, StepTiming

    stale = ExecutionChoice("xla", {"xla": StepTiming(1e-3, 3.2e4, 1e-3, 32, 1, 16, 0.1)}, "timed before",
                            remembered="2026-01-01T00:00:00", steps_per_execution=1)
    forgotten = []
    monkeypatch.setattr(execution_memory.ExecutionMemory, "get", lambda self, key: stale)
    monkeypatch.setattr(execution_memory.ExecutionMemory, "forget", lambda self, key: forgotten.append(key))
    record = _fit(tmp_path, _string_op_model, "run", execution="auto")
    assert len(forgotten) == 1 and record.execution == "graph"
    assert record.execution_choice["remembered"] is None and "AsString" in record.execution_choice["skipped"][0]


@pytest.mark.slow
def test_an_explicit_xla_that_cannot_compile_fails_in_one_line_with_the_fix(tmp_path):
    task_file = tmp_path / "strings_task.py"
    task_file.write_text(
        "import numpy as np, keras, tensorflow as tf, tftrain\n"
        "class RoundTrip(keras.layers.Layer):\n"
        "    def call(self, x):\n"
        "        return tf.strings.to_number(tf.strings.as_string(x))\n"
        "def build():\n"
        "    inputs = keras.Input((4,))\n"
        "    return keras.Model(inputs, keras.layers.Dense(1)(RoundTrip()(inputs)))\n"
        "x = np.random.default_rng(0).standard_normal((256, 4)).astype('float32')\n"
        "task = tftrain.ArrayTask(build, x, x[:, :1], loss='mse')\n"
    )
    proc = run_module("tftrain.run", [f"{task_file}:task", "--execution", "xla", "--epochs", "1",
                                      "--run-dir", tmp_path / "run"], cwd=REPO)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("python -m tftrain.run: run failed: XlaCompileError: XLA could not compile a step of "
                           "this model: unsupported operations on XLA_CPU_JIT: AsString")
    assert "Try --execution graph" in last


def _own_step_model(scales: bool, mention: bool = False):
    """A subclassed model with the Keras guide's train_step, calling `scale_loss` or not; with `mention`, an
    unscaled step whose text names `scale_loss` on a path it never takes (a branch and a comment)."""
    import keras
    import tensorflow as tf

    class Scaled(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
                scaled = self.optimizer.scale_loss(loss)
            self.optimizer.apply(tape.gradient(scaled, self.trainable_variables), self.trainable_variables)
            return {"step_loss": loss}

    class Unscaled(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
            return {"step_loss": loss}

    class Mentions(keras.Model):
        scale = False

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
                if self.scale:  # never: the step below takes the unscaled loss's gradients
                    loss = self.optimizer.scale_loss(loss)
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
            return {"step_loss": loss}

    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(1, dtype="float32")(keras.layers.Dense(16, activation="relu")(inputs))
    return (Scaled if scales else Mentions if mention else Unscaled)(inputs, outputs)


@pytest.mark.parametrize("scales, mention", [(True, False), (False, False), (False, True)])
def test_step_scales_loss_is_judged_by_running_the_step(scales, mention):
    import keras
    import numpy as np
    import tensorflow as tf

    from tftrain.runtime.precision import overridden_steps, step_scales_loss

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _own_step_model(scales, mention)
        data = tf.data.Dataset.from_tensors((np.ones((8, 4), "float32"), np.full((8, 1), 3.0, "float32")))
        got = step_scales_loss(model, lambda optimizer: model.compile(optimizer=optimizer, loss="mse"), data)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert got is scales
    assert overridden_steps(model) == ("train_step",) and overridden_steps(_unbuilt()) == ()


@pytest.mark.slow
def test_precision_auto_takes_float32_for_a_step_that_does_not_scale_its_loss(tmp_path, monkeypatch, capsys):
    from tftrain.runtime import precision

    real = precision.resolve_precision
    monkeypatch.setattr(precision, "resolve_precision",  # what auto picks on a GPU with Tensor Cores
                        lambda name, devices, native_bf16=None: "mixed_float16" if name == "auto" else real(name, devices))
    record = _fit(tmp_path, lambda: _own_step_model(False), "run", precision="auto", execution="graph", epochs=3,
                  verbose=1)
    assert record.runtime["precision"] == "float32"
    assert "precision: auto -> float32, not mixed_float16: Unscaled.train_step does not scale its loss: run under " \
           "two loss scales, its updates shrank with the larger" in capsys.readouterr().out
    # It learns (0.022 -> 0.012 from the seed's weights); with its gradients divided by the loss scale the
    # loss would stay where it started.
    assert record.history["step_loss"][-1] < 0.7 * record.history["step_loss"][0]


@pytest.mark.slow
def test_an_explicit_mixed_float16_warns_with_the_fix(tmp_path, capsys):
    _fit(tmp_path, lambda: _own_step_model(False), "run", precision="mixed_float16", execution="graph", verbose=1)
    captured = capsys.readouterr()
    assert "Unscaled.train_step does not scale its loss" in captured.out + captured.err
    assert "Take the gradients of self.optimizer.scale_loss(loss)" in captured.out + captured.err


def test_a_custom_step_s_loss_is_marked_as_its_own_across_replicas(tmp_path):
    import types

    trainer = tftrain.Trainer(_task(_unbuilt), epochs=1, verbose=0, run_dir=str(tmp_path / "run"))
    trainer.runtime = types.SimpleNamespace(num_replicas=2)
    trainer.note_custom_steps(_own_step_model(True))
    note = trainer.extras["custom_step"]
    assert note["overridden"] == ["train_step"] and note["replicas"] == 2
    assert "reports the loss / 2" in note["note"]
    trainer.extras.clear()
    trainer.note_custom_steps(_unbuilt())
    assert "custom_step" not in trainer.extras


@pytest.mark.slow
def test_steps_per_execution_auto_is_measured_and_divides_the_backup_interval(tmp_path, fresh_execution_memory):
    record = _fit(tmp_path, _unbuilt, "a", steps_per_execution="auto", execution="graph", epochs=1, batch_size=32)
    choice = record.execution_choice
    assert choice["steps_per_execution"] == 8 == record.runtime["steps_per_execution"]
    assert choice["timings"] == {} and "the only candidate" in choice["reason"]  # 16 batches: 32 and 64 do not fit
    backed = _fit(tmp_path, _unbuilt, "b", steps_per_execution="auto", execution="graph", backup_every_steps=4)
    assert backed.execution_choice["steps_per_execution"] == 1 and backed.extras["backup"]["every_steps"] == 4


@pytest.mark.slow
def test_a_remembered_count_that_fails_now_is_timed_again_from_the_compiled_count(tmp_path, monkeypatch,
                                                                                   fresh_execution_memory):
    from tftrain.runtime import execution_memory
    from tftrain.runtime.execution import ExecutionChoice, StepTiming

    stale = ExecutionChoice("xla", {"xla": StepTiming(1e-3, 8e3, 1e-3, 8, 32, 64, 0.1)}, "timed before",
                            remembered="2026-01-01T00:00:00", steps_per_execution=32)
    monkeypatch.setattr(execution_memory.ExecutionMemory, "get", lambda self, key: stale)
    monkeypatch.setattr(execution_memory.ExecutionMemory, "forget", lambda self, key: None)
    record = _fit(tmp_path, _string_op_model, "run", execution="auto", steps_per_execution="auto", batch_size=8,
                  epochs=10)  # 640 steps: enough to time every count
    timings = record.execution_choice["timings"]
    assert record.execution == "graph" and "graph" in timings  # timed again from 8, not from the stale 32
    assert timings["graph"]["steps_per_execution"] == 8


@pytest.mark.slow
def test_a_remembered_choice_that_left_xla_untimed_serves_runs_as_short_and_a_longer_run_times_again(
        tmp_path, monkeypatch, fresh_execution_memory):
    from tftrain.runtime import execution_memory
    from tftrain.runtime.execution import ExecutionChoice, StepTiming

    partial = ExecutionChoice("graph", {"graph": StepTiming(1e-3, 8e3, 1e-3, 8, 1, 64, 0.1)},
                              "xla not timed: ... a run of 200 steps or more times it",
                              remembered="2026-01-01T00:00:00", steps_per_execution=1, time_again_from_steps=200)
    monkeypatch.setattr(execution_memory.ExecutionMemory, "get", lambda self, key: partial)
    short = _fit(tmp_path, _dense, "short", execution="auto")  # 128 steps
    assert short.execution_choice["remembered"] == "2026-01-01T00:00:00"
    longer = _fit(tmp_path, _dense, "longer", execution="auto", epochs=4)  # 256 steps: XLA may repay now
    assert longer.execution_choice["remembered"] is None and "graph" in longer.execution_choice["timings"]


def _string_test_step_model():
    """A training step XLA compiles and a test step it cannot (a `tf.strings` op feeds the targets)."""
    import keras
    import tensorflow as tf

    class StringTestStep(keras.Model):
        def test_step(self, data):
            x, y = data
            digits = tf.cast(tf.strings.length(tf.strings.as_string(x[:, :1])), y.dtype)
            return super().test_step((x, y + 0.0 * digits))

    inputs = keras.Input((4,))
    return StringTestStep(inputs, keras.layers.Dense(1)(inputs))


@pytest.mark.slow
def test_a_remembered_xla_choice_whose_test_step_xla_cannot_compile_gives_way_to_graph(
        tmp_path, monkeypatch, fresh_execution_memory, xla_always_timed):
    from tftrain.runtime import execution_memory
    from tftrain.runtime.execution import ExecutionChoice, StepTiming

    remembered = ExecutionChoice("xla", {"xla": StepTiming(1e-3, 3.2e4, 1e-3, 32, 1, 16, 0.1)}, "faster",
                                 remembered="2026-01-01T00:00:00", steps_per_execution=1)
    monkeypatch.setattr(execution_memory.ExecutionMemory, "get", lambda self, key: remembered)
    record = _fit(tmp_path, _string_test_step_model, "run", execution="auto")
    assert record.execution == "graph" and record.execution_choice["execution"] == "graph"
    assert any(s.startswith("xla test step: ") and "AsString" in s for s in record.execution_choice["skipped"])
    assert np.isfinite(record.test["loss"]) and (tmp_path / "run" / "model.keras").is_file()


@pytest.mark.slow
def test_xla_chosen_in_training_keeps_the_test_step_in_graph(tmp_path, monkeypatch, fresh_execution_memory,
                                                             xla_always_timed):
    from tftrain.runtime import execution_trial

    class XlaWins(execution_trial.ExecutionTrial):  # as a trial that found XLA faster leaves the model
        def _judge(self):
            if self.challenger.mode == "xla" and self.challenger.samples:
                self.incumbent, self.challenger = self.challenger, None

    monkeypatch.setattr(execution_trial, "ExecutionTrial", XlaWins)
    record = _fit(tmp_path, _string_test_step_model, "run", execution="auto")
    assert record.execution == "xla" and np.isfinite(record.test["loss"])  # the test step ran in graph


def test_an_explicit_xla_whose_test_step_does_not_compile_fails_before_training(tmp_path):
    with pytest.raises(tftrain.XlaCompileError, match=r"test step of this model: unsupported operations.*"
                                                       r"AsString.*Try --execution graph"):
        _fit(tmp_path, _string_test_step_model, "run", execution="xla")
    assert not (tmp_path / "run" / "model.keras").exists() and not (tmp_path / "run" / "backup").exists()


def _dense():
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])


@pytest.mark.slow
def test_precision_auto_times_bfloat16_against_float32_on_a_cpu_and_remembers(tmp_path, monkeypatch,
                                                                                fresh_execution_memory,
        bf16_always_timed):
    from tftrain.runtime import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda *a: True)  # auto would take mixed_bfloat16
    first = _fit(tmp_path, _dense, "a", execution="graph", precision="auto")
    choice = first.extras["precision_auto"]
    assert choice["policy"] in ("float32", "mixed_bfloat16") and set(choice["step_time_s"]) == {
        "float32", "mixed_bfloat16"} and all(t > 0 for t in choice["step_time_s"].values())
    assert first.runtime["precision"] == choice["policy"] and np.isfinite(first.test["loss"])
    import keras

    saved = keras.saving.load_model(tmp_path / "a" / "model.keras")
    dense = next(layer for layer in saved.layers if isinstance(layer, keras.layers.Dense))
    assert dense.dtype_policy.name == choice["policy"]  # the model trained is the one chosen

    def not_again(*args, **kwargs):
        raise AssertionError("a remembered precision is not timed again")

    monkeypatch.setattr(precision, "choose_precision", not_again)
    again = _fit(tmp_path, _dense, "b", execution="graph", precision="auto")
    assert again.extras["precision_auto"] == choice and again.runtime["precision"] == choice["policy"]


@pytest.mark.slow
def test_a_resumed_run_goes_on_in_the_policy_its_checkpoint_trained_in(tmp_path, monkeypatch, fresh_execution_memory,
                                                                      bf16_always_timed):
    import json

    import keras

    from tftrain.runtime import execution_probe, precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda *a: True)
    faster = {"policy": "mixed_bfloat16"}  # the timing's winner, by decree
    monkeypatch.setattr(execution_probe, "time_graph_step", lambda model, *a, **k: 2e-3 if model.dtype_policy.name
                        == faster["policy"] else 4e-3)

    class StopAfterOneEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise KeyboardInterrupt

    settings = {"execution": "graph", "precision": "auto", "remember_execution": False}
    with pytest.raises(tftrain.Interrupted):
        _fit(tmp_path, _dense, "run", callbacks=[StopAfterOneEpoch()], **settings)
    (meta,) = sorted((tmp_path / "run" / "backup").glob("ckpt-*.json"))[-1:]
    assert json.loads(meta.read_text())["precision"] == "mixed_bfloat16"
    faster["policy"] = "float32"  # timed again now, float32 would win: the run keeps its checkpoint's policy
    record = _fit(tmp_path, _dense, "run", **settings)
    assert record.resumed_from_epoch == 1 and record.runtime["precision"] == "mixed_bfloat16"
    saved = keras.saving.load_model(tmp_path / "run" / "model.keras")
    assert next(layer for layer in saved.layers if isinstance(layer, keras.layers.Dense)).dtype_policy.name == \
        "mixed_bfloat16"


@pytest.mark.slow
def test_precision_auto_trains_float32_when_float32_is_faster(tmp_path, monkeypatch, fresh_execution_memory,
                                                               bf16_always_timed):
    import keras

    from tftrain.runtime import precision

    from tftrain.runtime import execution_probe

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda *a: True)
    timed, initial = [], []  # float32 twice as fast: the model built first (float32) is the model trained

    def step_time(model, dataset, steps=16, batch_size=None):
        timed.append(model.dtype_policy.name)
        initial.append(model.get_weights())
        return 2e-3 if model.dtype_policy.name == "float32" else 4e-3

    monkeypatch.setattr(execution_probe, "time_graph_step", step_time)
    record = _fit(tmp_path, _dense, "run", execution="graph", precision="auto")
    assert timed == ["float32", "mixed_bfloat16"] and record.extras["precision_auto"]["policy"] == "float32"
    for first, twin in zip(*initial):  # under --seed the twin starts where the first model did
        np.testing.assert_array_equal(first, twin)
    assert record.runtime["precision"] == "float32" and record.runtime["compute_dtype"] == "float32"
    saved = keras.saving.load_model(tmp_path / "run" / "model.keras")
    assert all(layer.dtype_policy.name == "float32" for layer in saved.layers)


@pytest.mark.slow
def test_precision_auto_times_nothing_under_eager_execution(tmp_path, monkeypatch, fresh_execution_memory):
    from tftrain.runtime import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda *a: True)
    record = _fit(tmp_path, _dense, "run", execution="eager", precision="auto")  # no graph step to time
    assert record.runtime["precision"] == "float32" and record.extras["precision_auto"]["step_time_s"] == {}
    assert "--execution eager is not timed" in record.extras["precision_auto"]["reason"]


def _padded_sequences(n: int):
    """A `DatasetTask` of `n` sequences of 2-11 ones, padded per batch (no static batch or length
    dimension), regressing their length."""
    import keras
    import tensorflow as tf

    lengths = np.random.default_rng(0).integers(2, 12, n)

    def train(batch_size):
        return tf.data.Dataset.from_generator(
            lambda: (([1.0] * k, float(k)) for k in lengths),
            output_signature=(tf.TensorSpec([None]), tf.TensorSpec([]))).padded_batch(batch_size)

    def build():
        return keras.Sequential([keras.Input((None,)), keras.layers.Reshape((-1, 1)),
                                 keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])

    return tftrain.DatasetTask(build, train, batch=False, loss="mse", num_train_examples=n)


@pytest.mark.slow
def test_precision_auto_times_batches_of_unknown_size(tmp_path, monkeypatch, fresh_execution_memory,
        bf16_always_timed):
    """`padded_batch` without `drop_remainder` (sequences of several lengths) has no static batch size; plain
    Keras trains on it, and the precision timing takes the run's global batch size instead."""
    from tftrain.runtime import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda *a: True)
    record = tftrain.Trainer(_padded_sequences(300), epochs=2, verbose=0, batch_size=16, execution="graph",
                             precision="auto", run_dir=str(tmp_path / "run")).fit()
    assert set(record.extras["precision_auto"]["step_time_s"]) == {"float32", "mixed_bfloat16"}
    assert len(record.history["loss"]) == 2 and np.isfinite(record.history["loss"][-1])


def test_a_remembered_xla_choice_is_checked_on_batches_of_unknown_size():
    """`_still_compiles` runs a remembered XLA step once on the probe batches; without the run's batch
    size, a `padded_batch` (no static batch dimension) made the check fail and the choice was forgotten."""
    import keras
    import tensorflow as tf

    from tftrain.runtime.execution_probe import check_compiles

    data = tf.data.Dataset.from_generator(lambda: ((np.ones(n, "float32"), 1.0) for n in (3, 5, 4, 2)),
                                          output_signature=(tf.TensorSpec([None]), tf.TensorSpec([]))).padded_batch(2)
    model = keras.Sequential([keras.Input((None,)), keras.layers.Reshape((-1, 1)),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
    model.compile("sgd", "mse", jit_compile=True)
    with pytest.raises(ValueError, match="batch dimension is unknown"):
        check_compiles(model, data)
    check_compiles(model, data, batch_size=2)  # compiles and runs; the state is restored
    assert model.train_function is not None


def _mixes_float32_in_a_layer():
    """Plain Keras (float32) builds it; under a mixed policy its layer multiplies a bfloat16 input by a
    float32 constant, and the build fails."""
    import keras
    import tensorflow as tf

    class Scale(keras.layers.Layer):
        def call(self, x):
            return x * tf.constant(2.0)

    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(1)(Scale()(keras.layers.Dense(8)(inputs))))


def _mixes_float32_in_its_step():
    """Builds under any policy; its own `train_step` multiplies a hidden activation (bfloat16 under
    mixed_bfloat16) by a float32 constant, so only the step fails."""
    import keras
    import tensorflow as tf

    class Step(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                hidden = self.layers[1](x) * tf.constant(1.0)
                loss = tf.reduce_mean(tf.square(tf.cast(self.layers[2](hidden), tf.float32) - y))
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
            return {"loss": loss}

    inputs = keras.Input((4,))
    return Step(inputs, keras.layers.Dense(1, dtype="float32")(keras.layers.Dense(8)(inputs)))


@pytest.mark.slow
def test_precision_auto_builds_in_float32_a_model_that_does_not_build_under_the_mixed_policy(
        tmp_path, monkeypatch, fresh_execution_memory, bf16_always_timed, capsys):
    from tftrain.runtime import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda *a: True)  # auto would take mixed_bfloat16
    timed = _fit(tmp_path, _mixes_float32_in_a_layer, "timed", execution="graph", precision="auto")
    assert timed.runtime["precision"] == "float32" and np.isfinite(timed.history["loss"][-1])
    assert re.search(r"mixed_bfloat16 fails \(.*bfloat16", timed.extras["precision_auto"]["reason"])
    # Untimed where the rule's policy stays (a GPU's mixed_float16; here the CPU's, as if it stayed untimed): the
    # build under the rule's policy falls back.
    from tftrain.train.precision_plan import PrecisionPlanner

    with monkeypatch.context() as patched:
        patched.setattr(PrecisionPlanner, "settle_untimed", lambda self, why: None)
        untimed = _fit(tmp_path, _mixes_float32_in_a_layer, "untimed", execution="eager", precision="auto", verbose=1)
    assert untimed.runtime["precision"] == "float32" and np.isfinite(untimed.history["loss"][-1])
    fallback = untimed.extras["precision_auto"]
    assert fallback["policy"] == "float32" and fallback["instead_of"] == "mixed_bfloat16"
    assert re.search(r"does not build under mixed_bfloat16 \(.*bfloat16", fallback["reason"])
    out = capsys.readouterr().out  # set-up names the rule's policy as a candidate, the build what it took
    assert "precision: auto: float32 or mixed_bfloat16, whichever trains faster on this CPU" in out
    assert "precision: auto -> float32: the model does not build under mixed_bfloat16" in out
    with pytest.raises(Exception, match="bfloat16"):  # asked for by name, the policy is kept: the model's error
        _fit(tmp_path, _mixes_float32_in_a_layer, "asked", execution="graph", precision="mixed_bfloat16")


def test_precision_auto_keeps_float32_on_a_cpu_where_it_cannot_time_bfloat16(tmp_path, monkeypatch, capsys):
    # (--deterministic, the other untimed case in one process, would turn op determinism on for the tests after.)
    from tftrain.runtime import precision

    why = "--execution xla is not timed (graph steps are)"
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda *a: True)  # the rule's candidate: mixed_bfloat16
    record = _fit(tmp_path, _dense, "run", precision="auto", epochs=1, verbose=1, execution="xla")
    assert record.runtime["precision"] == "float32"
    choice = record.extras["precision_auto"]
    assert choice["policy"] == "float32" and choice["step_time_s"] == {}
    assert choice["reason"] == f"mixed_bfloat16 only when timing shows it faster on this CPU, and {why}"
    assert f"precision: auto -> float32: mixed_bfloat16 only when timing shows it faster" in capsys.readouterr().out


@pytest.mark.slow
def test_precision_auto_trains_in_float32_a_step_that_fails_under_bfloat16(tmp_path, monkeypatch,
                                                                          fresh_execution_memory, bf16_always_timed):
    from tftrain.runtime import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda *a: True)
    record = _fit(tmp_path, _mixes_float32_in_its_step, "timed", execution="graph", precision="auto")
    assert record.runtime["precision"] == "float32" and np.isfinite(record.history["loss"][-1])
    choice = record.extras["precision_auto"]
    assert set(choice["step_time_s"]) == {"float32"} and "mixed_bfloat16 fails (" in choice["reason"]
    # Untimed where the rule's policy stays (a GPU's mixed_float16; here the CPU's, as if it stayed untimed): the
    # sanity pass's step fails under it before training, so float32 trains, and one line says why.
    from tftrain.train.precision_plan import PrecisionPlanner

    monkeypatch.setattr(PrecisionPlanner, "settle_untimed", lambda self, why: None)
    untimed = _fit(tmp_path, _mixes_float32_in_its_step, "untimed", execution="eager", precision="auto")
    assert untimed.runtime["precision"] == "float32" and np.isfinite(untimed.history["loss"][-1])
    fallback = untimed.extras["precision_auto"]
    assert fallback["instead_of"] == "mixed_bfloat16"
    assert re.search(r"does not build or step under mixed_bfloat16 \(.*bfloat16", fallback["reason"])


@pytest.mark.slow
def test_precision_auto_builds_one_model_where_the_run_cannot_repay_timing_bfloat16(tmp_path, monkeypatch,
                                                                                    fresh_execution_memory):
    import keras

    from tftrain.runtime import execution_probe, precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda *a: True)
    built, asked = [], []

    def build():
        built.append(keras.mixed_precision.global_policy().name)
        return _dense()

    # The gate's own rule is tested in tests/unit/runtime/test_precision.py; here it says that runs from
    # 200 steps repay the twin, whatever the host's load (a loaded host's slow float32 steps made 128
    # steps look long enough).
    monkeypatch.setattr(precision, "bfloat16_repays_from", lambda step_s, probe_s: 200)
    monkeypatch.setattr(execution_probe, "time_graph_step", lambda *args: asked.append(args[0]) or 1e-3)
    for run in ("first", "second"):  # 128 steps of a tiny model
        record = _fit(tmp_path, build, run, execution="graph", precision="auto")
        choice = record.extras["precision_auto"]
        assert record.runtime["precision"] == "float32"  # plain Keras's policy
        assert set(choice["step_time_s"]) == {"float32"} and choice["reason"].startswith("mixed_bfloat16 not timed")
        assert not choice["complete"] and choice["time_twin_from_steps"] == 200
    # Two float32 builds a run (the sanity pass's and the run's), no mixed_bfloat16 twin; the second run remembers.
    assert built == ["float32"] * 4 and len(asked) == 1
    longer = _fit(tmp_path, build, "longer", execution="graph", precision="auto", epochs=4)  # 256 steps
    assert built[4:] == ["float32", "float32", "mixed_bfloat16"] and len(asked) == 3  # float32 and the twin timed
    assert set(longer.extras["precision_auto"]["step_time_s"]) == {"float32", "mixed_bfloat16"}


def test_varying_shape_names_the_first_dimension_past_the_batch_that_varies():
    import tensorflow as tf

    from tftrain.train.model_facts import varying_shape

    fixed = (tf.TensorSpec([None, 28, 28]), tf.TensorSpec([None]))
    assert varying_shape(fixed) is None  # the batch dimension may vary: XLA pads it (Keras drops no batch)
    padded = (tf.TensorSpec([None, None], tf.int64), tf.TensorSpec([None]))
    assert varying_shape(padded) == "dimension 1 of input 0 (shape (None, None))"
    two_inputs = ({"ids": tf.TensorSpec([None, 8]), "text": tf.TensorSpec([None, 4, None])}, tf.TensorSpec([None, 1]))
    assert varying_shape(two_inputs) == "dimension 2 of input 1 (shape (None, 4, None))"
    assert varying_shape((tf.TensorSpec([None, 3]), tf.TensorSpec([None, None]))).startswith("dimension 1 of label 0")
    assert varying_shape((tf.TensorSpec(None), tf.TensorSpec([None]))) == "input 0 (shape of unknown rank)"


@pytest.mark.slow
def test_execution_auto_does_not_time_xla_over_batches_whose_shape_varies(tmp_path, fresh_execution_memory,
                                                                         xla_always_timed, capsys):
    task = _padded_sequences(512)
    message = "xla not timed: the batches' dimension 1 of input 0 (shape (None, None)) is not static"
    for spe, name in ((1, "untimed"), ("auto", "counts")):
        capsys.readouterr()
        record = tftrain.Trainer(task, epochs=3, verbose=1, batch_size=8, execution="auto", precision="float32",
                                 steps_per_execution=spe, run_dir=str(tmp_path / name)).fit()
        choice = record.to_dict()["execution_choice"]
        assert record.execution == "graph" and not any(label.startswith("xla") for label in choice["timings"])
        assert message in capsys.readouterr().out
        assert (message in choice["reason"]) == (spe == 1)  # with counts, graph alone goes on to them


@pytest.mark.slow
def test_a_remembered_count_after_the_precision_timing_trains_every_step(tmp_path, monkeypatch,
                                                                           fresh_execution_memory, bf16_always_timed):
    """The precision timing leaves the model a graph train function traced at the compiled count (8); a
    remembered graph choice at another count must not run it (Keras would count 32 steps a call while it
    runs 8), and an untimed graph run at the compiled count keeps it (no second trace)."""
    from tftrain.runtime import execution_memory, precision
    from tftrain.runtime.execution import ExecutionChoice, StepTiming

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda *a: True)
    remembered = ExecutionChoice("graph", {"graph": StepTiming(1e-3, 8e3, 1e-3, 8, 32, 64, 0.1)}, "faster",
                                 remembered="2026-01-01T00:00:00", steps_per_execution=32)
    monkeypatch.setattr(execution_memory.ExecutionMemory, "get", lambda self, key: remembered)
    record = _fit(tmp_path, _dense, "remembered", execution="auto", precision="auto", steps_per_execution="auto")
    assert record.execution_choice["steps_per_execution"] == 32
    assert record.extras["optimizer_steps"] == 2 * 64  # 512 examples in batches of 8, 2 epochs

    traced = []
    real = precision.choose_precision

    def keep_function(model, *args, **kwargs):
        choice = real(model, *args, **kwargs)
        traced.append(model.train_function)
        return choice

    import keras

    class FitsWith(keras.callbacks.Callback):  # fit has made (or kept) its train function by now
        def on_train_begin(self, logs=None):
            traced.append(self.model.train_function)

    monkeypatch.setattr(precision, "choose_precision", keep_function)
    monkeypatch.setattr(precision, "bfloat16_repays", lambda *args: False)  # float32 trains, whatever the timing
    monkeypatch.setattr(execution_memory.ExecutionMemory, "get", lambda self, key: None)
    monkeypatch.setattr(execution_memory.ExecutionMemory, "get_entry", lambda self, key: None)  # timed again
    untimed = tftrain.Trainer(_task(_dense), callbacks=[FitsWith()], epochs=1, verbose=0, seed=0, batch_size=8,
                              execution="auto", precision="auto", steps_per_execution=8,
                              run_dir=str(tmp_path / "untimed")).fit()  # 64 steps: too few to time graph vs xla
    assert untimed.execution_choice["timings"] == {} and "too few" in untimed.execution_choice["reason"]
    assert len(traced) == 2 and traced[0] is not None and traced[1] is traced[0]  # traced once, by the timing
    assert untimed.extras["optimizer_steps"] == 64


@pytest.mark.slow
def test_a_remembered_bfloat16_that_no_longer_builds_trains_the_float32_model_and_is_replaced(
        tmp_path, monkeypatch, fresh_execution_memory):
    from tftrain.runtime import execution_memory, precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda *a: True)
    stored = {}
    monkeypatch.setattr(execution_memory.ExecutionMemory, "get_entry", lambda self, key: {
        "policy": "mixed_bfloat16", "step_time_s": {"float32": 2e-3, "mixed_bfloat16": 1e-3}, "reason": "faster"})
    monkeypatch.setattr(execution_memory.ExecutionMemory, "put_entry",
                        lambda self, key, value: stored.update({key: value}))
    record = _fit(tmp_path, _mixes_float32_in_a_layer, "run", execution="graph", precision="auto")
    assert record.runtime["precision"] == "float32" and np.isfinite(record.history["loss"][-1])
    assert record.extras["precision_auto"]["reason"].startswith("mixed_bfloat16 fails now (")
    assert [v["policy"] for v in stored.values()] == ["float32"]  # the next run does not try it again


def _dense_model():
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])


def _nested_conv_model():
    """A Conv1D inside a nested Sequential: found however deep it sits."""
    import keras

    inputs = keras.Input((4,))
    block = keras.Sequential([keras.layers.Reshape((4, 1)), keras.layers.Conv1D(2, 3), keras.layers.Flatten()])
    return keras.Model(inputs, keras.layers.Dense(1)(block(inputs)))


def test_convolution_layers_finds_nested_convolutions_and_nothing_in_a_dense_model():
    from tftrain.train.model_facts import convolution_layers

    assert convolution_layers(_nested_conv_model()) == ["Conv1D"]
    assert convolution_layers(_string_op_model()) == []


def test_execution_auto_on_a_cpu_does_not_time_xla_for_a_model_that_convolves(tmp_path, fresh_execution_memory,
                                                                                xla_always_timed, capsys):
    message = "xla not timed: the model convolves (Conv1D), and XLA on a CPU runs convolutions without the oneDNN"
    for spe, name in ((1, "untimed"), ("auto", "counts")):
        capsys.readouterr()
        record = _fit(tmp_path, _nested_conv_model, name, epochs=3, verbose=1, execution="auto",
                      precision="float32", steps_per_execution=spe)
        choice = record.to_dict()["execution_choice"]
        assert record.execution == "graph" and not any(label.startswith("xla") for label in choice["timings"])
        assert message in capsys.readouterr().out
        assert (message in choice["reason"]) == (spe == 1)  # with counts, graph alone goes on to them
    # A model without convolutions still times XLA against graph.
    record = _fit(tmp_path, _dense_model, "dense", epochs=3, execution="auto", precision="float32",
                  steps_per_execution=1)
    assert "xla" in record.to_dict()["execution_choice"]["timings"]
