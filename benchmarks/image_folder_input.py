"""Image folder input: Keras's `image_dataset_from_directory` vs `tftrain.data.image_folder_dataset`.

A folder of MNIST digits written as image files (`root/<digit>/<i>.png|jpg`,
PNG and JPEG alternating; 6,000 files, 200 at `--quick`), read at 32 x 32 RGB by
two contenders with the same batch size:

* `keras`: what a user writes by hand,
  `keras.utils.image_dataset_from_directory(folder, image_size=(32, 32),
  batch_size=B)`, every other argument Keras's default (shuffled file names,
  parallel decode, prefetch; no cache);
* `tftrain`: `image_folder_dataset(list_image_files(folder), (32, 32), B,
  training=True)` with the default `DataConfig` (parallel decode, decoded images
  cached in memory, shuffled every epoch, prefetch).

Two figures each, per epoch (the first epoch reads and decodes every file; later
ones can use a cache), timed back to back in one process in interleaved rounds,
each contender keeping its fastest first epoch and its fastest later epoch:

* pipeline alone: images/sec of iterating the dataset, no model;
* training: images/sec of `model.fit` on a small CNN (the same for both; its
  train function is traced before the clock starts).

    python -m benchmarks.image_folder_input [--quick] [--images N] [--epochs N] [--batch-size N] [--rounds N]
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import common

NAME = "image_folder_input"

CONTENDERS = ("keras", "tftrain")

IMAGE_SIZE = (32, 32)


def _extra(parser):
    parser.add_argument("--images", type=int, default=None, help="image files to write (default 6,000; quick 200)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per timing, >= 2 (default 3; quick 2)")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size of both contenders (default 64)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; quick 1)")


def make_dataset(contender: str, folder: Path, batch_size: int):
    """The contender's training dataset over `folder` (built now: listing counts as set-up)."""
    import keras

    from tftrain.data import image_folder_dataset, list_image_files

    if contender == "keras":
        return keras.utils.image_dataset_from_directory(folder, image_size=IMAGE_SIZE, batch_size=batch_size,
                                                        verbose=False)
    return image_folder_dataset(list_image_files(folder), IMAGE_SIZE, batch_size, training=True)


