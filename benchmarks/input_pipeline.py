"""Input pipeline: tf.data alone vs the training step, for each pipeline option.

For each variant of the recipe's pipeline (`tftrain.data.build_dataset` with one
option changed: parallel map, prefetch, private threads; and the tf.data
guide's element-wise pipeline over whole examples, for comparison), three figures,
timed back to back in interleaved rounds:

* pipeline alone: examples/sec of iterating the dataset, no model;
* training: examples/sec of training steps fed by that pipeline (mean over the
  timed steps, so epoch-boundary stalls count);
* input wait: the share of the training step spent waiting for input,
  `1 - t(batches held in memory) / t(pipeline)`, the same model and mode,
  paired within each round and the median over rounds.

    python -m benchmarks.input_pipeline [--quick] [--batch-size N]
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from benchmarks import common

NAME = "input_pipeline"

VARIANTS = {
    "recipe defaults": {},
    "element-wise shuffle": None,  # the tf.data guide's pipeline over whole examples; see elementwise()
    "scale in the pipeline": "scale",  # float32 batches from the pipeline (the recipe scales in the model)
    "no parallel map": {"parallel_map": False},
    "no prefetch": {"prefetch": False},
    "all off": {"parallel_map": False, "prefetch": False},
    "private threads 1": {"private_threads": 1},
    "private threads 2": {"private_threads": 2},
}
"""Variant name -> `DataConfig` fields changed from the recipe's defaults (None: `elementwise`;
"scale": the defaults with `scale_pixels` as the batch map)."""


def _extra(parser):
    parser.add_argument("--batch-size", type=int, default=None, help="global batch size (default: the recipe's)")


def elementwise(data, batch_size: int, examples: int, seed: int = 0):
    """The pipeline of the tf.data guide over whole examples, for comparison.

    `from_tensor_slices((x, y)) -> cache -> shuffle(whole set) -> batch -> map(scale)
    -> prefetch`: what `build_dataset` did before it shuffled indices instead.
    """
    import tensorflow as tf

    from tftrain.data import integer_labels

    ds = tf.data.Dataset.from_tensor_slices((data.x_train[:examples], data.y_train[:examples])).cache()
    ds = ds.shuffle(examples, seed=seed, reshuffle_each_iteration=True).batch(batch_size, drop_remainder=True)
    return ds.map(integer_labels, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def pipeline_examples_per_sec(dataset, batches: int, batch_size: int) -> float:
    """Examples/sec of iterating `dataset.repeat()` for `batches` batches (after one warm-up batch)."""
    iterator = iter(dataset.repeat())
    next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches * batch_size / (time.perf_counter() - start)


def run(args, device) -> common.Result:
    """Times each pipeline variant alone and under training, per model."""
    import tensorflow as tf

    from tftrain.data import scale_pixels
    from tftrain.runtime import choose_execution, time_training_steps

    quick = args.quick
    defaults = common.recipe_defaults()
    batches = common.batch_sizes(args, quick_size=64)
    spe = defaults.runtime.steps_per_execution
    variants = {k: VARIANTS[k] for k in ("recipe defaults", "element-wise shuffle")} if quick else VARIANTS
    # Batches per (repeated) epoch: the MLP's whole training set, so each timing spans one real epoch
    # with its shuffle-buffer refill; 32 batches for the CNN, whose epoch would take minutes.
    epoch_batches = {"mlp": 4, "cnn": 4} if quick else {
        "mlp": len(common.mnist_arrays().x_train) // batches["mlp"], "cnn": 32}
    steps = {"mlp": 2, "cnn": 1} if quick else {"mlp": epoch_batches["mlp"], "cnn": 8}
    alone_batches = 8 if quick else 100
    rounds = 1 if quick else 3
    data = common.mnist_arrays()

    rows, points = [], []
    for model_name in common.MODELS:
        batch = batches[model_name]
        batches_per_epoch = epoch_batches[model_name]
        examples = batch * batches_per_epoch
        datasets = {
            name: elementwise(data, batch, examples) if change is None
            else common.train_batches(data, batch, examples, defaults.data, preprocess=scale_pixels)
            if change == "scale"
            else common.train_batches(data, batch, examples, dataclasses.replace(defaults.data, **change))
            for name, change in variants.items()
        }
        # The same number of batches, produced once and held in memory: the step time with no input
        # cost (distinct batches, so the data is no more cache-hot than the pipeline's).
        synthetic = datasets["recipe defaults"].take(batches_per_epoch).cache().repeat()
        for _ in synthetic.take(batches_per_epoch):  # fill the cache now, outside the timing
            pass
        model = common.compile_model(common.build_model(model_name), "graph", spe)
        mode = "graph" if quick else defaults.runtime.execution
        if mode == "auto":
            mode = choose_execution(model, synthetic).execution
        elif mode != "graph":
            model = common.compile_model(common.build_model(model_name), mode, spe)

        def train_timer(ds, model_name=model_name, model=model):  # noqa: B023 (bound now)
            return lambda: time_training_steps(model, ds, steps=steps[model_name],
                                               min_timed_executions=1 if quick else 3).mean_step_time_s

        contenders = {}
        for name, ds in datasets.items():
            # The no-input step timed right before each variant, so each pair is seconds apart.
            contenders[f"synthetic:{name}"] = train_timer(synthetic)
            contenders[name] = train_timer(ds)
            contenders[f"alone:{name}"] = (
                lambda ds=ds, batch=batch: batch / pipeline_examples_per_sec(ds, alone_batches, batch)
            )
        figures = common.best_of_rounds(contenders, rounds)
        t_synthetic = min(min(figures[f"synthetic:{name}"]) for name in variants)
        for name in variants:
            t_train = min(figures[name])
            alone = batch / min(figures[f"alone:{name}"])
            # Paired within each round (the two timings were taken seconds apart), median over rounds:
            # steadier on a busy machine than comparing each one's best round.
            wait = max(0.0, statistics.median(
                1.0 - syn / t for syn, t in zip(figures[f"synthetic:{name}"], figures[name])))
            points.append({
                "model": model_name, "variant": name,
                "options": dataclasses.asdict(dataclasses.replace(defaults.data, **variants[name]))
                if isinstance(variants[name], dict) else variants[name],
                "pipeline_examples_per_sec": alone, "training_examples_per_sec": batch / t_train,
                "synthetic_examples_per_sec": batch / t_synthetic, "input_wait_fraction": wait,
                "execution": mode, "steps_per_execution": spe, "batch_size": batch,
            })
            rows.append([model_name, batch, name, common.fmt(alone), common.fmt(batch / t_train),
                         common.fmt(batch / t_synthetic), f"{wait:.1%}"])
            print(f"{model_name} {name}: alone {alone:,.0f} ex/s, training {batch / t_train:,.0f} ex/s, "
                  f"wait {wait:.1%}", flush=True)

    default_wait = {p["model"]: p["input_wait_fraction"] for p in points if p["variant"] == "recipe defaults"}
    summary = {
        "batch_sizes": batches,
        "input_wait_fraction_recipe_defaults": default_wait,
        "target": "input wait < 5% of the step time with the recipe's defaults",
        "target_met": all(w < 0.05 for w in default_wait.values()),
    }

    def plot(fig):
        axes = fig.subplots(1, len(common.MODELS))
        names = list(variants)
        for ax, model_name in zip(axes, common.MODELS):
            ps = [p for p in points if p["model"] == model_name]
            xs = range(len(ps))
            ax.bar([x - 0.2 for x in xs], [p["pipeline_examples_per_sec"] for p in ps], width=0.4,
                   label="pipeline alone")
            ax.bar([x + 0.2 for x in xs], [p["training_examples_per_sec"] for p in ps], width=0.4,
                   label="training")
            ax.axhline(ps[0]["synthetic_examples_per_sec"], color="grey", linestyle="--", linewidth=1,
                       label="training, no input")
            ax.set_yscale("log")
            top = max(p["pipeline_examples_per_sec"] for p in ps)
            ax.set_ylim(top=top * 8)  # room for the legend above the bars
            ax.set_xticks(list(xs), names, fontsize=6, rotation=40, ha="right")
            ax.set_title(f"{model_name}, batch {batches[model_name]}", fontsize=9)
            ax.set_ylabel("examples/sec")
            ax.legend(fontsize=6, loc="upper right", ncol=3)

    return common.Result(
        name=NAME,
        title=f"Input pipeline: tf.data alone vs training ({common.describe_batches(batches)})",
        headers=["model", "batch", "pipeline", "alone ex/s", "training ex/s", "no-input ex/s", "input wait"],
        rows=rows,
        data={"points": points, "rounds": rounds, "epoch_batches": epoch_batches, "steps": steps,
              "tf_data_autotune": str(tf.data.AUTOTUNE)},
        summary=summary,
        notes=[
            f"Epochs of {epoch_batches['mlp']} (MLP{'' if quick else ': the whole training set'}) / "
            f"{epoch_batches['cnn']} (CNN) batches, "
            "repeated (so epoch boundaries, with their "
            "shuffle-buffer refill, are inside the timed steps). "
            "The recipe's pipeline shuffles example indices and gathers each batch; 'element-wise shuffle' "
            "shuffles whole examples (from_tensor_slices -> cache -> shuffle -> batch -> map -> prefetch). "
            "There is no 'no cache' row: cache applies to file sources only (arrays are in memory). The recipe's "
            "pipeline yields raw uint8 pixels (its models scale them); 'scale in the pipeline' maps them to "
            "float32 in tf.data instead, as the tf.data guide does (compare its training examples/sec).",
            "Input wait = 1 - (step time on batches held in memory) / (step time fed by the pipeline), "
            f"paired within each of {rounds} interleaved round(s), median over rounds; the examples/sec are "
            "each contender's best round.",
        ],
        plot=plot,
    )


def main(argv=None) -> int:
    """`python -m benchmarks.input_pipeline [--quick] [--batch-size N]`."""
    return common.main_for(NAME, __doc__.splitlines()[0], run, argv, extra=_extra)


if __name__ == "__main__":
    raise SystemExit(main())
