"""`python -m tftrain.run FILE.py:NAME`: loading tasks, flags, exit codes."""

import textwrap

import pytest

from tests.conftest import REPO, read_metrics, run_module
from tftrain import run
from tftrain.errors import ConfigError

TASK_FILE = textwrap.dedent('''
    import dataclasses
    import numpy as np
    import tftrain

    @dataclasses.dataclass(frozen=True)
    class HP:
        units: int = tftrain.hparam(4, "hidden units", minimum=1)

    def build(hp):
        import keras
        if hp.units == 13:
            raise RuntimeError("unlucky width")
        return keras.Sequential([keras.Input((2,)), keras.layers.Dense(hp.units), keras.layers.Dense(1)])

    x = np.ones((64, 2), "float32")
    task = tftrain.ArrayTask(build, x, x[:, :1], x, x[:, :1], loss="mse", hparams=HP(), name="filetask")

    def make_task():
        return task

    not_a_task = 3
''')


@pytest.fixture
def task_file(tmp_path):
    path = tmp_path / "my_task.py"
    path.write_text(TASK_FILE)
    return path


def test_load_task_by_name_or_factory(task_file):
    assert run.load_task(f"{task_file}:task").name == "filetask"
    assert run.load_task(f"{task_file}:make_task").name == "filetask"
    assert run.load_task("tftrain.recipes.mnist:TASK").name == "mnist"


