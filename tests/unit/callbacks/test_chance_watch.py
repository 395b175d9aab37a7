"""ChanceWatch says once when validation accuracy sits at chance while training accuracy climbs."""

import keras

from tftrain.callbacks import ChanceWatch


def _watch(units=10):
    said = []
    watch = ChanceWatch(say=said.append)
    watch.set_model(keras.Sequential([keras.Input((4,)), keras.layers.Dense(units, activation="softmax")]))
    watch.on_train_begin()
    return watch, said


def test_validation_at_chance_while_training_learns_is_said_once():
    watch, said = _watch()
    watch.on_epoch_end(0, {"accuracy": 0.6, "val_accuracy": 0.1})  # the first epoch: too early to tell
    assert said == []
    watch.on_epoch_end(1, {"accuracy": 0.74, "val_accuracy": 0.1005})
    watch.on_epoch_end(2, {"accuracy": 0.80, "val_accuracy": 0.1})
    assert len(said) == 1 and said[0].startswith("validation accuracy 0.101 sits at chance (0.100 for 10 classes) "
                                                 "while training accuracy reached 0.740")
    assert "BatchNormalization's moving statistics" in said[0]


def test_learning_models_and_binary_outputs_are_left_alone():
    watch, said = _watch()
    watch.on_epoch_end(1, {"accuracy": 0.74, "val_accuracy": 0.6})  # it generalises
    watch.on_epoch_end(2, {"accuracy": 0.2, "val_accuracy": 0.1})  # it has not learned yet either
    one_unit, said_one = _watch(units=1)  # a sigmoid: chance is not 1 / units
    one_unit.on_epoch_end(1, {"accuracy": 0.9, "val_accuracy": 0.5})
    assert said == [] and said_one == [] and one_unit.chance is None
