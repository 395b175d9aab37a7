"""Shared test helpers.

Anything that sets thread counts or logical devices runs in a subprocess (TensorFlow
allows that once per process); `run_module` starts one with a timeout and returns
the completed process. The Keras dtype policy is restored after every test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Quiet TensorFlow's C++ start-up logs in subprocesses; keep Python warnings.
SUBPROCESS_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}

SMOKE = ["--train-examples", "1024", "--epochs", "1", "--verbose", "2", "--seed", "0"]
"""Recipe flags for a few-second smoke run."""


def run_module(module, args, cwd, env=None, timeout=300):
    """Runs `python -m module *args` in `cwd`; returns `subprocess.CompletedProcess` (text)."""
    full_env = {**os.environ, **SUBPROCESS_ENV, **(env or {})}
    full_env.pop("TF_CONFIG", None) if env is None or "TF_CONFIG" not in env else None
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout,
    )


def read_metrics(run_dir) -> dict:
    """The `metrics.json` of a finished run."""
    return json.loads((Path(run_dir) / "metrics.json").read_text())


@pytest.fixture(autouse=True)
def _restore_dtype_policy():
    """Saves and restores Keras's global dtype policy around each test."""
    import keras

    policy = keras.mixed_precision.global_policy()
    yield
    keras.mixed_precision.set_global_policy(policy)