@pytest.mark.parametrize("spec, message", [
    ("no_colon.py", "Expected FILE.py:NAME or MODULE:NAME"),
    ("missing/file.py:task", "does not exist"),
    ("{file}:nope", "has no 'nope'. Tasks in it: task"),
    ("{file}:not_a_task", "is a int, not a tftrain.Task"),
    ("tftrain.no_such_module:task", "Could not import 'tftrain.no_such_module': ModuleNotFoundError"),
])
def test_load_task_errors_are_one_line(task_file, spec, message):
    with pytest.raises(ConfigError) as e:
        run.load_task(spec.format(file=task_file))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_syntax_error_names_the_line(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\ndef broken(:\n")
    with pytest.raises(ConfigError) as e:
        run.load_task(f"{bad}:task")
    assert str(e.value).endswith("SyntaxError: invalid syntax (line 2).") and str(e.value).count("line 2") == 1


@pytest.mark.slow
def test_main_trains_with_task_hyperparameter_flags(task_file, tmp_path, capsys):
    code = run.main([f"{task_file}:task", "--units", "3", "--epochs", "1", "--batch-size", "16", "--verbose", "0", "--execution", "graph",
                     "--run-dir", str(tmp_path / "run")])
    assert code == 0, capsys.readouterr().err
    assert "units: 3" in (tmp_path / "run" / "config.yaml").read_text()


def test_bad_input_exits_2_with_one_line(task_file, tmp_path, capsys):
    assert run.main([f"{task_file}:task", "--units", "0", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["python -m tftrain.run: error: units must be positive. Received: units=0. Pass a value >= 1."]
    assert run.main([]) == 2
    assert "No task given" in capsys.readouterr().err
    assert run.main([str(task_file), "--epochs", "1"]) == 2  # the file without :NAME
    assert f"{str(task_file)!r} names a file but not the task in it. Pass {task_file}:NAME" in capsys.readouterr().err


def test_a_run_that_fails_exits_1_naming_what_failed_and_the_traceback_file(task_file, tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = run.main([f"{task_file}:task", "--units", "13", "--batch-size", "16", "--verbose", "0", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err.strip().splitlines()  # the model does not build: before the run directory
    assert code == 1 and err == ["python -m tftrain.run: run failed: RuntimeError: unlucky width. (Set "
                                 "TFTRAIN_TRACEBACK=1 to print the traceback.)"] and not run_dir.exists()
    failing = tmp_path / "failing.py"
    failing.write_text("import keras\n"
                       "class Unlucky(keras.callbacks.Callback):\n"
                       "    def on_epoch_begin(self, epoch, logs=None):\n"
                       "        raise RuntimeError('unlucky epoch')\n")
    code = run.main([f"{task_file}:task", "--batch-size", "16", "--verbose", "0", "--callbacks", f"{failing}:Unlucky",
                     "--execution", "graph", "--precision", "float32", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert "run failed: RuntimeError: unlucky epoch. Traceback:" in err[0] and str(run_dir / "failure.log") in err[0]
    assert "unlucky epoch" in (run_dir / "failure.log").read_text()


def test_a_run_that_fails_after_a_checkpoint_says_the_same_command_resumes(task_file, tmp_path, capsys):
    failing = tmp_path / "failing.py"
    failing.write_text("import keras\n"
                       "class LostPeer(keras.callbacks.Callback):\n"
                       "    def on_epoch_begin(self, epoch, logs=None):\n"
                       "        if epoch == 1:\n"
                       "            raise ConnectionError('a peer task stopped')\n")
    run_dir = tmp_path / "run"
    code = run.main([f"{task_file}:task", "--epochs", "2", "--batch-size", "16", "--verbose", "0", "--execution",
                     "graph", "--callbacks", f"{failing}:LostPeer", "--run-dir", str(run_dir)])
    [line] = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and "run failed: ConnectionError: a peer task stopped" in line, line
    assert line.endswith("Its checkpoint is kept. To resume, rerun the same command."), line  # it has --run-dir
    assert run.main([f"{task_file}:task", "--epochs", "2", "--batch-size", "16", "--verbose", "0", "--execution",
                     "graph", "--run-dir", str(run_dir)]) == 0  # the advice holds
    assert len(read_metrics(run_dir)["history"]["loss"]) == 2


def test_help_lists_the_task_hyperparameters(task_file, capsys):
    with pytest.raises(SystemExit) as e:
        run.main([f"{task_file}:task", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--units N" in out and "hidden units (default: 4)" in out and "--strategy" in out


@pytest.mark.parametrize("case, message", [
    ("not_utf8", "is not UTF-8 text (byte 17 cannot be decoded). Save it as UTF-8."),
    ("directory", "is a directory. Pass --config with a YAML file."),
    ("section_not_mapping", "Section 'train' in {path} must be a mapping. Received: 3."),
    ("run_dir_in_a_file", "is inside '{tmp}/afile', which is a file."),
    ("run_dir_unwritable", "cannot be written ('/proc/self'"),
])
def test_bad_files_and_folders_exit_2_with_one_line(task_file, tmp_path, capsys, case, message):
    recipe, run_dir = tmp_path / "recipe.yaml", tmp_path / "run"
    recipe.write_text("train:\n  epochs: 1\n")
    if case == "not_utf8":
        recipe.write_bytes(b"train:\n  epochs: \xff\xfe\n")
    elif case == "directory":
        recipe = tmp_path
    elif case == "section_not_mapping":
        recipe.write_text("train: 3\n")
    elif case == "run_dir_in_a_file":
        (tmp_path / "afile").write_text("mine")
        run_dir = tmp_path / "afile" / "run"
    else:
        run_dir = "/proc/self/run"
    code = run.main([f"{task_file}:task", "--config", str(recipe), "--run-dir", str(run_dir), "--verbose", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert message.format(path=recipe, tmp=tmp_path) in err[0]
    if case == "run_dir_in_a_file":
        assert (tmp_path / "afile").read_text() == "mine"


@pytest.mark.slow
def test_an_empty_tf_config_means_unset_for_every_strategy(task_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TF_CONFIG", "")
    for strategy in ("mirrored", "multi_worker_mirrored"):
        code = run.main([f"{task_file}:task", "--strategy", strategy, "--epochs", "1", "--batch-size", "16",
                         "--verbose", "0", "--execution", "graph", "--run-dir", str(tmp_path / strategy)])
        assert code == 0, capsys.readouterr().err
        assert (tmp_path / strategy / "metrics.json").is_file()


def test_cache_is_not_offered_for_in_memory_arrays(task_file, tmp_path, capsys):
    with pytest.raises(SystemExit):
        run.main([f"{task_file}:task", "--help"])
    assert "--cache" not in capsys.readouterr().out
    assert run.main([f"{task_file}:task", "--no-cache", "--run-dir", str(tmp_path / "r")]) == 2
    assert "data.cache (--cache) does nothing for task 'filetask'" in capsys.readouterr().err
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("data:\n  cache: false\n")
    assert run.main([f"{task_file}:task", "--config", str(recipe), "--run-dir", str(tmp_path / "r")]) == 2
    assert "data.cache (--cache) does nothing for task 'filetask': its arrays are in memory already" in \
        capsys.readouterr().err
    assert not (tmp_path / "r").exists()


STARTS_TENSORFLOW = textwrap.dedent('''
    import keras, tftrain, numpy as np
    x = np.random.rand(2048, 8).astype("float32"); y = x[:, :1]
    M = {metric}
    def build():
        i = keras.Input((8,)); o = keras.layers.Dense(1)(i); return keras.Model(i, o)
    task = tftrain.ArrayTask(build, x, y, x[:256], y[:256], loss="mse", metrics=[M])
''')
"""A task file as in keras-team/keras#21054: a metric object built at import creates variables,
which starts TensorFlow's runtime before `tftrain.runtime.setup` can split the CPU."""

MIRRORED_ON_TWO_CPUS = ["--strategy", "mirrored", "--cpu-replicas", "2", "--epochs", "1", "--train-examples", "512",
                        "--verbose", "0"]


@pytest.mark.slow
def test_a_task_file_that_starts_tensorflow_at_import_is_named_with_the_fix(tmp_path):
    path = tmp_path / "task.py"
    path.write_text(STARTS_TENSORFLOW.format(metric="keras.metrics.MeanAbsoluteError()"))
    result = run_module("tftrain.run", [f"{path}:task", *MIRRORED_ON_TWO_CPUS, "--run-dir", tmp_path / "run"],
                        cwd=REPO, timeout=120)
    errors = [line for line in result.stderr.splitlines() if line.startswith("python -m tftrain.run:")]
    assert result.returncode == 2, result.stderr
    assert errors == [
        f"python -m tftrain.run: error: {path} started TensorFlow when imported (a Keras metric, optimizer, layer or "
        "tensor built at module level), so --cpu-replicas 2 cannot split the CPU: build metrics inside compile_args, or "
        "pass the class (metrics=[keras.metrics.MeanAbsoluteError])."
    ]
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_task_file_that_starts_tensorflow_is_named_under_a_multi_worker_strategy(tmp_path):
    import json

    import portpicker

    path = tmp_path / "task.py"  # an optimizer instance at module level makes its step counter: TensorFlow starts
    path.write_text(STARTS_TENSORFLOW.format(metric='"mae"').replace('loss="mse"',
                                                                     'loss="mse", optimizer=keras.optimizers.SGD(0.1)'))
    config = {"cluster": {"worker": [f"127.0.0.1:{portpicker.pick_unused_port()}"]}, "task": {"type": "worker",
                                                                                              "index": 0}}
    result = run_module("tftrain.run", [f"{path}:task", "--strategy", "multi_worker_mirrored", "--epochs", "1",
                                        "--run-dir", tmp_path / "run"],
                        cwd=REPO, timeout=120, env={"TF_CONFIG": json.dumps(config)})
    errors = [line for line in result.stderr.splitlines() if line.startswith("python -m tftrain.run:")]
    assert result.returncode == 2, result.stderr
    assert errors == [
        f"python -m tftrain.run: error: {path} started TensorFlow when imported (a Keras metric, optimizer, layer or "
        "tensor built at module level), so --strategy multi_worker_mirrored cannot set up its cluster: build Keras "
        "objects and tensors inside build_model or compile_args, not at module level."
    ]
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_metric_class_is_built_in_the_strategy_scope_and_reported(tmp_path):
    path = tmp_path / "task.py"
    path.write_text(STARTS_TENSORFLOW.format(metric="keras.metrics.MeanAbsoluteError"))
    run_dir = tmp_path / "run"
    result = run_module("tftrain.run", [f"{path}:task", *MIRRORED_ON_TWO_CPUS, "--run-dir", run_dir],
                        cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    metrics = read_metrics(run_dir)
    assert metrics["replicas"] == 2 and metrics["test_mean_absolute_error"] >= 0
    assert "mean_absolute_error" in metrics["history"]


@pytest.mark.slow
def test_thread_flags_a_task_file_cannot_honour_are_one_warning_naming_it(tmp_path):
    path = tmp_path / "task.py"
    path.write_text(STARTS_TENSORFLOW.format(metric="keras.metrics.MeanAbsoluteError()"))
    result = run_module("tftrain.run", [f"{path}:task", "--intra-op-threads", "1", "--epochs", "1", "--train-examples",
                                        "256", "--execution", "graph", "--verbose", "0", "--run-dir", tmp_path / "run"],
                        cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "warning" in line.lower() and "thread" in line.lower()]
    assert said == [
        f"python -m tftrain.run: warning: {path} started TensorFlow when imported (a Keras metric, optimizer, layer or "
        "tensor built at module level), so --intra-op-threads 1 cannot apply: build metrics inside compile_args, or pass "
        "the class (metrics=[keras.metrics.MeanAbsoluteError])."
    ]


@pytest.mark.slow
def test_callbacks_from_the_command_line(task_file, tmp_path, capsys):
    mine = tmp_path / "my_callbacks.py"
    mine.write_text(
        "import keras\n"
        "seen = []\n"
        "class Marker(keras.callbacks.Callback):\n"
        "    def __init__(self, path=None):\n"
        "        super().__init__()\n"
        "        self.path = path\n"
        "    def on_train_end(self, logs=None):\n"
        f"        open({str(tmp_path / 'marker')!r}, 'a').write(type(self).__name__ + '\\n')\n"
        "class Other(Marker):\n"
        "    pass\n"
        "def two():\n"
        "    return [Marker(), Other()]\n"
        "not_a_callback = 3\n")
    args = [f"{task_file}:task", "--epochs", "1", "--batch-size", "16", "--verbose", "0", "--execution", "graph"]
    assert run.main([*args, "--callbacks", f"{mine}:Marker,{mine}:two", "--run-dir", str(tmp_path / "run")]) == 0
    assert (tmp_path / "marker").read_text().split() == ["Marker", "Marker", "Other"]  # after tftrain's own
    for spec, message in ((f"{mine}:missing", "has no 'missing'"), (f"{mine}:not_a_callback", "is of type int, not a Keras"),
                          ("nocolon", "invalid 'nocolon'")):
        capsys.readouterr()
        assert run.main([*args, "--callbacks", spec, "--run-dir", str(tmp_path / "bad")]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("python -m tftrain.run: error: --callbacks: ") and message in line, line
    assert not (tmp_path / "bad").exists()  # refused before the run directory


def test_a_full_disk_anywhere_is_one_line_naming_the_file_and_the_fix(tmp_path):
    import errno
    from types import SimpleNamespace

    from tftrain import run

    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "runs/r/model.keras")
        except OSError as cause:
            raise RuntimeError("Unable to synchronously create file (file write failed)") from cause
    except RuntimeError as raised:
        error = raised
    line = run._disk_full(error, None)
    assert line == ("RuntimeError: no space left on the disk holding runs/r/model.keras; free space on that disk, "
                    "then rerun the same command (it resumes from a checkpoint, if one was written)")
    assert run._disk_full(ValueError("bad value"), None) == ""
    trainer = SimpleNamespace(run_dir=SimpleNamespace(path=tmp_path))  # what the line says follows the run's state
    assert run._disk_full(error, trainer).endswith(  # a command without --run-dir would start a new run
        f"no checkpoint was written yet: free space on that disk, then rerun the same command with --run-dir "
        f"{tmp_path} (--resume takes the newest unfinished run of these settings)")
    named = SimpleNamespace(run_dir=trainer.run_dir, config=SimpleNamespace(run_dir=str(tmp_path)))
    assert run._disk_full(error, named).endswith("free space on that disk, then rerun the same command")
    (tmp_path / "backup").mkdir()
    (tmp_path / "backup" / "ckpt-0.json").write_text("{}")
    assert "the last checkpoint in the run directory is kept" in run._disk_full(error, trainer)
    (tmp_path / "metrics.json").write_text("{}")
    assert "the trained run is written (metrics.json)" in run._disk_full(error, trainer)
    # The line's tail names the traceback file, and no logs folder where none was made; the advice is not repeated.
    trainer = SimpleNamespace(run_dir=SimpleNamespace(path=tmp_path, backup_dir=tmp_path / "backup"), is_chief=True)
    assert run._failure_log(trainer, error, resume_hint=False) == f". Traceback: {tmp_path / 'failure.log'}"


@pytest.mark.slow
def test_a_task_file_s_open_files_and_exit_hooks_are_kept_at_a_successful_exit(task_file, tmp_path):
    written, hooked = tmp_path / "written.txt", tmp_path / "hooked.txt"
    task_file.write_text(TASK_FILE + textwrap.dedent(f'''
        import atexit
        log = open({str(written)!r}, "w")
        log.write("buffered, never closed")  # Python flushes it at a normal exit
        atexit.register(lambda: open({str(hooked)!r}, "w").write("ran"))
    '''))
    result = run_module("tftrain.run", [f"{task_file}:task", "--epochs", "1", "--execution", "graph", "--verbose", "0",
                                        "--run-dir", tmp_path / "run"], cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert written.read_text() == "buffered, never closed" and hooked.read_text() == "ran"


@pytest.mark.parametrize("ran, succeeded, code, line", [
    (False, False, 143, "tftrain: stopped by SIGTERM before the run started (nothing written): rerun the same command"),
    (True, False, 143, "tftrain: stopped by SIGTERM after the run ended"),
    (True, True, 0, "tftrain: SIGTERM after the run succeeded; exiting"),
], ids=["before", "after-a-failure", "after-success"])
def test_sigterm_outside_the_trainer_s_watch_is_one_line(capsys, monkeypatch, ran, succeeded, code, line):
    import signal

    from tftrain import run

    monkeypatch.setattr(run, "_ran", ran)
    monkeypatch.setattr(run, "_succeeded", succeeded)
    with pytest.raises(SystemExit) as stopped:
        run._exit_on_sigterm(signal.SIGTERM, None)
    assert stopped.value.code == code and capsys.readouterr().err == line + "\n"


def test_an_error_that_ends_a_background_thread_is_said_in_one_line(capsys):
    import threading
    from types import SimpleNamespace

    from tftrain.run import _one_line_thread_error

    error = RuntimeError("recvmsg:Connection reset by peer\nAdditional GRPC error information: ...")
    _one_line_thread_error(SimpleNamespace(exc_type=RuntimeError, exc_value=error, exc_traceback=None,
                                           thread=threading.Thread(name="WorkerPreemptionHandler")))
    _one_line_thread_error(SimpleNamespace(exc_type=SystemExit, exc_value=SystemExit(0), exc_traceback=None,
                                           thread=None))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tftrain: warning: WorkerPreemptionHandler ended: RuntimeError: "
                                                   "recvmsg:Connection reset by peer"), err


def test_the_resume_line_gives_the_same_command_where_it_names_the_run_directory_else_the_flags_quoted(monkeypatch):
    from types import SimpleNamespace

    from tftrain.run import _resume_hint

    monkeypatch.delenv("TFTRAIN_RUN_ID", raising=False)
    named = SimpleNamespace(config=SimpleNamespace(run_dir="runs/my run"))
    assert _resume_hint("runs/my run", named) == "To resume, rerun the same command."
    default = SimpleNamespace(config=SimpleNamespace(run_dir=None))
    assert _resume_hint("runs/task-1 ü", default) == \
        "To resume, rerun the same command with --run-dir 'runs/task-1 ü' (--resume takes the newest unfinished run " \
        "of these settings)."
    alone = SimpleNamespace(config=SimpleNamespace(run_dir=None), cluster=None)  # stopped before the directory
    assert _resume_hint("", alone) == "To resume, rerun the same command."
    server = SimpleNamespace(config=SimpleNamespace(run_dir=None), cluster=object())
    assert _resume_hint("", server) == "To resume, rerun the same command (the chief's line names the run directory)."
    monkeypatch.setenv("TFTRAIN_RUN_ID", "20261205-000000")
    assert _resume_hint("runs/t", default) == ("To resume, rerun the same python -m tftrain.launch command with "
                                               "--run-dir runs/t (--resume takes the newest unfinished run of these "
                                               "settings) added to the training command after --.")
