"""KeepBest's direction rule (`monitor_direction`), the sanity pass's monitor check (`check_monitor`), and
KeepBest on a model of several outputs and as a worker that ranks from the chief's `keep_best.json`."""

import json

import numpy as np
import pytest

from tftrain.callbacks.keep_best import STATE_FILE, KeepBest, check_monitor, monitor_direction
from tftrain.errors import ConfigError


@pytest.mark.parametrize("monitor, direction", [
    ("loss", "min"), ("val_loss", "min"), ("val_value_loss", "min"), ("label_loss", "min"),
    ("accuracy", "max"), ("val_acc", "max"), ("val_label_accuracy", "max"), ("label_acc", "max"),
    ("val_label_sparse_categorical_accuracy", "max"), ("sparse_top_k_categorical_accuracy", "max"),
    ("val_auc", "max"), ("out_precision", "max"), ("recall", "max"), ("val_precision_at_recall", "max"),
    ("f1_score", "max"), ("head_fbeta_score", "max"), ("r2_score", "max"), ("val_seg_mean_io_u", "max"),
    ("binary_io_u", "max"), ("cosine_similarity", "max"), ("true_positives", "max"), ("val_x_true_negatives", "max"),
    ("mae", "min"), ("val_value_mae", "min"), ("value_mse", "min"), ("val_rmse", "min"), ("msle", "min"),
    ("mape", "min"), ("mean_absolute_error", "min"), ("val_value_root_mean_squared_error", "min"),
    ("val_y_mean_anything_error", "min"), ("val_label_sparse_categorical_crossentropy", "min"),
    ("binary_crossentropy", "min"), ("squared_hinge", "min"), ("categorical_hinge", "min"),
    ("kl_divergence", "min"), ("val_poisson", "min"), ("logcosh", "min"), ("false_positives", "min"),
    ("val_out_false_negatives", "min"),
    ("my_metric", None), ("val_custom", None), ("value", None), ("maex", None), ("", None),
])
def test_auto_direction_comes_from_the_name_or_its_part_after_an_output_prefix(monitor, direction):
    assert monitor_direction(monitor) == direction


def test_min_and_max_are_returned_as_they_are_and_other_modes_are_refused():
    assert monitor_direction("my_metric", "max") == "max"
    assert monitor_direction("val_accuracy", "min") == "min"  # the user's word wins
    with pytest.raises(ConfigError, match=r"Invalid monitor mode 'up'. Expected one of: auto, min, max"):
        monitor_direction("val_loss", "up")


def test_check_monitor_names_the_logs_keys_or_the_mode_flag():
    keys = ("loss", "value_mae", "val_loss", "val_value_mae")
    check_monitor("val_value_mae", "auto", keys)
    check_monitor("loss", "min", keys)
    with pytest.raises(ConfigError) as missing:
        check_monitor("val_mae", "auto", keys)
    message = str(missing.value)
    assert "\n" not in message and "'val_mae'" in message and "loss, value_mae, val_loss, val_value_mae" in message
    assert "--monitor KEY" in message
    with pytest.raises(ConfigError) as unknown:
        check_monitor("val_score", "auto", [*keys, "val_score"])
    assert "\n" not in str(unknown.value) and "'val_score'" in str(unknown.value)
    assert "direction is unknown" in str(unknown.value) and "--monitor-mode min or max" in str(unknown.value)
    check_monitor("val_score", "max", [*keys, "val_score"])


def test_keep_best_refuses_an_unknown_direction_when_made(tmp_path):
    with pytest.raises(ConfigError, match=r"direction is unknown.*pass --monitor-mode min or max"):
        KeepBest(tmp_path, keep=1, monitor="val_score")
    assert KeepBest(tmp_path, keep=1, monitor="val_score", mode="max").summary()["mode"] == "max"
    assert KeepBest(tmp_path, keep=1, monitor="val_value_mae").summary() == {
        "monitor": "val_value_mae", "mode": "min", "kept": [], "last": None}
    with pytest.raises(ValueError):
        KeepBest(tmp_path, keep=0)


def _two_outputs():
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    model = keras.Model(inputs, {"value": keras.layers.Dense(1, name="value")(inputs),
                                 "label": keras.layers.Dense(3, activation="softmax", name="label")(inputs)})
    model.compile("sgd", loss={"value": "mse", "label": "sparse_categorical_crossentropy"},
                  metrics={"value": ["mae"], "label": ["accuracy"]})
    return model


