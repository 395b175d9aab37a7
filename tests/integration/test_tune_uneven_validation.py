"""`python -m tftrain.run ... --tune 2 --strategy mirrored --cpu-replicas 2` with a validation set
that does not split evenly over the 2 replicas: 25 examples, fewer than any trial's global batch
(32, 64 or 128), so each trial's first validation batch holds all 25. Keras 3 reads the shapes of a
first batch by adding up the replicas' parts (13 and 12 rows: `AddN` failed, every trial failed,
then `TuningFailed`); each trial now validates at its own batch size with that first batch cut into
24 + 1 (`tftrain.tuning.keras_tuner.even_first_batch`). Once for the regression example (one output),
once for a model of two dict outputs with per-output metrics. Each run in its own process (logical
CPU devices can be set once per process).

The runs stop once tuning has returned: training the best trial afterwards validates through the
trainer's own path (`Trainer.train`), not the tuner's, and that path meets the same first-batch limit
when the validation set is smaller than the global batch and does not split evenly.
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

# tftrain.run's main with `tune` (which BatchStages.plan_batch imports when it runs) wrapped to print
# the trials' ranking and end the process once tuning returned.
TUNE_ONLY = textwrap.dedent('''
    import json, sys
    import tftrain.train.search as search

    tune = search.tune

    def tune_then_stop(trainer):
        figures, best = tune(trainer)
        print("TUNED " + json.dumps({"trials": figures["trials"], "ranking": figures["ranking"]}), flush=True)
        raise SystemExit(0)

    search.tune = tune_then_stop
    from tftrain import run
    sys.exit(run.main(sys.argv[1:]))
''')


@pytest.mark.parametrize("which", ["regression", "two-outputs"])
def test_tune_on_two_replicas_with_a_validation_set_that_does_not_split_evenly(tmp_path, which):
    if which == "regression":
        target = str(REPO / "examples" / "regression.py") + ":task"
    else:
        (tmp_path / "two_outputs.py").write_text(TWO_OUTPUTS)
        target = str(tmp_path / "two_outputs.py") + ":task"
    (tmp_path / "tune_only.py").write_text(TUNE_ONLY)
    # 250 examples, the last 10% (25) held out for validation.
    args = [target, "--train-examples", "250", "--validation-split", "0.1", "--tune", "2", "--strategy", "mirrored",
            "--cpu-replicas", "2", "--epochs", "1", "--seed", "0", "--verbose", "2", "--run-dir", tmp_path / "run"]
    code = f"import runpy, sys; sys.argv = {['tune_only.py', *map(str, args)]!r}; runpy.run_path('tune_only.py')"
    r = run_python(code, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "AddN" not in r.stdout + r.stderr
    tuned = json.loads(r.stdout.split("TUNED ", 1)[1].splitlines()[0])
    assert tuned["trials"] == 2
    assert len(tuned["ranking"]) == 2  # both trials scored (a failed trial has no score)
    assert all(t["hyperparameters"]["batch_size"] in (32, 64, 128) for t in tuned["ranking"])
