"""--keep-best N keeps the N best epochs' weights (and the last) as TensorFlow checkpoints, across
resumes; --init-from starts a run from a .keras file, a checkpoint or a run directory's best."""

import json

import numpy as np
import pytest

import tftrain
from tftrain.errors import ConfigError


def _model(width=8):
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(width, activation="relu"), keras.layers.Dense(1)])


def _task(width=8):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 0.0], "float32"))[:, None]
    return tftrain.ArrayTask(lambda: _model(width), x, y, x[:64], y[:64], loss="mse", optimizer="sgd",
                             learning_rate=0.02, name="keep", metrics=["mae"])


def _fit(tmp_path, name, width=8, **overrides):
    overrides = {"epochs": 5, "verbose": 0, "seed": 0, "batch_size": 32, "execution": "graph",
                 "validation_split": 0.25, "run_dir": str(tmp_path / name), **overrides}
    return tftrain.Trainer(_task(width), **overrides).fit()


@pytest.mark.slow
def test_the_best_epochs_by_val_loss_and_the_last_are_kept_and_recorded(tmp_path):
    record = _fit(tmp_path, "run", keep_best=2)
    kept = record.extras["keep_best"]["kept"]
    losses = record.history["val_loss"]
    best_two = sorted(range(len(losses)), key=lambda e: losses[e])[:2]
    assert [k["epoch"] for k in kept] == [e + 1 for e in best_two]  # best first, 1-based epochs
    assert [k["value"] for k in kept] == pytest.approx([losses[e] for e in best_two])
    checkpoints = tmp_path / "run" / "checkpoints"
    assert {p.name.split(".")[0] for p in (checkpoints / "best").glob("*.index")} == \
        {f"epoch-{e + 1}" for e in best_two}  # the others were deleted
    assert record.extras["keep_best"]["last"].endswith("epoch-5")
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["keep_best"]["monitor"] == "val_loss" and metrics["keep_best"]["mode"] == "min"


@pytest.mark.slow
def test_kept_checkpoints_survive_a_resumed_run_and_higher_is_better_for_accuracy_like_metrics(tmp_path):
    import keras
    import tensorflow as tf

    from tftrain.callbacks import KeepBest

    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 4)).astype("float32")
    y = (x[:, :1] > 0).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile("sgd", "binary_crossentropy", metrics=["accuracy"])
    weights = {}  # epoch (1-based) -> the weights at its end
    remember = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: weights.update({e + 1: model.get_weights()}))
    before = model.fit(x, y, epochs=2, verbose=0, callbacks=[KeepBest(tmp_path, keep=2, monitor="accuracy"), remember])
    again = KeepBest(tmp_path, keep=2, monitor="accuracy")  # the resumed run reads the ranking back
    after = model.fit(x, y, epochs=4, initial_epoch=2, verbose=0, callbacks=[again, remember])
    accuracies = before.history["accuracy"] + after.history["accuracy"]  # epochs 1-4
    assert again.summary()["mode"] == "max"
    assert [k["value"] for k in again.kept] == pytest.approx(sorted(accuracies, reverse=True)[:2])
    assert all(accuracies[k["epoch"] - 1] == pytest.approx(k["value"]) for k in again.kept)
    best = again.kept[0]
    restored = keras.models.clone_model(model)
    tf.train.Checkpoint(model=restored).read(best["checkpoint"]).expect_partial()
    for got, saved in zip(restored.get_weights(), weights[best["epoch"]]):  # the best epoch's own weights
        np.testing.assert_array_equal(got, saved)


