"""The one execution chooser: `--execution auto` and `--steps-per-execution auto` timed inside
`Model.fit` on real training steps (the run's own in the Trainer, which train the model like any
other; probe steps whose state is restored after in `tftrain.runtime.choose_execution`).

An `ExecutionTrial` is installed as `model.train_function`, which Keras 3's `fit` calls once per
execution. It runs each call through a candidate's train function (graph or XLA, at a count that
divides the largest) and times the candidates in duels, their calls interleaved; the winner then
trains the rest. Every count of a mode loops over one traced function whose count is read at run
time (`tftrain.runtime.epoch_ends.StepCount`), so a new count costs no new trace or XLA compile.

Source: keras/src/backend/tensorflow/trainer.py (`fit`, `make_train_function`) in Keras 3.
"""

from __future__ import annotations

import dataclasses
import math
import time
import weakref
from typing import Callable, Optional, Sequence

from tftrain import _compat
from tftrain.runtime.execution import ExecutionChoice, best_label, choice_reason, failure_line, label_of
from tftrain.runtime.epoch_ends import StepCount, epoch_start_callback, steps_this_call
from tftrain.runtime.trial_rules import (GIVE_UP_RATIO, MIN_GIVE_UP_STEPS, XLA_MAX_SPEEDUP, duel_verdict, kept_calls,
                                         step_time, timed_enough, timing, xla_compile_ratio)

_TRACED_GRAPH: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
"""model -> (the graph train function `time_graph_step` left on it, its steps per execution, the seconds of its
first execution, which traced it)."""


def remember_traced_graph(model, function, steps_per_execution: int, first_call_s: float) -> None:
    """Records the graph train function a timing traced on `model` (`tftrain.runtime.time_graph_step`), so
    that a trial's graph candidate at the same count runs it instead of tracing its own."""
    _TRACED_GRAPH[model] = (function, steps_per_execution, first_call_s)


def traced_graph(model, steps_per_execution: int) -> Optional[tuple]:
    """`(function, first_call_s)` recorded by `remember_traced_graph` while it is still the model's
    `train_function` at `steps_per_execution` (anything that changes the count or the mode drops it); else
    None."""
    function, count, first_call_s = _TRACED_GRAPH.get(model, (None, None, None))
    if function is None or function is not model.train_function or count != steps_per_execution:
        return None
    return function, first_call_s


@dataclasses.dataclass
class _Candidate:
    """One (mode, steps per execution) point: its Keras train function and its timed calls."""

    mode: str
    spe: int
    label: str
    function: Optional[Callable] = None
    warmup_s: Optional[float] = None
    samples: list = dataclasses.field(default_factory=list)  # (seconds, training steps) per timed call
    window: list = dataclasses.field(default_factory=list)  # the samples of the current duel
    failed: bool = False



