"""Time to accuracy on real MNIST: plain Keras tutorial code vs the tftrain recipe.

The way DAWNBench and MLPerf judge training: wall time until the test accuracy
first reaches a target (98.0% for the MLP, 99.0% for the CNN), checked at the end
of every epoch on the 10,000 MNIST test images. Two contenders per model and seed,
each in a fresh process, back to back:

* `keras`: the code a user copies from the Keras tutorials: the same architecture
  as the recipe's model as a `keras.Sequential`, float32 NumPy arrays,
  `compile("adam", "sparse_categorical_crossentropy")`, `fit(x, y, batch_size=64)`,
  every other setting Keras's default.
* `tftrain`: the MNIST recipe with its defaults (`tftrain.recipes.mnist`: its
  batch size, learning-rate schedule over its 10 epochs, execution, pipeline), run
  through the recipe driver, so its set-up (including `--execution auto`'s timing,
  the checkpoint and TensorBoard callbacks) is counted.

The clock starts before the data is loaded and stops at the end of the epoch that
reaches the target; the test evaluations are excluded (the clock is paused while
they run). Process start-up and the TensorFlow import are excluded for both.

    python -m benchmarks.time_to_accuracy [--quick] [--models mlp,cnn] [--seeds 0,1]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common

NAME = "time_to_accuracy"

TARGETS = {"mlp": 0.98, "cnn": 0.99}
"""Test-accuracy targets (fractions)."""

MAX_EPOCHS = {"mlp": 20, "cnn": 8}
"""Epochs after which the plain-Keras contender, if it has not reached its target, is
stopped. The tftrain contender runs the recipe's default epochs (its learning-rate
schedule spans them), stopping early at the target like the other."""

CONTENDERS = ("keras", "tftrain")


def _extra(parser):
    parser.add_argument("--models", default=None, help="comma-separated models (default: mlp,cnn; quick: mlp)")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: mlp 0,1 and cnn 0)")
    parser.add_argument("--max-epochs", type=int, default=None, help="epoch cap per run (default: per model)")
    parser.add_argument("--contender", choices=CONTENDERS, default=None, help="(worker) run one contender")
    parser.add_argument("--model", default="mlp", help="(worker) model")
    parser.add_argument("--seed", type=int, default=0, help="(worker) seed")
    parser.add_argument("--target", type=float, default=None, help="(worker) target test accuracy")
    parser.add_argument("--train-examples", type=int, default=None, help="(worker) first N training images")
    parser.add_argument("--point-out", type=Path, default=None, help="(worker) JSON file for the result")
    parser.add_argument("--timeout", type=float, default=900, help="seconds allowed per contender run")


def make_probe(x_test, y_test, target: float, start: float):
    """A Keras callback: test accuracy at each epoch end, training clock, stop at `target`.

    Args:
        x_test: test images, as the model takes them (raw pixels for the recipe).
        y_test: integer test labels.
        target: test accuracy at which training stops.
        start: `time.perf_counter()` when the contender's clock started.

    Returns:
        The callback; its `epochs` lists `{"epoch", "train_time_s", "test_accuracy"}`
        and `reached_at` is the first such entry at or above `target` (or None).
    """
    import keras

    class TimeToAccuracy(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs = []
            self.reached_at = None
            self.paused_s = 0.0

        def on_epoch_end(self, epoch, logs=None):
            pause = time.perf_counter()
            train_time = pause - start - self.paused_s
            _, accuracy = self.model.evaluate(x_test, y_test, batch_size=1000, verbose=0)
            entry = {"epoch": epoch + 1, "train_time_s": train_time, "test_accuracy": float(accuracy)}
            self.epochs.append(entry)
            print(f"epoch {epoch + 1}: test accuracy {accuracy:.4f} at {train_time:.1f} s", flush=True)
            if accuracy >= target and self.reached_at is None:
                self.reached_at = entry
                self.model.stop_training = True
            self.paused_s += time.perf_counter() - pause

    return TimeToAccuracy()


def run_keras(model_name: str, seed: int, max_epochs: int, target: float, train_examples=None) -> dict:
    """The plain-Keras contender (tutorial code); returns the probe's record."""
    import keras

    from tftrain.data import load_mnist

    start = time.perf_counter()
    (x_train, y_train, x_test, y_test) = load_mnist()  # keras.datasets.mnist.load_data(), offline
    if train_examples:
        x_train, y_train = x_train[:train_examples], y_train[:train_examples]
    x_train = x_train.astype("float32") / 255
    x_test = x_test.astype("float32") / 255
    keras.utils.set_random_seed(seed)
    if model_name == "mlp":
        layers = [
            keras.layers.Flatten(),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(10, activation="softmax"),
        ]
    else:  # https://keras.io/examples/vision/mnist_convnet/
        layers = [
            keras.layers.Reshape((28, 28, 1)),
            keras.layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
            keras.layers.MaxPooling2D(pool_size=(2, 2)),
            keras.layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
            keras.layers.MaxPooling2D(pool_size=(2, 2)),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(10, activation="softmax"),
        ]
    model = keras.Sequential([keras.Input((28, 28)), *layers])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    probe = make_probe(x_test, y_test, target, start)
    model.fit(x_train, y_train, batch_size=64, epochs=max_epochs, verbose=0, callbacks=[probe])
    return {"epochs": probe.epochs, "reached_at": probe.reached_at,
            "settings": {"batch_size": 64, "execution": "graph" if not model.jit_compile else "xla",
                         "steps_per_execution": 1, "input": "NumPy arrays"}}


