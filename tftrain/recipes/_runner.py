"""The shared recipe driver: config -> runtime -> data -> model -> fit -> report.

A recipe module declares a `Recipe` (models, data loader, defaults) and calls
`main(argv, recipe)`. Bad input of any kind (flags, recipe file, TF_CONFIG, SLURM
step, data folder, run directory) ends with one line on stderr and exit code 2.

Multi-process runs (`--strategy multi_worker_mirrored` or `parameter_server`,
started by `python -m tftrain.launch`, `srun` or a TFJob) run this same driver in
every task:

* `multi_worker_mirrored`: every chief/worker task trains with `Model.fit` on its
  own shard of the data; only the chief writes the run directory (config, logs,
  `backup/` checkpoint, model, metrics); the others write the same files to a
  temporary directory that is removed at the end (`rundir.task_run_dir`).
* `parameter_server`: worker and ps tasks start a `tf.distribute.Server` and wait;
  the chief builds the model on the ps tasks and trains it with
  `tftrain.ps_training.fit` (a `ClusterCoordinator` loop), then evaluates it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from typing import Callable, Mapping, Optional, Sequence

from tftrain import cli
from tftrain import config as config_lib
from tftrain.errors import ConfigError

PROG_PREFIX = "python -m tftrain.recipes."


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What a recipe supplies to the driver.

    Attributes:
        name: short name, used for the program name and run directories.
        models: model name -> function `(RecipeConfig) -> keras.Model` (called
            inside `strategy.scope()`, uncompiled).
        load_data: function `(data_dir or None) -> ImageClassificationData`.
        defaults: the recipe's default `RecipeConfig`.
        preprocess: batch map `(x, y) -> (x, y)` for the tf.data pipeline.
            Defaults to None (no map).
        default_config: the recipe file that mirrors `defaults`, named in help.
            Defaults to None.
        description: one paragraph shown by `--help`. Defaults to "".
    """

    name: str
    models: Mapping[str, Callable]
    load_data: Callable
    defaults: config_lib.RecipeConfig
    preprocess: Optional[Callable] = None
    default_config: Optional[str] = None
    description: str = ""


def main(argv: Optional[Sequence[str]], recipe: Recipe) -> int:
    """Runs a recipe from command-line arguments.

    Args:
        argv: arguments without the program name; None reads `sys.argv[1:]`.
        recipe: the `Recipe`.

    Returns:
        The process exit code: 0 on success, 2 on bad input (one line printed to
        stderr, no traceback), 130 when interrupted with Ctrl-C (the checkpoint in
        the run directory lets the same command resume).
    """
    prog = PROG_PREFIX + recipe.name
    started = time.perf_counter()
    try:
        cfg = cli.parse_config(
            argv, recipe.defaults, prog, recipe.description, tuple(recipe.models), recipe.default_config
        )
        run(cfg, recipe, argv=list(sys.argv[1:] if argv is None else argv), started=started)
        return 0
    except ConfigError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        where = f"--run-dir {e.args[0]}" if e.args else "the same --run-dir"
        print(f"\n{prog}: interrupted. Rerun the same command with {where} to resume.", file=sys.stderr)
        return 130


