"""ProfilerWindow / ProfileSteps: the window logic alone, then real traces read back."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.profile_traces import event_counts, read_xspace, stat_values, step_markers
from tftrain.callbacks import ProfilerWindow, ProfileSteps, profile_steps, profiler
from tftrain.callbacks._trace_steps import group_steps_by_markers, step_marker_name
from tftrain.callbacks.profile_steps import StepWindow, check_window_fits
from tftrain.errors import ConfigError, ProfileNotWritten, ProfilerError


# -- the window alone ------------------------------------------------------------

def run_window(window, executions):
    """Feeds execution sizes to a StepWindow; returns (start, stop) events."""
    done, events = 0, []
    for steps in executions:
        if window.should_start(done, steps):
            window.mark_started(done)
            events.append(("start", done))
        done += steps
        if window.should_stop(done):
            window.mark_stopped(done)
            events.append(("stop", done))
    return events


def test_step_window_aligned_with_steps_per_execution():
    window = StepWindow(4, 12)
    assert run_window(window, [4] * 5) == [("start", 4), ("stop", 12)]
    assert window.captured == (4, 12)


def test_step_window_widens_to_execution_boundaries():
    window = StepWindow(5, 6)
    run_window(window, [4] * 5)
    assert window.captured == (4, 8)


def test_step_window_one_step_executions_and_partial_last_execution():
    assert run_window(StepWindow(2, 3), [1] * 5) == [("start", 2), ("stop", 3)]
    window = StepWindow(8, 20)
    run_window(window, [4, 4, 2])  # training ends inside the window
    assert window.active and window.started_at == 8


def test_step_window_never_reached():
    window = StepWindow(50, 60)
    run_window(window, [4] * 5)
    assert window.started_at is None and window.captured is None


@pytest.mark.parametrize("start, stop", [(-1, 3), (5, 5), (6, 2), (1.5, 3)])
def test_step_window_rejects_bad_windows(start, stop):
    with pytest.raises(ProfilerError, match="window"):
        StepWindow(start, stop)


def test_profiler_errors_are_config_errors():
    assert issubclass(ProfilerError, ConfigError)


def test_check_window_fits_names_the_run_length():
    check_window_fits(10, 15, 11)
    check_window_fits(10, 15, None)
    with pytest.raises(ProfilerError, match=r"runs 8 optimizer step\(s\).*--profile 2,7"):
        check_window_fits(10, 15, 8)


# -- real traces -------------------------------------------------------------------

def small_model(steps_per_execution=1):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
    # Plain SGD: one AssignSubVariableOp per trainable variable per optimizer step.
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=steps_per_execution)
    return model


def small_dataset(batches=5, batch_size=16):
    x = np.random.default_rng(0).random((batches * batch_size, 4)).astype("float32")
    y = (x[:, 0] > 0.5).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size, drop_remainder=True)


def optimizer_steps_in_trace(space) -> int:
    """Optimizer steps in a trace: SGD updates each of the 4 variables once per step."""
    counts = event_counts(space)
    updates = {name: n for name, n in counts.items() if "/sgd" in name and name.endswith(":AssignSubVariableOp")}
    assert len(updates) == 4, updates  # 2 kernels + 2 biases
    (steps,) = set(updates.values())
    return steps


def test_window_under_steps_per_execution_traces_exactly_the_requested_steps(tmp_path):
    model = small_model(steps_per_execution=4)
    window = ProfilerWindow(tmp_path, start=4, stop=12, verbose=0)
    # 8 steps per epoch = 2 executions of 4; the window spans the epoch boundary at step 8.
    model.fit(small_dataset(batches=8), epochs=2, callbacks=[window], verbose=0, shuffle=False)
    assert window.captured == (4, 12)
    (trace,) = window.trace_files
    assert trace.name.endswith(".xplane.pb")
    assert trace.parent.parent == tmp_path / "train" / "plugins" / "profile"
    space = read_xspace(trace)
    assert optimizer_steps_in_trace(space) == 8  # steps 4..11: no more, no fewer
    # two executions of 4 steps, each one marker that says so
    assert step_markers(space, with_names=True) == [(4, "train(4 steps)"), (8, "train(4 steps)")]
    iter_nums = stat_values(space, "iter_num")
    assert iter_nums and set(iter_nums) == {0}  # the while-loop iterations no longer group the trace


def test_step_marker_names():
    assert step_marker_name(1) == "train"
    assert step_marker_name(8) == "train(8 steps)"
    assert "/" not in step_marker_name(8)  # the Profile tab takes "train..." without "/" as a step marker


def test_group_steps_by_markers_rewrites_only_loop_iterations(tmp_path):
    fits = {}
    for spe in (4, 1):  # raw traces: without markers ProfileSteps leaves the file as TensorFlow wrote it
        window = ProfilerWindow(tmp_path / f"spe{spe}", start=spe, stop=2 * spe, step_markers=False, verbose=0)
        small_model(steps_per_execution=spe).fit(small_dataset(batches=8), epochs=1, callbacks=[window], verbose=0,
                                                   shuffle=False)
        fits[spe] = window.trace_files[0]
    looped = fits[4]
    before = read_xspace(looped)
    assert any(stat_values(before, "iter_num"))  # Keras ran the 4 steps as tf.while_loop iterations
    assert group_steps_by_markers(looped) == sum(1 for v in stat_values(before, "iter_num") if v)
    after = read_xspace(looped)
    assert set(stat_values(after, "iter_num")) == {0}
    assert event_counts(after) == event_counts(before)  # nothing else changed
    assert group_steps_by_markers(looped) == 0  # idempotent
    plain = fits[1].read_bytes()
    assert group_steps_by_markers(fits[1]) == 0 and fits[1].read_bytes() == plain  # no loop: untouched


def test_capture_line_says_one_overview_step_is_one_execution(tmp_path, capsys):
    window = ProfilerWindow(tmp_path, start=4, stop=8, verbose=1)
    small_model(steps_per_execution=4).fit(small_dataset(batches=8), epochs=1, callbacks=[window], verbose=0,
                                         shuffle=False)
    out = capsys.readouterr().out
    assert "traced steps [4, 8)" in out
    assert "one step per execution of 4 steps ('train(4 steps) 4' = steps 4..7)" in out
    assert "divide its step time by 4" in out


def test_window_with_one_step_executions(tmp_path):
    model = small_model()
    window = ProfilerWindow(tmp_path, start=2, stop=5, verbose=0)
    model.fit(small_dataset(batches=8), epochs=1, callbacks=[window], verbose=0, shuffle=False)
    assert window.captured == (2, 5)
    space = read_xspace(window.trace_files[0])
    assert optimizer_steps_in_trace(space) == 3
    assert step_markers(space) == [2, 3, 4]


def test_resumed_fit_counts_the_models_steps_and_does_not_trace_a_passed_window_again(tmp_path):
    model = small_model()
    model.fit(small_dataset(batches=6), epochs=1, verbose=0, shuffle=False)  # the attempt before: steps 0..5
    said = []
    passed = ProfilerWindow(tmp_path / "a", start=2, stop=5, verbose=0, resumes=True, say=said.append)
    model.fit(small_dataset(batches=6), epochs=2, initial_epoch=1, callbacks=[passed], verbose=0, shuffle=False)
    assert passed.captured is None and passed.passed == 6 and not passed.trace_files
    assert said == ["profile: steps [2, 5) ran before step 6, where this run resumed; not traced again"]
    said.clear()
    inside = ProfilerWindow(tmp_path / "b", start=10, stop=14, verbose=0, resumes=True, say=said.append)
    model.fit(small_dataset(batches=6), epochs=3, initial_epoch=2, callbacks=[inside], verbose=0,
              shuffle=False)  # steps 12..17
    assert inside.captured == (12, 14)  # labelled with the model's steps, not this fit's
    assert said == ["profile: the run resumed at step 12, inside the window [10, 14); tracing steps [12, 14) (the "
                    "steps before are in the attempt before's trace, if it finished one)"]  # not steps_per_execution
    assert optimizer_steps_in_trace(read_xspace(inside.trace_files[0])) == 2


def test_window_past_the_end_of_training_fails_before_training(tmp_path):
    model = small_model()
    window = ProfilerWindow(tmp_path, start=20, stop=25, verbose=0)
    with pytest.raises(ProfilerError, match=r"starts after the end of training, which runs 10 optimizer step"):
        model.fit(small_dataset(batches=5), epochs=2, callbacks=[window], verbose=0, shuffle=False)
    assert int(model.optimizer.iterations.numpy()) == 0  # refused before the first step
    assert not (tmp_path / "train").exists()


def test_a_window_past_the_end_of_a_fit_resumed_by_hand_fails_before_training(tmp_path):
    model = small_model()
    window = ProfilerWindow(tmp_path, start=8, stop=10, verbose=0)
    with pytest.raises(ProfilerError, match=r"starts after the end of training, which runs 5 optimizer step"):
        model.fit(small_dataset(batches=5), epochs=3, initial_epoch=2, callbacks=[window], verbose=0, shuffle=False)
    assert int(model.optimizer.iterations.numpy()) == 0


def test_two_captures_within_one_second_keep_both_traces(tmp_path):
    model = small_model()
    traces = []
    for _ in range(2):  # the second fit's window starts well within the first capture's second
        window = ProfilerWindow(tmp_path, start=0, stop=1, verbose=0)
        model.fit(small_dataset(batches=2), epochs=1, callbacks=[window], verbose=0, shuffle=False)
        traces += window.trace_files
    assert len(set(traces)) == 2 and all(path.is_file() for path in traces)


def test_window_never_reached_on_data_of_unknown_length(tmp_path):
    ds = small_dataset(batches=3).filter(lambda x, y: True)  # unknown length: Keras cannot tell up front
    model = small_model()
    window = ProfilerWindow(tmp_path, start=10, stop=12, verbose=0)
    with pytest.raises(ProfilerError, match=r"never reached: training ran only 3 optimizer step"):
        model.fit(ds, epochs=1, callbacks=[window], verbose=0, shuffle=False)


def test_training_that_ends_inside_the_window_keeps_the_partial_trace(tmp_path):
    ds = small_dataset(batches=4).filter(lambda x, y: True)
    model = small_model()
    window = ProfilerWindow(tmp_path, start=2, stop=10, verbose=0)
    with pytest.warns(UserWarning, match=r"inside the profile window"):
        model.fit(ds, epochs=1, callbacks=[window], verbose=0, shuffle=False)
    assert window.captured == (2, 4)
    assert optimizer_steps_in_trace(read_xspace(window.trace_files[0])) == 2


def test_custom_training_loop_with_profile_steps(tmp_path):
    model = small_model()
    optimizer = keras.optimizers.SGD()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    with ProfileSteps(tmp_path, start=2, stop=4, verbose=0) as prof:
        for x, y in small_dataset(batches=6):
            with prof.step():
                train_step(x, y)
    assert prof.window.captured == (2, 4)
    assert step_markers(read_xspace(prof.trace_files[0])) == [2, 3]


def test_custom_loop_shorter_than_the_window_raises(tmp_path):
    with pytest.raises(ProfilerError, match="never reached"):
        with ProfileSteps(tmp_path, start=5, stop=6, verbose=0) as prof:
            for _ in range(3):
                with prof.step():
                    pass


def test_missing_profile_plugin_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(profile_steps, "profile_plugin_installed", lambda: False)
    with pytest.raises(ProfilerError, match="pip install tensorboard-plugin-profile"):
        ProfilerWindow(tmp_path)
    ProfilerWindow(tmp_path, require_plugin=False)  # capture anyway, view elsewhere


def test_trace_without_xplane_file_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(profile_steps, "xplane_files", lambda log_dir: [])
    with pytest.raises(ProfileNotWritten, match=r"wrote no \.xplane\.pb"):  # a failed run (exit 1), not bad input
        with ProfileSteps(tmp_path, start=0, stop=1, verbose=0) as prof:
            with prof.step():
                tf.constant(1.0) + 1.0


def test_second_profiler_session_is_refused_clearly(tmp_path):
    tf.profiler.experimental.start(str(tmp_path / "other"))
    try:
        prof = ProfileSteps(tmp_path, start=0, stop=1, verbose=0)
        with pytest.raises(ProfilerError, match="another profiling session is running"):
            prof.begin(1)
    finally:
        tf.profiler.experimental.stop()


def test_on_demand_server_requires_acknowledging_all_interfaces():
    with pytest.raises(ProfilerError, match="cannot be bound to 127.0.0.1"):
        ProfilerWindow.on_demand(6009)
    with pytest.raises(ProfilerError, match="port"):
        profiler.start_profiler_server(0, listen_on_all_interfaces=True)


def test_a_window_widened_at_either_end_says_so_once(tmp_path):
    model = small_model(steps_per_execution=4)
    window = ProfilerWindow(tmp_path, start=5, stop=10, verbose=0)  # widened to the executions [4, 8), [8, 12)
    with pytest.warns(UserWarning) as caught:
        model.fit(small_dataset(batches=8), epochs=2, callbacks=[window], verbose=0, shuffle=False)
    messages = [str(w.message) for w in caught if "profile:" in str(w.message)]
    assert messages == ["profile: steps [5, 10) fall inside executions of 4 steps (steps_per_execution); "
                        "tracing steps [4, 12)."], messages
    assert window.captured == (4, 12)
    said = []
    again = ProfilerWindow(tmp_path / "again", start=5, stop=10, verbose=0, say=said.append)  # e.g. a console
    small_model(steps_per_execution=4).fit(small_dataset(batches=8), epochs=2, callbacks=[again], verbose=0,
                                           shuffle=False)
    assert len(said) == 1 and "tracing steps [4, 12)" in said[0]


def test_on_demand_is_its_own_callback_holding_its_settings():
    from tftrain.callbacks import ProfilerServer

    server = ProfilerWindow.on_demand(6009, listen_on_all_interfaces=True, verbose=0)
    assert type(server) is ProfilerServer and (server.server_port, server.verbose) == (6009, 0)
    assert server.listen_on_all_interfaces is True
