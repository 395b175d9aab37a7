"""The Trainer's stages in this process (default strategy), each on a tiny model."""

import json
import time
from pathlib import Path

import numpy as np
import pytest

import tftrain
from tests.conftest import REPO
from tftrain.errors import ConfigError, RunDirError


def _model():
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])


def _task(n=512, **kw):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 0.0], "float32"))[:, None]
    return tftrain.ArrayTask(_model, x, y, x[:64], y[:64], loss="mse", optimizer="sgd", metrics=["mae"],
                             learning_rate=0.05, name="tiny", **kw)


def _trainer(tmp_path, **overrides):
    overrides = {"epochs": 2, "verbose": 0, "seed": 0, "execution": "graph", "run_dir": str(tmp_path / "run"),
                 **overrides}
    return tftrain.Trainer(_task(), **overrides)


@pytest.mark.slow
def test_fit_writes_the_run_directory_and_returns_the_record(tmp_path):
    record = _trainer(tmp_path, validation_split=0.25).fit()
    run = tmp_path / "run"
    assert {p.name for p in run.iterdir()} >= {"config.yaml", "logs", "model.keras", "metrics.json", "report.md"}
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test_loss"] == pytest.approx(record.test["loss"]) and "test_mae" in metrics
    assert record.train_examples == 384 and record.steps_per_epoch == 384 // 128  # default 128 per replica
    assert record.history["loss"][-1] < record.history["loss"][0]  # it learns
    assert "val_loss" in record.history and record.epochs_trained == 2
    assert metrics["task"] == "tiny" and metrics["execution"] == "graph"


@pytest.mark.slow
def test_a_finished_run_directory_is_never_overwritten(tmp_path, monkeypatch):
    monkeypatch.setenv("TFTRAIN_RUN_ID", "job-1")  # as tftrain.launch sets it
    _trainer(tmp_path, epochs=1).fit()
    before = (tmp_path / "run" / "metrics.json").read_text()
    with pytest.raises(RunDirError, match="holds a finished run"):
        _trainer(tmp_path, epochs=1).fit()
    # A scheduler's restart of the job that finished the run: nothing to train, nothing rewritten, and the
    # backup a kill after metrics.json left behind is removed as the finished attempt would have.
    (tmp_path / "run" / "backup").mkdir()
    monkeypatch.setenv("TFTRAIN_RESTART_COUNT", "1")
    with pytest.raises(tftrain.AlreadyFinished, match="finished before this restart"):
        _trainer(tmp_path, epochs=1).fit()
    assert (tmp_path / "run" / "metrics.json").read_text() == before and not (tmp_path / "run" / "backup").exists()
    monkeypatch.setenv("TFTRAIN_RUN_ID", "job-2")  # another job's restart is no restart of this run
    with pytest.raises(RunDirError, match="holds a finished run"):
        _trainer(tmp_path, epochs=1).fit()


def test_batch_plan_uses_the_task_default_and_fits_a_batch_to_few_examples(tmp_path, capsys):
    trainer = tftrain.Trainer(_task(default_batch_size=64), verbose=0, run_dir=str(tmp_path / "r"))
    trainer.check(), trainer.setup_runtime(), trainer.bind_task(), trainer.plan_fixed_batch()
    assert (trainer.batch.global_batch_size, trainer.steps_per_epoch) == (64, 8)
    small = tftrain.Trainer(_task(), verbose=1, run_dir=str(tmp_path / "s"), batch_size=1024)
    small.check(), small.setup_runtime(), small.bind_task()
    small.plan_fixed_batch()  # fewer examples than a batch: one step of all of them, as Keras's fit takes
    n = small.task.num_train_examples
    assert (small.batch.global_batch_size, small.steps_per_epoch) == (n, 1)
    assert f"{n} training examples are fewer than a global batch of 1024" in capsys.readouterr().out
    accumulated = tftrain.Trainer(_task(), verbose=0, run_dir=str(tmp_path / "a"), batch_size=1024,
                                  gradient_accumulation_steps=n + 1)
    accumulated.check(), accumulated.setup_runtime(), accumulated.bind_task()
    with pytest.raises(ConfigError, match="not one full step"):  # not one example per micro-batch
        accumulated.plan_fixed_batch()


