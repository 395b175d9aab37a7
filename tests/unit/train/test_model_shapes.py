"""Models of every shape through the features that failed on them after training: export of several
inputs and outputs, a trained run kept when an after-step fails (and redone alone), bad input refused
before the run directory, labels a mixed policy would round, and `--sanity-check`."""

import json

import numpy as np
import pytest

import tftrain
from tftrain import run
from tftrain.errors import ConfigError
from tftrain.train.after_steps import AfterStepFailed

RNG = np.random.default_rng(0)
X = RNG.standard_normal((96, 8)).astype("float32")
CLASSES = (X[:, 0] > 0).astype("int32")
VALUES = (2 * X[:, 1:2]).astype("float32")


def _two_outputs():
    import keras

    inputs = keras.Input((8,), name="features")
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    return keras.Model(inputs, {"label": keras.layers.Dense(2, activation="softmax", name="label")(hidden),
                                "value": keras.layers.Dense(1, name="value")(hidden)})


def _dict_inputs():
    import keras

    a, b = keras.Input((5,), name="a"), keras.Input((3,), name="b")
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([a, b]))
    return keras.Model({"a": a, "b": b}, keras.layers.Dense(2, activation="softmax")(hidden))


def _list_in_list_out():
    import keras

    a, b = keras.Input((5,), name="left"), keras.Input((3,), name="right")
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([a, b]))
    return keras.Model([a, b], [keras.layers.Dense(2, activation="softmax")(hidden), keras.layers.Dense(1)(hidden)])


TWO_OUTPUTS = dict(build_model=_two_outputs, x=X, y={"label": CLASSES, "value": VALUES},
                   loss={"label": "sparse_categorical_crossentropy", "value": "mse"},
                   metrics={"label": ["accuracy"], "value": ["mae"]})
DICT_INPUTS = dict(build_model=_dict_inputs, x={"a": X[:, :5], "b": X[:, 5:]}, y=CLASSES,
                   loss="sparse_categorical_crossentropy", metrics=["accuracy"])
LISTS = dict(build_model=_list_in_list_out, x=(X[:, :5], X[:, 5:]), y=(CLASSES, VALUES),
             loss=["sparse_categorical_crossentropy", "mse"], metrics=[["accuracy"], ["mae"]])


def _task(spec, **kw):
    spec = {**spec, **kw}
    build, x, y = spec.pop("build_model"), spec.pop("x"), spec.pop("y")
    return tftrain.ArrayTask(build, x, y, x, y, name="shape", **spec)


def _fit(task, tmp_path, name="run", **overrides):
    overrides = {"epochs": 1, "verbose": 0, "seed": 0, "batch_size": 32, "execution": "graph",
                 "run_dir": str(tmp_path / name), **overrides}
    return tftrain.Trainer(task, **overrides).fit()


@pytest.mark.slow
@pytest.mark.parametrize("spec, outputs", [(TWO_OUTPUTS, ["label", "value"]), (DICT_INPUTS, ["output_0"]),
                                           (LISTS, ["output_0", "output_1"])], ids=["dict-outputs", "dict-inputs",
                                                                                   "list-inputs-list-outputs"])
def test_models_of_several_inputs_or_outputs_export_to_every_format_checked_on_every_output(spec, outputs,
                                                                                         tmp_path):
    record = _fit(_task(spec), tmp_path, export="saved_model,onnx,litert")
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["after_steps"] == {"export": "done"}
    for name in ("saved_model", "onnx", "litert"):
        assert record.extras["export"][name]["outputs"] == outputs
        assert record.extras["export"][name]["max_abs_difference"] < 1e-4
    assert (tmp_path / "run" / "export" / "model.onnx").is_file()


@pytest.mark.slow
def test_an_export_that_fails_after_training_keeps_the_run_and_the_same_command_redoes_only_the_export(
        tmp_path, monkeypatch):
    from tftrain.train import export

    real = export.export_all

    def fails_in_the_run_directory(model, formats, directory, features):
        if directory.name == "export":  # the run's after-step, not the sanity pass's temporary folder
            raise RuntimeError("disk said no")
        return real(model, formats, directory, features)

    task = _task(TWO_OUTPUTS)
    with monkeypatch.context() as patched:
        patched.setattr(export, "export_all", fails_in_the_run_directory)
        with pytest.raises(AfterStepFailed, match=r"export failed after training \(RuntimeError: disk said no\); "
                                                  r"the trained model and metrics.json are kept"):
            _fit(task, tmp_path, epochs=2, export="saved_model", precision="mixed_bfloat16")
    run_dir = tmp_path / "run"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["after_steps"] == {"export": "failed: RuntimeError: disk said no"}
    assert metrics["epochs_trained"] == 2 and (run_dir / "model.keras").is_file()
    assert not (run_dir / "backup").exists()  # the run is finished: nothing to resume
    history = (run_dir / "history.csv").read_text()
    # only the export, from model.keras built under the run's policy: nothing trained
    assert _fit(task, tmp_path, epochs=2, export="saved_model", precision="mixed_bfloat16") is None
    assert (run_dir / "history.csv").read_text() == history
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["after_steps"] == {"export": "done"} and metrics["export"]["saved_model"]["outputs"] == [
        "label", "value"]
    assert (run_dir / "export" / "saved_model" / "saved_model.pb").is_file()
    with pytest.raises(ConfigError, match="holds a finished run"):  # done: the same command is refused again
        _fit(task, tmp_path, epochs=2, export="saved_model", precision="mixed_bfloat16")


