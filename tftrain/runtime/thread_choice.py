"""This machine's best CPU thread counts, measured in child processes and remembered.

TensorFlow fixes its thread pools at start-up, so each candidate trains two small reference models in its own
child (`python -m tftrain.runtime.thread_choice --intra N --inter M`). `python -m tftrain.doctor` measures and
remembers; `runtime.setup` applies it for `threads="auto"` (runs never measure: too slow).
Source: https://www.tensorflow.org/api_docs/python/tf/config/threading; figures: `benchmarks/results/threads.md`.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from typing import Optional, Sequence

from tftrain.runtime.threads import cpu_count

KEEP_DEFAULTS_WITHIN = 0.05
"""TensorFlow's defaults are kept unless another candidate is more than this fraction faster."""

CHILD_TIMEOUT_S = 120.0
"""Seconds one candidate's child process may run before it counts as failed."""

BATCH_SIZE, BATCHES = 128, 32
"""Each reference model trains `BATCHES` batches of `BATCH_SIZE` per timed epoch."""


def candidates(cores: Optional[int] = None) -> list:
    """Distinct (intra, inter) candidates: (0, 0), (cores, 1), (cores // 2, 1); `cores` defaults to usable cores."""
    cores = cores or cpu_count()
    return list(dict.fromkeys([(0, 0), (cores, 1), (max(1, cores // 2), 1)]))


def machine_key() -> str:
    """The execution-memory key of this machine: a hash of CPU model, usable cores and TensorFlow version."""
    import tensorflow as tf

    from tftrain.host import cpu_model

    facts = json.dumps(["threads", cpu_model(), cpu_count(), tf.__version__])
    return "threads-" + hashlib.sha256(facts.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class ThreadChoice:
    """The measured thread counts for this machine (0 = TensorFlow's default).

    Attributes:
        speedup: geometric-mean examples/sec over the defaults (1.0 when they were kept).
        rates: `"intra,inter"` -> `{reference model: examples/sec}`.
        failed: `"intra,inter"` -> one line, for candidates whose child failed.
        measured_at: ISO time ("" before it is remembered).
    """

    intra_op: int
    inter_op: int
    speedup: float
    rates: dict
    failed: dict = dataclasses.field(default_factory=dict)
    measured_at: str = ""

    def describe(self) -> str:
        """E.g. `intra-op 2, inter-op 1: 1.12x TensorFlow's defaults (measured 2026-12-02T01:00:00)`."""
        name = lambda n: "default" if n == 0 else str(n)  # noqa: E731
        return (f"intra-op {name(self.intra_op)}, inter-op {name(self.inter_op)}: {self.speedup:.2f}x "
                f"TensorFlow's defaults (measured {self.measured_at or 'now'})")


def _geometric_mean(values) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def pick(rates: dict) -> tuple:
    """`((intra, inter), speedup)` of the fastest of `rates` against `(0, 0)`; `((0, 0), 1.0)` when the defaults
    did not run or nothing beat them by more than `KEEP_DEFAULTS_WITHIN`."""
    if (0, 0) not in rates:
        return (0, 0), 1.0
    base = rates[(0, 0)]
    ratios = {c: _geometric_mean([r[m] / base[m] for m in base if r.get(m)]) for c, r in rates.items()}
    best = max((c for c in ratios if math.isfinite(ratios[c])), key=ratios.get, default=(0, 0))
    if ratios[best] <= 1 + KEEP_DEFAULTS_WITHIN:
        return (0, 0), 1.0
    return best, ratios[best]


def _child(intra: int, inter: int, batches: int) -> dict:
    """`{reference model: examples/sec}` from one candidate's child; RuntimeError on failure."""
    cmd = [sys.executable, "-m", "tftrain.runtime.thread_choice", "--intra", str(intra), "--inter", str(inter),
           "--batches", str(batches)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"}
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timed out after {CHILD_TIMEOUT_S:.0f} s") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"exit code {proc.returncode}: {tail}")
    return json.loads(lines[-1])


def measure_threads(cores: Optional[int] = None, batches: int = BATCHES, most: Optional[int] = None) -> ThreadChoice:
    """Times each `candidates(cores)` setting in a child process, one after another, and `pick`s one.

    Args:
        batches: batches per timed epoch, >= 8. Defaults to `BATCHES`.
        most: time only the first this-many candidates. Defaults to None: all.

    Returns:
        A `ThreadChoice`; failed children are listed in `failed`.
    """
    rates, failed = {}, {}
    for intra, inter in candidates(cores)[:most]:
        try:
            rates[(intra, inter)] = _child(intra, inter, batches)
        except (RuntimeError, ValueError) as e:
            failed[f"{intra},{inter}"] = str(e)
    (intra, inter), speedup = pick(rates)
    return ThreadChoice(intra, inter, speedup, {f"{i},{j}": r for (i, j), r in rates.items()}, failed)


def remember(choice: ThreadChoice, memory=None) -> ThreadChoice:
    """Stores `choice` in the execution memory under `machine_key()`; returns it with `measured_at` set."""
    import datetime

    from tftrain.runtime.execution_memory import ExecutionMemory

    choice = dataclasses.replace(choice, measured_at=datetime.datetime.now().isoformat(timespec="seconds"))
    (memory or ExecutionMemory()).put_entry(machine_key(), dataclasses.asdict(choice))
    return choice


def remembered(memory=None) -> Optional[ThreadChoice]:
    """This machine's remembered `ThreadChoice`, or None (never measured, or another CPU / TensorFlow)."""
    from tftrain.runtime.execution_memory import ExecutionMemory

    entry = (memory or ExecutionMemory()).get_entry(machine_key())
    try:
        choice = ThreadChoice(**entry)
    except TypeError:  # none, or of another shape
        return None
    ok = all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (choice.intra_op, choice.inter_op))
    return choice if ok else None


# --- The child: one candidate ---

def _reference_models():
    """The reference models, compiled: a dense MLP and a small CNN on MNIST-shaped input."""
    import keras
    from keras import layers

    mlp = keras.Sequential([keras.Input((28, 28)), layers.Flatten(), layers.Dense(512, activation="relu"),
                            layers.Dense(512, activation="relu"), layers.Dense(10)])
    cnn = keras.Sequential([keras.Input((28, 28, 1)), layers.Conv2D(16, 3, activation="relu"), layers.MaxPooling2D(),
                            layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(),
                            layers.Flatten(), layers.Dense(10)])
    for model in (mlp, cnn):
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=8, jit_compile=False)
    return {"mlp": mlp, "cnn": cnn}


def _time_reference(model, batches: int) -> float:
    """Examples/sec of the second of two epochs (the first traces)."""
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    n = BATCH_SIZE * batches
    x = rng.random((n, *model.input_shape[1:]), dtype=np.float32)
    y = rng.integers(0, 10, n)
    stamps = []
    stamp = keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: stamps.append(time.perf_counter()),
                                           on_epoch_end=lambda e, logs: stamps.append(time.perf_counter()))
    model.fit(x, y, batch_size=BATCH_SIZE, epochs=2, verbose=0, shuffle=False, callbacks=[stamp])
    return n / (stamps[3] - stamps[2])


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The child: sets the thread counts, prints one JSON line `{reference model: examples/sec}`."""
    parser = argparse.ArgumentParser(prog="python -m tftrain.runtime.thread_choice")
    parser.add_argument("--intra", type=int, required=True)
    parser.add_argument("--inter", type=int, required=True)
    parser.add_argument("--batches", type=int, default=BATCHES)
    args = parser.parse_args(argv)
    from tftrain.runtime.threads import set_threads

    set_threads(args.intra, args.inter)
    models = _reference_models()
    print(json.dumps({name: _time_reference(model, max(8, args.batches)) for name, model in models.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
