"""`--export saved_model,onnx,litert`: each format written with Keras's `model.export`
(https://keras.io/api/models/model_saving_apis/model_export/), loaded by its serving runtime and run on a test batch;
the largest difference from the model goes into `metrics.json`. Mixed-precision models export in float32 (ONNX needs
it, keras-team/keras#20710)."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

from tftrain.errors import ConfigError

CONVERTER_NOISE = re.compile(r"tf_tfl_flatbuffer_helpers\.cc:\d+\] Ignored (output_format|drop_control_dependency)")
"""TensorFlow's C++ warnings on each LiteRT conversion (TF 2.21) about options Keras's exporter sets; dropped."""

TOLERANCE = 1e-3
"""The largest difference an artifact's outputs may have from the float32 model's, relative to 1 + the largest
output magnitude (float32 kernels of another runtime differ by about 1e-7 to 1e-5)."""

FORMATS = {
    "saved_model": ("tf_saved_model", "saved_model", ()),
    "onnx": ("onnx", "model.onnx", ("tf2onnx", "onnxruntime")),
    "litert": ("litert", "model.tflite", ("ai_edge_litert",)),
}
"""Format -> (Keras's `model.export` format, its path under `export/`, the modules it needs)."""

EXTRAS = {"onnx": "onnx", "litert": "litert"}
"""Format -> the pip extra installing what it needs (`pip install "tftrain[onnx]"`)."""


def parse(text: str) -> Tuple[str, ...]:
    """The formats `--export` names (comma-separated); `ConfigError` on an unknown or uninstalled one."""
    formats = tuple(dict.fromkeys(f.strip() for f in text.split(",") if f.strip()))
    for name in formats:
        if name not in FORMATS:
            raise ConfigError(f"--export {text}: unknown format {name!r}. Pass any of {', '.join(FORMATS)}, "
                              "comma-separated.")
    missing = {name: [m for m in FORMATS[name][2] if importlib.util.find_spec(m) is None] for name in formats}
    missing = {name: modules for name, modules in missing.items() if modules}
    if missing:  # all formats' at once, so one install serves
        needs = "; ".join(f"{name} needs {' and '.join(modules)}" for name, modules in missing.items())
        extras = ",".join(EXTRAS[name] for name in missing)
        raise ConfigError(f"--export: {needs}, not installed. Install the extra: pip install -e \".[{extras}]\" in a "
                          f"clone of tftrain (pip install \"tftrain[{extras}]\" from a package), or drop "
                          f"{' and '.join(missing)} from --export.")
    if not formats:
        raise ConfigError("--export names no format. Pass any of saved_model, onnx, litert, comma-separated.")
    return formats


def export_all(model, formats: Sequence[str], directory: Path, features) -> Dict[str, dict]:
    """Writes `model` (built, float32) in each format under `directory` and checks each artifact on `features` (one
    NumPy batch in the model's input structure): `{format: {"path", "max_abs_difference", "outputs": [name, ...]}}`.
    `ExportCheckFailed` if an artifact's outputs differ from the model's in names, shapes or values (`TOLERANCE`)."""
    import numpy as np
    import tensorflow as tf

    _check_flat("inputs", features)
    tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)  # the artifacts' runtimes compute float32
    try:
        outputs = model(features, training=False)
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(tf32)
    _check_flat("outputs", outputs)
    directory.mkdir(parents=True, exist_ok=True)
    expected = output_arrays(outputs)
    feeds = input_feeds(model, features)
    out = {}
    for name in formats:
        keras_format, filename, _ = FORMATS[name]
        path = directory / filename
        with warnings.catch_warnings(), _converter_errors() as failed:  # Keras 3.15's ONNX path: `np.object`
            warnings.filterwarnings("ignore", message=".*np.object.*", category=FutureWarning)
            try:
                with native_lines_dropped(CONVERTER_NOISE):
                    model.export(str(path), format=keras_format, verbose=False)
                served = _RUNNERS[name](path)(feeds, features)
            except Exception as error:
                if failed:  # the converter's own account of the first node it could not convert
                    raise ExportCheckFailed(failed[0]) from error
                raise
        got = _match_outputs(name, served, expected)
        worst = max(float(np.max(_differences(got[k], expected[k]), initial=0.0)) for k in expected)
        bound = TOLERANCE * (1.0 + max(float(np.max(np.abs(v[np.isfinite(v)]), initial=0.0))
                                       for v in expected.values()))
        if not worst <= bound:  # a NaN only the artifact has included
            raise ExportCheckFailed(f"the {name} artifact's outputs differ from the model's by up to {worst:.2e} "
                                    f"(more than {bound:.1e}) on the same examples: it does not compute what the "
                                    "model does")
        out[name] = {"path": str(path), "max_abs_difference": worst, "outputs": list(expected)}
    return out


