"""Recipe defaults: the MNIST MLP's batch size and learning rate, chosen on a validation split.

The recipe's defaults must not be chosen on the numbers the other benchmarks
report (test accuracy) nor with their seeds. This benchmark trains the MLP
recipe (`tftrain.recipes.mnist`, every other default: Adam, cosine decay to 0
over 10 epochs, its precision and execution) on the first 54,000 training
images and scores each candidate on the last 6,000 (`--validation-split 0.1`,
held out as Keras's `fit(validation_split=...)` does), with `SEEDS` (0 and 1).
The test set is never evaluated here. The candidate with the best mean final
validation accuracy wins (ties within `TIE` go to the faster one); the other
benchmarks (`flagship`, `time_to_accuracy`) report test figures on seeds 2-4,
never used for choosing.

    python -m benchmarks.recipe_defaults [--quick]
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common

NAME = "recipe_defaults"

BATCH_SIZES = (256, 512, 1024)
LEARNING_RATES = (1e-3, 2e-3, 4e-3)
SEEDS = (0, 1)
"""The grid and the seeds used for choosing (never reported elsewhere)."""

TIE = 0.0005
"""Mean validation accuracies closer than this (0.05 points) count as a tie; the faster candidate wins."""


def _one_run(batch_size: int, learning_rate: float, seed: int, quick: bool, work: Path) -> dict:
    """One recipe run with a validation split; returns its final validation accuracy and times."""
    import keras

    from tftrain.recipes import mnist
    from tftrain.train import Trainer

    keras.backend.clear_session()
    overrides = {"model": "mlp", "batch_size": batch_size, "learning_rate": learning_rate, "seed": seed,
                 "validation_split": 0.1, "verbose": 0, "run_dir": str(work / f"b{batch_size}-lr{learning_rate}-s{seed}")}
    if quick:
        overrides.update(epochs=1, train_examples=2048)
    started = time.perf_counter()
    record = Trainer(_without_test(mnist.TASK), mnist.DEFAULTS.override(overrides)).fit()
    return {"batch_size": batch_size, "learning_rate": learning_rate, "seed": seed,
            "val_accuracy": record.history["val_accuracy"][-1], "val_loss": record.history["val_loss"][-1],
            "seconds": time.perf_counter() - started, "fit_time_s": record.fit_time_s}


def _without_test(task):
    """The MNIST task with its test set dropped after binding: nothing here may look at it."""
    class NoTest(type(task)):
        def bind(self, config):
            bound = super().bind(config)
            bound.test = None
            return bound

    return NoTest()


def choose(records: list) -> dict:
    """The candidate with the best mean validation accuracy; within `TIE` of it, the fastest.

    Args:
        records: `_one_run` results.

    Returns:
        `{"batch_size", "learning_rate", "mean_val_accuracy", "mean_seconds"}` of the winner.
    """
    candidates = {}
    for r in records:
        candidates.setdefault((r["batch_size"], r["learning_rate"]), []).append(r)
    means = [{"batch_size": b, "learning_rate": lr,
              "mean_val_accuracy": statistics.mean(r["val_accuracy"] for r in rs),
              "mean_seconds": statistics.mean(r["seconds"] for r in rs)} for (b, lr), rs in candidates.items()]
    best = max(m["mean_val_accuracy"] for m in means)
    return min((m for m in means if m["mean_val_accuracy"] >= best - TIE), key=lambda m: m["mean_seconds"])


def run(args, device) -> common.Result:
    """Trains every candidate with every seed, in this process, one after the other."""
    grid = list(itertools.product((256, 512), (2e-3,))) if args.quick else list(
        itertools.product(BATCH_SIZES, LEARNING_RATES))
    seeds = SEEDS[:1] if args.quick else SEEDS
    records = []
    with tempfile.TemporaryDirectory(prefix="tftrain-defaults-") as tmp:
        os.environ["TFTRAIN_CACHE_DIR"] = str(Path(tmp) / "cache")  # not the user's execution memory
        for (batch_size, lr), seed in itertools.product(grid, seeds):
            records.append(_one_run(batch_size, lr, seed, args.quick, Path(tmp)))
            print(f"batch {batch_size}, learning rate {lr:g}, seed {seed}: validation accuracy "
                  f"{records[-1]['val_accuracy']:.4f} in {records[-1]['seconds']:.1f} s", flush=True)
    return _result(records, grid, seeds)


def _result(records, grid, seeds) -> common.Result:
    from tftrain.recipes import mnist

    winner = choose(records)
    current = {"batch_size": mnist.BATCH_SIZES["mlp"], "learning_rate": mnist.DEFAULTS.train.learning_rate}
    rows = []
    for batch_size, lr in grid:
        rs = [r for r in records if (r["batch_size"], r["learning_rate"]) == (batch_size, lr)]
        mark = ("chosen" if (batch_size, lr) == (winner["batch_size"], winner["learning_rate"]) else "") + (
            " (recipe default)" if (batch_size, lr) == tuple(current.values()) else "")
        rows.append([batch_size, f"{lr:g}", " / ".join(f"{100 * r['val_accuracy']:.2f}%" for r in rs),
                     f"{100 * statistics.mean(r['val_accuracy'] for r in rs):.2f}%",
                     f"{statistics.mean(r['seconds'] for r in rs):.1f} s", mark.strip()])
    summary = {"chosen": winner, "recipe_default": current, "seeds": list(seeds),
               "recipe_default_is_chosen": (winner["batch_size"], winner["learning_rate"]) == tuple(current.values())}

    def plot(fig):
        ax = fig.subplots()
        for batch_size in sorted({b for b, _ in grid}):
            lrs = sorted(lr for b, lr in grid if b == batch_size)
            ax.plot(lrs, [100 * statistics.mean(r["val_accuracy"] for r in records if r["batch_size"] == batch_size
                                                and r["learning_rate"] == lr) for lr in lrs],
                    marker="o", label=f"batch {batch_size}")
        ax.set_xscale("log")
        ax.set_xlabel("peak learning rate (cosine decay to 0)")
        ax.set_ylabel("mean final validation accuracy, %")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)

    return common.Result(
        name=NAME, plot=plot,
        title="Recipe defaults: MNIST MLP batch size and learning rate chosen on a validation split",
        headers=["batch", "learning rate", f"validation accuracy (seeds {', '.join(map(str, seeds))})", "mean",
                 "mean run time", ""],
        rows=rows, data={"records": records}, summary=summary,
        notes=[f"MLP recipe, every other default; trained on the first 54,000 training images, scored on the last "
               f"6,000 (validation split 0.1) after the last epoch; seeds {list(seeds)}; the test set is never "
               "evaluated here. Run time: the whole Trainer run (set-up, --execution auto, training, saving).",
               f"Chosen: batch {winner['batch_size']}, learning rate {winner['learning_rate']:g} (best mean "
               f"validation accuracy, ties within {100 * TIE:.2f} points to the faster); the recipe's default is "
               f"batch {current['batch_size']}, learning rate {current['learning_rate']:g}."],
    )


def main(argv=None) -> int:
    """`python -m benchmarks.recipe_defaults [--quick]`."""
    return common.main_for(NAME, __doc__.split("\n\n")[0], run, argv)


if __name__ == "__main__":
    sys.exit(main())
