"""One validated configuration tree for a training run.

The tree is four frozen dataclasses: `RuntimeConfig` (threads, devices, precision,
execution, strategy), `DataConfig` (input pipeline, batch size, validation split),
`TrainConfig` (epochs, learning rate, callbacks, search) and `RecipeConfig`, which
holds the other three plus the seed, the run directory and the task's own
hyperparameters (`task`: a frozen dataclass the task declares; its fields are
declared with `hparam`). Each dataclass validates itself when it is built, so a
config that exists is a valid one; bad values raise `tftrain.errors.ConfigError` with
a one-line message naming the value and the fix.

A recipe file (YAML) has one mapping per section, with the field names as keys:

```yaml
seed: 0
run_dir: null
runtime: {strategy: mirrored, precision: auto, execution: graph}
data: {batch_size: 128}
train: {epochs: 10}
task: {model: mlp}       # the task's own hyperparameters (here MNIST's)
```

Values are merged in this order, later ones winning: the recipe's defaults, the
recipe file, then command-line flags (see `tftrain.cli`). This module imports no
TensorFlow, so it is cheap to import and test.

The package: `fields` (the lists of valid values, `hparam`, validation), `sections` (`RuntimeConfig`,
`DataConfig`, `TrainConfig`), `recipe` (`RecipeConfig`, merging, YAML); every name is importable from
`tftrain.config`.
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
