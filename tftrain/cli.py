"""Recipe flags from the config dataclasses (the only module reading argv): one per field (`per_replica_batch_size`
-> `--per-replica-batch-size`) plus `--config FILE`; flags override the file, which overrides the defaults."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import typing
from typing import Collection, Optional, Sequence

from tftrain import config as config_lib
from tftrain.config.fields import type_hints
from tftrain.errors import ConfigError


class OneLineParser(argparse.ArgumentParser):
    """tftrain's `ArgumentParser`: errors raise `error` (default `ConfigError`: exit 2), one line naming `--help`."""

    def __init__(self, *args, error: type = ConfigError, **kwargs):
        super().__init__(*args, **kwargs)
        self._error = error

    def error(self, message):  # noqa: D102 (argparse API)
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            typed = [flag.split("=", 1)[0] for flag in message[len(prefix):].split() if flag.startswith("--")]
            hints = [f"{flag}: did you mean {' or '.join(close)}?" for flag in typed
                     for close in [self.closest_flags(flag)] if close]
            if hints:
                message = f"{message} ({'; '.join(hints)})"
        raise self._error(f"{message}. Run {self.prog} --help for usage.")

    def closest_flags(self, typed: str, n: int = 2) -> list:
        """Up to `n` flags nearest an unknown `typed` one (`--learning-rat`, or initials like `--lr`), closest first."""
        name = typed.split("=", 1)[0]
        flags = [f for f in self._option_string_actions if f.startswith("--")]
        initials = [f for f in flags if "".join(w[:1] for w in f[2:].split("-")) == name[2:] and len(name) > 3]
        close = difflib.get_close_matches(name, flags, n=n, cutoff=0.75)
        return list(dict.fromkeys(initials + close))[:n]


def flag_name(field_name: str) -> str:
    """`per_replica_batch_size` -> `--per-replica-batch-size`."""
    return "--" + field_name.replace("_", "-")


def _fields(defaults: config_lib.RecipeConfig):
    """Yields (section or None, field, type hint) for every config field, the task's hyperparameters last."""
    hints = typing.get_type_hints(config_lib.RecipeConfig)
    for f in dataclasses.fields(config_lib.RecipeConfig):
        if f.name in config_lib.SECTIONS:
            cls = config_lib.SECTIONS[f.name]
            sub_hints = typing.get_type_hints(cls)
            for sub in dataclasses.fields(cls):
                yield f.name, sub, sub_hints[sub.name]
        elif f.name != config_lib.TASK_SECTION:
            yield None, f, hints[f.name]
    if defaults.task is not None:
        task_hints = type_hints(type(defaults.task))
        for f in dataclasses.fields(defaults.task):
            yield config_lib.TASK_SECTION, f, task_hints[f.name]


def _type_with_special(kind, special):
    """`kind`, or a converter that also accepts the strings in `special` (e.g. `"auto"`)."""
    if not special:
        return kind

    def convert(text):
        return text if text in special else kind(text)

    convert.__name__ = f"{kind.__name__} or {' or '.join(special)}"  # named in argparse errors
    return convert


def build_parser(
    prog: str,
    defaults: config_lib.RecipeConfig,
    description: str = "",
    default_config: Optional[str] = None,
    omit: Collection[str] = (),
) -> argparse.ArgumentParser:
    """The recipe's parser: unset flags stay out of its namespace (not overriding the file); errors: `ConfigError`.

    Args:
        defaults: the default config, shown in the help; `defaults.task`'s hyperparameters become flags too.
        default_config: recipe file named in `--config`'s help. Defaults to None.
        omit: flat keys (`"data.cache"`) hidden from `--help` but parsed, for the task to refuse. Defaults to ().
    """
    parser = OneLineParser(
        prog=prog,
        description=description,
        allow_abbrev=False,  # `--epoch 2` is a typo, not --epochs
        formatter_class=argparse.RawDescriptionHelpFormatter,  # defaults are in each help text
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="recipe YAML file; flags given on the command line override it"
        + (f" (e.g. {default_config})" if default_config else ""),
    )
    default_dict = defaults.to_dict()
    groups = {None: parser}
    if defaults.task is not None:
        groups[config_lib.TASK_SECTION] = parser.add_argument_group(
            "task hyperparameters", f"declared by the task ({type(defaults.task).__name__}); YAML section 'task:'"
        )
    for section, f, hint in _fields(defaults):
        kind, _ = config_lib._field_kind(hint)
        if not isinstance(kind, type):
            kind = str
        default = default_dict[section][f.name] if section else default_dict[f.name]
        help_text = f.metadata.get("help", "") + f" (default: {default})"
        choices = f.metadata.get("choices")
        kwargs = {"help": help_text.replace("%", "%%"), "dest": f.name}
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = _type_with_special(kind, f.metadata.get("special") or ())
            if choices:
                kwargs["choices"] = choices
            else:
                kwargs["metavar"] = f.metadata.get("metavar") or (
                    "N" if kind is int else "F" if kind is float else f.name.split("_")[-1].upper())
        if f"{section}.{f.name}" in omit:  # parsed, so the task's check can say why it does nothing
            kwargs["help"] = argparse.SUPPRESS
        groups.get(section, parser).add_argument(flag_name(f.name), **kwargs)
    return parser


def parse_config(
    argv: Optional[Sequence[str]],
    defaults: config_lib.RecipeConfig,
    prog: str,
    description: str = "",
    default_config: Optional[str] = None,
    omit: Collection[str] = (),
) -> config_lib.RecipeConfig:
    """Parses `argv` (None: `sys.argv[1:]`) into a validated `RecipeConfig`: defaults <- --config file <- flags.

    Raises:
        ConfigError: an unknown flag, a bad value, an unreadable file or an invalid combination (one line).
    """
    parser = build_parser(prog, defaults, description, default_config, omit)
    namespace = vars(parser.parse_args(argv))
    path = namespace.pop("config", None)
    if not path:
        return defaults.override(namespace)
    # One layer, so combinations are checked on file and flags together.
    return config_lib.from_yaml(path, base=defaults, overrides=namespace)
