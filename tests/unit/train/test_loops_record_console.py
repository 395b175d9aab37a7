"""What each loop supports, the run record's flat form, and the console's verbosity."""

import io

import pytest

from tftrain.config import RecipeConfig
from tftrain.errors import ConfigError
from tftrain.train import FitLoop, MultiWorkerLoop, ParameterServerLoop, RunRecord, loop_for
from tftrain.train.console import Console


def test_loop_for_each_strategy():
    assert type(loop_for("mirrored")) is FitLoop and type(loop_for("default")) is FitLoop
    assert isinstance(loop_for("multi_worker_mirrored"), MultiWorkerLoop)
    ps = loop_for("parameter_server")
    assert isinstance(ps, ParameterServerLoop)
    assert (ps.per_step_hooks, ps.times_execution, ps.in_process_search) == (False, False, False)


@pytest.mark.parametrize("strategy, flags, message", [
    ("multi_worker_mirrored", {"tune": 1}, "keras-tuner runs each trial in one process"),
    ("multi_worker_mirrored", {"batch_size": "auto"}, "--batch-size auto searches in one process"),
    ("parameter_server", {"profile": "1,3"}, "--profile needs per-step hooks"),
    ("parameter_server", {"execution": "xla"}, "execution='xla' is not available with the parameter-server"),
    ("default", {"tune": 1, "batch_size": "auto"}, "--tune searches the batch size itself"),
])
def test_loops_refuse_what_they_cannot_do(strategy, flags, message):
    cfg = RecipeConfig().override({"strategy": strategy, **flags})
    with pytest.raises(ConfigError, match=message):
        loop_for(strategy).check(cfg)


def test_what_each_loop_does_besides_fit():
    import types

    fit, mwms, ps = FitLoop(), MultiWorkerLoop(), ParameterServerLoop()
    assert (fit.checks_input, fit.needs_steps_per_epoch) == (True, False)
    assert (mwms.checks_input, mwms.needs_steps_per_epoch) == (False, True)
    assert (ps.checks_input, ps.needs_steps_per_epoch) == (False, True)
    worker, chief = types.SimpleNamespace(task_type="worker"), types.SimpleNamespace(task_type="chief")
    assert ps.serves(worker) and not ps.serves(chief) and not fit.serves(worker)


def test_fit_loop_accepts_every_flag_alone():
    for flags in ({"tune": 2}, {"batch_size": "auto"}, {"profile": "1,3"}, {"execution": "xla"}):
        FitLoop().check(RecipeConfig().override(flags))


def _record(**kw):
    base = dict(task="t", run_dir="r", test={"loss": 0.5, "accuracy": 0.75}, history={"loss": [1.0]}, epochs=1,
                epochs_trained=1, resumed_from_epoch=0, train_examples=10, test_examples=5, steps_per_epoch=2,
                global_batch_size=4, per_replica_batch_size=4, wall_time_s=1.0, fit_time_s=0.5,
                examples_per_sec=16.0, execution="graph", execution_requested="auto", execution_choice=None,
                runtime={"replicas": 1}, hparams={"width": 3}, seed=None, argv=[], versions={},
                learning_rate=None, lr_schedule="constant", extras={"throughput": None})
    base.update(kw)
    return RunRecord(**base)


def test_record_flattens_test_results_runtime_hyperparameters_and_extras():
    flat = _record().to_dict()
    assert flat["test_loss"] == 0.5 and flat["test_accuracy"] == 0.75 and flat["test"] == {"loss": 0.5, "accuracy": 0.75}
    assert flat["replicas"] == 1 and flat["width"] == 3 and "throughput" in flat and flat["recipe"] == "t"
    assert "runtime" not in flat and "extras" not in flat
    assert "test_loss" not in _record(test=None).to_dict()


def test_console_is_silent_at_verbose_0_except_for_errors():
    out, err = io.StringIO(), io.StringIO()
    quiet = Console(0, out, err)
    quiet.section("x"), quiet.line("y"), quiet.warn("z"), quiet.error("boom")
    assert out.getvalue() == "" and err.getvalue() == "boom\n"
    loud = Console(1, out, err)
    loud.section("plan"), loud.lines(["a", "b"]), loud.warn("careful")
    assert out.getvalue() == "== plan ==\na\nb\n" and err.getvalue().endswith("warning: careful\n")


def test_progress_is_one_line_per_epoch_off_a_terminal_and_a_capped_bar_on_one():
    import io

    import keras
    import numpy as np

    from tftrain.train.console import keras_progress

    assert keras_progress(1, io.StringIO()) == (2, [])  # a file or pipe: no control characters
    assert keras_progress(0, io.StringIO()) == (0, []) and keras_progress(2, io.StringIO()) == (2, [])

    class Tty(io.StringIO):
        def isatty(self):
            return True

    verbose, (bar,) = keras_progress(1, Tty())
    assert verbose == 1 and isinstance(bar, keras.callbacks.ProgbarLogger)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", steps_per_execution=8)
    model.fit(np.ones((32, 2)), np.ones((32, 1)), batch_size=8, epochs=1, callbacks=[bar], verbose=1)
    assert bar.seen == 4  # 4 steps, not the execution's nominal 8 (keras-team/keras#20861)


def test_multi_worker_loop_runs_executions_that_divide_the_epoch():
    # Keras runs whole executions on endless data: 117 steps at 8 per execution would run 120.
    assert MultiWorkerLoop().steps_per_execution_for(8, 117) == 3
    assert MultiWorkerLoop().steps_per_execution_for(4, 2) == 2
    assert MultiWorkerLoop().steps_per_execution_for(8, 16) == 8
    assert FitLoop().steps_per_execution_for(8, 117) == 8  # its data ends each epoch


def test_each_loop_says_its_own_reason_for_refusing_a_search():
    from tftrain.config import RecipeConfig, RuntimeConfig, TrainConfig
    from tftrain.errors import ConfigError
    from tftrain.train.loops import loop_for

    for strategy, reason in (("multi_worker_mirrored", "in lockstep"), ("parameter_server", "asynchronously")):
        cfg = RecipeConfig(runtime=RuntimeConfig(strategy=strategy), train=TrainConfig(tune=2))
        with pytest.raises(ConfigError) as refused:
            loop_for(strategy).check(cfg)
        assert f"{strategy}: " in str(refused.value) and reason in str(refused.value)
    assert "lockstep" not in loop_for("parameter_server").no_search_reason  # its workers are asynchronous


def test_the_result_line_of_a_resume_with_nothing_left_says_why():
    from types import SimpleNamespace

    from tftrain.train.reporting import _result_line

    record = SimpleNamespace(test={"loss": 0.5}, examples_per_sec=None, epochs_trained=0, resumed_from_epoch=3,
                             epochs=3, wall_time_s=1.0)
    assert _result_line(record) == ("test loss 0.5000; nothing left to train (the checkpoint held every epoch); "
                                    "wall time 1.0 s")
    record.resumed_from_epoch = 2  # fewer than asked: the restored run had stopped early
    assert "nothing left to train (early stopping had ended the run)" in _result_line(record)
