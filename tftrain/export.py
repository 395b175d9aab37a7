"""`python -m tftrain.export RUN_DIR --formats saved_model,onnx,litert`: a finished run's model for serving.

Loads `RUN_DIR/model.keras`, writes each format under `RUN_DIR/export/` with `model.export`, runs each
artifact on a few examples made from the model's input signature, and records the results in
`metrics.json`, as `--export` does at the end of a run. A mixed-policy model is exported in float32; a
subclassed model (no symbolic inputs) is exported by rerunning its training command with `--export`.

Exit codes: 0 exported and checked; 2 bad input (no finished run, an unknown format, a converter not
installed); 1 an export that failed.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import List, Optional

from tftrain import rundir as rundir_lib
from tftrain.cli import OneLineParser
from tftrain.errors import ConfigError

PROG = "python -m tftrain.export"


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line; raises `ConfigError` (one line) on a bad one."""
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a finished run's directory (it holds model.keras)")
    parser.add_argument("--formats", default="saved_model", metavar="FORMATS",
                        help="saved_model, onnx, litert, comma-separated (default: saved_model)")
    parser.add_argument("--task", metavar="FILE.py[:NAME]", help="the training command's task file (or module), "
                        "imported first so that the custom layers, losses and metrics it registers load")
    return parser.parse_args(argv)


def _task_of(run_dir: Path) -> Optional[str]:
    """The `WHERE:NAME` task of the training command `metrics.json` records, else None."""
    import json

    try:
        argv = json.loads((run_dir / rundir_lib.METRICS_FILE).read_text(encoding="utf-8")).get("argv") or []
    except (OSError, ValueError, AttributeError):
        return None
    return next((a for a in argv if isinstance(a, str) and not a.startswith("-") and ":" in a and "://" not in a),
                None) if isinstance(argv, list) else None


