"""`--tune` over every tuner and every kind of choice: the best values apply to the run's config as they are."""

import dataclasses

import numpy as np
import pytest

import tftrain

X = np.random.default_rng(0).standard_normal((256, 4)).astype("float32")
Y = (X[:, :1] * 2).astype("float32")


@dataclasses.dataclass(frozen=True)
class HP:
    wide: bool = tftrain.hparam(False, "a wider hidden layer")


class Toggled(tftrain.ArrayTask):
    def tune_space(self):
        return {"wide": (False, True)}


def _build(seen):
    import keras

    def build(hp):
        seen.append(hp.wide)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(16 if hp.wide else 4), keras.layers.Dense(1)])

    return build


def test_a_boolean_choice_reaches_the_model_as_a_boolean():
    import keras_tuner as kt

    from tftrain.tuning.keras_tuner import _choice

    hp = kt.HyperParameters()
    assert _choice(hp, "wide", (False, True)) is False and _choice(hp, "only", (True,)) is True
    assert _choice(hp, "units", (4, 8)) == 4


@pytest.mark.slow
@pytest.mark.parametrize("tuner", ["random", "hyperband"])
def test_the_best_trial_trains_whatever_the_tuner_and_a_boolean_choice(tmp_path, tuner):
    seen = []
    task = Toggled(_build(seen), X, Y, loss="mse", hparams=HP(), name="toggled")
    record = tftrain.Trainer(task, tune=2, tuner=tuner, validation_split=0.25, epochs=2, verbose=0,
                             execution="graph", run_dir=str(tmp_path / "run")).fit()
    best = record.extras["tuning"]["best"]
    assert not [k for k in best if k.startswith("tuner/")] and isinstance(best["wide"], bool), best
    assert record.epochs_trained == 2 and set(seen) <= {False, True} and all(isinstance(s, bool) for s in seen)
