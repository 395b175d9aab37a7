"""Execution modes: eager vs graph vs XLA, and steps_per_execution 1 / 8 / 32, per model.

Every combination trains the recipe's model on the recipe's pipeline at one batch
size (the recipe's default for the model unless `--batch-size`); all of a model's contenders are
built first and then timed in interleaved rounds, each keeping its best round.

    python -m benchmarks.execution [--quick] [--batch-size N]
"""

from __future__ import annotations

from benchmarks import common

NAME = "execution"

COMBINATIONS = (("eager", 1), ("graph", 1), ("graph", 8), ("graph", 32), ("xla", 1), ("xla", 8), ("xla", 32))
"""(execution, steps_per_execution) pairs timed per model. Eager runs one step per
Python call whatever steps_per_execution says, so only 1 is timed."""


def _extra(parser):
    parser.add_argument("--batch-size", type=int, default=None, help="global batch size (default: the recipe's)")


def run(args, device) -> common.Result:
    """Times every (mode, steps_per_execution) pair for each model."""
    from tftrain.runtime import time_training_steps

    quick = args.quick
    batches = common.batch_sizes(args, quick_size=32)
    # Quick: every mode once on the MLP, graph only on the CNN (XLA-compiling it takes longest).
    combos_by_model = {"mlp": (("eager", 1), ("graph", 1), ("graph", 8), ("xla", 1)), "cnn": (("graph", 1),)} \
        if quick else {m: COMBINATIONS for m in common.MODELS}
    steps = {"mlp": 1, "cnn": 1} if quick else {"mlp": 64, "cnn": 16}
    rounds = 1 if quick else 2
    data = common.mnist_arrays()

    rows, points = [], []
    for model_name in common.MODELS:
        combos = combos_by_model[model_name]
        batch = batches[model_name]
        ds = common.train_batches(data, batch, examples=batch * 32)
        models = {
            (mode, spe): common.compile_model(common.build_model(model_name), mode, spe) for mode, spe in combos
        }

        def timer(key, model_name=model_name, models=models, ds=ds):
            mode, spe = key
            # Eager steps are slow and their time does not vary with compiling: time fewer.
            n = max(1, steps[model_name] // (4 if mode == "eager" else 1))
            return lambda: time_training_steps(
                models[key], ds, steps=n, min_timed_executions=1 if spe >= 32 or quick else 3
            ).step_time_s

        figures = common.best_of_rounds({key: timer(key) for key in combos}, rounds)
        base = min(figures[("graph", 1)])
        for (mode, spe), times in figures.items():
            step = min(times)
            point = {
                "model": model_name, "execution": mode, "steps_per_execution": spe, "batch_size": batch,
                "step_time_s": step, "examples_per_sec": common.rate(batch, step),
                "speedup_vs_graph_1": common.ratio(base, step), "rounds_s": times,
            }
            points.append(point)
            rows.append([model_name, batch, mode, spe, common.fmt(step * 1e3, ".2f"), common.fmt(point["examples_per_sec"]),
                         common.fmt(point["speedup_vs_graph_1"], ".2f") + "x"])
            print(f"{model_name} {mode} spe={spe}: {step * 1e3:.2f} ms/step", flush=True)

    best = {}
    for p in (p for p in points if p["examples_per_sec"] == p["examples_per_sec"]):  # skip NaN (failed)
        if p["model"] not in best or p["examples_per_sec"] > best[p["model"]]["examples_per_sec"]:
            best[p["model"]] = p
    step_of = {(p["model"], p["execution"], p["steps_per_execution"]): p["step_time_s"] for p in points}
    summary = {
        "batch_sizes": batches,
        "best": {m: {"execution": p["execution"], "steps_per_execution": p["steps_per_execution"],
                     "examples_per_sec": p["examples_per_sec"], "speedup_vs_graph_1": p["speedup_vs_graph_1"]}
                 for m, p in best.items()},
        "xla_speedup_vs_graph_spe1": {
            m: common.ratio(step_of[(m, "graph", 1)], step_of[(m, "xla", 1)])
            for m in common.MODELS if (m, "xla", 1) in step_of
        },
    }

    def plot(fig):
        axes = fig.subplots(1, len(common.MODELS))
        for ax, model_name in zip(axes, common.MODELS):
            ps = [p for p in points if p["model"] == model_name]
            labels = [f"{p['execution']}\nspe {p['steps_per_execution']}" for p in ps]
            colors = {"eager": "tab:grey", "graph": "tab:blue", "xla": "tab:orange"}
            ax.bar(range(len(ps)), [p["examples_per_sec"] for p in ps], color=[colors[p["execution"]] for p in ps])
            ax.set_xticks(range(len(ps)), labels, fontsize=7)
            ax.set_title(f"{model_name}, batch {batches[model_name]}", fontsize=9)
            ax.set_ylabel("examples/sec")
            ax.grid(axis="y", alpha=0.3)

    return common.Result(
        name=NAME,
        title=f"Execution modes and steps_per_execution ({common.describe_batches(batches)})",
        headers=["model", "batch", "execution", "steps/execution", "ms/step", "examples/sec", "vs graph, 1 step"],
        rows=rows,
        data={"points": points, "rounds": rounds, "steps": steps},
        summary=summary,
        notes=[
            f"Median step time of each contender's best of {rounds} interleaved round(s), after compiling; "
            "the recipe's tf.data pipeline feeds every contender.",
            "XLA compiles each step function (jit_compile=True); steps_per_execution > 1 runs that many "
            "steps in one tf.function call (a tf.while_loop around the step).",
        ],
        plot=plot,
    )


def main(argv=None) -> int:
    """`python -m benchmarks.execution [--quick] [--batch-size N]`."""
    return common.main_for(NAME, __doc__.splitlines()[0], run, argv, extra=_extra)


if __name__ == "__main__":
    raise SystemExit(main())
