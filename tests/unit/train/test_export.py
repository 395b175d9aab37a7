"""--export writes the trained model for serving and checks each artifact in the runtime that serves it
(TensorFlow, ONNX Runtime, the LiteRT interpreter); a missing converter is refused before training."""

import json
import re

import numpy as np

import pytest

import tftrain
from tftrain.errors import ConfigError


def _task():
    import keras

    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 0.0], "float32"))[:, None]
    build = lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),  # noqa: E731
                                      keras.layers.Dense(1)])
    return tftrain.ArrayTask(build, x, y, x[:64], y[:64], loss="mse", optimizer="sgd", name="export")


def _fit(tmp_path, **overrides):
    overrides = {"epochs": 1, "verbose": 0, "seed": 0, "batch_size": 32, "execution": "graph",
                 "run_dir": str(tmp_path / "run"), **overrides}
    return tftrain.Trainer(_task(), **overrides).fit()


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
@pytest.mark.slow
def test_every_format_is_written_loaded_back_and_matches_the_model(tmp_path, precision, capfd):
    record = _fit(tmp_path, export="saved_model,onnx,litert", precision=precision)
    printed = capfd.readouterr()  # LiteRT's C++ log and NumPy's warnings reach the file descriptors
    assert "XNNPACK" not in printed.err + printed.out and "FutureWarning" not in printed.err, printed.err[-2000:]
    assert "Ignored output_format" not in printed.err, printed.err[-2000:]  # the converter's C++ warnings
    exported = record.extras["export"]
    assert set(exported) == {"saved_model", "onnx", "litert"}
    run = tmp_path / "run"
    assert (run / "export" / "saved_model" / "saved_model.pb").is_file()
    assert (run / "export" / "model.onnx").is_file() and (run / "export" / "model.tflite").is_file()
    for name, figures in exported.items():  # the float32 model (its float32 twin under a mixed policy)
        assert figures["max_abs_difference"] < 1e-4, (name, figures)
    assert json.loads((run / "metrics.json").read_text())["export"] == exported


@pytest.mark.slow
def test_python_m_tftrain_export_of_another_format_keeps_the_formats_recorded_before(tmp_path, monkeypatch):
    from tftrain import export

    monkeypatch.chdir(tmp_path)
    _fit(tmp_path, export="saved_model", run_dir="run")  # metrics.json records run/export/...
    monkeypatch.chdir(tmp_path / "run")  # where those relative paths do not lead
    assert export.main([str(tmp_path / "run"), "--formats", "onnx"]) == 0
    recorded = json.loads((tmp_path / "run" / "metrics.json").read_text())["export"]
    assert set(recorded) == {"saved_model", "onnx"}, recorded


def test_a_format_whose_converter_is_missing_is_refused_before_training(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("tf2onnx", "ai_edge_litert") else real(name, *a))
    with pytest.raises(ConfigError, match=r"--export: onnx needs tf2onnx; litert needs ai_edge_litert, not installed\. "
                                          r"Install the extra: pip install -e \"\.\[onnx,litert\]\""):
        _fit(tmp_path, export="saved_model,onnx,litert")  # every missing one named at once
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="unknown format 'pytorch'"):
        _fit(tmp_path, export="pytorch")


