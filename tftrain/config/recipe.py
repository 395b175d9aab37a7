"""`RecipeConfig`, merging a recipe file and flags over defaults, and YAML in and out."""

from __future__ import annotations

import dataclasses
import os
import typing
from typing import Any, Mapping, Optional

import yaml

from tftrain.config.fields import AUTO_STEPS_PER_EXECUTION, _field, _field_kind, _validate_fields, type_hints
from tftrain.config.sections import DataConfig, RuntimeConfig, TrainConfig, check_batch_divides
from tftrain.errors import ConfigError


SECTIONS = {"runtime": RuntimeConfig, "data": DataConfig, "train": TrainConfig}

TASK_SECTION = "task"
"""The recipe-file section (and `RecipeConfig` field) holding the task's own hyperparameters."""


def check_hparams(hparams) -> None:
    """Validates a task's hyperparameters: a frozen dataclass of `hparam` fields, or None.

    Raises:
        ConfigError: a bad value, a dataclass not frozen, or a field named like a tftrain one (both would be flags).
    """
    if hparams is None:
        return
    if not dataclasses.is_dataclass(hparams) or isinstance(hparams, type):
        raise ConfigError(
            f"A task's hparams must be a dataclass instance (e.g. HParams()), or None. "
            f"Received: {type(hparams).__name__}."
        )
    if not type(hparams).__dataclass_params__.frozen:
        raise ConfigError(f"{type(hparams).__name__} must be a frozen dataclass: @dataclasses.dataclass(frozen=True).")
    clash = sorted({f.name for f in dataclasses.fields(hparams)} & set(_builtin_field_index()))
    if clash:
        raise ConfigError(
            f"Task hyperparameter {clash[0]!r} has the name of a tftrain field (flag --{clash[0].replace('_', '-')}). "
            "Rename it in the task's hparams dataclass."
        )
    hints = type_hints(type(hparams))
    for f in dataclasses.fields(hparams):
        if _field_kind(hints[f.name])[0] not in (int, float, str, bool):
            raise ConfigError(f"Task hyperparameter {f.name!r} is typed {hints[f.name]}; a flag sets an int, float, "
                              "str or bool (or an Optional of one). Declare it as str and parse it in the task "
                              "(e.g. '32,16').")
    _validate_fields(hparams)


@dataclasses.dataclass(frozen=True)
class RecipeConfig:
    """The whole configuration of one run.

    Attributes:
        seed: seeds Python, NumPy, TensorFlow and the shuffle order. Defaults to None (random).
        run_dir: config, logs, checkpoints, model and metrics. Defaults to None (`runs/<task name>-<timestamp>`).
        resume: without `run_dir`, resume the newest unfinished run of the same task and configuration under
            `runs/` (an error if none). Defaults to False.
        sanity_check: try each requested feature on the real model and data, then exit (no run dir). Defaults to False.
        deterministic: op determinism, a seed, no setting chosen by timing (`deterministic_config`). Defaults to False.
        task: the task's hyperparameters (frozen dataclass, section `task:`). Defaults to None.

    Raises:
        ConfigError: a wrong-type section, an invalid value, or a fixed `batch_size` not dividing over `cpu_replicas`.
    """

    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    seed: Optional[int] = _field(None, "random seed (repeatable runs)", minimum=0)
    run_dir: Optional[str] = _field(None, "run directory (None: runs/<task>-<time>)")
    resume: bool = _field(False, "resume the newest unfinished run of this task and settings under runs/")
    sanity_check: bool = _field(False, "only check every feature this run asks for on the real model and data, "
                                       "in seconds, then exit (writes no run directory)")
    deterministic: bool = _field(False, "repeatable figures: op determinism, a seed, no setting chosen by timing")
    task: Any = None

    def __post_init__(self):
        for name, cls in SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(f"{name} must be a {cls.__name__}.")
        check_hparams(self.task)
        for f in _top_level_fields():
            value = getattr(self, f.name)
            if value is None:
                continue
            kind, _ = _field_kind(typing.get_type_hints(RecipeConfig)[f.name])
            if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
                raise ConfigError(
                    f"{f.name} must be of type {kind.__name__}. Received: {f.name}={value!r}."
                )
            minimum = f.metadata.get("minimum")
            if minimum is not None and value < minimum:
                raise ConfigError(f"{f.name} must be >= {minimum}. Received: {f.name}={value!r}.")
        runtime, batch_size = self.runtime, self.data.batch_size
        if runtime.cpu_replicas > 1 and isinstance(batch_size, int) and not self.train.tune:
            check_batch_divides(batch_size, runtime.cpu_replicas)  # before TensorFlow starts

    def to_dict(self) -> dict:
        """The config as nested plain dicts in the recipe-file layout (`task` only when set)."""
        out = dataclasses.asdict(self)
        if self.task is None:
            out.pop(TASK_SECTION)
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "config", task=None) -> "RecipeConfig":
        """Builds a validated config from nested dicts in the recipe-file layout.

        Args:
            values: optional keys `runtime`, `data`, `train`, `task`, and top-level fields.
            source: named in error messages. Defaults to `"config"`.
            task: the task's default hyperparameters. Defaults to None.

        Raises:
            ConfigError: an unknown key, a wrong type or an invalid value.
        """
        return merge(cls(task=task), values, source)

    def override(self, flat: Mapping[str, Any]) -> "RecipeConfig":
        """A copy with flat `{field_name: value}` pairs laid over it; names are unique across sections
        (`{"strategy": "mirrored"}` sets `runtime.strategy`). Setting one batch size clears the other.

        Raises:
            ConfigError: an unknown field name or an invalid value.
        """
        return merge(self, _flat_over_nested({}, flat, self), "overrides")


