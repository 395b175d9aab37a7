"""`tftrain.runtime.thread_choice`: picking, remembering, and `runtime.setup` applying the measured thread counts."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, SUBPROCESS_ENV
from tftrain.runtime import thread_choice
from tftrain.runtime.execution_memory import ExecutionMemory
from tftrain.runtime.thread_choice import ThreadChoice, candidates, pick


def test_candidates_start_with_the_defaults_and_hold_one_inter_op_thread():
    assert candidates(2) == [(0, 0), (2, 1), (1, 1)]
    assert candidates(1) == [(0, 0), (1, 1)]
    assert candidates(16) == [(0, 0), (16, 1), (8, 1)]


def test_pick_keeps_the_defaults_unless_another_is_clearly_faster():
    defaults = {"mlp": 100.0, "cnn": 100.0}
    assert pick({(0, 0): defaults, (2, 1): {"mlp": 104.0, "cnn": 104.0}}) == ((0, 0), 1.0)  # within 5%
    best, speedup = pick({(0, 0): defaults, (2, 1): {"mlp": 121.0, "cnn": 100.0}, (1, 1): {"mlp": 50.0, "cnn": 50.0}})
    assert best == (2, 1) and speedup == pytest.approx(1.1)  # geometric mean of 1.21 and 1.0
    assert pick({(2, 1): defaults}) == ((0, 0), 1.0)  # the defaults never ran: nothing to compare with


def test_a_choice_is_remembered_per_machine_and_a_corrupt_entry_is_ignored(tmp_path):
    memory = ExecutionMemory(tmp_path / "execution.json")
    assert thread_choice.remembered(memory) is None
    kept = thread_choice.remember(ThreadChoice(2, 1, 1.2, {"0,0": {"mlp": 1.0}}), memory)
    assert kept.measured_at and thread_choice.remembered(memory) == kept
    memory.put_entry(thread_choice.machine_key(), {"intra_op": -1, "inter_op": 1, "speedup": 1.0, "rates": {}})
    assert thread_choice.remembered(memory) is None
    memory.put_entry(thread_choice.machine_key(), {"unexpected": True})
    assert thread_choice.remembered(memory) is None


_SETUP = """
import json, sys
import tensorflow as tf
from tftrain.config import RuntimeConfig
from tftrain.runtime.core import setup
rt = setup(RuntimeConfig(device="cpu", precision="float32", **json.loads(sys.argv[1])))
print(json.dumps([tf.config.threading.get_intra_op_parallelism_threads(),
                  tf.config.threading.get_inter_op_parallelism_threads(), rt.threads.source]))
"""


def _setup_threads(cache, **config):
    """Thread counts and source after `runtime.setup` in a fresh process (thread pools are fixed at start)."""
    import os

    env = {**os.environ, **SUBPROCESS_ENV, "TFTRAIN_CACHE_DIR": str(cache), "CUDA_VISIBLE_DEVICES": "-1"}
    done = subprocess.run([sys.executable, "-c", _SETUP, json.dumps(config)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_setup_applies_the_remembered_counts(tmp_path):
    assert _setup_threads(tmp_path)[:2] == [0, 0]  # never measured: TensorFlow's defaults
    thread_choice.remember(ThreadChoice(1, 1, 1.3, {}), ExecutionMemory(tmp_path / "execution.json"))
    intra, inter, source = _setup_threads(tmp_path)  # a fresh process: the pools really take the counts
    assert (intra, inter) == (1, 1) and "measured by python -m tftrain.doctor" in source and "1.30x" in source


def test_remembered_counts_give_way_to_the_users_and_to_default(tmp_path, monkeypatch):
    from tftrain.config import RuntimeConfig
    from tftrain.runtime import core
    from tftrain.runtime.threads import ThreadSettings

    monkeypatch.setenv("TFTRAIN_CACHE_DIR", str(tmp_path))
    thread_choice.remember(ThreadChoice(1, 1, 1.3, {}), ExecutionMemory(tmp_path / "execution.json"))
    asked = []
    monkeypatch.setattr(core, "set_threads", lambda intra, inter: asked.append((intra, inter)) or ThreadSettings(
        intra, inter, True, 2))
    for config, expected in ((RuntimeConfig(), (1, 1)), (RuntimeConfig(threads="default"), (0, 0)),
                             (RuntimeConfig(remember_execution=False), (0, 0)),
                             (RuntimeConfig(intra_op_threads=2, inter_op_threads=2), (2, 2))):
        settings = core._threads(config)
        assert asked[-1] == expected and bool(settings.source) == (expected == (1, 1)), config
