"""One validated configuration tree for a training run.

`RecipeConfig` holds the seed, the run directory, `RuntimeConfig`, `DataConfig`, `TrainConfig` and the
task's own hyperparameters (`task`, declared with `hparam`). Each dataclass validates itself when built;
bad values raise `tftrain.errors.ConfigError`. A recipe file (YAML) has one mapping per section
(`runtime: {strategy: mirrored}`); values merge as recipe defaults, then the file, then command-line
flags. Imports no TensorFlow. Submodules: `fields`, `sections`, `recipe`; every name is importable here.
"""

from __future__ import annotations

from tftrain.config.fields import (  # noqa: F401
    AUTO_BATCH, AUTO_STEPS_PER_EXECUTION, COMMUNICATIONS, DEVICES, EXECUTIONS, LR_SCHEDULES, MULTI_PROCESS_STRATEGIES,
    PRECISIONS, STRATEGIES, STRATEGY_ALIASES, THREAD_MODES, TUNERS, _expect_choice, _field, _field_kind,
    _validate_fields, hparam)
from tftrain.config.recipe import (  # noqa: F401
    SECTIONS, TASK_SECTION, RecipeConfig, check_hparams, deterministic_config, flat_field_index, from_yaml, load_yaml,
    merge, to_yaml)
from tftrain.config.sections import (  # noqa: F401
    DataConfig, RuntimeConfig, TrainConfig, check_batch_divides, parse_profile_window, xla_replicas_error)
