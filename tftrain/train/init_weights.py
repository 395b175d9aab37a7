"""`--init-from PATH`: start from saved weights (fine-tuning). PATH: a `.keras` or `.weights.h5` file, a TensorFlow
checkpoint (the path before `.index`), or a run directory (its best kept checkpoint, else `model.keras`, else
`model.weights.h5`).
Source: https://www.tensorflow.org/guide/checkpoint, https://keras.io/api/models/model_saving_apis/
"""

from __future__ import annotations

from pathlib import Path
from typing import Tuple

from tftrain.errors import ConfigError

CHECKPOINTS_DIR = "checkpoints"
"""The run-directory folder of `--keep-best`'s checkpoints."""


def resolve(path: str) -> Tuple[str, str]:
    """`(kind, path)` of the weights `--init-from` names (`"keras"` or `"checkpoint"`); `ConfigError` if none."""
    p = Path(path).expanduser()
    if p.is_dir():
        state = p / CHECKPOINTS_DIR / "keep_best.json"
        if state.is_file():
            from tftrain.callbacks.keep_best import best_checkpoint, state_damaged

            if state_damaged(p / CHECKPOINTS_DIR):
                raise ConfigError(f"--init-from {path}: its {CHECKPOINTS_DIR}/keep_best.json is damaged, so which kept "
                                  f"checkpoint is best is unknown: pass one ({p / CHECKPOINTS_DIR}/best/epoch-N) or "
                                  f"{p / 'model.keras'}.")
            best = best_checkpoint(p / CHECKPOINTS_DIR)
            if best is not None:
                return "checkpoint", best
        for name in ("model.keras", "model.weights.h5"):  # the second: a model Keras cannot serialize
            if (p / name).is_file():
                return "keras", str(p / name)
        raise ConfigError(f"--init-from {path}: the directory holds neither kept checkpoints ({CHECKPOINTS_DIR}/"
                          "keep_best.json) nor model.keras (or model.weights.h5). Pass a run directory that finished, "
                          "a .keras file or a "
                          "checkpoint path.")
    if (p.suffix == ".keras" or p.name.endswith(".weights.h5")) and p.is_file():
        return "keras", str(p)
    if Path(f"{p}.index").is_file():
        return "checkpoint", str(p)
    raise ConfigError(f"--init-from {path}: no such .keras or .weights.h5 file, checkpoint (PATH.index) or run "
                      "directory.")


def load(model, kind: str, path: str) -> None:
    """Sets `model`'s weights from `resolve`'s `(kind, path)`; `ConfigError` names the first misfit, or a file that
    cannot be read (damaged: a checksum that does not match, a cut file)."""
    from tftrain.errors import one_line

    try:
        _load_keras(model, path) if kind == "keras" else _load_checkpoint(model, path)
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 (TensorFlow's DataLossError, zipfile's BadZipFile, h5py's OSError)
        raise ConfigError(f"--init-from {path} cannot be read ({one_line(error)}): it is damaged. Pass another "
                          "checkpoint or model file (a run's checkpoints/best/epoch-N, checkpoints/last or "
                          "model.keras).") from None


def _load_keras(model, path: str) -> None:
    import keras

    if path.endswith(".weights.h5"):
        _load_weights_only(model, path)
        return
    try:
        source = keras.models.load_model(path, compile=False)
    except (TypeError, ValueError):  # a class not registered here (a subclassed model)
        _load_weights_only(model, path)
        return
    mine, theirs = model.weights, source.weights
    for a, b in zip(mine, theirs):
        if tuple(a.shape) != tuple(b.shape):
            raise ConfigError(f"--init-from {path}: this model's weight {a.path} has shape {tuple(a.shape)}, the "
                              f"file's {b.path} {tuple(b.shape)}: it holds another model. Pass weights of this "
                              "task's model.")
    if len(mine) != len(theirs):
        raise ConfigError(f"--init-from {path}: this model has {len(mine)} weights, the file's {len(theirs)}: it "
                          "holds another model. Pass weights of this task's model.")
    model.set_weights(source.get_weights())


def _load_weights_only(model, path: str) -> None:
    """`model.load_weights(path)`, for a `.keras` file whose model cannot be rebuilt."""
    try:
        model.load_weights(path)
    except (ValueError, TypeError, KeyError, OSError) as error:  # OSError: h5py on a damaged file
        lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
        said = " ".join(lines[:2] if lines[0].endswith(":") else lines[:1])  # Keras's "Example error ...:" and it
        raise ConfigError(f"--init-from {path}: its weights do not fit this model ({said[:300]}). Pass weights of "
                          "this task's model.") from None


def _load_checkpoint(model, path: str) -> None:
    import tensorflow as tf

    try:
        from tftrain.runtime.precision import user_model

        status = tf.train.Checkpoint(model=user_model(model)).read(path)  # as KeepBest saves it
        status.expect_partial()  # no warnings for the rest (its save counter, an optimizer), nor for a mismatch
        status.assert_existing_objects_matched()  # every weight of this model is in it
    except (AssertionError, ValueError, tf.errors.InvalidArgumentError) as error:
        first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
        first = first.split(" Showing ")[0]  # TensorFlow then lists the unmatched variables with their values
        raise ConfigError(f"--init-from {path}: the checkpoint does not fit this model ({first[:300]}). Pass "
                          "weights of this task's model.") from None