def run_tftrain(model_name: str, seed: int, max_epochs: int, target: float, train_examples=None,
                device: str = "auto") -> dict:
    """The tftrain contender: the MNIST recipe with its defaults; returns the probe's record."""
    import keras  # noqa: F401 (imports TensorFlow before the clock starts, as run_keras does)

    from tftrain.data import load_mnist
    from tftrain.recipes import mnist
    from tftrain.train import Trainer

    test = load_mnist()
    x_test, y_test = test.x_test, test.y_test  # raw pixels: the recipe's models scale their inputs
    with tempfile.TemporaryDirectory(prefix="tftrain-tta-") as tmp:
        overrides = {"model": model_name, "seed": seed, "epochs": max_epochs, "verbose": 0,
                     "run_dir": str(Path(tmp) / "run"), "device": device}
        if train_examples:
            overrides["train_examples"] = train_examples
        cfg = mnist.DEFAULTS.override(overrides)
        start = time.perf_counter()
        probe = make_probe(x_test, y_test, target, start)
        Trainer(mnist.TASK, cfg, callbacks=[probe]).fit(started=start)
        metrics = json.loads((Path(tmp) / "run" / "metrics.json").read_text())
    return {"epochs": probe.epochs, "reached_at": probe.reached_at,
            "settings": {"batch_size": metrics["global_batch_size"], "execution": metrics["execution"],
                         "execution_auto": metrics.get("execution_auto"),
                         "steps_per_execution": metrics["steps_per_execution"], "input": "tf.data (recipe)",
                         "precision": metrics["precision"]}}


def worker(args) -> None:
    """Runs one contender in this process and writes its record to `--point-out`."""
    target = args.target if args.target is not None else TARGETS[args.model]
    max_epochs = args.max_epochs or (
        MAX_EPOCHS[args.model] if args.contender == "keras" else common.recipe_defaults().train.epochs
    )
    device = "cpu" if args.device == "cpu" else "auto"
    if args.contender == "keras":
        from tftrain.runtime.devices import configure_devices

        configure_devices(device)  # the CPU suite hides any GPU; the recipe does this itself
        record = run_keras(args.model, args.seed, max_epochs, target, args.train_examples)
    else:
        record = run_tftrain(args.model, args.seed, max_epochs, target, args.train_examples, device)
    record.update({"contender": args.contender, "model": args.model, "seed": args.seed, "target": target,
                   "max_epochs": max_epochs, "train_examples": args.train_examples})
    args.point_out.write_text(json.dumps(record))


