"""Zoo: tftrain's automatic settings against plain Keras and a settings grid, on six models.

Goal 2 of the performance issue. Six Keras models of different shapes (`ZOO`),
each at one global batch size a user would pick, with Adam and the same loss
for every contender:

* plain Keras as a user writes it: `compile(optimizer="adam", ...)` and
  `fit(x, y, batch_size=B)` on NumPy arrays, every Keras default (on a CPU:
  graph mode, no XLA, steps_per_execution 1, TensorFlow's thread counts);
* the grid: execution mode (graph, XLA) x steps_per_execution (1, 8, 32) x
  intra-op / inter-op threads (TensorFlow's defaults and two others), the same
  `fit` on the same arrays;
* tftrain: `tftrain.Trainer(tftrain.ArrayTask(...), execution="auto",
  steps_per_execution="auto", precision="float32")` over the same arrays,
  timing its `--execution auto` probe (the `choose_execution` stage) on its own.

Every contender is timed by the same stopwatch, a Keras callback around whole
epochs: examples/sec = examples per epoch / fastest epoch after the first (which
traces and compiles). TensorFlow reads thread counts once, so each thread setting
is a worker process (`--threads INTRA,INTER`) timing every model's grid points;
plain Keras and tftrain run in the worker with TensorFlow's default threads.

Goal, per model: tftrain >= 95% of the grid's best examples/sec, never below
plain Keras, and its probe <= 3% of a 10-epoch run on a realistic dataset size
(`ZooModel.dataset_size`), or nothing when a remembered choice applies: tftrain
gets an empty choice memory (`TFTRAIN_CACHE_DIR`), so its timed run probes, and
a second short run shows what the next run of the same model pays.

    python -m benchmarks.zoo [--quick] [--models mlp,wide]
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

from benchmarks import common

NAME = "zoo"

GRID = (("graph", 1), ("graph", 8), ("graph", 32), ("xla", 1), ("xla", 8), ("xla", 32))
"""(execution, steps_per_execution) pairs of the grid, timed at every thread setting."""

QUICK_GRID = (("graph", 1), ("graph", 8))
"""The grid at `--quick`: graph only (XLA compiles take longest), one thread setting."""

QUICK_MODELS = ("mlp", "wide")
"""Models timed at `--quick`: the MNIST MLP and one synthetic-data model."""

EPOCHS, QUICK_EPOCHS = 4, 2
"""Epochs per contender; the first (tracing, compiling) is never timed."""

DOMINATED = 2.0
"""A grid point stops after its first timed epoch when that epoch took over this many times the
fastest epoch its model has had so far in the process (it cannot be the best)."""

TARGETS = {"fraction_of_grid_best": 0.95, "fraction_of_plain_keras": 1.0, "probe_fraction_of_10_epochs": 0.03}
"""The goals: tftrain / grid best, tftrain / plain Keras (at least), probe / a 10-epoch run (at most)."""

SEQUENCE_LENGTH, TEXT_VOCAB = 64, 5000
"""Token sequences of the Transformer and the LSTM: length and vocabulary size."""

WIDE_VOCAB, WIDE_IDS = 100_000, 16
"""The wide model: vocabulary of its ids and ids per example."""


# --- Models (each a builder `() -> uncompiled keras.Model`) ---------------------------
# No builder takes an argument (ArrayTask would pass a required one the task's hyperparameters).

def mlp():
    """The MNIST recipe's MLP: `(batch, 28, 28)` raw pixels -> `(batch, 10)` probabilities."""
    return common.build_model("mlp")


def cnn():
    """The MNIST recipe's CNN: `(batch, 28, 28)` raw pixels -> `(batch, 10)` probabilities."""
    return common.build_model("cnn")


def _residual_block(x, filters: int, stride: int):
    """Two 3x3 convolutions with BatchNorm, added to the input (a 1x1 projection where the shape changes)."""
    from keras import layers

    y = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
    y = layers.ReLU()(layers.BatchNormalization()(y))
    y = layers.BatchNormalization()(layers.Conv2D(filters, 3, padding="same", use_bias=False)(y))
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
        shortcut = layers.BatchNormalization()(layers.Conv2D(filters, 1, strides=stride, use_bias=False)(x))
    return layers.ReLU()(layers.Add()([y, shortcut]))


def resnet():
    """A small ResNet: stride-2 stem, residual blocks of 16 and 32 filters with BatchNorm, global pooling.

    Returns:
        An uncompiled `keras.Model`: `(batch, 32, 32, 3)` float32 images ->
        `(batch, 10)` class probabilities.
    """
    import keras
    from keras import layers

    inputs = keras.Input((32, 32, 3))
    x = layers.Conv2D(16, 3, strides=2, padding="same", use_bias=False)(inputs)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    for filters, stride in ((16, 1), (32, 2)):
        x = _residual_block(x, filters, stride)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(10, activation="softmax")(x), name="resnet")


