"""The rules an `ExecutionTrial` (`tftrain.runtime.execution_trial`) judges candidates by: how long a
duel times each side and when it ends early, how a step time is read, whether a run repays compiling
XLA, and the verdict lines. Pure functions of timed figures (no TensorFlow), testable alone.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

from tftrain.runtime.execution import KEEP_FIRST_WITHIN, ExecutionChoice, StepTiming

MIN_TIMED_STEPS = 32
"""Optimizer steps each side of a duel is timed for at least (after its compiling call)."""

MIN_TIMED_CALLS = 3
"""Calls of its train function each side of a duel is timed for at least (`_step_time`)."""

GIVE_UP_RATIO = 1.3
"""A duel ends early once one side's step time (over two calls and `MIN_GIVE_UP_STEPS`) is this factor slower."""

MIN_GIVE_UP_STEPS = 8
"""Optimizer steps each side is timed for at least before a duel may end early: two calls of a short
step can differ by more than `GIVE_UP_RATIO` on a loaded host."""

XLA_MAX_SPEEDUP = 2.5
"""The largest speed-up XLA is assumed to give over graph at the same count, when deciding whether a run
repays compiling it; see benchmarks/results/zoo.json."""


XLA_COMPILE_RATIO = 3.25
"""XLA's first call (its compile) is estimated as this many times graph's first call, when deciding
whether a run repays compiling it, for a model with a recurrent layer: its step's `while` loop is compiled
whole (3.24x measured on a GRU)."""

XLA_COMPILE_RATIO_NO_LOOP = 2.0
"""`XLA_COMPILE_RATIO` for a model without a recurrent layer (0.6-1.9x measured on the zoo's others)."""


def xla_compile_ratio(model) -> float:
    """`XLA_COMPILE_RATIO` when `model` holds a recurrent layer (`keras.layers.RNN`: LSTM, GRU, ..., also inside
    nested models and wrappers such as `Bidirectional`), else `XLA_COMPILE_RATIO_NO_LOOP`."""
    import keras

    seen, todo = set(), [model]
    while todo:
        layer = todo.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        if isinstance(layer, keras.layers.RNN):
            return XLA_COMPILE_RATIO
        todo += [*getattr(layer, "layers", ()), *(getattr(layer, name, None) for name in ("layer", "forward_layer"))]
        todo = [t for t in todo if isinstance(t, keras.layers.Layer)]
    return XLA_COMPILE_RATIO_NO_LOOP


def kept_calls(samples: list) -> list:
    """Timed calls (`(seconds, steps)` each) that ran whole executions (an epoch's last call may run fewer steps)."""
    full = max((steps for _, steps in samples), default=0)
    return [(s, n) for s, n in samples if n == full and n > 0]


def step_time(samples: list) -> Optional[float]:
    """Seconds per step over the whole executions timed: total seconds over total steps.

    Not the median: XLA compiles a program per input shape, a cost a run with varying shapes (sequences
    padded per batch) keeps paying.
    """
    kept = kept_calls(samples)
    return sum(s for s, _ in kept) / sum(n for _, n in kept) if kept else None


def timed_enough(kept: list) -> bool:
    """`MIN_TIMED_CALLS` calls of `MIN_TIMED_STEPS` steps in all, or two calls of twice as many (so that a
    large count does not make a duel outlast short runs)."""
    steps = sum(n for _, n in kept)
    return (len(kept) >= MIN_TIMED_CALLS and steps >= MIN_TIMED_STEPS) or (len(kept) >= 2
                                                                           and steps >= 2 * MIN_TIMED_STEPS)


def timing(samples: list, examples_per_step: int, spe: int, warmup_s: Optional[float]) -> StepTiming:
    """The `StepTiming` of one candidate's `samples` (`(seconds, steps)` each); `warmup_s` its compiling call's."""
    kept, step = kept_calls(samples), step_time(samples)
    return StepTiming(step_time_s=step, examples_per_sec=examples_per_step / step if step > 0 else float("inf"),
                      mean_step_time_s=sum(s for s, _ in kept) / sum(n for _, n in kept),
                      batch_size=examples_per_step, steps_per_execution=spe,
                      timed_steps=sum(n for _, n in kept), warmup_s=warmup_s or 0.0,
                      execution_times_s=tuple(s for s, _ in kept))


def duel_verdict(incumbent: str, challenger: str, speedup: float, challenger_won: bool,
                 step_times_s: Optional[tuple] = None) -> str:
    """A duel's outcome line, from the calls timed side by side in it. `speedup` is the incumbent's step
    time over the challenger's; `step_times_s` both sides' seconds per step in the duel."""
    if step_times_s is not None:
        inc, chal = (t * 1e3 for t in step_times_s)
        figures = f" ({incumbent} {inc:.2f}, {challenger} {chal:.2f} ms/step)"
    else:
        figures = ""
    if challenger_won:
        return f"{challenger} {speedup:.2f}x faster than {incumbent} side by side{figures}"
    if speedup > 1:
        return (f"{incumbent} kept: {challenger} only {speedup - 1:.0%} faster side by side{figures}, within the "
                f"{KEEP_FIRST_WITHIN:.0%} timing noise")
    return f"{incumbent} {1 / speedup:.2f}x faster than {challenger} side by side{figures}"


def weigh_remembered_xla(choice: ExecutionChoice, planned_steps: Optional[int]) -> ExecutionChoice:
    """A remembered XLA choice, or graph at its fastest timed count when this run is too short to repay
    compiling XLA again.

    The compile is XLA's first call less graph's (`StepTiming.warmup_s`); when the time XLA saves over
    `planned_steps` (None or 0: unknown, the choice stands) is less, graph trains and the reason says so.
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
    """About how many training steps an `ExecutionTrial` takes to time every candidate (each duel as
    `timed_enough` needs, after the challenger's compiling call), in executions of the largest count."""
    largest = max((base, *counts))
    duels = [(base, base)] * (modes - 1) + list(zip([base, *sorted(c for c in counts if c > base)],
                                                    sorted(c for c in counts if c > base)))

    def calls(spe):  # as timed_enough
        return 2 if 2 * spe >= 2 * MIN_TIMED_STEPS else max(MIN_TIMED_CALLS, math.ceil(MIN_TIMED_STEPS / spe))

    steps = base + sum(a * calls(a) + b * (calls(b) + 1) for a, b in duels)
    return math.ceil(steps / largest) * largest
