"""Training loops, each stating in one place what it supports and why it refuses the rest; the `Trainer` asks
`loop_for(strategy)` instead of branching on the strategy's name."""

from tftrain.train.loops.fit import FitLoop
from tftrain.train.loops.multi_worker import MultiWorkerLoop
from tftrain.train.loops.parameter_server import ParameterServerLoop

__all__ = ["FitLoop", "MultiWorkerLoop", "ParameterServerLoop", "loop_for"]


def loop_for(strategy: str) -> FitLoop:
    """The training loop for a strategy name (`RuntimeConfig.strategy`)."""
    if strategy == "multi_worker_mirrored":
        return MultiWorkerLoop()
    if strategy == "parameter_server":
        return ParameterServerLoop()
    return FitLoop()

