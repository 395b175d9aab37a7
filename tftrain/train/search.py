"""The trainer's searches before training: keras-tuner trials (`--tune`, scored on validation
data, never the test set) and the batch-size search (`--batch-size auto`)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Sequence, Tuple

from tftrain.errors import ConfigError, TuningFailed

AUTO_BATCH_MIN_STEPS = 10
"""`--batch-size auto` tries batches up to train_examples / this, so an epoch keeps this many steps."""

TUNE_BATCH_SIZES = (32, 64, 128, 256, 512)
"""Global batch sizes `--tune` chooses from (those that fit the data and replicas)."""

TUNE_LEARNING_RATES = (1e-4, 1e-2)
"""Learning-rate range `--tune` searches on a log scale when the task sets no rate;
with a rate r it searches [r / 10, r * 10]."""


def _learning_rate_range(config, task) -> tuple:
    rate = config.train.learning_rate or task.learning_rate
    return (rate / 10, rate * 10) if rate else TUNE_LEARNING_RATES


def _objective(config, compile_args: dict, validation_keys: Sequence[str] = ()):
    """The trials' objective: `--monitor` (in the direction `--keep-best` reads it, `--monitor-mode`); else
    `val_accuracy` where the validation logs have it (`validation_keys`, from the sanity pass; without them,
    where the task measures accuracy), else `val_loss`."""
    monitor = config.train.monitor
    if monitor:
        import keras_tuner as kt

        from tftrain.callbacks.keep_best import monitor_direction

        direction = monitor_direction(monitor, config.train.monitor_mode)
        return kt.Objective(monitor, direction) if direction else monitor
    if validation_keys:
        return "val_accuracy" if "val_accuracy" in validation_keys else "val_loss"
    names = [m if isinstance(m, str) else getattr(m, "name", "") for m in (compile_args.get("metrics") or ())]
    return "val_accuracy" if any(n in ("accuracy", "acc") for n in names) else "val_loss"


def check_objective(config, compile_args: dict, validation_keys: Sequence[str]) -> None:
    """Raises `ConfigError` when the trials' objective (`_objective`) is not among the validation logs' keys."""
    objective = _objective(config, compile_args, validation_keys)
    name = getattr(objective, "name", objective)
    if name not in validation_keys:
        raise ConfigError(f"--tune scores its trials by {name}, which this model's validation logs do not have "
                          f"(they have {', '.join(validation_keys)}). Pass --monitor KEY with one of them.")


def tune(task, config, runtime, compute_dtype: str, directory: Path, console, chief: bool,
         validation_keys: Sequence[str] = (), watch=None) -> Tuple[dict, dict]:
    """Runs `config`'s `--tune N` keras-tuner trials of the bound `task` over learning rate, batch size and
    `task.tune_space()` on `runtime`'s strategy, models built under `compute_dtype`; trials are kept in
    `directory` (`<run_dir>/tuning`), so a resumed run reuses finished ones; the `chief` logs them to HParams. A
    signal recorded by `watch` (a `PreemptionWatch`) ends the search at a batch's end (`Preempted`), its trial
    left to the resumed run.
    The objective is `--monitor`, else `val_accuracy` or `val_loss` (`_objective`, from `validation_keys`).

    Returns:
        `(figures for metrics.json, best values as flat config overrides)`.

    Raises:
        ConfigError: when the task has too few examples.
        TuningFailed: when no trial finished.
        Preempted: on a signal `watch` recorded.
    """
    import keras

    from tftrain.runtime import ensure_float32_outputs
    from tftrain.tuning.keras_tuner import TrainingHyperModel, make_tuner

    cfg, rt = config, runtime
    given, batch_sizes = _batch_sizes(cfg, rt.num_replicas, task.num_train_examples)

    trial = {}  # the trial being built and trained (keras-tuner builds, then fits, one trial at a time)

    def trial_task(**more):
        """The task bound to the trial's values of `task.tune_space()` (and `more`): every method sees them."""
        values = {**trial, **more}
        return task.bind(cfg.override(values)) if values else task

    build_errors = []

    def model_fn(values):
        trial.clear()
        trial.update(values or {})
        try:
            model = trial_task().build_model()
        except Exception as error:
            build_errors.append(error)
            raise
        plain = type(model) is keras.Sequential or type(model).__name__ == "Functional"  # as the run casts them
        return ensure_float32_outputs(model) if compute_dtype != "float32" and plain else model

    def compile_args(learning_rate):
        return trial_task(learning_rate=learning_rate, lr_schedule="constant").compile_args(None)

    objective = _objective(cfg, task.compile_args(None), validation_keys)
    # Each trial validates at its own global batch size; the validation data is present (Trainer.check_task).
    hypermodel = TrainingHyperModel(
        model_fn, lambda b: trial_task().train_data(b), lambda b: trial_task().validation_data(b),
        learning_rate=_learning_rate_range(cfg, task),
        choices=dict(task.tune_space()), batch_sizes=batch_sizes, compile_args=compile_args,
        compile_options=rt.compile_options(),
    )
    def tuner_of():
        return make_tuner(hypermodel, directory=directory, algorithm=cfg.train.tuner, max_trials=cfg.train.tune,
                          strategy=rt.strategy, seed=cfg.seed, max_epochs=cfg.train.epochs, objective=objective)

    tuner = _reloaded(tuner_of, directory, console, build_failed=lambda: bool(build_errors))
    over = ["learning rate", *(() if given else ("batch size",)), *task.tune_space()]
    console.section(f"tuning: {cfg.train.tune} {cfg.train.tuner} trial(s) over {', '.join(over)}"
                    + (f" at the given batch size {given}" if given else "")
                    + f" (objective {getattr(objective, 'name', objective)})")
    weights = {"class_weight": task.class_weight} if task.class_weight is not None else {}  # trials as the run
    from tftrain.callbacks.keep_best import quiet_retracing
    from tftrain.callbacks.scalar_logs import ScalarLogs
    from tftrain.train.console import keras_progress
    from tftrain.tuning.keras_tuner import StopSearch

    stop = [StopSearch(watch.requested)] if watch is not None else []
    with watch.polling(stop_after=False) if watch is not None else contextlib.nullcontext(), quiet_retracing():
        try:
            tuner.search(epochs=cfg.train.epochs, verbose=keras_progress(cfg.train.verbose)[0],  # no bar in a pipe
                         callbacks=[ScalarLogs(), *stop], **weights)  # ScalarLogs first: it names the objective
        except Exception:
            if watch is None or watch.requested() is None:
                raise
            raise watch.stop() from None
    return _tuning_figures(tuner, directory, cfg, console, chief)


