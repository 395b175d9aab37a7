"""The profile is really viewable: a TensorBoard server lists the run and serves its trace.

Starts `tensorboard` bound to 127.0.0.1 on a port it picks itself (--port 0, read back
from its start-up line), asks the profile plugin's HTTP API for runs, tools, hosts and
the trace-viewer data, and always stops the server (its whole process group).
"""

import gzip
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import keras
import numpy as np
import pytest
import tensorflow as tf

from tftrain.callbacks import ProfilerWindow

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 90
REQUEST_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory):
    """A log directory holding one profile of steps [2, 5) of a small model."""
    log_dir = tmp_path_factory.mktemp("run") / "logs"
    x = np.random.default_rng(0).random((256, 8)).astype("float32")
    y = (x[:, 0] > 0.5).astype("int32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    window = ProfilerWindow(log_dir, start=2, stop=5, verbose=0)
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=1, shuffle=False, verbose=0,
              callbacks=[keras.callbacks.TensorBoard(str(log_dir)), window])
    assert window.captured == (2, 5)
    return log_dir, window.trace_files[0]


@pytest.fixture
def tensorboard(profiled_run):
    """A running `tensorboard --logdir <run>` on 127.0.0.1; yields its base URL; always stopped."""
    log_dir, _ = profiled_run
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(log_dir), "--host", "127.0.0.1",
         "--port", "0", "--load_fast", "false", "--reload_interval", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    lines: "queue.Queue[str]" = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True)
    reader.start()
    try:
        url, deadline = None, time.monotonic() + START_TIMEOUT_S
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                match = re.search(r"(http://127\.0\.0\.1:\d+)/", lines.get(timeout=1))
                url = match.group(1) if match else None
            except queue.Empty:
                pass
        assert url, f"TensorBoard did not start within {START_TIMEOUT_S} s (exit code {proc.poll()})"
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)
        reader.join(timeout=5)


def get_json(url, path, **params):
    query = ("?" + urllib.parse.urlencode(params)) if params else ""
    request = urllib.request.Request(url + path + query, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return json.loads(body)


def test_tensorboard_profile_plugin_lists_the_run_and_serves_its_trace(tensorboard, profiled_run):
    _, trace_file = profiled_run
    assert get_json(tensorboard, "/data/plugins_listing")["profile"]["enabled"]

    expected_run = f"train/{trace_file.parent.name}"
    deadline, runs = time.monotonic() + REQUEST_TIMEOUT_S, []
    while expected_run not in runs and time.monotonic() < deadline:
        runs = get_json(tensorboard, "/data/plugin/profile/runs")
        time.sleep(0.5)
    assert expected_run in runs, runs

    tools = get_json(tensorboard, "/data/plugin/profile/run_tools", run=expected_run)
    assert "trace_viewer@" in tools or "trace_viewer" in tools, tools
    trace_tool = "trace_viewer@" if "trace_viewer@" in tools else "trace_viewer"
    hosts = [h["hostname"] for h in get_json(tensorboard, "/data/plugin/profile/hosts", run=expected_run,
                                             tag=trace_tool)]
    assert hosts == [trace_file.name[: -len(".xplane.pb")]]

    trace = get_json(tensorboard, "/data/plugin/profile/data", run=expected_run, tag=trace_tool, host=hosts[0])
    names = {event.get("name") for event in trace["traceEvents"]}
    markers = {name for name in names if re.fullmatch(r"train \d+", str(name))}
    assert markers == {"train 2", "train 3", "train 4"}  # the step markers of the window [2, 5)
    assert "multi_step_on_iterator" in names  # Keras's training function ran inside the trace
