"""tftrain: TensorFlow's performance machinery around any Keras model.

    task = tftrain.ArrayTask(build_model, x, y, x_test, y_test, loss="mse", optimizer="sgd")
    record = tftrain.Trainer(task, epochs=3, strategy="mirrored", cpu_replicas=2).fit()

Nothing here imports TensorFlow until you use it; the subpackages (`tftrain.runtime`, `.data`,
`.config`, `.callbacks`, `.tuning`) hold the pieces.
"""

__version__ = "0.1.0"

from tftrain.config import DataConfig, RecipeConfig, RuntimeConfig, TrainConfig, hparam
from tftrain.errors import (
    AlreadyFinished,
    BatchSizeSearchError,
    CheckpointSpaceError,
    ClusterConfigError,
    ConfigError,
    DataError,
    DeviceError,
    LaunchError,
    PrecisionError,
    Preempted,
    ProfileNotWritten,
    ProfilerError,
    RunDirError,
    TftrainError,
    TrainingDiverged,
    TuningError,
    TuningFailed,
    XlaCompileError,
)
from tftrain.train import (
    ArrayTask,
    DatasetTask,
    ImageFolderTask,
    Interrupted,
    RunRecord,
    TableTask,
    Task,
    TFRecordTask,
    Trainer,
)

__all__ = [
    "__version__",
    "AlreadyFinished",
    "ArrayTask",
    "BatchSizeSearchError",
    "CheckpointSpaceError",
    "ClusterConfigError",
    "ConfigError",
    "DataConfig",
    "DataError",
    "DatasetTask",
    "DeviceError",
    "hparam",
    "ImageFolderTask",
    "Interrupted",
    "LaunchError",
    "PrecisionError",
    "Preempted",
    "ProfileNotWritten",
    "ProfilerError",
    "RecipeConfig",
    "RunDirError",
    "RunRecord",
    "RuntimeConfig",
    "TableTask",
    "Task",
    "TFRecordTask",
    "TftrainError",
    "TrainConfig",
    "Trainer",
    "TrainingDiverged",
    "TuningError",
    "TuningFailed",
    "XlaCompileError",
]
