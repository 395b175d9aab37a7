"""The typed record of one run: what `metrics.json` holds and `Trainer.fit` returns."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

from tftrain.errors import ConfigError


@dataclasses.dataclass
class RunRecord:
    """What one run did and measured (`metrics.json`).

    Attributes:
        test: test-set results `{"loss": ..., <metric>: ...}` (`test_<name>` in `metrics.json`),
            or None without test data.
        history: `History.history` per epoch (`loss`, metrics, `val_*`).
        epochs_trained: epochs trained in this process; resumed_from_epoch: epochs restored.
        steps_per_epoch: optimizer steps per epoch (None if unknown).
        global_batch_size, per_replica_batch_size: examples per (micro-)batch.
        effective_global_batch_size: examples per optimizer step.
        wall_time_s, fit_time_s: seconds from program start, and inside the training loop.
        examples_per_sec: over `fit_time_s`, every micro-batch counted (None if unknown).
        execution: the mode trained in (`"graph"`, `"xla"`, `"eager"`); execution_choice:
            `--execution auto`'s timings, or None.
        runtime: strategy, replicas, devices, precision, threads, ... (`RUNTIME_KEYS`).
        extras: optional sections (`EXTRA_KEYS`).
    """

    task: str
    run_dir: str
    test: Optional[Dict[str, float]]
    history: Dict[str, List[float]]
    epochs: int
    epochs_trained: int
    resumed_from_epoch: int
    train_examples: Optional[int]
    test_examples: Optional[int]
    steps_per_epoch: Optional[int]
    global_batch_size: int
    per_replica_batch_size: int
    wall_time_s: float
    fit_time_s: float
    examples_per_sec: Optional[float]
    execution: str
    execution_requested: str
    execution_choice: Optional[dict]
    runtime: Dict[str, Any]
    hparams: Optional[Dict[str, Any]]
    seed: Optional[int]
    argv: List[str]
    versions: Dict[str, Optional[str]]
    learning_rate: Optional[float]
    lr_schedule: str
    extras: Dict[str, Any] = dataclasses.field(default_factory=dict)
    gradient_accumulation_steps: int = 1
    effective_global_batch_size: Optional[int] = None

    def to_dict(self) -> dict:
        """The flat dict of `metrics.json`: `runtime`, `hparams` and `extras` merged in at the top,
        `test_<name>` per test result, and `recipe` (the task's name, an older key)."""
        out = dataclasses.asdict(self)
        for key in ("runtime", "extras"):
            out.update(out.pop(key))
        for name, value in (self.test or {}).items():
            out[f"test_{name}"] = value
        out.update(self.hparams or {})  # names never clash: see reserved_keys
        out["recipe"] = self.task
        return out

    @staticmethod
    def reserved_keys() -> frozenset:
        """Top-level `metrics.json` keys a task hyperparameter may not take (checked by the Trainer)."""
        return frozenset({f.name for f in dataclasses.fields(RunRecord)} | set(RUNTIME_KEYS) | set(EXTRA_KEYS)
                         | {"recipe"})


RUNTIME_KEYS = ("replicas", "workers", "ps_tasks", "cluster_source", "strategy", "strategy_class", "communication",
                "devices", "device_kind", "precision", "compute_dtype", "loss_scaling", "steps_per_execution",
                "threads", "malloc")
"""Keys of `RunRecord.runtime`."""

EXTRA_KEYS = ("throughput", "profile", "tuning", "batch_size_search", "execution_auto", "precision_auto",
              "optimizer_steps", "backup", "early_stopping", "custom_step", "keep_best", "init_from", "export",
              "after_steps", "sanity", "evaluation")
"""Keys `RunRecord.extras` may hold."""


def check_hparam_names(hparams) -> None:
    """Refuses task hyperparameters named like a key of `metrics.json` (`RunRecord.reserved_keys`)."""
    names = {f.name for f in dataclasses.fields(hparams)} if hparams is not None else set()
    clash = sorted(n for n in names if n in RunRecord.reserved_keys() or n == "test_loss")
    if clash:
        raise ConfigError(f"Task hyperparameter {clash[0]!r} has the name of a metrics.json key. Rename it in the "
                          "task's hparams dataclass.")
