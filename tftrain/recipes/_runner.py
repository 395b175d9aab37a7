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

AUTO_PROBE_BATCHES = 16
"""`--execution auto` times graph and XLA on the first this-many training batches."""

AUTO_PROBE_STEPS = 16
"""Optimizer steps timed per mode by `--execution auto` (after the compiling warm-up;
at least 2 executions)."""


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
        widths: model name -> widths `--tune` chooses from (`train.width`).
            Defaults to None (width not tuned).
        batch_sizes: model name -> global batch size used when the config sets
            neither `batch_size` nor `per_replica_batch_size` (the best batch
            size differs between models). Defaults to {} (128 per replica).
    """

    name: str
    models: Mapping[str, Callable]
    load_data: Callable
    defaults: config_lib.RecipeConfig
    preprocess: Optional[Callable] = None
    default_config: Optional[str] = None
    description: str = ""
    widths: Optional[Mapping[str, Sequence[int]]] = None
    batch_sizes: Mapping[str, int] = dataclasses.field(default_factory=dict)


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


def run(
    cfg: config_lib.RecipeConfig,
    recipe: Recipe,
    argv: Sequence[str] = (),
    started: Optional[float] = None,
    extra_callbacks: Sequence = (),
) -> dict:
    """Trains, evaluates and reports one validated config.

    Args:
        cfg: the validated `RecipeConfig`.
        recipe: the `Recipe`.
        argv: the command line, recorded in `metrics.json`. Defaults to ().
        started: `time.perf_counter()` at program start, for the wall time.
            Defaults to now.
        extra_callbacks: Keras callbacks added to the training `fit` after the
            recipe's own (e.g. a benchmark's time-to-accuracy probe). Defaults
            to ().

    Returns:
        The metrics dict also written to `<run_dir>/metrics.json` (test accuracy,
        loss, wall time in seconds, examples/sec, replicas, precision, execution
        mode and, for `auto`, both timings, versions, ...).

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
    _check_callback_flags(cfg, strategy_name in MULTI_PROCESS_STRATEGIES)
    cluster = resolve_cluster(strategy_name, ps_tasks=cfg.runtime.ps_tasks)
    parameter_server = strategy_name == "parameter_server"
    if parameter_server and cluster.task_type in ("worker", "ps"):
        from tftrain.runtime import serve

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server blocks in C++: stop at once
        serve(cluster, cfg.runtime.intra_op_threads, cfg.runtime.inter_op_threads)
        return {"served": cluster.task}
    if parameter_server and cfg.runtime.execution not in ("graph", "auto"):
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

    x_train, y_train = data.x_train, data.y_train
    if cfg.data.train_examples is not None:
        x_train, y_train = x_train[: cfg.data.train_examples], y_train[: cfg.data.train_examples]
    # --batch-size auto and --tune choose the batch size later, in the run directory.
    search_batch = cfg.data.batch_size == config_lib.AUTO_BATCH or bool(cfg.train.tune)
    multi_process = strategy_name in MULTI_PROCESS_STRATEGIES
    batch = steps_per_epoch = None
    if not search_batch:
        batch_size = cfg.data.batch_size
        if batch_size is None and cfg.data.per_replica_batch_size is None:
            batch_size = recipe.batch_sizes.get(cfg.train.model)  # the model's default; None: 128 per replica
        batch = resolve_batch_size(batch_size, cfg.data.per_replica_batch_size, rt.num_replicas)
        steps_per_epoch = _steps_per_epoch(len(x_train), batch.global_batch_size)
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
    if batch is not None:
        _print_batch(batch, steps_per_epoch, len(x_train))
        if cfg.train.profile_window is not None:  # refuse a window past the end before writing anything
            from tftrain.callbacks.profiler import check_window_fits

            check_window_fits(*cfg.train.profile_window, cfg.train.epochs * steps_per_epoch)
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

    data_cfg = dataclasses.replace(cfg.data, batch_size=None)  # options only; sizes are passed

    def make_train_ds(global_batch_size, input_context=None):
        return build_dataset(
            (x_train, y_train), global_batch_size, training=True, config=data_cfg,
            seed=cfg.seed, preprocess=recipe.preprocess, input_context=input_context,
        )

    def train_dataset(input_context=None):
        return make_train_ds(batch.global_batch_size, input_context)

    extra_metrics = {}
    train_cfg = cfg  # cfg with tuned / searched values filled in
    task = cluster.task if cluster is not None else "chief"
    with rundir_lib.task_run_dir(run_dir, config_lib.to_yaml(cfg), is_chief, task) as out_dir:
        print(f"run directory: {run_dir.path}" + ("" if is_chief else f" (the chief's; {task} writes to {out_dir.path})"))
        if run_dir.resumed_epochs:
            print(
                f"resuming: {run_dir.resumed_epochs}/{cfg.train.epochs} epochs done, "
                f"from the checkpoint in {run_dir.backup_dir}"
            )
        if cfg.train.tune:
            tuning = _tune(cfg, recipe, rt, x_train, y_train, out_dir, build_dataset)
            extra_metrics["tuning"] = tuning
            train_cfg = cfg.override(tuning["best"])
        def compile_model(model, steps_per_epoch):
            """Adam (cosine-decayed over the run when asked and the steps are known), loss, metrics."""
            learning_rate = train_cfg.train.learning_rate
            if train_cfg.train.lr_schedule == "cosine" and steps_per_epoch is not None:
                learning_rate = keras.optimizers.schedules.CosineDecay(
                    learning_rate, decay_steps=cfg.train.epochs * steps_per_epoch
                )
            with rt.strategy.scope():
                model.compile(
                    optimizer=keras.optimizers.Adam(learning_rate),
                    loss=keras.losses.SparseCategoricalCrossentropy(),
                    metrics=None if parameter_server else [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
                    **({} if parameter_server else rt.compile_options()),
                )

        with rt.strategy.scope():
            model = runtime.ensure_float32_outputs(recipe.models[train_cfg.train.model](train_cfg))
            train_metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")] if parameter_server else []
        compile_model(model, steps_per_epoch)  # searched batch sizes: constant rate until the search is done
        if cfg.data.batch_size == config_lib.AUTO_BATCH:
            from tftrain.tuning.batch_size import find_batch_size

            # At most a tenth of the examples per batch: at least 10 steps per epoch.
            max_val = max(rt.num_replicas, len(x_train) // AUTO_BATCH_MIN_STEPS // rt.num_replicas * rt.num_replicas)
            print(f"== batch size search (objective: examples/sec, at most {max_val}) ==")
            search = find_batch_size(
                model, make_train_ds, objective="throughput", init_val=min(32 * rt.num_replicas, max_val),
                max_val=max_val, verbose=1,
            )
            extra_metrics["batch_size_search"] = search.to_dict()
            train_cfg = train_cfg.override({"batch_size": search.batch_size})
        if batch is None:
            batch = resolve_batch_size(
                train_cfg.data.batch_size, train_cfg.data.per_replica_batch_size, rt.num_replicas
            )
            steps_per_epoch = _steps_per_epoch(len(x_train), batch.global_batch_size)
            _print_batch(batch, steps_per_epoch, len(x_train))
            if train_cfg.train.lr_schedule == "cosine":
                compile_model(model, steps_per_epoch)  # now the schedule knows the run's steps
        execution, choice = cfg.runtime.execution, None
        if execution == "auto":
            # The first training batches, uncached (a partly read cache would make tf.data warn).
            probe = min(len(x_train), batch.global_batch_size * AUTO_PROBE_BATCHES)
            execution, choice = _auto_execution(model, cfg, rt, build_dataset(
                (x_train[:probe], y_train[:probe]), batch.global_batch_size, training=True,
                config=dataclasses.replace(data_cfg, cache=False), seed=cfg.seed, preprocess=recipe.preprocess,
            ))
        test_ds = build_dataset(
            (data.x_test, data.y_test), batch.global_batch_size, training=False, config=data_cfg,
            preprocess=recipe.preprocess,
        )

        from tftrain.callbacks import ProfilerWindow, ThroughputMonitor

        profiler = monitor = None
        if cfg.train.profile_window is not None:
            from tftrain.callbacks.profiler import check_window_fits

            start, stop = cfg.train.profile_window
            check_window_fits(start, stop, cfg.train.epochs * steps_per_epoch)
            profiler = ProfilerWindow(out_dir.log_dir, start, stop)
        if not parameter_server:  # the coordinator loop has no per-step hooks to time
            monitor = ThroughputMonitor(
                batch.global_batch_size, log_dir=out_dir.log_dir,
                # The input check times this process's pipeline; a worker of a multi-worker job
                # reads only its shard, so it is skipped there.
                input_data=None if multi_process else train_dataset(),
            )
        loss_scaling = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        callbacks = [
            # double_checkpoint keeps the previous epoch's state in case a task dies mid-save.
            keras.callbacks.BackupAndRestore(str(out_dir.backup_dir), double_checkpoint=True),
            keras.callbacks.TensorBoard(str(out_dir.log_dir)),
        ] + [cb for cb in (monitor, profiler) if cb is not None] + list(extra_callbacks)

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
        extra_metrics["throughput"] = monitor.result() if monitor is not None else None
        if profiler is not None:
            extra_metrics["profile"] = {
                "window": list(cfg.train.profile_window),
                "captured": list(profiler.captured) if profiler.captured else None,
                "trace_files": [str(p.relative_to(out_dir.path)) for p in profiler.trace_files],
                "tensorboard": f"tensorboard --logdir {run_dir.log_dir}",
            }

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
        "execution": execution,
        "execution_requested": cfg.runtime.execution,
        "execution_choice": choice.to_dict() if choice is not None else None,
        "execution_auto": choice.describe() if choice is not None else None,
        "steps_per_execution": cfg.runtime.steps_per_execution if parameter_server else rt.steps_per_execution,
        "threads": dataclasses.asdict(rt.threads),
        "malloc": dataclasses.asdict(rt.malloc) if rt.malloc is not None else None,
        "history": {k: [float(v) for v in vals] for k, vals in history.history.items()},
        "seed": cfg.seed,
        "argv": [PROG_PREFIX.split()[0], "-m", f"tftrain.recipes.{recipe.name}", *argv],
        "versions": reports.versions(),
        "learning_rate": train_cfg.train.learning_rate,
        "lr_schedule": train_cfg.train.lr_schedule,
        "width": train_cfg.train.width,
        **extra_metrics,
    }
    if is_chief:
        reports.write_metrics(run_dir.path, metrics)
        reports.write_report(run_dir.path, metrics, title=f"{recipe.name} ({cfg.train.model})")
    print(
        f"== result ==\ntest accuracy {test_accuracy:.4f}, test loss {test_loss:.4f}; "
        f"{metrics['examples_per_sec']:,.0f} examples/sec over {epochs_trained} epoch(s); "
        f"wall time {metrics['wall_time_s']:.1f} s"
    )
    throughput = extra_metrics["throughput"]
    if throughput and throughput["step_time_median_s"] is not None:
        print(
            f"throughput: {throughput['examples_per_sec']:,.0f} examples/sec after warm-up; step time "
            f"median {throughput['step_time_median_s'] * 1e3:.2f} ms, p90 {throughput['step_time_p90_s'] * 1e3:.2f} ms"
        )
    if throughput and throughput["input"]:
        print(f"input:      {throughput['input']['verdict']}")
    if is_chief:
        print(f"run directory: {run_dir.path}")
        print(f"TensorBoard:   tensorboard --logdir {run_dir.log_dir}" + ("  (profile: Profile tab)" if profiler else ""))
    metrics["run_dir"] = str(run_dir.path)
    return metrics


_STRATEGY_CLASSES = {"multi_worker_mirrored": "MultiWorkerMirroredStrategy", "parameter_server": "ParameterServerStrategy"}


def _check_callback_flags(cfg, multi_process: bool) -> None:
    """Refuses --tune / --batch-size auto / --profile combinations that cannot work, before any work."""
    auto = cfg.data.batch_size == config_lib.AUTO_BATCH
    strategy = cfg.runtime.strategy
    if cfg.train.tune and auto:
        raise ConfigError(
            "--tune searches the batch size itself; drop --batch-size auto (or drop --tune to only search the batch size)."
        )
    if cfg.train.tune and multi_process:
        raise ConfigError(
            f"keras-tuner runs each trial on one worker; it cannot use {_STRATEGY_CLASSES[strategy]}. "
            "Tune with a single-worker strategy (--strategy mirrored, one_device or default), "
            "then train the best configuration multi-worker."
        )
    if auto and multi_process:
        raise ConfigError(
            f"--batch-size auto searches in one process; with --strategy {strategy} every worker would have to run "
            "the same trials in lockstep. Search on one machine (--batch-size auto --strategy mirrored), "
            "then pass the result with --batch-size N."
        )
    if cfg.train.profile is not None and strategy == "parameter_server":
        raise ConfigError(
            "--profile needs Model.fit's per-step hooks; parameter_server trains with a coordinator loop. "
            "Profile a single-worker run instead."
        )


def _auto_execution(model, cfg, rt, probe_dataset):
    """`--execution auto`: returns `(execution, ExecutionChoice or None)` and prints the choice.

    Times graph and XLA on `probe_dataset` (the run's first `AUTO_PROBE_BATCHES`
    training batches) with `choose_execution`, except where only graph is possible:
    parameter-server and multi-worker runs (every task must run the same program,
    and each would time its own steps) and several replicas (XLA cannot compile a
    cross-replica step).
    """
    from tftrain.runtime.execution import choose_execution

    strategy = cfg.runtime.strategy
    if strategy in ("parameter_server", "multi_worker_mirrored"):
        print(f"execution: auto -> graph ({strategy} runs do not time graph against XLA)")
        return "graph", None
    if rt.num_replicas > 1:
        print(f"execution: auto -> graph (XLA does not run across {rt.num_replicas} replicas)")
        return "graph", None
    choice = choose_execution(model, probe_dataset, steps=AUTO_PROBE_STEPS, min_timed_executions=2)
    print(f"execution: auto -> {choice.describe()}")
    sys.stdout.flush()
    return choice.execution, choice


def _steps_per_epoch(num_examples: int, global_batch_size: int) -> int:
    steps = num_examples // global_batch_size
    if steps < 1:
        raise ConfigError(
            f"Only {num_examples} training examples for a global batch of {global_batch_size}: "
            "not one full step. Pass a larger --train-examples or a smaller batch size."
        )
    return steps


def _print_batch(batch, steps_per_epoch: int, num_examples: int) -> None:
    print(
        f"batch:     global {batch.global_batch_size} = per-replica {batch.per_replica_batch_size} "
        f"x {batch.num_replicas} replica(s); {steps_per_epoch} steps/epoch on {num_examples} examples"
    )
    sys.stdout.flush()


AUTO_BATCH_MIN_STEPS = 10
"""`--batch-size auto` tries batches up to train_examples / this, so an epoch keeps this many steps."""

TUNE_BATCH_SIZES = (32, 64, 128, 256, 512)
"""Global batch sizes `--tune` chooses from (those that fit the data and replicas)."""

TUNE_LEARNING_RATES = (1e-4, 1e-2)
"""Adam learning-rate range `--tune` searches, on a log scale."""


def _tune(cfg, recipe, rt, x_train, y_train, out_dir, build_dataset) -> dict:
    """Runs `cfg.train.tune` keras-tuner trials; returns the figures and best values.

    Trials train on the first 90% of the training examples and are scored on
    the last 10% (never on the test set). keras-tuner keeps its trials under
    `<run_dir>/tuning`, so a resumed run reuses finished trials.
    """
    from tftrain import runtime
    from tftrain.tuning.keras_tuner import TrainingHyperModel, make_tuner

    replicas = rt.num_replicas
    n_val = max(replicas, len(x_train) // 10)
    x_fit, y_fit, x_val, y_val = x_train[:-n_val], y_train[:-n_val], x_train[-n_val:], y_train[-n_val:]
    batch_sizes = [b for b in TUNE_BATCH_SIZES if b % replicas == 0 and b <= len(x_fit)]
    if not batch_sizes:
        raise ConfigError(
            f"--tune needs at least {TUNE_BATCH_SIZES[0]} training examples per trial; "
            f"{len(x_fit)} remain after holding out {n_val} for validation. Pass a larger --train-examples."
        )
    data_cfg = dataclasses.replace(cfg.data, batch_size=None)

    def model_fn(width):
        c = cfg.override({"width": width}) if width else cfg
        return runtime.ensure_float32_outputs(recipe.models[cfg.train.model](c))

    def make_dataset(global_batch_size):
        return build_dataset((x_fit, y_fit), global_batch_size, training=True, config=data_cfg,
                             seed=cfg.seed, preprocess=recipe.preprocess)

    val_ds = build_dataset((x_val, y_val), max(batch_sizes), training=False, config=data_cfg,
                           preprocess=recipe.preprocess)
    hypermodel = TrainingHyperModel(
        model_fn, make_dataset, val_ds,
        learning_rate=TUNE_LEARNING_RATES,
        widths=(recipe.widths or {}).get(cfg.train.model),
        batch_sizes=batch_sizes,
        compile_options=rt.compile_options(),
    )
    directory = out_dir.path / "tuning"
    tuner = make_tuner(
        hypermodel, directory=directory, algorithm=cfg.train.tuner, max_trials=cfg.train.tune,
        strategy=rt.strategy, seed=cfg.seed, max_epochs=cfg.train.epochs,
    )
    print(f"== tuning: {cfg.train.tune} {cfg.train.tuner} trial(s) over learning rate, width, batch size ==")
    sys.stdout.flush()
    tuner.search(epochs=cfg.train.epochs, verbose=cfg.train.verbose)
    trials = tuner.oracle.get_best_trials(cfg.train.tune)
    if not trials:
        raise ConfigError("keras-tuner finished no trial; see its messages above.")
    best = trials[0].hyperparameters.values
    best_values = {"learning_rate": float(best["learning_rate"]), "batch_size": int(best["batch_size"])}
    if "width" in best:
        best_values["width"] = int(best["width"])
    print(f"tuning:    best {tuner.oracle.objective.name} {trials[0].score:.4f} with {best_values}")
    return {
        "algorithm": cfg.train.tuner,
        "trials": len(tuner.oracle.trials),
        "objective": tuner.oracle.objective.name,
        "best_score": trials[0].score,
        "best": best_values,
        "validation_examples": int(n_val),
        "directory": str(directory),
        "ranking": [
            {"trial_id": t.trial_id, "score": t.score, "hyperparameters": dict(t.hyperparameters.values)}
            for t in trials
        ],
    }


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
