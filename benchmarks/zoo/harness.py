"""The zoo's harness: worker processes that time every contender, in interleaved rounds.

TensorFlow reads thread counts once, so each (round, thread setting) is one worker
process (`--threads INTRA,INTER --round R`) that times every model: the oracle's
points (the `Trainer` with one setting fixed), and, in the worker with TensorFlow's
default threads, plain Keras and tftrain with every setting automatic. Rounds
interleave: round 1 runs every thread setting's worker, then round 2, and so on,
so a slow spell of the host falls on every contender alike.

Every contender is timed by the same stopwatch, a Keras callback around whole
epochs: examples/sec = examples per epoch / fastest epoch after the first (which
traces and compiles); `wall_s` is the whole call (building, probing, tracing,
training, the run directory's writes).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from benchmarks import common
from benchmarks.zoo.models import ZooModel, examples_per_epoch, zoo_models

GRID = tuple((mode, spe) for mode in ("graph", "xla") for spe in (1, 8, 32, 64))
"""(execution, steps_per_execution) points of the oracle, timed at every thread setting."""

THREADS_GRID = (("graph", 8), ("graph", 32), ("xla", 8), ("xla", 32))
"""The points timed at the thread settings other than TensorFlow's defaults (fewer, to keep the run
near an hour): the middle of the steps_per_execution range in each mode."""

QUICK_GRID = (("graph", 1), ("graph", 8))
"""The oracle at `--quick`: graph only (XLA compiles take longest), one thread setting."""

EPOCHS, QUICK_EPOCHS = 3, 2
"""Epochs per oracle point; the first (tracing, compiling) is never timed."""

REFERENCE_EPOCHS, QUICK_REFERENCE_EPOCHS = 10, 16
"""Epochs of plain Keras and of tftrain's first run: a whole 10-epoch run, timed end to end; at
`--quick` (8 batches an epoch) 16, so that tftrain's first run has the steps its graph-vs-XLA duel
takes (about 90) and the test sees a finished trial."""

ROUNDS, QUICK_ROUNDS = 3, 1
"""Interleaved rounds: every contender runs once per round; figures are medians over rounds."""

DOMINATED = 2.0
"""An oracle point stops after its first timed epoch when that epoch took over this many times the
fastest epoch its model has had so far in the process (it cannot be the best)."""


def thread_settings(cores: int, quick: bool) -> list:
    """(intra-op, inter-op) settings: TensorFlow's defaults (0, 0), then (cores/2, 1) and (cores, 1).

    On 2 cores: (0, 0), (1, 1), (2, 1); on one core (1, 1) and (2, 2). `--quick`: (0, 0) only.
    """
    if quick:
        return [(0, 0)]
    others = [(max(1, cores // 2), 1), (cores, 1), (2 * cores, 2)]
    return [(0, 0)] + list(dict.fromkeys(others))[:2]


def add_flags(parser) -> None:
    """The zoo's flags: `--models`, `--rounds`, `--timeout`, and the worker's own."""
    parser.add_argument("--models", default=None, help="comma-separated models (default: all; --quick: wide)")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"interleaved rounds (default {ROUNDS}; --quick {QUICK_ROUNDS})")
    parser.add_argument("--threads", default=None,
                        help="(worker) time every model at intra-op,inter-op threads INTRA,INTER in this process")
    parser.add_argument("--round", type=int, default=0, help="(worker) the round this worker runs")
    parser.add_argument("--with-references", action="store_true",
                        help="(worker) also time plain Keras and tftrain")
    parser.add_argument("--point-out", type=Path, default=None, help="(worker) JSON file for the figures")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed per worker process")
    parser.add_argument("--oracle-from", type=Path, default=None,
                        help="a zoo.json whose oracle points (every thread setting) are kept: this run times only "
                             "plain Keras and tftrain, back to back, each round")
    parser.add_argument("--no-grid", action="store_true", help="(worker) time no oracle point")
    parser.set_defaults(no_device_setup=True)  # the parent only starts subprocesses: keep TensorFlow out


# --- Timing one contender -------------------------------------------------------------

def _stopwatch(stop_slower_than: float = math.inf, batches: int = 0):
    """A Keras callback stamping each epoch's begin and end (`begins`, `ends`: `time.perf_counter()`),
    and the compile settings the model trained with (`settings`).

    Args:
        stop_slower_than: seconds; training stops when an epoch is bound to take longer: after the first
            timed epoch (the second) when it did, or during the first epoch once, after tracing and
            compiling, its executions' pace projects an epoch of `batches` batches slower than that
            (`early_rate` then holds that pace, batches/sec). Defaults to infinity (never).
        batches: batches per epoch (for the projection). Defaults to 0 (no projection).
    """
    import keras

    class EpochStopwatch(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.begins, self.ends, self.settings = [], [], {}
            self.early_rate = self._first = None
            self.batches = batches

        def on_epoch_begin(self, epoch, logs=None):
            self.begins.append(time.perf_counter())

        def _pace(self, batch, logs=None):  # on_train_batch_end, only where it may stop training (below)
            if self.ends:
                return
            now = time.perf_counter()
            if self._first is None:  # the first execution traced and compiled: the pace starts here
                self._first = (batch, now)
                return
            done, seconds = batch - self._first[0], now - self._first[1]
            if done >= 2 * max(1, int(self.model.steps_per_execution)) and seconds / done * batches > stop_slower_than:
                self.early_rate = done / seconds
                self.model.stop_training = True

        def on_epoch_end(self, epoch, logs=None):
            self.ends.append(time.perf_counter())
            if len(self.ends) == 2 and self.ends[-1] - self.begins[-1] > stop_slower_than:
                self.model.stop_training = True

        def on_train_end(self, logs=None):
            self.settings = {"trained_jit_compile": bool(self.model.jit_compile),
                             "trained_steps_per_execution": int(self.model.steps_per_execution)}

    stopwatch = EpochStopwatch()
    if batches and math.isfinite(stop_slower_than):  # an oracle point; a per-batch hook would make tftrain's
        stopwatch.on_train_batch_end = stopwatch._pace  # --steps-per-execution auto keep 1 step per execution
    return stopwatch


def _figures(stopwatch, examples: int, wall_s: float, lead=None) -> dict:
    """Examples/sec of the fastest epoch after the first, every epoch's seconds, and the call's wall seconds.

    Args:
        stopwatch: the last callback of the `fit`.
        examples: examples per epoch.
        wall_s: seconds of the whole call (model built to `fit` returned).
        lead: a stopwatch placed first in the callback list, or None. With it, an epoch runs from
            the lead's begin to `stopwatch`'s end, and `callbacks_s` holds the seconds the callbacks
            between them spent at each epoch's begin and end (e.g. writing a checkpoint). Defaults to None.

    Returns:
        `{"examples_per_sec", "epochs_s", "wall_s", "trained_jit_compile", "trained_steps_per_execution"}`
        (the last two: the model's settings at the end of `fit`), `callbacks_s` with a lead, and
        `stopped_early` when the stopwatch stopped the first epoch (examples/sec is then its pace).
    """
    begins = (lead or stopwatch).begins
    seconds = [end - begin for begin, end in zip(begins, stopwatch.ends)]
    out = {"examples_per_sec": common.rate(examples, min(seconds[1:])) if seconds[1:] else math.nan,
           "epochs_s": seconds, "wall_s": wall_s, **stopwatch.settings}
    if stopwatch.early_rate is not None:  # stopped in its first epoch: dominated, its pace stands in
        out.update(examples_per_sec=stopwatch.early_rate * examples / max(1, stopwatch.batches), stopped_early=True)
    if lead is not None:
        steps = [end - begin for begin, end in zip(stopwatch.begins, lead.ends)]
        out["callbacks_s"] = [whole - inner for whole, inner in zip(seconds, steps)]
    return out


def _reset() -> None:
    """`keras.backend.clear_session()`, a garbage collection and seed 0, before every contender and before its
    clock starts: clearing the previous contender's models and graphs is not this one's cost (it took 2-7 s of
    the contender that came next in a process, which the end-to-end columns had counted against it; the first
    contender of a process also paid TensorFlow's start-up there, 3.8 s)."""
    import gc

    import keras

    keras.backend.clear_session()
    gc.collect()
    keras.utils.set_random_seed(0)


def time_keras(spec: ZooModel, x, y, epochs: int) -> dict:
    """Times plain Keras as a user writes it: a fresh model, `compile(optimizer="adam", loss, metrics)` and
    `fit(x, y, batch_size=B)` with every other Keras default. Returns `_figures`."""
    _reset()
    started = time.perf_counter()
    model = spec.build()
    model.compile(optimizer="adam", loss=spec.loss, metrics=[spec.metric])
    stopwatch = _stopwatch()
    model.fit(x, y, batch_size=spec.batch_size, epochs=epochs, verbose=0, callbacks=[stopwatch])
    return _figures(stopwatch, len(x), time.perf_counter() - started)


def _timed_trainer():
    """`tftrain.Trainer` whose `choose_execution` stage (before `fit`) records its wall seconds in `probe_s`,
    and whose callback list starts with the callback `lead` (set it before `fit`)."""
    import tftrain

    class ProbeTimedTrainer(tftrain.Trainer):
        probe_s = lead = None

        def choose_execution(self, model):  # the stage before fit; the trial's own cost is in metrics.json
            start = time.perf_counter()
            super().choose_execution(model)
            self.probe_s = time.perf_counter() - start

        def make_callbacks(self):
            made = super().make_callbacks()
            return dataclasses.replace(made, all=(self.lead, *made.all))

    return ProbeTimedTrainer


def train(spec: ZooModel, x, y, run_dir: Path, device: str, stop_slower_than: float = math.inf, **settings):
    """One `Trainer(ArrayTask(...), precision="float32", **settings)` run over `x, y`, a stopwatch last and
    a lead stopwatch first.

    Returns:
        `(trainer, _figures, metrics.json as a dict)`.
    """
    import tftrain

    _reset()
    started = time.perf_counter()
    task = tftrain.ArrayTask(spec.build, x, y, loss=spec.loss, optimizer="adam", metrics=[spec.metric],
                             name=f"zoo-{spec.name}")
    stopwatch = _stopwatch(stop_slower_than, len(x) // spec.batch_size)
    trainer = _timed_trainer()(task, precision="float32", batch_size=spec.batch_size, verbose=0,
                               run_dir=str(run_dir), device=device, callbacks=[stopwatch], **settings)
    trainer.lead = _stopwatch()
    trainer.fit()
    figures = _figures(stopwatch, len(x), time.perf_counter() - started, trainer.lead)
    trial = trainer.execution.trial
    if trial is not None and trial.chosen is not None:  # what trained after the trial (the model stays out of XLA)
        figures.update(trained_jit_compile=trial.chosen.mode == "xla", trained_steps_per_execution=trial.chosen.spe)
    return trainer, figures, json.loads((run_dir / "metrics.json").read_text())


def time_point(spec: ZooModel, x, y, epochs: int, run_dir: Path, device: str, mode: str, spe: int,
               stop_slower_than: float) -> dict:
    """One oracle point: the `Trainer` with `execution=mode, steps_per_execution=spe` fixed. Returns `_figures`."""
    _, figures, _ = train(spec, x, y, run_dir, device, stop_slower_than, epochs=epochs, execution=mode,
                          steps_per_execution=spe)
    return figures


def time_tftrain(spec: ZooModel, x, y, epochs: int, run_dir: Path, device: str) -> dict:
    """tftrain with every execution setting automatic (`execution="auto", steps_per_execution="auto"`) for
    `epochs` epochs, then, where it remembers choices, a second one-epoch run of the same model that should
    reuse them.

    Returns:
        `_figures` (with `callbacks_s`), `probe_s` (seconds of choosing: the `choose_execution` stage before
        `fit` plus the trial's cost inside it, `ExecutionChoice.trial["cost_s"]`), `trial` (that record),
        `execution` and `steps_per_execution` (the choice), `remembered` (a choice an earlier run timed,
        else None), `metrics_execution` and `metrics_choice` (from metrics.json), and `second_run`:
        `{"probe_s" (the stage less `compiled_before_fit_s`), "compiled_before_fit_s", "execution",
        "remembered"}`, or None.
    """
    auto = {"execution": "auto", "steps_per_execution": "auto"}
    trainer, figures, metrics = train(spec, x, y, run_dir, device, epochs=epochs, **auto)
    choice = metrics.get("execution_choice") or {}
    trial = choice.get("trial") or {}
    second = None
    if "remembered" in choice:
        again, _, again_metrics = train(spec, x, y, run_dir.with_name(run_dir.name + "-again"), device, epochs=1,
                                        **auto)
        again_choice = again_metrics.get("execution_choice") or {}
        compiled = again_choice.get("compiled_before_fit_s") or 0.0  # XLA's compile, which fit then reuses
        second = {"probe_s": max(0.0, again.probe_s - compiled), "compiled_before_fit_s": compiled,
                  "execution": again.execution.execution, "remembered": again_choice.get("remembered")}
    return {**figures, "probe_s": trainer.probe_s + trial.get("cost_s", 0.0), "trial": trial or None,
            "execution": trainer.execution.execution, "steps_per_execution": metrics.get("steps_per_execution"),
            "metrics_execution": metrics["execution"], "metrics_choice": choice.get("execution"),
            "remembered": choice.get("remembered"), "second_run": second}


def _guarded(label: str, fn: Callable) -> dict:
    """`fn()`, or `{"error": ...}` when it raises (one failing contender must not sink the others)."""
    try:
        figures = fn()
    except Exception as e:  # noqa: BLE001 (recorded and printed)
        message = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        print(f"FAILED: {label}: {message}", flush=True)
        return {"error": message}
    print(f"{label}: {common.fmt(figures['examples_per_sec'])} examples/sec", flush=True)
    return figures


def _fastest_epoch(figures: list) -> float:
    """The fastest timed epoch (seconds) among contenders' figures; infinity when none."""
    return min((s for f in figures for s in f.get("epochs_s", [])[1:]), default=math.inf)


# --- The worker: one (round, thread setting), every model ------------------------------

def _references(spec: ZooModel, x, y, epochs: int, args, tmp: Path) -> dict:
    """Plain Keras and tftrain, `epochs` epochs each, in an order that alternates by round (neither always
    runs first)."""
    device = "cpu" if args.device == "cpu" else "auto"
    label = f"{spec.name} round {args.round}"
    contenders = [("keras", lambda: _guarded(f"{label} plain Keras", lambda: time_keras(spec, x, y, epochs))),
                  ("tftrain", lambda: _guarded(f"{label} tftrain", lambda: time_tftrain(
                      spec, x, y, epochs, tmp / f"run-{spec.name}", device)))]
    if args.round % 2:
        contenders.reverse()
    return {name: fn() for name, fn in contenders}


def grid(args) -> tuple:
    """This worker's (execution, steps_per_execution) points: `QUICK_GRID` at `--quick`, `GRID` at
    TensorFlow's default threads, else `THREADS_GRID`."""
    if args.quick:
        return QUICK_GRID
    return GRID if args.threads == "0,0" else THREADS_GRID


def time_model(spec: ZooModel, args, tmp: Path) -> dict:
    """Times one model's oracle points in this process, and plain Keras and tftrain when asked."""
    n = examples_per_epoch(spec, args.quick)
    x, y = spec.data(n)
    epochs = QUICK_EPOCHS if args.quick else EPOCHS
    device = "cpu" if args.device == "cpu" else "auto"
    out = {"examples_per_epoch": n, "grid": []}
    if args.with_references:
        out.update(_references(spec, x, y, QUICK_REFERENCE_EPOCHS if args.quick else REFERENCE_EPOCHS, args, tmp))
    for i, (mode, spe) in enumerate(() if args.no_grid else grid(args)):
        limit = DOMINATED * _fastest_epoch([out.get("keras", {}), *out["grid"]])
        figures = _guarded(f"{spec.name} round {args.round} {mode} spe {spe} threads {args.threads}", lambda: time_point(
            spec, x, y, epochs, tmp / f"point-{spec.name}-{i}", device, mode, spe, limit))
        out["grid"].append({"execution": mode, "steps_per_execution": spe, **figures})
    return out


def worker(args) -> None:
    """Sets the thread counts, then times every model; writes `--point-out`. TensorFlow must not have started."""
    intra, inter = (int(v) for v in args.threads.split(","))
    from tftrain.runtime import set_threads

    settings = set_threads(intra, inter)  # before any TensorFlow op
    from tftrain.runtime.devices import configure_devices

    configure_devices("cpu" if args.device == "cpu" else "auto")
    out = {"intra_op": intra, "inter_op": inter, "round": args.round, "applied": settings.applied, "models": {}}
    with tempfile.TemporaryDirectory(prefix="tftrain-zoo-") as tmp:
        for spec in zoo_models(args):
            out["models"][spec.name] = time_model(spec, args, Path(tmp))
    args.point_out.write_text(json.dumps(out))


# --- The parent: rounds x thread settings, one worker each --------------------------------

def run_worker(setting, round_: int, references: bool, args, tmp: Path) -> dict:
    """Runs one (round, thread setting) worker process; returns its record (or an `error`)."""
    intra, inter = setting
    out = tmp / f"round-{round_}-threads-{intra}-{inter}.json"
    cmd = [sys.executable, "-m", "benchmarks.zoo", "--threads", f"{intra},{inter}", "--round", str(round_),
           "--point-out", str(out), "--device", args.device] + (["--quick"] if args.quick else []) \
        + (["--with-references"] if references else []) + (["--models", args.models] if args.models else []) \
        + (["--no-grid"] if args.oracle_from else [])
    # A fresh folder of remembered choices each round: tftrain's first run of a model times its probe.
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
           "TFTRAIN_CACHE_DIR": str(tmp / f"cache-{round_}-{intra}-{inter}")}
    failed = {"intra_op": intra, "inter_op": inter, "round": round_}
    try:
        proc = subprocess.run(cmd, env=env, stderr=subprocess.PIPE, text=True, timeout=args.timeout,
                              cwd=Path(__file__).resolve().parents[2])  # its progress lines go to our stdout
    except subprocess.TimeoutExpired:
        return {**failed, "error": f"timed out after {args.timeout:.0f} s"}
    if proc.returncode != 0 or not out.exists():
        tail = proc.stderr.strip().splitlines()[-20:] or ["no output"]
        print("\n".join(tail), file=sys.stderr, flush=True)
        return {**failed, "error": f"exit code {proc.returncode}: {tail[-1]}"}
    return json.loads(out.read_text())


def run_rounds(args) -> list:
    """Every round's workers, rounds outermost (interleaved); the default-threads worker also times plain
    Keras and tftrain. With `--oracle-from`, only that worker runs, and the kept run's oracle points join
    its records (`with_kept_oracle`). Returns the workers' records."""
    settings = thread_settings(common.cpu_cores(), args.quick)
    if args.oracle_from:
        settings = [(0, 0)]
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    workers = []
    with tempfile.TemporaryDirectory(prefix="tftrain-zoo-") as tmp:
        for round_ in range(rounds):
            for setting in settings:
                print(f"--- round {round_ + 1}/{rounds}: threads intra-op {setting[0] or 'default'}, "
                      f"inter-op {setting[1] or 'default'} ---", flush=True)
                workers.append(run_worker(setting, round_, setting == (0, 0), args, Path(tmp)))
    return with_kept_oracle(workers, args.oracle_from) if args.oracle_from else workers


def with_kept_oracle(workers: list, path: Path) -> list:
    """`workers` (plain Keras and tftrain, default threads) with the oracle points of the zoo run saved at
    `path` (its `data.points`): each round's default-threads points join this run's worker of the same
    round, and the other thread settings' points come as one worker per (setting, round)."""
    points = json.loads(Path(path).read_text())["data"]["points"]
    by_round = {w.get("round"): w for w in workers}
    others: dict = {}
    for point in points:
        setting, round_ = (point["intra_op"], point["inter_op"]), point["round"]
        if setting == (0, 0):
            worker = by_round.get(round_)
        else:
            worker = others.setdefault((setting, round_), {"intra_op": setting[0], "inter_op": setting[1],
                                                           "round": round_, "applied": True, "models": {}})
        if worker is not None and "models" in worker:
            worker["models"].setdefault(point["model"], {}).setdefault("grid", []).append(point)
    return workers + list(others.values())