def _numpy_function_task():
    import tensorflow as tf

    def train_data():
        ds = tf.data.Dataset.from_tensor_slices((X, CLASSES))
        return ds.map(lambda x, y: (tf.numpy_function(lambda a: a, [x], tf.float32), y))  # no set_shape

    def build():
        import keras

        return keras.Sequential([keras.layers.Dense(2, activation="softmax")])

    return tftrain.DatasetTask(build, train_data, loss="sparse_categorical_crossentropy", name="shape")


@pytest.mark.parametrize("case, message", [
    ("class_weight", "class_weight weighs the classes of one output, and this task's labels are for 2 outputs"),
    ("numpy_function", r"The training data's features have an unknown shape \(rank unknown\).*set_shape"),
])
def test_bad_input_found_late_before_is_refused_before_the_run_directory(case, message, tmp_path):
    task = (_task(TWO_OUTPUTS, class_weight={0: 1.0, 1: 2.0}) if case == "class_weight" else _numpy_function_task())
    with pytest.raises(ConfigError, match=message):
        _fit(task, tmp_path)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_monitor_the_logs_do_not_have_is_refused_before_training(tmp_path):
    with pytest.raises(ConfigError, match="val_value_mse"):
        _fit(_task(TWO_OUTPUTS), tmp_path, keep_best=1, monitor="val_value_mse", validation_split=0.25)
    assert not (tmp_path / "run").exists()
    record = _fit(_task(TWO_OUTPUTS), tmp_path, keep_best=1, monitor="val_value_mae", validation_split=0.25,
                  epochs=2)
    assert record.extras["keep_best"]["mode"] == "min" and len(record.extras["keep_best"]["kept"]) == 1
    assert "--monitor val_value_mae" in record.extras["sanity"]["checked"]


def _many_classes():
    """A subclassed model whose last layer computes in the policy's dtype: 400 classes."""
    import keras

    class Classifier(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden, self.out = keras.layers.Dense(16, activation="relu"), keras.layers.Dense(400)

        def call(self, x):
            return self.out(self.hidden(x))

    return Classifier()


MANY = RNG.integers(0, 400, len(X)).astype("int32")


@pytest.mark.slow
def test_labels_a_mixed_policy_would_round_are_refused_or_trained_in_float32_never_a_silent_wrong_figure(
        tmp_path, monkeypatch):
    import keras

    from tftrain.runtime import precision

    task = tftrain.ArrayTask(_many_classes, X, MANY, X, MANY, loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), metrics=["accuracy"], name="shape")
    with pytest.raises(ConfigError, match=r"computed in bfloat16, which holds integers exactly only up to 256; its "
                                          r"labels go up to 39\d.*pass --precision float32"):
        _fit(task, tmp_path, "asked", precision="mixed_bfloat16")
    assert not (tmp_path / "asked").exists()
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda *a: True)  # auto's candidate is mixed_bfloat16
    record = _fit(task, tmp_path, "auto", precision="auto", epochs=3)
    assert record.runtime["precision"] == "float32"
    assert "labels go up to" in record.extras["precision_auto"]["reason"]
    keras.mixed_precision.set_global_policy("float32")
    model = _many_classes()
    model(X[:1])
    model.load_weights(tmp_path / "auto" / "model.keras")
    true_accuracy = float(np.mean(np.argmax(model.predict(X, verbose=0), axis=-1) == MANY))
    assert record.test["accuracy"] == pytest.approx(true_accuracy, abs=1e-6)  # the figure is the model's own


@pytest.mark.slow
def test_sanity_check_runs_only_the_pass_and_writes_nothing(tmp_path, capsys):
    task_file = tmp_path / "shapes_task.py"
    task_file.write_text("from tests.unit.train.test_model_shapes import TWO_OUTPUTS, _task\n"
                         "task = _task(TWO_OUTPUTS)\n")
    run_dir = tmp_path / "run"
    code = run.main([f"{task_file}:task", "--sanity-check", "--export", "saved_model,onnx", "--keep-best", "1",
                     "--monitor", "val_label_accuracy", "--validation-split", "0.25", "--run-dir", str(run_dir)])
    out = capsys.readouterr().out
    assert code == 0 and not run_dir.exists()
    assert ("sanity:    data shapes, a training step and a validation step, a test step, "
            "--monitor val_label_accuracy, every label against the outputs' classes, export saved_model, onnx "
            "checked in") in out
    assert "sanity check passed; nothing trained" in out


@pytest.mark.slow
def test_python_m_tftrain_export_exports_a_finished_run_of_a_mixed_policy_model(tmp_path, capsys):
    from tftrain import export

    _fit(_task(TWO_OUTPUTS), tmp_path, precision="mixed_bfloat16")
    run_dir = tmp_path / "run"
    assert export.main([str(run_dir), "--formats", "saved_model,onnx"]) == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["after_steps"] == {"export": "done"} and set(metrics["export"]) == {"saved_model", "onnx"}
    assert all(r["outputs"] == ["label", "value"] and r["max_abs_difference"] < 1e-4 for r in metrics["export"].values())
    assert (run_dir / "export" / "model.onnx").is_file()
    capsys.readouterr()
    assert export.main([str(tmp_path / "nothing"), "--formats", "onnx"]) == 2
    assert "holds no finished run" in capsys.readouterr().err
    assert export.main([str(run_dir), "--formats", "pdf"]) == 2
    assert "unknown format 'pdf'" in capsys.readouterr().err