@pytest.mark.parametrize("monitor, reverse", [("val_value_mae", False), ("val_label_accuracy", True)])
def test_a_model_of_two_outputs_is_ranked_by_one_output_s_metric(tmp_path, monitor, reverse):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype("float32")
    y = {"value": x[:, :1] * 2, "label": (x[:, 0] > 0).astype("int32")}
    model = _two_outputs()
    best = KeepBest(tmp_path, keep=2, monitor=monitor)
    history = model.fit(x, y, epochs=3, batch_size=16, validation_split=0.25, verbose=0, callbacks=[best])
    values = history.history[monitor]
    assert [k["value"] for k in best.kept] == pytest.approx(sorted(values, reverse=reverse)[:2])
    assert json.loads((tmp_path / STATE_FILE).read_text()) == [
        {**k, "checkpoint": f"best/epoch-{k['epoch']}"} for k in best.kept]  # in the run directory, wherever it is
    assert best.summary()["mode"] == ("max" if reverse else "min") and best.last.endswith("epoch-3")


def test_a_worker_ranks_from_the_chief_s_state_and_never_deletes_its_files(tmp_path):
    import keras

    chief, worker = tmp_path / "chief", tmp_path / "worker"
    (chief / "best").mkdir(parents=True)
    kept = [{"epoch": e, "value": v, "checkpoint": str(chief / "best" / f"epoch-{e}")} for e, v in ((2, 0.1), (1, 0.5))]
    for k in kept:
        (chief / "best" / f"epoch-{k['epoch']}.index").write_text("")
    (chief / STATE_FILE).write_text(json.dumps(kept))

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    best = KeepBest(worker, keep=2, monitor="loss", ranking_from=chief)
    best.set_model(model)
    best.on_train_begin()
    assert [(k["epoch"], k["value"]) for k in best.kept] == [(2, 0.1), (1, 0.5)]  # the chief's ranking
    assert all(k["checkpoint"] == str(worker / "best" / f"epoch-{k['epoch']}") for k in best.kept)
    best.on_epoch_end(2, {"loss": 0.3})  # better than epoch 1: saved here, epoch 1 dropped
    assert [k["epoch"] for k in best.kept] == [2, 3]
    assert (worker / "best" / "epoch-3.index").is_file() and (worker / STATE_FILE).is_file()
    assert sorted(p.name for p in (chief / "best").iterdir()) == ["epoch-1.index", "epoch-2.index"]  # untouched
    best.on_epoch_end(3, {"loss": 0.9})  # worse than both: not saved (as on the chief)
    assert not list((worker / "best").glob("epoch-4*"))


def test_an_epoch_trained_again_after_a_kill_replaces_its_first_ranking(tmp_path):
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    best = KeepBest(tmp_path, keep=2, monitor="loss")
    best.set_model(model)
    best.on_train_begin()
    for epoch, loss in enumerate((0.9, 0.5, 0.2)):  # epochs 1-3 ranked; a kill then came before the backup
        best.on_epoch_end(epoch, {"loss": loss})
    resumed = KeepBest(tmp_path, keep=2, monitor="loss")  # the rerun resumes at the end of epoch 2
    resumed.set_model(model)
    resumed.on_train_begin()
    resumed.on_epoch_end(2, {"loss": 0.3})  # epoch 3 again, trained anew: its first ranking goes
    assert [(k["epoch"], k["value"]) for k in resumed.kept] == [(3, 0.3), (2, 0.5)]
    assert [(k["epoch"], k["value"]) for k in json.loads((tmp_path / STATE_FILE).read_text())] == [(3, 0.3), (2, 0.5)]
    assert sorted(p.stem for p in (tmp_path / "best").glob("*.index")) == ["epoch-2", "epoch-3"]


def test_a_second_fit_with_the_same_callback_ranks_its_epochs_after_the_first_fit_s(tmp_path):
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    best = KeepBest(tmp_path, keep=2, monitor="loss")
    best.set_model(model)
    for losses in ((0.9, 0.5, 0.2), (2.4, 2.6)):  # a second fit, numbered from epoch 0 again, does worse
        best.on_train_begin()
        for epoch, loss in enumerate(losses):
            best.on_epoch_end(epoch, {"loss": loss})
        best.on_train_end()
    assert [(k["epoch"], k["value"]) for k in best.kept] == [(3, 0.2), (2, 0.5)]  # the first fit's, kept
    assert best.last.endswith("epoch-5")
    assert sorted(p.stem for p in (tmp_path / "best").glob("*.index")) == ["epoch-2", "epoch-3"]