@pytest.mark.slow
def test_a_damaged_ranking_is_rebuilt_from_the_kept_checkpoints_and_the_epoch_log_with_one_line(tmp_path):
    import keras

    from tftrain.callbacks import KeepBest

    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 0.0], "float32"))[:, None]
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    history = tmp_path / "history.csv"
    logger = keras.callbacks.CSVLogger(str(history), append=True)
    checkpoints = tmp_path / "checkpoints"
    model.fit(x, y, epochs=3, verbose=0, callbacks=[logger, KeepBest(checkpoints, keep=2, monitor="loss")])
    state = checkpoints / "keep_best.json"
    ranked = json.loads(state.read_text())
    state.write_text(state.read_text()[:50])  # cut by a kill or a bad disk
    said = []
    worker = KeepBest(tmp_path / "worker-1", keep=1, monitor="loss", say=said.append, ranking_from=checkpoints,
                      history_file=history)  # a non-chief reads the ranking its chief is repairing
    model.fit(x, y, epochs=3, initial_epoch=3, verbose=0, callbacks=[worker])
    assert [k["epoch"] for k in worker.kept] == [3] and not said  # the chief's ranking, said by the chief only
    assert worker.kept[0]["checkpoint"] == str(tmp_path / "worker-1" / "best" / "epoch-3")
    assert len(list((checkpoints / "best").glob("*.index"))) == 2  # the chief's files are left to the chief
    again = KeepBest(checkpoints, keep=1, monitor="loss", say=said.append, history_file=history)
    model.fit(x, y, epochs=3, initial_epoch=3, verbose=0, callbacks=[again])  # no epoch: the ranking read back
    assert len(said) == 1 and "keep_best.json was damaged" in said[0] and "epochs 3" in said[0], said
    assert [k["epoch"] for k in again.kept] == [ranked[0]["epoch"]] == [3]  # the loss falls: the last is best
    assert again.kept[0]["value"] == pytest.approx(ranked[0]["value"])
    assert {p.name.split(".")[0] for p in (checkpoints / "best").glob("*.index")} == {"epoch-3"}  # beyond keep
    assert json.loads(state.read_text()) == [{**k, "checkpoint": "best/epoch-3"} for k in again.kept]


@pytest.mark.slow
def test_init_from_a_run_directory_starts_from_its_best_weights(tmp_path):
    first = _fit(tmp_path, "first", keep_best=1)
    again = _fit(tmp_path, "again", epochs=1, init_from=str(tmp_path / "first"))
    scratch = _fit(tmp_path, "scratch", epochs=1)
    assert again.extras["init_from"]["kind"] == "checkpoint"
    assert again.extras["init_from"]["path"] == first.extras["keep_best"]["kept"][0]["checkpoint"]
    assert again.history["loss"][0] < scratch.history["loss"][0]  # it did not start from scratch
    from_file = _fit(tmp_path, "from-file", epochs=1, init_from=str(tmp_path / "first" / "model.keras"))
    assert from_file.extras["init_from"]["kind"] == "keras" and from_file.history["loss"][0] < scratch.history["loss"][0]


@pytest.mark.slow
def test_init_from_weights_of_another_model_names_the_first_weight_that_differs(tmp_path):
    _fit(tmp_path, "narrow", epochs=1, keep_best=1)
    with pytest.raises(ConfigError, match=r"--init-from .*model\.keras: this model's weight .*kernel has shape "
                                          r"\(4, 16\), the file's .*\(4, 8\)"):
        _fit(tmp_path, "wide", width=16, epochs=1, init_from=str(tmp_path / "narrow" / "model.keras"))
    with pytest.raises(ConfigError, match="the checkpoint does not fit this model"):
        _fit(tmp_path, "wide2", width=16, epochs=1, init_from=str(tmp_path / "narrow"))


@pytest.mark.slow
def test_a_run_started_from_init_weights_resumes_from_its_checkpoint_after_their_file_moved(tmp_path, capsys):
    import keras

    class Kill(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise KeyboardInterrupt  # after epoch 2's checkpoint

    _fit(tmp_path, "source", epochs=1)
    with pytest.raises(tftrain.Interrupted):
        tftrain.Trainer(_task(), epochs=4, verbose=0, seed=0, batch_size=32, execution="graph", callbacks=[Kill()],
                        init_from=str(tmp_path / "source" / "model.keras"), run_dir=str(tmp_path / "run")).fit()
    (tmp_path / "source").rename(tmp_path / "moved")
    capsys.readouterr()
    record = _fit(tmp_path, "run", epochs=4, validation_split=0.0, init_from=str(tmp_path / "source" / "model.keras"),
                  verbose=1)
    assert record.to_dict()["resumed_from_epoch"] == 2 and len(record.history["loss"]) == 4
    assert "not read: the run resumes from its own checkpoint" in capsys.readouterr().out
    assert record.extras["init_from"] == {"path": str(tmp_path / "source" / "model.keras"), "kind": None,
                                          "read": "when the run started"}  # metrics.json says where it began


def test_init_from_a_path_without_weights_is_refused_before_the_run_directory(tmp_path):
    with pytest.raises(ConfigError, match="no such .keras or .weights.h5 file, checkpoint"):
        _fit(tmp_path, "run", init_from=str(tmp_path / "missing.keras"))
    assert not (tmp_path / "run").exists()


def test_init_from_a_run_whose_ranking_is_damaged_is_refused_naming_what_to_pass(tmp_path):
    from tftrain.train.init_weights import resolve

    run = tmp_path / "source"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "keep_best.json").write_text("{garbage")
    (run / "model.keras").write_bytes(b"the last epoch's")
    with pytest.raises(ConfigError, match=r"keep_best.json is damaged, so which kept checkpoint is best is unknown: "
                                          r"pass one \(.*best/epoch-N\) or .*model.keras"):
        resolve(str(run))


