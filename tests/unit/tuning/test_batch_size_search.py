"""tftrain.tuning.search: the batch-size search with fake trials (no TensorFlow)."""

import pytest

from tftrain.errors import BatchSizeSearchError, ConfigError
from tftrain.tuning.search import Trial, best_throughput_trial, search_batch_size


def fake_oom_above(threshold, rate=lambda b: float(b)):
    """A trial function: OOM above `threshold`, else fits with examples/sec = rate(b)."""
    calls = []

    def run(batch_size):
        calls.append(batch_size)
        if batch_size > threshold:
            return Trial(batch_size, "oom", note="fake OOM")
        return Trial(batch_size, "ok", examples_per_sec=rate(batch_size))

    run.calls = calls
    return run


def test_power_mode_finds_the_largest_power_of_two_under_the_threshold():
    run = fake_oom_above(1000)
    result = search_batch_size(run, mode="power", objective="largest", init_val=32)
    assert result.batch_size == 512 and result.largest_fitting == 512
    assert run.calls == [32, 64, 128, 256, 512, 1024]
    assert result.limit == "failure"
    assert [t.status for t in result.trials][-1] == "oom"


def test_binsearch_mode_finds_the_threshold_then_takes_the_margin():
    run = fake_oom_above(1000)
    exact = search_batch_size(run, mode="binsearch", objective="largest", init_val=32, margin=0.0)
    assert exact.batch_size == 1000 and exact.largest_tried_ok == 1000
    with_margin = search_batch_size(fake_oom_above(1000), mode="binsearch", objective="largest", margin=0.05)
    assert with_margin.largest_tried_ok == 1000 and with_margin.batch_size == 950


def test_binsearch_that_reaches_max_val_without_a_failure_takes_it_whole():
    result = search_batch_size(fake_oom_above(10_000), mode="binsearch", objective="largest", init_val=32,
                               max_val=256, margin=0.05)
    assert result.limit == "max_val" and result.batch_size == result.largest_fitting == 256  # a size it tried


def test_accumulation_is_told_why_the_target_was_not_trained_at_once():
    from tftrain.tuning.batch_size import BatchSizeResult

    common = dict(batch_size=256, objective="largest", mode="power", trials=(Trial(256, "ok"),), best_throughput=256,
                  best_examples_per_sec=None, largest_fitting=256, largest_tried_ok=256, target_batch_size=4096,
                  micro_batch_size=256, gradient_accumulation_steps=16)
    assert "4096 asked for was not tried (the search ended by max_val): accumulate 16 micro-batches of 256 " \
        "(effective 4096; batch_size=256, gradient_accumulation_steps=16, or --batch-size 256 " \
        "--gradient-accumulation-steps 16)" in BatchSizeResult(limit="max_val", **common).describe()
    assert "4096 asked for does not fit" in BatchSizeResult(limit="failure", **common).describe()


def test_binsearch_respects_multiple_of_the_replica_count():
    result = search_batch_size(
        fake_oom_above(1000), mode="binsearch", objective="largest", init_val=32, margin=0.0, multiple_of=8
    )
    assert result.batch_size == 1000  # 1000 = 125 x 8
    odd = search_batch_size(
        fake_oom_above(999), mode="binsearch", objective="largest", init_val=32, margin=0.0, multiple_of=8
    )
    assert odd.batch_size == 992
    assert all(t.batch_size % 8 == 0 for t in odd.trials)


def test_throughput_objective_stops_on_a_plateau_and_prefers_the_smaller_batch():
    run = fake_oom_above(10**9, rate=lambda b: float(min(b, 256)) * 100)
    result = search_batch_size(run, objective="throughput", init_val=32, min_gain=0.05)
    assert result.limit == "plateau"
    assert run.calls == [32, 64, 128, 256, 512, 1024]  # 512 and 1024 gained < 5%: stop growing
    assert result.batch_size == 256 == result.best_throughput
    assert result.largest_fitting is None  # the memory limit was not searched
    impatient = fake_oom_above(10**9, rate=lambda b: float(min(b, 256)) * 100)
    assert search_batch_size(impatient, init_val=32, patience=1).batch_size == 256
    assert impatient.calls == [32, 64, 128, 256, 512]


