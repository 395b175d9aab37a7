"""Importing the user's code (task files, callback modules) and naming its errors in one line."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import traceback
from pathlib import Path

from tftrain.errors import ConfigError


def import_file(path: Path):
    """Imports a Python file as a module (its folder first on `sys.path`, so it can import its neighbours)."""
    if not path.is_file():
        raise ConfigError(f"Task file {str(path)!r} does not exist. Pass FILE.py:NAME with an existing file.")
    sys.path.insert(0, str(path.resolve().parent))
    name = f"tftrain_user_task_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def import_where(where: str):
    """The module `where` names: a `.py` file or path (`import_file`), else an importable module."""
    if where.endswith(".py") or os.sep in where:
        return import_file(Path(where))
    return importlib.import_module(where)


KERAS_WRAPPER_LINES = ("Exception encountered when calling", "Arguments received by", "•")
"""How the lines Keras wraps a layer's error in start (not its cause)."""


def one_line(error: BaseException) -> str:
    """`Type: first line` of an error (with the next line when the first ends in a colon), past the lines Keras
    wraps a layer's error in (`KERAS_WRAPPER_LINES`) and its colour codes."""
    if isinstance(error, SyntaxError) and error.msg:  # its str() repeats the file and line `line_of` names
        return f"{type(error).__name__}: {error.msg}"
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(KERAS_WRAPPER_LINES)] or lines
    if not lines:
        return type(error).__name__
    text = f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return f"{type(error).__name__}: {text.rstrip('.:')}"


def cause_line(error: BaseException) -> str:
    """`Type: cause` of `error` (at most 300 characters): the first line after Keras's "Exception encountered
    when calling" header, colour codes removed."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines and lines[0] == "in user code:":  # traced: the error's own line closes the trace
        raised = [line for line in lines if re.match(r"[A-Z]\w*(Error|Exception): ", line)]
        if raised:
            return words_within(raised[-1], 300)
    cause = [line for line in lines if not line.startswith(KERAS_WRAPPER_LINES)]
    return words_within(f"{type(error).__name__}: {(cause or lines or [''])[0]}", 300)


def words_within(text: str, most: int) -> str:
    """`text`, or its whole words within `most` characters followed by ` ...`."""
    return text if len(text) <= most else text[:most - 4].rsplit(" ", 1)[0] + " ..."


def line_of(error: BaseException, where: str) -> str:
    """` (line N)` for an error raised in the user's file or a syntax error, else ""."""
    if isinstance(error, SyntaxError) and error.lineno:
        return f" (line {error.lineno})"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename.endswith(os.path.basename(where))]
    return f" (line {frames[-1].lineno})" if frames else ""
