"""The batch plan: global and per-replica batch size, micro-batches and steps per epoch
(`plan_batch`, a pure function), and the `Trainer`'s stages that make it (`BatchStages`)."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Optional

from tftrain import config as config_lib
from tftrain import rundir as rundir_lib
from tftrain.errors import ConfigError

if TYPE_CHECKING:  # tftrain.data.pipeline imports TensorFlow: only where a plan is made
    from tftrain.data.pipeline import BatchSize

BATCH_PLAN_FILE = "batch_plan.json"
"""In the run directory: the batch size a `--batch-size auto` search chose, kept for a resumed run."""


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """How a run batches its training examples.

    Attributes:
        batch: the global and per-replica batch size (`BatchSize`), examples per micro-batch.
        accumulation_steps: micro-batches per optimizer step, >= 1.
        steps_per_epoch: full optimizer steps per epoch; None when the number of examples is unknown.
        note: one line when the batch shrank to fit few examples, else None.
    """

    batch: BatchSize
    accumulation_steps: int
    steps_per_epoch: Optional[int]
    note: Optional[str] = None

    @property
    def effective_global_batch_size(self) -> int:
        """Examples per optimizer step: the global batch size x `accumulation_steps`."""
        return self.batch.global_batch_size * self.accumulation_steps


def plan_batch(batch_size: Optional[int], per_replica_batch_size: Optional[int], num_replicas: int,
               num_examples: Optional[int], accumulation_steps: int = 1) -> BatchPlan:
    """The batch plan for a global batch size, else a per-replica one (else 128 a replica).

    With fewer examples than one effective global batch, the global batch shrinks to one step of
    all of them (a multiple of the replicas), and `note` says so. Raises `ConfigError` on both sizes
    given, a bad size, a global batch the replicas do not divide, or fewer examples than one step.
    """
    from tftrain.data.pipeline import resolve_batch_size

    batch = resolve_batch_size(batch_size, per_replica_batch_size, num_replicas)
    plan = _with_steps(batch, accumulation_steps, num_examples)
    if plan.steps_per_epoch == 0:
        plan = _fit_to_few_examples(plan, num_examples)
    if plan.steps_per_epoch == 0:
        gb = plan.batch.global_batch_size
        asked = (f"an effective global batch of {plan.effective_global_batch_size} ({accumulation_steps} "
                 f"micro-batches of {gb})" if accumulation_steps > 1 else f"a global batch of {gb}")
        raise ConfigError(
            f"Only {num_examples} training examples for {asked}: not one full step. Pass a larger --train-examples "
            "or a smaller batch size" + (" or fewer --gradient-accumulation-steps." if accumulation_steps > 1 else "."))
    return plan


def _with_steps(batch: BatchSize, accumulation_steps: int, num_examples: Optional[int], note=None) -> BatchPlan:
    effective = batch.global_batch_size * accumulation_steps
    return BatchPlan(batch, accumulation_steps, None if num_examples is None else num_examples // effective, note)


def _fit_to_few_examples(plan: BatchPlan, n: int) -> BatchPlan:
    """One step of all `n` examples; `plan` unchanged when not one example per replica is left."""
    replicas, acc = plan.batch.num_replicas, plan.accumulation_steps
    global_batch = n // acc // replicas * replicas
    if global_batch < replicas:
        return plan
    step = f"{acc} micro-batches of {global_batch}" if acc > 1 else f"{global_batch} examples"
    from tftrain.data.pipeline import resolve_batch_size

    note = (f"Batch: {n} training examples are fewer than a global batch of {plan.batch.global_batch_size}; "
            f"each epoch is one step of {step}.")
    return _with_steps(resolve_batch_size(global_batch, None, replicas), acc, n, note)


class BatchStages:
    """`Trainer`'s stages that plan the batch; they set the frozen `batch_plan`."""

    def plan_fixed_batch(self, batch_size=None) -> None:
        """Plans a fixed batch, unless a search picks it later (`--batch-size auto`, `--tune`)."""
        data = self.config.data
        if batch_size is None and (data.batch_size == config_lib.AUTO_BATCH or self.config.train.tune):
            return
        if batch_size is None:
            batch_size = data.batch_size
            if batch_size is None and data.per_replica_batch_size is None:
                batch_size = self.task.default_batch_size
        per_replica = data.per_replica_batch_size if batch_size is None else None
        plan = plan_batch(batch_size, per_replica, self.runtime.num_replicas, self.task.num_train_examples,
                          self.accumulation_steps)
        self.batch_plan = plan
        if plan.note:
            self.console.line(plan.note)
        window = self.config.train.profile_window
        if window is not None and self.steps_per_epoch:  # refuse a window past the end before writing anything
            from tftrain.callbacks.profile_steps import check_window_fits

            check_window_fits(*window, self.config.train.epochs * self.steps_per_epoch)

    @property
    def batch(self) -> Optional["BatchSize"]:
        """The planned global and per-replica batch size; None before the plan (a search may make it later)."""
        return self.batch_plan.batch if self.batch_plan is not None else None

    @property
    def steps_per_epoch(self) -> Optional[int]:
        """Optimizer steps per epoch of the plan; None before it or when the examples are not counted."""
        return self.batch_plan.steps_per_epoch if self.batch_plan is not None else None

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step (`--gradient-accumulation-steps`)."""
        return self.config.train.gradient_accumulation_steps

    @property
    def effective_global_batch_size(self) -> int:
        """Examples per optimizer step: the global batch size x `accumulation_steps`."""
        return self.batch.global_batch_size * self.accumulation_steps

    def plan_batch(self) -> None:
        """The batch plan: fixed (already set), tuned (`--tune`) or searched (`--batch-size auto`); then
        `resolved`, made once: `config` with the run directory and what the search or the tuner chose."""
        decided = {}
        if self.config.train.tune:
            from tftrain.train.search import tune

            self.extras["tuning"], decided = tune(self.task, self.config, self.runtime,
                                                  self.precision.info.compute_dtype, self.out_dir.path / "tuning",
                                                  self.console, self.is_chief,
                                                  self.sanity.validation_keys if self.sanity else (),
                                                  self.preemption)
        elif self.batch is None:
            self.extras["batch_size_search"], batch_size = self._resumed_search() or self._searched()
            rundir_lib.write_text_atomic(self.out_dir / BATCH_PLAN_FILE, json.dumps(
                {"batch_size_search": self.extras["batch_size_search"], "batch_size": batch_size}), durable=True)
            decided = {"batch_size": batch_size}
        self.resolved = self.config.override({**decided, "run_dir": str(self.run_dir.path)})
        if self.config.train.tune:
            self.task = self.task.bind(self.resolved)
        if decided:
            self.plan_fixed_batch(decided["batch_size"])
            from tftrain.train.reporting import print_batch

            print_batch(self)

    def _searched(self):
        """`search_batch_size` under the policy in force; a model that does not train under the mixed policy
        `--precision auto` took falls back to float32 (one line) and is searched again."""
        from tftrain.train.search import search_batch_size

        return self.precision.or_float32(lambda: search_batch_size(
            self.task, self.runtime.num_replicas, self.accumulation_steps, self.build_model, self.console), "train")

    def _resumed_search(self):
        """`(search figures, batch size)` an interrupted run chose, or None: a resumed run keeps its batch, from
        `batch_plan.json`, else from its checkpoint's metadata; `ConfigError` when neither says it."""
        from tftrain.checkpoint_files import read_position

        path = self.out_dir / BATCH_PLAN_FILE
        if not self.run_dir.resumed:
            return None
        try:
            plan = json.loads(path.read_text(encoding="utf-8"))
            found = plan["batch_size_search"], int(plan["batch_size"])
            self.console.line(f"batch:     {found[1]}, as chosen by this run's search before it was interrupted")
            return found
        except (OSError, ValueError, TypeError, KeyError):
            position = read_position(self.run_dir.backup_dir)
        if position is None or not position.batch_size:
            raise ConfigError(f"{path} is missing or damaged, and the checkpoint in {self.run_dir.backup_dir} does "
                              "not record the batch size it trained at, so the run cannot resume at it. Train again "
                              "with a new --run-dir.")
        self.console.line(f"batch:     {position.batch_size}, as the checkpoint was trained at ({path.name} is "
                          "missing or damaged)")
        return None, int(position.batch_size)
