"""Moved to `tftrain.train.tasks` (a base module and one module per adapter); re-exported here."""

from tftrain.train.tasks import *  # noqa: F401,F403
from tftrain.train.tasks.base import (  # noqa: F401 (names callers import from here)
    FunctionTask, Task, _call_builder, build_metrics, check_metrics, metric_class_name, with_shard_policy,
)
from tftrain.train.tasks.image_folder import _random_subset  # noqa: F401
