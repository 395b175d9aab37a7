"""The profile is really viewable: a TensorBoard server lists the run and serves its trace,
and its Overview and Input Pipeline pages measure step time, under steps_per_execution too.

Starts `tensorboard` bound to 127.0.0.1 on a port it picks itself (--port 0, read back
from its start-up line), asks the profile plugin's HTTP API for runs, tools, hosts, the
trace-viewer data and the Overview / Input Pipeline pages, and always stops the server
(its whole process group).
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


SPE = 4
"""steps_per_execution of the second profile: Keras runs its steps as a tf.while_loop."""


def profile_small_model(log_dir, start, stop, steps_per_execution=1, subdir="train", tensorboard=False):
    """Trains a small model for one epoch of 16 steps, profiling steps [start, stop); returns the callback."""
    x = np.random.default_rng(0).random((512, 8)).astype("float32")
    y = (x[:, 0] > 0.5).astype("int32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=steps_per_execution)
    window = ProfilerWindow(log_dir, start=start, stop=stop, subdir=subdir, verbose=0)
    extra = [keras.callbacks.TensorBoard(str(log_dir))] if tensorboard else []
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=1, shuffle=False, verbose=0,
              callbacks=extra + [window])
    return window


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory):
    """A log directory holding a profile of steps [2, 5) (run `train/...`) and one of steps
    [4, 12) under steps_per_execution=4 (run `spe4/...`); returns (log_dir, {subdir: trace})."""
    log_dir = tmp_path_factory.mktemp("run") / "logs"
    one = profile_small_model(log_dir, 2, 5, tensorboard=True)
    assert one.captured == (2, 5)
    several = profile_small_model(log_dir, SPE, 3 * SPE, steps_per_execution=SPE, subdir="spe4")
    assert several.captured == (SPE, 3 * SPE)
    return log_dir, {"train": one.trace_files[0], "spe4": several.trace_files[0]}


@pytest.fixture(scope="module")
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


def wait_for_run(url, trace_file) -> str:
    """The plugin's name of the run holding `trace_file`, once TensorBoard lists it."""
    expected_run = f"{trace_file.parent.parent.parent.parent.name}/{trace_file.parent.name}"
    deadline, runs = time.monotonic() + REQUEST_TIMEOUT_S, []
    while expected_run not in runs and time.monotonic() < deadline:
        runs = get_json(url, "/data/plugin/profile/runs")
        time.sleep(0.5)
    assert expected_run in runs, runs
    return expected_run


def tool_name(url, run, tool) -> str:
    """The plugin's name of `tool` for `run` (`tool` or `tool@`, by plugin version)."""
    tools = get_json(url, "/data/plugin/profile/run_tools", run=run)
    assert tool + "@" in tools or tool in tools, tools
    return tool + "@" if tool + "@" in tools else tool


def tool_data(url, run, tool, trace_file):
    """What the Profile tab's `tool` page shows for the one host of `run`."""
    tag = tool_name(url, run, tool)
    hosts = [h["hostname"] for h in get_json(url, "/data/plugin/profile/hosts", run=run, tag=tag)]
    assert hosts == [trace_file.name[: -len(".xplane.pb")]]
    return get_json(url, "/data/plugin/profile/data", run=run, tag=tag, host=hosts[0])


def step_time_table(page) -> tuple:
    """(summary properties, [(step name, step time ms)]) of an Overview / Input Pipeline page:
    the table whose columns hold the step number."""
    (table,) = [t for t in page if any(c.get("id") == "stepnum" for c in t.get("cols", []))]
    column = [c["id"] for c in table["cols"]].index("stepTimeMs")
    return table["p"], [(row["c"][0]["v"], row["c"][column]["v"]) for row in table["rows"]]


def test_tensorboard_profile_plugin_lists_the_run_and_serves_its_trace(tensorboard, profiled_run):
    trace_file = profiled_run[1]["train"]
    assert get_json(tensorboard, "/data/plugins_listing")["profile"]["enabled"]
    run = wait_for_run(tensorboard, trace_file)
    trace = tool_data(tensorboard, run, "trace_viewer", trace_file)
    names = {event.get("name") for event in trace["traceEvents"]}
    markers = {name for name in names if re.fullmatch(r"train \d+", str(name))}
    assert markers == {"train 2", "train 3", "train 4"}  # the step markers of the window [2, 5)
    assert "multi_step_on_iterator" in names  # Keras's training function ran inside the trace


@pytest.mark.parametrize("subdir, steps", [("train", ["train 2", "train 3", "train 4"]),
                                           ("spe4", [f"train({SPE} steps) {SPE}", f"train({SPE} steps) {2 * SPE}"])])
def test_overview_and_input_pipeline_measure_the_windows_steps(tensorboard, profiled_run, subdir, steps):
    trace_file = profiled_run[1][subdir]
    run = wait_for_run(tensorboard, trace_file)
    for page in ("overview_page", "input_pipeline_analyzer"):
        summary, rows = step_time_table(tool_data(tensorboard, run, page, trace_file))
        assert [name for name, _ in rows] == steps, (page, rows)  # one step per traced execution
        assert all(ms > 0 for _, ms in rows), (page, rows)
        average = float(summary["steptime_ms_average"])
        assert average > 0, (page, summary)
        assert "No step time measured" not in summary["input_conclusion"], (page, summary)
        print(f"{subdir} {page}: average step time {average} ms over {len(rows)} step(s) {rows}")