def _differences(got, want):
    """`|got - want|`, 0 where both are the same non-finite value (NaN, or an infinity of one sign)."""
    import numpy as np

    same = (np.isnan(got) & np.isnan(want)) | (np.isinf(got) & (got == want))
    return np.where(same, 0.0, np.abs(got - want))


class _Collect(logging.Handler):
    """Keeps tf2onnx's node conversion errors as one line each (it logs them with a traceback and goes on)."""

    def __init__(self, into: list):
        super().__init__(logging.ERROR)
        self.into = into

    def emit(self, record) -> None:
        node = re.sub(r"\s*\(fct=.*", "", (record.getMessage().splitlines() or [""])[0])
        cause = record.exc_info[1] if record.exc_info else None
        self.into.append(f"tf2onnx: {node}" + (f": {str(cause).removeprefix('make_sure failure: ')}" if cause else ""))


@contextlib.contextmanager
def _converter_errors():
    """Within the block, tf2onnx's error records are collected into the list it yields instead of printed."""
    failed: list = []
    logger = logging.getLogger("tf2onnx")
    handler, propagate = _Collect(failed), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield failed
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


FATAL_LINE = re.compile(r"^(F\d{4} |Fatal Python error|terminate called)")
"""A native crash's own line (absl's FATAL level, CPython's, C++'s `std::terminate`): passed on even where every
other line is dropped."""


@contextlib.contextmanager
def native_lines_dropped(pattern: Optional[re.Pattern] = None, fds: Sequence[int] = (2,)):
    """Within the block, lines the process writes to the file descriptors `fds` (2: stderr, where TensorFlow's C++
    code logs; 1: stdout) that match `pattern` are dropped (None: every line but a `FATAL_LINE`). The others are
    passed on as they come, within about 50 ms: the descriptors write to a temporary file (a write never blocks,
    whoever holds the GIL) that a thread reads. The descriptors are restored however the block ends."""
    def flush(fd):
        {1: sys.stdout, 2: sys.stderr}.get(fd, sys.stdout).flush()

    restore, stop, reader = [], threading.Event(), None
    with contextlib.ExitStack() as files:
        try:
            for fd in fds:
                flush(fd)
                restore.append((fd, os.dup(fd), files.enter_context(tempfile.TemporaryFile())))
                os.dup2(restore[-1][2].fileno(), fd)
            reader = threading.Thread(target=_forward_lines, args=(restore, pattern, stop), daemon=True)
            reader.start()
            yield
        finally:
            for fd, copy, _ in reversed(restore):
                flush(fd)
                os.dup2(copy, fd)
            stop.set()
            if reader is not None:
                reader.join()
            else:  # redirecting failed partway: what was held is passed on now
                _forward_lines(restore, pattern, stop)
            for _, copy, _ in restore:
                os.close(copy)


def _forward_lines(held, pattern: Optional[re.Pattern], stop: threading.Event) -> None:
    """Writes the whole lines that `held` (`[(fd, its saved copy, temporary file)]`) gained since the last pass
    and that `pattern` keeps to each saved copy, every 50 ms until `stop`, then what is left."""
    offsets, pending = [0] * len(held), [b""] * len(held)
    while True:
        last = stop.is_set()
        for i, (_, copy, file) in enumerate(held):
            while chunk := os.pread(file.fileno(), 1 << 16, offsets[i]):
                offsets[i] += len(chunk)
                pending[i] += chunk
            lines = pending[i].splitlines(True)
            pending[i] = lines.pop() if lines and not last and not lines[-1].endswith(b"\n") else b""
            for line in lines:
                text = line.decode(errors="replace")
                if FATAL_LINE.match(text) if pattern is None else not pattern.search(text):
                    os.write(copy, line)
        if last:
            return
        stop.wait(0.05)


class ExportCheckFailed(RuntimeError):
    """An exported artifact's outputs do not match the model's (names, count or shapes), or the model's inputs
    or outputs nest (a serving signature takes and returns one flat dict or list of tensors)."""


def _check_flat(what: str, structure) -> None:
    """`ExportCheckFailed` naming the first entry of a dict or list `structure` that is itself a dict or list."""
    items = structure.items() if isinstance(structure, dict) else enumerate(structure) \
        if isinstance(structure, (list, tuple)) else ()
    for key, value in items:
        if isinstance(value, (dict, list, tuple)):
            raise ExportCheckFailed(f"the model's {what} nest: {key!r} holds a {type(value).__name__}, and a served "
                                    f"model takes and returns one flat dict or list of tensors; give the model flat "
                                    f"{what} (e.g. keys joined as '{key}_<name>')")


def output_arrays(outputs) -> Dict[str, "object"]:
    """The model's outputs as `{serving name: float32 array}`: a dict's keys, else `output_0`, ... in order."""
    import numpy as np
    import tensorflow as tf

    if isinstance(outputs, dict):
        return {str(k): np.asarray(v, dtype="float32") for k, v in sorted(outputs.items())}
    return {f"output_{i}": np.asarray(v, dtype="float32") for i, v in enumerate(tf.nest.flatten(outputs))}