class ExecutionTrial:
    """Times execution candidates on training steps inside one `Model.fit`, then trains with the winner.

    Duels: the first mode at the model's own count against each other mode, then the winner against its
    mode at each larger count while the larger count wins, then each other mode at the winner's count (the
    interaction: per-call overhead weighs less at a larger count, so a mode slower at the base can win
    there), and a mode that wins that grows its count in turn. A duel ends once each side has
    `MIN_TIMED_CALLS` calls of `MIN_TIMED_STEPS` steps (the challenger must be more than 5% faster,
    `tftrain.runtime.execution.best_label`), or earlier once one side is `GIVE_UP_RATIO` slower.

    Args:
        model: a compiled Keras model (TensorFlow backend, one replica, not `run_eagerly`); its
            `steps_per_execution` is the base count.
        modes: modes to time at the base count, from `"graph"` and `"xla"`; the first is the first incumbent.
        counts: larger steps per execution to try for the winning mode; with the base, each must divide
            the largest. Defaults to ().
        examples_per_step: examples per training step (per micro-batch under gradient accumulation).
        on_settled: called once with the `ExecutionChoice`. Defaults to None.
        clock: seconds, monotonic. Defaults to `time.perf_counter`.
        planned_steps: training steps of the whole run; XLA is not timed when even `XLA_MAX_SPEEDUP`
            over the steps left could not repay compiling it. Defaults to None (always timed).
        steps_per_epoch: training steps of an epoch; with several counts the trial then ends each epoch
            itself, so `fit` can keep one iterator over repeated data (add `epoch_callback()` to `fit`'s
            callbacks). Defaults to None.

    Raises:
        ValueError: on no modes, an unknown mode, or a count that does not divide the largest.

    Example:
        >>> trial = ExecutionTrial(model, ("graph", "xla"), (32, 64), examples_per_step=128)
        >>> trial.install()              # model.train_function is now the trial
        >>> model.fit(train_ds, epochs=10)
        >>> trial.finish().describe()
    """


    def __init__(self, model, modes: Sequence[str], counts: Sequence[int] = (), *, examples_per_step: int,
                 on_settled: Optional[Callable] = None, clock: Callable[[], float] = time.perf_counter,
                 planned_steps: Optional[int] = None, steps_per_epoch: Optional[int] = None):
        if not modes or any(m not in ("graph", "xla") for m in modes):
            raise ValueError(f"modes must be a non-empty subset of ('graph', 'xla'); got {tuple(modes)}.")
        self.model, self.modes, self.examples_per_step = model, tuple(modes), examples_per_step
        self.base = int(model.steps_per_execution or 1)
        all_counts = sorted({self.base, *counts})
        self.fit_steps_per_execution = all_counts[-1]
        if any(self.fit_steps_per_execution % c for c in all_counts):
            raise ValueError(f"Every count must divide the largest, {self.fit_steps_per_execution}; got {all_counts}.")
        self.larger = [c for c in all_counts if c > self.base]
        # Several counts, or an epoch that ends inside an execution: each mode's function runs any count up to
        # the largest, so that it can end each epoch itself and `fit` keeps one iterator (at a fixed count the
        # data stays finite: Keras builds its pipeline each epoch and, under a MirroredStrategy, warns "Your
        # input ran out of data" at each epoch's end).
        self.shared_count = bool(self.larger) or bool(steps_per_epoch and steps_per_epoch % self.base)
        self.on_settled, self.clock, self.planned_steps = on_settled, clock, planned_steps
        self.steps_per_epoch, self.epoch_steps = steps_per_epoch, 0  # epoch_steps: run so far in this epoch
        self.not_timed: list = []  # "<label>: why", candidates the run is too short to repay
        self.time_again_from: Optional[int] = None  # planned steps from which those would repay timing
        self.incumbent = self._candidate(self.modes[0], self.base)
        self.challengers = [self._candidate(m, self.base) for m in self.modes[1:]]
        self.challenger: Optional[_Candidate] = None
        self.last: Optional[_Candidate] = None  # the candidate of the latest call
        self.count_lost: set = set()  # modes whose larger count lost its duel: their larger ones are not timed
        self.rematched: set = set()  # modes timed again at the incumbent's larger count
        self.timed: dict = {}  # label -> _Candidate, in the order timed
        self.skipped: list = []
        self.steps: dict = {}  # mode -> its shared step tf.function
        self.functions: dict = {}  # mode -> its train function, shared by every count
        self.count: Optional[StepCount] = None  # the count the shared functions run (several counts only)
        self.chosen: Optional[_Candidate] = None
        self.choice: Optional[ExecutionChoice] = None
        self.verdicts: list = []  # each duel's outcome, as the reason says it
        self.first_step: Optional[int] = None  # the training step of the trial's first call (a resumed run's is not 0)
        self.started: Optional[tuple] = None  # (clock, training step) after the first compiling call
        self.first_compiled: Optional[_Candidate] = None  # the candidate whose compiling call came first
        # Graph at the base count, traced already by --precision auto's timing (one count: not shared).
        self.traced_graph = None if self.shared_count else traced_graph(model, self.base)

    def _candidate(self, mode: str, spe: int) -> _Candidate:
        return _Candidate(mode, spe, label_of(mode, spe, self.base))

    def install(self) -> None:
        """Makes the trial `model.train_function`, at `fit_steps_per_execution` steps per call. Under
        several modes the model stays out of XLA (`jit_compile` False), so the validation and test steps,
        which are not timed, run in graph."""
        if len(self.modes) > 1:
            self.model.jit_compile = False
        if self.model.steps_per_execution != self.fit_steps_per_execution:  # a test function traced at the
            self.model.test_function = None  # old count would run it per call of the new (XLA's test-step check)
        self.model.steps_per_execution = self.fit_steps_per_execution
        self.model.train_function = self

    @property
    def ends_epochs(self) -> bool:
        """Whether each call stops at the epoch's end (`steps_per_epoch` given and the count shared, so that a
        call can run any number of steps up to the largest count)."""
        return bool(self.steps_per_epoch) and self.shared_count and self._make_function_available()

    def epoch_callback(self):
        """A Keras callback that marks each epoch's start (a resumed epoch is ended early by `StepBackup`,
        so the steps run do not say where the next begins)."""
        return epoch_start_callback(self)

    # -- the train function -------------------------------------------------
    def __call__(self, iterator):
        """Runs `fit_steps_per_execution` steps from `iterator` (fewer where the epoch has fewer left,
        when the trial `ends_epochs`); the logs of the last call."""
        todo = self._steps_this_call()
        logs, done = None, 0
        while done < todo:
            candidate = self._pick(todo - done)
            steps = min(candidate.spe, todo - done)
            try:
                logs = self._run(candidate, iterator, steps)
            except Exception as error:  # noqa: BLE001 (an XLA candidate that does not compile is skipped)
                if isinstance(error, StopIteration) or _ran_out(error):  # the data's end: Keras ends the epoch
                    if logs is None:
                        raise
                    return logs
                if not self._skip(candidate, error):
                    raise
                continue
            done += steps
        self.epoch_steps += done
        return logs

    def _steps_this_call(self) -> int:
        """`fit_steps_per_execution`, or the steps the epoch has left when fewer and the trial `ends_epochs`."""
        if not self.ends_epochs:
            return self.fit_steps_per_execution
        return steps_this_call(self, self.fit_steps_per_execution)

    def _pick(self, remaining: int) -> _Candidate:
        """The candidate of the next call: the incumbent and the challenger in turn (the challenger only
        where its count divides the rest of this execution; else the incumbent, which runs at most what
        is left: every count divides a whole execution, and an epoch's short last one runs on the shared
        count)."""
        if self.chosen is None and self.challenger is None and self.incumbent.samples:
            self._next_duel()
        if self.chosen is not None:
            return self.chosen
        if self.challenger is None:  # the first calls: the incumbent compiles, then is timed once
            return self.incumbent
        other = self.challenger if self.last is self.incumbent else self.incumbent
        return other if remaining % other.spe == 0 else self.incumbent

    def _run(self, candidate: _Candidate, iterator, steps: Optional[int] = None):
        """One call of `candidate`'s train function, running `steps` steps (its count; fewer only through the
        shared count); timed (and synchronised by reading the optimizer's step counter) while the
        candidates are being timed."""
        model = self.model
        if candidate.function is None:
            candidate.function = self._function(candidate)
        # Read when Keras traces the function: the shared count when there is one, else the candidate's.
        model.steps_per_execution = self.count if self.count is not None else candidate.spe
        if self.count is not None:
            self.count.set(steps or candidate.spe)
        try:
            if self.chosen is not None:
                return candidate.function(iterator)
            before, start = self._step(), self.clock()
            self.first_step = before if self.first_step is None else self.first_step
            logs = candidate.function(iterator)
            steps = self._step() - before  # reading the counter waits for the steps (a device sync)
            self._record(candidate, self.clock() - start, steps)
            return logs
        finally:
            model.steps_per_execution = self.fit_steps_per_execution
            if self.count is not None and steps and steps != candidate.spe:  # an epoch's short last call:
                self.count.set(candidate.spe)  # a function handed over to Keras meanwhile runs whole calls

    def _function(self, candidate: _Candidate):
        """Keras's train function around the mode's one step function, one per mode: with several
        counts it loops over the shared `StepCount` (set before each call), so that a mode is traced, and
        compiled by XLA, once. Graph at the one count is the function the precision timing traced, when
        there is one (`traced_graph`)."""
        if candidate.mode == "graph" and self.traced_graph is not None:
            return self.traced_graph[0]
        if self.shared_count and self._make_function_available():
            if self.count is None:
                self.count = StepCount(self.fit_steps_per_execution)
            if candidate.mode not in self.functions:
                self.functions[candidate.mode] = self._keras_function(candidate)
            return self.functions[candidate.mode]
        return self._keras_function(candidate)

    def _make_function_available(self) -> bool:
        return _compat.make_function_available(self.model)

    def _keras_function(self, candidate: _Candidate):
        """Keras's train function for `candidate`'s mode and count (traced at its first call)."""
        model = self.model
        jit = model.jit_compile
        try:
            model.jit_compile = candidate.mode == "xla"
            if candidate.mode == "xla" and not model.jit_compile:  # Keras refused: a layer does not support XLA
                raise ValueError("the model does not support jit_compile")
            model.steps_per_execution = candidate.spe
            if not _compat.make_function_available(model):
                model.make_train_function(force=True)
                return model.train_function
            model.jit_compile = False  # the XLA step is the shared inner function
            return _compat.make_function(model, self._step_function(candidate.mode))
        finally:
            model.jit_compile, model.train_function = jit, self
            model.steps_per_execution = self.fit_steps_per_execution

    def _step_function(self, mode: str):
        """`model.train_step` as one `tf.function` per mode (`jit_compile` for XLA)."""
        import tensorflow as tf

        if mode not in self.steps:
            self.steps[mode] = tf.function(self.model.train_step, jit_compile=mode == "xla", reduce_retracing=True)
        return self.steps[mode]

    def _step(self) -> int:
        """Training steps (batches) run so far: the micro-step counter of an optimizer that accumulates
        gradients (`tftrain.train.accumulation`), among any wrappers, else the optimizer's `iterations`.
        Reading it waits for the steps before it."""
        optimizer = self.model.optimizer
        while optimizer is not None and not hasattr(optimizer, "micro_steps"):
            optimizer = getattr(optimizer, "inner_optimizer", None)
        counter = optimizer.micro_steps if optimizer is not None else self.model.optimizer.iterations
        return int(counter.numpy())

    def _record(self, candidate: _Candidate, seconds: float, steps: int) -> None:
        self.last = candidate
        if candidate.warmup_s is None:  # the call that traced and compiled
            candidate.warmup_s = seconds
            if self.started is None:
                self.started = (self.clock(), self._step())
                self.first_compiled = candidate
            return
        candidate.samples.append((seconds, steps))
        candidate.window.append((seconds, steps))
        self.timed.setdefault(candidate.label, candidate)
        if self.challenger is not None:
            self._judge()

    def _tracing_call_s(self, candidate: _Candidate) -> Optional[float]:
        """Seconds of the call that traced `candidate`'s function: its first call here, or, for graph's
        function traced by the precision timing (`traced_graph`), that timing's first call (which also
        holds the start of its `fit`: an estimate of XLA's compile from it errs toward not timing XLA)."""
        if candidate.mode == "graph" and self.traced_graph is not None and candidate.warmup_s is not None:
            return max(candidate.warmup_s, self.traced_graph[1])
        return candidate.warmup_s

    def _judge(self) -> None:
        """Ends the duel when both are timed enough, or one is already `GIVE_UP_RATIO` slower."""
        inc, chal = kept_calls(self.incumbent.window), kept_calls(self.challenger.window)
        if len(inc) < 2 or len(chal) < 2:
            return
        ratio = step_time(chal) / step_time(inc)
        enough = all(timed_enough(k) for k in (inc, chal))
        clear = (ratio > GIVE_UP_RATIO or ratio < 1 / GIVE_UP_RATIO) and \
            min(sum(n for _, n in k) for k in (inc, chal)) >= MIN_GIVE_UP_STEPS
        if not (enough or clear):
            return
        sides = ((self.incumbent, inc), (self.challenger, chal))  # the incumbent first: it stays within 5%
        winner = best_label({c.label: timing(kept, 1, c.spe, c.warmup_s) for c, kept in sides},
                            {c.label: c.spe for c, _ in sides})
        overall = self._slower_over_all_calls() if winner == self.challenger.label else None
        if overall:
            winner = self.incumbent.label
        if self.challenger.spe != self.base and winner != self.challenger.label \
                and self.challenger.mode == self.incumbent.mode:
            self.count_lost.add(self.incumbent.mode)
        self.verdicts.append(overall or duel_verdict(self.incumbent.label, self.challenger.label, 1 / ratio,
                                                     winner == self.challenger.label,
                                                     (step_time(inc), step_time(chal))))
        if winner == self.challenger.label:
            self.incumbent = self.challenger
        self.challenger = None

    def _slower_over_all_calls(self) -> Optional[str]:
        """Why the challenger that won its duel side by side is not taken, or None: over all its timed calls
        (the figures the choice prints) it was slower than the incumbent over all of its own. The two
        disagree when the step waits on its input (a Python generator's pipeline: XLA won a duel 1.58x and
        ran 4.82 against graph's 0.62 ms/step over all calls), and then the incumbent, the cheaper, stays."""
        inc, chal = step_time(self.incumbent.samples), step_time(self.challenger.samples)
        if inc is None or chal is None or chal <= inc:
            return None
        return (f"{self.incumbent.label} kept: {self.challenger.label} was faster side by side but slower over all "
                f"its timed calls ({chal * 1e3:.2f} against {inc * 1e3:.2f} ms/step), so the timing is not "
                "clear (a step that waits on its input?)")

    def _skip(self, candidate: _Candidate, error: Exception) -> bool:
        """Skips an XLA candidate that failed when graph is a candidate too; False to raise `error`."""
        if candidate.mode != "xla" or "graph" not in self.modes or self.chosen is not None \
                or candidate is not self.challenger:
            return False
        candidate.failed = True
        if candidate.spe != self.base and candidate.mode == self.incumbent.mode:
            self.count_lost.add(candidate.mode)  # its larger counts are not tried again
        self.rematched.add(candidate.mode)
        self.timed.pop(candidate.label, None)
        self.skipped.append(f"{candidate.label}: {failure_line(error)}")
        self.challenger, self.last = None, self.incumbent
        return True

    # -- choosing -------------------------------------------------------------
    def _next_duel(self) -> None:
        """The next challenger: the other modes at the base count, then the incumbent's mode at each
        larger count while the previous larger count won; settles when none is left."""
        self.incumbent.window.clear()
        while self.challengers and self.challenger is None:
            challenger = self.challengers.pop(0)
            why = self._not_worth_timing(challenger)
            if why:
                self.not_timed.append(f"{challenger.label} not timed: {why}")
            else:
                self.challenger = challenger
        if self.challenger is not None:
            return
        larger = [c for c in self.larger if c > self.incumbent.spe]
        if larger and self.incumbent.mode not in self.count_lost:
            self.challenger = self._candidate(self.incumbent.mode, larger[0])
            return
        rematch = self._rematch_modes()
        if rematch:  # mode and count interact: a mode slower per call at the base count can win at a larger one
            self.rematched.add(rematch[0])
            self.challenger = self._candidate(rematch[0], self.incumbent.spe)
            return
        self._settle(complete=True)

    def _rematch_modes(self) -> list:
        """The other timed modes that have not met the incumbent at its count, when that count is larger
        than the base (at the base they have met)."""
        if self.incumbent.spe == self.base:
            return []
        return [mode for mode in self._unmet_modes() if label_of(mode, self.incumbent.spe, self.base) not in self.timed]

    def _unmet_modes(self) -> list:
        """The other modes timed at the base count (not failed) that have not yet been timed again."""
        return [c.mode for c in self.timed.values() if c.mode != self.incumbent.mode and not c.failed
                and c.mode not in self.rematched and c.spe == self.base]

    def _not_worth_timing(self, challenger: _Candidate) -> Optional[str]:
        """Why an XLA challenger of a graph incumbent cannot pay for itself in this run, or None: when
        `XLA_MAX_SPEEDUP` over the steps left saves less than compiling XLA is estimated to take
        (`xla_compile_ratio` times the graph step's own first call)."""
        step_s, warmup = step_time(self.incumbent.samples), self._tracing_call_s(self.incumbent)
        if self.planned_steps is None or challenger.mode != "xla" or self.incumbent.mode != "graph" \
                or step_s is None or warmup is None:
            return None
        done = self._step()
        left = self.planned_steps - done  # planned_steps counts a resumed run's restored steps too
        gain = (1 - 1 / XLA_MAX_SPEEDUP) * step_s * left
        ratio = xla_compile_ratio(self.model)
        compile_s = ratio * warmup
        if gain >= compile_s:
            return None
        # A fresh run reaches this duel after the steps this trial ran (not a resumed run's restored ones).
        repays_from = done - (self.first_step or 0) + math.ceil(compile_s / ((1 - 1 / XLA_MAX_SPEEDUP) * step_s))
        self.time_again_from = min(self.time_again_from or repays_from, repays_from)
        return (f"even {XLA_MAX_SPEEDUP}x faster it would save at most {gain:.1f} s over the run's last {left} "
                f"steps, less than compiling it may take (about {compile_s:.1f} s, {ratio}x graph's "
                f"first call; a run of {repays_from} steps or more times it)")

    def _rematch_waits(self) -> bool:
        """Whether another mode timed at the base count may yet meet the incumbent at a larger count."""
        grows = any(c > self.incumbent.spe for c in self.larger) and self.incumbent.mode not in self.count_lost
        return grows and bool(self._unmet_modes())

    def _settle(self, complete: bool) -> None:
        self.chosen = self.incumbent
        if self.chosen.function is None:
            self.chosen.function = self._function(self.chosen)
        if self.count is not None:
            self.count.set(self.chosen.spe)
        if self.chosen.spe == self.fit_steps_per_execution and not (
                self.ends_epochs and self.steps_per_epoch % self.chosen.spe):
            self.model.train_function = self.chosen.function  # nothing left to dispatch (no short last call)
        timings = {label: timing(c.samples, self.examples_per_step, c.spe, c.warmup_s) for label, c in self.timed.items()
                   if not c.failed and kept_calls(c.samples)}
        if self.chosen.label in timings:
            reason = ("; ".join(self.verdicts)
                      + (f"; skipped {'; '.join(self.skipped)}" if self.skipped else "")
                      if self.verdicts else choice_reason(timings, self.chosen.label, self.skipped))
            reason += "".join(f"; {line}" for line in self.not_timed)
            if not complete and self.challenger is not None:
                reason += f"; {self.challenger.label} not decided: training ended first"
        elif self.skipped:
            reason = f"the others failed: skipped {'; '.join(self.skipped)}"
        else:
            reason = "training ended before any candidate was timed"
        self.choice = ExecutionChoice(self.chosen.mode, timings, reason, steps_per_execution=self.chosen.spe,
                                      skipped=tuple(self.skipped), trial=self._cost(complete),
                                      time_again_from_steps=self.time_again_from)
        if self.on_settled is not None:
            self.on_settled(self.choice)

    def _cost(self, complete: bool) -> dict:
        """Steps and seconds since the first compiling call, and `cost_s`: what the run paid beyond a run at
        the chosen setting (those seconds less the same steps at the chosen step time, less the chosen
        candidate's own compile); an upper bound."""
        # The modes are decided once no other mode waits, at the base count or at the incumbent's larger one,
        # and the duel left, if any, is one of the incumbent's counts.
        decided = complete or (not self.challengers and not self._rematch_modes() and not self._rematch_waits()
                               and (self.challenger is None or self.challenger.mode == self.incumbent.mode))
        if self.started is None:
            return {"steps": 0, "seconds": 0.0, "cost_s": 0.0, "complete": complete, "modes_decided": decided}
        seconds, steps = self.clock() - self.started[0], self._step() - self.started[1]
        chosen = step_time(self.chosen.samples) or 0.0
        first, own = self.first_compiled.warmup_s, self.chosen.warmup_s
        beyond_first = max(0.0, own - first) if own is not None and self.chosen is not self.first_compiled else 0.0
        cost = seconds - steps * chosen - beyond_first
        return {"steps": steps, "seconds": round(seconds, 3), "cost_s": round(max(0.0, cost), 3),
                "complete": complete, "modes_decided": decided}

    def finish(self) -> ExecutionChoice:
        """The choice, settling on the incumbent when training ended before every candidate was timed
        (`trial["complete"]` is then False)."""
        if self.choice is None:
            self._settle(complete=False)
        return self.choice


def _ran_out(error: BaseException) -> bool:
    """Whether `error` is the end of the data (an epoch of data of unknown length), not a candidate's failure."""
    import tensorflow as tf

    return isinstance(error, tf.errors.OutOfRangeError)
