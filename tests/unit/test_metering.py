"""tftrain.metering: throughput and step-time math on synthetic timings (no TensorFlow)."""


import pytest

from tftrain import metering
from tftrain.metering import StepMeter, input_bound_verdict, percentile, time_batches


class FakeClock:
    """A clock that advances only when told to."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


def test_metering_imports_no_tensorflow():
    assert "tensorflow" not in metering.__dict__
    source = open(metering.__file__).read()
    assert "import tensorflow" not in source and "import keras" not in source


def test_percentile_matches_linear_interpolation():
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 90) == pytest.approx(9.1)
    assert percentile([7.0], 90) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_step_meter_shares_execution_time_between_its_steps():
    meter = StepMeter(batch_size=64, warmup_steps=4)
    meter.record(steps=4, seconds=5.0)  # first execution (tracing): warm-up
    meter.record(steps=4, seconds=0.4)
    meter.record(steps=4, seconds=0.8)
    meter.record(steps=2, seconds=0.2)  # last, partial execution of the epoch
    stats = meter.stats()
    assert stats.steps == 10
    assert stats.examples == 10 * 64
    assert stats.seconds == pytest.approx(1.4)
    assert stats.examples_per_sec == pytest.approx(640 / 1.4)
    # per-step times: 0.1 x4, 0.2 x4, 0.1 x2 -> median 0.1, p90 0.2
    assert stats.step_time_median_s == pytest.approx(0.1)
    assert stats.step_time_p90_s == pytest.approx(0.2)
    assert meter.total_steps == 14 and meter.measured_steps == 10


def test_step_meter_warmup_excludes_whole_executions_that_start_inside_it():
    meter = StepMeter(batch_size=1, warmup_steps=3)
    for seconds in (9.0, 9.0, 9.0, 1.0, 1.0):
        meter.record(1, seconds)
    assert meter.stats().steps == 2 and meter.stats().step_time_median_s == 1.0
    only_warmup = StepMeter(warmup_steps=10)
    only_warmup.record(4, 1.0)
    assert only_warmup.stats() is None


def test_step_meter_per_epoch_and_window():
    meter = StepMeter(batch_size=10, warmup_steps=0, window=3)
    meter.start_epoch(0)
    for _ in range(4):
        meter.record(1, 0.5)
    meter.start_epoch(1)
    for _ in range(3):
        meter.record(1, 0.25)
    assert meter.stats(epoch=0).examples_per_sec == pytest.approx(20.0)
    assert meter.stats(epoch=1).examples_per_sec == pytest.approx(40.0)
    assert meter.window_stats().steps == 3
    assert meter.window_stats().step_time_median_s == pytest.approx(0.25)


def test_step_meter_without_batch_size_reports_steps_only():
    meter = StepMeter(warmup_steps=0)
    meter.record(2, 1.0)
    stats = meter.stats()
    assert stats.examples is None and stats.examples_per_sec is None
    assert stats.steps_per_sec == pytest.approx(2.0)


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"warmup_steps": -1}, {"window": 0}])
def test_step_meter_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        StepMeter(**kwargs)


def test_time_batches_skips_warmup_and_averages():
    clock = FakeClock()

    def batches():
        clock.advance(5.0)  # iterator start-up and first batch
        yield 0
        for i in range(10):
            clock.advance(0.1)
            yield i

    assert time_batches(batches(), num_batches=4, warmup_batches=1, clock=clock) == pytest.approx(0.1)
    assert time_batches(iter([]), num_batches=3, clock=clock) is None


def test_input_bound_verdict_wording_and_threshold():
    bound = input_bound_verdict(0.03, 0.04)
    assert bound.input_bound and bound.input_fraction == pytest.approx(0.75)
    assert bound.verdict.startswith("input-bound: 75% of each step waits for data; try ")
    assert "prefetch" in bound.verdict
    free = input_bound_verdict(0.001, 0.01)
    assert not free.input_bound and free.verdict.startswith("not input-bound: ")
    assert "10%" in free.verdict
    assert input_bound_verdict(0.5, 0.1).input_fraction == 1.0  # capped
    assert input_bound_verdict(0.03, 0.1, threshold=0.25).input_bound
    with pytest.raises(ValueError):
        input_bound_verdict(0.1, 0.0)
    with pytest.raises(ValueError):
        input_bound_verdict(0.1, 0.1, threshold=0)


def test_reconcile_epoch_corrects_the_last_execution():
    meter = StepMeter(batch_size=8, warmup_steps=0)
    meter.start_epoch(0)
    for _ in range(3):
        meter.record(4, 0.4)  # nominal: the hooks say 4 steps each
    assert meter.reconcile_epoch(0, 10) == -2  # the data ran out: the last execution ran 2
    assert meter.total_steps == 10
    assert meter.step_times(0) == pytest.approx([0.1] * 8 + [0.2] * 2)
    meter.start_epoch(1)
    meter.record(4, 0.4)
    assert meter.reconcile_epoch(1, 4) == 0
    meter.start_epoch(2)
    meter.record(4, 0.4)
    meter.reconcile_epoch(2, 0)  # nothing really ran: the record goes
    assert meter.stats(epoch=2) is None and meter.total_steps == 14