def input_feeds(model, features) -> Dict[str, "object"]:
    """`features` as `{serving input name: array}`: by dict key, else the model's input names in order, else
    `"inputs"` (`"inputs_<i>"` for several)."""
    import numpy as np

    if isinstance(features, dict):
        return {str(k): np.asarray(v) for k, v in features.items()}
    names = [t.name for t in (getattr(model, "inputs", None) or [])]
    items = list(features) if isinstance(features, (tuple, list)) else [features]
    if len(names) != len(items):
        names = ["inputs"] if len(items) == 1 else [f"inputs_{i}" for i in range(len(items))]
    return {n: np.asarray(v) for n, v in zip(names, items)}


def _match_outputs(fmt: str, got: Dict[str, "object"], expected: Dict[str, "object"]) -> Dict[str, "object"]:
    """`got` keyed like `expected` (by name, else position); `ExportCheckFailed` on another count or shape."""
    import numpy as np

    if set(got) != set(expected):
        if len(got) != len(expected):
            raise ExportCheckFailed(f"the {fmt} artifact has {len(got)} output(s) ({', '.join(got)}); the model has "
                                    f"{len(expected)} ({', '.join(expected)})")
        got = dict(zip(expected, got.values()))
    out = {}
    for key, want in expected.items():
        value = np.asarray(got[key], dtype="float32")
        if value.size != want.size:
            raise ExportCheckFailed(f"the {fmt} artifact's output {key!r} has shape {value.shape}; the model's has "
                                    f"{want.shape}")
        out[key] = value.reshape(want.shape)
    return out


def check_batch(dataset, max_examples: int = 8):
    """The features of `dataset`'s first batch (at most `max_examples`) as NumPy arrays: a tuple element is
    `(x,)`, `(x, y)` or `(x, y, sample_weight)`, as `Model.fit` reads it."""
    import tensorflow as tf

    element = next(iter(dataset.take(1)))
    features = element[0] if isinstance(element, tuple) and len(element) in (1, 2, 3) else element
    return tf.nest.map_structure(lambda t: t.numpy()[:max_examples], features)


def _saved_model(path: Path) -> Callable:
    """Runs the artifact's `serve` endpoint on the model's input structure (its serving signature names the inputs
    of a subclassed model `args_0`, `args_0_1`, ..., in no fixed order)."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(path))  # kept: the endpoint's variables live as long as it does

    def run(feeds, features):
        serve = loaded.serve
        specs = serve.concrete_functions[0].structured_input_signature[0][0]
        try:  # a list or a tuple of inputs alike
            tf.nest.assert_same_structure(specs, features, check_types=False)
        except (ValueError, TypeError):  # one input fed as a 1-tuple or a dict of one
            features = tf.nest.pack_sequence_as(specs, tf.nest.flatten(features))
        return output_arrays(serve(tf.nest.map_structure(lambda spec, x: tf.constant(x, dtype=spec.dtype), specs,
                                                         features, check_types=False)))

    return run


def _onnx(path: Path) -> Callable:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    types = {i.name: i.type for i in session.get_inputs()}

    def run(feeds, features=None):
        named = _by_names(feeds, list(types))
        values = session.run(None, {n: x.astype(_ONNX_DTYPES.get(types[n], x.dtype)) for n, x in named.items()})
        return {o.name: v for o, v in zip(session.get_outputs(), values)}

    return run


_ONNX_DTYPES = {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(int32)": "int32",
                "tensor(int64)": "int64", "tensor(float16)": "float16", "tensor(bool)": "bool"}
"""ONNX Runtime's input type names -> NumPy dtypes (strings left as they are)."""


def _litert(path: Path) -> Callable:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    def run(feeds, features=None):  # built-in kernels, without the default XNNPACK delegate (which announces itself)
        interpreter = Interpreter(model_path=str(path),
                                  experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        runner = interpreter.get_signature_runner("serving_default")
        details = runner.get_input_details()
        named = _by_names(feeds, list(details))
        return runner(**{n: x.astype(details[n]["dtype"]) for n, x in named.items()})

    return run


def _by_names(feeds: Dict[str, "object"], names: Sequence[str]) -> Dict[str, "object"]:
    """`feeds` keyed by the artifact's input `names` (by name, else position); `ExportCheckFailed` if counts differ."""
    if set(feeds) == set(names):
        return feeds
    if len(feeds) != len(names):
        raise ExportCheckFailed(f"the artifact takes {len(names)} input(s) ({', '.join(names)}); the model's batch "
                                f"has {len(feeds)} ({', '.join(feeds)})")
    return dict(zip(names, feeds.values()))


_RUNNERS = {"saved_model": _saved_model, "onnx": _onnx, "litert": _litert}
