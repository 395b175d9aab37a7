import json

import numpy as np
import pytest

import tftrain

from tftrain import reports


def test_versions_names_the_stack():
    v = reports.versions()
    assert v["tensorflow"] and v["keras"] and v["tftrain"] and v["python"].count(".") == 2


def test_metrics_json_holds_numpy_scalars_and_report_table(tmp_path):
    metrics = {"test_accuracy": np.float32(0.98), "test": {"accuracy": np.float32(0.98), "mae": 0.25,
                                                           "cls.head_accuracy": 0.5},  # an output named with a dot
               "history": {"loss": [2.0, 1.0], "val_mae": [0.5, 0.375], "val_cls.head_loss": [0.75]},
               "replicas": np.int64(2),
               "devices": ("a", "b"), "examples_per_sec": 1234.5, "argv": ["python", "-m", "x"]}
    path = reports.write_metrics(tmp_path, metrics)
    loaded = json.loads(path.read_text())
    assert abs(loaded["test_accuracy"] - 0.98) < 1e-6 and loaded["replicas"] == 2
    assert loaded["devices"] == ["a", "b"]
    text = reports.write_report(tmp_path, metrics, title="t").read_text()
    assert "| Test accuracy | 0.9800 |" in text and "| Training examples/sec | 1,234 |" in text
    assert "| Test mae | 0.2500 |" in text and "| Validation mae (last epoch) | 0.3750 |" in text
    assert "| Test cls.head_accuracy | 0.5000 |" in text and "| Validation cls.head_loss (last epoch) | 0.7500 |" in text
    assert "`python -m x`" in text


def test_a_report_written_back_after_a_kill_is_titled_as_the_run_s_own(tmp_path):
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class HParams:
        model: str = "mlp"
        width: int = 64

    (tmp_path / "metrics.json").write_text(json.dumps({"task": "mnist", "model": "cnn", "width": 32}))
    reports.write_missing_report(tmp_path, HParams())  # metrics.json holds the trained values at its top level
    assert (tmp_path / "report.md").read_text().splitlines()[0] == "# " + reports.run_title(
        "mnist", {"model": "cnn", "width": 32}) == "# mnist (model=cnn, width=32)"
    (tmp_path / "report.md").write_text("kept")
    reports.write_missing_report(tmp_path, HParams())  # an existing report is left as it is
    assert (tmp_path / "report.md").read_text() == "kept"


@pytest.mark.slow
def test_model_keras_and_metrics_json_reach_the_disk_before_the_backup_is_deleted(tmp_path, monkeypatch):
    import shutil

    import os
    from pathlib import Path

    from tftrain import files

    x = np.zeros((64, 4), "float32")
    events = []
    flush = files.fsync_file
    monkeypatch.setattr(files, "fsync_file", lambda path: (events.append(f"fsync {Path(path).name}"),
                                                                flush(path)))
    remove = shutil.rmtree
    monkeypatch.setattr(shutil, "rmtree", lambda path, *a, **k: (events.append(f"rmtree {Path(path).name}"),
                                                                 remove(path, *a, **k)))
    tftrain.Trainer(tftrain.ArrayTask(_dense, x, x[:, :1], loss="mse"), epochs=1, batch_size=32, verbose=0,
                    run_dir=str(tmp_path / "run")).fit()
    before = events[:events.index("rmtree backup")]
    assert {f"fsync .tmp-{os.getpid()}-model.keras", f"fsync .tmp-{os.getpid()}-metrics.json"} <= set(before), events


def _dense():
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
