"""The batch-size search algorithm, free of TensorFlow (tested with fake trials).

`search_batch_size(run_trial, ...)` grows the batch size by doubling (`power`) and,
in `binsearch` mode, then bisects between the largest batch that fitted and the
smallest that did not. `run_trial(batch_size)` is supplied by the caller and
returns a `Trial`; `tftrain.tuning.find_batch_size` supplies one that trains a real
model for a few steps. The design follows PyTorch Lightning's batch-size scaler
(`tuner/batch_size_scaling.py`): the algorithm is a plain function, the callback
only wires hooks.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Tuple

from tftrain.errors import BatchSizeSearchError, ConfigError, check_int

MODES = ("power", "binsearch")
OBJECTIVES = ("throughput", "largest")

OK = "ok"
OOM = "oom"
OVER_BUDGET = "over_budget"
TIMEOUT = "timeout"
NO_DATA = "no_data"
STATUSES = (OK, OOM, OVER_BUDGET, TIMEOUT, NO_DATA)
"""Trial outcomes: fitted; out of device memory; over the memory budget (measured
or predicted); slower than the per-trial time limit; too few examples for one batch."""


@dataclasses.dataclass(frozen=True)
class Trial:
    """One batch size tried.

    Attributes:
        batch_size: global batch size tried.
        status: one of `STATUSES`; only `"ok"` counts as fitting.
        examples_per_sec: measured global examples/sec (None unless measured).
        step_time_s: median step time in seconds (None unless measured).
        peak_memory_bytes: memory the trial used above the search's baseline,
            in bytes (None when not measured).
        seconds: wall time of the trial, in seconds.
        note: free text (e.g. the error message of an OOM).
    """

    batch_size: int
    status: str
    examples_per_sec: Optional[float] = None
    step_time_s: Optional[float] = None
    peak_memory_bytes: Optional[int] = None
    seconds: float = 0.0
    note: str = ""

    @property
    def fits(self) -> bool:
        """True when the trial ran within memory and time."""
        return self.status == OK

    def to_dict(self) -> dict:
        """The trial as plain data (JSON-ready)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """Outcome of `search_batch_size`.

    Attributes:
        batch_size: the choice for the objective: `best_throughput` for
            `"throughput"`, `largest_fitting` for `"largest"`.
        largest_fitting: largest batch that fitted, less the safety margin in
            binsearch mode; None when the search stopped on a throughput plateau
            before finding the limit.
        largest_tried_ok: largest batch that fitted, before the margin.
        best_throughput: the smallest fitting batch whose examples/sec is
            within `min_gain` of the highest measured (see
            `best_throughput_trial`).
        best_examples_per_sec: its examples/sec.
        limit: what ended growth: "failure" (OOM, budget, time), "max_val",
            "plateau" (gain under `min_gain`) or "max_trials".
        mode, objective: as requested.
        trials: every `Trial`, in the order run.
    """

    batch_size: int
    largest_fitting: Optional[int]
    largest_tried_ok: int
    best_throughput: int
    best_examples_per_sec: Optional[float]
    limit: str
    mode: str
    objective: str
    trials: List[Trial]

    def to_dict(self) -> dict:
        """The result as plain data (JSON-ready)."""
        out = dataclasses.asdict(self)
        out["trials"] = [t.to_dict() for t in self.trials]
        return out


