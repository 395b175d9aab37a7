"""Training loops, each saying in one place what it supports and why it refuses what it refuses.

A strategy changes what a run can do: `Model.fit` under a single-process
strategy (`FitLoop`) has per-step hooks, can time graph against XLA and can
search in process; a multi-worker job (`MultiWorkerLoop`) must run the same
steps in every task, in lockstep, so one task cannot search or time modes
alone; the parameter-server loop (`ParameterServerLoop`, `ClusterCoordinator`)
runs asynchronous steps on its workers, has no per-step hooks and runs only
`tf.function`s. The `Trainer` asks the loop (`loop_for(strategy)`) instead of
branching on the strategy's name.
"""

from tftrain.train.loops.fit import FitLoop
from tftrain.train.loops.multi_worker import MultiWorkerLoop
from tftrain.train.loops.parameter_server import ParameterServerLoop, metric_objects

__all__ = ["FitLoop", "MultiWorkerLoop", "ParameterServerLoop", "loop_for", "metric_objects"]


def loop_for(strategy: str) -> FitLoop:
    """The training loop for a strategy name (`RuntimeConfig.strategy`)."""
    if strategy == "multi_worker_mirrored":
        return MultiWorkerLoop()
    if strategy == "parameter_server":
        return ParameterServerLoop()
    return FitLoop()

