"""Importing the user's code (task files, callback modules) and naming its errors in one line."""

from __future__ import annotations

import importlib
import importlib.util
import os
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


def line_of(error: BaseException, where: str) -> str:
    """` (line N)` for an error raised in the user's file or a syntax error, else ""."""
    if isinstance(error, SyntaxError) and error.lineno:
        return f" (line {error.lineno})"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename.endswith(os.path.basename(where))]
    return f" (line {frames[-1].lineno})" if frames else ""
