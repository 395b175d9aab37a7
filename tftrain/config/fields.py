"""The config's lists of valid values, `hparam` (a field with help, choices and bounds) and field validation."""

from __future__ import annotations

import dataclasses
import typing

from tftrain.errors import ConfigError

STRATEGIES = ("default", "one_device", "mirrored", "multi_worker_mirrored", "parameter_server")
"""Strategy names accepted by `RuntimeConfig.strategy`."""

STRATEGY_ALIASES = {"multi_worker": "multi_worker_mirrored", "ps": "parameter_server"}
"""Alternative spelling -> canonical strategy name."""

MULTI_PROCESS_STRATEGIES = ("multi_worker_mirrored", "parameter_server")
"""Strategies whose processes form a cluster (TF_CONFIG or SLURM)."""

DEVICES = ("auto", "cpu", "gpu")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
THREAD_MODES = ("auto", "default")
"""`RuntimeConfig.threads`: the doctor's measured counts if any, or TensorFlow's defaults."""

EXECUTIONS = ("auto", "eager", "graph", "xla")
COMMUNICATIONS = ("auto", "ring", "nccl")
TUNERS = ("random", "hyperband", "bayesian")
AUTO_BATCH = "auto"
"""`batch_size: auto` searches the global batch size (`tftrain.tuning.find_batch_size`)."""
LR_SCHEDULES = ("constant", "cosine")

AUTO_STEPS_PER_EXECUTION = 8
"""`steps_per_execution: auto` starts at 8; `Trainer.choose_execution` may time 32 and 64."""


def hparam(default, help: str = "", choices=None, minimum=None, special=(), metavar=None):
    """A dataclass field for a task hyperparameter: a flag (`width` -> `--width`) and a `task:` key.

    Args:
        default: int, float, str, bool or None.
        help: one line for `--help`. Defaults to "".
        choices: the allowed values. Defaults to None (any).
        minimum: the smallest allowed number. Defaults to None.
        special: strings accepted besides the field's type (e.g. `"auto"`). Defaults to ().
        metavar: the value's name in `--help`. Defaults to None (`N`, `F`, else the name's last word).

    Example:
        >>> width: int = hparam(64, "hidden units", minimum=1)
    """
    metadata = {"help": help, "choices": choices, "minimum": minimum, "special": tuple(special), "metavar": metavar}
    return dataclasses.field(default=default, metadata=metadata)


_field = hparam


def _expect_choice(name, value, choices, fix=""):
    if value not in choices:
        raise ConfigError(
            f"Invalid {name} {value!r}. Expected one of: {', '.join(choices)}. "
            f"Received: {name}={value!r}.{(' ' + fix) if fix else ''}"
        )


def type_hints(cls) -> dict:
    """`typing.get_type_hints(cls)`; for a class of a module run by runpy or exec, whose globals are not
    `sys.modules[cls.__module__]`'s, its string annotations are read with `typing`'s names.

    Raises:
        ConfigError: an annotation names something neither place has.
    """
    try:
        return typing.get_type_hints(cls)
    except NameError:
        pass
    try:
        return typing.get_type_hints(cls, localns=vars(typing))
    except NameError as e:
        raise ConfigError(f"The annotations of {cls.__name__} cannot be read ({e}): annotate each field with int, "
                          "float, str or bool (or typing.Optional of one), or define the class in a module Python "
                          "imports.") from None


def _validate_fields(obj) -> None:
    """Checks types, choices and lower bounds declared in each field's metadata."""
    hints = type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        kind, optional = _field_kind(hints[f.name])
        if not isinstance(kind, type):  # e.g. Tuple[int, ...]: the task checks it itself
            continue
        if value is None:
            if optional:
                continue
            raise ConfigError(f"{f.name} must be set. Received: {f.name}=None.")
        special = f.metadata.get("special") or ()
        if isinstance(value, str) and value in special:
            continue
        if kind is float and isinstance(value, str):  # YAML 1.1 reads `1e-3` as a string
            try:
                value = float(value)
                object.__setattr__(obj, f.name, value)
            except ValueError:
                pass
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
            object.__setattr__(obj, f.name, value)
        if kind is bool and not isinstance(value, bool) or (
            kind is not bool and (isinstance(value, bool) or not isinstance(value, kind))
        ):
            also = "".join(f" or {v!r}" for v in special)
            raise ConfigError(
                f"{f.name} must be of type {kind.__name__}{also}. "
                f"Received: {f.name}={value!r} ({type(value).__name__})."
            )
        choices = f.metadata.get("choices")
        if choices:
            _expect_choice(f.name, value, choices)
        minimum = f.metadata.get("minimum")
        if minimum is not None and value < minimum:
            word = "positive" if minimum == 1 else f">= {minimum}"
            raise ConfigError(
                f"{f.name} must be {word}. Received: {f.name}={value!r}. "
                f"Pass a value >= {minimum}."
            )


def _field_kind(hint):
    """(base type, is_optional) of an `int`, `Optional[int]`, ... hint."""
    args = typing.get_args(hint)
    if args and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else hint), True
    return hint, False
