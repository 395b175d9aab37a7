"""PreemptionWatch: SIGTERM, SIGUSR1 and SIGHUP become a request while open; the previous handlers come back."""

import os
import signal

import pytest

from tftrain.callbacks import PreemptionWatch
from tftrain.callbacks.preemption import SIGNALS
from tftrain.errors import Preempted


def test_each_signal_is_a_request_while_training_polls_and_later_ones_are_ignored_on_the_way_out():
    before = {s: signal.getsignal(s) for s in SIGNALS}
    with PreemptionWatch():
        pass
    assert {s: signal.getsignal(s) for s in before} == before  # no signal: the handlers come back
    try:
        for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
            with PreemptionWatch() as watch, watch.polling(stop_after=False):
                assert watch.requested() is None
                os.kill(os.getpid(), signum)  # handled at once, in this (the main) thread
                assert watch.requested() == signum
            assert all(signal.getsignal(s) == signal.SIG_IGN for s in SIGNALS)  # the process is ending on it
            os.kill(os.getpid(), signal.SIGTERM)  # a second notice does not kill it
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def test_outside_training_a_signal_stops_at_once_naming_the_phase():
    with PreemptionWatch() as watch:
        watch.phase = "evaluation"
        with pytest.raises(Preempted, match="^stopped by SIGHUP during evaluation$") as stopped:
            os.kill(os.getpid(), signal.SIGHUP)
        assert stopped.value.signum == signal.SIGHUP


def test_a_write_under_way_finishes_before_the_stop_and_a_second_signal_waits_for_it():
    written = []
    with PreemptionWatch() as watch:
        watch.phase = "saving the model"
        with pytest.raises(Preempted, match="stopped by SIGTERM during saving the model"):
            with watch.holding():
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGTERM)  # a second notice: still waits
                written.append("model.keras")
        assert written == ["model.keras"]
        os.kill(os.getpid(), signal.SIGTERM)  # after the stop was raised: nothing more is raised


def test_ctrl_c_is_a_keyboard_interrupt_until_a_stop_is_on_its_way_then_it_waits_for_its_save(capsys):
    written = []
    with PreemptionWatch() as watch:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        watch.phase = "training"
        with pytest.raises(Preempted, match="stopped by SIGTERM during training"):
            with watch.holding():
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C after the scheduler's notice: the save goes on
                written.append("checkpoint")
        assert written == ["checkpoint"]
        assert capsys.readouterr().err == ("Ctrl-C: the run stops for SIGTERM once its checkpoint is saved; Ctrl-C "
                                           "again stops at once\n")
        with pytest.raises(KeyboardInterrupt):  # the second: at once
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C is the user's again


def test_a_signal_after_the_loop_s_last_check_stops_on_leaving_and_a_plain_fit_keeps_its_checkpoint(tmp_path):
    import keras
    import numpy as np

    from tftrain.callbacks import StepBackup

    class SignalAtTheEnd(keras.callbacks.Callback):  # the notice lands after the last batch's check (in a slow upload)
        def on_train_end(self, logs=None):
            os.kill(os.getpid(), signal.SIGTERM)

    def fit(*callbacks, last=False):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        backup = StepBackup(tmp_path / "backup", stop_requested=watch.requested)
        return model, model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0,
                                callbacks=[backup, *callbacks] if last else [*callbacks, backup])

    x = np.random.default_rng(0).standard_normal((32, 4)).astype("float32")
    before = {s: signal.getsignal(s) for s in SIGNALS}
    try:
        with pytest.raises(Preempted, match="^stopped by SIGTERM during training$"):
            with PreemptionWatch() as watch, watch.polling():
                fit(SignalAtTheEnd())
        with PreemptionWatch() as watch, watch.polling():  # the rerun: every epoch was done
            model, history = fit()
        assert history.epoch == [] and int(model.optimizer.iterations) == 8
        assert not (tmp_path / "backup").exists()  # deleted once a fit ended without a stop
        with PreemptionWatch() as watch, watch.polling():  # a notice after the backup was removed: nothing to save
            model, history = fit(SignalAtTheEnd(), last=True)
        assert history.epoch == [0, 1] and signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def test_a_stop_at_an_epoch_s_end_lets_the_callbacks_after_the_backup_have_that_epoch(tmp_path):
    import keras
    import numpy as np

    from tftrain.callbacks import StepBackup

    class Logged(keras.callbacks.Callback):  # TensorBoard, MLflow or the user's, listed after the backup
        epochs = []

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.append(epoch)

    requested = []

    class Notice(keras.callbacks.Callback):  # the notice comes during epoch 2's last batch
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations) == 8:
                requested.append(signal.SIGTERM)

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x = np.random.default_rng(0).standard_normal((32, 4)).astype("float32")
    backup = StepBackup(tmp_path / "backup", stop_requested=lambda: requested[0] if requested else None)
    logged = Logged()
    with pytest.raises(Preempted, match=r"checkpoint saved at the end of epoch 2 \(optimizer step 8\)"):
        model.fit(x, x[:, :1], batch_size=8, epochs=4, verbose=0, callbacks=[Notice(), backup, logged])
    assert logged.epochs == [0, 1]
