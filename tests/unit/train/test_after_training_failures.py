"""A run that has trained is never lost to a step after training: a failing test evaluation still saves the
trained model and metrics.json, and ends the run in one line (exit 1)."""

import json

import numpy as np
import pytest

import tftrain
from tftrain.errors import ConfigError


def _classifier():
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])


def _arrays(n=96, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 4)).astype("float32"), rng.integers(0, 3, n).astype("int64")


def test_a_failing_test_evaluation_keeps_the_trained_model_and_metrics(tmp_path, capsys):
    import tensorflow as tf

    x, y = _arrays()
    bad = y.copy()
    bad[-1] = 3  # in the last test batch: the sanity pass's first batch is good

    task = tftrain.DatasetTask(_classifier, lambda: tf.data.Dataset.from_tensor_slices((x, y)),
                               test=lambda: tf.data.Dataset.from_tensor_slices((x, bad)),
                               loss="sparse_categorical_crossentropy", metrics=["accuracy"], name="late_bad_label")
    run = tmp_path / "run"
    trainer = tftrain.Trainer(task, epochs=2, verbose=0, seed=0, execution="graph", batch_size=32, run_dir=str(run))
    from tftrain.train.after_steps import AfterStepFailed

    with pytest.raises(AfterStepFailed, match=r"the test evaluation failed after training \(.*label value of 3") as e:
        trainer.fit()
    assert "label value of 3" in str(e.value.__cause__)  # its traceback is the evaluation's (failure.log)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["epochs_trained"] == 2 and metrics["evaluation"].startswith("failed: ")
    assert "test_loss" not in metrics and "test_accuracy" not in metrics, metrics
    import keras

    assert keras.models.load_model(run / "model.keras").count_params() == _classifier().count_params()
    assert "test evaluation failed;" in capsys.readouterr().out
    assert not (run / "backup").exists()  # the run is finished: a rerun trains nothing, and overwrites nothing
    from tftrain.rundir import RunDirError

    with pytest.raises(RunDirError, match="holds a finished run"):
        tftrain.Trainer(task, epochs=2, verbose=0, seed=0, execution="graph", batch_size=32,
                        run_dir=str(run)).fit()


@pytest.mark.parametrize("split", ["training", "test"])
def test_a_label_outside_the_output_s_classes_anywhere_in_memory_is_refused_before_training(tmp_path, split):
    x, y = _arrays()
    bad = y.copy()
    bad[-1] = 3  # not in the first batch the sanity pass steps
    arrays = (x, bad, x, y) if split == "training" else (x, y, x, bad)
    task = tftrain.ArrayTask(_classifier, *arrays, loss="sparse_categorical_crossentropy", name="bad_label")
    with pytest.raises(ConfigError, match=f"The {split} labels hold class 3, and the output has 3 classes"):
        tftrain.Trainer(task, epochs=1, verbose=0, seed=0, batch_size=32, run_dir=str(tmp_path / "run")).fit()
    assert not (tmp_path / "run").exists()


def test_the_label_range_check_follows_each_output_s_loss_and_ignore_class():
    import keras

    from tftrain.train.data_checks import check_label_range

    outputs = {"cls": np.zeros((2, 3), "float32"), "value": np.zeros((2, 1), "float32")}
    labels = {"cls": np.array([0, 2, 255]), "value": np.array([[7.0], [9.0]])}  # regression labels are no classes
    losses = {"cls": keras.losses.SparseCategoricalCrossentropy(ignore_class=255), "value": "mse"}
    check_label_range([("training", labels)], losses, outputs, ["cls", "value"])
    with pytest.raises(ConfigError, match="training labels of output 'cls' hold class -1, .* or pass "
                                          r"SparseCategoricalCrossentropy\(ignore_class=-1\)"):
        check_label_range([("training", {**labels, "cls": np.array([0, -1])})], losses, outputs, ["cls", "value"])
    one = np.zeros((2, 3), "float32")
    check_label_range([("test", np.array([0, 2]))], keras.losses.sparse_categorical_crossentropy, one, ["out"])
    with pytest.raises(ConfigError, match="give the output 4 units"):
        check_label_range([("test", np.array([0, 3]))], "sparse_categorical_crossentropy", one, ["out"])
    said = check_label_range([("test", np.array([0.5, 1.0]))], "sparse_categorical_crossentropy", one, ["out"])
    assert said.startswith("the test labels are not whole numbers (0.5, ...)")
    assert check_label_range([("test", np.array([0.0, 2.0]))], "sparse_categorical_crossentropy", one) is None


def _two_outputs():
    import keras

    inputs = keras.Input((4,))
    return keras.Model(inputs, {"out": keras.layers.Dense(3, activation="softmax", name="out")(inputs),
                                "value": keras.layers.Dense(1, name="value")(inputs)})


