"""Mirrored across the GPUs: one device vs MirroredStrategy over all of them.

The same recipe model trains with TensorFlow's default strategy on one device and
with `MirroredStrategy` over every visible GPU, at the same per-replica batch size
(so the global batch grows with the replicas), in float32 and in the policy the
recipe's `--precision auto` picks (mixed_float16 on GPUs of compute capability
>= 7.0). Scaling efficiency = examples/sec with N replicas / (N x one device).
Graph mode throughout: Keras cannot compile a cross-replica step with XLA.

Without a GPU it runs on the CPU's single device, says so, and the figures only
show that the code path works.

    python -m benchmarks.mirrored [--quick] [--device gpu]
"""

from __future__ import annotations

from benchmarks import common

NAME = "mirrored"


def _extra(parser):
    parser.add_argument("--per-replica-batch-size", type=int, default=None,
                        help="examples per replica per step (default: the recipe's batch size)")


def run(args, device) -> common.Result:
    """Times one device and Mirrored over all devices, per model and policy."""
    import tensorflow as tf

    from tftrain.runtime import precision_policy, time_training_steps
    from tftrain.runtime.devices import DeviceInfo
    from tftrain.runtime.precision import resolve_precision

    quick = args.quick
    defaults = common.recipe_defaults()
    per_replica_sizes = {m: args.per_replica_batch_size or (32 if quick else common.default_batch_size(m))
                         for m in common.MODELS}
    spe = defaults.runtime.steps_per_execution
    devices = device["devices"] or ["/device:CPU:0"]
    info = DeviceInfo(device["kind"], tuple(devices))
    policies = ["float32"] if quick else list(dict.fromkeys(["float32", resolve_precision("auto", info)]))
    steps = {"mlp": 2, "cnn": 2} if quick else {"mlp": 100, "cnn": 30}
    rounds = 1 if quick or device["kind"] == "gpu" else 2
    model_names = ("mlp",) if quick else common.MODELS  # --quick checks the machinery on one model
    data = common.mnist_arrays()
    strategies = {
        "one device": tf.distribute.OneDeviceStrategy(devices[0]),
        f"mirrored x{len(devices)}": tf.distribute.MirroredStrategy(list(devices)),
    }

    rows, points = [], []
    for model_name in model_names:
        per_replica = per_replica_sizes[model_name]
        contenders, batches = {}, {}
        for strategy_name, strategy in strategies.items():
            global_batch = per_replica * strategy.num_replicas_in_sync
            ds = common.train_batches(data, global_batch, examples=global_batch * 16)
            for policy in policies:
                # Keras 3 cannot run several steps per call across replicas (keras-team/keras#19246).
                steps_per_call = spe if strategy.num_replicas_in_sync == 1 else 1
                with precision_policy(policy), strategy.scope():
                    model = common.compile_model(common.build_model(model_name), "graph", steps_per_call)
                key = (strategy_name, policy)
                batches[key] = (global_batch, strategy.num_replicas_in_sync)
                contenders[key] = (lambda m=model, d=ds, n=steps[model_name]:
                                   time_training_steps(m, d, steps=n).step_time_s)
        figures = common.best_of_rounds(contenders, rounds)
        single = {policy: common.rate(batches[("one device", policy)][0], min(figures[("one device", policy)]))
                  for policy in policies}
        for (strategy_name, policy), times in figures.items():
            global_batch, replicas = batches[(strategy_name, policy)]
            eps = common.rate(global_batch, min(times))
            efficiency = common.ratio(eps, replicas * single[policy])
            points.append({"model": model_name, "strategy": strategy_name, "replicas": replicas, "policy": policy,
                           "global_batch_size": global_batch, "per_replica_batch_size": per_replica,
                           "examples_per_sec": eps, "scaling_efficiency": efficiency})
            rows.append([model_name, strategy_name, replicas, policy, global_batch, common.fmt(eps),
                         common.fmt(efficiency, ".0%")])
            print(f"{model_name} {strategy_name} {policy}: {eps:,.0f} examples/sec", flush=True)

    def plot(fig):
        axes = fig.subplots(1, len(model_names), squeeze=False)[0]
        for ax, model_name in zip(axes, model_names):
            ps = [p for p in points if p["model"] == model_name]
            ax.bar(range(len(ps)), [p["examples_per_sec"] for p in ps])
            ax.set_xticks(range(len(ps)), [f"{p['strategy']}\n{p['policy']}" for p in ps], fontsize=6)
            ax.set_ylabel("examples/sec")
            ax.set_title(f"{model_name}, {per_replica_sizes[model_name]} per replica", fontsize=9)

    notes = [f"Devices: {', '.join(devices)}" + (f" ({', '.join(device['gpu_names'])})" if device["gpu_names"] else "")
             + f"; per-replica {common.describe_batches(per_replica_sizes)}; graph mode; best of {rounds} round(s)."]
    if device["kind"] != "gpu":
        notes.append("No GPU: MirroredStrategy ran on the CPU's one device (1 replica); this only checks the path.")
    return common.Result(
        name=NAME,
        title="Mirrored across the GPUs vs one device",
        headers=["model", "strategy", "replicas", "policy", "global batch", "examples/sec", "scaling efficiency"],
        rows=rows,
        data={"points": points, "policies": policies},
        summary={"replicas": len(devices), "points": [
            {k: p[k] for k in ("model", "strategy", "policy", "examples_per_sec", "scaling_efficiency")}
            for p in points]},
        notes=notes,
        plot=plot,
    )


def main(argv=None) -> int:
    """`python -m benchmarks.mirrored [--quick] [--device gpu]`."""
    return common.main_for(NAME, __doc__.splitlines()[0], run, argv, extra=_extra)


if __name__ == "__main__":
    raise SystemExit(main())
