"""A regression task outside the package: a small MLP, MSE loss, SGD.

Data: y = sin(x0) + x1 * x2 - 0.5 * x3 + noise (standard deviation 0.1) on 8 input
features drawn from a standard normal, generated with a fixed seed: 20,000 training
and 4,000 test examples. The noise sets the floor: a perfect model reaches a test
MSE of about 0.01 (0.1 squared); predicting the mean of y gives about 2.2.

    python -m tftrain.run examples/regression.py:task --epochs 5
    python -m tftrain.run examples/regression.py:task --strategy mirrored --cpu-replicas 2 --hidden 64
    python -m tftrain.launch --workers 2 -- python -m tftrain.run examples/regression.py:task \\
        --strategy multi_worker_mirrored

From Python::

    from examples.regression import task
    record = tftrain.Trainer(task, epochs=5).fit()
"""

import dataclasses

import numpy as np

import tftrain

NUM_FEATURES = 8


def make_data(num_examples: int, seed: int):
    """`(x float32 (num_examples, 8), y float32 (num_examples, 1))` from the formula above."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((num_examples, NUM_FEATURES)).astype("float32")
    y = np.sin(x[:, 0]) + x[:, 1] * x[:, 2] - 0.5 * x[:, 3] + 0.1 * rng.standard_normal(num_examples)
    return x, y.astype("float32")[:, None]


@dataclasses.dataclass(frozen=True)
class HParams:
    """This task's own knobs: each becomes a flag (`--hidden 64`) and a YAML key (`task: {hidden: 64}`)."""

    hidden: int = tftrain.hparam(64, "hidden units per layer", minimum=1)
    layers: int = tftrain.hparam(2, "hidden layers", minimum=1)


def build_model(hp: HParams):
    """An MLP: 8 features -> `layers` x `hidden` ReLU units -> 1 output (float32)."""
    import keras

    inputs = keras.Input((NUM_FEATURES,), name="features")
    x = inputs
    for _ in range(hp.layers):
        x = keras.layers.Dense(hp.hidden, activation="relu")(x)
    outputs = keras.layers.Dense(1, dtype="float32", name="prediction")(x)
    return keras.Model(inputs, outputs, name="regression_mlp")


x_train, y_train = make_data(20_000, seed=0)
x_test, y_test = make_data(4_000, seed=1)

task = tftrain.ArrayTask(
    build_model, x_train, y_train, x_test, y_test,
    loss="mse", optimizer="sgd", metrics=["mae"], learning_rate=0.05,
    name="regression", hparams=HParams(), default_batch_size=128,
    defaults={"epochs": 10},
)
