"""--export writes the trained model for serving and checks each artifact in the runtime that serves it
(TensorFlow, ONNX Runtime, the LiteRT interpreter); a missing converter is refused before training."""

import json

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
    exported = record.extras["export"]
    assert set(exported) == {"saved_model", "onnx", "litert"}
    run = tmp_path / "run"
    assert (run / "export" / "saved_model" / "saved_model.pb").is_file()
    assert (run / "export" / "model.onnx").is_file() and (run / "export" / "model.tflite").is_file()
    for name, figures in exported.items():  # the float32 model (its float32 twin under a mixed policy)
        assert figures["max_abs_difference"] < 1e-4, (name, figures)
    assert json.loads((run / "metrics.json").read_text())["export"] == exported


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
