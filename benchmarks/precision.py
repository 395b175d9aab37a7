"""Precision: float32 vs mixed_bfloat16 vs mixed_float16 training throughput.

Each dtype policy builds its own copy of the recipe's model (Keras wraps the
optimizer in a LossScaleOptimizer under mixed_float16); all are timed in graph and
XLA mode, in interleaved rounds, at the recipe's batch size. Mixed precision pays
off on hardware with fast 16-bit math (GPUs of compute capability >= 7.0 for
float16, >= 8.0 for bfloat16; CPUs with AVX512-BF16 or AMX); elsewhere the casts
only add work, and the table shows by how much.

    python -m benchmarks.precision [--quick] [--batch-size N]
"""

from __future__ import annotations

from benchmarks import common

NAME = "precision"

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")


def _extra(parser):
    parser.add_argument("--batch-size", type=int, default=None, help="global batch size (default: the recipe's)")


def hardware_support(device: dict) -> dict:
    """Which 16-bit types the hardware runs natively: `{"bfloat16": bool, "float16": bool, "why": str}`."""
    from tftrain.runtime.precision import cpu_has_native_bf16

    if device.get("kind") == "gpu":
        import tensorflow as tf

        caps = []
        for gpu in tf.config.list_physical_devices("GPU"):
            details = tf.config.experimental.get_device_details(gpu)
            caps.append(details.get("compute_capability") or (0, 0))
        low = min(caps) if caps else (0, 0)
        return {"float16": low >= (7, 0), "bfloat16": low >= (8, 0), "why": f"GPU compute capability {low}"}
    native = cpu_has_native_bf16()
    return {"float16": False, "bfloat16": native,
            "why": "CPU " + ("with" if native else "without") + " AVX512-BF16/AMX-BF16; no fast float16 on CPUs"}


def run(args, device) -> common.Result:
    """Times each policy in graph and XLA mode, per model."""
    import warnings

    from tftrain.runtime import precision_policy, time_training_steps

    quick = args.quick
    defaults = common.recipe_defaults()
    batches = common.batch_sizes(args, quick_size=32)
    spe = defaults.runtime.steps_per_execution
    modes = ("graph",) if quick else ("graph", "xla")
    steps = {"mlp": 1, "cnn": 1} if quick else {"mlp": 48, "cnn": 8}
    rounds = 1 if quick else 2
    model_names = ("mlp",) if quick else common.MODELS  # --quick checks the machinery on one model
    data = common.mnist_arrays()
    support = hardware_support(device)

    rows, points = [], []
    for model_name in model_names:
        batch = batches[model_name]
        ds = common.train_batches(data, batch, examples=batch * 16)
        models = {}
        for policy in POLICIES:
            for mode in modes:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # mixed_float16 on CPU: we know
                    with precision_policy(policy):
                        models[(policy, mode)] = common.compile_model(common.build_model(model_name), mode, spe)

        def timer(key, model_name=model_name, models=models, ds=ds):
            return lambda: time_training_steps(models[key], ds, steps=steps[model_name],
                                               min_timed_executions=1 if quick else 3).step_time_s

        figures = common.best_of_rounds({key: timer(key) for key in models}, rounds)
        base = {mode: min(figures[("float32", mode)]) for mode in modes}
        for (policy, mode), times in figures.items():
            step = min(times)
            points.append({
                "model": model_name, "policy": policy, "execution": mode, "batch_size": batch,
                "step_time_s": step, "examples_per_sec": common.rate(batch, step),
                "speedup_vs_float32": common.ratio(base[mode], step), "rounds_s": times,
            })
            rows.append([model_name, batch, policy, mode, common.fmt(step * 1e3, ".2f"), common.fmt(common.rate(batch, step)),
                         common.fmt(common.ratio(base[mode], step), ".2f") + "x"])
            print(f"{model_name} {policy} {mode}: {step * 1e3:.2f} ms/step", flush=True)

    summary = {
        "batch_sizes": batches,
        "hardware": support,
        "speedup_vs_float32": {
            f"{p['model']}/{p['policy']}/{p['execution']}": p["speedup_vs_float32"]
            for p in points if p["policy"] != "float32"
        },
    }

    def plot(fig):
        axes = fig.subplots(1, len(model_names), squeeze=False)[0]
        for ax, model_name in zip(axes, model_names):
            width = 0.8 / len(modes)
            for i, mode in enumerate(modes):
                ys = [next(p["examples_per_sec"] for p in points
                           if p["model"] == model_name and p["policy"] == pol and p["execution"] == mode)
                      for pol in POLICIES]
                ax.bar([x + (i - (len(modes) - 1) / 2) * width for x in range(len(POLICIES))], ys, width=width,
                       label=mode)
            ax.set_xticks(range(len(POLICIES)), POLICIES, fontsize=7)
            ax.set_title(f"{model_name}, batch {batches[model_name]}", fontsize=9)
            ax.set_ylabel("examples/sec")
            ax.legend(fontsize=7)

    return common.Result(
        name=NAME,
        title=f"Precision: float32 vs mixed_bfloat16 vs mixed_float16 ({common.describe_batches(batches)})",
        headers=["model", "batch", "policy", "execution", "ms/step", "examples/sec", "vs float32"],
        rows=rows,
        data={"points": points, "rounds": rounds, "steps": steps},
        summary=summary,
        notes=[
            f"Hardware: {support['why']}: native float16 {'yes' if support['float16'] else 'no'}, "
            f"native bfloat16 {'yes' if support['bfloat16'] else 'no'}.",
            f"Median step time of each contender's best of {rounds} interleaved round(s); mixed_float16 "
            "includes dynamic loss scaling.",
        ],
        plot=plot,
    )


def main(argv=None) -> int:
    """`python -m benchmarks.precision [--quick] [--batch-size N]`."""
    return common.main_for(NAME, __doc__.splitlines()[0], run, argv, extra=_extra)


if __name__ == "__main__":
    raise SystemExit(main())
