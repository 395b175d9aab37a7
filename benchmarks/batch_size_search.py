"""Which global batch sizes does find_batch_size choose for the MNIST models? Prints a table.

For each model: the largest batch that fits (objective "largest": on the CPU, under the
default memory budget, half the memory available at the start) and the batch with the
best examples/sec (objective "throughput": the smallest within 5% of the fastest), on the
full 60,000 MNIST training images.

    python benchmarks/batch_size_search.py --models mlp cnn

Figures depend on the machine and on what else runs on it; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=("mlp", "cnn"), default=["mlp", "cnn"])
    parser.add_argument("--objectives", nargs="+", choices=("largest", "throughput"),
                        default=["largest", "throughput"])
    parser.add_argument("--mode", choices=("power", "binsearch"), default="power")
    parser.add_argument("--steps-per-trial", type=int, default=3)
    parser.add_argument("--trial-timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)

    import keras

    from tftrain.data import load_mnist
    from tftrain.recipes import mnist
    from tftrain.tuning import find_batch_size

    data = load_mnist()
    x, y = data.x_train, data.y_train  # raw pixels: the recipe's models scale their inputs
    rows = []
    for name in args.models:
        for objective in args.objectives:
            keras.utils.set_random_seed(0)
            model = getattr(mnist, name)()
            model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
            model.build((None, 28, 28))
            print(f"== {name}, objective {objective} ==", flush=True)
            result = find_batch_size(model, (x, y), objective=objective, mode=args.mode,
                                     steps_per_trial=args.steps_per_trial, trial_timeout_s=args.trial_timeout_s)
            rows.append((name, objective, result))

    print()
    print(f"{'model':<6}{'objective':<12}{'chosen':>8}{'largest fit':>13}{'best ex/s at':>14}"
          f"{'ex/s':>10}{'limit':>10}{'trials':>8}{'budget GiB':>12}{'time s':>9}")
    for name, objective, r in rows:
        largest = r.largest_fitting if r.largest_fitting is not None else f">={r.largest_tried_ok}"
        budget = f"{r.memory_budget_bytes / 2**30:.1f}" if r.memory_budget_bytes else "-"
        rate = f"{r.best_examples_per_sec:,.0f}" if r.best_examples_per_sec else "-"
        print(f"{name:<6}{objective:<12}{r.batch_size:>8}{largest!s:>13}{r.best_throughput:>14}"
              f"{rate:>10}{r.limit:>10}{len(r.trials):>8}{budget:>12}{r.seconds:>9.0f}")


if __name__ == "__main__":
    main()
