"""A run's settings and final figures in TensorBoard's HParams dashboard (one session per run, in its `logs/`), so
`tensorboard --logdir runs/` compares runs. https://www.tensorflow.org/tensorboard/hyperparameter_tuning_with_hparams"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Mapping, Optional

RESOLVED = ("execution", "precision", "steps_per_execution", "replicas", "global_batch_size")
"""What the run settled on (`run.<name>`), next to what was asked (`runtime.*`)."""


def _flat(prefix: str, value, out: dict) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            _flat(f"{prefix}.{key}" if prefix else str(key), item, out)
    elif isinstance(value, (bool, int, float, str)):
        out[prefix] = value
    elif value is not None:  # a list or tuple: one readable value
        out[prefix] = str(value)


def hparam_values(config, record) -> dict:
    """The dashboard's hyperparameters: the config's `{section.field: value}` (`task.<name>` for the task's) and
    `run.<name>` for `RESOLVED`; None fields left out."""
    values: dict = {}
    _flat("", dataclasses.asdict(config), values)
    _flat("task", record.hparams or {}, values)
    settled = {"execution": record.execution, "global_batch_size": record.global_batch_size,
               **{k: record.runtime.get(k) for k in ("precision", "steps_per_execution", "replicas")}}
    _flat("run", {k: settled[k] for k in RESOLVED}, values)
    return values


def final_figures(record) -> dict:
    """`test_<metric>`, `examples_per_sec`, `wall_time_s` and `epochs_trained`; missing ones left out."""
    figures = {f"test_{name}": value for name, value in (record.test or {}).items()}
    figures.update(examples_per_sec=record.examples_per_sec, wall_time_s=record.wall_time_s,
                   epochs_trained=record.resumed_from_epoch + record.epochs_trained)
    return {k: float(v) for k, v in figures.items() if isinstance(v, (int, float))}


def write_session(log_dir: Path, session: str, values: dict, figures: dict, step: Optional[int] = None) -> None:
    """Writes HParams session `session` into `log_dir` (created): `values` as hyperparameters, `figures` as
    scalars at `step` (default 0)."""
    import tensorflow as tf
    from tensorboard.plugins.hparams import api as hp

    writer = tf.summary.create_file_writer(str(log_dir))
    with writer.as_default():
        hp.hparams(values, trial_id=session)
        for tag, value in figures.items():
            tf.summary.scalar(tag, value, step=step or 0)
    writer.close()