def test_tune_without_validation_data_is_refused_before_the_run_directory(tmp_path):
    with pytest.raises(ConfigError, match="--tune scores trials on validation data"):
        _trainer(tmp_path, tune=1).fit()
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_user_callbacks_run_after_tftrain_s_own(tmp_path):
    import keras

    seen = []

    class Spy(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(sorted(logs))

    trainer = tftrain.Trainer(_task(), callbacks=[Spy()], epochs=1, verbose=0, execution="graph",
                              run_dir=str(tmp_path / "run"))
    trainer.fit()
    assert seen == [["loss", "mae"]]


@pytest.mark.slow
def test_execution_auto_times_graph_and_xla_on_the_run_s_own_training_steps(tmp_path, fresh_execution_memory,
                                                                              xla_always_timed):
    record = _trainer(tmp_path, execution="auto", epochs=3, batch_size=16).fit()  # 96 steps: enough for both
    choice = record.execution_choice
    assert record.execution == choice["execution"] and set(choice["timings"]) == {"graph", "xla"}
    assert choice["trial"]["complete"] and 0 < choice["trial"]["steps"] <= 96  # they trained the model
    assert record.history["loss"][-1] < record.history["loss"][0]


@pytest.mark.slow
def test_a_run_too_short_to_time_on_trains_in_graph_and_says_so(tmp_path, fresh_execution_memory):
    record = _trainer(tmp_path, execution="auto", epochs=1).fit()  # 4 steps
    assert record.execution == "graph" and record.execution_choice["timings"] == {}
    assert "training steps are too few to time the candidates on" in record.execution_choice["reason"]


@pytest.mark.slow
def test_execution_auto_remembers_its_choice_for_the_same_model_and_batch(tmp_path, monkeypatch,
                                                                          fresh_execution_memory, xla_always_timed):
    from tftrain.runtime.execution_trial import ExecutionTrial

    timed = []
    real = ExecutionTrial.install
    monkeypatch.setattr(ExecutionTrial, "install", lambda self: timed.append(1) or real(self))
    fit = {"execution": "auto", "epochs": 3, "batch_size": 16}
    first = _trainer(tmp_path / "a", **fit).fit()
    again = _trainer(tmp_path / "b", **fit).fit()
    assert len(timed) == 1 and first.execution_choice["remembered"] is None
    assert again.execution_choice["remembered"] and again.execution == first.execution
    assert {k: v["step_time_s"] for k, v in again.execution_choice["timings"].items()} == \
        {k: v["step_time_s"] for k, v in first.execution_choice["timings"].items()}
    # A remembered XLA is compiled before fit (which reuses the function), and that call's seconds are kept.
    compiled = again.execution_choice["compiled_before_fit_s"]
    assert (compiled > 0) if again.execution == "xla" else compiled is None
    _trainer(tmp_path / "c", **{**fit, "batch_size": 8}).fit()  # another batch: timed again
    retimed = _trainer(tmp_path / "d", **fit, remember_execution=False).fit()
    assert len(timed) == 3 and retimed.execution_choice["remembered"] is None


@pytest.mark.slow
def test_steps_per_execution_auto_is_timed_from_8_steps_per_call_on_one_replica(tmp_path, fresh_execution_memory):
    trainer = _trainer(tmp_path, steps_per_execution="auto", epochs=6, batch_size=16)  # 32 batches an epoch
    record = trainer.fit()
    chosen = record.execution_choice["steps_per_execution"]
    assert trainer.runtime.steps_per_execution == 8  # compiled with the rule's count, then timed
    assert record.runtime["steps_per_execution"] == chosen and chosen in (8, 32)
    assert set(record.execution_choice["timings"]) == {"graph", "graph, 32 steps/execution"}
    assert "steps_per_execution=8 (auto)" in "\n".join(trainer.runtime.describe())
    assert "steps_per_execution: auto" in (tmp_path / "run" / "config.yaml").read_text()


def test_overrides_must_name_config_fields():
    with pytest.raises(ConfigError, match="Unknown config field 'epoch'"):
        tftrain.Trainer(_task(), epoch=3)
    with pytest.raises(ConfigError, match="Trainer needs a tftrain.Task"):
        tftrain.Trainer(object())


@pytest.mark.slow
def test_multi_output_model_with_a_loss_per_output(tmp_path):
    import keras

    def build():
        inputs = keras.Input((4,))
        hidden = keras.layers.Dense(8, activation="relu")(inputs)
        return keras.Model(inputs, {"a": keras.layers.Dense(1, name="a")(hidden),
                                    "b": keras.layers.Dense(1, name="b")(hidden)})

    x = np.random.default_rng(0).standard_normal((256, 4)).astype("float32")
    y = {"a": x[:, :1], "b": x[:, 1:2] * 3}
    task = tftrain.ArrayTask(build, x, y, x[:32], {"a": y["a"][:32], "b": y["b"][:32]},
                             loss={"a": "mse", "b": "mae"}, optimizer="adam", learning_rate=0.01)
    record = tftrain.Trainer(task, epochs=3, verbose=0, execution="graph", batch_size=32,
                             run_dir=str(tmp_path / "run")).fit()
    assert {"loss", "a_loss", "b_loss"} <= set(record.test)
    assert record.history["loss"][-1] < record.history["loss"][0]


def test_a_model_that_overrides_train_step_works_unchanged(tmp_path):
    import keras
    import tensorflow as tf

    class HalfStep(keras.Model):
        """Its own train_step: a gradient step with a custom logged value."""

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            return {"custom_loss": loss}

    def build():
        inputs = keras.Input((4,))
        return HalfStep(inputs, keras.layers.Dense(1)(inputs))

    x = np.random.default_rng(0).standard_normal((256, 4)).astype("float32")
    task = tftrain.ArrayTask(build, x, x[:, :1] * 2, loss="mse", optimizer="sgd", learning_rate=0.1)
    record = tftrain.Trainer(task, epochs=2, verbose=0, execution="graph", batch_size=32,
                             run_dir=str(tmp_path / "run")).fit()
    assert set(record.history) == {"custom_loss"}
    assert record.history["custom_loss"][-1] < record.history["custom_loss"][0]


@pytest.mark.slow
def test_batch_size_auto_searches_then_keeps_its_choice_for_a_resumed_run(tmp_path):
    trainer = _trainer(tmp_path, batch_size="auto", epochs=1)
    record = trainer.fit()
    search = record.extras["batch_size_search"]
    assert record.global_batch_size == search["batch_size"] and len(search["trials"]) >= 2
    plan = json.loads((tmp_path / "run" / "batch_plan.json").read_text())
    assert plan["batch_size"] == record.global_batch_size
    assert "auto" in (tmp_path / "run" / "config.yaml").read_text()  # the run directory keeps what was asked
    assert trainer.config.data.batch_size == "auto"  # the input is never replaced: the choice is in `resolved`
    assert trainer.resolved.data.batch_size == record.global_batch_size


@pytest.mark.slow
def test_tune_runs_trials_on_validation_data_and_trains_the_best(tmp_path):
    trainer = _trainer(tmp_path, tune=2, validation_split=0.25, epochs=1)
    record = trainer.fit()
    tuning = record.extras["tuning"]
    assert trainer.config.train.learning_rate is None and trainer.config.run_dir == str(tmp_path / "run")
    assert trainer.resolved.train.learning_rate == pytest.approx(tuning["best"]["learning_rate"])
    assert tuning["trials"] == 2 and tuning["objective"] == "val_loss"
    assert record.global_batch_size == tuning["best"]["batch_size"]
    assert record.learning_rate == pytest.approx(tuning["best"]["learning_rate"])
    assert 0.005 <= record.learning_rate <= 0.5  # searched around the task's 0.05


@pytest.mark.slow
def test_tune_says_so_when_every_trial_failed(tmp_path):
    import keras

    class FailsInTraining(keras.layers.Layer):
        def call(self, x, training=None):
            if training:
                raise RuntimeError("this layer cannot train")
            return x

    builds = []

    def broken_model():  # the sanity pass's model trains (a model that never does is refused there); the trials' fail
        builds.append(1)
        return keras.Sequential([keras.Input((4,)), *([FailsInTraining()] if len(builds) > 1 else []),
                                 keras.layers.Dense(1)])

    x, y = np.ones((64, 4), "float32"), np.ones((64, 1), "float32")
    task = tftrain.ArrayTask(broken_model, x, y, loss="mse", name="broken")
    trainer = tftrain.Trainer(task, tune=2, validation_split=0.25, epochs=1, verbose=0, execution="graph",
                              run_dir=str(tmp_path / "run"))
    from tftrain.errors import TuningFailed

    with pytest.raises(TuningFailed, match="keras-tuner finished no trial"):  # not a TypeError on a None score
        trainer.fit()


def test_evaluate_save_and_report_stages(tmp_path, capsys):
    import keras

    trainer = _trainer(tmp_path, epochs=1, verbose=1)
    record = trainer.fit()
    out = capsys.readouterr().out
    assert f"test loss {record.test['loss']:.4f}, test mae {record.test['mae']:.4f}" in out
    assert keras.models.load_model(tmp_path / "run" / "model.keras").count_params() == 49
    assert "| Test mae |" in (tmp_path / "run" / "report.md").read_text()


def test_mixed_precision_keeps_a_subclassed_model_and_casts_a_functional_one(tmp_path):
    import types

    import keras

    class Custom(keras.Model):
        pass

    trainer = _trainer(tmp_path)
    trainer.precision = types.SimpleNamespace(info=types.SimpleNamespace(compute_dtype="float16"))
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(1, dtype="float16")(inputs)
    custom = Custom(inputs, outputs)
    assert trainer._float32_outputs(custom) is custom
    cast = trainer._float32_outputs(keras.Model(inputs, outputs))
    assert str(cast.outputs[0].dtype) == "float32"


def test_a_config_file_path_is_laid_over_the_task_defaults(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("train: {epochs: 7}\n")
    trainer = tftrain.Trainer(_task(), str(path), verbose=0)
    assert trainer.config.train.epochs == 7 and trainer.config.train.verbose == 0
    with pytest.raises(ConfigError, match="config must be a RecipeConfig or a recipe file path"):
        tftrain.Trainer(_task(), 3)
    # File and keyword arguments are judged together: 2 CPU replicas need the mirrored strategy given here.
    path.write_text("runtime: {cpu_replicas: 2}\n")
    trainer = tftrain.Trainer(_task(), str(path), strategy="mirrored")
    assert trainer.config.runtime.strategy == "mirrored" and trainer.config.runtime.cpu_replicas == 2
    with pytest.raises(ConfigError, match="Unknown config field 'strategie'"):
        tftrain.Trainer(_task(), str(path), strategie="mirrored")


def test_hyperparameters_named_like_metrics_keys_are_refused():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class HP:
        devices: int = 1

    with pytest.raises(ConfigError, match="Task hyperparameter 'devices' has the name of a metrics.json key"):
        tftrain.Trainer(_task(hparams=HP()))


def test_multi_process_loops_need_the_number_of_training_examples(tmp_path):
    import tensorflow as tf

    task = tftrain.DatasetTask(_model, lambda: tf.data.Dataset.range(10).map(lambda i: (tf.zeros(4), 0.0))
                               .filter(lambda x, y: True), loss="mse")
    trainer = tftrain.Trainer(task, verbose=0, run_dir=str(tmp_path / "r"))
    trainer.loop = tftrain.train.MultiWorkerLoop()
    trainer.check(), trainer.setup_runtime(), trainer.bind_task()
    with pytest.raises(ConfigError, match="needs steps per epoch that every task agrees on"):
        trainer.check_task()


@pytest.mark.slow
def test_python_api_on_the_regression_example_file(tmp_path):
    from tftrain import run

    task = run.load_task(str(REPO / "examples" / "regression.py") + ":task")
    record = tftrain.Trainer(task, epochs=2, train_examples=2048, verbose=0, execution="graph", hidden=16,
                             run_dir=str(tmp_path / "run")).fit()
    assert record.hparams["hidden"] == 16 and record.test["loss"] < record.history["loss"][0]
    assert record.test["loss"] < 2.0  # predicting the mean gives about 2.2
    assert (tmp_path / "run" / "metrics.json").is_file()


def test_an_unfinished_run_of_another_task_is_refused(tmp_path):
    from tftrain import config as config_lib
    from tftrain import rundir

    first = _trainer(tmp_path)
    first.check()  # the run directory as an interrupted run of this config would leave it ...
    rundir.create_run_dir(first.run_dir, config_lib.to_yaml(first.config))
    (tmp_path / "run" / "task.json").write_text(json.dumps({"name": "other", "class": "ArrayTask", "hparams": None}))
    with pytest.raises(RunDirError, match="holds a run of task 'other' \\(ArrayTask\\); this is task 'tiny'"):
        _trainer(tmp_path).fit()  # ... but of another task: refused before anything is written
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".tftrain.config-sha256", "config.yaml", "task.json"]


def test_a_damaged_task_file_is_said_and_written_again(tmp_path, capsys):
    from tftrain import config as config_lib
    from tftrain import rundir

    first = _trainer(tmp_path, verbose=1, epochs=1)
    first.check()  # the run directory as an interrupted run of this config would leave it ...
    rundir.create_run_dir(first.run_dir, config_lib.to_yaml(first.config))
    (tmp_path / "run" / "task.json").write_bytes(b"\x00\x00garbage")  # ... with its task file damaged
    _trainer(tmp_path, verbose=1, epochs=1).fit()
    assert f"{tmp_path / 'run' / 'task.json'} is damaged; this run writes it again" in capsys.readouterr().err
    assert json.loads((tmp_path / "run" / "task.json").read_text())["name"] == "tiny"


@pytest.mark.slow
def test_the_run_directory_names_its_task(tmp_path):
    _trainer(tmp_path, epochs=1).fit()
    assert json.loads((tmp_path / "run" / "task.json").read_text()) == {
        "name": "tiny", "class": "ArrayTask", "hparams": None}


@pytest.mark.parametrize("overrides, message", [
    ({"strategy": "mirrored", "communication": "ring"}, "communication='ring' applies to multi_worker_mirrored only"),
    ({"strategy": "default", "ps_tasks": 2}, "ps_tasks=2 applies to parameter_server only"),
])
def test_flags_a_strategy_ignores_are_refused(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        _trainer(tmp_path, **overrides)


def test_a_parameter_server_worker_serves_on_the_asked_devices(tmp_path, monkeypatch):
    from tftrain import runtime
    from tftrain.runtime.cluster import ClusterInfo

    import signal

    calls = []
    monkeypatch.setattr(runtime, "configure_devices", lambda device, *a: calls.append(("devices", device)))
    monkeypatch.setattr(runtime, "serve", lambda cluster, *a, **k: calls.append(
        ("serve", cluster.task, signal.getsignal(signal.SIGTERM))))
    trainer = _trainer(tmp_path, strategy="parameter_server", device="cpu")
    trainer.cluster = ClusterInfo({"chief": ("127.0.0.1:1",), "worker": ("127.0.0.1:2",), "ps": ("127.0.0.1:3",)},
                                  "worker", 0)
    before = signal.getsignal(signal.SIGTERM)
    trainer.serve()
    # While it serves, SIGTERM only prints a line (the chief saves and says the job stopped); afterwards the process
    # (here the test's worker, which later tests signal through) has its handler back.
    assert calls[0] == ("devices", "cpu") and calls[1][:2] == ("serve", "worker:0")
    assert callable(calls[1][2]) and calls[1][2] not in (before, signal.SIG_DFL)
    assert signal.getsignal(signal.SIGTERM) == before != calls[1][2]


def test_resume_finds_the_newest_unfinished_run_of_the_same_settings(tmp_path, monkeypatch):
    import keras

    monkeypatch.chdir(tmp_path)  # default run directories go under ./runs

    class StopAfterOneEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise KeyboardInterrupt

    x = np.random.default_rng(0).standard_normal((128, 4)).astype("float32")

    def trainer(**kw):
        task = tftrain.ArrayTask(lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]), x, x[:, :1],
                                 loss="mse", optimizer="sgd", name="resumable")
        return tftrain.Trainer(task, epochs=2, verbose=0, execution="graph", batch_size=32, **kw)

    with pytest.raises(RunDirError, match="--resume found no unfinished run of task 'resumable'"):
        trainer(resume=True).fit()
    class StopAtOnce(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        trainer(callbacks=[StopAfterOneEpoch()]).fit()
    (interrupted,) = (tmp_path / "runs").iterdir()
    time.sleep(1.1)  # a newer run directory
    with pytest.raises(KeyboardInterrupt):  # a newer run, stopped before its first checkpoint: nothing to resume
        trainer(callbacks=[StopAtOnce()]).fit()
    record = trainer(resume=True).fit()
    assert record.run_dir == str(Path("runs") / interrupted.name) and record.resumed_from_epoch == 1
    assert (interrupted / "metrics.json").is_file()


def test_another_tasks_run_directory_is_refused_by_task_before_settings(tmp_path):
    import keras

    class StopAfterOneEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise KeyboardInterrupt

    x = np.random.default_rng(0).standard_normal((64, 4)).astype("float32")

    def trainer(name, **kw):
        task = tftrain.ArrayTask(lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]), x, x[:, :1],
                                 loss="mse", optimizer="sgd", name=name)
        return tftrain.Trainer(task, verbose=0, execution="graph", batch_size=32, run_dir=str(tmp_path / "run"), **kw)

    with pytest.raises(KeyboardInterrupt):
        trainer("first", epochs=2, callbacks=[StopAfterOneEpoch()]).fit()
    # Other settings too: naming the settings would send the user to rerun with them, and be refused again.
    with pytest.raises(RunDirError, match="holds a run of task 'first' \\(ArrayTask\\); this is task 'second'"):
        trainer("second", epochs=5).fit()


