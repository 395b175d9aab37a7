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

from tftrain.rundir import RESTART_ENVS

REPO = Path(__file__).resolve().parents[1]

# TensorFlow's C++ warnings stay visible (tests assert some never appear).
SUBPROCESS_ENV = {"TF_CPP_MIN_LOG_LEVEL": "1", "PYTHONUNBUFFERED": "1"}

SMOKE = ["--train-examples", "1024", "--epochs", "1", "--verbose", "2", "--seed", "0"]
"""Recipe flags for a few-second smoke run."""


BASE_INSTALL_WITHOUT = "pandas,sklearn,scipy,matplotlib"
"""Packages the dev extras install (for MLflow, the bayesian tuner and the benchmark plots) and
`pip install tftrain` does not; the processes tests start run without them (tests/base_install)."""


@pytest.fixture(scope="session", autouse=True)
def _processes_start_as_a_base_install():
    """Every process a test starts lacks `BASE_INSTALL_WITHOUT` (`tests/base_install` on `PYTHONPATH`),
    which Keras would import at start-up (2 s a process on 2 cores); this process (pytest's) keeps
    them. No test process takes itself for a scheduler's restart (`RESTART_ENVS` removed)."""
    before = {key: os.environ.get(key) for key in ("PYTHONPATH", "TFTRAIN_TESTS_WITHOUT", *RESTART_ENVS)}
    for key in RESTART_ENVS:  # a suite run inside a requeued SLURM job is no restart of the runs it makes
        os.environ.pop(key, None)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests" / "base_install"), before["PYTHONPATH"]]))
    os.environ["TFTRAIN_TESTS_WITHOUT"] = BASE_INSTALL_WITHOUT
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def with_dev_extras(env: dict, *names: str) -> dict:
    """`env` (a process environment) with the dev extras' packages `names` (top-level import names,
    e.g. "matplotlib") importable again, or all of them when none is named: without what
    `_processes_start_as_a_base_install` adds."""
    still_without = [n for n in env.get("TFTRAIN_TESTS_WITHOUT", "").split(",") if n and names and n not in names]
    if still_without:
        return {**env, "TFTRAIN_TESTS_WITHOUT": ",".join(still_without)}
    env = {k: v for k, v in env.items() if k != "TFTRAIN_TESTS_WITHOUT"}
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p) != REPO / "tests" / "base_install"]
    env.pop("PYTHONPATH", None)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    return env


@pytest.fixture(scope="session", autouse=True)
def _session_execution_memory(tmp_path_factory):
    """One `--execution auto` memory (`tftrain.runtime.execution_memory`) for the whole session,
    in a temporary folder, never the user's cache: as for a user, the first run of a model and
    batch times graph against XLA and later runs reuse the choice. A test that needs the timing
    to happen takes `fresh_execution_memory`."""
    before = os.environ.get("TFTRAIN_CACHE_DIR")
    os.environ["TFTRAIN_CACHE_DIR"] = str(tmp_path_factory.mktemp("tftrain-cache"))
    yield
    if before is None:
        os.environ.pop("TFTRAIN_CACHE_DIR", None)
    else:
        os.environ["TFTRAIN_CACHE_DIR"] = before


@pytest.fixture(autouse=True)
def _xla_flags_restored(monkeypatch):
    """`TF_XLA_FLAGS` as it was before each test: `runtime.setup` names XLA's persistent cache there
    (`tftrain.runtime.xla_cache`), which must not follow one test's cache into the next test's processes."""
    if "TF_XLA_FLAGS" in os.environ:
        monkeypatch.setenv("TF_XLA_FLAGS", os.environ["TF_XLA_FLAGS"])
    else:
        monkeypatch.delenv("TF_XLA_FLAGS", raising=False)


@pytest.fixture
def fresh_execution_memory(tmp_path, monkeypatch):
    """An empty `--execution auto` memory for this test and the processes it starts."""
    monkeypatch.setenv("TFTRAIN_CACHE_DIR", str(tmp_path / "tftrain-cache"))


@pytest.fixture
def xla_always_timed(monkeypatch):
    """`--execution auto` times XLA, and keeps a remembered XLA choice, in this process however short
    the run: tests of the trial's and the memory's mechanics run a few dozen steps, too few to repay
    compiling XLA, so the trial would skip it and a remembered XLA choice would give way to graph;
    those rules have their own tests in tests/unit/runtime/test_execution_trial.py."""
    from tftrain.runtime import execution_trial, trial_rules

    monkeypatch.setattr(execution_trial.ExecutionTrial, "_not_worth_timing", lambda self, challenger: None)
    monkeypatch.setattr(trial_rules, "weigh_remembered_xla", lambda choice, planned_steps: choice)


