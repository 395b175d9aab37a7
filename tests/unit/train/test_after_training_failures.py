"""A run that has trained is never lost to a step after training: a failing test evaluation still saves the
trained model and metrics.json, and ends the run in one line (exit 1)."""

import json

import numpy as np
import pytest

import tftrain


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

    with pytest.raises(AfterStepFailed, match=r"the test evaluation failed after training \(.*label value of 3"):
        trainer.fit()
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