_DETERMINISTIC_RUNS = """
import json, sys
import keras, numpy as np
import tftrain

x = np.random.default_rng(0).standard_normal((512, 8)).astype("float32")
y = (x[:, :1] * 2 - x[:, 1:2]).astype("float32")

def build():
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dropout(0.3),
                             keras.layers.Dense(1)])

out = []
for name in ("a", "b"):
    task = tftrain.ArrayTask(build, x, y, x[:64], y[:64], loss="mse", optimizer="adam", name="det")
    trainer = tftrain.Trainer(task, epochs=2, verbose=0, batch_size=32, deterministic=True,
                              steps_per_execution="auto", run_dir=sys.argv[1] + "/" + name)
    record = trainer.fit()
    rt = trainer.config.runtime
    out.append({"history": record.history, "test": record.test,
                "settings": [rt.execution, rt.steps_per_execution, trainer.config.seed]})
print(json.dumps(out))
"""


@pytest.mark.slow
def test_deterministic_runs_give_identical_figures(tmp_path):
    # Its own process: TensorFlow's op determinism cannot be switched off again, and under it Keras refuses XLA.
    import os
    import subprocess
    import sys

    from tests.conftest import SUBPROCESS_ENV

    env = {**{k: v for k, v in os.environ.items() if k != "TF_CONFIG"}, **SUBPROCESS_ENV}
    done = subprocess.run([sys.executable, "-c", _DETERMINISTIC_RUNS, str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = json.loads(done.stdout.strip().splitlines()[-1])
    assert a["settings"] == b["settings"] == ["graph", 8, 0]  # nothing chosen by timing, a seed
    assert a["history"] == b["history"] and a["test"] == b["test"]  # shuffle, dropout and weights repeat exactly
    assert a["history"]["loss"][1] < a["history"]["loss"][0]


def test_batch_hooks_lists_the_users_own_per_batch_methods_only():
    import keras

    from tftrain.train.model_facts import batch_hooks

    class Logger(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    class EveryEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            pass

    class MyCheckpoint(keras.callbacks.ModelCheckpoint):
        pass

    lambdas = keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: None)
    assert batch_hooks([Logger(), EveryEpoch(), MyCheckpoint("m.keras"), keras.callbacks.TerminateOnNaN(),
                        lambdas]) == ["Logger.on_train_batch_end", "LambdaCallback.on_train_batch_begin"]


@pytest.mark.slow
def test_a_per_batch_callback_sees_every_batch_under_auto_steps_per_execution(tmp_path, capsys):
    import keras

    batches = []

    class Logger(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            batches.append(batch)

    trainer = tftrain.Trainer(_task(), callbacks=[Logger()], epochs=2, verbose=1, execution="graph",
                              steps_per_execution="auto", batch_size=32, run_dir=str(tmp_path / "run"))
    trainer.fit()
    assert batches == list(range(16)) * 2  # 512 examples / 32, every batch of both epochs
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["steps_per_execution"] == 1
    assert "Logger.on_train_batch_end runs every batch" in capsys.readouterr().out


def test_class_weight_is_refused_in_one_line_unless_a_dict_of_class_indices_to_weights():
    for bad in ({}, {"cat": 1.0}, {0: -1.0}, {0: "x"}, [1.0, 2.0], {True: 1.0}):
        with pytest.raises(ConfigError, match="class_weight"):
            tftrain.ArrayTask(_model, np.zeros((4, 4)), np.zeros(4), loss="mse", class_weight=bad)
    task = tftrain.ArrayTask(_model, np.zeros((4, 4)), np.zeros(4), loss="mse", class_weight={np.int64(1): 2})
    assert task.class_weight == {1: 2.0}


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["FitLoop", "MultiWorkerLoop"])
def test_class_weight_trains_as_keras_fit_with_the_same_weights(tmp_path, loop):
    """Both loops weigh as plain Keras's `fit(class_weight=...)`; the multi-worker loop (here on one
    worker) maps the weights onto each worker's dataset, since `fit` refuses them over a distributed one."""
    import keras

    from tests.conftest import class_weight_problem

    x, y, weights, build = class_weight_problem()
    task = tftrain.ArrayTask(build, x, y, loss="sparse_categorical_crossentropy", optimizer="sgd",
                             learning_rate=0.1, class_weight=weights)
    trainer = tftrain.Trainer(task, epochs=3, batch_size=256, seed=0, execution="graph", steps_per_execution=1,
                              verbose=0, run_dir=str(tmp_path / "run"))
    trainer.loop = getattr(tftrain.train, loop)()
    record = trainer.fit()
    keras.utils.set_random_seed(0)  # the same initial weights; one full batch an epoch: the same gradients
    model = build()
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    plain = model.fit(x, y, batch_size=256, epochs=3, verbose=0, shuffle=False, class_weight=weights)
    assert record.history["loss"] == pytest.approx(plain.history["loss"], rel=1e-5)
    keras.utils.set_random_seed(0)
    model = build()
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    unweighted = model.fit(x, y, batch_size=256, epochs=1, verbose=0, shuffle=False)
    assert record.history["loss"][0] != pytest.approx(unweighted.history["loss"][0], rel=1e-3)  # weights count


def test_class_weight_is_refused_before_the_run_by_a_loop_that_cannot_weigh_classes(tmp_path):
    """Every loop tftrain ships weighs classes (the parameter-server one in
    tests/unit/train/test_parameter_server_class_weight.py); a loop that says it cannot is refused early."""
    import dataclasses

    assert all(tftrain.train.loops.loop_for(s).weighs_classes
               for s in ("default", "mirrored", "multi_worker_mirrored", "parameter_server"))
    task = tftrain.ArrayTask(_model, np.zeros((64, 4), "float32"), np.zeros(64, "int64"), loss="mse",
                             class_weight={0: 1.0})
    trainer = tftrain.Trainer(task, verbose=0, run_dir=str(tmp_path / "r"))
    trainer.loop = dataclasses.replace(tftrain.train.FitLoop(), weighs_classes=False)
    trainer.check(), trainer.setup_runtime(), trainer.bind_task()
    with pytest.raises(ConfigError, match="class_weight is not supported by"):
        trainer.check_task()


def test_the_printed_configuration_shows_the_task_learning_rate_that_trains(tmp_path, capsys):
    from tftrain.train.reporting import print_plan

    trainer = tftrain.Trainer(_task(), verbose=2, run_dir=str(tmp_path / "r"))
    trainer.check(), trainer.setup_runtime(), trainer.bind_task(), trainer.plan_fixed_batch()
    print_plan(trainer)
    assert "learning_rate: 0.05" in capsys.readouterr().out  # the task's; config.yaml keeps null (--learning-rate)
    assert trainer.config.train.learning_rate is None
    rng = np.random.default_rng(0)
    x, y = rng.random((64, 4), "float32"), rng.random((64, 1), "float32")
    unset = tftrain.Trainer(tftrain.ArrayTask(_model, x, y, loss="mse", optimizer="rmsprop"), verbose=2,
                            run_dir=str(tmp_path / "u"))
    unset.check(), unset.setup_runtime(), unset.bind_task(), unset.plan_fixed_batch()
    print_plan(unset)
    assert "learning_rate: 0.001" in capsys.readouterr().out  # RMSprop's own default trains


def test_a_model_compiled_by_build_model_is_compiled_again_with_the_task_s_arguments_and_said(tmp_path, capsys):
    import keras

    def compiled():
        model = _model()
        model.compile(optimizer=keras.optimizers.RMSprop(0.001), loss="mae", metrics=["mse"], jit_compile=True,
                      steps_per_execution=8)
        return model

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((256, 4)).astype("float32"), rng.standard_normal((256, 1)).astype("float32")
    task = tftrain.ArrayTask(compiled, x, y, x[:64], y[:64], loss="mse", optimizer="sgd", name="own_compile")
    record = tftrain.Trainer(task, epochs=1, verbose=1, seed=0, execution="graph", precision="float32",
                             run_dir=str(tmp_path / "run")).fit()
    err = capsys.readouterr().err
    assert err.count("build_model returned a model compiled with RMSprop; tftrain compiles it again with the "
                     "task's optimizer (sgd), loss ('mse') and metrics (None), so RMSprop is not used, nor its "
                     "jit_compile=True (--execution xla) and steps_per_execution=8 (--steps-per-execution 8)") == 1
    saved = keras.saving.load_model(tmp_path / "run" / "model.keras")
    assert type(saved.optimizer).__name__ == "SGD" and "loss" in record.test


def test_explicit_xla_on_a_model_keras_compiles_without_xla_trains_in_graph_and_says_so(tmp_path, capsys):
    import keras

    words = np.array(["red", "green", "blue", "cat"])

    def lookup():
        inputs = keras.Input((1,), dtype="string")
        one_hot = keras.layers.StringLookup(vocabulary=list(words), output_mode="one_hot")(inputs)
        return keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Flatten()(one_hot)))

    rng = np.random.default_rng(0)
    x = words[rng.integers(0, 4, (256, 1))]
    y = (x[:, 0] == "red").astype("float32")[:, None]
    task = tftrain.ArrayTask(lookup, x, y, x[:64], y[:64], loss="mse", name="strings")
    record = tftrain.Trainer(task, epochs=1, verbose=1, execution="xla", precision="float32",
                             run_dir=str(tmp_path / "run")).fit()
    assert record.execution == "graph"  # what ran: Keras turned jit_compile off ("Proceeding with jit_compile=False")
    assert "--execution xla: Keras compiles this model without XLA" in capsys.readouterr().err