def check(run_dir: Path, formats_text: str):
    """The parsed formats, once `run_dir` holds a finished run; else raises `ConfigError` naming the fix."""
    from tftrain.train import export as export_lib

    formats = export_lib.parse(formats_text)
    if not (run_dir / rundir_lib.MODEL_FILE).is_file() and (run_dir / rundir_lib.WEIGHTS_FILE).is_file():
        raise ConfigError(f"{str(run_dir)!r} holds the trained weights only ({rundir_lib.WEIGHTS_FILE}: Keras could "
                          "not serialize the model). Build the model in Python, call it on a batch, "
                          "model.load_weights them and call model.export (or train again with --export).")
    if not (run_dir / rundir_lib.MODEL_FILE).is_file() or not (run_dir / rundir_lib.METRICS_FILE).is_file():
        raise ConfigError(f"{str(run_dir)!r} holds no finished run ({rundir_lib.MODEL_FILE} and "
                          f"{rundir_lib.METRICS_FILE}). Pass the directory of a run that finished training.")
    import json

    try:
        metrics = json.loads((run_dir / rundir_lib.METRICS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        metrics = e
    if not isinstance(metrics, dict):  # the export's results are recorded there
        raise ConfigError(f"{run_dir / rundir_lib.METRICS_FILE} is damaged (not a JSON object), and the export "
                          "records its results there: write it back from a copy, then export again.")
    from tftrain.train import after_steps

    ours = (metrics.get("after_steps") or {}).get("export") not in (None, "done")  # a cut export's are its own
    recorded = metrics.get("export") if isinstance(metrics.get("export"), dict) else {}
    for name in formats:
        target = run_dir / after_steps.EXPORT_DIR / export_lib.FORMATS[name][1]
        if target.exists() and not ours and name not in recorded:
            raise ConfigError(f"{target} exists and this run's {rundir_lib.METRICS_FILE} records no {name} export "
                              "written there: move it out of the way, then rerun this command.")
    return formats


def signature_features(model, batch: int = 4):
    """A batch of `batch` examples in the structure of `model.input` (random normal floats, zeros for
    integers, empty strings); raises `ConfigError` for a model without symbolic inputs."""
    import numpy as np
    import tensorflow as tf

    if not getattr(model, "inputs", None):
        raise ConfigError(f"{type(model).__name__} has no input signature (a subclassed model): its training "
                          "command exports it when given --export before it trains; for this run, export it from "
                          "Python: build it, call it on a batch, model.load_weights('RUN_DIR/model.keras'), then "
                          "model.export(PATH, format=...).")
    rng = np.random.default_rng(0)

    def example(tensor):
        shape = [batch] + [d if d is not None else 8 for d in tensor.shape[1:]]
        dtype = tf.as_dtype(tensor.dtype)
        if dtype == tf.string:
            return np.full(shape, b"", dtype=object)
        if dtype.is_integer or dtype.is_bool:
            return np.zeros(shape, dtype.as_numpy_dtype)
        return rng.standard_normal(shape).astype(dtype.as_numpy_dtype)

    from tftrain import _compat

    structure = _compat.input_structure(model)  # a loaded Sequential has `inputs` but no `input` until called
    if structure is None:
        structure = model.inputs[0] if len(model.inputs) == 1 else list(model.inputs)
    return tf.nest.map_structure(example, structure)


def float32_model(model):
    """`model` when every layer computes in float32, else a copy with its weights whose config has every
    mixed dtype policy replaced by `"float32"`, as `--export` exports it (ONNX export needs float32)."""
    if all(getattr(layer, "compute_dtype", "float32") == "float32" for layer in model.layers):
        return model

    def float32(config):
        if isinstance(config, dict):
            return {k: ("float32" if k == "dtype" and _mixed(v) else float32(v)) for k, v in config.items()}
        if isinstance(config, list):
            return [float32(v) for v in config]
        return config

    copy = type(model).from_config(float32(model.get_config()))
    copy.set_weights(model.get_weights())
    return copy


def _mixed(dtype) -> bool:
    """Whether a layer config's `dtype` entry names a mixed policy (as a name or a serialised DTypePolicy)."""
    name = dtype.get("config", {}).get("name") if isinstance(dtype, dict) else dtype
    return isinstance(name, str) and name.startswith("mixed_")


def _recorded_exports(run_dir: Path) -> dict:
    """The formats `metrics.json` records as exported whose artifacts are still there (another format's export
    keeps them)."""
    import json

    from tftrain.train import after_steps

    try:
        recorded = json.loads((run_dir / rundir_lib.METRICS_FILE).read_text(encoding="utf-8")).get("export")
    except (OSError, ValueError, AttributeError):
        return {}
    def kept(entry) -> bool:  # a path as the training command wrote it, perhaps relative to where it ran
        return isinstance(entry, dict) and bool(entry.get("path")) and (
            run_dir / after_steps.EXPORT_DIR / Path(str(entry["path"])).name).exists()

    return {name: entry for name, entry in recorded.items() if kept(entry)} if isinstance(recorded, dict) else {}


def main(argv: Optional[List[str]] = None) -> int:
    """Exports and checks; returns the exit code (module docstring)."""
    try:
        args = parse_args(argv)
        run_dir = Path(args.run_dir)
        formats = check(run_dir, args.formats)
        if args.task:  # its file registers its custom objects (keras.saving.register_keras_serializable)
            from tftrain.errors import one_line
            from tftrain.train.user_code import import_where

            where = args.task.rpartition(":")[0] or args.task
            try:
                import_where(where)
            except Exception as e:  # noqa: BLE001 (the user's file: one line)
                raise ConfigError(f"--task {args.task}: could not import {where!r} ({one_line(e)}).") from None
        import keras

        from tftrain.train import after_steps

        model = float32_model(keras.models.load_model(run_dir / rundir_lib.MODEL_FILE, compile=False))
        features = signature_features(model)
    except ConfigError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 (a model.keras that does not load: one line)
        from tftrain.errors import cause_line

        task = None if args.task else _task_of(run_dir)
        fix = (f"If it holds custom layers, losses or metrics, pass --task {task} (the training command's task file "
               "registers them); else export" if task else "Export")
        print(f"{PROG}: error: {run_dir / rundir_lib.MODEL_FILE} does not load ({cause_line(e)}). {fix} it from "
              "Python: build the task's model, model.load_weights(...) from that file, then model.export(...).",
              file=sys.stderr)
        return 2
    try:
        with rundir_lib.locked(run_dir):
            after_steps.update_metrics(run_dir, after_steps={"export": "pending"})  # what it writes is its own
            results = after_steps.export(model, formats, run_dir, features, print)
            after_steps.update_metrics(run_dir, export={**_recorded_exports(run_dir), **results},
                                       after_steps={"export": "done"})
    except ConfigError as e:  # the run directory is in use
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 (one line; the run is unchanged)
        from tftrain.run import no_space_where

        where = no_space_where(e, run_dir / after_steps.EXPORT_DIR)
        what = (f"no space left on the disk holding {where}; free space on that disk, then rerun this command (the "
                "trained run is unchanged)") if where else after_steps.failure_status(e).removeprefix("failed: ")
        print(f"{PROG}: export failed: {what}", file=sys.stderr)
        return 1
    print(f"exported {', '.join(formats)} to {run_dir / after_steps.EXPORT_DIR}; metrics.json updated")
    return 0


def _main() -> int:
    """`main`, with Ctrl-C (exit 130) or SIGTERM (143) one line: the trained run is unchanged, the same command
    exports again."""
    from tftrain.errors import interrupted, sigterm_as_interrupt

    previous = sigterm_as_interrupt()
    try:
        return main()
    except KeyboardInterrupt as e:
        words, code = interrupted(e)
        print(f"\n{PROG}: {words}; the trained run is unchanged: rerun this command to export", file=sys.stderr)
        return code
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's info lines, as `python -m tftrain.run`
    exit_code = _main()
    if exit_code == 0:  # exported: a signal in the interpreter's slow teardown must not turn exit 0 into 143
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(exit_code)