@pytest.mark.slow
def test_model_keras_of_a_mixed_policy_run_holds_the_model_as_built_with_its_output_names(tmp_path):
    import keras

    # The float32 cast a mixed policy adds is a layer after each output: saved, a list's outputs took its names.
    record = _fit(_task(LISTS), tmp_path, precision="mixed_bfloat16", epochs=2, execution="xla",
                  steps_per_execution=3)
    loaded = keras.models.load_model(tmp_path / "run" / "model.keras")
    assert (loaded.steps_per_execution, loaded.jit_compile) == (3, True)  # compiled as the run was, as plain Keras
    assert not [layer.name for layer in loaded.layers if layer.name.startswith("float32_output")]
    again = loaded.evaluate(LISTS["x"], list(LISTS["y"]), batch_size=32, verbose=0, return_dict=True)
    assert set(again) == set(record.test) and any(name.endswith("_accuracy") for name in again), again
    assert int(loaded.optimizer.iterations.numpy()) == 2 * 3  # the optimizer's state came along (96 / 32 a epoch)


def _unnamed_outputs():
    import keras

    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    return keras.Model(inputs, [keras.layers.Dense(2, activation="softmax")(hidden), keras.layers.Dense(1)(hidden)])


@pytest.mark.slow
def test_the_run_s_model_is_named_as_plain_keras_names_it_so_a_per_output_monitor_of_unnamed_layers_works(tmp_path):
    import keras

    keras.backend.clear_session()
    plain = _unnamed_outputs()  # what plain Keras, in a fresh process, calls the outputs' metrics
    plain.compile(loss=["sparse_categorical_crossentropy", "mse"], metrics=[["accuracy"], ["mae"]])
    keys = set(plain.fit(X, [CLASSES, VALUES], validation_split=0.25, epochs=1, verbose=0).history)
    monitor = next(k for k in keys if k.startswith("val_dense") and k.endswith("_mae"))
    keras.backend.clear_session()
    task = _task(dict(build_model=_unnamed_outputs, x=X, y=(CLASSES, VALUES), loss=["sparse_categorical_crossentropy",
                                                                                    "mse"],
                      metrics=[["accuracy"], ["mae"]]))
    record = _fit(task, tmp_path, epochs=2, validation_split=0.25, keep_best=1, monitor=monitor, precision="float32")
    assert set(record.history) == keys  # the sanity pass's model did not shift the names
    assert len(record.extras["keep_best"]["kept"]) == 1 and record.extras["keep_best"]["monitor"] == monitor


def _numpy_in_call():
    import keras

    class Peeks(keras.Model):  # a subclassed model runs eagerly; in a graph a symbolic tensor has no value
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x) * float(x.numpy().mean() * 0 + 1)

    return Peeks()


def _spaced_output_name():
    import keras

    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    return keras.Model(inputs, {"my value": keras.layers.Dense(1, name="value")(hidden),  # a loss each: a graph
                                "label": keras.layers.Dense(2, activation="softmax", name="label")(hidden)})  # scope each


@pytest.mark.parametrize("build, y, match", [
    (_numpy_in_call, VALUES, r"training step in graph mode failed .*numpy.* \(a model that runs only eagerly, with "
                             r"NumPy or \.numpy\(\) in its call, trains under --execution eager\)"),
    (_spaced_output_name, {"my value": VALUES, "label": CLASSES}, "'my value_loss' is not a valid scope name"),
])
def test_a_step_that_works_eagerly_but_not_in_a_graph_is_refused_before_the_run_directory(tmp_path, build, y,
                                                                                            match):
    loss = {"my value": "mse", "label": "sparse_categorical_crossentropy"} if isinstance(y, dict) else "mse"
    task = tftrain.ArrayTask(build, X, y, loss=loss, name="graph_only")
    with pytest.raises(ConfigError, match=match):
        tftrain.Trainer(task, epochs=1, verbose=0, execution="graph", precision="float32",
                        run_dir=str(tmp_path / "run")).fit()
    assert not (tmp_path / "run").exists()
    record = tftrain.Trainer(task, epochs=1, verbose=0, execution="eager", run_dir=str(tmp_path / "eager")).fit()
    assert record.test is None or all(np.isfinite(v) for v in record.test.values())  # eagerly it trains


@pytest.mark.slow
def test_a_dict_output_holding_a_dict_trains_under_a_mixed_policy_which_is_put_back_after_the_run(tmp_path):
    import keras

    def build():
        i = keras.Input((8,))
        h = keras.layers.Dense(16, activation="relu")(i)
        return keras.Model(i, {"cls": keras.layers.Dense(2, activation="softmax", name="cls")(h),
                               "reg": {"r1": keras.layers.Dense(1, name="r1")(h), "r2": keras.layers.Dense(1, name="r2")(h)}})

    x = np.random.default_rng(0).standard_normal((128, 8)).astype("float32")
    y = {"cls": (x[:, 0] > 0).astype("int32"), "reg": {"r1": x[:, 1:2], "r2": x[:, 2:3]}}
    task = tftrain.ArrayTask(build, x, y, x, y, loss={"cls": "sparse_categorical_crossentropy",
                                                      "reg": {"r1": "mse", "r2": "mse"}}, name="nested")
    keras.mixed_precision.set_global_policy("float32")
    record = _fit(task, tmp_path, precision="mixed_bfloat16")
    assert record.runtime["precision"] == "mixed_bfloat16" and np.isfinite(record.test["loss"])
    assert keras.mixed_precision.global_policy().name == "float32"  # a model built next is plain Keras's