def _top_level_fields():
    return [f for f in dataclasses.fields(RecipeConfig) if f.name not in SECTIONS and f.name != TASK_SECTION]


def _builtin_field_index() -> dict:
    index = {f.name: None for f in _top_level_fields()}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            index[f.name] = section
    return index


def flat_field_index(config: Optional[RecipeConfig] = None) -> dict:
    """Maps every field name to its section (None for top-level; `"task"` for `config`'s hparams)."""
    index = _builtin_field_index()
    if config is not None and config.task is not None:
        index.update({f.name: TASK_SECTION for f in dataclasses.fields(config.task)})
    return index


_BATCH_FIELDS = ("batch_size", "per_replica_batch_size")


def _merge_section(name: str, cls, current: dict, given, source: str):
    """`cls(**current)` with the mapping `given` laid over it; errors name the bad key."""
    given = given or {}
    if not isinstance(given, Mapping):
        raise ConfigError(f"Section {name!r} in {source} must be a mapping. Received: {given!r}.")
    names = [f.name for f in dataclasses.fields(cls)]
    bad = [k for k in given if k not in names]
    if bad:
        raise ConfigError(
            f"Unknown key '{name}.{bad[0]}' in {source}. Expected one of: {', '.join(names)}."
        )
    if name == "data" and any(k in given for k in _BATCH_FIELDS):
        for k in _BATCH_FIELDS:
            current[k] = None
    current.update(given)
    try:
        return cls(**current)
    except TypeError as e:  # a task's own dataclass rejecting a value in its __init__
        raise ConfigError(f"Section {name!r} in {source}: {e}.") from None


def _merge_task(base: RecipeConfig, given, source: str):
    if given is None:
        return base.task
    if base.task is None:
        raise ConfigError(
            f"{source} has a '{TASK_SECTION}' section, but this task declares no hyperparameters. Remove the section."
        )
    return _merge_section(TASK_SECTION, type(base.task), dataclasses.asdict(base.task), given, source)


