"""`--callbacks WHERE:NAME[,...]`: the user's own Keras callbacks, named on the command line.

WHERE is a `.py` file or an importable module; NAME a `keras.callbacks.Callback`, a callback
class (built with no arguments) or a function of no arguments returning one or a list. Names
are resolved before TensorFlow starts; the callbacks are made in every process, after tftrain's.
"""

from __future__ import annotations

import inspect
from typing import Callable, List

from tftrain.errors import ConfigError


def resolve(specs: str) -> List[Callable[[], list]]:
    """Imports each `WHERE:NAME` of the comma-separated `specs`; returns one maker per spec.
    Raises `ConfigError` on a bad spec, import error, missing NAME or NAME that is no callback."""
    return [_maker(spec.strip()) for spec in specs.split(",") if spec.strip()]


def _import(where: str):
    from tftrain.errors import one_line
    from tftrain.train.user_code import import_where

    try:
        return import_where(where)
    except ConfigError:
        raise
    except Exception as e:  # the user's file: what failed, in one line
        raise ConfigError(f"--callbacks: could not import {where!r}: {one_line(e)}.") from None


def _maker(spec: str) -> Callable[[], list]:
    import keras

    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ConfigError(f"--callbacks: invalid {spec!r}. Expected FILE.py:NAME or MODULE:NAME, e.g. "
                          "my_callbacks.py:Logger.")
    module = _import(where)
    if not hasattr(module, name):
        raise ConfigError(f"--callbacks: {where!r} has no {name!r}.")
    obj = getattr(module, name)
    if isinstance(obj, keras.callbacks.Callback):
        return lambda: [obj]
    if not callable(obj):
        raise ConfigError(f"--callbacks: {spec} is of type {type(obj).__name__}, not a Keras callback, a callback class "
                          "or a function returning callbacks.")
    return lambda: _made(spec, obj)


def _made(spec: str, factory) -> list:
    """`factory()` as a list of callbacks; `ConfigError` when it needs arguments or gives no callbacks."""
    import keras

    required = [p for p in inspect.signature(factory).parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if required:
        raise ConfigError(f"--callbacks: {spec} needs arguments ({', '.join(p.name for p in required)}); give it "
                          "defaults, or name a function of no arguments that builds it.")
    made = factory()
    made = list(made) if isinstance(made, (list, tuple)) else [made]
    wrong = [type(c).__name__ for c in made if not isinstance(c, keras.callbacks.Callback)]
    if wrong:
        raise ConfigError(f"--callbacks: {spec} gave {', '.join(wrong)}, not Keras callbacks.")
    return made