@pytest.mark.slow
def test_tune_trains_a_subclassed_model_under_a_mixed_policy(tmp_path):
    import keras

    class Classifier(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(16, activation="relu")
            self.head = keras.layers.Dense(2, activation="softmax", dtype="float32")

        def call(self, x):
            return self.head(self.hidden(x))

    x = np.random.default_rng(0).standard_normal((256, 8)).astype("float32")
    task = tftrain.ArrayTask(Classifier, x, (x[:, 0] > 0).astype("int32"), loss="sparse_categorical_crossentropy",
                             metrics=["accuracy"], name="sub")
    record = _fit(task, tmp_path, precision="mixed_bfloat16", tune=2, validation_split=0.2, batch_size=None)
    assert record.extras["tuning"]["trials"] == 2 and record.runtime["precision"] == "mixed_bfloat16"


@pytest.mark.slow
def test_tune_ranks_trials_by_monitor_on_a_model_of_two_outputs_and_refuses_a_monitor_it_lacks(tmp_path):
    record = _fit(_task(TWO_OUTPUTS), tmp_path, tune=2, monitor="val_label_accuracy", batch_size=None,
                  validation_split=0.25)
    tuning = record.extras["tuning"]
    assert (tuning["objective"], tuning["direction"]) == ("val_label_accuracy", "max")
    scores = [trial["score"] for trial in tuning["ranking"]]
    assert len(scores) == 2 and scores == sorted(scores, reverse=True)  # a rising metric: the best is the largest
    plain = _fit(_task(TWO_OUTPUTS), tmp_path, "plain", tune=2, batch_size=None, validation_split=0.25)
    assert plain.extras["tuning"]["objective"] == "val_loss"  # no val_accuracy: each output's is named after it
    with pytest.raises(ConfigError, match="--monitor 'val_accuracy' is not among the epoch logs' keys"):
        _fit(_task(TWO_OUTPUTS), tmp_path, "wrong", tune=2, monitor="val_accuracy", batch_size=None,
             validation_split=0.25)
    assert not (tmp_path / "wrong").exists()


@pytest.mark.slow
def test_early_stopping_on_a_model_whose_test_step_reports_no_loss_is_refused_before_training(tmp_path):
    import keras

    class OwnLoss(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):
            x, y = data
            with __import__("tensorflow").GradientTape() as tape:
                loss = keras.ops.mean((self(x, training=True) - y) ** 2)
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
            return {"my_loss": loss}

        def test_step(self, data):
            x, y = data
            return {"my_loss": keras.ops.mean((self(x) - y) ** 2)}

    x = np.random.default_rng(0).standard_normal((128, 4)).astype("float32")
    task = tftrain.ArrayTask(OwnLoss, x, x[:, :1], x, x[:, :1], loss=None, name="own")
    with pytest.raises(ConfigError, match="--early-stopping watches val_loss, which is not among the epoch logs"):
        _fit(task, tmp_path, early_stopping=1, precision="float32", validation_split=0.25)
    assert not (tmp_path / "run").exists()


def _seeded_two_outputs():
    import keras

    keras.utils.set_random_seed(1)  # the same initial weights in every build
    return _two_outputs()


@pytest.mark.slow
def test_sample_weights_per_output_and_weighted_metrics_are_those_of_keras_fit_and_evaluate(tmp_path):
    import keras

    weights = {"label": (X[:, 2] > 0).astype("float32"), "value": np.abs(X[:, 3]).astype("float32")}
    spec = {**TWO_OUTPUTS, "build_model": _seeded_two_outputs, "weighted_metrics": {"value": ["mae"]}}
    task = _task(spec, sample_weight=weights, test_sample_weight=weights, optimizer=keras.optimizers.SGD(0.0))
    record = _fit(task, tmp_path, validation_split=0.25, precision="float32")
    plain = _seeded_two_outputs()  # at learning rate 0 the validation metrics are those of the initial weights
    plain.compile(loss=spec["loss"], metrics=spec["metrics"], weighted_metrics=spec["weighted_metrics"])
    held_out = {k: v[72:] for k, v in spec["y"].items()}  # the last quarter, with its weights, as Keras's split
    want = plain.evaluate(X[72:], held_out, sample_weight={k: w[72:] for k, w in weights.items()}, batch_size=24,
                          verbose=0, return_dict=True)
    unweighted = plain.evaluate(X[72:], held_out, batch_size=24, verbose=0, return_dict=True)
    assert want["loss"] != pytest.approx(unweighted["loss"], rel=1e-3)  # the weights change the figures
    got = {k.removeprefix("val_"): v[-1] for k, v in record.history.items() if k.startswith("val_")}
    assert set(got) == set(want) and got == pytest.approx(want, rel=1e-4), (got, want)
    tested = plain.evaluate(X, spec["y"], sample_weight=weights, batch_size=32, verbose=0, return_dict=True)
    assert record.test == pytest.approx(tested, rel=1e-4), (record.test, tested)


def test_sample_weight_with_class_weight_is_refused_as_keras_refuses_it():
    with pytest.raises(ConfigError, match="class_weight or sample_weight, not both"):
        _task(DICT_INPUTS, sample_weight=np.ones(96, "float32"), class_weight={0: 1.0, 1: 2.0})
    with pytest.raises(ConfigError, match="differ in length"):
        _task(DICT_INPUTS, sample_weight=np.ones(95, "float32"))


def test_class_weight_over_batches_carrying_sample_weights_is_refused_before_training():
    import tensorflow as tf

    from tftrain.train.data_checks import check_class_weight

    weighted = tf.data.Dataset.from_tensor_slices((X, CLASSES, np.ones(96, "float32"))).batch(8)
    with pytest.raises(ConfigError, match="class_weight and sample weights"):
        check_class_weight(weighted, {0: 1.0, 1: 2.0})
    check_class_weight(weighted.map(lambda x, y, w: (x, y)), {0: 1.0, 1: 2.0})  # labels of one output: accepted


def _subclassed_with_arguments():
    import keras

    class Net(keras.Model):  # __init__ takes an argument and there is no get_config: Keras cannot serialize it
        def __init__(self, units, **kwargs):
            super().__init__(**kwargs)
            self.hidden, self.out = keras.layers.Dense(units, activation="relu"), keras.layers.Dense(1)

        def call(self, x):
            return self.out(self.hidden(x))

    return Net(8)


@pytest.mark.slow
def test_a_model_keras_cannot_serialize_is_said_before_training_and_its_trained_weights_are_saved(tmp_path, capsys):
    task = tftrain.ArrayTask(_subclassed_with_arguments, X, VALUES, X, VALUES, loss="mse", name="net")
    record = _fit(task, tmp_path, epochs=2, verbose=2)
    run_dir = tmp_path / "run"
    printed = capsys.readouterr()
    said = printed.out + printed.err
    assert said.count("Net cannot be serialized") == 2 and "get_config" in said, said  # before training, and after
    assert not (run_dir / "model.keras").exists() and (run_dir / "metrics.json").is_file()
    assert not [p.name for p in run_dir.iterdir() if p.name.startswith(".tmp-")]
    again = _subclassed_with_arguments()
    again(X[:2])
    again.load_weights(run_dir / "model.weights.h5")
    again.compile(loss="mse")
    assert again.evaluate(X, VALUES, verbose=0) == pytest.approx(record.test["loss"], rel=1e-5)
    fine_tuned = _fit(task, tmp_path, name="tuned", epochs=1, init_from=str(run_dir))  # --init-from the run reads them
    assert fine_tuned.history["loss"][0] < record.history["loss"][0]
    from tftrain import export

    capsys.readouterr()
    assert export.main([str(run_dir), "--formats", "saved_model"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds the trained weights only" in err[0], err


def test_test_labels_of_another_structure_are_refused_before_training(tmp_path):
    spec = dict(LISTS)
    build, x, y = spec.pop("build_model"), spec.pop("x"), spec.pop("y")
    task = tftrain.ArrayTask(build, x, y, x, y[0], name="shape", **spec)  # one test label array for two outputs
    with pytest.raises(ConfigError, match="sanity check's test step failed on the first batch, before training"):
        _fit(task, tmp_path)
    assert not (tmp_path / "run").exists()


def test_array_task_inputs_that_would_shift_or_vanish_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"validation_data: sample weights weigh labels, and y is None"):
        _task(DICT_INPUTS, validation_data=(DICT_INPUTS["x"], None, np.ones(96, "float32")))  # not taken as labels
    with pytest.raises(ConfigError, match=r"validation_data must be \(x, y\) or \(x, y, sample_weight\)"):
        _task(DICT_INPUTS, validation_data=(DICT_INPUTS["x"],))
    with pytest.raises(ConfigError, match="no x_test is given"):
        tftrain.ArrayTask(_dict_inputs, DICT_INPUTS["x"], CLASSES, loss="mse", test_sample_weight=np.ones(96))
    with pytest.raises(ConfigError, match="one is a scalar"):
        _task(DICT_INPUTS, sample_weight=1.0)


def test_only_tftrain_s_own_temporary_files_are_removed_from_a_run_directory(tmp_path):
    from tftrain import files

    ours = [".tmp-123-model.keras", ".tmp-9-model.weights.h5", ".metrics.json.tmp-77"]
    users = [".tmp-notes.txt", ".plan.tmp-old", "notes.tmp-1"]
    for name in ours + users:
        (tmp_path / name).write_text("x")
    (tmp_path / "checkpoints" / "last" / "epoch-2_temp").mkdir(parents=True)  # TensorFlow's, cut by a kill
    (tmp_path / "checkpoints" / "last" / "epoch-2_temp" / "part-0").write_text("x")
    files.remove_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(users + ["checkpoints"])
    assert not list((tmp_path / "checkpoints" / "last").iterdir())


def test_what_keras_cannot_serialize_is_named_with_its_own_fix():
    import functools

    import keras

    from tftrain.train.sanity import unserializable

    net = _subclassed_with_arguments()
    net(X[:2])
    assert "get_config()" in unserializable(net)[1]
    inputs = keras.Input((X.shape[1],))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    assert unserializable(model) is None
    model.compile("adam", loss=functools.partial(keras.losses.mean_squared_error))  # the architecture serializes
    why, fix = unserializable(model)
    assert "functools.partial" in why and "register_keras_serializable" in fix and "get_config" not in fix


def test_a_class_its_config_does_not_make_again_is_said_as_load_model_would_fail(tmp_path):
    import keras

    from tftrain.train.sanity import not_rebuilt

    class Shift(keras.layers.Layer):  # Keras's config holds `amount`, and `trainable` that __init__ refuses
        def __init__(self, amount):
            super().__init__()
            self.amount = amount

        def call(self, x):
            return x + self.amount

    class Kept(Shift):
        def __init__(self, amount, **kwargs):
            keras.layers.Layer.__init__(self, **kwargs)
            self.amount = amount

    for layer, fails in ((Shift(0.5), True), (Kept(0.5), False)):
        inputs = keras.Input((X.shape[1],))
        model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))
        why = not_rebuilt(model)
        assert (why is not None) == fails, why
        model.save(tmp_path / "m.keras")
        try:
            keras.saving.load_model(tmp_path / "m.keras", custom_objects={"Shift": Shift, "Kept": Kept})
        except TypeError:
            assert fails
        else:
            assert not fails
    assert "Shift.__init__() got an unexpected keyword argument 'trainable'" in not_rebuilt(
        keras.Sequential([keras.Input((2,)), Shift(1.0)]))