@functools.lru_cache(maxsize=None)
def _position_embedding():
    """The `PositionEmbedding` layer class, defined on first use (the parent process imports no Keras)."""
    import keras

    @keras.saving.register_keras_serializable(package="benchmarks.zoo")
    class PositionEmbedding(keras.layers.Layer):
        """Adds a learned vector per position to `(batch, length, dim)` embeddings."""

        def build(self, input_shape):
            self.positions = self.add_weight(shape=tuple(input_shape[1:]), initializer="random_normal",
                                             name="positions")

        def call(self, x):
            return x + self.positions

    return PositionEmbedding


def _encoder_block(x, heads: int, hidden: int):
    """Self-attention and a feed-forward layer, each added to its input and layer-normalised."""
    from keras import layers

    dim = x.shape[-1]
    attention = layers.MultiHeadAttention(heads, key_dim=dim // heads)(x, x)
    x = layers.LayerNormalization()(layers.Add()([x, attention]))
    y = layers.Dense(dim)(layers.Dense(hidden, activation="relu")(x))
    return layers.LayerNormalization()(layers.Add()([x, y]))


def transformer():
    """A Transformer encoder text classifier: token and position embeddings (width 32), two encoder
    blocks (2 attention heads, 64 feed-forward units), average pooling.

    Returns:
        An uncompiled `keras.Model`: `(batch, SEQUENCE_LENGTH)` int32 token ids
        in `[0, TEXT_VOCAB)` -> `(batch, 1)` probability.
    """
    import keras
    from keras import layers

    inputs = keras.Input((SEQUENCE_LENGTH,), dtype="int32")
    x = _position_embedding()()(layers.Embedding(TEXT_VOCAB, 32)(inputs))
    for _ in range(2):
        x = _encoder_block(x, heads=2, hidden=64)
    x = layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, layers.Dense(1, activation="sigmoid")(x), name="transformer")


def lstm():
    """An LSTM text classifier: embedding (width 32), one LSTM layer of 32 units, a sigmoid.

    Returns:
        An uncompiled `keras.Model`: `(batch, SEQUENCE_LENGTH)` int32 token ids ->
        `(batch, 1)` probability.
    """
    import keras
    from keras import layers

    inputs = keras.Input((SEQUENCE_LENGTH,), dtype="int32")
    x = layers.LSTM(32)(layers.Embedding(TEXT_VOCAB, 32)(inputs))
    return keras.Model(inputs, layers.Dense(1, activation="sigmoid")(x), name="lstm")


def wide():
    """A wide embedding model: a `WIDE_VOCAB` x 32 embedding table (3.2M weights), flattened, a dense
    layer of 64 units, a sigmoid.

    Returns:
        An uncompiled `keras.Model`: `(batch, WIDE_IDS)` int32 ids in
        `[0, WIDE_VOCAB)` -> `(batch, 1)` probability.
    """
    import keras
    from keras import layers

    inputs = keras.Input((WIDE_IDS,), dtype="int32")
    x = layers.Flatten()(layers.Embedding(WIDE_VOCAB, 32)(inputs))
    x = layers.Dense(64, activation="relu")(x)
    return keras.Model(inputs, layers.Dense(1, activation="sigmoid")(x), name="wide")


# --- Data (each `(n, seed) -> (x, y)` NumPy arrays of n examples) ---------------------

def mnist_data(n: int, seed: int = 0):
    """The first `n` real MNIST training images: uint8 `(n, 28, 28)`, uint8 labels 0..9."""
    data = common.mnist_arrays()
    return data.x_train[:n], data.y_train[:n]


def image_data(n: int, seed: int = 0):
    """Synthetic CIFAR-like images: float32 `(n, 32, 32, 3)` uniform in [0, 1), int32 labels 0..9."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.random((n, 32, 32, 3), dtype=np.float32), rng.integers(0, 10, n, dtype=np.int32)


def token_data(n: int, seed: int = 0):
    """Synthetic IMDB-like token sequences: int32 `(n, SEQUENCE_LENGTH)` ids, float32 0/1 labels."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.integers(1, TEXT_VOCAB, (n, SEQUENCE_LENGTH), dtype=np.int32)
    return x, rng.integers(0, 2, n).astype(np.float32)


