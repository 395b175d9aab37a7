"""What a user supplies: a `Task` builds the model and reads its data for a global batch size (and an
`InputContext` when multi-worker); the rest is the `Trainer`'s. Adapters, one a module. After TF Model Garden's
`official/core/base_task.py`."""

from tftrain.train.tasks.arrays import ArrayTask
from tftrain.train.tasks.base import FunctionTask, Task, build_metrics, check_metrics, metric_class_name
from tftrain.train.tasks.datasets import DatasetTask
from tftrain.train.tasks.files import FileSplitTask
from tftrain.train.tasks.image_folder import ImageFolderTask
from tftrain.train.tasks.table import TableTask
from tftrain.train.tasks.tfrecord import TFRecordTask

__all__ = ["ArrayTask", "DatasetTask", "FileSplitTask", "FunctionTask", "ImageFolderTask", "TFRecordTask", "TableTask", "Task",
           "build_metrics", "check_metrics", "metric_class_name"]