def _built_by_shape():
    import keras

    class Net(keras.Model):  # build(shape) marks it built; its layers make their weights at the first call
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.hidden, self.out = keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)

        def call(self, x):
            return self.out(self.hidden(x))

    net = Net()
    net.build((None, X.shape[1]))
    return net


@pytest.mark.slow
def test_a_subclassed_model_built_by_shape_is_timed_and_trained_as_keras_trains_it(tmp_path):
    import tensorflow as tf

    from tftrain.runtime.execution_probe import time_graph_step

    model = _built_by_shape()
    model.compile("adam", "mse")
    batches = tf.data.Dataset.from_tensor_slices((X, VALUES)).batch(16, drop_remainder=True)
    assert time_graph_step(model, batches) > 0
    record = _fit(tftrain.ArrayTask(_built_by_shape, X, VALUES, X, VALUES, loss="mse", name="built"), tmp_path,
                  precision="auto", execution="auto")
    assert np.isfinite(record.test["loss"])


def _sparse_task():
    import keras
    import tensorflow as tf

    def build():
        inputs = keras.Input((X.shape[1],), sparse=True)
        return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(keras.layers.Dense(8)(inputs)))

    def batches(batch_size):
        data = tf.data.Dataset.from_tensor_slices((X, CLASSES)).batch(batch_size, drop_remainder=True)
        return data.map(lambda x, y: (tf.sparse.from_dense(x), y))

    return tftrain.DatasetTask(build, batches, test=batches, batch=False, num_train_examples=len(X),
                               loss="sparse_categorical_crossentropy", metrics=["accuracy"], name="sparse")


