"""`--execution auto` and `--steps-per-execution auto` timed inside `Model.fit`, on the run's own
first training steps, which train the model like any other (nothing is restored or thrown away).

Keras 3's `fit` reads `model.train_function` at every execution and calls it on the epoch's
iterator; each call runs the `steps_per_execution` steps the function was traced for. An
`ExecutionTrial` is installed as that train function: `fit` runs at the largest count a candidate
may take (`fit_steps_per_execution`: its epoch iterator and batch callbacks see executions of that
many steps), and each call runs those steps through Keras's own train functions of the candidates
(graph or XLA at 1, 8, 32 or 64 steps per call; every count divides the largest). The first calls
time the candidates in duels, their calls interleaved: graph against XLA at the model's own count,
then the winner against its mode at each larger count while the larger count wins
(`tftrain.runtime.execution_probe.choose_execution` times the same candidates on separate probe steps,
restoring the weights after). A challenger `GIVE_UP_RATIO` slower stops at once; an XLA candidate
that fails to compile or run is skipped with XLA's reason (the batch its failed call drew is not
trained on). Then the winner trains the rest of the run. What choosing costs is compiling the
candidates that lose and the steps they ran slower: `ExecutionChoice.trial` records it.

Every count of a mode runs through one Keras train function, traced once: the count it loops over is
read at run time from a variable (`tftrain.runtime.epoch_ends.StepCount`), so a new count costs no new
trace, no Grappler pass and, under XLA, no new compile (Keras's own function bakes its count in: each count then cost 0.4-1.2 s of
tracing and compiling on this project's 2-core CPU).

Source: keras/src/backend/tensorflow/trainer.py (`fit`, `make_train_function`) in Keras 3.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Optional, Sequence

from tftrain.runtime.execution import (KEEP_FIRST_WITHIN, ExecutionChoice, StepTiming, best_label, choice_reason,
                                       failure_line, label_of)
from tftrain.runtime.epoch_ends import StepCount, epoch_start_callback, steps_this_call
from tftrain.runtime.execution_probe import traced_graph

MIN_TIMED_STEPS = 32
"""Optimizer steps each side of a duel is timed for at least (after its compiling call)."""

MIN_TIMED_CALLS = 3
"""Calls of its train function each side of a duel is timed for at least (`_step_time`)."""

GIVE_UP_RATIO = 1.3
"""A duel ends early once one side's step time (over two calls or more, and `MIN_GIVE_UP_STEPS` steps) is
this factor slower."""

MIN_GIVE_UP_STEPS = 8
"""Optimizer steps each side is timed for at least before a duel may end early: at one step per call, two
calls of a ~2 ms step differed by 1.4-1.7x on a loaded 2-core host (XLA taken over graph, then trained at
15,000-17,600 examples/sec against graph's 18,000-18,400 in the same runs)."""

XLA_MAX_SPEEDUP = 2.5
"""The most XLA is taken to speed a step up over graph at the same count, for deciding whether a run is
long enough to repay compiling it: the zoo's largest ratio was 2.26x (lstm at 32 steps/execution;
`benchmarks/results/zoo.json`, medians over 3 rounds on a 2-core CPU), most were below 1.5x."""


XLA_COMPILE_RATIO = 3.25
"""XLA's first call (its compile) is estimated as this many times graph's first call (which traces and
optimises the step) when deciding whether a run can repay compiling it: measured ratios were 0.6-1.9 on
the zoo's models and 3.24 on an Embedding + GRU over padded sequences (3.89 s against 1.20 s), whose
`while` loop XLA compiles whole."""


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


def _kept(samples: list) -> list:
    """Timed calls that ran whole executions (an epoch's last call may run fewer steps)."""
    full = max((steps for _, steps in samples), default=0)
    return [(s, n) for s, n in samples if n == full and n > 0]


def _step_time(samples: list) -> Optional[float]:
    """Seconds per step over the whole executions timed: their total seconds over their total steps.

    Not their median: a call that compiles for a new input shape is a cost the run keeps paying
    when shapes vary (sequences padded per batch), and XLA compiles a program per shape. Measured
    on an Embedding + GRU over `padded_batch` sequences of 5-59 tokens: XLA's median was 8.96
    ms/step against graph's 19.98, so the trial took XLA, and the run then trained at 39 ms/step.
    """
    kept = _kept(samples)
    return sum(s for s, _ in kept) / sum(n for _, n in kept) if kept else None


def _timed_enough(kept: list) -> bool:
    """`MIN_TIMED_CALLS` calls of `MIN_TIMED_STEPS` steps in all, or two calls of twice as many (a count
    of 32 or 64 steps per call: waiting for a third call of 64 made the last duel outlast short runs)."""
    steps = sum(n for _, n in kept)
    return (len(kept) >= MIN_TIMED_CALLS and steps >= MIN_TIMED_STEPS) or (len(kept) >= 2
                                                                           and steps >= 2 * MIN_TIMED_STEPS)


def _timing(candidate: _Candidate, samples: list, examples_per_step: int) -> StepTiming:
    kept, step = _kept(samples), _step_time(samples)
    return StepTiming(step_time_s=step, examples_per_sec=examples_per_step / step if step > 0 else float("inf"),
                      mean_step_time_s=sum(s for s, _ in kept) / sum(n for _, n in kept),
                      batch_size=examples_per_step, steps_per_execution=candidate.spe,
                      timed_steps=sum(n for _, n in kept), warmup_s=candidate.warmup_s or 0.0,
                      execution_times_s=tuple(s for s, _ in kept))


class ExecutionTrial:
    """Times execution candidates on the run's first training steps, inside one `Model.fit`.

    The candidates meet in duels: an incumbent (graph at the model's own count first) against one
    challenger (XLA at that count, then the winning mode at each larger count while the larger
    count wins), their calls interleaved so that both are timed under the same load. A duel ends
    once each has `MIN_TIMED_CALLS` timed calls of `MIN_TIMED_STEPS` steps in all (the challenger
    wins when its step time (`_step_time`) is more than 5% below the incumbent's,
    `tftrain.runtime.execution.best_label`), or earlier once one is `GIVE_UP_RATIO` slower.

    Args:
        model: a compiled Keras model (TensorFlow backend, one replica, not
            `run_eagerly`, its optimizer built by the first step as usual); its
            `steps_per_execution` is the base count the modes are compared at.
        modes: modes to time at the base count, from `"graph"` and `"xla"`, the
            first being the first incumbent.
        counts: other steps per execution the faster mode may take (only those
            above the base are timed, in order, while each wins); with the base,
            each must divide the largest. Defaults to ().
        examples_per_step: examples per training step (the global batch; with
            gradient accumulation, per micro-batch), for examples/sec.
        on_settled: called once with the `ExecutionChoice` when the candidates
            are timed (or at `finish` when training ended first). Defaults to None.
        planned_steps: training steps (batches) the whole run takes, counted as
            the trial counts them; an XLA candidate is then not timed when even
            `XLA_MAX_SPEEDUP` over the steps left could not repay compiling it
            (estimated as the graph step's first call, which traced and optimised
            it). Defaults to None (always timed).
        clock: seconds, monotonic. Defaults to `time.perf_counter`.
        steps_per_epoch: training steps (batches) of an epoch, or None. With
            several counts the trial then ends each epoch itself: a call runs
            only the steps the epoch has left (the shared count set to them), so
            the training data may repeat forever and Keras keep one iterator for
            the run (`ends_epochs`, `tftrain.train.loops.fit.one_iterator`); add
            `epoch_callback()` to `fit`'s callbacks (`tftrain.runtime.epoch_ends`).
            Defaults to None.

    Raises:
        ValueError: on no modes, an unknown mode, or a count that does not divide
            the largest.

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
        self.shared_count = bool(self.larger)  # several counts: each mode's function runs any of them
        self.on_settled, self.clock, self.planned_steps = on_settled, clock, planned_steps
        self.steps_per_epoch, self.epoch_steps = steps_per_epoch, 0  # epoch_steps: run so far in this epoch
        self.not_timed: list = []  # "<label>: why", candidates the run is too short to repay
        self.time_again_from: Optional[int] = None  # planned steps from which those would repay timing
        self.incumbent = self._candidate(self.modes[0], self.base)
        self.challengers = [self._candidate(m, self.base) for m in self.modes[1:]]
        self.challenger: Optional[_Candidate] = None
        self.last: Optional[_Candidate] = None  # the candidate of the latest call
        self.count_lost = False  # a larger count lost its duel: larger ones are not timed
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
            except StopIteration:
                if logs is None:
                    raise
                return logs
            except Exception as error:  # noqa: BLE001 (an XLA candidate that does not compile is skipped)
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
        return getattr(self.model, "_make_function", None) is not None

    def _keras_function(self, candidate: _Candidate):
        """Keras's train function for `candidate`'s mode and count (traced at its first call)."""
        model = self.model
        jit = model.jit_compile
        try:
            model.jit_compile = candidate.mode == "xla"
            if candidate.mode == "xla" and not model.jit_compile:  # Keras refused: a layer does not support XLA
                raise ValueError("the model does not support jit_compile")
            model.steps_per_execution = candidate.spe
            make = getattr(model, "_make_function", None)  # Keras 3's TensorFlow trainer
            if make is None:
                model.make_train_function(force=True)
                return model.train_function
            model.jit_compile = False  # the XLA step is the shared inner function
            return make(self._step_function(candidate.mode))
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
        inc, chal = _kept(self.incumbent.window), _kept(self.challenger.window)
        if len(inc) < 2 or len(chal) < 2:
            return
        ratio = _step_time(chal) / _step_time(inc)
        enough = all(_timed_enough(k) for k in (inc, chal))
        clear = (ratio > GIVE_UP_RATIO or ratio < 1 / GIVE_UP_RATIO) and \
            min(sum(n for _, n in k) for k in (inc, chal)) >= MIN_GIVE_UP_STEPS
        if not (enough or clear):
            return
        sides = ((self.incumbent, inc), (self.challenger, chal))  # the incumbent first: it stays within 5%
        winner = best_label({c.label: _timing(c, kept, 1) for c, kept in sides}, {c.label: c.spe for c, _ in sides})
        if self.challenger.spe != self.base and winner != self.challenger.label:
            self.count_lost = True
        self.verdicts.append(duel_verdict(self.incumbent.label, self.challenger.label, 1 / ratio,
                                          winner == self.challenger.label))
        if winner == self.challenger.label:
            self.incumbent = self.challenger
        self.challenger = None

    def _skip(self, candidate: _Candidate, error: Exception) -> bool:
        """Skips an XLA candidate that failed when graph is a candidate too; False to raise `error`."""
        if candidate.mode != "xla" or "graph" not in self.modes or self.chosen is not None \
                or candidate is not self.challenger:
            return False
        candidate.failed = True
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
        if self.larger and not self.count_lost:
            self.challenger = self._candidate(self.incumbent.mode, self.larger.pop(0))
        else:
            self._settle(complete=True)

    def _not_worth_timing(self, challenger: _Candidate) -> Optional[str]:
        """Why an XLA challenger of a graph incumbent cannot pay for itself in this run, or None: when
        `XLA_MAX_SPEEDUP` over the steps left saves less than compiling XLA is estimated to take
        (`XLA_COMPILE_RATIO` times the graph step's own first call)."""
        step_time, warmup = _step_time(self.incumbent.samples), self._tracing_call_s(self.incumbent)
        if self.planned_steps is None or challenger.mode != "xla" or self.incumbent.mode != "graph" \
                or step_time is None or warmup is None:
            return None
        done = self._step()
        left = self.planned_steps - done  # planned_steps counts a resumed run's restored steps too
        gain = (1 - 1 / XLA_MAX_SPEEDUP) * step_time * left
        compile_s = XLA_COMPILE_RATIO * warmup
        if gain >= compile_s:
            return None
        # A fresh run reaches this duel after the steps this trial ran (not a resumed run's restored ones).
        repays_from = done - (self.first_step or 0) + math.ceil(compile_s / ((1 - 1 / XLA_MAX_SPEEDUP) * step_time))
        self.time_again_from = min(self.time_again_from or repays_from, repays_from)
        return (f"even {XLA_MAX_SPEEDUP}x faster it would save at most {gain:.1f} s over the run's last {left} "
                f"steps, less than compiling it may take (about {compile_s:.1f} s, {XLA_COMPILE_RATIO}x graph's "
                f"first call; a run of {repays_from} steps or more times it)")

    def _settle(self, complete: bool) -> None:
        self.chosen = self.incumbent
        if self.chosen.function is None:
            self.chosen.function = self._function(self.chosen)
        if self.count is not None:
            self.count.set(self.chosen.spe)
        if self.chosen.spe == self.fit_steps_per_execution and not (
                self.ends_epochs and self.steps_per_epoch % self.chosen.spe):
            self.model.train_function = self.chosen.function  # nothing left to dispatch (no short last call)
        timings = {label: _timing(c, c.samples, self.examples_per_step) for label, c in self.timed.items()
                   if not c.failed and _kept(c.samples)}
        if self.chosen.label in timings:
            reason = ("; ".join(self.verdicts) + " (each duel's calls timed side by side)"
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
        """The trial's training steps and wall seconds after the first candidate's compiling call (which
        any `fit` pays), and those seconds less the same steps at the chosen candidate's step time."""
        # The modes are decided once no other mode waits and the duel left, if any, is one of counts.
        decided = complete or (not self.challengers and (self.challenger is None or self.challenger.spe != self.base))
        if self.started is None:
            return {"steps": 0, "seconds": 0.0, "cost_s": 0.0, "complete": complete, "modes_decided": decided}
        seconds, steps = self.clock() - self.started[0], self._step() - self.started[1]
        chosen = _step_time(self.chosen.samples) or 0.0
        return {"steps": steps, "seconds": round(seconds, 3), "cost_s": round(max(0.0, seconds - steps * chosen), 3),
                "complete": complete, "modes_decided": decided}

    def finish(self) -> ExecutionChoice:
        """The choice, settling on the incumbent when training ended before every candidate was timed
        (`trial["complete"]` is then False)."""
        if self.choice is None:
            self._settle(complete=False)
        return self.choice


def duel_verdict(incumbent: str, challenger: str, speedup: float, challenger_won: bool) -> str:
    """A duel's outcome, from the figures it was judged on (the calls timed side by side in it, not
    every call of the run), e.g. `xla 1.40x faster than graph`, `graph kept: xla only 3% faster, within
    the 5% timing noise`. `speedup` is the incumbent's step time over the challenger's (above 1: the
    challenger was faster)."""
    if challenger_won:
        return f"{challenger} {speedup:.2f}x faster than {incumbent}"
    if speedup > 1:
        return (f"{incumbent} kept: {challenger} only {speedup - 1:.0%} faster, within the "
                f"{KEEP_FIRST_WITHIN:.0%} timing noise")
    return f"{incumbent} {1 / speedup:.2f}x faster than {challenger}"


def weigh_remembered_xla(choice: ExecutionChoice, planned_steps: Optional[int]) -> ExecutionChoice:
    """A remembered XLA choice, or graph at its fastest timed count when this run is too short to repay
    compiling XLA again.

    A remembered XLA choice compiles XLA in every run that reuses it. The run that timed it recorded
    the compile (XLA's first call less graph's, `StepTiming.warmup_s`) and both modes' step times;
    when the steps XLA saves over `planned_steps` (graph's fastest step time less XLA's, times the
    steps) come to less than that compile, graph trains instead, and the reason says so.

    Args:
        choice: the remembered `ExecutionChoice`.
        planned_steps: training steps (batches) this run takes; None or 0 when unknown (the choice
            stands).

    Returns:
        `choice` unchanged, or a copy with `execution="graph"`, graph's fastest count and the reason.
    """
    timings = choice.timings
    xla = [t for label, t in timings.items() if label.startswith("xla") and t.steps_per_execution
           == choice.steps_per_execution]
    graphs = [t for label, t in timings.items() if label.startswith("graph")]
    if choice.execution != "xla" or not planned_steps or not xla or "xla" not in timings or "graph" not in timings:
        return choice
    graph = min(graphs, key=lambda t: t.step_time_s)
    compile_s = max(0.0, timings["xla"].warmup_s - timings["graph"].warmup_s)
    saved = (graph.step_time_s - xla[0].step_time_s) * planned_steps
    if saved >= compile_s:
        return choice
    return dataclasses.replace(
        choice, execution="graph", steps_per_execution=graph.steps_per_execution,
        reason=(f"xla would save {saved:.1f} s over this run's {planned_steps} steps, less than compiling it "
                f"again takes (about {compile_s:.1f} s): graph at {graph.steps_per_execution} steps/execution"))


def steps_to_time(modes: int, base: int, counts: Sequence[int] = ()) -> int:
    """About how many training steps (batches) an `ExecutionTrial` takes to time every candidate: each
    duel (the other modes at `base` steps per execution, then each larger count) times both sides
    `MIN_TIMED_CALLS` calls of at least `MIN_TIMED_STEPS` steps after the challenger's compiling call,
    in executions of the largest count."""
    largest = max((base, *counts))
    duels = [(base, base)] * (modes - 1) + list(zip([base, *sorted(c for c in counts if c > base)],
                                                    sorted(c for c in counts if c > base)))

    def calls(spe):  # as _timed_enough
        return 2 if 2 * spe >= 2 * MIN_TIMED_STEPS else max(MIN_TIMED_CALLS, math.ceil(MIN_TIMED_STEPS / spe))

    steps = base + sum(a * calls(a) + b * (calls(b) + 1) for a, b in duels)
    return math.ceil(steps / largest) * largest