def _batch_sizes(config, replicas: int, examples) -> tuple:
    """`(the config's global batch size or None, the batch sizes the trials choose from)`: the given one alone, else
    `TUNE_BATCH_SIZES` that split across `replicas` and fit `examples`; raises `ConfigError` when none fits."""
    data = config.data
    given = data.batch_size if isinstance(data.batch_size, int) else (
        data.per_replica_batch_size * replicas if data.per_replica_batch_size else None)
    sizes = [given] if given else [b for b in TUNE_BATCH_SIZES if b % replicas == 0 and (examples is None
                                                                                          or b <= examples)]
    if not sizes:
        raise ConfigError(f"--tune needs at least {TUNE_BATCH_SIZES[0]} training examples per trial; {examples} "
                          "remain. Pass a larger --train-examples.")
    return given, sizes


def check_tune_space(task, config) -> None:
    """Raises `ConfigError` (before the run directory) on a `tune_space()` choice with no values, or naming a field
    or holding a value the task's config refuses."""
    for name, values in dict(task.tune_space()).items():
        if not list(values):
            raise ConfigError(f"The task's tune_space() gives {name!r} no values: give it at least one.")
        for value in values:
            try:
                task.bind(config.override({name: value}))
            except ConfigError as error:
                raise ConfigError(f"The task's tune_space() {name}={value!r} does not fit its config: {error}") \
                    from None


