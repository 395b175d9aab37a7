"""A run's settings and final figures in TensorBoard's HParams dashboard.

Each run's chief writes one HParams session into its `logs/` folder (next to Keras's `train/` and
`validation/` scalars, which the dashboard offers as metrics too): the flat configuration, the
task's hyperparameters and what `auto` resolved to, then the final figures as scalars. So
`tensorboard --logdir runs/` compares every run under `runs/` in the HParams tab.

Source: https://www.tensorflow.org/tensorboard/hyperparameter_tuning_with_hparams
(`tensorboard.plugins.hparams.api`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Mapping, Optional

RESOLVED = ("execution", "precision", "steps_per_execution", "replicas", "global_batch_size")
"""What each run settled on (`run.<name>` in the dashboard), next to what was asked (`runtime.*`)."""


def _flat(prefix: str, value, out: dict) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            _flat(f"{prefix}.{key}" if prefix else str(key), item, out)
    elif isinstance(value, (bool, int, float, str)):
        out[prefix] = value
    elif value is not None:  # a list or tuple: one readable value
        out[prefix] = str(value)


def hparam_values(config, record) -> dict:
    """The run's settings as the dashboard's hyperparameters.

    Args:
        config: the run's `RecipeConfig`.
        record: its `RunRecord`.

    Returns:
        `{name: bool | int | float | str}`: every configuration field as `section.field`
        (`train.learning_rate`, `runtime.precision`; the task's hyperparameters as `task.<name>`),
        and `run.<name>` for what the run settled on (`RESOLVED`). Fields that are None are left out.
    """
    values: dict = {}
    _flat("", dataclasses.asdict(config), values)
    _flat("task", record.hparams or {}, values)
    settled = {"execution": record.execution, "global_batch_size": record.global_batch_size,
               **{k: record.runtime.get(k) for k in ("precision", "steps_per_execution", "replicas")}}
    _flat("run", {k: settled[k] for k in RESOLVED}, values)
    return values


def final_figures(record) -> dict:
    """The run's final figures as the dashboard's metrics: `test_<metric>` (the test set),
    `examples_per_sec`, `wall_time_s` (seconds) and `epochs_trained`; missing ones are left out."""
    figures = {f"test_{name}": value for name, value in (record.test or {}).items()}
    figures.update(examples_per_sec=record.examples_per_sec, wall_time_s=record.wall_time_s,
                   epochs_trained=record.resumed_from_epoch + record.epochs_trained)
    return {k: float(v) for k, v in figures.items() if isinstance(v, (int, float))}


def write_session(log_dir: Path, session: str, values: dict, figures: dict, step: Optional[int] = None) -> None:
    """Writes one HParams session into `log_dir`: `values` as its hyperparameters, `figures` as scalars.

    Args:
        log_dir: the session's TensorBoard folder (created if missing).
        session: its name in the dashboard (the trial id).
        values: `{name: bool | int | float | str}`.
        figures: `{tag: float}`.
        step: the scalars' step. Defaults to None (0).
    """
    import tensorflow as tf
    from tensorboard.plugins.hparams import api as hp

    writer = tf.summary.create_file_writer(str(log_dir))
    with writer.as_default():
        hp.hparams(values, trial_id=session)
        for tag, value in figures.items():
            tf.summary.scalar(tag, value, step=step or 0)
    writer.close()


def log_run(trainer, record) -> None:
    """The chief's HParams session of a finished run, in its `logs/` folder."""
    run_dir = trainer.run_dir.path
    write_session(trainer.run_dir.log_dir, run_dir.name, hparam_values(trainer.config, record),
                  final_figures(record), step=record.resumed_from_epoch + record.epochs_trained)
