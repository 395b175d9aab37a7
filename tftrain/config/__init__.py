"""One validated configuration tree for a training run; imports no TensorFlow.

`RecipeConfig` holds the seed, run directory, `RuntimeConfig`, `DataConfig`, `TrainConfig` and the task's
hyperparameters (`task`, fields from `hparam`); each dataclass validates itself (`ConfigError`). A recipe file
(YAML) has one mapping per section (`runtime: {strategy: mirrored}`); flags override the file, which overrides the
recipe's defaults. Every name of `fields`, `sections` and `recipe` is importable here.
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
