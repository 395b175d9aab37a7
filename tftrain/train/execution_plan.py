"""The run's execution mode and steps per execution, decided in one place: `--execution auto` and
`--steps-per-execution auto` timed on the run's own first training steps (`ExecutionTrial`) or
remembered (`tftrain.runtime.execution_memory`), the counts a run may take, and one step per execution
for the user's per-batch hooks. The `Trainer` owns one `ExecutionPlanner`."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from tftrain.errors import XlaCompileError
from tftrain.train.model_facts import convolution_layers, varying_shape

AUTO_PROBE_BATCHES = 16
"""Batches of the probe data that key the execution memory (their shapes and dtypes) and that a
remembered XLA choice, and `--precision auto`, are checked and timed on."""

STEPS_PER_EXECUTION_CANDIDATES = (1, 8, 32, 64)
"""Counts `--steps-per-execution auto` may take on one replica: it starts from the largest that fits
up to 8, then times the larger ones (`tftrain.runtime.execution_trial.ExecutionTrial`)."""

PROBE_CACHE_BYTES = 256 * 2**20
"""`--execution auto` caches its probe batches when they hold at most this many bytes (256 MiB)."""


def _cached_if_small(probe):
    """The probe batches cached in memory when their static shapes say they fit `PROBE_CACHE_BYTES`:
    the candidates are then timed on the model's step, not on the input pipeline refilling (repeating
    the first batches of a shuffled pipeline restarts it). Unknown sizes are not cached. The cache is
    filled by one pass here: a strategy's input iterator reads ahead and is torn down mid-pass after the
    timed steps, and tf.data then warned that a partly read cache was discarded (the first MNIST run
    under `--strategy mirrored`)."""
    import math

    import tensorflow as tf

    size = 0
    for spec in tf.nest.flatten(probe.element_spec):
        dims = spec.shape.as_list() if spec.shape.rank is not None else [None]
        if None in dims or not spec.dtype.size:
            return probe
        size += math.prod(dims) * spec.dtype.size
    if size * AUTO_PROBE_BATCHES > PROBE_CACHE_BYTES:
        return probe
    cached = probe.cache()
    for _ in cached:  # fills the cache whole: later iterators read it, whatever they leave unread
        pass
    return cached


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """What the execution choice needs to know of the run.

    Attributes:
        steps_per_epoch: optimizer steps per epoch; None when unknown.
        accumulation_steps: micro-batches per optimizer step.
        epochs: `--epochs`.
        hooks: names of the user's callbacks with per-batch hooks (`model_facts.batch_hooks`).
        batch_size: the global batch size.
        task: the bound `Task` (its validation and test data check a compiled test step).
        probe: returns the first `AUTO_PROBE_BATCHES` training batches (`probe_batches`).
    """

    steps_per_epoch: Optional[int] = None
    accumulation_steps: int = 1
    epochs: int = 1
    hooks: tuple = ()
    batch_size: int = 0
    task: Any = None
    probe: Optional[Callable] = None

    @property
    def batches_per_epoch(self) -> int:
        """Batches (micro-batches under accumulation) of an epoch; 0 when unknown."""
        return (self.steps_per_epoch or 0) * self.accumulation_steps

    @property
    def planned_steps(self) -> int:
        """Training steps (batches, micro-batches under accumulation) of the whole run; 0 when unknown."""
        return self.batches_per_epoch * self.epochs


def probe_batches(task, batch_size: int):
    """The first `AUTO_PROBE_BATCHES` training batches of `task`, cached when small (`_cached_if_small`)."""
    return _cached_if_small(task.probe_data(batch_size, AUTO_PROBE_BATCHES))


class ExecutionPlanner:
    """Owns the execution mode and steps per execution of one run.

    Args:
        asked: the run's `RuntimeConfig` (`execution`, `steps_per_execution`, `remember_execution`).
        backup_every_steps: `--backup-every-steps` (optimizer steps), or None.
        loop: the training loop (`times_execution`, `per_step_hooks`, `validates`, `name`).
        replicas: replicas training in sync.
        device_kind: `"cpu"` or `"gpu"`.
        console: the run's `Console`.

    Attributes:
        execution: the mode that trains (`"graph"` until a trial decides).
        choice: the `ExecutionChoice` made, or None.
        trial: the `ExecutionTrial` timing candidates inside `fit`, or None.
    """

    def __init__(self, asked, backup_every_steps: Optional[int], loop, replicas: int, device_kind: str, console):
        self.asked, self.backup_every_steps, self.loop = asked, backup_every_steps, loop
        self.replicas, self.device_kind, self.console = replicas, device_kind, console
        self.execution, self.choice, self.trial, self.run = asked.execution, None, None, RunFacts()

    def choose(self, model, run: RunFacts) -> None:
        """`--execution auto` and `--steps-per-execution auto`: reuses the choice an earlier run timed
        for the same model, batch and machine (`tftrain.runtime.execution_memory`; an XLA choice is
        compiled once more first, and forgotten and timed again if that fails), unless
        `--no-remember-execution`; else installs an `ExecutionTrial`, which times graph against XLA,
        then the faster at larger steps per execution, on the run's first training steps (a candidate
        XLA cannot compile is skipped with XLA's reason; XLA is not timed over batches whose shape
        varies, `varying_shape`, nor on CPUs for a model that convolves, `convolution_layers`). A run too
        short to time them on, or a loop that cannot, trains in graph at the rule's count."""
        from tftrain.runtime.execution import AUTO_CANDIDATES

        self.run = run
        self._keep_batch_hooks_per_step(model)
        rt = self.asked
        modes = AUTO_CANDIDATES if rt.execution == "auto" else (rt.execution,)
        counts = self.candidates(self.run)
        if rt.execution == "xla" and not model.jit_compile:  # Keras's compile turned XLA off for this model
            self.execution, modes = "graph", ("graph",)
            self.console.warn("--execution xla: Keras compiles this model without XLA (one of its layers does not "
                              "support jit_compile, e.g. TextVectorization or StringLookup), so it trains in graph "
                              "mode; pass --execution graph to say so")
        elif rt.execution == "xla":  # before training, not after it: the test step compiles under XLA too
            reason = self._test_step_failure(model)
            if reason:
                raise XlaCompileError(f"XLA could not compile the test step of this model: {reason}. "
                                      "Try --execution graph.")
        if rt.execution == "eager" or (len(modes) == 1 and not counts):
            return
        if not self.loop.times_execution:
            self.execution = "graph" if rt.execution == "auto" else rt.execution
            if rt.execution == "auto":
                self.console.line(f"execution: auto -> graph ({self.loop.name} does not time graph against XLA)")
            return
        if self.replicas > 1:  # Keras 3 cannot compile a cross-replica step with XLA
            self._untimed(model, modes, f"XLA does not run across {self.replicas} replicas; graph is "
                                        "the only mode")
            return
        probe = self.run.probe()  # for the batches' shapes, the memory's key and a remembered XLA's check
        modes, why = self._auto_modes(modes, probe.element_spec, model)
        if why and not counts:
            self._untimed(model, modes, why)
            return
        if why:
            self.console.line(f"execution: auto: {why}")
        if counts:  # start from the rule's count, or the largest allowed below it (1 always is)
            start = max(c for c in counts if c <= model.steps_per_execution)
            if start != model.steps_per_execution:  # functions traced at the old count (the precision timing's,
                model.steps_per_execution, model.train_function, model.test_function = start, None, None  # XLA's check)
        key = self._execution_key(model, probe, modes, counts)
        choice = self._remembered(model, key, counts, probe)
        if choice is not None:
            self.execution, self.choice = choice.execution, choice
            self.console.line(f"execution: auto -> {choice.describe()}")
            self._say_callback_frequency(model.steps_per_execution, counts)
            return
        self._start_trial(model, modes, counts, key)

    def _auto_modes(self, modes: tuple, element_spec, model) -> tuple:
        """`(modes, why)`: `modes` without XLA, and why, when a batch (of `element_spec`) varies past its
        batch dimension (`varying_shape`: XLA would compile a program for each shape) or when the run is on
        CPUs and `model` convolves (`convolution_layers`: XLA's convolutions are slower there); else
        `(modes, None)`."""
        if "xla" not in modes or len(modes) == 1:
            return modes, None
        why = self._xla_not_timed(element_spec, model)
        return (modes, None) if why is None else (tuple(m for m in modes if m != "xla"), why)

    def _xla_not_timed(self, element_spec, model) -> Optional[str]:
        varying = varying_shape(element_spec)
        if varying is not None:
            return (f"xla not timed: the batches' {varying} is not static, and XLA compiles a program for each "
                    "shape it meets (tf.ensure_shape or padding to one length fixes it; --execution xla tries it "
                    "anyway)")
        convolutions = convolution_layers(model) if self.device_kind == "cpu" else []
        if convolutions:
            return (f"xla not timed: the model convolves ({', '.join(convolutions)}), and XLA on a CPU runs "
                    "convolutions without the oneDNN kernels graph uses (2.5-10x slower in the zoo; "
                    "--execution xla tries it anyway)")
        return None

    def every_step_hooks(self, run: RunFacts) -> tuple:
        """The user's callbacks with per-batch hooks (`run.hooks`) when `--steps-per-execution auto` runs them
        every batch, as plain Keras does (one step per execution); else ()."""
        if self.asked.steps_per_execution != "auto" or not self.loop.per_step_hooks:
            return ()  # a loop without per-step hooks calls batch hooks once an epoch, whatever the count
        return run.hooks

    def _keep_batch_hooks_per_step(self, model) -> None:
        """One step per execution where `every_step_hooks` names callbacks; one line says so."""
        hooks = self.every_step_hooks(self.run)
        if not hooks:
            return
        model.steps_per_execution, model.train_function = 1, None  # a function traced at 8 (a timing) is dropped
        self.console.line(f"steps/execution: auto -> 1: {', '.join(hooks)} runs every batch, as in plain Keras "
                          "(--steps-per-execution N runs it once every N batches, faster)")

    def _start_trial(self, model, modes, counts, key) -> None:
        """Installs the `ExecutionTrial` on `model` for this run's `fit`, or, when the run has fewer
        training steps than timing every candidate needs, leaves graph at the rule's count."""
        from tftrain.runtime.execution_memory import ExecutionMemory
        from tftrain.runtime.execution_trial import ExecutionTrial
        from tftrain.runtime.trial_rules import steps_to_time

        base = model.steps_per_execution
        needed = steps_to_time(len(modes), base, counts)
        planned = self.run.planned_steps
        if len(modes) == 1 and max(counts, default=0) <= base:
            why = (f"the only candidate: no count above {base} steps per execution fits this run (the batches of "
                   "an epoch, --backup-every-steps)")
        elif planned and planned < needed:
            why = f"this run's {planned} training steps are too few to time the candidates on (about {needed})"
        else:
            why = None
        if why:
            self._untimed(model, modes, f"{why}; nothing timed or remembered")
            return

        def settled(choice):
            self.execution, self.choice = choice.execution, choice
            self.console.line(f"execution: auto -> {choice.describe()}")
            # A run that ended during a duel of counts has its mode decided: remembered, the count undecided.
            if key and choice.trial["modes_decided"] and self.asked.remember_execution:
                ExecutionMemory().put(key, choice)

        self.execution = modes[0] if len(modes) == 1 else "graph"
        self.trial = ExecutionTrial(
            model, modes, tuple(c for c in counts if c != model.steps_per_execution),
            examples_per_step=self.run.batch_size, on_settled=settled, planned_steps=planned or None,
            steps_per_epoch=self.run.batches_per_epoch or None)
        self.trial.install()
        larger = [c for c in sorted(counts) if c > base]  # the trial times no count below the compiled one
        timed = " or ".join(m + (" (if the run is long enough to repay compiling it)" if m == "xla" and planned
                                 and len(modes) > 1 else "") for m in modes)
        if larger:
            timed += f", at {base} to {larger[-1]} steps per call"
        every = "every step" if model.steps_per_execution == 1 else f"once every {model.steps_per_execution} steps"
        self.console.line(f"execution: auto: {timed}, whichever trains faster on the first steps (which train the "
                          f"model); batch callbacks fire {every}")

    def _untimed(self, model, modes, reason: str) -> None:
        """Trains without timing: the one mode asked for, else graph, at the compiled count; one line says why.
        A graph train function already on the model (`--precision auto`'s timing traced it) is kept for
        `fit`, which would trace the same function again: callers that change the count drop it first."""
        from tftrain.runtime.execution import ExecutionChoice

        if model.jit_compile != (modes == ("xla",)):  # a graph function traced by the precision timing is kept
            model.jit_compile, model.train_function = modes == ("xla",), None
        self.execution = modes[0] if len(modes) == 1 else "graph"
        self.choice = ExecutionChoice(self.execution, {}, reason,
                                                steps_per_execution=model.steps_per_execution)
        self.console.line(f"execution: auto -> {self.execution}, {model.steps_per_execution} steps/execution: "
                          f"{reason}")

    def _say_callback_frequency(self, spe: int, counts) -> None:
        if spe > 1 and counts:
            self.console.line(f"           Keras batch callbacks fire once per execution of "
                              f"{spe} steps (--steps-per-execution 1 for every step)")

    def checkpoint_unit(self, run: RunFacts, compiled: int) -> int:
        """Batches a checkpoint position must be a multiple of: an execution (of the `compiled` count, 1 where
        auto may choose any count or runs hooks every step, as the loop runs it: MultiWorkerLoop may lower it)
        and an optimizer step."""
        import math

        spe = compiled if self.loop.per_step_hooks else 1
        if self.candidates(run) or self.every_step_hooks(run):  # any count auto may choose divides the interval
            spe = 1
        if run.steps_per_epoch:
            spe = self.loop.steps_per_execution_for(spe, run.batches_per_epoch)
        return math.lcm(spe, run.accumulation_steps)

    def candidates(self, run: RunFacts) -> tuple:
        """Counts `--steps-per-execution auto` may time: one replica and per-step hooks only, at most
        an epoch, and dividing `--backup-every-steps` (a checkpoint is written between executions)."""
        import math

        if (self.asked.steps_per_execution != "auto" or self.replicas > 1
                or not self.loop.per_step_hooks or not self.loop.times_execution or self.every_step_hooks(run)):
            return ()  # nothing is timed: the rule's count (AUTO_STEPS_PER_EXECUTION) runs
        acc, batches = run.accumulation_steps, run.batches_per_epoch
        counts = [c for c in STEPS_PER_EXECUTION_CANDIDATES if not batches or c <= batches]
        backup = self.backup_every_steps
        if backup is not None:
            counts = [c for c in counts if (backup * acc) % math.lcm(c, acc) == 0]
        return tuple(counts) or (1,)

    def _execution_key(self, model, probe, modes, counts) -> Optional[str]:
        """The execution memory's key for this model, batch (`probe`'s), machine and the candidates this
        run may take (an epoch's length or the backup interval can rule counts out, so a short run's
        choice never stands in for a full run's); None when nothing is remembered (`--no-remember-execution`)."""
        from tftrain.runtime.execution_memory import execution_key

        if not self.asked.remember_execution:  # (several replicas never get here: nothing is timed)
            return None
        return execution_key(model, probe, (*modes, *(f"steps_per_execution {c}" for c in counts)))

    def _remembered(self, model, key, counts, probe):
        """The remembered `ExecutionChoice` under `key`, with `model` set up for it, if it still
        compiles on `probe`'s batches (and its test step too, for XLA) and timed every candidate this run
        could repay (`time_again_from_steps`); else None (a stale choice is forgotten)."""
        from tftrain.runtime.execution_memory import ExecutionMemory
        from tftrain.runtime.trial_rules import weigh_remembered_xla

        memory = ExecutionMemory() if key else None
        choice = memory.get(key) if memory else None
        if choice is not None and counts and choice.steps_per_execution not in counts:
            return None
        planned, untimed_for = self.run.planned_steps, choice and choice.time_again_from_steps
        if untimed_for and (not planned or planned >= untimed_for):
            self.console.line(f"execution: the remembered choice left a candidate untimed for runs under "
                              f"{untimed_for} steps; this run of {planned or 'unknown'} steps times them again")
            return None
        if choice is not None:
            choice = weigh_remembered_xla(choice, self.run.planned_steps)
        if choice is None:
            return None
        choice = self._still_compiles(model, probe, choice)
        if choice is None:
            memory.forget(key)
            return None
        return self._with_test_step(model, choice)

    def _test_step_failure(self, model) -> Optional[str]:
        """XLA's reason when `model`'s test step (validation inside `fit`, the test evaluation) fails in
        its current mode on one validation (else test) batch; None when it runs or there is no such data.
        The compiled test function stays on the model for `fit` and `evaluate`."""
        from tftrain.runtime.execution import xla_failure_reason

        if not model.jit_compile:
            return None
        gb = self.run.batch_size
        data = self.run.task.validation_data(gb) or self.run.task.test_data(gb)
        if data is None or not hasattr(data, "take"):
            return None
        try:
            model.evaluate(data.take(1), verbose=0)
        except Exception as error:  # noqa: BLE001 (XLA's refusal; any other error is the model's own)
            reason = xla_failure_reason(error)
            if reason is None:
                raise
            return reason
        return None

    def _with_test_step(self, model, choice):
        """`choice`, or graph at its steps per execution when XLA, chosen for the training step, cannot
        compile the test step (Keras's `jit_compile` covers both): one line says why."""
        reason = self._test_step_failure(model) if choice.execution == "xla" else None
        if not reason:
            return choice
        model.jit_compile = False
        model.train_function = model.test_function = model.predict_function = None  # rebuilt in graph by fit
        self.console.line(f"execution: xla compiles the training step but not the test step ({reason}); graph")
        return dataclasses.replace(choice, execution="graph", reason=f"xla cannot compile the test step: {reason}",
                                   skipped=(*choice.skipped, f"xla test step: {reason}"))

    def _still_compiles(self, model, probe, choice):
        """Sets `model` up for a remembered choice; an XLA one is compiled and run once (its train
        function is kept for `fit`, and the seconds of that first, compiling call are the returned choice's
        `compiled_before_fit_s`). Returns the choice, or None, with one line, when Keras or XLA refuses it
        now."""
        from tftrain.runtime.execution import failure_line
        from tftrain.runtime.execution_probe import check_compiles

        compiled_count = model.steps_per_execution
        model.jit_compile = choice.execution == "xla"
        if choice.steps_per_execution:
            model.steps_per_execution = choice.steps_per_execution
        if model.jit_compile != (choice.execution == "xla"):  # Keras refused XLA for this model now
            model.jit_compile, model.steps_per_execution = False, compiled_count
            return None
        if choice.execution != "xla":
            if model.steps_per_execution != compiled_count:  # a graph function traced at the old count
                model.train_function = None
            return choice
        try:
            timing = check_compiles(model, probe, batch_size=self.run.batch_size)
        except Exception as error:  # noqa: BLE001 (XLA refuses what it compiled before: time again)
            self.console.line(f"execution: the remembered choice xla fails now ({failure_line(error)}); timing again")
            model.jit_compile, model.steps_per_execution = False, compiled_count
            model.train_function = None  # the XLA one check_compiles built
            return None
        return dataclasses.replace(choice, compiled_before_fit_s=round(timing.warmup_s, 3))

    def raise_if_xla_failed(self, error: Exception) -> None:
        """Raises `XlaCompileError` (XLA's reason and the fix in one line) when XLA, asked for or
        chosen, could not compile or run a step (training, or validation inside `fit`)."""
        from tftrain.runtime.execution import xla_failure_reason

        reason = xla_failure_reason(error) if self.execution == "xla" else None
        if reason:
            raise XlaCompileError(f"XLA could not compile a step of this model: {reason}. Try --execution graph.") \
                from error
