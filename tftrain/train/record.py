"""The typed record of one run: what `metrics.json` holds and `Trainer.fit` returns."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional


@dataclasses.dataclass
class RunRecord:
    """What one run did and measured.

    Attributes:
        task: the task's name.
        run_dir: the run directory (str).
        test: test-set results `{"loss": ..., <metric>: ...}`, or None when the
            task has no test data. `metrics.json` also holds each as
            `test_<name>` (e.g. `test_loss`, `test_accuracy`).
        history: `History.history` of this process's epochs (`loss`, metrics,
            `val_*`), lists of floats per epoch.
        epochs: epochs asked for. epochs_trained: epochs trained in this process.
        resumed_from_epoch: epochs done before, restored from the checkpoint.
        train_examples: training examples per epoch (None if unknown).
        test_examples: test examples evaluated (None if unknown).
        steps_per_epoch: optimizer steps per epoch (None if unknown).
        global_batch_size, per_replica_batch_size: examples per batch (per
            micro-batch under gradient accumulation), all replicas together /
            each replica.
        gradient_accumulation_steps: micro-batches per optimizer step (1: none).
        effective_global_batch_size: examples per optimizer step:
            `global_batch_size` x `gradient_accumulation_steps`.
        wall_time_s: seconds from program start to the end of the run.
        fit_time_s: seconds inside the training loop.
        examples_per_sec: training examples per second over `fit_time_s`,
            every example of every micro-batch counted (None when the steps
            are unknown).
        execution: the mode trained in (`"graph"`, `"xla"`, `"eager"`);
            execution_requested: what was asked (`"auto"`, ...);
            execution_choice: `--execution auto`'s timings, or None.
        runtime: strategy, replicas, workers, devices, precision, threads,
            malloc and communication, as a dict.
        hparams: the task's hyperparameters (a dict), or None.
        extras: optional sections: `throughput`, `profile`, `tuning`,
            `batch_size_search`, `validation_examples`, `optimizer_steps`,
            `backup` (`--backup-every-steps`), `early_stopping`, `custom_step` (a model
            with its own `train_step` / `test_step`: whose figure `loss` is), ...
        seed, argv, versions, learning_rate, lr_schedule: as run.
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
        """The flat dict written to `metrics.json`: every field, `runtime`, `hparams` and
        `extras` merged in at the top, `test_<name>` per test result, and `recipe` (the
        task's name, the key MNIST runs have always written)."""
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
              "after_steps", "sanity")
"""Keys `RunRecord.extras` may hold."""