def test_a_monitor_given_is_checked_even_when_nothing_ranks_by_it(tmp_path):
    x, y = _arrays()
    task = tftrain.ArrayTask(_two_outputs, x, {"out": y, "value": x[:, :1]},
                             loss={"out": "sparse_categorical_crossentropy", "value": "mse"},
                             metrics={"out": ["accuracy"]}, name="two")
    with pytest.raises(ConfigError, match="--monitor 'val_accuracy' is not among the epoch logs' keys .*"
                                          "val_out_accuracy"):
        tftrain.Trainer(task, epochs=1, verbose=0, seed=0, batch_size=32, validation_split=0.25,
                        monitor="val_accuracy", run_dir=str(tmp_path / "run")).fit()
    assert not (tmp_path / "run").exists()


def test_keep_best_s_default_monitor_the_logs_lack_is_said_as_the_default(tmp_path):
    import keras

    class OwnTestStep(keras.Sequential):
        def test_step(self, data):
            x, y = data
            return {"my_error": keras.ops.mean(keras.ops.abs(self(x) - y))}

    def build():
        return OwnTestStep([keras.Input((4,)), keras.layers.Dense(1)])

    x, _ = _arrays()
    task = tftrain.ArrayTask(build, x, x[:, :1], loss="mse", name="own_test_step")
    with pytest.raises(ConfigError, match=r"^--keep-best ranks by val_loss when no --monitor is given, and the epoch "
                                          r"logs have no val_loss \(.*val_my_error\)"):
        tftrain.Trainer(task, epochs=1, verbose=0, seed=0, batch_size=32, validation_split=0.25, keep_best=1,
                        run_dir=str(tmp_path / "run")).fit()


@pytest.mark.parametrize("flags, said", [({"tune": 2}, "--tune needs at least 32 training examples per trial"),
                                         ({"batch_size": "auto"}, None)])
def test_fewer_examples_than_a_default_batch_reach_the_searches_own_checks(tmp_path, flags, said):
    x, y = _arrays(40)
    task = tftrain.ArrayTask(_classifier, x, y, loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                             name="small")
    trainer = tftrain.Trainer(task, epochs=1, verbose=0, seed=0, validation_split=0.25,
                              run_dir=str(tmp_path / "run"), **flags)
    if said is None:
        assert trainer.fit().epochs_trained == 1
        return
    with pytest.raises(ConfigError, match=said):
        trainer.fit()


def test_a_monitor_mode_against_the_metric_s_name_is_said(tmp_path, capsys):
    x, y = _arrays()
    task = tftrain.ArrayTask(_classifier, x, y, loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                             name="mode")
    tftrain.Trainer(task, epochs=1, verbose=2, seed=0, batch_size=32, validation_split=0.25, keep_best=1,
                    monitor="val_accuracy", monitor_mode="min", run_dir=str(tmp_path / "run")).fit()
    assert ("--monitor-mode min: val_accuracy is taken as improving as it falls, where its name says it rises"
            in capsys.readouterr().err)


def test_a_validation_monitor_without_validation_data_names_the_fix(tmp_path):
    x, y = _arrays()
    task = tftrain.ArrayTask(_classifier, x, y, loss="sparse_categorical_crossentropy", name="no_validation")
    with pytest.raises(ConfigError, match="--monitor 'val_loss' is a validation metric, and the run has no "
                                          "validation data: pass --validation-split F"):
        tftrain.Trainer(task, epochs=1, verbose=0, seed=0, batch_size=32, monitor="val_loss",
                        run_dir=str(tmp_path / "run")).fit()


def test_a_monitor_mode_without_a_monitor_leaves_early_stopping_on_val_loss_falling(tmp_path):
    x, y = _arrays()
    task = tftrain.ArrayTask(_classifier, x, y, loss="sparse_categorical_crossentropy", name="mode_alone")
    record = tftrain.Trainer(task, epochs=2, verbose=0, seed=0, batch_size=32, validation_split=0.25,
                             early_stopping=1, monitor_mode="max", run_dir=str(tmp_path / "run")).fit()
    stop = record.to_dict()["early_stopping"]
    assert stop["best"] == pytest.approx(min(record.history["val_loss"]))


def test_a_stop_signal_once_the_run_is_written_ends_it_complete_not_stopped(tmp_path, monkeypatch):
    import signal

    from tftrain.train import reporting

    x, y = _arrays()
    task = tftrain.ArrayTask(_classifier, x, y, loss="sparse_categorical_crossentropy", name="written")
    make_record, calls = reporting.make_record, []

    def signalled_at_the_report(*args, **kwargs):  # the second record is the report's, after metrics.json
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGTERM)
        return make_record(*args, **kwargs)

    monkeypatch.setattr(reporting, "make_record", signalled_at_the_report)
    before = signal.getsignal(signal.SIGTERM)
    try:
        record = tftrain.Trainer(task, epochs=1, verbose=0, seed=0, batch_size=32,
                                 run_dir=str(tmp_path / "run")).fit()
    finally:
        signal.signal(signal.SIGTERM, before)  # the watch ends a signalled run ignoring later ones
    assert len(calls) == 2 and record.epochs_trained == 1 and (tmp_path / "run" / "metrics.json").is_file()
