"""`--export saved_model,onnx,litert`: the trained model for serving, each artifact loaded back and
checked against the model.

Each format is written with Keras's own `model.export` into `export/` of the run directory
(`saved_model/`, `model.onnx`, `model.tflite`), then loaded by the runtime that serves it
(TensorFlow's `tf.saved_model.load`, ONNX Runtime, the LiteRT interpreter) and run on a batch
of test data: the largest absolute difference from the trained model's own outputs is printed
and recorded in `metrics.json` (`export`). A model trained under a mixed policy is exported in
float32 (the task's model rebuilt under float32 with the trained weights: ONNX export needs it,
keras-team/keras#20710). A format whose converter or runtime is not installed is refused before
training, naming the pip extra.

Source: https://keras.io/api/models/model_saving_apis/model_export/
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable, Dict, Sequence, Tuple

from tftrain.errors import ConfigError

FORMATS = {
    "saved_model": ("tf_saved_model", "saved_model", ()),
    "onnx": ("onnx", "model.onnx", ("tf2onnx", "onnxruntime")),
    "litert": ("litert", "model.tflite", ("ai_edge_litert",)),
}
"""Format -> (Keras's `model.export` format, its path under `export/`, the modules it needs)."""

EXTRAS = {"onnx": "onnx", "litert": "litert"}
"""Format -> the pip extra that installs what it needs (`pip install "tftrain[onnx]"`)."""


def parse(text: str) -> Tuple[str, ...]:
    """The formats `--export` names (comma-separated), each known and its converter installed.

    Raises:
        ConfigError: on an unknown format or one whose modules are missing (naming the pip extra).
    """
    formats = tuple(dict.fromkeys(f.strip() for f in text.split(",") if f.strip()))
    for name in formats:
        if name not in FORMATS:
            raise ConfigError(f"--export {text}: unknown format {name!r}. Pass any of {', '.join(FORMATS)}, "
                              "comma-separated.")
        missing = [m for m in FORMATS[name][2] if importlib.util.find_spec(m) is None]
        if missing:
            raise ConfigError(f"--export {name} needs {', '.join(missing)}, which is not installed: "
                              f"pip install \"tftrain[{EXTRAS[name]}]\" (or drop {name} from --export).")
    if not formats:
        raise ConfigError("--export names no format. Pass any of saved_model, onnx, litert, comma-separated.")
    return formats


def export_all(model, formats: Sequence[str], directory: Path, batch) -> Dict[str, dict]:
    """Writes `model` in each format under `directory` and checks each artifact on `batch`.

    Args:
        model: a float32 Keras model (the trained weights).
        formats: from `FORMATS`.
        directory: the `export/` folder (created).
        batch: input features of one batch (a NumPy array), run through the model and each artifact.

    Returns:
        `{format: {"path": str, "max_abs_difference": float}}`.
    """
    import numpy as np

    directory.mkdir(parents=True, exist_ok=True)
    expected = np.asarray(model(batch, training=False), dtype="float32")
    out = {}
    for name in formats:
        keras_format, filename, _ = FORMATS[name]
        path = directory / filename
        model.export(str(path), format=keras_format, verbose=False)
        got = np.asarray(_RUNNERS[name](path)(batch), dtype="float32").reshape(expected.shape)
        out[name] = {"path": str(path), "max_abs_difference": float(np.max(np.abs(got - expected)))}
    return out


def check_batch(dataset):
    """The features of `dataset`'s first batch as one float NumPy array, the input the artifacts are
    checked on.

    Raises:
        ConfigError: when the model takes several inputs (a dict or tuple of features): the check
            feeds one input.
    """
    import numpy as np

    features = next(iter(dataset.take(1)))
    features = features[0] if isinstance(features, tuple) else features
    if not hasattr(features, "numpy"):
        raise ConfigError("--export checks one input per model; this task's model takes several. Export it "
                          "yourself with model.export(...) from model.keras.")
    return np.asarray(features.numpy())


def _saved_model(path: Path) -> Callable:
    import tensorflow as tf

    loaded = tf.saved_model.load(str(path))
    return lambda x: loaded.serve(x).numpy()


def _onnx(path: Path) -> Callable:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})[0]


def _litert(path: Path) -> Callable:
    from ai_edge_litert.interpreter import Interpreter

    def run(x):
        interpreter = Interpreter(model_path=str(path))
        (entry,), (exit_,) = interpreter.get_input_details(), interpreter.get_output_details()
        interpreter.resize_tensor_input(entry["index"], x.shape)
        interpreter.allocate_tensors()
        interpreter.set_tensor(entry["index"], x.astype(entry["dtype"]))
        interpreter.invoke()
        return interpreter.get_tensor(exit_["index"])

    return run


_RUNNERS = {"saved_model": _saved_model, "onnx": _onnx, "litert": _litert}
