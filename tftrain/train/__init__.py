"""The training layer: `Task`, its adapters, the `Trainer`, its loops and run record; above
runtime / data / callbacks / tuning, below the recipes and `tftrain.run`."""

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