def id_data(n: int, seed: int = 0):
    """Synthetic categorical ids: int32 `(n, WIDE_IDS)` in `[0, WIDE_VOCAB)`, float32 0/1 labels."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.integers(0, WIDE_VOCAB, (n, WIDE_IDS), dtype=np.int32)
    return x, rng.integers(0, 2, n).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """One model of the zoo and how it is timed.

    Attributes:
        name: short name (table rows, `--models`).
        build: `() -> keras.Model`, uncompiled.
        data: `(n, seed) -> (x, y)` NumPy arrays.
        loss: the Keras loss name every contender compiles with.
        batch_size: the global batch size of every contender.
        timed_examples: examples per epoch at full size (a multiple of 32 x
            `batch_size`, so steps_per_execution 8 and 32 divide each epoch).
        dataset_size: a realistic training set size, for the probe's share of
            a 10-epoch run.
        dataset: what `dataset_size` stands for.
    """

    name: str
    build: Callable
    data: Callable
    loss: str
    batch_size: int
    timed_examples: int
    dataset_size: int
    dataset: str


_SPARSE, _BINARY = "sparse_categorical_crossentropy", "binary_crossentropy"
ZOO = (
    ZooModel("mlp", mlp, mnist_data, _SPARSE, 128, 128 * 32 * 4, 60_000, "MNIST, real"),
    ZooModel("cnn", cnn, mnist_data, _SPARSE, 128, 128 * 32, 60_000, "MNIST, real"),
    ZooModel("resnet", resnet, image_data, _SPARSE, 128, 128 * 32, 50_000, "CIFAR-10-like, synthetic"),
    ZooModel("transformer", transformer, token_data, _BINARY, 128, 128 * 32, 25_000, "IMDB-like, synthetic"),
    ZooModel("lstm", lstm, token_data, _BINARY, 128, 128 * 32, 25_000, "IMDB-like, synthetic"),
    ZooModel("wide", wide, id_data, _BINARY, 128, 128 * 32 * 2, 100_000, "categorical ids, synthetic"),
)
"""The zoo, in running order."""


def zoo_models(args) -> list:
    """The `ZooModel`s to time: `--models`, else `QUICK_MODELS` at `--quick`, else all.

    Raises:
        SystemExit: on an unknown model name.
    """
    by_name = {m.name: m for m in ZOO}
    names = args.models.split(",") if args.models else (QUICK_MODELS if args.quick else tuple(by_name))
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SystemExit(f"Unknown model(s) {', '.join(unknown)}. Expected some of: {', '.join(by_name)}.")
    return [by_name[n] for n in names]


def examples_per_epoch(spec: ZooModel, quick: bool) -> int:
    """Examples in each timed epoch: `timed_examples`, or 8 batches at `--quick`."""
    return spec.batch_size * 8 if quick else spec.timed_examples


def thread_settings(cores: int, quick: bool) -> list:
    """(intra-op, inter-op) settings: TensorFlow's defaults (0, 0), then (cores/2, 1) and (cores, 1).

    On 2 cores: (0, 0), (1, 1), (2, 1); on one core (1, 1) and (2, 2). `--quick`: (0, 0) only.
    """
    if quick:
        return [(0, 0)]
    others = [(max(1, cores // 2), 1), (cores, 1), (2 * cores, 2)]
    return [(0, 0)] + list(dict.fromkeys(others))[:2]


# --- The worker: one thread setting, every model --------------------------------------

def _extra(parser):
    parser.add_argument("--models", default=None,
                        help=f"comma-separated models (default: all; --quick: {','.join(QUICK_MODELS)})")
    parser.add_argument("--threads", default=None,
                        help="(worker) time the grid at intra-op,inter-op threads INTRA,INTER in this process")
    parser.add_argument("--with-references", action="store_true",
                        help="(worker) also time plain Keras and tftrain")
    parser.add_argument("--point-out", type=Path, default=None, help="(worker) JSON file for the figures")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed per worker process")
    parser.set_defaults(no_device_setup=True)  # the parent only starts subprocesses: keep TensorFlow out


def _stopwatch(stop_slower_than: float = math.inf):
    """A Keras callback stamping each epoch's begin and end (`begins`, `ends`: `time.perf_counter()`),
    and the compile settings the model trained with (`settings`).

    Args:
        stop_slower_than: seconds; training stops after the first timed epoch (the second) when it
            took longer. Defaults to infinity (never).
    """
    import keras

    class EpochStopwatch(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.begins, self.ends, self.settings = [], [], {}

        def on_epoch_begin(self, epoch, logs=None):
            self.begins.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            self.ends.append(time.perf_counter())
            if len(self.ends) == 2 and self.ends[-1] - self.begins[-1] > stop_slower_than:
                self.model.stop_training = True

        def on_train_end(self, logs=None):
            self.settings = {"trained_jit_compile": bool(self.model.jit_compile),
                             "trained_steps_per_execution": int(self.model.steps_per_execution)}

    return EpochStopwatch()


def _figures(stopwatch, examples: int, lead=None) -> dict:
    """Examples/sec of the fastest epoch after the first, with every epoch's seconds.

    Args:
        stopwatch: the last callback of the `fit`.
        examples: examples per epoch.
        lead: a stopwatch placed first in the callback list, or None. With it, an epoch runs from
            the lead's begin to `stopwatch`'s end, and `callbacks_s` holds the seconds the callbacks
            between them spent at each epoch's begin and end (e.g. writing a checkpoint). Defaults to None.

    Returns:
        `{"examples_per_sec", "epochs_s", "trained_jit_compile", "trained_steps_per_execution"}` (the
        last two: the model's settings at the end of `fit`), and `callbacks_s` with a lead.
    """
    begins = (lead or stopwatch).begins
    seconds = [end - begin for begin, end in zip(begins, stopwatch.ends)]
    out = {"examples_per_sec": common.rate(examples, min(seconds[1:])) if seconds[1:] else math.nan,
           "epochs_s": seconds, **stopwatch.settings}
    if lead is not None:
        steps = [end - begin for begin, end in zip(stopwatch.begins, lead.ends)]
        out["callbacks_s"] = [whole - inner for whole, inner in zip(seconds, steps)]
    return out


def _reset() -> None:
    """`keras.backend.clear_session()` and seed 0, before every contender."""
    import keras

    keras.backend.clear_session()
    keras.utils.set_random_seed(0)


def _fresh(spec: ZooModel):
    """A new model of `spec` after `_reset()`."""
    _reset()
    return spec.build()


def time_keras(spec: ZooModel, x, y, epochs: int, stop_slower_than: float = math.inf, **compile_options) -> dict:
    """Times `fit(x, y, batch_size=B)` of a fresh model compiled with Adam, `spec.loss`, accuracy and
    `compile_options` (none: plain Keras's defaults); see `_stopwatch` for `stop_slower_than`.
    Returns `_figures`."""
    model = _fresh(spec)
    model.compile(optimizer="adam", loss=spec.loss, metrics=["accuracy"], **compile_options)
    stopwatch = _stopwatch(stop_slower_than)
    model.fit(x, y, batch_size=spec.batch_size, epochs=epochs, verbose=0, callbacks=[stopwatch])
    return _figures(stopwatch, len(x))


def _timed_trainer():
    """`tftrain.Trainer` whose `choose_execution` stage records its wall seconds in `probe_s`, and whose
    callback list starts with the callback `lead` (set it before `fit`)."""
    import tftrain

    class ProbeTimedTrainer(tftrain.Trainer):
        probe_s = lead = None

        def choose_execution(self, model):
            start = time.perf_counter()
            super().choose_execution(model)
            self.probe_s = time.perf_counter() - start

        def make_callbacks(self):
            return [self.lead] + super().make_callbacks()

    return ProbeTimedTrainer


def _train_tftrain(spec: ZooModel, x, y, run_dir: Path, device: str, **overrides):
    """One `Trainer(ArrayTask(...), execution="auto", steps_per_execution="auto", precision="float32")` run over `x, y`, with the
    stopwatch last and a lead stopwatch first; returns `(trainer, stopwatch, metrics.json as a dict)`."""
    import tftrain

    _reset()
    task = tftrain.ArrayTask(spec.build, x, y, loss=spec.loss, optimizer="adam", metrics=["accuracy"],
                             name=f"zoo-{spec.name}")
    stopwatch = _stopwatch()
    trainer = _timed_trainer()(task, execution="auto", steps_per_execution="auto", precision="float32",
                               batch_size=spec.batch_size,
                               verbose=0, run_dir=str(run_dir), device=device, callbacks=[stopwatch], **overrides)
    trainer.lead = _stopwatch()
    trainer.fit()
    return trainer, stopwatch, json.loads((run_dir / "metrics.json").read_text())


def time_tftrain(spec: ZooModel, x, y, epochs: int, run_dir: Path, device: str) -> dict:
    """Times tftrain's run over `x, y` (`_train_tftrain`); where tftrain remembers `--execution auto`
    choices (`metrics.json`'s `execution_choice` has `remembered`), also the stage of a second, one-epoch
    epoch on the same data (so the same steps_per_execution counts fit), which should find the first run's choice.

    Returns:
        `_figures` (with `callbacks_s`: tftrain's own callbacks at epoch begin and end), plus
        `probe_s` (seconds of the `choose_execution` stage), `execution` (the Trainer's choice),
        and from `metrics.json`: `metrics_execution`, `metrics_choice` (the probe's winner),
        `remembered` (when an earlier run timed the choice, else None), `execution_auto`,
        `steps_per_execution`, `fit_examples_per_sec`; and `second_run`: `{"probe_s", "execution",
        "remembered"}` of the second run, or None.
    """
    trainer, stopwatch, metrics = _train_tftrain(spec, x, y, run_dir, device, epochs=epochs)
    choice = metrics.get("execution_choice") or {}
    second = None
    if "remembered" in choice:
        again, _, again_metrics = _train_tftrain(spec, x, y, run_dir.with_name(run_dir.name + "-again"), device,
                                                 epochs=1)
        second = {"probe_s": again.probe_s, "execution": again.execution,
                  "remembered": (again_metrics.get("execution_choice") or {}).get("remembered")}
    return {**_figures(stopwatch, len(x), trainer.lead), "probe_s": trainer.probe_s, "execution": trainer.execution,
            "metrics_execution": metrics["execution"], "metrics_choice": choice.get("execution"),
            "remembered": choice.get("remembered"), "execution_auto": metrics.get("execution_auto"),
            "steps_per_execution": metrics.get("steps_per_execution"),
            "fit_examples_per_sec": metrics.get("examples_per_sec"), "second_run": second}


def _guarded(label: str, fn: Callable) -> dict:
    """`fn()`, or `{"error": ...}` when it raises (one failing contender must not sink the others)."""
    try:
        figures = fn()
    except Exception as e:  # noqa: BLE001 (recorded and printed)
        message = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        print(f"FAILED: {label}: {message}", flush=True)
        return {"error": message}
    print(f"{label}: {common.fmt(figures['examples_per_sec'])} examples/sec", flush=True)
    return figures


def _fastest_epoch(figures: list) -> float:
    """The fastest timed epoch (seconds) among contenders' figures; infinity when none."""
    return min((s for f in figures for s in f.get("epochs_s", [])[1:]), default=math.inf)


def time_model(spec: ZooModel, args, tmp: Path) -> dict:
    """Times one model's grid points in this process, and plain Keras and tftrain when asked."""
    n = examples_per_epoch(spec, args.quick)
    x, y = spec.data(n)
    epochs = QUICK_EPOCHS if args.quick else EPOCHS
    out = {"examples_per_epoch": n, "grid": []}
    if args.with_references:
        out["keras"] = _guarded(f"{spec.name} plain Keras", lambda: time_keras(spec, x, y, epochs))
    for mode, spe in (QUICK_GRID if args.quick else GRID):
        limit = DOMINATED * _fastest_epoch([out.get("keras", {}), *out["grid"]])
        figures = _guarded(f"{spec.name} {mode} spe {spe} threads {args.threads}", lambda: time_keras(
            spec, x, y, epochs, limit, jit_compile=mode == "xla", steps_per_execution=spe))
        out["grid"].append({"execution": mode, "steps_per_execution": spe, **figures})
    if args.with_references:
        device = "cpu" if args.device == "cpu" else "auto"
        out["tftrain"] = _guarded(f"{spec.name} tftrain", lambda: time_tftrain(
            spec, x, y, epochs, tmp / f"run-{spec.name}", device))
    return out


def worker(args) -> None:
    """Sets the thread counts, then times every model; writes `--point-out`. TensorFlow must not have started."""
    intra, inter = (int(v) for v in args.threads.split(","))
    from tftrain.runtime import set_threads

    settings = set_threads(intra, inter)  # before any TensorFlow op
    from tftrain.runtime.devices import configure_devices

    configure_devices("cpu" if args.device == "cpu" else "auto")
    out = {"intra_op": intra, "inter_op": inter, "applied": settings.applied, "models": {}}
    with tempfile.TemporaryDirectory(prefix="tftrain-zoo-") as tmp:
        for spec in zoo_models(args):
            out["models"][spec.name] = time_model(spec, args, Path(tmp))
    args.point_out.write_text(json.dumps(out))


# --- The parent: one worker per thread setting, then the table --------------------------

def run_worker(setting, references: bool, args, tmp: Path) -> dict:
    """Runs one thread setting's worker process; returns its record (or an `error`)."""
    intra, inter = setting
    out = tmp / f"threads-{intra}-{inter}.json"
    cmd = [sys.executable, "-m", "benchmarks.zoo", "--threads", f"{intra},{inter}", "--point-out", str(out),
           "--device", args.device] + (["--quick"] if args.quick else []) \
        + (["--with-references"] if references else []) + (["--models", args.models] if args.models else [])
    # A fresh folder for tftrain's remembered --execution auto choices: the first run times its probe.
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", "TFTRAIN_CACHE_DIR": str(tmp / "cache")}
    try:
        proc = subprocess.run(cmd, env=env, stderr=subprocess.PIPE, text=True, timeout=args.timeout,
                              cwd=Path(__file__).resolve().parents[1])  # its progress lines go to our stdout
    except subprocess.TimeoutExpired:
        return {"intra_op": intra, "inter_op": inter, "error": f"timed out after {args.timeout:.0f} s"}
    if proc.returncode != 0 or not out.exists():
        tail = proc.stderr.strip().splitlines()[-20:] or ["no output"]
        print("\n".join(tail), file=sys.stderr, flush=True)
        return {"intra_op": intra, "inter_op": inter, "error": f"exit code {proc.returncode}: {tail[-1]}"}
    return json.loads(out.read_text())


def run(args, device) -> common.Result:
    """Runs one worker per thread setting (the first, TensorFlow's defaults, also times plain Keras
    and tftrain), then tabulates."""
    settings = thread_settings(common.cpu_cores(), args.quick)
    workers = []
    with tempfile.TemporaryDirectory(prefix="tftrain-zoo-") as tmp:
        for i, setting in enumerate(settings):
            print(f"--- threads intra-op {setting[0] or 'default'}, inter-op {setting[1] or 'default'} ---",
                  flush=True)
            workers.append(run_worker(setting, i == 0, args, Path(tmp)))
    return _result(zoo_models(args), workers, args.quick)


def _threads(intra: int, inter: int) -> str:
    return "default threads" if (intra, inter) == (0, 0) else f"threads {intra or 'dflt'}/{inter or 'dflt'}"


def _grid_points(name: str, workers: list) -> list:
    """Every grid point of model `name`, across the workers (a failed one carries `error`)."""
    return [{"model": name, "intra_op": w["intra_op"], "inter_op": w["inter_op"], **p}
            for w in workers if "models" in w and name in w["models"] for p in w["models"][name]["grid"]]


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def model_summary(spec: ZooModel, workers: list) -> dict:
    """One model's figures against the goals (None where a contender failed)."""
    reference = next((w["models"].get(spec.name, {}) for w in workers if "models" in w), {})
    keras_rate = reference.get("keras", {}).get("examples_per_sec")
    tft = reference.get("tftrain", {})
    points = [p for p in _grid_points(spec.name, workers) if _finite(p.get("examples_per_sec"))]
    best = max(points, key=lambda p: p["examples_per_sec"], default=None)
    same = next((p for p in points if (p["execution"], p["steps_per_execution"], p["intra_op"], p["inter_op"])
                 == (tft.get("execution"), tft.get("steps_per_execution"), 0, 0)), None)
    tft_rate, probe = tft.get("examples_per_sec"), tft.get("probe_s")
    run_10 = 10 * spec.dataset_size / tft_rate if _finite(tft_rate) else None
    out = {
        "batch_size": spec.batch_size, "examples_per_epoch": reference.get("examples_per_epoch"),
        "dataset_size": spec.dataset_size, "keras_examples_per_sec": keras_rate,
        "grid_best": None if best is None else {k: best[k] for k in (
            "execution", "steps_per_execution", "intra_op", "inter_op", "examples_per_sec")},
        "tftrain_examples_per_sec": tft_rate, "tftrain_execution": tft.get("execution"),
        "tftrain_steps_per_execution": tft.get("steps_per_execution"), "probe_s": probe,
        "ten_epoch_run_s": run_10,
        "tftrain_vs_grid_best": common.ratio(tft_rate or math.nan, best["examples_per_sec"] if best else math.nan),
        "tftrain_vs_keras": common.ratio(tft_rate or math.nan, keras_rate or math.nan),
        # The grid's own figure at tftrain's setting: how good the choice is, apart from the noise of tftrain's run.
        "grid_at_tftrain_setting": same and same["examples_per_sec"],
        "choice_vs_grid_best": common.ratio(same["examples_per_sec"], best["examples_per_sec"])
        if same and best else None,
        "probe_fraction_of_10_epochs": probe / run_10 if run_10 and probe is not None else None,
        "probe_remembered": tft.get("remembered"), **_second_run(tft.get("second_run")),
        **_callback_share(tft, reference.get("examples_per_epoch")),
    }
    return {**out, **_verdicts(out)}


def _second_run(second: Optional[dict]) -> dict:
    """The `choose_execution` seconds of tftrain's second run, and whether it reused the first run's choice
    (both None where tftrain remembers no choices)."""
    if not second:
        return {"next_run_probe_s": None, "next_run_remembered": None}
    return {"next_run_probe_s": second["probe_s"], "next_run_remembered": bool(second["remembered"])}


def _callback_share(tft: dict, examples: Optional[int]) -> dict:
    """Seconds tftrain's own callbacks spent at each timed epoch's begin and end (median), and their
    share of its fastest epoch; None when unknown."""
    seconds = tft.get("callbacks_s", [])[1:]
    if not seconds or not examples or not _finite(tft.get("examples_per_sec")):
        return {"tftrain_epoch_callbacks_s": None, "tftrain_epoch_callbacks_share": None}
    median = statistics.median(seconds)
    return {"tftrain_epoch_callbacks_s": median,
            "tftrain_epoch_callbacks_share": median / (examples / tft["examples_per_sec"])}


def _verdicts(m: dict) -> dict:
    """The three goals for one model's figures (False when a figure is missing). The probe's: the first
    run's probe <= 3% of a 10-epoch run, timed (not remembered), and a next run, where measured, reuses it."""
    probe = m["probe_fraction_of_10_epochs"]
    timed = probe is not None and not m["probe_remembered"]
    return {"meets_grid_best": bool(m["tftrain_vs_grid_best"] >= TARGETS["fraction_of_grid_best"]),
            "meets_plain_keras": bool(m["tftrain_vs_keras"] >= TARGETS["fraction_of_plain_keras"]),
            "meets_probe": timed and probe <= TARGETS["probe_fraction_of_10_epochs"]
            and m["next_run_remembered"] is not False}


def _percent(fraction, spec: str = ".0f") -> str:
    """`95%`, `-` for None, `failed` for NaN."""
    return "-" if fraction is None else common.fmt(100 * fraction, spec) + ("%" if math.isfinite(fraction) else "")


def _times(ratio: float) -> str:
    """`1.05x`, `failed` for NaN."""
    return common.fmt(ratio, ".2f") + ("x" if math.isfinite(ratio) else "")


def _probe_cell(m: dict) -> str:
    """`2.5 (next run 0.01, remembered)`: the first run's probe seconds, then the next run's."""
    cell = common.fmt(m["probe_s"], ".1f") + (" remembered" if m["probe_remembered"] else "")
    if m["next_run_probe_s"] is None:
        return cell
    return cell + (f" (next run {m['next_run_probe_s']:.2f}, "
                   f"{'remembered' if m['next_run_remembered'] else 'timed again'})")


def _row(name: str, m: dict) -> list:
    best = m["grid_best"]
    setting = "-" if best is None else (f"{best['execution']}, spe {best['steps_per_execution']}, "
                                        f"{_threads(best['intra_op'], best['inter_op'])}")
    yes = lambda ok: "yes" if ok else "no"  # noqa: E731
    return [name, m["batch_size"], common.fmt(m["keras_examples_per_sec"]),
            common.fmt(best and best["examples_per_sec"]), setting, common.fmt(m["tftrain_examples_per_sec"]),
            f"{m['tftrain_execution'] or '-'}, spe {m['tftrain_steps_per_execution'] or '-'}",
            _percent(m["tftrain_vs_grid_best"]), _percent(m["choice_vs_grid_best"]), _times(m["tftrain_vs_keras"]),
            _probe_cell(m), _percent(m["probe_fraction_of_10_epochs"], ".1f"),
            yes(m["meets_grid_best"]), yes(m["meets_plain_keras"]), yes(m["meets_probe"])]


HEADERS = ["model", "batch", "plain Keras ex/s", "grid best ex/s", "grid best setting", "tftrain ex/s",
           "tftrain choice", "tftrain / grid best", "grid at tftrain's choice / grid best", "tftrain / plain Keras", "probe s", "probe / 10 epochs",
           "≥ 95% of best", "≥ plain Keras", "probe ≤ 3%"]


def _plot(models: dict):
    """Grouped bars per model: plain Keras, grid best and tftrain, as % of the grid's best."""

    def plot(fig):
        ax = fig.subplots()
        names, top = list(models), 100.0
        bars = (("plain Keras", "keras_examples_per_sec", "tab:grey"), ("grid best", None, "tab:blue"),
                ("tftrain", "tftrain_examples_per_sec", "tab:orange"))
        for i, (label, key, color) in enumerate(bars):
            ys = []
            for m in models.values():
                best = m["grid_best"]["examples_per_sec"] if m["grid_best"] else math.nan
                ys.append(100.0 if key is None else 100 * common.ratio(m[key] or math.nan, best))
            top = max([top] + [y for y in ys if math.isfinite(y)])
            ax.bar([x + (i - 1) * 0.27 for x in range(len(names))], ys, width=0.27, label=label, color=color)
        ax.axhline(100 * TARGETS["fraction_of_grid_best"], color="black", linestyle="--", linewidth=0.8,
                   label="95% goal")
        ax.set_xticks(range(len(names)), [f"{n}\nbatch {m['batch_size']}" for n, m in models.items()], fontsize=8)
        ax.set_ylabel("examples/sec, % of the grid's best")
        ax.set_ylim(0, top * 1.18)
        ax.legend(fontsize=7, loc="upper center", ncol=4)
        ax.grid(axis="y", alpha=0.3)

    return plot


def _notes(specs: list, workers: list, quick: bool) -> list:
    epochs = QUICK_EPOCHS if quick else EPOCHS
    grid = QUICK_GRID if quick else GRID
    settings = [_threads(w["intra_op"], w["inter_op"]) for w in workers]
    sizes = ", ".join(f"{s.name} {s.batch_size} ({examples_per_epoch(s, quick):,}/epoch; "
                      f"10-epoch run on {s.dataset_size:,}: {s.dataset})" for s in specs)
    notes = [
        f"Batch size and examples per timed epoch (and the dataset size of the 10-epoch run): {sizes}. "
        "MNIST is the bundled real data; the others are random (synthetic) inputs and labels: speed only.",
        f"Every contender: a fresh model (seed 0), Adam (learning rate 1e-3), the model's loss and accuracy, "
        f"{epochs} epochs; examples/sec = examples per epoch / fastest epoch after the first, timed by one "
        "callback around whole epochs (tftrain's epochs include its own callbacks' work: checkpoint at each "
        "epoch end, TensorBoard, ThroughputMonitor).",
        "Plain Keras: compile + fit on NumPy arrays with every Keras default (on a CPU: graph, no XLA, "
        "steps_per_execution 1, TensorFlow's threads). Grid: the same fit at "
        f"{len(grid)} (execution, steps_per_execution) points x {len(settings)} thread setting(s) "
        f"({', '.join(settings)}), one worker process per thread setting.",
        "tftrain: Trainer(ArrayTask(...), execution='auto', steps_per_execution='auto', precision='float32') "
        "over the same arrays (float32, so the comparison isolates the execution settings); its tf.data "
        "pipeline. execution='auto' times graph against XLA at 8 steps per execution, then the faster at 32 and "
        "64 (while they win); another setting replaces graph at 8 only when more than 5% faster (the "
        "Trainer's default stays Keras's 1, so a user's batch callbacks fire every step unless they ask for "
        "auto); threads stay TensorFlow's defaults.",
        "Probe = wall seconds of the Trainer's choose_execution stage (gross: it includes tracing and compiling "
        "the train function that fit then reuses); its share of a 10-epoch run = probe / (10 x dataset size / "
        "tftrain examples/sec). Where tftrain remembers choices, the benchmark gives it a fresh cache folder "
        "(TFTRAIN_CACHE_DIR), so the timed run probes, and a second, one-epoch run on the same data shows what "
        "a next run of the same model pays (\"next run\"); the goal then also needs that run to reuse the choice.",
        f"A grid point whose first timed epoch takes over {DOMINATED:g}x the fastest epoch of its model so far in "
        "its process stops there (one timed epoch: it cannot be the best).",
        "Goals per model: tftrain >= 95% of the grid's best, >= plain Keras, probe <= 3% of a 10-epoch run. "
        "One round per contender (no interleaving); figures from different worker processes carry their "
        "run-to-run noise. On this host some epochs of any process run about 2x slower (seen in plain Keras too), "
        "so each figure is the fastest timed epoch, and the grid's best is the largest of many such maxima, "
        "which favours the grid. \"grid at tftrain's choice / grid best\" compares the grid's own figure at "
        "tftrain's setting (default threads) with the grid's best: how good the choice is, apart from the noise "
        "of tftrain's single run.",
    ]
    notes += [f"FAILED worker ({settings[i]}): {w['error']}" for i, w in enumerate(workers) if "error" in w]
    return notes


def _callbacks_note(models: dict) -> list:
    """One sentence on the time tftrain's own callbacks take at epoch begin and end, per model."""
    parts = [f"{n} {m['tftrain_epoch_callbacks_s']:.2f} s ({m['tftrain_epoch_callbacks_share']:.0%})"
             for n, m in models.items() if m["tftrain_epoch_callbacks_s"] is not None]
    if not parts:
        return []
    return ["tftrain's own callbacks at each epoch's begin and end (checkpoint, TensorBoard; median seconds per "
            "timed epoch, and share of its fastest epoch, counted in its examples/sec): " + ", ".join(parts)
            + ". A real epoch holds more examples than the timed one, so this share is smaller there."]


def _errors(workers: list) -> list:
    """`model contender: error` for every contender that failed inside a worker."""
    out = []
    for w in workers:
        for name, figures in w.get("models", {}).items():
            for label in ("keras", "tftrain"):
                if "error" in figures.get(label, {}):
                    out.append(f"{name} {label}: {figures[label]['error']}")
            out += [f"{name} {p['execution']} spe {p['steps_per_execution']} "
                    f"{_threads(w['intra_op'], w['inter_op'])}: {p['error']}" for p in figures["grid"] if "error" in p]
    return out


def _result(specs: list, workers: list, quick: bool) -> common.Result:
    models = {s.name: model_summary(s, workers) for s in specs}
    goals = {key: all(m[key] for m in models.values()) for key in ("meets_grid_best", "meets_plain_keras",
                                                                   "meets_probe")}
    summary = {"models": models, "goals": goals, "targets": TARGETS,
               "models_meeting_grid_best": sum(m["meets_grid_best"] for m in models.values()),
               "models_meeting_plain_keras": sum(m["meets_plain_keras"] for m in models.values()),
               "models_meeting_probe": sum(m["meets_probe"] for m in models.values()), "model_count": len(models)}
    reference = next((w for w in workers if "models" in w), {"models": {}})
    data = {"points": [p for s in specs for p in _grid_points(s.name, workers)],
            "keras": {n: f.get("keras") for n, f in reference["models"].items()},
            "tftrain": {n: f.get("tftrain") for n, f in reference["models"].items()},
            "workers": [{k: v for k, v in w.items() if k != "models"} for w in workers]}
    return common.Result(
        name=NAME, title="Zoo: tftrain's automatic settings vs plain Keras and the best of a settings grid",
        headers=HEADERS, rows=[_row(n, m) for n, m in models.items()], data=data, summary=summary,
        notes=_notes(specs, workers, quick) + _callbacks_note(models) + [f"FAILED: {e}" for e in _errors(workers)],
        plot=_plot(models))


def main(argv=None) -> int:
    """`python -m benchmarks.zoo [--quick] [--models a,b]`; `--threads` is the worker mode."""
    return common.main_with_worker(NAME, __doc__.splitlines()[0], run, worker, "threads", argv, extra=_extra)


if __name__ == "__main__":
    raise SystemExit(main())
