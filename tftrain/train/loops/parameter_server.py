"""`ParameterServerLoop`: the coordinator loop of a `parameter_server` job."""

from __future__ import annotations

import dataclasses
from typing import Optional

from tftrain.train.loops.fit import FitLoop


def _backup_every(callbacks) -> Optional[int]:
    """The `StepBackup`'s steps between checkpoints (None: epoch ends only)."""
    from tftrain.callbacks.backup import StepBackup

    return next((c.every_steps for c in callbacks if isinstance(c, StepBackup) and c.every_steps), None)


@dataclasses.dataclass(frozen=True)
class ParameterServerLoop(FitLoop):
    """The coordinator loop of a `parameter_server` job (`ps_training`): steps run asynchronously on the workers,
    so no per-step hooks, no in-process search, graph mode only; the chief validates at each epoch's end."""

    name: str = "the parameter-server coordinator loop"
    per_step_hooks: bool = False
    times_execution: bool = False
    in_process_search: bool = False
    checks_input: bool = False
    needs_steps_per_epoch: bool = True
    executions: tuple = ("auto", "graph")
    accumulates: bool = False
    no_search_reason: str = ("its workers run steps asynchronously under the chief's coordinator, and keras-tuner "
                             "and the batch-size search time trials in one process")
    weighs_classes: bool = True  # on each worker's dataset; the step weighs the loss

    def serves(self, cluster) -> bool:
        """Worker and ps tasks serve; the chief (coordinator) trains."""
        return cluster is not None and cluster.task_type in ("worker", "ps")

    def job(self, cluster):
        """On the chief: tells every worker and ps task at the end whether the run failed (their exit code)."""
        from tftrain.runtime.server import telling_servers

        return telling_servers(cluster)

    def compile(self, model, compile_args: dict, runtime) -> None:
        """Compiles in the strategy's scope, so the optimizer's and metrics' variables live on the parameter
        servers."""
        with runtime.strategy.scope():
            model.compile(**compile_args)

    def fit(self, model, train_data, *, epochs, steps_per_epoch, callbacks, verbose, validation_data=None,
            runtime=None, say=print, class_weight=None):
        """`ps_training.fit` on per-worker datasets (see `FitLoop.fit`); `class_weight` weighs the loss and the
        weighted metrics, as `Model.fit`. Under `--backup-every-steps N` the coordinator joins every N steps for the
        backup."""
        from tftrain.train.loops import ps_training
        from tftrain.train.loops.multi_worker import class_weighted

        weigh = class_weighted(class_weight)
        return ps_training.fit(
            model, lambda ctx: weigh(train_data(ctx)).repeat(), epochs=epochs, steps_per_epoch=steps_per_epoch,
            callbacks=callbacks, verbose=verbose, steps_per_execution=runtime.requested_steps_per_execution,
            sync_every=_backup_every(callbacks), validation_data=validation_data,
        )

    def evaluate(self, model, dataset) -> dict:
        """`ps_training.evaluate` on the chief (every example exactly once)."""
        from tftrain.train.loops import ps_training

        return ps_training.evaluate(model, dataset)
