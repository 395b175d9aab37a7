"""Models whose own `train_step` never calls them on the training features (keras.io's GAN and VAE shapes):
`Model.fit` trains them, so tftrain's build and sanity pass must not need `model(features)`."""

import numpy as np
import pytest

import tftrain

X = (np.random.default_rng(0).standard_normal((192, 4)) * 0.5 + 2).astype("float32")


def _gan_task(own_optimizer=False):
    import keras
    import tensorflow as tf

    class GAN(keras.Model):  # call() is the generator: noise in, samples out
        def __init__(self):
            super().__init__()
            self.own = keras.optimizers.get(own_optimizer if isinstance(own_optimizer, str) else "sgd") \
                if own_optimizer else None
            self.gen = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4)])
            self.disc = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            self.d_loss = keras.metrics.Mean(name="d_loss")
            self.bce = keras.losses.BinaryCrossentropy(from_logits=True)

        def call(self, z):
            return self.gen(z)

        @property
        def metrics(self):
            return [self.d_loss]

        def train_step(self, real):
            b = tf.shape(real)[0]
            with tf.GradientTape() as tape:
                fake = self.gen(tf.random.normal((b, 2)))
                loss = self.bce(tf.ones((b, 1)), self.disc(real)) + self.bce(tf.zeros((b, 1)), self.disc(fake))
            variables = self.trainable_weights
            (self.own or self.optimizer).apply_gradients(zip(tape.gradient(loss, variables), variables))
            self.d_loss.update_state(loss)
            return {"d_loss": self.d_loss.result()}

    class GanTask(tftrain.Task):
        name, num_train_examples = "gan", 192

        def build_model(self):
            model = GAN()
            model(tf.zeros((1, 2)))
            return model

        def compile_args(self, steps_per_epoch):
            return {"optimizer": "adam"}

        def train_data(self, global_batch_size, input_context=None):
            return tf.data.Dataset.from_tensor_slices(X).batch(global_batch_size, drop_remainder=True)

    return GanTask()


def _vae_task():
    import keras
    import tensorflow as tf

    class VAE(keras.Model):  # no call() at all
        def __init__(self):
            super().__init__()
            self.encoder = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4)])
            self.decoder = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4)])
            self.total = keras.metrics.Mean(name="loss")

        @property
        def metrics(self):
            return [self.total]

        def train_step(self, data):
            with tf.GradientTape() as tape:
                h = self.encoder(data)
                z = h[:, :2] + tf.exp(0.5 * h[:, 2:]) * tf.random.normal(tf.shape(h[:, :2]))
                loss = tf.reduce_mean(tf.square(data - self.decoder(z))) + 1e-3 * tf.reduce_mean(tf.square(h))
            self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_weights), self.trainable_weights))
            self.total.update_state(loss)
            return {"loss": self.total.result()}

    class VaeTask(tftrain.Task):
        name, num_train_examples = "vae", 192

        def build_model(self):
            return VAE()

        def compile_args(self, steps_per_epoch):
            return {"optimizer": "adam"}

        def train_data(self, global_batch_size, input_context=None):
            return tf.data.Dataset.from_tensor_slices(X).batch(global_batch_size, drop_remainder=True)

    return VaeTask()


@pytest.mark.slow
@pytest.mark.parametrize("make,key", [(_gan_task, "d_loss"), (_vae_task, "loss")])
def test_a_model_whose_own_step_does_not_call_it_on_the_features_trains(tmp_path, make, key):
    record = tftrain.Trainer(make(), epochs=2, batch_size=32, verbose=0, run_dir=str(tmp_path / "run")).fit()
    assert record.epochs_trained == 2 and len(record.history[key]) == 2
    assert all(np.isfinite(record.history[key])) and (tmp_path / "run" / "metrics.json").is_file()


def test_a_subclassed_model_that_does_not_take_the_features_is_refused_before_the_run_directory(tmp_path):
    import keras

    from tftrain.errors import ConfigError

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.body = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])

        def call(self, x):
            return self.body(x)

    task = tftrain.ArrayTask(Net, X, X[:, :1], loss="mse")  # 4 features for a model that takes 8
    with pytest.raises(ConfigError, match=r"^The model fails on a batch of the training features \(ValueError: Input "
                                          r"0 .* expected axis -1 of input shape to have value 8, but received input "
                                          r"with shape \(32, 4\)\)"):
        tftrain.Trainer(task, epochs=1, batch_size=32, verbose=0, run_dir=str(tmp_path / "run")).fit()
    assert not (tmp_path / "run").exists()


def test_one_line_names_the_cause_keras_wraps_a_layer_s_error_in():
    from tftrain.errors import one_line

    error = ValueError("Exception encountered when calling Sequential.call().\n\n\x1b[1mInput 0 of layer 'dense' is "
                       "incompatible with the layer: expected axis -1 to have value 8\x1b[0m\n\nArguments received by "
                       "Sequential.call():\n  • inputs=tf.Tensor(shape=(32, 7), dtype=float32)")
    assert one_line(error) == ("ValueError: Input 0 of layer 'dense' is incompatible with the layer: expected axis -1 "
                               "to have value 8")
    assert one_line(ValueError("plain")) == "ValueError: plain"