@pytest.fixture
def bf16_always_timed(monkeypatch):
    """`--precision auto` times the mixed_bfloat16 twin however short the run: tests of its mechanics run
    a few dozen steps, too few to repay timing it (`tftrain.runtime.precision.bfloat16_repays`, tested
    in tests/unit/runtime/test_precision.py)."""
    from tftrain.runtime import precision

    monkeypatch.setattr(precision, "bfloat16_repays", lambda *args: True)


def run_module(module, args, cwd, env=None, timeout=300):
    """Runs `python -m module *args` in `cwd`; returns `subprocess.CompletedProcess` (text)."""
    full_env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    full_env.update(SUBPROCESS_ENV)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout,
    )


def interrupt_after_first_checkpoint(module, args, run_dir, cwd, timeout=180):
    """Runs `python -m module *args` through tests/held_run.py, sends SIGINT (Ctrl-C) once the run's
    first BackupAndRestore checkpoint exists (the run waits there for it), and returns
    `(returncode, stderr, epochs done)`.

    Fails the test when the run ends before it could be interrupted; the process is
    killed if it outlives `timeout` seconds.
    """
    import signal
    import time

    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    held_run = str(REPO / "tests" / "held_run.py")
    proc = subprocess.Popen([sys.executable, held_run, module, *map(str, args)], cwd=cwd, text=True,
                            env={**env, **SUBPROCESS_ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout
        while checkpoint_metadata(run_dir) is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "run finished before it could be interrupted"
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err, checkpoint_metadata(run_dir)["epoch"]


def checkpoint_metadata(run_dir):
    """The newest checkpoint's position in `run_dir/backup` as a dict (`epoch`, `steps_in_epoch`,
    `optimizer_iterations`), or None when there is none."""
    import dataclasses

    from tftrain.checkpoint_files import read_position

    position = read_position(Path(run_dir) / "backup")
    return None if position is None else dataclasses.asdict(position)


def checkpoint_weights(run_dir) -> Path:
    """The newest committed checkpoint's weights file in `run_dir/backup`."""
    from tftrain.checkpoint_files import checkpoints

    return checkpoints(Path(run_dir) / "backup")[0].weights


def read_metrics(run_dir) -> dict:
    """The `metrics.json` of a finished run."""
    return json.loads((Path(run_dir) / "metrics.json").read_text())


def optimizer_steps(run_dir) -> int:
    """The optimizer steps a finished run's saved `model.keras` has taken (`optimizer.iterations`,
    which a step that dynamic loss scaling skips does not count).

    Loaded under the run's dtype policy: Keras wraps the saved optimizer in a
    LossScaleOptimizer only under `mixed_float16`, and otherwise skips its state.
    """
    import keras

    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(read_metrics(run_dir)["precision"])
    try:
        model = keras.saving.load_model(Path(run_dir) / "model.keras")
    finally:
        keras.mixed_precision.set_global_policy(policy)
    return int(model.optimizer.iterations.numpy())


@pytest.fixture(autouse=True)
def _restore_dtype_policy():
    """Saves and restores Keras's global dtype policy around each test."""
    import keras

    policy = keras.mixed_precision.global_policy()
    yield
    keras.mixed_precision.set_global_policy(policy)


def run_python(code, env=None, timeout=180, cwd=None):
    """Runs `python -c code` in a fresh process (for code that changes TF's start-up
    settings); returns `subprocess.CompletedProcess` (text)."""
    full_env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    full_env.update(SUBPROCESS_ENV)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout,
    )


def class_weight_problem():
    """A 4-feature, 2-class problem for class-weight tests: `(x, y, weights, build)`, 256 float32 rows of
    which about 1 in 4 is positive, `{0: 1.0, 1: 3.0}`, and an uncompiled softmax layer's builder. The same
    in every process (seed 0), so a subprocess's run compares with plain Keras in the test's process."""
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 4)).astype("float32")
    y = (x[:, 0] + 0.5 * rng.standard_normal(256) > 0.8).astype("int64")

    def build():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])

    return x, y, {0: 1.0, 1: 3.0}, build


def linear_regression_task(name: str):
    """A 4-feature linear regression `ArrayTask` (256 training rows, 64 test rows; MSE, SGD, `mae`):
    seconds to train, for tests of what a run writes."""
    import keras
    import numpy as np

    import tftrain

    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 0.0], "float32"))[:, None]
    return tftrain.ArrayTask(lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]), x, y, x[:64],
                             y[:64], loss="mse", optimizer="sgd", metrics=["mae"], name=name)