def test_python_m_tftrain_export_refuses_a_bad_command_line_in_one_line(capsys):
    from tftrain import export

    assert export.main(["--formts", "onnx", "runs/x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--formts: did you mean --formats?" in err[0], err
    assert export.main([]) == 2
    assert "required: RUN_DIR" in capsys.readouterr().err


def test_outputs_nested_in_a_dict_are_refused_with_the_entry_that_nests(tmp_path):
    import keras

    from tftrain.train.export import ExportCheckFailed, export_all

    inputs = keras.Input((4,), name="x")
    hidden = keras.layers.Dense(4)(inputs)
    model = keras.Model(inputs, {"a": {"p": keras.layers.Dense(2)(hidden)}, "b": keras.layers.Dense(1)(hidden)})
    with pytest.raises(ExportCheckFailed, match=r"the model's outputs nest: 'a' holds a dict, and a served model "
                                                r"takes and returns one flat dict or list of tensors"):
        export_all(model, ("saved_model",), tmp_path, np.zeros((2, 4), "float32"))
    assert not list(tmp_path.iterdir())  # refused before any write


@pytest.mark.slow
def test_a_node_tf2onnx_cannot_convert_is_named_in_one_line_without_its_traceback(tmp_path, capfd):
    import keras
    import tensorflow as tf

    from tftrain.train.export import ExportCheckFailed, export_all

    class Spectrum(keras.layers.Layer):  # tf2onnx converts RFFT only when ComplexAbs consumes it directly
        def call(self, x):
            return tf.abs(tf.signal.rfft(x)[..., :1]) + x[..., :1]

    inputs = keras.Input((8,), name="x")
    model = keras.Model(inputs, keras.layers.Dense(1)(Spectrum()(inputs)))
    with pytest.raises(ExportCheckFailed, match=r"^tf2onnx: Failed to convert node '[^']*rfft'"):
        export_all(model, ("onnx",), tmp_path, np.zeros((2, 8), "float32"))
    assert "Traceback" not in capfd.readouterr().err


def test_native_log_lines_matching_a_pattern_are_dropped_and_the_others_kept_in_order(capfd):
    import os
    import re

    from tftrain.train.export import native_lines_dropped

    with native_lines_dropped(re.compile(r"\] Ignored ")):
        os.write(2, b"W0 helpers.cc:364] Ignored output_format.\nfirst kept\n")
        os.write(2, b"W0 helpers.cc:367] Ignored drop_control_dependency.\nsecond kept\n")
    assert capfd.readouterr().err == "first kept\nsecond kept\n"


def test_native_lines_pass_on_while_the_block_runs_and_a_fatal_line_passes_where_all_are_dropped(capfd):
    import os
    import time

    from tftrain.train.export import native_lines_dropped

    with native_lines_dropped(re.compile(r"noise")):
        os.write(2, b"noise\nkept at once\n")
        deadline = time.monotonic() + 10
        seen = ""
        while "kept at once" not in seen and time.monotonic() < deadline:
            time.sleep(0.01)
            seen += capfd.readouterr().err
        assert seen == "kept at once\n"  # forwarded before the block ends
    with native_lines_dropped(fds=(1, 2)):
        os.write(1, b"converter account\n")
        os.write(2, b"W0 some warning\nF0000 00:00 check.cc:1] Check failed: x\n")
    assert capfd.readouterr() == ("", "F0000 00:00 check.cc:1] Check failed: x\n")


def test_the_descriptors_are_restored_when_redirecting_one_of_them_fails(capfd):
    import os

    from tftrain.train.export import native_lines_dropped

    bad = 4000  # a descriptor number no test opens: dup fails on it
    with pytest.raises(OSError):
        os.fstat(bad)
    with pytest.raises(OSError):
        with native_lines_dropped(fds=(1, bad)):
            pass
    os.write(1, b"stdout again\n")
    assert capfd.readouterr().out == "stdout again\n"


@pytest.mark.timeout(60)
def test_native_code_holding_the_gil_writes_more_than_a_pipe_holds_without_blocking(capfd):
    import ctypes

    from tftrain.train.export import native_lines_dropped

    noise = b"noise from a converter\n" * 20000  # 460 KB: a pipe's buffer is 64 KB
    with native_lines_dropped(re.compile("noise")):
        ctypes.PyDLL(None).write(2, noise, len(noise))  # write(2) called with the GIL held
        os_write_kept = ctypes.PyDLL(None).write(2, b"kept\n", 5)
    assert os_write_kept == 5 and capfd.readouterr().err == "kept\n"


def _lstm():
    import keras

    inputs = keras.Input((6, 3))
    return keras.Model(inputs, keras.layers.Dense(1)(keras.layers.LSTM(4)(inputs)))


@pytest.mark.slow
def test_a_format_that_fails_before_training_is_refused_in_one_line_without_the_converter_s_output(tmp_path, capfd):
    x = np.random.default_rng(0).standard_normal((64, 6, 3)).astype("float32")
    task = tftrain.ArrayTask(_lstm, x, x[:, 0, :1], x, x[:, 0, :1], loss="mse", name="lstm")
    with pytest.raises(ConfigError, match="--export litert cannot write or serve this model") as refused:
        tftrain.Trainer(task, epochs=1, verbose=0, batch_size=32, execution="graph", export="litert",
                        run_dir=str(tmp_path / "run")).fit()
    printed = capfd.readouterr()
    assert "Flex" not in printed.err + printed.out, printed.err[-2000:]  # the converter's account of the ops
    assert "Select TensorFlow op" in str(refused.value) and not (tmp_path / "run").exists()


def test_a_long_cause_is_cut_at_a_whole_word():
    from tftrain.errors import cause_line

    line = cause_line(RuntimeError("word " * 100))
    assert len(line) <= 300 and line.endswith("word ...")


_DICT_INPUTS_SUBCLASSED = """
import sys
from pathlib import Path
import keras, numpy as np
from tftrain.train.export import export_all

class Net(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden, self.out = keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2, activation="softmax")

    def call(self, inputs):
        return self.out(self.hidden(keras.ops.concatenate([inputs["a"], inputs["b"]], axis=-1)))

x = np.random.default_rng(0).standard_normal((4, 8)).astype("float32")
features = {"a": x[:, :5], "b": x[:, 5:]}
model = Net()
model(features)
print(export_all(model, ("saved_model",), Path(sys.argv[1]), features)["saved_model"]["max_abs_difference"])
"""


@pytest.mark.slow
@pytest.mark.parametrize("hash_seed", ["1", "2"])
def test_a_subclassed_model_s_dict_inputs_reach_its_saved_model_by_name_under_any_hash_seed(tmp_path, hash_seed):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO, SUBPROCESS_ENV

    # Its serving signature names the inputs args_0, args_0_1 in an order that follows the hash seed.
    done = subprocess.run([sys.executable, "-c", _DICT_INPUTS_SUBCLASSED, str(tmp_path / "export")], cwd=REPO,
                          env={**os.environ, **SUBPROCESS_ENV, "PYTHONHASHSEED": hash_seed}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.strip().splitlines()[-1]) < 1e-6


def test_an_artifact_whose_outputs_differ_from_the_model_s_is_refused(tmp_path, monkeypatch):
    import keras

    from tftrain.train import export

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    features = np.ones((3, 4), "float32")
    monkeypatch.setitem(export._RUNNERS, "saved_model", lambda path: lambda feeds, features: {
        "output_0": np.asarray(model(features)) + 0.5})  # an artifact that computes something else
    with pytest.raises(export.ExportCheckFailed, match="differ from the model's by up to 5.00e-01"):
        export.export_all(model, ("saved_model",), tmp_path / "export", features)


@pytest.mark.parametrize("inputs", ["list", "one as a 1-tuple"])
def test_the_saved_model_check_feeds_list_inputs_and_one_input_in_a_tuple(tmp_path, inputs):
    import keras

    from tftrain.train.export import export_all

    x = np.random.default_rng(0).standard_normal((4, 5)).astype("float32")
    if inputs == "list":
        a, b = keras.Input((3,)), keras.Input((2,))
        model = keras.Model([a, b], keras.layers.Dense(1)(keras.layers.Concatenate()([a, b])))
        features = (x[:, :3], x[:, 3:])  # the pipeline hands a list's inputs over as a tuple
    else:
        a = keras.Input((5,))
        model, features = keras.Model(a, keras.layers.Dense(1)(a)), (x,)
    assert export_all(model, ("saved_model",), tmp_path, features)["saved_model"]["max_abs_difference"] < 1e-6


def test_outputs_that_are_nan_in_the_model_and_the_artifact_alike_pass_the_check(tmp_path):
    import keras

    from tftrain.train.export import export_all

    a = keras.Input((2,))
    model = keras.Model(a, keras.layers.Lambda(lambda t: keras.ops.sqrt(t))(a))  # NaN for a negative input
    features = np.array([[-1.0, 4.0], [1.0, 9.0]], "float32")
    assert export_all(model, ("saved_model",), tmp_path, features)["saved_model"]["max_abs_difference"] == 0.0


@pytest.mark.slow
def test_python_m_tftrain_export_refuses_a_damaged_metrics_json_before_exporting(tmp_path, capsys):
    from tftrain import export

    _fit(tmp_path)
    (tmp_path / "run" / "metrics.json").write_text("[1, 2]")
    assert export.main([str(tmp_path / "run")]) == 2
    assert "metrics.json is damaged (not a JSON object)" in capsys.readouterr().err
    assert not (tmp_path / "run" / "export").exists()


@pytest.mark.slow
def test_python_m_tftrain_export_on_a_full_disk_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    import errno

    from tftrain import export
    from tftrain.train import after_steps

    _fit(tmp_path)
    before = json.loads((tmp_path / "run" / "metrics.json").read_text())

    def full(*args, **kwargs):  # as TensorFlow wraps a write that found the disk full
        try:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "export" / "x"))
        except OSError as e:
            raise RuntimeError("could not write the SavedModel") from e

    monkeypatch.setattr(after_steps, "export", full)
    assert export.main([str(tmp_path / "run")]) == 1
    assert capsys.readouterr().err.strip() == (
        f"python -m tftrain.export: export failed: no space left on the disk holding {tmp_path}/run/export/x; free "
        "space on that disk, then rerun this command (the trained run is unchanged)")
    after = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert after.pop("after_steps") == {"export": "pending"} and after == {k: v for k, v in before.items()
                                                                            if k != "after_steps"}  # all else kept
    with pytest.raises(tftrain.ConfigError, match=r"an export of it was cut short: finish it with python -m "
                                                  r"tftrain.export .*/run --formats FORMATS\."):
        _fit(tmp_path)  # the training command, which asked for no export, does not inherit the pending one
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["after_steps"] == {"export": "pending"}