def test_the_default_plan_is_a_few_lines_without_the_configuration_and_verbose_0_prints_the_result(tmp_path,
                                                                                                    capsys):
    from tftrain.train.reporting import print_plan

    trainer = tftrain.Trainer(_task(), verbose=1, run_dir=str(tmp_path / "r"))
    trainer.check(), trainer.setup_runtime(), trainer.bind_task(), trainer.plan_fixed_batch()
    print_plan(trainer)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) <= 9 and not any(line.startswith(("train:", "runtime:", "  ")) for line in lines), lines
    assert "--verbose 2, or config.yaml in the run directory" in lines[0]
    quiet = tftrain.Trainer(_task(), verbose=0, epochs=1, run_dir=str(tmp_path / "q")).fit()
    [line] = capsys.readouterr().out.strip().splitlines()
    assert line.startswith("test ") and quiet is not None, line


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["deleted", "emptied"])
def test_a_resumed_run_whose_batch_plan_is_lost_keeps_the_batch_its_checkpoint_trained_at(tmp_path, capsys, damage):
    import keras

    class Kill(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise KeyboardInterrupt  # after epoch 1's checkpoint

    with pytest.raises(tftrain.Interrupted):
        _trainer(tmp_path, batch_size="auto", epochs=2, callbacks=[Kill()]).fit()
    plan = tmp_path / "run" / "batch_plan.json"
    chosen = json.loads(plan.read_text())["batch_size"]
    plan.unlink() if damage == "deleted" else plan.write_text("")
    capsys.readouterr()
    record = _trainer(tmp_path, batch_size="auto", epochs=2, verbose=1).fit()
    assert record.global_batch_size == chosen and record.to_dict()["resumed_from_epoch"] == 1
    assert f"batch:     {chosen}, as the checkpoint was trained at (batch_plan.json is missing or damaged)" in \
        capsys.readouterr().out


@pytest.mark.parametrize("option, value, flag", [("jit_compile", True, "--execution xla"),
                                                 ("run_eagerly", True, "--execution eager"),
                                                 ("steps_per_execution", 4, "--steps-per-execution 4")])
def test_an_execution_option_in_compile_args_is_refused_with_its_flag_before_the_run_directory(tmp_path, option,
                                                                                                value, flag):
    class OwnOptions(tftrain.ArrayTask):
        def compile_args(self, steps_per_epoch):
            return {**super().compile_args(steps_per_epoch), option: value}

    task = _task()
    task.__class__ = OwnOptions
    trainer = tftrain.Trainer(task, epochs=1, verbose=0, run_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=f"compile_args sets {option}={value}, .* pass {flag} "):
        trainer.fit()
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_class_weight_that_leaves_out_a_class_of_the_model_weighs_it_1_as_keras_does_for_arrays(tmp_path):
    import keras

    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 4)).astype("float32")
    y = np.zeros(96, "int32")
    y[40:] = 1
    y[90:] = 2  # in the last batch only: the sanity pass's first batch has no class 2
    build = lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])  # noqa: E731
    task = tftrain.ArrayTask(build, x, y, loss="sparse_categorical_crossentropy", class_weight={0: 1.0, 1: 2.0},
                             name="weighed")
    record = tftrain.Trainer(task, epochs=1, batch_size=32, verbose=0, execution="graph",
                             run_dir=str(tmp_path / "run")).fit()
    assert record.epochs_trained == 1 and np.isfinite(record.history["loss"][-1])