def _round_down(value: int, multiple: int) -> int:
    return (value // multiple) * multiple


def propose_accumulation(target: int, largest_fitting: int, multiple_of: int = 1) -> Tuple[int, int]:
    """A micro-batch that fits and the gradient accumulation steps that make up `target`.

    For a global batch `target` that does not fit in memory, with N0 =
    `ceil(target / largest_fitting)` the fewest steps that could work: the
    fewest steps N in [N0, 2 x N0] such that `target / N` is a whole multiple of
    `multiple_of` (the replica count) and at most `largest_fitting`, so N
    micro-batches give exactly `target` examples per optimizer step. When none
    divides, the fewest steps N whose micro-batch `target / N`, rounded up to a
    multiple of `multiple_of`, fits; their product exceeds `target` a little.

    Args:
        target: the global batch size wanted per optimizer step, >= 1.
        largest_fitting: the largest global batch size that fits, >= 1.
        multiple_of: micro-batches are multiples of this. Defaults to 1.

    Returns:
        `(micro_batch_size, accumulation_steps)`; `(target, 1)` when `target` fits.

    Example:
        >>> propose_accumulation(1024, 200, multiple_of=8)
        (128, 8)
    """
    if target <= largest_fitting:
        return target, 1
    largest_fitting = max(largest_fitting, multiple_of)
    fewest = -(-target // largest_fitting)
    for steps in range(fewest, 2 * fewest + 1):
        if target % steps == 0 and (target // steps) % multiple_of == 0:
            return target // steps, steps
    steps = fewest
    while -(-target // (steps * multiple_of)) * multiple_of > largest_fitting:
        steps += 1
    return -(-target // (steps * multiple_of)) * multiple_of, steps


def best_throughput_trial(trials: List[Trial], min_gain: float = 0.05) -> Trial:
    """The smallest batch size whose examples/sec is within `min_gain` of the best.

    A larger batch that is faster by less than `min_gain` (relative) is not worth
    its cost (fewer updates per epoch, more memory), and such small differences
    are within timing noise; so the smallest batch on the plateau wins.

    Args:
        trials: fitting trials (at least one).
        min_gain: relative tolerance, e.g. 0.05 for 5%. Defaults to 0.05.

    Returns:
        The chosen `Trial` (the largest batch when none has a measured rate).

    Example:
        >>> rates = {256: 900.0, 512: 1000.0, 1024: 1030.0}
        >>> best_throughput_trial([Trial(b, "ok", examples_per_sec=r) for b, r in rates.items()]).batch_size
        512
    """
    measured = [t for t in trials if t.examples_per_sec is not None]
    if not measured:
        return max(trials, key=lambda t: t.batch_size)
    top = max(t.examples_per_sec for t in measured)
    on_plateau = [t for t in measured if t.examples_per_sec * (1 + min_gain) >= top]
    return min(on_plateau, key=lambda t: t.batch_size)


def validate_search_args(mode, objective, init_val, max_val, max_trials, margin, min_gain, multiple_of) -> None:
    """Checks the search arguments; raises `ConfigError` naming the bad one."""
    if mode not in MODES:
        raise ConfigError(f"Invalid mode {mode!r}. Expected one of: {', '.join(MODES)}. Received: mode={mode!r}.")
    if objective not in OBJECTIVES:
        raise ConfigError(
            f"Invalid objective {objective!r}. Expected one of: {', '.join(OBJECTIVES)}. Received: objective={objective!r}."
        )
    for name, value in (("init_val", init_val), ("max_trials", max_trials), ("multiple_of", multiple_of)):
        check_int(value, name, error=ConfigError)
    if max_val is not None and (isinstance(max_val, bool) or not isinstance(max_val, int) or max_val < init_val):
        raise ConfigError(f"max_val must be an integer >= init_val ({init_val}) or None. Received: max_val={max_val!r}.")
    if not 0 <= margin < 1:
        raise ConfigError(f"margin must be in [0, 1). Received: margin={margin!r}.")
    if min_gain < 0:
        raise ConfigError(f"min_gain must be >= 0. Received: min_gain={min_gain!r}.")
    if init_val % multiple_of:
        raise ConfigError(
            f"init_val={init_val} is not a multiple of {multiple_of} (the replica count). "
            f"Pass init_val={max(multiple_of, _round_down(init_val, multiple_of))}."
        )


def search_batch_size(
    run_trial: Callable[[int], Trial],
    *,
    mode: str = "power",
    objective: str = "throughput",
    init_val: int = 32,
    max_val: Optional[int] = None,
    max_trials: int = 20,
    margin: float = 0.05,
    min_gain: float = 0.05,
    multiple_of: int = 1,
    patience: int = 2,
) -> SearchResult:
    """Searches the global batch size with caller-supplied trials.

    Growth: try `init_val`, then double (capped at `max_val`) while trials fit.
    With objective `"throughput"` growth also stops once `patience` trials in a
    row fail to beat the best examples/sec so far by `min_gain` (one slow trial
    on a busy machine does not end the search). If `init_val` itself
    does not fit, it halves instead until one fits.
    `binsearch` mode (objective `"largest"` only) then bisects between the largest
    fitting and the smallest failing batch until they are `multiple_of` apart,
    and takes `margin` off the result as a safety buffer (as Lightning does,
    margin applies only in binsearch mode). Every batch size tried is a multiple
    of `multiple_of` (the replica count, so the global batch splits evenly).

    Args:
        run_trial: function `batch_size -> Trial`.
        mode: `"power"` (doubling only) or `"binsearch"`. Defaults to "power".
        objective: `"throughput"` (best examples/sec) or `"largest"` (largest
            that fits). Defaults to "throughput".
        init_val: first batch size tried. Defaults to 32.
        max_val: largest batch size tried; None for no cap. Defaults to None.
        max_trials: most trials run in total. Defaults to 20.
        margin: fraction taken off the largest fitting batch in binsearch mode,
            in [0, 1). Defaults to 0.05.
        min_gain: smallest relative examples/sec gain that keeps a throughput
            search growing (0.05 = 5%). Defaults to 0.05.
        multiple_of: batch sizes are multiples of this. Defaults to 1.
        patience: trials in a row without a `min_gain` improvement that end a
            throughput search. Defaults to 2.

    Returns:
        A `SearchResult`.

    Raises:
        ConfigError: on an invalid argument.
        BatchSizeSearchError: when not even a batch of `multiple_of` fits.

    Example:
        >>> fits = lambda b: Trial(b, "ok" if b <= 1000 else "oom", examples_per_sec=float(b))
        >>> search_batch_size(fits, mode="binsearch", objective="largest", margin=0.0).batch_size
        1000
    """
    validate_search_args(mode, objective, init_val, max_val, max_trials, margin, min_gain, multiple_of)
    check_int(patience, "patience", error=ConfigError)
    search = _Search(run_trial, max_trials, multiple_of, min_gain)
    search.shrink(init_val)
    if search.high_fail is None:
        search.grow(max_val, patience if objective == "throughput" else None)
    if mode == "binsearch" and objective == "largest" and search.high_fail is not None:
        search.bisect()
    return search.result(mode, objective, margin)


class _Search:
    """The state of one `search_batch_size`: its trials, the largest fitting and the smallest failing
    batch so far, and why growth stopped (`limit`)."""

    def __init__(self, run_trial: Callable[[int], Trial], max_trials: int, multiple_of: int, min_gain: float):
        self.run_trial, self.max_trials, self.multiple_of, self.min_gain = run_trial, max_trials, multiple_of, min_gain
        self.trials: List[Trial] = []
        self.low_ok: Optional[int] = None  # largest fitting
        self.high_fail: Optional[int] = None  # smallest failing
        self.limit = "max_trials"

    def _attempt(self, batch_size: int) -> Trial:
        trial = self.run_trial(batch_size)
        self.trials.append(trial)
        return trial

    @property
    def _trials_left(self) -> bool:
        return len(self.trials) < self.max_trials

    def shrink(self, size: int) -> None:
        """Tries `size`, halving while it does not fit; `limit` becomes "failure" when it did not.

        Raises:
            BatchSizeSearchError: when not even a batch of `multiple_of` fits.
        """
        while self._trials_left:
            if self._attempt(size).fits:
                self.low_ok = size
                break
            self.high_fail, self.limit = size, "failure"
            smaller = _round_down(size // 2, self.multiple_of)
            if smaller < self.multiple_of or smaller == size:
                break
            size = smaller
        if self.low_ok is None:
            tried = ", ".join(f"{t.batch_size} ({t.status})" for t in self.trials)
            raise BatchSizeSearchError(
                f"No batch size fits: tried {tried}. Free memory, raise the memory budget or the per-trial "
                "time limit, or use a smaller model."
            )

    def grow(self, max_val: Optional[int], patience: Optional[int]) -> None:
        """Doubles the fitting batch (capped at `max_val`) until one fails, the cap, or (with `patience`)
        `patience` trials in a row without a `min_gain` examples/sec gain."""
        best_rate, stale = self.trials[-1].examples_per_sec, 0
        while self._trials_left:
            cap = None if max_val is None else _round_down(max_val, self.multiple_of)
            size = self.low_ok * 2 if cap is None else min(self.low_ok * 2, cap)
            if size <= self.low_ok:
                self.limit = "max_val"
                return
            trial = self._attempt(size)
            if not trial.fits:
                self.high_fail, self.limit = size, "failure"
                return
            self.low_ok, rate = size, trial.examples_per_sec
            stale = stale + 1 if rate is not None and best_rate and rate < best_rate * (1 + self.min_gain) else 0
            if rate is not None and (best_rate is None or rate > best_rate):
                best_rate = rate
            if patience is not None and stale >= patience:
                self.limit = "plateau"
                return

    def bisect(self) -> None:
        """Bisects between the largest fitting and the smallest failing batch until `multiple_of` apart."""
        while self._trials_left and self.high_fail - self.low_ok > self.multiple_of:
            mid = _round_down((self.low_ok + self.high_fail) // 2, self.multiple_of)
            if mid <= self.low_ok:
                return
            if self._attempt(mid).fits:
                self.low_ok = mid
            else:
                self.high_fail = mid

    def result(self, mode: str, objective: str, margin: float) -> SearchResult:
        """The `SearchResult`: in binsearch mode the largest fitting batch less `margin`."""
        if self.limit == "plateau":
            largest_fitting = None
        elif mode == "binsearch":
            largest_fitting = max(self.multiple_of, _round_down(int(self.low_ok * (1 - margin)), self.multiple_of))
        else:
            largest_fitting = self.low_ok
        best = best_throughput_trial([t for t in self.trials if t.fits], self.min_gain)
        return SearchResult(
            batch_size=best.batch_size if objective == "throughput" else largest_fitting,
            largest_fitting=largest_fitting, largest_tried_ok=self.low_ok, best_throughput=best.batch_size,
            best_examples_per_sec=best.examples_per_sec, limit=self.limit, mode=mode, objective=objective,
            trials=self.trials,
        )