def test_ctrl_c_during_the_export_command_is_one_line_and_exit_130(monkeypatch, capsys):
    from tftrain import export as export_command

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(export_command, "main", interrupted)
    assert export_command._main() == 130
    assert capsys.readouterr().err.strip() == ("python -m tftrain.export: interrupted; the trained run is unchanged: "
                                               "rerun this command to export")


def test_sigterm_during_the_export_command_is_one_line_and_exit_143(monkeypatch, capsys):
    import os
    import signal
    import time

    from tftrain import export as export_command

    def terminated():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(export_command, "main", terminated)
    assert export_command._main() == 143 and signal.getsignal(signal.SIGTERM) == before
    assert capsys.readouterr().err.strip() == ("python -m tftrain.export: stopped by SIGTERM; the trained run is "
                                               "unchanged: rerun this command to export")


@pytest.mark.slow
def test_python_m_tftrain_export_refuses_to_replace_what_it_did_not_write(tmp_path, capsys):
    from tftrain import export

    _fit(tmp_path)
    mine = tmp_path / "run" / "export" / "saved_model"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("my own")
    assert export.main([str(tmp_path / "run"), "--formats", "saved_model"]) == 2
    assert f"{mine} exists and this run's metrics.json records no saved_model export written there" in \
        capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    (mine / "notes.txt").unlink()
    mine.rmdir()
    from tftrain.train import after_steps

    def cut_short(model, formats, run_dir, *args):  # Ctrl-C once part of the artifact is written
        (run_dir / "export" / "saved_model").mkdir(parents=True)
        raise KeyboardInterrupt

    export_all = after_steps.export
    after_steps.export = cut_short
    try:
        with pytest.raises(KeyboardInterrupt):
            export.main([str(tmp_path / "run"), "--formats", "saved_model"])
    finally:
        after_steps.export = export_all
    assert export.main([str(tmp_path / "run"), "--formats", "saved_model"]) == 0  # its own part: written again
    assert export.main([str(tmp_path / "run"), "--formats", "saved_model"]) == 0  # recorded: written again


def test_the_check_batch_of_unlabelled_data_is_its_features():
    import tensorflow as tf

    from tftrain.train.export import check_batch

    x = np.arange(24, dtype="float32").reshape(12, 2)
    for element in ((x,), (x, x[:, :1]), (x, x[:, :1], np.ones(12, "float32"))):
        got = check_batch(tf.data.Dataset.from_tensor_slices(element).batch(4), max_examples=3)
        np.testing.assert_array_equal(got, x[:3])


def test_a_stop_signal_that_comes_out_of_the_export_wrapped_by_tensorflow_is_a_stop(tmp_path, monkeypatch):
    import signal

    from tftrain.train import after_steps

    def stopped_inside_a_trace(*args, **kwargs):  # as TensorFlow wraps what the handler raised while tracing
        try:
            signal.raise_signal(signal.SIGTERM)
        except BaseException as error:
            raise RuntimeError("in user code:") from error

    monkeypatch.setattr(after_steps, "export", stopped_inside_a_trace)
    with pytest.raises(tftrain.Preempted, match="stopped by SIGTERM during the export"):
        _fit(tmp_path, export="saved_model")
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["after_steps"] == {"export": "pending"}
