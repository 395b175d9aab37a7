"""EpochLengthWatch says once when an epoch runs other than the planned steps (a task's example count off)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tftrain.callbacks.epoch_length import EpochLengthWatch


def _model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model


def _data(batches):
    x = np.zeros((batches * 4, 3), "float32")
    return tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(4)


def _fit(planned, batches, epochs=2, model=None, initial_epoch=0):
    said = []
    model = model or _model()
    model.fit(_data(batches), epochs=epochs, initial_epoch=initial_epoch, verbose=0,
              callbacks=[EpochLengthWatch(planned, "the task's 40 training examples at batch 4", say=said.append)])
    return said, model


def test_an_epoch_longer_or_shorter_than_planned_is_said_once():
    longer, _ = _fit(planned=5, batches=10, epochs=3)
    assert longer == ["epoch 1 ran 10 steps where the plan counts 5 from the task's 40 training examples at batch 4: "
                      "a learning-rate schedule, --backup-every-steps and --profile count the planned steps, so a "
                      "cosine schedule reaches 0 early. Give the task its true number of training examples "
                      "(num_train_examples)."]
    shorter, _ = _fit(planned=20, batches=10)
    assert len(shorter) == 1 and "stops short of 0" in shorter[0]


def test_the_planned_length_within_a_step_and_a_resumed_epoch_are_left_alone():
    assert _fit(planned=10, batches=10)[0] == [] and _fit(planned=11, batches=10)[0] == []
    _, model = _fit(planned=10, batches=7, epochs=1)  # the attempt before stopped inside epoch 1, at step 7
    said, _ = _fit(planned=10, batches=3, epochs=2, model=model, initial_epoch=1)  # resumes mid-way: cannot tell
    assert said == []


@pytest.mark.parametrize("unknown_length", [True, False])
@pytest.mark.parametrize("steps_per_execution", [1, 8])
def test_the_batches_keras_runs_are_counted_at_any_steps_per_execution_and_data_length(unknown_length,
                                                                                       steps_per_execution):
    # 11 batches: the optimizer counts 12 at 1 step per execution on data of unknown length; the batch hooks
    # say 16 at 8 steps per execution (indices 7 and 15).
    x = np.zeros((42, 3), "float32")
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :1]))
    data = (data.filter(lambda a, b: True) if unknown_length else data).batch(4)  # 10 batches and one of 2
    said, model = [], _model()
    model.compile("sgd", "mse", steps_per_execution=steps_per_execution)
    for planned in (10, 14):
        said.clear()
        model.fit(data, epochs=1, verbose=0,
                  callbacks=[EpochLengthWatch(planned, "the task's 42 training examples at batch 4", say=said.append)])
        model.optimizer.iterations.assign(0)  # each fit's first epoch starts where its plan says
        if planned == 10:
            assert said == []  # the planned 10 and the last partial one
        else:
            assert len(said) == 1 and said[0].startswith("epoch 1 ran 11 steps where the plan counts 14"), said