def run(cfg: config_lib.RecipeConfig, recipe: Recipe, argv: Sequence[str] = (), started: Optional[float] = None) -> dict:
    """Trains, evaluates and reports one validated config.

    Args:
        cfg: the validated `RecipeConfig`.
        recipe: the `Recipe`.
        argv: the command line, recorded in `metrics.json`. Defaults to ().
        started: `time.perf_counter()` at program start, for the wall time.
            Defaults to now.

    Returns:
        The metrics dict also written to `<run_dir>/metrics.json` (test accuracy,
        loss, wall time in seconds, examples/sec, replicas, precision, versions, ...).

    Raises:
        ConfigError: (and subclasses) on bad input discovered while setting up.
    """
    started = time.perf_counter() if started is None else started
    from tftrain import rundir as rundir_lib
    from tftrain.runtime.cluster import MULTI_PROCESS_STRATEGIES, resolve_cluster

    if cfg.train.model not in recipe.models:
        raise ConfigError(
            f"Invalid model {cfg.train.model!r}. Expected one of: {', '.join(recipe.models)}. "
            f"Received: model={cfg.train.model!r}."
        )
    strategy_name = cfg.runtime.strategy
    cluster = resolve_cluster(strategy_name, ps_tasks=cfg.runtime.ps_tasks)
    parameter_server = strategy_name == "parameter_server"
    if parameter_server and cluster.task_type in ("worker", "ps"):
        from tftrain.runtime import serve

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server blocks in C++: stop at once
        serve(cluster, cfg.runtime.intra_op_threads, cfg.runtime.inter_op_threads)
        return {"served": cluster.task}
    if parameter_server and cfg.runtime.execution != "graph":
        raise ConfigError(
            f"execution={cfg.runtime.execution!r} is not available with parameter_server: the "
            "coordinator schedules tf.functions on the workers. Pass --execution graph."
        )
    is_chief = cluster is None or cluster.is_chief

    if cfg.run_dir is None:
        cfg = dataclasses.replace(cfg, run_dir=str(rundir_lib.default_run_dir(recipe.name)))
    run_dir = rundir_lib.check_run_dir(cfg.run_dir, cfg.to_dict())

    data = recipe.load_data(cfg.data.data_dir)

    # TensorFlow starts only after the cheap checks above.
    import keras

    from tftrain import reports, runtime
    from tftrain.data.pipeline import build_dataset, resolve_batch_size

    rt = runtime.setup(cfg.runtime, cluster=cluster)
    if cfg.seed is not None:
        keras.utils.set_random_seed(cfg.seed)
    batch = resolve_batch_size(cfg.data.batch_size, cfg.data.per_replica_batch_size, rt.num_replicas)

    x_train, y_train = data.x_train, data.y_train
    if cfg.data.train_examples is not None:
        x_train, y_train = x_train[: cfg.data.train_examples], y_train[: cfg.data.train_examples]
    steps_per_epoch = len(x_train) // batch.global_batch_size
    if steps_per_epoch < 1:
        raise ConfigError(
            f"Only {len(x_train)} training examples for a global batch of {batch.global_batch_size}: "
            "not one full step. Pass a larger --train-examples or a smaller batch size."
        )
    multi_process = strategy_name in MULTI_PROCESS_STRATEGIES
    if multi_process:
        # Every worker must run the same number of steps: keep whole global batches only, so
        # each worker's shard holds exactly steps_per_epoch of its per-worker batches.
        used = steps_per_epoch * batch.global_batch_size
        x_train, y_train = x_train[:used], y_train[:used]

    print(f"== {recipe.name}: effective configuration ==")
    print(config_lib.to_yaml(cfg).rstrip())
    print("== runtime ==")
    for line in rt.describe():
        print(line)
    print(
        f"batch:     global {batch.global_batch_size} = per-replica {batch.per_replica_batch_size} "
        f"x {batch.num_replicas} replica(s); {steps_per_epoch} steps/epoch on {len(x_train)} examples"
    )
    if parameter_server:
        print(
            f"note:      each step runs one global batch on one of {_training_workers(cluster)} worker(s), "
            f"asynchronously; variables live on {cluster.num_ps} ps task(s)"
        )
    if strategy_name == "mirrored" and rt.devices.kind == "cpu":
        print(
            f"note:      no GPU found, so MirroredStrategy runs on the CPU as {rt.num_replicas} "
            "replica(s)" + ("; pass --cpu-replicas N to split the CPU into N replicas" if rt.num_replicas == 1 else "")
        )
    if not is_chief:
        print(f"note:      {cluster.task} is not the chief: it writes to a temporary directory, removed at the end")
    sys.stdout.flush()

    def train_dataset(input_context=None):
        return build_dataset(
            (x_train, y_train), batch.global_batch_size, training=True, config=cfg.data,
            seed=cfg.seed, preprocess=recipe.preprocess, input_context=input_context,
        )

    test_ds = build_dataset(
        (data.x_test, data.y_test), batch.global_batch_size, training=False, config=cfg.data,
        preprocess=recipe.preprocess,
    )
    task = cluster.task if cluster is not None else "chief"
    with rundir_lib.task_run_dir(run_dir, config_lib.to_yaml(cfg), is_chief, task) as out_dir:
        print(f"run directory: {run_dir.path}" + ("" if is_chief else f" (the chief's; {task} writes to {out_dir.path})"))
        if run_dir.resumed_epochs:
            print(
                f"resuming: {run_dir.resumed_epochs}/{cfg.train.epochs} epochs done, "
                f"from the checkpoint in {run_dir.backup_dir}"
            )
        with rt.strategy.scope():
            model = runtime.ensure_float32_outputs(recipe.models[cfg.train.model](cfg))
            model.compile(
                optimizer=keras.optimizers.Adam(cfg.train.learning_rate),
                loss=keras.losses.SparseCategoricalCrossentropy(),
                metrics=None if parameter_server else [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
                **({} if parameter_server else rt.compile_options()),
            )
            train_metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")] if parameter_server else []
        loss_scaling = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        callbacks = [
            # double_checkpoint keeps the previous epoch's state in case a task dies mid-save.
            keras.callbacks.BackupAndRestore(str(out_dir.backup_dir), double_checkpoint=True),
            keras.callbacks.TensorBoard(str(out_dir.log_dir)),
        ]

        fit_start = time.perf_counter()
        try:
            history = _fit(model, cfg, rt, train_dataset, callbacks, steps_per_epoch, train_metrics, run_dir.resumed_epochs)
        except KeyboardInterrupt:
            raise KeyboardInterrupt(str(run_dir.path)) from None
        fit_time = time.perf_counter() - fit_start
        epochs_trained = len(history.epoch)

        if parameter_server:
            from tftrain import ps_training

            results = ps_training.evaluate(model, test_ds, [keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
            test_loss, test_accuracy = results["loss"], results["accuracy"]
        else:
            test_loss, test_accuracy = model.evaluate(test_ds, verbose=0)
        model.save(out_dir / rundir_lib.MODEL_FILE)

    examples = epochs_trained * steps_per_epoch * batch.global_batch_size
    metrics = {
        "recipe": recipe.name,
        "model": cfg.train.model,
        "test_accuracy": float(test_accuracy),
        "test_loss": float(test_loss),
        "test_examples": int(len(data.x_test)),
        "train_examples": int(len(x_train)),
        "epochs": cfg.train.epochs,
        "epochs_trained": epochs_trained,
        "resumed_from_epoch": run_dir.resumed_epochs,
        "steps_per_epoch": steps_per_epoch,
        "wall_time_s": time.perf_counter() - started,
        "fit_time_s": fit_time,
        "examples_per_sec": examples / fit_time if fit_time > 0 else None,
        "replicas": rt.num_replicas,
        "workers": _training_workers(cluster),
        "ps_tasks": cluster.num_ps if cluster is not None else 0,
        "cluster_source": cluster.source if cluster is not None else None,
        "global_batch_size": batch.global_batch_size,
        "per_replica_batch_size": batch.per_replica_batch_size,
        "strategy": cfg.runtime.strategy,
        "strategy_class": type(rt.strategy).__name__,
        "communication": cfg.runtime.communication if strategy_name == "multi_worker_mirrored" else None,
        "devices": list(rt.devices.devices),
        "device_kind": rt.devices.kind,
        "precision": rt.precision.policy,
        "compute_dtype": rt.precision.compute_dtype,
        "loss_scaling": loss_scaling,
        "execution": cfg.runtime.execution,
        "steps_per_execution": cfg.runtime.steps_per_execution,
        "threads": dataclasses.asdict(rt.threads),
        "history": {k: [float(v) for v in vals] for k, vals in history.history.items()},
        "seed": cfg.seed,
        "argv": [PROG_PREFIX.split()[0], "-m", f"tftrain.recipes.{recipe.name}", *argv],
        "versions": reports.versions(),
    }
    if is_chief:
        reports.write_metrics(run_dir.path, metrics)
        reports.write_report(run_dir.path, metrics, title=f"{recipe.name} ({cfg.train.model})")
    print(
        f"== result ==\ntest accuracy {test_accuracy:.4f}, test loss {test_loss:.4f}; "
        f"{metrics['examples_per_sec']:,.0f} examples/sec over {epochs_trained} epoch(s); "
        f"wall time {metrics['wall_time_s']:.1f} s"
    )
    if is_chief:
        print(f"run directory: {run_dir.path}")
        print(f"TensorBoard:   tensorboard --logdir {run_dir.log_dir}")
    metrics["run_dir"] = str(run_dir.path)
    return metrics


def _fit(model, cfg, rt, train_dataset, callbacks, steps_per_epoch, train_metrics, resumed_epochs):
    """Trains with `Model.fit`, or with the coordinator loop for `parameter_server`; returns the History."""
    strategy_name = cfg.runtime.strategy
    if strategy_name == "parameter_server":
        from tftrain import ps_training

        def per_worker_dataset(input_context):
            return train_dataset(input_context).repeat()

        return ps_training.fit(
            model, per_worker_dataset, epochs=cfg.train.epochs, steps_per_epoch=steps_per_epoch,
            metrics=train_metrics, callbacks=callbacks, initial_epoch=resumed_epochs,
            verbose=cfg.train.verbose, steps_per_execution=cfg.runtime.steps_per_execution,
        )
    # Multi-worker: each worker builds its own shard of the input (sharded at the source by
    # InputContext, auto-shard policy OFF), so the workers read disjoint examples.
    train_ds = (
        rt.strategy.distribute_datasets_from_function(train_dataset)
        if strategy_name == "multi_worker_mirrored" else train_dataset()
    )
    return model.fit(train_ds, epochs=cfg.train.epochs, callbacks=callbacks, verbose=cfg.train.verbose, shuffle=False)


def _training_workers(cluster) -> int:
    """Tasks that compute gradients: chief + workers (MultiWorkerMirrored), workers (ParameterServer)."""
    if cluster is None:
        return 1
    if cluster.num_ps:
        return len(cluster.cluster.get("worker", ()))
    return cluster.num_workers


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def run_module(recipe: Recipe) -> None:
    """`if __name__ == "__main__"` helper: runs `main` and exits with its code.

    SIGTERM (sent by `python -m tftrain.launch`, SLURM or Kubernetes to stop a
    task) exits with code 143 through Python's normal shutdown, so a worker's
    temporary directory is removed.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sys.exit(main(None, recipe))