def merge(base: RecipeConfig, values: Mapping[str, Any], source: str) -> RecipeConfig:
    """`base` with the nested `values` laid over it. Setting one batch size clears the other from `base`, so a flag
    replaces a file's batch size instead of clashing with it.

    Raises:
        ConfigError: an unknown section or key, naming `source`.
    """
    if values is None:
        return base
    if not isinstance(values, Mapping):
        raise ConfigError(
            f"{source} must hold a mapping of sections (runtime, data, train, task). "
            f"Received: {type(values).__name__}."
        )
    top_names = [f.name for f in _top_level_fields()]
    allowed = list(SECTIONS) + [TASK_SECTION] + top_names
    unknown = [k for k in values if k not in allowed]
    if unknown:
        raise ConfigError(
            f"Unknown key {unknown[0]!r} in {source}. Expected one of: {', '.join(allowed)}."
        )
    sections = {
        name: _merge_section(name, cls, dataclasses.asdict(getattr(base, name)), values.get(name), source)
        for name, cls in SECTIONS.items()
    }
    task = _merge_task(base, values.get(TASK_SECTION), source)
    top = {k: values[k] if k in values else getattr(base, k) for k in top_names}
    return RecipeConfig(**sections, **top, task=task)


def load_yaml(path: str | os.PathLike) -> dict:
    """Reads a recipe file into nested dicts (not validated).

    Raises:
        ConfigError: the file is missing, a directory, unreadable, not UTF-8, or not YAML.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ConfigError(f"Recipe file {path!r} is a directory. Pass --config with a YAML file.")
    if not os.path.isfile(path):
        raise ConfigError(f"Recipe file {path!r} does not exist. Pass --config with an existing YAML file.")
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"Recipe file {path!r} is not UTF-8 text (byte {e.start} cannot be decoded). Save it as UTF-8."
        ) from None
    except OSError as e:
        raise ConfigError(f"Recipe file {path!r} cannot be read: {e.strerror}. Check its permissions.") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"Recipe file {path!r} is not valid YAML{where}: {getattr(e, 'problem', e)}.") from None


def from_yaml(path: str | os.PathLike, base: Optional[RecipeConfig] = None,
              overrides: Optional[Mapping[str, Any]] = None) -> RecipeConfig:
    """Loads a recipe file over `base` (default `RecipeConfig()`), then flat `overrides`, validated as one layer (a
    file's `cpu_replicas: 2` with `strategy="mirrored"` overridden is valid).

    Raises:
        ConfigError: the file is missing, not YAML or holds bad values, or an override names an unknown field.
    """
    base = base or RecipeConfig()
    values = _flat_over_nested(load_yaml(path), overrides or {}, base)
    return merge(base, values, os.fspath(path))


def _flat_over_nested(values, flat: Mapping[str, Any], base: RecipeConfig):
    """Nested `values` with flat pairs laid over them; a batch size in `flat` drops both from the file."""
    if not isinstance(values, dict):
        return values
    out = {key: dict(value) if isinstance(value, dict) else value for key, value in values.items()}
    if any(key in flat for key in _BATCH_FIELDS) and isinstance(out.get("data"), dict):
        for name in _BATCH_FIELDS:  # the file's only: both given in `flat` still clash
            out["data"].pop(name, None)
    index = flat_field_index(base)
    for key, value in flat.items():
        if key not in index:
            raise ConfigError(f"Unknown config field {key!r}. Expected one of: {', '.join(sorted(index))}.")
        section = index[key]
        if section is None:
            out[key] = value
            continue
        if out.get(section) is None:  # absent, or an empty `data:` line
            out[section] = {}
        if not isinstance(out[section], dict):
            return out  # merge names the section that is not a mapping
        out[section][key] = value
    return out


def to_yaml(config: RecipeConfig) -> str:
    """The config as YAML in the recipe-file layout (readable by `from_yaml`)."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False)


def deterministic_config(config: "RecipeConfig") -> "RecipeConfig":
    """`config` as `--deterministic` runs it (else unchanged): a seed (0 if none), `execution` `auto` -> `graph`,
    `steps_per_execution` `auto` -> `AUTO_STEPS_PER_EXECUTION`.
    Source: https://www.tensorflow.org/api_docs/python/tf/config/experimental/enable_op_determinism"""
    if not config.deterministic:
        return config
    runtime = config.runtime
    runtime = dataclasses.replace(
        runtime, execution="graph" if runtime.execution == "auto" else runtime.execution,
        steps_per_execution=AUTO_STEPS_PER_EXECUTION if runtime.steps_per_execution == "auto"
        else runtime.steps_per_execution)
    return dataclasses.replace(config, runtime=runtime, seed=0 if config.seed is None else config.seed)
