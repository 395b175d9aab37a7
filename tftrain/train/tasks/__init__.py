"""What a user supplies: a `Task` (model, compile arguments, data), and adapters, one a module.

A task says how to build the model (called inside the strategy's scope), how to
compile it, and how to read its training / validation / test data given the
global batch size (and, for multi-worker training, a `tf.distribute.InputContext`).
Everything else (runtime, run directory, batch plan, execution mode, callbacks,
the training loop, reports) is the `Trainer`'s. The shape follows TF Model
Garden's `official/core/base_task.py` (`build_model`, `build_inputs(params,
input_context)`), in Keras terms.

Adapters cover the common cases in a few lines:

* `ArrayTask`: NumPy arrays, or dicts of arrays for multi-input models;
* `DatasetTask`: functions returning the user's own `tf.data.Dataset`;
* `TFRecordTask`: TFRecord files and the user's parse function;
* `ImageFolderTask`: a folder of images with one sub-folder per class;
* `TableTask`: CSV or Parquet tables with label and feature columns.

Before calling any method, the `Trainer` binds the task to the run's config
(`Task.bind`): a shallow copy whose `config` is the run's `RecipeConfig` and
whose `hparams` holds the values of the task's own hyperparameters.
"""

from tftrain.train.tasks.arrays import ArrayTask
from tftrain.train.tasks.base import FunctionTask, Task, build_metrics, check_metrics, metric_class_name
from tftrain.train.tasks.datasets import DatasetTask
from tftrain.train.tasks.files import FileSplitTask
from tftrain.train.tasks.image_folder import ImageFolderTask
from tftrain.train.tasks.table import TableTask
from tftrain.train.tasks.tfrecord import TFRecordTask

__all__ = ["ArrayTask", "DatasetTask", "FileSplitTask", "FunctionTask", "ImageFolderTask", "TFRecordTask", "TableTask", "Task",
           "build_metrics", "check_metrics", "metric_class_name"]
