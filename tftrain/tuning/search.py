"""The batch-size search over a caller's `run_trial(batch_size) -> Trial`, free of TensorFlow (tested with fake
trials). After PyTorch Lightning's `tuner/batch_size_scaling.py`."""

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
"""Trial outcomes; only OK fits. NO_DATA: too few examples for one batch."""


@dataclasses.dataclass(frozen=True)
class Trial:
    """One global batch size tried; rates and memory (`peak_memory_bytes`: above the baseline) None unless measured."""

    batch_size: int
    status: str
    examples_per_sec: Optional[float] = None
    step_time_s: Optional[float] = None
    peak_memory_bytes: Optional[int] = None
    seconds: float = 0.0
    note: str = ""

    @property
    def fits(self) -> bool:
        return self.status == OK

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """Outcome of `search_batch_size`.

    Attributes:
        batch_size: `best_throughput` or `largest_fitting`, by objective.
        largest_fitting: less the margin in binsearch mode (when a failure bounded it); None when growth stopped on a
            throughput plateau.
        best_throughput: see `best_throughput_trial`.
        limit: what ended growth: "failure", "max_val", "plateau" or "max_trials".
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
        out = dataclasses.asdict(self)
        out["trials"] = [t.to_dict() for t in self.trials]
        return out


def _round_down(value: int, multiple: int) -> int:
    return (value // multiple) * multiple


def propose_accumulation(target: int, largest_fitting: int, multiple_of: int = 1) -> Tuple[int, int]:
    """`(micro-batch that fits, accumulation steps)` making up `target`; `(target, 1)` if it fits. Prefers the fewest
    steps dividing `target` into multiples of `multiple_of` (default 1); else the product exceeds `target` a little.

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
    """The smallest trial within `min_gain` (relative, default 0.05) of the best examples/sec: smaller gains are
    timing noise and cost updates and memory. Without measured rates: the largest batch.

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
    """Searches the global batch size with caller-supplied trials: doubles from `init_val` (halving first if it
    does not fit) while trials fit, up to `max_val`; a throughput search also stops after `patience` trials in a row
    without a `min_gain` gain. `binsearch` (objective `"largest"` only) then bisects to within `multiple_of` and takes
    `margin` off, as Lightning. Arguments as `find_batch_size`'s, except `multiple_of` (default 1).

    Raises:
        ConfigError: an invalid argument.
        BatchSizeSearchError: not even a batch of `multiple_of` fits.

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
        """Tries `size`, halving while it does not fit; `BatchSizeSearchError` if none fits."""
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
        """Doubles the fitting batch until one fails, `max_val`, or a plateau of `patience` trials."""
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
        while self._trials_left and self.high_fail - self.low_ok > self.multiple_of:
            mid = _round_down((self.low_ok + self.high_fail) // 2, self.multiple_of)
            if mid <= self.low_ok:
                return
            if self._attempt(mid).fits:
                self.low_ok = mid
            else:
                self.high_fail = mid

    def result(self, mode: str, objective: str, margin: float) -> SearchResult:
        if self.limit == "plateau":
            largest_fitting = None
        elif mode == "binsearch" and self.high_fail is not None:  # the margin keeps off a failure's edge
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