@pytest.mark.slow
def test_a_sparse_input_trains_and_what_cannot_take_it_is_refused_before_training(tmp_path):
    record = _fit(_sparse_task(), tmp_path)  # the sanity pass cuts a sparse batch too
    assert np.isfinite(record.test["loss"])
    with pytest.raises(ConfigError, match="takes a SparseTensor input, which tftrain's export check cannot feed"):
        _fit(_sparse_task(), tmp_path, name="export", export="saved_model")
    assert not (tmp_path / "export").exists()
    from tftrain.train.data_checks import check_dense

    with pytest.raises(ConfigError, match="--strategy mirrored: the features are a tf.SparseTensor"):
        check_dense(_sparse_task().train_data(32), "mirrored")  # Trainer.check_task, before any work
    check_dense(tftrain.ArrayTask(lambda: None, X, CLASSES, loss="mse").train_data(32), "mirrored")


@pytest.mark.slow
def test_a_metric_per_class_is_logged_as_one_scalar_per_class_through_every_feature(tmp_path):
    import keras

    def build():
        inputs = keras.Input((X.shape[1],))
        return keras.Model(inputs, keras.layers.Dense(3, activation="sigmoid")(keras.layers.Dense(8)(inputs)))

    labels = (X[:, :3] > 0).astype("float32")
    task = tftrain.ArrayTask(build, X, labels, X, labels, loss="binary_crossentropy", name="f1",
                             metrics=[lambda: keras.metrics.F1Score(average=None, threshold=0.5)])
    record = _fit(task, tmp_path, epochs=2, validation_split=0.25, keep_best=1, monitor="val_f1_score_2")
    names = [f"f1_score_{i}" for i in range(3)]
    assert set(record.test) == {"loss", *names} and set(record.history) >= {*names, *(f"val_{n}" for n in names)}
    assert record.to_dict()["keep_best"]["mode"] == "max"
    model = keras.models.load_model(tmp_path / "run" / "model.keras")
    again = model.evaluate(X, labels, batch_size=32, verbose=0, return_dict=True)
    for i, name in enumerate(names):
        assert record.test[name] == pytest.approx(float(again["f1_score"][i]), rel=1e-5)
    tuned = _fit(task, tmp_path, name="tuned", validation_split=0.25, tune=1, monitor="val_f1_score_2")
    assert tuned.extras["tuning"]["objective"] == "val_f1_score_2" and tuned.extras["tuning"]["trials"] == 1