def _reloaded(tuner_of, directory, console, build_failed=lambda: False):
    """`tuner_of()`, which reloads a resumed run's finished trials; when keras-tuner cannot read its files back (cut
    by a kill or a full disk, or lost: its oracle naming a trial file that is not there), said in one line, the
    folder removed and the tuner made anew; not when `build_failed()` (keras-tuner builds a model as it is made)."""
    import tensorflow as tf

    try:
        return tuner_of()
    except (ValueError, OSError, KeyError, TypeError, RuntimeError, tf.errors.NotFoundError) as e:
        if isinstance(e, RuntimeError) and "reloading `Oracle`" not in str(e):
            raise
        if isinstance(e, ConfigError) or build_failed() or not Path(directory).exists():
            raise
        import shutil

        from tftrain.errors import one_line

        console.warn(f"{directory} could not be read back ({one_line(e)}); its trials are run again")
        shutil.rmtree(directory)
        return tuner_of()


def _tuning_figures(tuner, directory, config, console, chief: bool) -> Tuple[dict, dict]:
    # A failed trial has no score (keras-tuner ranks it among the best when every trial failed).
    trials = [t for t in tuner.oracle.get_best_trials(config.train.tune) if t.score is not None]
    if not trials:
        raise TuningFailed("keras-tuner finished no trial; see its messages above.")
    values = {k: v for k, v in trials[0].hyperparameters.values.items()
              if not k.startswith("tuner/")}  # not Hyperband's bookkeeping
    best = {k: (float(v) if k == "learning_rate" else v) for k, v in values.items()}
    console.line(f"tuning:    best {tuner.oracle.objective.name} {trials[0].score:.4f} with {best}")
    figures = {
        "algorithm": config.train.tuner,
        "trials": len(tuner.oracle.trials),
        "objective": tuner.oracle.objective.name,
        "direction": tuner.oracle.objective.direction,
        "best_score": trials[0].score,
        "best": best,
        "directory": str(directory),
        "ranking": [{"trial_id": t.trial_id, "score": t.score, "hyperparameters": dict(t.hyperparameters.values)}
                    for t in trials],
    }
    if chief:
        _log_trials(directory, tuner.oracle.objective.name, trials)
    return figures, best


def _log_trials(directory, objective: str, trials) -> None:
    """Each scored trial as its own HParams session (`tuning/hparams/trial-<id>`)."""
    from tftrain.train import hparams_log

    for t in trials:
        values = {f"tune.{k}": v for k, v in t.hyperparameters.values.items() if not k.startswith("tuner/")}
        hparams_log.write_session(directory / "hparams" / f"trial-{t.trial_id}", f"trial {t.trial_id}", values,
                                  {objective: float(t.score)})


def search_batch_size(task, replicas: int, accumulation_steps: int, build_model, console) -> Tuple[dict, int]:
    """`--batch-size auto`: the global batch size with the best examples/sec for `build_model()`'s model on
    `task`'s data over `replicas`, at most one that leaves `AUTO_BATCH_MIN_STEPS` optimizer steps (of
    `accumulation_steps` micro-batches) an epoch; returns `(figures, batch size)`."""
    from tftrain.tuning.batch_size import find_batch_size

    n = task.num_train_examples
    per_epoch = AUTO_BATCH_MIN_STEPS * accumulation_steps  # micro-batches for that many optimizer steps
    max_val = None if n is None else max(replicas, n // per_epoch // replicas * replicas)
    init_val = 32 * replicas if max_val is None else min(32 * replicas, max_val)
    model = build_model()  # a constant rate while searching; rebuilt once the steps are known
    console.section(f"batch size search (objective: examples/sec, at most {max_val or 'no limit'})")
    search = find_batch_size(model, lambda b: task.train_data(b), objective="throughput", init_val=init_val,
                             max_val=max_val, verbose=1 if console.verbose else 0)
    return search.to_dict(), int(search.batch_size)