@pytest.mark.slow
def test_a_tune_trial_s_values_reach_compile_args_and_the_data_as_well_as_the_model(tmp_path):
    import dataclasses

    import keras

    seen = []

    @dataclasses.dataclass(frozen=True)
    class HP:
        width: int = tftrain.hparam(8, "hidden units", minimum=1)
        smoothing: float = tftrain.hparam(0.0, "label smoothing, read in compile_args")

    class Smoothed(tftrain.ArrayTask):
        def compile_args(self, steps_per_epoch):
            seen.append(("compile_args", self.hparams.width, self.hparams.smoothing))
            return {**super().compile_args(steps_per_epoch),
                    "loss": keras.losses.CategoricalCrossentropy(label_smoothing=self.hparams.smoothing)}

        def train_data(self, global_batch_size, input_context=None):
            seen.append(("train_data", self.hparams.width, self.hparams.smoothing))
            return super().train_data(global_batch_size, input_context)

        def tune_space(self):
            return {"width": (4,), "smoothing": (0.5,)}

    x = np.random.default_rng(0).standard_normal((256, 4)).astype("float32")
    y = np.eye(2, dtype="float32")[(x[:, 0] > 0).astype(int)]
    def build(hp):
        seen.append(("build_model", hp.width, hp.smoothing))
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(hp.width),
                                 keras.layers.Dense(2, activation="softmax")])

    task = Smoothed(build, x, y, loss="categorical_crossentropy", hparams=HP(), name="smoothed")
    tftrain.Trainer(task, tune=1, validation_split=0.25, epochs=1, verbose=0, execution="graph",
                    run_dir=str(tmp_path / "run")).fit()
    trial = seen[seen.index(("build_model", 4, 0.5)):]  # from the trial's build on, then the run's
    assert len(trial) > 3 and all(s[1:] == (4, 0.5) for s in trial), seen


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["empty trial", "garbage oracle", "oracle deleted"])
def test_a_tuning_folder_keras_tuner_cannot_read_back_is_said_and_its_trials_run_again(tmp_path, capsys, damage):
    first = _trainer(tmp_path, tune=1, validation_split=0.25, epochs=1)
    first.fit()
    tuner = tmp_path / "run" / "tuning" / "tuner"
    for written in ("metrics.json", "model.keras", "report.md"):  # as if killed after the search, before a checkpoint
        (tmp_path / "run" / written).unlink()
    if damage.endswith("deleted"):
        (tuner / "oracle.json").unlink()
    else:
        (tuner / "trial_0" / "trial.json" if damage == "empty trial" else tuner / "oracle.json").write_text(
            "" if damage == "empty trial" else '{"garbage')
    record = _trainer(tmp_path, tune=1, validation_split=0.25, epochs=1, verbose=1).fit()
    assert "could not be read back" in capsys.readouterr().err and record.extras["tuning"]["trials"] == 1