@pytest.mark.slow
def test_batch_size_auto_searches_a_model_that_trains_only_in_float32_in_float32(tmp_path):
    import keras

    def build():  # an activity regularizer's loss stays bfloat16 under mixed_bfloat16: Keras's step fails
        return keras.Sequential([keras.Input((X.shape[1],)), keras.layers.Dense(
            8, activation="relu", activity_regularizer=keras.regularizers.l1(1e-4)), keras.layers.Dense(1)])

    task = tftrain.ArrayTask(build, X, VALUES, X, VALUES, loss="mse", name="regularized")
    record = _fit(task, tmp_path, precision="auto", batch_size="auto")  # where the rule picks mixed_bfloat16
    assert np.isfinite(record.test["loss"]) and record.runtime["precision"] == "float32"


def test_nested_outputs_keep_their_metric_names_under_a_mixed_policy():
    import keras

    from tftrain.runtime.precision import ensure_float32_outputs

    def build():
        inputs = keras.Input((X.shape[1],))
        hidden = keras.layers.Dense(8)(inputs)
        return keras.Model(inputs, {"heads": [keras.layers.Dense(1, name="a")(hidden),
                                              keras.layers.Dense(2, activation="softmax", name="b")(hidden)],
                                    "aux": keras.layers.Dense(1, name="c")(hidden)})

    labels = {"heads": [VALUES, CLASSES], "aux": VALUES}
    compile_args = dict(loss={"heads": ["mse", "sparse_categorical_crossentropy"], "aux": "mse"},
                        metrics={"heads": [["mae"], ["accuracy"]], "aux": ["mae"]})
    keys = {}
    for policy in ("float32", "mixed_bfloat16"):
        keras.mixed_precision.set_global_policy(policy)
        try:
            model = ensure_float32_outputs(build())
        finally:
            keras.mixed_precision.set_global_policy("float32")
        model.compile("adam", **compile_args)
        keys[policy] = sorted(model.fit(X, labels, epochs=1, verbose=0).history)
    assert keys["mixed_bfloat16"] == keys["float32"] and "heads/b_loss" in keys["float32"], keys


@pytest.mark.slow
def test_data_of_unknown_size_trains_and_evaluates_without_a_warning_that_it_ran_out(tmp_path):
    import warnings

    import tensorflow as tf

    def batches():
        spec = (tf.TensorSpec((X.shape[1],), tf.float32), tf.TensorSpec((), tf.int32))
        return tf.data.Dataset.from_generator(lambda: zip(X, CLASSES), output_signature=spec)  # no cardinality

    def build():
        import keras

        return keras.Sequential([keras.Input((X.shape[1],)), keras.layers.Dense(2, activation="softmax")])

    task = tftrain.DatasetTask(build, batches, test=batches, loss="sparse_categorical_crossentropy", name="generated")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record = _fit(task, tmp_path, epochs=2)
    assert len(record.history["loss"]) == 2 and np.isfinite(record.test["loss"])
    assert not [w for w in caught if "ran out of data" in str(w.message)]


def _ops_outputs():
    import keras

    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    return keras.Model(inputs, [keras.ops.softmax(keras.layers.Dense(3)(hidden)),  # outputs made by operations
                                keras.ops.concatenate([keras.layers.Dense(1)(hidden), hidden[:, :1] * 3.0], axis=-1)])


@pytest.mark.slow
@pytest.mark.parametrize("spec", [None, TWO_OUTPUTS, "ops"], ids=["sequential", "dict-outputs", "ops-outputs"])
def test_model_keras_of_a_mixed_policy_run_returns_float32_and_its_metrics_evaluate(tmp_path, spec):
    import keras

    if spec is None:
        spec = dict(build_model=lambda: keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"),
                                                          keras.layers.Dense(3, activation="softmax")]),
                    x=X, y=CLASSES, loss="sparse_categorical_crossentropy",
                    metrics=["accuracy", lambda: keras.metrics.SparseTopKCategoricalAccuracy(k=2)])
    elif spec == "ops":
        spec = dict(build_model=_ops_outputs, x=X, y=[CLASSES, X[:, :2]], loss=["sparse_categorical_crossentropy",
                                                                             "mse"], metrics=[["accuracy"], ["mae"]])
    record = _fit(_task(spec), tmp_path, precision="mixed_bfloat16")
    model = keras.models.load_model(tmp_path / "run" / "model.keras")
    outputs = model(spec["x"][:4])
    # An output an operation makes keeps the compute dtype, and its name (a cast layer would rename it).
    made_by_ops = spec["build_model"] is _ops_outputs
    assert all((keras.backend.standardize_dtype(t.dtype) == "float32") != made_by_ops
               for t in keras.tree.flatten(outputs))
    again = model.evaluate(spec["x"], spec["y"], batch_size=32, verbose=0, return_dict=True)  # top-k takes float32
    assert sorted(again) == sorted(record.test)
    assert again["loss"] == pytest.approx(record.test["loss"], rel=1e-5)


def test_a_metric_per_class_whose_element_names_another_metric_is_refused_in_one_line():
    from tftrain.callbacks.scalar_logs import scalar_logs

    assert scalar_logs({"f1_score": np.array([0.1, 0.2]), "loss": 1.0}) == {"f1_score_0": 0.1, "f1_score_1": 0.2,
                                                                            "loss": 1.0}
    with pytest.raises(ValueError, match=r"'f1_score_1' is another metric's name; give one of them another name"):
        scalar_logs({"f1_score": np.array([0.1, 0.2]), "f1_score_1": 0.3})