def build_cnn():
    """A small CNN for 32 x 32 RGB images with pixels 0..255, compiled with Adam."""
    import keras

    model = keras.Sequential([
        keras.Input((*IMAGE_SIZE, 3)),
        keras.layers.Rescaling(1.0 / 255),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def warm_up(model, dataset) -> None:
    """Traces the model's train function on one zero batch of `dataset`'s element spec."""
    import tensorflow as tf

    image_spec, label_spec = dataset.element_spec
    batch = image_spec.shape[0] or 8
    zeros = (tf.zeros((batch, *image_spec.shape[1:])), tf.zeros((batch,), label_spec.dtype))
    fixed = image_spec.shape[0] is not None
    same_spec = tf.data.Dataset.from_tensors(zeros).unbatch().batch(batch, drop_remainder=fixed)
    model.fit(same_spec, epochs=1, verbose=0, shuffle=False)


def images_per_epoch(contender: str, num_files: int, batch_size: int) -> int:
    """Images one epoch yields: Keras keeps the last partial batch, tftrain drops it when training."""
    return num_files if contender == "keras" else num_files // batch_size * batch_size


def time_pipeline(contender: str, folder: Path, batch_size: int, epochs: int) -> dict:
    """Times building a fresh dataset, then each of `epochs` passes over it, no model.

    Returns:
        `{"setup_s": seconds to build the dataset, "epochs_s": [seconds per epoch]}`.
    """
    start = time.perf_counter()
    dataset = make_dataset(contender, folder, batch_size)
    out = {"setup_s": time.perf_counter() - start, "epochs_s": []}
    for _ in range(epochs):
        start = time.perf_counter()
        for _ in dataset:
            pass
        out["epochs_s"].append(time.perf_counter() - start)
    return out


def time_training(contender: str, folder: Path, batch_size: int, epochs: int) -> dict:
    """Times building a fresh dataset, then each of `epochs` epochs of `model.fit` of a fresh
    `build_cnn()` on it (its train function traced first, outside the clocks).

    Returns:
        `{"setup_s": seconds to build the dataset, "epochs_s": [seconds per epoch]}`.
    """
    import keras

    start = time.perf_counter()
    dataset = make_dataset(contender, folder, batch_size)
    setup_s = time.perf_counter() - start

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.start)

    model = build_cnn()
    warm_up(model, dataset)
    timer = EpochTimer()
    model.fit(dataset, epochs=epochs, verbose=0, callbacks=[timer], shuffle=False)  # shuffled by the dataset
    return {"setup_s": setup_s, "epochs_s": timer.seconds}


MEASURES = {"training": (time_training, 1), "pipeline alone": (time_pipeline, 3)}
"""Measure name -> (timing function `(contender, folder, batch_size, epochs) -> dict`, rounds
per `--rounds`: the pipeline alone takes seconds, so it gets more rounds against noise)."""


def _figures(runs: list, images: int) -> dict:
    """Images/sec of the fastest first epoch and of the fastest later epoch over the rounds
    (all later epochs do the same work: none has a cache, or all read it), with their
    medians, and the fastest set-up."""
    ok = [r for r in runs if isinstance(r, dict)]
    if not ok:
        return {"epoch_1": math.nan, "later": math.nan, "epoch_1_median": math.nan, "later_median": math.nan,
                "setup_s": math.nan, "rounds_s": []}
    firsts = [r["epochs_s"][0] for r in ok]
    laters = [s for r in ok for s in r["epochs_s"][1:]]
    return {
        "epoch_1": images / min(firsts),
        "later": images / min(laters),
        "epoch_1_median": images / statistics.median(firsts),
        "later_median": images / statistics.median(laters),
        "setup_s": min(r["setup_s"] for r in ok),
        "rounds_s": [r["epochs_s"] for r in ok],
    }


def _sizes(args) -> dict:
    """Files per class, epochs and rounds from the flags (checked)."""
    images = args.images or (200 if args.quick else 6000)
    epochs = args.epochs or (2 if args.quick else 3)
    if images < 10 or epochs < 2 or args.batch_size < 1 or args.batch_size > images:
        raise SystemExit(f"Need --images >= 10, --epochs >= 2 and 1 <= --batch-size <= --images. Received: "
                         f"images={images}, epochs={epochs}, batch_size={args.batch_size}.")
    return {"per_class": images // 10, "epochs": epochs, "rounds": args.rounds or (1 if args.quick else 3)}


def run(args, device) -> common.Result:
    """Writes the image folder, times both contenders in interleaved rounds."""
    import tensorflow as tf  # noqa: F401 (imported before any clock starts)

    from tests.image_folders import write_mnist_image_folder

    sizes, batch = _sizes(args), args.batch_size
    num_files = sizes["per_class"] * 10
    with tempfile.TemporaryDirectory(prefix="tftrain-image-folder-") as tmp:
        start = time.perf_counter()
        folder = write_mnist_image_folder(Path(tmp) / "digits", per_class=sizes["per_class"])
        print(f"wrote {num_files:,} PNG/JPEG files in {time.perf_counter() - start:.1f} s", flush=True)
        runs = {}
        for measure, (fn, more) in MEASURES.items():
            contenders = {f"{measure}:{c}": (lambda fn=fn, c=c: fn(c, folder, batch, sizes["epochs"]))
                          for c in CONTENDERS}
            runs.update(common.best_of_rounds(contenders, sizes["rounds"] * more))
    figures = {measure: {c: _figures(runs[f"{measure}:{c}"], images_per_epoch(c, num_files, batch))
                         for c in CONTENDERS} for measure in MEASURES}
    ratios = {measure: {k: common.ratio(f["tftrain"][k], f["keras"][k]) for k in ("epoch_1", "later")}
              for measure, f in figures.items()}
    for measure, f in figures.items():
        print(f"{measure}: " + ", ".join(f"{c} {f[c]['epoch_1']:,.0f} / {f[c]['later']:,.0f} img/s" for c in f)
              + f" (epoch 1 / later); tftrain / keras {ratios[measure]['epoch_1']:.2f}x / "
              f"{ratios[measure]['later']:.2f}x", flush=True)
    return _result(args, figures, ratios, sizes, num_files, batch)


def _result(args, figures: dict, ratios: dict, sizes: dict, num_files: int, batch: int) -> common.Result:
    later = f"epochs 2-{sizes['epochs']}" if sizes["epochs"] > 2 else "epoch 2"
    rows = []
    for measure, f in figures.items():
        for c in CONTENDERS:
            rows.append([measure, c, common.fmt(f[c]["epoch_1"]), common.fmt(f[c]["later"]),
                         common.fmt(f[c]["setup_s"], ".2f")])
        rows.append([measure, "tftrain / keras", common.fmt(ratios[measure]["epoch_1"], ".2f") + "x",
                     common.fmt(ratios[measure]["later"], ".2f") + "x", ""])

    def plot(fig):
        axes = fig.subplots(1, len(figures))
        for ax, (measure, f) in zip(axes, figures.items()):
            xs = range(2)
            for i, c in enumerate(CONTENDERS):
                ax.bar([x + (i - 0.5) * 0.4 for x in xs], [f[c]["epoch_1"], f[c]["later"]], width=0.4, label=c)
            ax.set_xticks(list(xs), ["epoch 1", later])
            ax.set_ylabel("images/sec")
            ax.set_title(measure, fontsize=9)
            ax.legend(fontsize=7)

    return common.Result(
        name=NAME,
        title=f"Image folder input: Keras image_dataset_from_directory vs tftrain image_folder_dataset "
              f"({num_files:,} files, batch {batch})",
        headers=["measure", "contender", "epoch 1 img/s", f"{later} img/s", "set-up s"],
        rows=rows,
        data={"figures": figures, "num_files": num_files, "batch_size": batch, "image_size": list(IMAGE_SIZE),
              **sizes},
        summary={"images_per_sec": {m: {c: {k: f[c][k] for k in ("epoch_1", "later")} for c in f}
                                    for m, f in figures.items()},
                 "ratio_tftrain_over_keras": ratios, "num_files": num_files, "batch_size": batch},
        notes=[
            f"{num_files:,} MNIST digits written as 28 x 28 grayscale PNG and JPEG files (alternating), read as "
            f"{IMAGE_SIZE[0]} x {IMAGE_SIZE[1]} RGB float32 (bilinear resize) by both. keras: "
            "image_dataset_from_directory(folder, image_size, batch_size), its defaults (verbose=False only "
            "silences its 'Found N files' line; file names shuffled "
            "with a buffer of 8 batches, parallel decode, last partial batch kept, prefetch, no cache). "
            "tftrain: image_folder_dataset(list_image_files(folder), image_size, batch_size, training=True), "
            "the default DataConfig (parallel decode, decoded images cached in memory, shuffled over the whole "
            "set every epoch, last partial batch dropped, prefetch; seed None, so non-deterministic order).",
            "images/sec = images the epoch yields / its seconds: the fastest first epoch, and the fastest later "
            f"epoch (they all do the same work), over {sizes['rounds']} (training) and "
            f"{sizes['rounds'] * MEASURES['pipeline alone'][1]} (pipeline alone) interleaved rounds (medians in "
            "the JSON file), each round on a fresh "
            "dataset (so epoch 1 always decodes every file) and, for training, a fresh model (a small CNN, "
            "Adam, its train function traced before the clock). The files were just written, so both read "
            "them from the OS page cache; set-up s = building the dataset (listing the files).",
            "A shared machine: other processes compete for the cores; compare the two contenders within a "
            "round, not figures across runs.",
        ],
        plot=plot,
    )


def main(argv=None) -> int:
    """`python -m benchmarks.image_folder_input [--quick] [--images N] [--epochs N] [--batch-size N]`."""
    return common.main_for(NAME, __doc__.splitlines()[0], run, argv, extra=_extra)


if __name__ == "__main__":
    raise SystemExit(main())
