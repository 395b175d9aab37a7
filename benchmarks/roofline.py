"""Roofline: how close training gets to the machine's measured matmul speed.

* Peak: FLOP/s of a large float32 matmul (`tf.matmul` in a `tf.function`), best of
  several repeats and sizes: what the machine's BLAS really delivers, not the data
  sheet's figure.
* Work: training FLOPs per example of each model, counted from its layer shapes
  (`tftrain.flops.count_training_flops`: forward plus backward multiply-adds).
* Achieved: examples/sec x FLOPs per example, per model and batch size, in graph
  and XLA mode (the faster is the row's figure), as a fraction of the peak.

    python -m benchmarks.roofline [--quick]
"""

from __future__ import annotations

from benchmarks import common
from tftrain.doctor.measure import matmul_peak  # shared with python -m tftrain.doctor

NAME = "roofline"


def run(args, device) -> common.Result:
    """Measures the peak and each model's achieved fraction of it."""
    from tftrain.flops import count_training_flops
    from tftrain.runtime import precision_policy, time_training_steps

    quick = args.quick
    gpu = device["kind"] == "gpu"
    sizes = (256,) if quick else ((4096, 8192) if gpu else (1024, 2048, 4096))
    repeats = 2 if quick else 5
    peaks = {"float32": matmul_peak(sizes, repeats)}
    policies = ["float32"]
    if gpu:
        from benchmarks.precision import hardware_support

        if hardware_support(device)["float16"]:
            peaks["mixed_float16"] = matmul_peak(sizes, repeats, dtype="float16")
            policies.append("mixed_float16")
    peak = peaks["float32"]
    if quick:
        batches = {"mlp": (32, 128), "cnn": (32,)}  # noqa: E501 (quick)
    elif gpu:
        batches = {"mlp": (512, 2048, 8192), "cnn": (256, 1024)}  # fits the GPU suite's 10 minutes
    else:
        batches = {"mlp": (32, 64, 128, 256, 512, 1024, 2048), "cnn": (32, 64, 128, 256, 512)}
    steps = {"mlp": 2, "cnn": 1} if quick else {"mlp": 40, "cnn": 8 if not gpu else 20}
    spe = common.recipe_defaults().runtime.steps_per_execution
    data = common.mnist_arrays()
    rows, points, flops = [], [], {}
    for model_name, sizes_for_model in batches.items():
        flops[model_name] = count_training_flops(common.build_model(model_name)).to_dict()
        per_example = flops[model_name]["training"]
        for policy in policies:
            policy_peak = peaks[policy]["best_flops"]
            for batch in sizes_for_model:
                ds = common.train_batches(data, batch, examples=batch * 8)
                # Quick: XLA-compiling the CNN alone takes longer than the rest; time graph only.
                candidates = ("graph",) if quick and model_name == "cnn" else ("graph", "xla")
                figures = {}
                for mode in candidates:  # each mode timed on its own model, the same steps
                    with precision_policy(policy):
                        model = common.compile_model(common.build_model(model_name), mode, spe)
                    figures[mode] = time_training_steps(
                        model, ds, steps=steps[model_name],
                        min_timed_executions=1 if quick or model_name == "cnn" else 3).examples_per_sec
                best_mode = max(figures, key=figures.get)
                best = max(figures.values())
                achieved = best * per_example
                point = {
                    "model": model_name, "policy": policy, "batch_size": batch, "examples_per_sec": figures,
                    "best_mode": best_mode, "achieved_flops": achieved,
                    "fraction_of_peak": achieved / policy_peak,
                }
                points.append(point)
                rows.append([
                    model_name, policy, batch, common.fmt(figures.get("graph")), common.fmt(figures.get("xla")),
                    best_mode, f"{achieved / 1e9:.1f}", f"{point['fraction_of_peak']:.0%}",
                ])
                print(f"{model_name} {policy} batch {batch}: " + ", ".join(
                    f"{m} {v:,.0f} examples/sec" for m, v in figures.items()), flush=True)

    best_by_model = {}
    for p in (p for p in points if p["policy"] == "float32"):
        if p["model"] not in best_by_model or p["fraction_of_peak"] > best_by_model[p["model"]]["fraction_of_peak"]:
            best_by_model[p["model"]] = p
    summary = {
        "peak_gflops": peak["best_flops"] / 1e9,
        "peak_gflops_by_dtype": {k: v["best_flops"] / 1e9 for k, v in peaks.items()},
        "training_flops_per_example": {m: f["training"] for m, f in flops.items()},
        "best": {
            m: {"batch_size": p["batch_size"], "mode": p["best_mode"], "fraction_of_peak": p["fraction_of_peak"],
                "gflops": p["achieved_flops"] / 1e9}
            for m, p in best_by_model.items()
        },
        "target": "MLP at its best batch size >= 50% of the measured matmul peak",
    }
    if "mlp" in best_by_model:
        summary["mlp_target_met"] = best_by_model["mlp"]["fraction_of_peak"] >= 0.5

    def plot(fig):
        ax = fig.add_subplot(1, 1, 1)
        for model_name in batches:
            for policy in policies:
                ps = [p for p in points if p["model"] == model_name and p["policy"] == policy]
                ax.plot([p["batch_size"] for p in ps], [100 * p["fraction_of_peak"] for p in ps], marker="o",
                        label=model_name + ("" if policy == "float32" else f" {policy}"))
        ax.axhline(50, color="grey", linestyle="--", linewidth=1, label="target 50% (MLP)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel(f"% of measured matmul peak (float32: {peak['best_flops'] / 1e9:.0f} GFLOP/s)")
        ax.legend()
        ax.grid(alpha=0.3)

    notes = [
        f"Peak: best matmul of sizes {', '.join(map(str, sizes))}: "
        + ", ".join(f"{v['dtype']} {v['best_flops'] / 1e9:.1f} GFLOP/s" for v in peaks.values())
        + " (mixed_float16 rows are measured against the float16 peak).",
        "Training FLOPs per example (forward + backward multiply-adds, from layer shapes): "
        + ", ".join(f"{m} {f['training'] / 1e6:.2f} MFLOP" for m, f in flops.items()) + ".",
        f"Each point: best of graph and XLA (median step of {steps['mlp']} (MLP) / {steps['cnn']} (CNN) "
        f"timed steps after compiling), the recipe's steps_per_execution ({spe}) and tf.data pipeline.",
    ]
    return common.Result(
        name=NAME,
        title="Roofline: achieved fraction of the measured matmul peak",
        headers=["model", "policy", "batch", "graph ex/s", "XLA ex/s", "faster", "achieved GFLOP/s", "of peak"],
        rows=rows,
        data={"peak": peak, "peaks": peaks, "flops_per_example": flops, "points": points, "steps_per_execution": spe},
        summary=summary,
        notes=notes,
        plot=plot,
    )


def main(argv=None) -> int:
    """`python -m benchmarks.roofline [--quick] [--out DIR]`."""
    return common.main_for(NAME, __doc__.splitlines()[0], run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