def _reconstructs():
    import keras

    class ReconstructionLoss(keras.layers.Layer):
        def call(self, inputs):
            x, reconstruction = inputs
            self.add_loss(keras.ops.mean(keras.ops.square(x - reconstruction)))
            return reconstruction

    inputs = keras.Input((X.shape[1],))
    return keras.Model(inputs, ReconstructionLoss()([inputs, keras.layers.Dense(X.shape[1])(inputs)]))


@pytest.mark.slow
def test_arrays_without_labels_train_a_model_through_add_loss_as_fit_x_none_does(tmp_path):
    task = tftrain.ArrayTask(_reconstructs, X, None, X, None, validation_data=(X[:32], None), loss=None)
    record = _fit(task, tmp_path, epochs=2)
    assert len(record.history["val_loss"]) == 2 and np.isfinite(record.test["loss"])
    with pytest.raises(ConfigError, match="sample weights weigh labels, and y is None"):
        tftrain.ArrayTask(_reconstructs, X, None, sample_weight=np.ones(len(X)), loss=None)


def test_a_dtype_clash_under_a_mixed_policy_asked_by_name_is_refused_before_the_run_directory(tmp_path):
    import keras
    import tensorflow as tf

    class Gate(keras.layers.Layer):  # trains in float32; mixes a float32 constant into bfloat16 under the policy
        def call(self, x):
            return x * tf.constant(2.0)

    def build():
        inputs = keras.Input((X.shape[1],))
        return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(Gate()(inputs)))

    task = tftrain.ArrayTask(build, X, CLASSES, loss="sparse_categorical_crossentropy")
    with pytest.raises(ConfigError, match=r"does not build or step under --precision mixed_bfloat16 \(Input 'y' of "
                                          r"'Mul' Op has type float32 that does not match type bfloat16 .*\): "):
        _fit(task, tmp_path, precision="mixed_bfloat16")
    assert not (tmp_path / "run").exists()


def test_an_output_of_one_scalar_per_example_is_warned_of_over_several_replicas_only():
    import keras
    import tensorflow as tf

    from tftrain.train import sanity

    def build():
        inputs = keras.Input((X.shape[1],))
        return keras.Model(inputs, keras.layers.Reshape(())(keras.layers.Dense(1)(inputs)))

    data = tf.data.Dataset.from_tensor_slices((X, X[:, 0])).batch(16)
    for replicas in (1, 2):
        said = []
        sanity.run(sanity.SanityPlan(build=build, build_float32=build, compile_args={"optimizer": "sgd", "loss": "mse"},
                                     train_data=data, replicas=replicas, graph=False), say=said.append)
        assert [s for s in said if "one scalar per example" in s] == ([] if replicas == 1 else [
            "an output is one scalar per example (shape (batch,)): over 2 replicas Keras reports its loss, and "
            "scales its gradients, 2 times too large for a loss that averages over the last axis (mse, ...); give "
            "the output a last axis of 1 (and the labels too)"]), said


@pytest.mark.slow
def test_the_test_figures_under_a_mixed_policy_are_those_of_the_saved_model(tmp_path):
    # The run trains with the output layer in bfloat16 (outputs cast to float32); model.keras computes it in
    # float32 (TensorFlow's mixed precision guide), so metrics.json must report that model, not the other.
    import keras

    y = (1000.0 + X @ RNG.standard_normal((8, 1))).astype("float32")  # bfloat16 holds ~1000 to 4 either way

    def build():
        return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                 keras.layers.Dense(1, bias_initializer=keras.initializers.Constant(1000.0))])

    task = tftrain.ArrayTask(build, X[:64], y[:64], X[64:], y[64:], loss="mse", metrics=["mae"], name="shape")
    record = _fit(task, tmp_path, epochs=2, precision="mixed_bfloat16")
    keras.mixed_precision.set_global_policy("float32")
    saved = keras.models.load_model(tmp_path / "run" / "model.keras")
    assert saved.layers[-1].dtype_policy.name == "float32"
    own = saved.evaluate(X[64:], y[64:], batch_size=32, verbose=0, return_dict=True)
    assert record.test["mae"] == pytest.approx(own["mae"], rel=1e-5)
    assert record.test["loss"] == pytest.approx(own["loss"], rel=1e-5)


@pytest.mark.slow
def test_a_model_whose_output_an_operation_makes_is_saved_under_a_mixed_policy_with_its_output_names(tmp_path):
    import keras

    labels, values = (X[:, 0] > 0).astype("int32"), 2 * X[:, 2:3]

    def build():
        inputs = keras.Input((8,))
        hidden = keras.layers.Dense(16, activation="relu")(inputs)
        probs = keras.ops.softmax(keras.layers.Dense(2)(hidden))  # no layer makes this output
        return keras.Model(inputs, [probs, keras.layers.Dense(1, name="value")(hidden)])

    task = tftrain.ArrayTask(build, X[:64], (labels[:64], values[:64]), X[64:], (labels[64:], values[64:]),
                             loss=["sparse_categorical_crossentropy", "mse"], metrics=[["accuracy"], ["mae"]],
                             name="shape")
    record = _fit(task, tmp_path, precision="mixed_bfloat16")
    keras.mixed_precision.set_global_policy("float32")
    saved = keras.models.load_model(tmp_path / "run" / "model.keras")
    assert saved.output_names == ["softmax", "value"]  # not float32_output_0, _1
    own = saved.evaluate(X[64:], (labels[64:], values[64:]), verbose=0, return_dict=True)
    assert sorted(own) == sorted(record.test) and record.test["value_mae"] == pytest.approx(own["value_mae"], rel=1e-5)
