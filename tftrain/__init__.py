"""tftrain: TensorFlow's performance machinery around any Keras model.

Import what you need; nothing here imports TensorFlow until you use it:

    from tftrain.runtime import setup, set_threads, configure_devices, set_precision, make_strategy
    from tftrain.data import load_mnist, build_dataset, resolve_batch_size
    from tftrain.config import RecipeConfig, RuntimeConfig, DataConfig, TrainConfig
    from tftrain.callbacks import ProfilerWindow, ThroughputMonitor, BatchSizeFinder
    from tftrain.tuning import find_batch_size, make_tuner, TrainingHyperModel
"""

__version__ = "0.1.0"

from tftrain.config import DataConfig, RecipeConfig, RuntimeConfig, TrainConfig
from tftrain.errors import (
    BatchSizeSearchError,
    ClusterConfigError,
    ConfigError,
    DataError,
    DeviceError,
    LaunchError,
    ProfilerError,
    RunDirError,
    TftrainError,
    TuningError,
)

__all__ = [
    "BatchSizeSearchError",
    "ClusterConfigError",
    "ConfigError",
    "DataConfig",
    "DataError",
    "DeviceError",
    "LaunchError",
    "ProfilerError",
    "RecipeConfig",
    "RunDirError",
    "RuntimeConfig",
    "TftrainError",
    "TrainConfig",
    "TuningError",
    "__version__",
]
