"""The training layer: `Task` (what the user supplies), its adapters, the `Trainer`,
its loops and its run record. It sits above runtime / data / callbacks / tuning and
below the recipes and the command line (`tftrain.run`)."""

from tftrain.train.loops import FitLoop, MultiWorkerLoop, ParameterServerLoop, loop_for
from tftrain.train.record import RunRecord
from tftrain.train.tasks import ArrayTask, DatasetTask, ImageFolderTask, TableTask, Task, TFRecordTask
from tftrain.train.trainer import Interrupted, Trainer

__all__ = [
    "ArrayTask",
    "DatasetTask",
    "FitLoop",
    "ImageFolderTask",
    "TableTask",
    "Interrupted",
    "MultiWorkerLoop",
    "ParameterServerLoop",
    "RunRecord",
    "TFRecordTask",
    "Task",
    "Trainer",
    "loop_for",
]