def test_a_damaged_kept_checkpoint_and_files_no_ranking_owns_are_removed_when_a_run_resumes(tmp_path):
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    best = KeepBest(tmp_path, keep=2, monitor="loss")
    best.set_model(model)
    best.on_train_begin()
    for epoch, loss in enumerate((0.9, 0.5)):
        best.on_epoch_end(epoch, {"loss": loss})
    (data,) = (tmp_path / "best").glob("epoch-2.data-*")
    data.write_bytes(b"\0" * data.stat().st_size)  # zero-filled: its checksum no longer matches
    (tmp_path / "best" / "epoch-7.data-00000-of-00001").write_bytes(b"x")  # a kill between deleting index and data
    (tmp_path / "best" / "epoch-8_temp").mkdir()  # a kill inside a write
    said = []
    resumed = KeepBest(tmp_path, keep=2, monitor="loss", say=said.append)
    resumed.set_model(model)
    resumed.on_train_begin()
    assert [k["epoch"] for k in resumed.kept] == [1]
    assert [k["epoch"] for k in json.loads((tmp_path / STATE_FILE).read_text())] == [1]
    assert said == [f"keep-best: the kept checkpoint(s) of epoch(s) 2 in {tmp_path / 'best'} could not be read "
                    "(damaged); removed from the ranking"]
    assert sorted(p.name.split(".")[0] for p in (tmp_path / "best").iterdir()) == ["epoch-1", "epoch-1"]


@pytest.mark.parametrize("damage", [b"\0" * 168, b""])  # NUL bytes, or emptied
def test_a_damaged_pointer_to_the_last_checkpoint_is_said_in_one_line_not_printed_raw(tmp_path, capfd, damage):
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    best = KeepBest(tmp_path, keep=1, monitor="loss")
    best.set_model(model)
    best.on_train_begin()
    best.on_epoch_end(0, {"loss": 0.9})
    pointer = tmp_path / "last" / "checkpoint"
    pointer.write_bytes(damage)
    said = []
    resumed = KeepBest(tmp_path, keep=1, monitor="loss", say=said.append)
    resumed.set_model(model)
    resumed.on_train_begin()
    assert said == [f"keep-best: {pointer} was damaged; the last epoch's checkpoint is written again at this run's "
                    "next epoch end"]
    assert "\0" not in "".join(capfd.readouterr()) and resumed.last is None
    resumed.on_epoch_end(1, {"loss": 0.95})
    assert resumed.summary()["last"].endswith("epoch-2") and [k["epoch"] for k in resumed.kept] == [1]


def test_a_copied_run_directory_ranks_and_deletes_its_own_checkpoints_only(tmp_path):
    import shutil

    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    first = KeepBest(tmp_path / "a", keep=1, monitor="loss")
    first.set_model(model)
    first.on_train_begin()
    first.on_epoch_end(0, {"loss": 0.9})
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    copied = KeepBest(tmp_path / "b", keep=1, monitor="loss")
    copied.set_model(model)
    copied.on_train_begin()
    assert copied.kept == [{"epoch": 1, "value": 0.9, "checkpoint": str(tmp_path / "b" / "best" / "epoch-1")}]
    copied.on_epoch_end(1, {"loss": 0.5})  # better: the copy's epoch 1 goes, the original's stays
    assert sorted(p.stem for p in (tmp_path / "b" / "best").glob("*.index")) == ["epoch-2"]
    assert sorted(p.stem for p in (tmp_path / "a" / "best").glob("*.index")) == ["epoch-1"]


def test_the_trainer_ranks_an_epoch_before_its_backup_commits_it(tmp_path):
    import keras

    import tftrain
    from tftrain.callbacks import KeepBest, StepBackup

    def build():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])

    x = np.random.default_rng(0).standard_normal((64, 4)).astype("float32")
    task = tftrain.ArrayTask(build, x, x[:, :1], loss="mse")
    trainer = tftrain.Trainer(task, keep_best=1, verbose=0, run_dir=str(tmp_path / "run"))
    trainer.check(), trainer.setup_runtime(), trainer.bind_task(), trainer.plan_fixed_batch()
    trainer.out_dir = trainer.run_dir
    kinds = [type(c) for c in trainer.make_callbacks().all]
    assert kinds.index(KeepBest) < kinds.index(StepBackup)


def test_an_epoch_without_validation_is_no_missing_monitor_but_a_fit_that_never_logs_it_is_said(tmp_path):
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    said = []
    best = KeepBest(tmp_path, keep=1, say=said.append)
    best.set_model(model)
    best.on_train_begin()
    best.on_epoch_end(0, {"loss": 0.9})  # validation_freq=2: no validation this epoch
    best.on_epoch_end(1, {"loss": 0.5, "val_loss": 0.6})
    best.on_train_end()
    assert said == [] and [k["epoch"] for k in best.kept] == [2]
    best.on_train_begin()
    best.on_epoch_end(0, {"loss": 0.4})  # a fit without validation data
    best.on_train_end()
    assert said == ["keep-best: the epoch logs have no 'val_loss' (they have loss); pass --monitor (monitor= in "
                    "Python) with one of them. Only the last checkpoint is kept."]
