"""The run's dtype policy, decided in one place: the rule's pick (`tftrain.runtime.precision`), then
`--precision auto`'s timing of float32 against mixed_bfloat16 on a CPU, and its falls back to float32
(a model that does not build or step under the mixed policy, labels a low-precision output would round,
a `train_step` that does not scale its loss). The `Trainer` owns one `PrecisionPlanner`; the policy in
force is its `info`, what auto decided its `record`."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Optional

from tftrain.errors import PrecisionError


class PrecisionPlanner:
    """Owns the dtype policy of one run.

    Args:
        asked: `--precision` (`"auto"` or a policy name).
        info: the `PrecisionInfo` the runtime set up (the rule's pick under auto).
        device_kind: `"cpu"` or `"gpu"`.
        say: prints one line of the plan.
    """

    def __init__(self, asked: str, info, device_kind: str, say: Callable[[str], None]):
        self.asked, self.info, self.device_kind, self.say = asked, info, device_kind, say
        self.record: Optional[dict] = None  # metrics.json's `precision_auto`: what auto decided and why

    @property
    def auto(self) -> bool:
        return self.asked == "auto"

    def set(self, policy: str) -> None:
        """Makes `policy` Keras's global dtype policy (models built next take it) and the run's."""
        from tftrain.runtime.precision import set_precision

        self.info = set_precision(policy)

    def clash(self, error: BaseException) -> bool:
        """Whether `error` is a dtype clash under a mixed policy that `--precision auto` took."""
        from tftrain.runtime.precision import is_dtype_mismatch

        dtype = self.info.compute_dtype
        return self.auto and dtype != "float32" and is_dtype_mismatch(error, dtype)

    def refuse_clash(self, error: BaseException) -> None:
        """Raises `ConfigError` (the line that clashed and the flags that train) when `error` is a dtype clash
        under a mixed policy asked by name."""
        from tftrain.errors import ConfigError
        from tftrain.runtime.precision import is_dtype_mismatch

        dtype = self.info.compute_dtype
        if self.auto or dtype == "float32" or not is_dtype_mismatch(error, dtype):
            return
        import re

        text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # Keras's colour codes
        line = next(line.strip() for line in text.splitlines() if "16" in line)
        raise ConfigError(f"The model does not build or step under --precision {self.asked} ({line[:300]}): a "
                          "layer mixes float32 with the policy's compute dtype. Pass --precision float32, or "
                          "--precision auto (float32 where the model needs it), or cast in that layer.") from None

    def decide(self, choice, remembered: bool = False, memory=None, key: Optional[str] = None):
        """Records and says `choice` (a `PrecisionChoice`), and remembers one that timed (or left the twin
        untimed for shorter runs) under `key`; returns it. The policy is set by the caller."""
        if memory is not None and key and not remembered and (choice.complete or choice.time_twin_from_steps):
            memory.put_entry(key, choice.to_dict())
        self.record = choice.to_dict()
        self.say(f"precision: auto -> {choice.policy} [remembered; --no-remember-execution times it again]; "
                 f"an earlier run timed {choice.describe()}" if remembered
                 else f"precision: auto -> {choice.describe()}")
        return choice

    def choose(self, build: Callable, probe, batch_size: int, planned_steps: int, remember: bool):
        """`--precision auto` on a CPU with native bfloat16 (`timeable`): the model built under float32, plain
        Keras's policy, is timed against its mixed_bfloat16 twin on the run's batches `probe`
        (`tftrain.runtime.precision.choose_precision`; the twin only when the `planned_steps` repay it), and
        float32 kept unless bfloat16 is more than 5% faster. The choice is remembered per model, batch and
        machine unless not `remember`. `build(fall_back)` builds and compiles the task's model under the policy
        set. Returns the model to train; its policy is `info`."""
        from tftrain.runtime.execution_memory import ExecutionMemory, execution_key
        from tftrain.runtime.precision import choose_precision

        model = self._built("float32", build)
        memory = ExecutionMemory() if remember else None
        base = execution_key(model, probe, ("precision: float32 vs mixed_bfloat16",)) if memory else None
        key = f"precision-{base}" if base else None
        choice = remembered_choice(memory.get_entry(key) if key else None, planned_steps)
        remembered, twins = choice is not None, []
        if choice is None:
            choice = choose_precision(model, lambda: twins.append(self._built("mixed_bfloat16", build, False))
                                      or twins[-1], probe, batch_size=batch_size, planned_steps=planned_steps or None)
        choice = self.decide(choice, remembered, memory, key)
        if choice.policy == "mixed_bfloat16":
            twin = twins[-1] if twins else self._remembered_twin(build, memory, key)
            if twin is not None:
                return twin
        self.set("float32")
        return model

    def _built(self, policy: str, build: Callable, fall_back: bool = True):
        self.set(policy)
        return build(fall_back)

    def _remembered_twin(self, build: Callable, memory, key):
        """The model built under a remembered mixed_bfloat16, or None when it no longer builds: one line,
        and float32 remembered instead."""
        from tftrain.runtime.execution import failure_line
        from tftrain.runtime.precision import PrecisionChoice

        try:
            return self._built("mixed_bfloat16", build, False)
        except Exception as error:  # noqa: BLE001 (float32, built and timed-free, trains as plain Keras)
            choice = PrecisionChoice("float32", {}, f"mixed_bfloat16 fails now ({failure_line(error, 'bfloat16')})")
            self.decide(choice, False, memory, key)
            return None

    def or_float32(self, action: Callable, what: str):
        """`action()`; after a dtype clash under the mixed policy auto took (`clash`), float32 with one line
        (`the model does not <what> under <policy>`) and `action()` again; any other error is raised."""
        try:
            return action()
        except Exception as error:  # noqa: BLE001 (re-raised unless the auto-chosen policy caused it)
            if not self.clash(error):
                raise
            self.fall_back(f"the model does not {what} under {self.info.policy}", error)
        return action()

    def fall_back(self, why: str, error: BaseException) -> None:
        """float32 after auto's mixed policy failed (`why`, `error`): one line, and the record."""
        from tftrain.runtime.execution import failure_line

        policy, reason = self.info.policy, f"{why} ({failure_line(error, self.info.compute_dtype)})"
        self.set("float32")
        self.record = {"policy": "float32", "step_time_s": {}, "reason": reason, "instead_of": policy}
        self.say(f"precision: auto -> float32: {reason}")

    def float32_for_labels(self, why: str) -> None:
        """float32 where the sanity pass found a low-precision output would round the labels (`why`)."""
        from tftrain.runtime.precision import PrecisionChoice

        self.set("float32")
        self.decide(PrecisionChoice("float32", {}, why[0].lower() + why[1:]))

    def timeable(self, untimed_because: Optional[str]) -> bool:
        """Whether auto times float32 against the mixed_bfloat16 its rule picked on a CPU: where the run
        gives no reason it cannot (`untimed_because`: `--deterministic`, a mode other than graph, several
        replicas, a loop that cannot time it)."""
        return self.auto and self.device_kind == "cpu" and self.info.policy == "mixed_bfloat16" \
            and untimed_because is None

    def settle_untimed(self, why: str) -> None:
        """Under auto, float32 where the rule picked mixed_bfloat16 on a CPU and the run cannot time it
        (`why`): bfloat16 speeds only some models up on a CPU, so it is taken only when measured faster."""
        from tftrain.runtime.precision import PrecisionChoice

        if not self.auto or self.device_kind != "cpu" or self.info.policy != "mixed_bfloat16":
            return
        self.set("float32")
        self.decide(PrecisionChoice("float32", {}, f"mixed_bfloat16 only when timing shows it faster on this CPU, "
                                                   f"and {why}"))

    def for_unscaled_step(self, model_name: str, devices, warn: Callable[[str], None]) -> bool:
        """A model whose own `train_step` does not scale its loss, under mixed_float16 (keras-team/keras#20894):
        under auto, another policy is set and True returned (rebuild the model); an explicit mixed_float16 is
        kept, with a warning that says the fix (False)."""
        from tftrain.runtime.precision import unscaled_step_precision

        why = (f"{model_name}.train_step does not scale its loss: run under two loss scales, its updates shrank "
               "with the larger (it does not take the gradients of self.optimizer.scale_loss(loss))")
        if not self.auto:
            warn(f"{why}: under mixed_float16 its gradients are divided by the loss scale and the model does not "
                 "learn (keras-team/keras#20894). Take the gradients of self.optimizer.scale_loss(loss) in "
                 "train_step, or pass --precision mixed_bfloat16 or float32.")
            return False
        policy = unscaled_step_precision(devices)
        self.set(policy)
        self.say(f"precision: auto -> {policy}, not mixed_float16: {why}, so loss scaling would divide its gradients "
                 "by the scale (keras-team/keras#20894)")
        return True

    def raise_if_first_step_failed(self, error: BaseException, model) -> None:
        """Raises `PrecisionError` (the error and the fix in one line) when the first training step failed on
        a dtype clash under a mixed policy auto took untimed (no timing ran the step first)."""
        from tftrain.runtime.execution import failure_line

        if model.optimizer is None or not self.clash(error) or int(model.optimizer.iterations.numpy()):
            return
        why = failure_line(error, self.info.compute_dtype).rstrip(".")
        raise PrecisionError(f"The model's first training step failed under {self.info.policy}, which "
                             f"--precision auto chose: {why}. Pass --precision float32 (plain Keras's policy), or "
                             "make the step's dtypes agree (keras.ops casts).") from error


def remembered_choice(entry, planned_steps: int):
    """The `PrecisionChoice` a memory entry holds, or None (none, of another shape, or a float32 kept
    untimed by a shorter run than this one: `planned_steps`, 0 when unknown)."""
    from tftrain.runtime.precision import PrecisionChoice

    try:
        choice = PrecisionChoice(**{k: entry[k] for k in ("policy", "step_time_s", "reason")},
                                 complete=entry.get("complete", True),
                                 time_twin_from_steps=entry.get("time_twin_from_steps"))
    except (TypeError, KeyError, AttributeError):
        return None
    untimed_for = choice.time_twin_from_steps
    return None if untimed_for and (not planned_steps or planned_steps >= untimed_for) else choice


@contextlib.contextmanager
def global_policy_kept():
    """Keras's global dtype policy put back after the block as it was before it (float32 when Keras was not
    imported yet): a run sets its own, which a model the caller builds afterwards must not inherit."""
    keras = sys.modules.get("keras")
    previous = keras.mixed_precision.global_policy().name if keras is not None else "float32"
    try:
        yield
    finally:
        keras = sys.modules.get("keras")
        if keras is not None:
            keras.mixed_precision.set_global_policy(previous)