@pytest.mark.slow
def test_init_from_a_damaged_file_is_refused_in_one_line_naming_it_before_the_run_directory(tmp_path):
    _fit(tmp_path, "source", epochs=1, keep_best=1)
    (data,) = (tmp_path / "source" / "checkpoints" / "best").glob("epoch-1.data-*")
    data.write_bytes(b"\0" * data.stat().st_size)
    (tmp_path / "empty.keras").write_bytes(b"")  # as a machine crash can leave a file being written
    for source in (tmp_path / "source" / "checkpoints" / "best" / "epoch-1", tmp_path / "empty.keras"):
        with pytest.raises(ConfigError, match=rf"^--init-from {source} cannot be read \(\w+: .*\): it is damaged"):
            _fit(tmp_path, "run", epochs=1, init_from=str(source))
        assert not (tmp_path / "run").exists()


def test_keep_best_runs_under_every_strategy_s_loop():
    from tftrain.config import RecipeConfig, RuntimeConfig, TrainConfig
    from tftrain.train.loops import loop_for

    for strategy in ("multi_worker_mirrored", "mirrored", "default", "parameter_server"):
        loop_for(strategy).check(RecipeConfig(runtime=RuntimeConfig(strategy=strategy), train=TrainConfig(keep_best=2)))


@pytest.mark.slow
def test_monitor_mode_sets_the_direction_the_run_ranks_in(tmp_path):
    record = _fit(tmp_path, "run", epochs=3, keep_best=1, monitor="val_mae", monitor_mode="max")
    maes = record.history["val_mae"]
    assert record.extras["keep_best"]["mode"] == "max"
    assert [k["epoch"] for k in record.extras["keep_best"]["kept"]] == [maes.index(max(maes)) + 1]


@pytest.mark.slow
def test_init_from_a_kept_checkpoint_leaves_no_tensorflow_warning(tmp_path):
    from tests.conftest import REPO, run_python

    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from pathlib import Path\n"
            "from tests.unit.train.test_keep_best import _fit\n"
            f"tmp = Path({str(tmp_path)!r})\n"
            "_fit(tmp, 'first', keep_best=1, epochs=2)\n"
            "_fit(tmp, 'again', epochs=1, init_from=str(tmp / 'first'))\n"
            "import gc; gc.collect()\n")
    done = run_python(code, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for warning in ("unrestored values", "could not be found in the restored object", "save_counter"):
        assert warning not in done.stderr, done.stderr[-3000:]


@pytest.mark.slow
def test_init_from_a_kept_checkpoint_takes_its_weights_and_not_its_optimizer(tmp_path):
    # The kept checkpoint of a cosine run holds its optimizer at the schedule's end (learning rate 0) and,
    # under gradient accumulation, a step counter of another dtype: neither may reach the new run.
    _fit(tmp_path, "first", epochs=2, keep_best=1, lr_schedule="cosine")
    again = _fit(tmp_path, "again", epochs=2, lr_schedule="cosine", init_from=str(tmp_path / "first"))
    losses = again.history["loss"]
    assert losses[1] < losses[0], losses  # it trains: its optimizer starts at step 0 of its own schedule
    accumulated = _fit(tmp_path, "accumulated", epochs=1, gradient_accumulation_steps=2,
                       init_from=str(tmp_path / "first"))
    assert accumulated.extras["init_from"]["kind"] == "checkpoint" and np.isfinite(accumulated.history["loss"][0])
