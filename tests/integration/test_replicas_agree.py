"""Under MirroredStrategy and MultiWorkerMirroredStrategy each replica updates its own copy of BatchNormalization's
moving statistics; the saved model holds one copy, so the run's test figures are those of the copies agreed
(`agree_replicas`)."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, SUBPROCESS_ENV

pytestmark = pytest.mark.integration

_SCRIPT = """
import json, os, sys
import keras, numpy as np
import tftrain

rng = np.random.default_rng(0)
x = rng.standard_normal((640, 12)).astype("float32")
y = (x[:, :3].sum(axis=1) > 0).astype("int32")

def build():
    return keras.Sequential([keras.Input((12,)), keras.layers.Dense(16), keras.layers.BatchNormalization(momentum=0.5),
                             keras.layers.ReLU(), keras.layers.Dense(2, activation="softmax")])

task = tftrain.ArrayTask(build, x[:512], y[:512], x[512:], y[512:], loss="sparse_categorical_crossentropy",
                         metrics=["accuracy"], name="bn")
replicas = {"cpu_replicas": 2} if sys.argv[2] == "mirrored" else {}
record = tftrain.Trainer(task, epochs=2, batch_size=64, strategy=sys.argv[2], execution="graph", precision="float32",
                         validation_split=0.1,  # 51 validation examples: one batch the replicas split unevenly
                         seed=0, verbose=0, run_dir=sys.argv[1], **replicas).fit()
if json.loads(os.environ.get("TF_CONFIG", '{"task": {"index": 0}}'))["task"]["index"]:
    sys.exit(0)  # the chief prints
saved = keras.models.load_model(sys.argv[1] + "/model.keras")
print("figures", json.dumps({"reported": record.test, "saved": saved.evaluate(x[512:], y[512:], batch_size=64, verbose=0,
                                                                   return_dict=True)}))
"""


def _figures(done):
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if "figures {" in line)
    return json.loads(line[line.index("{"):])


@pytest.mark.parametrize("strategy", ["mirrored", "multi_worker_mirrored"])
def test_the_test_figures_of_a_batchnorm_model_on_two_replicas_are_the_saved_model_s(tmp_path, strategy):
    command = [sys.executable, "-c", _SCRIPT, str(tmp_path / "run"), strategy]
    if strategy == "multi_worker_mirrored":  # two workers, one replica each
        command = [sys.executable, "-m", "tftrain.launch", "--workers", "2", "--", *command]
    figures = _figures(subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                                      env={**os.environ, **SUBPROCESS_ENV}))
    assert figures["reported"]["loss"] == pytest.approx(figures["saved"]["loss"], rel=1e-5), figures
    assert figures["reported"]["accuracy"] == pytest.approx(figures["saved"]["accuracy"], abs=1e-6), figures