def test_one_slow_trial_does_not_end_a_throughput_search():
    rates = {32: 1000.0, 64: 500.0, 128: 3000.0, 256: 3050.0, 512: 3000.0}  # 64 hit a busy moment
    run = fake_oom_above(10**9, rate=lambda b: rates.get(b, 3000.0))
    result = search_batch_size(run, init_val=32)
    assert run.calls == [32, 64, 128, 256, 512]
    assert result.batch_size == 128


def test_max_val_caps_growth():
    result = search_batch_size(fake_oom_above(10**9), objective="largest", init_val=32, max_val=100)
    assert [t.batch_size for t in result.trials] == [32, 64, 100]
    assert result.batch_size == 100 and result.limit == "max_val"


def test_init_val_too_large_shrinks_until_one_fits():
    run = fake_oom_above(100)
    result = search_batch_size(run, mode="binsearch", objective="largest", init_val=512, margin=0.0)
    assert run.calls[:4] == [512, 256, 128, 64]
    assert result.batch_size == 100


def test_nothing_fits_raises_with_the_trials():
    with pytest.raises(BatchSizeSearchError, match=r"No batch size fits: tried 4 \(oom\), 2 \(oom\), 1 \(oom\)"):
        search_batch_size(fake_oom_above(0), init_val=4)


def test_max_trials_bounds_the_search():
    run = fake_oom_above(10**9)
    result = search_batch_size(run, objective="largest", init_val=1, max_trials=3)
    assert len(run.calls) == 3 and result.limit == "max_trials"


def test_timeouts_and_budget_overruns_end_growth_like_oom():
    def run(b):
        return Trial(b, "ok", examples_per_sec=float(b)) if b <= 64 else Trial(b, "timeout")

    result = search_batch_size(run, objective="largest", init_val=16)
    assert result.batch_size == 64 and result.limit == "failure"


def test_best_throughput_trial_picks_the_smallest_on_the_plateau():
    trials = [Trial(b, "ok", examples_per_sec=r) for b, r in ((64, 500.0), (128, 1000.0), (256, 1040.0))]
    assert best_throughput_trial(trials, 0.05).batch_size == 128
    assert best_throughput_trial(trials, 0.0).batch_size == 256


@pytest.mark.parametrize(
    "kwargs",
    [{"mode": "doubling"}, {"objective": "speed"}, {"init_val": 0}, {"max_val": 8, "init_val": 16},
     {"margin": 1.0}, {"min_gain": -0.1}, {"init_val": 30, "multiple_of": 8}, {"patience": 0}],
)
def test_invalid_arguments_raise_config_error(kwargs):
    with pytest.raises(ConfigError):
        search_batch_size(fake_oom_above(100), **kwargs)


@pytest.mark.parametrize("target, largest, multiple_of, expected", [
    (1024, 200, 8, (128, 8)),  # 1024 / 6 and / 7 are not whole multiples of 8; / 8 is
    (1000, 300, 8, (200, 5)),  # 250 (4 steps) is not a multiple of 8
    (128, 200, 8, (128, 1)),  # fits: no accumulation
    (97, 40, 1, (33, 3)),  # prime: no exact split within 2x the fewest steps; 3 x 33 = 99
])
def test_propose_accumulation_splits_a_batch_that_does_not_fit(target, largest, multiple_of, expected):
    from tftrain.tuning.search import propose_accumulation

    micro, steps = propose_accumulation(target, largest, multiple_of)
    assert (micro, steps) == expected
    assert micro <= largest and micro % multiple_of == 0 and micro * steps >= target