def run_contender(args, contender: str, model_name: str, seed: int, tmp: Path, quick_sizes: dict) -> dict:
    """Runs one contender in a fresh process; returns its record (or an `error`)."""
    out = tmp / f"{contender}-{model_name}-{seed}.json"
    cmd = [sys.executable, "-m", "benchmarks.time_to_accuracy", "--contender", contender, "--model", model_name,
           "--seed", str(seed), "--point-out", str(out), "--device", args.device]
    for flag, value in (("--max-epochs", args.max_epochs or quick_sizes.get("max_epochs")),
                        ("--target", quick_sizes.get("target")),
                        ("--train-examples", quick_sizes.get("train_examples"))):
        if value is not None:
            cmd += [flag, str(value)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    print(f"-- {model_name}, seed {seed}: {contender}", flush=True)
    try:
        proc = subprocess.run(cmd, env=env, text=True, timeout=args.timeout, capture_output=True,
                              cwd=Path(__file__).resolve().parents[1])
    except subprocess.TimeoutExpired:
        return {"contender": contender, "model": model_name, "seed": seed,
                "error": f"timed out after {args.timeout:.0f} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(("epoch ", "execution: auto ->")):
            print("   " + line, flush=True)
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"contender": contender, "model": model_name, "seed": seed,
                "error": f"exit code {proc.returncode}: {tail[0]}"}
    return json.loads(out.read_text())


def run(args, device) -> common.Result:
    """Runs both contenders for each model and seed, back to back."""
    quick = args.quick
    models = (args.models.split(",") if args.models else (["mlp"] if quick else list(common.MODELS)))
    if args.seeds:
        seeds = {m: [int(s) for s in args.seeds.split(",")] for m in models}
    else:
        seeds = {m: [0] if quick or m == "cnn" else [0, 1] for m in models}
    # Quick: 4,096 training images, a low target, at most 2 epochs: checks the machinery only.
    quick_sizes = {"train_examples": 4096, "target": 0.75, "max_epochs": 2} if quick else {}

    records = []
    with tempfile.TemporaryDirectory(prefix="tftrain-tta-") as tmp:
        for model_name in models:
            for i, seed in enumerate(seeds[model_name]):
                # Alternate who goes first, so a slow spell on the machine does not always hit the same one.
                order = CONTENDERS if i % 2 == 0 else tuple(reversed(CONTENDERS))
                for contender in order:
                    records.append(run_contender(args, contender, model_name, seed, Path(tmp), quick_sizes))

    rows, per_model = [], {}
    for model_name in models:
        target = quick_sizes.get("target", TARGETS[model_name])
        times = {c: [] for c in CONTENDERS}
        for seed in seeds[model_name]:
            by_c = {r["contender"]: r for r in records if r["model"] == model_name and r["seed"] == seed}
            cells = {}
            for c in CONTENDERS:
                r = by_c.get(c, {"error": "missing"})
                if "error" in r:
                    cells[c] = f"failed ({r['error']})"
                    times[c].append(None)
                elif r["reached_at"] is None:
                    best = max((e["test_accuracy"] for e in r["epochs"]), default=0)
                    cells[c] = f"not reached in {r['max_epochs']} epochs (best {best:.2%})"
                    times[c].append(None)
                else:
                    cells[c] = f"{r['reached_at']['train_time_s']:.1f} s (epoch {r['reached_at']['epoch']})"
                    times[c].append(r["reached_at"]["train_time_s"])
            k, t = times["keras"][-1], times["tftrain"][-1]
            ratio = f"{k / t:.2f}x" if k and t else "-"
            settings = by_c.get("tftrain", {}).get("settings", {})
            rows.append([model_name, f"{target:.1%}", seed, cells["keras"], cells["tftrain"], ratio,
                         f"batch {settings.get('batch_size', '?')}, {settings.get('execution', '?')}, "
                         f"spe {settings.get('steps_per_execution', '?')}"])
        ok = [(k, t) for k, t in zip(times["keras"], times["tftrain"]) if k and t]
        per_model[model_name] = {
            "target": target,
            "keras_s": times["keras"], "tftrain_s": times["tftrain"],
            "speedup": [k / t for k, t in ok],
            "speedup_of_mean_times": (sum(k for k, _ in ok) / sum(t for _, t in ok)) if ok else None,
        }
    summary = {"models": per_model, "target": "MLP: tftrain >= 4x faster than plain Keras to 98% test accuracy"}
    mlp_speedup = per_model.get("mlp", {}).get("speedup_of_mean_times")
    if mlp_speedup is not None and not quick:
        summary["mlp_target_met"] = mlp_speedup >= 4.0

    def plot(fig):
        axes = fig.subplots(1, len(models), squeeze=False)[0]
        for ax, model_name in zip(axes, models):
            for r in records:
                if r["model"] != model_name or "error" in r:
                    continue
                xs = [e["train_time_s"] for e in r["epochs"]]
                ys = [100 * e["test_accuracy"] for e in r["epochs"]]
                ax.plot(xs, ys, marker="o", markersize=3, linestyle="-" if r["contender"] == "tftrain" else "--",
                        color="tab:orange" if r["contender"] == "tftrain" else "tab:blue",
                        label=f"{r['contender']} (seed {r['seed']})")
            ax.axhline(100 * per_model[model_name]["target"], color="grey", linewidth=1)
            ax.set_xlabel("training time, s (evaluation excluded)")
            ax.set_ylabel("test accuracy, %")
            ax.set_title(model_name, fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)

    notes = [
        "keras: Sequential model, NumPy arrays, fit(batch_size=64), Adam defaults (learning rate 1e-3), float32, "
        "Keras's default execution (graph on CPU, XLA when a GPU is present), at most "
        + " / ".join(f"{n} ({m.upper()})" for m, n in MAX_EPOCHS.items()) + " epochs. "
        "tftrain: the MNIST recipe with its defaults (same architecture and optimizer; its batch size, "
        "learning-rate schedule and epochs, execution auto, tf.data pipeline).",
        "Clock: from data loading to the end of the first epoch whose test accuracy reaches the target; "
        "test evaluations excluded; each run in a fresh process; contenders back to back.",
    ]
    return common.Result(
        name=NAME,
        title="Time to accuracy on real MNIST: plain Keras vs the tftrain recipe",
        headers=["model", "target", "seed", "plain Keras", "tftrain recipe", "speed-up", "tftrain settings"],
        rows=rows,
        data={"records": records, "seeds": seeds, "quick_sizes": quick_sizes},
        summary=summary,
        notes=notes,
        plot=plot,
    )


def main(argv=None) -> int:
    """`python -m benchmarks.time_to_accuracy [--quick]`; `--contender` is the worker mode."""
    return common.main_with_worker(NAME, __doc__.splitlines()[0], run, worker, "contender", argv, extra=_extra)


if __name__ == "__main__":
    raise SystemExit(main())
