"""`python -m tftrain.run ... --tune 2 --strategy mirrored --cpu-replicas 2` with a validation set
that does not split evenly over the 2 replicas: 25 examples, fewer than any trial's global batch
(32, 64 or 128), so each trial's first validation batch holds all 25. Keras 3 reads the shapes of a
first batch by adding up the replicas' parts (13 and 12 rows: `AddN` failed, every trial failed,
then `TuningFailed`); each trial now validates at its own batch size with that first batch cut into
24 + 1 (`tftrain.tuning.keras_tuner.even_first_batch`). Once for the regression example (one output),
once for a model of two dict outputs with per-output metrics. Each run in its own process (logical
CPU devices can be set once per process).

Each run then trains the best trial, validating through the trainer's own path (`Trainer.train`,
whose first validation and test batches are cut the same way, `Trainer._evenly_first`).
"""

import json
import textwrap

import pytest

from tests.conftest import REPO, run_python

pytestmark = pytest.mark.integration

TWO_OUTPUTS = textwrap.dedent('''
    import numpy as np

    import tftrain

    RNG = np.random.default_rng(0)
    X = RNG.standard_normal((250, 8)).astype("float32")
    Y = {"label": (X[:, 0] > 0).astype("int32"), "value": (2 * X[:, 1:2]).astype("float32")}


    def build_model():
        import keras

        inputs = keras.Input((8,), name="features")
        hidden = keras.layers.Dense(8, activation="relu")(inputs)
        return keras.Model(inputs, {"label": keras.layers.Dense(2, activation="softmax", name="label")(hidden),
                                    "value": keras.layers.Dense(1, name="value")(hidden)})


    task = tftrain.ArrayTask(build_model, X, Y, X[:40], {k: v[:40] for k, v in Y.items()}, name="two_outputs",
                             loss={"label": "sparse_categorical_crossentropy", "value": "mse"},
                             metrics={"label": ["accuracy"], "value": ["mae"]})
''')

@pytest.mark.parametrize("which", ["regression", "two-outputs"])
def test_tune_on_two_replicas_with_a_validation_set_that_does_not_split_evenly(tmp_path, which):
    if which == "regression":
        target = str(REPO / "examples" / "regression.py") + ":task"
    else:
        (tmp_path / "two_outputs.py").write_text(TWO_OUTPUTS)
        target = str(tmp_path / "two_outputs.py") + ":task"
    # 250 examples, the last 10% (25) held out for validation; test sets of 4,000 (regression) and 40.
    args = [target, "--train-examples", "250", "--validation-split", "0.1", "--tune", "2", "--strategy", "mirrored",
            "--cpu-replicas", "2", "--epochs", "1", "--seed", "0", "--verbose", "2", "--run-dir", tmp_path / "run"]
    r = run_python(f"import sys; from tftrain import run; sys.exit(run.main({list(map(str, args))!r}))", cwd=tmp_path,
                   timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "AddN" not in r.stdout + r.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    tuning = metrics["tuning"]
    assert tuning["trials"] == 2 and metrics["global_batch_size"] == tuning["best"]["batch_size"] in (32, 64, 128)
    # the best trial trained with the same 25 validation examples in its first (uneven) batch, and was evaluated
    assert len(metrics["history"]["val_loss"]) == 1 and metrics["test_loss"] > 0