@pytest.mark.slow
def test_a_step_with_its_own_optimizer_is_told_that_loss_scaling_does_not_reach_it(tmp_path, capsys):
    record = tftrain.Trainer(_gan_task(own_optimizer=True), epochs=1, batch_size=32, precision="mixed_float16",
                             run_dir=str(tmp_path / "run")).fit()
    printed = capsys.readouterr()
    assert "warning: the model's train_step does not apply the compiled optimizer (its own optimizers?): the loss " \
        "scaling mixed_float16 needs does not reach them" in printed.err
    assert "the train_step's loss scaling" not in printed.out + printed.err and len(record.history["d_loss"]) == 1


def test_model_state_restores_the_optimizers_a_model_holds_besides_the_compiled_one():
    import keras

    from tftrain.runtime.execution_probe import ModelState, held_optimizers

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.own = keras.optimizers.Adam(0.1)
    model.own.build(model.trainable_variables)
    assert held_optimizers(model) == {"own": model.own}
    state = ModelState(model)
    model.own.apply_gradients([(np.ones(v.shape, "float32"), v) for v in model.trainable_variables])
    assert int(model.own.iterations.numpy()) == 1
    state.restore()
    assert int(model.own.iterations.numpy()) == 0
    assert all(not np.any(v.numpy()) for v in model.own.variables if "moment" in v.path or "velocity" in v.path)
    model.late = keras.optimizers.Adam(0.05)  # unbuilt: Keras builds it on its first step, slots and all
    state = ModelState(model)
    model.late.apply_gradients([(np.ones(v.shape, "float32"), v) for v in model.trainable_variables])
    state.restore()
    assert not model.late.built and model.late.get_config()["learning_rate"] == pytest.approx(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("own", ["adam", "sgd"])  # Adam's moments are built on its first step; SGD has none
def test_a_step_with_its_own_optimizer_counts_its_steps_and_says_what_a_resume_did_not_load(tmp_path, capsys, own):
    import keras

    class StopInEpoch2(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2 and self.model.own.iterations.numpy() > 6:
                raise KeyboardInterrupt

    run = dict(epochs=2, batch_size=32, precision="float32", run_dir=str(tmp_path / "run"), backup_every_steps=1)
    with pytest.raises(tftrain.Interrupted):
        tftrain.Trainer(_gan_task(own_optimizer=own), callbacks=[StopInEpoch2()], **run).fit()
    capsys.readouterr()
    record = tftrain.Trainer(_gan_task(own_optimizer=own), **run).fit()
    assert record.to_dict()["optimizer_steps"] == 2 * 6  # 192 examples: 6 steps an epoch
    printed = capsys.readouterr()
    afresh = ("resuming: the optimizers the model's train_step applies (own) are not built yet, so Keras loads none "
              "of their state")
    assert (afresh in printed.out) == (own == "adam") and "Skipping variable loading" not in printed.err


def test_model_state_finds_the_optimizers_a_model_holds_in_a_list_or_dict():
    import keras

    from tftrain.runtime.execution_probe import ModelState, held_optimizers

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.pair = [keras.optimizers.Adam(0.1), keras.optimizers.Adam(0.2)]
    model.named = {"critic": keras.optimizers.Adam(0.3)}
    model.pair[0].build(model.trainable_variables)
    held = held_optimizers(model)
    assert list(held) == ["pair[0]", "pair[1]", "named['critic']"] and held["named['critic']"] is model.named["critic"]
    state = ModelState(model)
    for optimizer in (model.pair[0], model.pair[1], model.named["critic"]):
        optimizer.apply_gradients([(np.ones(v.shape, "float32"), v) for v in model.trainable_variables])
    state.restore()
    assert int(model.pair[0].iterations.numpy()) == 0  # built before: its state is put back
    assert not model.pair[1].built and model.pair[1].get_config()["learning_rate"] == pytest.approx(0.2)
    assert not model.named["critic"].built and held_optimizers(model)["named['critic']"] is model.named["critic"]
    model.g_opt = model.pair[1]  # one optimizer kept in two places: both get the new one
    state = ModelState(model)
    model.g_opt.apply_gradients([(np.ones(v.shape, "float32"), v) for v in model.trainable_variables])
    state.restore()
    assert model.g_opt is model.pair[1] and not model.g_opt.built


def test_an_array_task_of_a_model_with_its_own_loss_needs_no_loss_argument(tmp_path):
    import keras

    class Regularised(keras.Model):  # its loss from add_loss, as compile(loss=None) allows
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(4)

        def call(self, x):
            out = self.dense(x)
            self.add_loss(keras.ops.mean(keras.ops.square(out - x)))
            return out

    task = tftrain.ArrayTask(Regularised, X, None, name="own_loss")
    record = tftrain.Trainer(task, epochs=1, verbose=0, seed=0, batch_size=32, run_dir=str(tmp_path / "run")).fit()
    assert record.epochs_trained == 1 and np.isfinite(record.history["loss"][-1])
