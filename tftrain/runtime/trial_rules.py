"""The rules an `ExecutionTrial` (`tftrain.runtime.execution_trial`) judges its candidates by: how long
each side of a duel is timed and when a duel ends early, how a step time is read from timed calls,
whether a run is long enough to repay compiling XLA, and the verdict lines it prints.

Pure functions of timed figures (no TensorFlow), so that they can be read and tested alone.
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


def kept_calls(samples: list) -> list:
    """Timed calls (`(seconds, steps)` each) that ran whole executions (an epoch's last call may run fewer steps)."""
    full = max((steps for _, steps in samples), default=0)
    return [(s, n) for s, n in samples if n == full and n > 0]


def step_time(samples: list) -> Optional[float]:
    """Seconds per step over the whole executions timed: their total seconds over their total steps.

    Not their median: a call that compiles for a new input shape is a cost the run keeps paying
    when shapes vary (sequences padded per batch), and XLA compiles a program per shape. Measured
    on an Embedding + GRU over `padded_batch` sequences of 5-59 tokens: XLA's median was 8.96
    ms/step against graph's 19.98, so the trial took XLA, and the run then trained at 39 ms/step.
    """
    kept = kept_calls(samples)
    return sum(s for s, _ in kept) / sum(n for _, n in kept) if kept else None


def timed_enough(kept: list) -> bool:
    """`MIN_TIMED_CALLS` calls of `MIN_TIMED_STEPS` steps in all, or two calls of twice as many (a count
    of 32 or 64 steps per call: waiting for a third call of 64 made the last duel outlast short runs)."""
    steps = sum(n for _, n in kept)
    return (len(kept) >= MIN_TIMED_CALLS and steps >= MIN_TIMED_STEPS) or (len(kept) >= 2
                                                                           and steps >= 2 * MIN_TIMED_STEPS)


def timing(samples: list, examples_per_step: int, spe: int, warmup_s: Optional[float]) -> StepTiming:
    """The `StepTiming` of one candidate's timed calls `samples` (`(seconds, steps)` each), at `spe`
    steps per execution, `warmup_s` its first (compiling) call's seconds."""
    kept, step = kept_calls(samples), step_time(samples)
    return StepTiming(step_time_s=step, examples_per_sec=examples_per_step / step if step > 0 else float("inf"),
                      mean_step_time_s=sum(s for s, _ in kept) / sum(n for _, n in kept),
                      batch_size=examples_per_step, steps_per_execution=spe,
                      timed_steps=sum(n for _, n in kept), warmup_s=warmup_s or 0.0,
                      execution_times_s=tuple(s for s, _ in kept))


def duel_verdict(incumbent: str, challenger: str, speedup: float, challenger_won: bool,
                 step_times_s: Optional[tuple] = None) -> str:
    """A duel's outcome, from the figures it was judged on (the calls timed side by side in it, not
    every call of the run, whose figures the choice line also prints), e.g. `xla 1.40x faster than graph
    side by side (7.10 vs 9.94 ms/step)`, `graph kept: xla only 3% faster side by side, within the 5%
    timing noise`. `speedup` is the incumbent's step time over the challenger's (above 1: the challenger
    was faster); `step_times_s` the incumbent's and the challenger's seconds per step in the duel."""
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

    def calls(spe):  # as timed_enough
        return 2 if 2 * spe >= 2 * MIN_TIMED_STEPS else max(MIN_TIMED_CALLS, math.ceil(MIN_TIMED_STEPS / spe))

    steps = base + sum(a * calls(a) + b * (calls(b) + 1) for a, b in duels)
    return math.ceil(steps / largest) * largest
