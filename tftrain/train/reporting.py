"""The trainer's plan lines, its `RunRecord` and its reports (metrics.json, report.md)."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Optional

from tftrain import config as config_lib
from tftrain import epoch_log
from tftrain import rundir as rundir_lib
from tftrain.callbacks._steps import held_steps
from tftrain.train.record import RunRecord


def print_plan(trainer) -> None:
    """Prints the effective configuration, the runtime, the data, the batch and notes."""
    console, rt, cfg = trainer.console, trainer.runtime, trainer.config
    if not trainer.is_chief and console.verbose < 2:  # the chief prints the plan of a multi-worker job
        return
    if console.verbose >= 2:
        console.section(f"{trainer.task.name}: effective configuration")
        console.detail(config_lib.to_yaml(_with_starting_rate(cfg, trainer.task)).rstrip())
    console.section(f"{trainer.task.name}: plan (the full configuration: --verbose 2, or config.yaml in the run "
                    "directory)")
    lines = rt.describe()  # threads joined to the devices' line; the malloc detail at --verbose 2
    threads = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("threads:")), None)
    console.lines([f"{line}; threads {threads}" if line.startswith("devices:") and threads else line for line in lines
                   if not line.startswith("threads:") and (console.verbose >= 2 or not line.startswith("memory:"))])
    console.lines(trainer.task.describe_data())
    pipelines = training_workers(trainer.cluster) if cfg.runtime.strategy in config_lib.MULTI_PROCESS_STRATEGIES else 1
    sharding = trainer.task.describe_sharding(pipelines) if pipelines > 1 else None
    if sharding:
        console.line(sharding)
    if trainer.batch is not None:
        print_batch(trainer)
    cluster = trainer.cluster
    if cfg.runtime.strategy == "parameter_server":
        console.line(f"note:      each step runs one global batch on one of {training_workers(cluster)} worker(s), "
                     f"asynchronously; variables live on {cluster.num_ps} ps task(s)")
    if cfg.runtime.strategy == "mirrored" and rt.devices.kind == "cpu":
        console.line(f"note:      no GPU found, so MirroredStrategy runs on the CPU as {rt.num_replicas} replica(s)"
                     + ("; pass --cpu-replicas N to split the CPU into N replicas" if rt.num_replicas == 1 else ""))
    if not trainer.is_chief:
        console.line(f"note:      {cluster.task} is not the chief: it writes to a temporary directory, "
                     "removed at the end")


def _with_starting_rate(cfg, task):
    """`cfg` showing the learning rate that trains where it leaves it to the task (config.yaml keeps null)."""
    if cfg.train.learning_rate is not None:
        return cfg
    try:
        rate = task.starting_learning_rate()
        return cfg.override({"learning_rate": float(f"{rate:.7g}") if isinstance(rate, float) else rate})
    except Exception:  # noqa: BLE001 (an optimizer function that needs a rate: the line stays null)
        return cfg


def print_batch(trainer) -> None:
    """The batch line: global = per-replica x replicas (x accumulation steps); steps per epoch."""
    b, n, acc = trainer.batch, trainer.task.num_train_examples, trainer.accumulation_steps
    spe = trainer.steps_per_epoch
    steps = (f"{spe} steps/epoch on {n} examples" if n is not None and acc == 1
             else f"{spe} optimizer steps/epoch ({spe * acc} micro-batches) on {n} examples" if n is not None
             else "steps/epoch: until the training data ends")
    effective = (f"; effective global {trainer.effective_global_batch_size} = {b.global_batch_size} x {acc} "
                 "accumulation steps" if acc > 1 else "")
    trainer.console.line(f"batch:     global {b.global_batch_size} = per-replica {b.per_replica_batch_size} "
                         f"x {b.num_replicas} replica(s){effective}; {steps}")


def announce_run_dir(trainer) -> None:
    """Where this task writes, and whether it resumes from a checkpoint."""
    run_dir, out, console = trainer.run_dir, trainer.out_dir, trainer.console
    console.line(f"run directory: {run_dir.path}" + ("" if trainer.is_chief else
                 f" (the chief's; {trainer.task_name} writes to {out.path})"))
    if run_dir.config_repaired:
        console.warn(f"{run_dir.path / 'config.yaml'} was damaged; this command's settings are those it was written "
                     "with (their digest matches), so it is written back")
    if run_dir.end_unwritten:
        console.warn(f"the run in {run_dir.path} finished, but {run_dir.end_unwritten}; its checkpoint is kept, so "
                     "this run writes its end again from it")
    if run_dir.resumed:
        done = run_dir.resumed_steps // trainer.accumulation_steps  # the checkpoint counts micro-batches
        steps = f" and {done} optimizer steps of the next" if done else ""
        console.line(f"resuming: {run_dir.resumed_epochs}/{trainer.config.train.epochs} epochs done{steps}, "
                     f"from the checkpoint in {run_dir.backup_dir}")
        if trainer.is_chief:  # bytes that are not text would fail Keras's CSVLogger at the first epoch
            console.warn(epoch_log.mend(run_dir.path / rundir_lib.HISTORY_FILE))
        logged = epoch_log.read_history(run_dir.path / rundir_lib.HISTORY_FILE)
        if trainer.is_chief and run_dir.resumed_epochs and not logged:
            console.warn(f"{run_dir.path / rundir_lib.HISTORY_FILE} is missing or empty: the epoch log, and "
                         f"metrics.json's history, hold only the epochs from {run_dir.resumed_epochs + 1} on")


def training_workers(cluster) -> int:
    """Tasks that compute gradients: chief + workers (MultiWorkerMirrored), workers (ParameterServer)."""
    if cluster is None:
        return 1
    if cluster.num_ps:
        return len(cluster.cluster.get("worker", ()))
    return cluster.num_workers


def runtime_facts(trainer, model_loss_scaling: bool = False) -> dict:
    """The runtime part of the record: strategy, replicas, devices, precision, threads, ..."""
    rt, cfg, cluster = trainer.runtime, trainer.config, trainer.cluster
    return {
        "replicas": rt.num_replicas,
        "workers": training_workers(cluster),
        "ps_tasks": cluster.num_ps if cluster is not None else 0,
        "cluster_source": cluster.source if cluster is not None else None,
        "strategy": cfg.runtime.strategy,
        "strategy_class": type(rt.strategy).__name__,
        "communication": cfg.runtime.communication if cfg.runtime.strategy == "multi_worker_mirrored" else None,
        "devices": list(rt.devices.devices),
        "device_kind": rt.devices.kind,
        "precision": trainer.precision.info.policy,
        "compute_dtype": trainer.precision.info.compute_dtype,
        "loss_scaling": model_loss_scaling,
        "steps_per_execution": (rt.requested_steps_per_execution if not trainer.loop.per_step_hooks
                                else rt.steps_per_execution),
        "threads": dataclasses.asdict(rt.threads),
        "malloc": dataclasses.asdict(rt.malloc) if rt.malloc is not None else None,
    }


def _extras(trainer) -> dict:
    """Throughput, profile and the searches' sections, where they ran."""
    extras = dict(trainer.extras)
    if trainer.precision.record is not None:
        extras["precision_auto"] = trainer.precision.record
    made = trainer.made
    extras["throughput"] = made.monitor.result() if made.monitor is not None else None
    if made.keep_best is not None:
        extras["keep_best"] = made.keep_best.summary()
    profiler = made.profiler
    if profiler is not None:
        extras["profile"] = {
            "window": list(trainer.config.train.profile_window),
            "captured": list(profiler.captured) if profiler.captured else None,
            **({"before_resumed_step": profiler.passed} if profiler.passed is not None else {}),
            "captured_unit": "micro-batches" if trainer.accumulation_steps > 1 else "optimizer steps",
            "trace_files": [str(p.relative_to(trainer.out_dir.path)) for p in profiler.trace_files],
            "tensorboard": f"tensorboard --logdir {trainer.run_dir.log_dir}",
        }
    return extras


def _checkpoint_extras(trainer, model, optimizer) -> dict:
    """`optimizer_steps` (the optimizers a `train_step` holds count when the compiled one never stepped:
    `held_steps`, plus the steps before a resume that did not load them), and the `backup` and
    `early_stopping` sections (epochs counted from 1)."""
    backup, stop = trainer.made.backup, trainer.made.early_stopping
    held = held_steps(model) if model is not None else None
    restored = backup.restored if held is not None and backup is not None and backup.held_afresh else None
    before = (restored.epoch * (trainer.steps_per_epoch or 0) + restored.steps_in_epoch // trainer.accumulation_steps
              if restored is not None else 0)
    out = {"optimizer_steps": before + held if held is not None else
           int(optimizer.iterations.numpy()) if optimizer is not None else None}
    if backup is not None and backup.every_steps:
        restored = backup.restored
        out["backup"] = {"every_steps": backup.every_steps // trainer.accumulation_steps,
                         "resumed_from": dataclasses.asdict(restored) if restored is not None else None}
    if stop is not None:
        out["early_stopping"] = {
            "monitor": stop.monitor, "patience": stop.patience,
            "stopped_epoch": stop.stopped_epoch + 1 if stop.stopped_epoch > 0 else None,
            "best_epoch": stop.best_epoch + 1 if stop.best is not None else None,
            "best": float(stop.best) if stop.best is not None else None,
        }
    return out


def _steps_per_execution_that_ran(history, choice=None) -> dict:
    """`{"steps_per_execution": N}` that auto chose or a loop lowered to, else {}."""
    model = getattr(history, "model", None)
    ran = choice.steps_per_execution if choice is not None and choice.steps_per_execution else \
        getattr(model, "steps_per_execution", None)
    return {"steps_per_execution": int(ran)} if isinstance(ran, int) and ran >= 1 else {}


def make_record(trainer, history, test, started: float, fit_time: float) -> RunRecord:
    """The `RunRecord` of a finished run."""
    import keras

    from tftrain import reports

    cfg, batch, spe = trainer.resolved, trainer.batch, trainer.steps_per_epoch
    epochs_trained = len(history.epoch)
    restored = trainer.made.backup.restored if trainer.made.backup is not None else None
    done_before = restored.steps_in_epoch // trainer.accumulation_steps if restored is not None else 0  # mid-epoch
    examples = (epochs_trained * spe - done_before) * trainer.effective_global_batch_size if spe else None
    choice = trainer.execution.choice
    model = getattr(history, "model", None)
    optimizer = getattr(model, "optimizer", None) if model is not None else None
    hparams = dataclasses.asdict(cfg.task) if cfg.task is not None else None
    return RunRecord(
        task=trainer.task.name, run_dir=str(trainer.run_dir.path), test=test,
        # The whole run's epochs (history.csv, across resumes), else this process's.
        history=epoch_log.read_history(trainer.out_dir.path / rundir_lib.HISTORY_FILE)
        or {k: [float(v) for v in vals] for k, vals in history.history.items()},
        epochs=cfg.train.epochs, epochs_trained=epochs_trained,
        # The checkpoint actually restored: the previous one when the newest could not be read.
        resumed_from_epoch=restored.epoch if restored is not None else trainer.run_dir.resumed_epochs,
        train_examples=trainer.task.num_train_examples, steps_per_epoch=spe,
        test_examples=trainer.task.num_test_examples if test is not None else None,
        global_batch_size=batch.global_batch_size, per_replica_batch_size=batch.per_replica_batch_size,
        wall_time_s=time.perf_counter() - started, fit_time_s=fit_time,
        examples_per_sec=examples / fit_time if examples and fit_time > 0 else None,
        execution=trainer.execution.execution, execution_requested=cfg.runtime.execution,
        execution_choice=choice.to_dict() if choice is not None else None,
        runtime={**runtime_facts(trainer, isinstance(optimizer, keras.optimizers.LossScaleOptimizer)),
                 **(_steps_per_execution_that_ran(history, choice) if trainer.loop.per_step_hooks else {})},
        hparams=hparams, seed=cfg.seed, argv=list(trainer.command or sys.argv), versions=reports.versions(),
        learning_rate=cfg.train.learning_rate if cfg.train.learning_rate is not None else trainer.task.learning_rate,
        lr_schedule=cfg.train.lr_schedule,
        extras={**_extras(trainer), **_checkpoint_extras(trainer, model, optimizer),
                "execution_auto": choice.describe() if choice is not None else None},
        gradient_accumulation_steps=trainer.accumulation_steps,
        effective_global_batch_size=trainer.effective_global_batch_size,
    )


def write_record(record: RunRecord, hparams: Optional[dict] = None) -> None:
    """Writes `record`'s `metrics.json` and `report.md` into its run directory; with `hparams` (the HParams
    values, `hparams_log.hparam_values`) the run's HParams session first, in `logs/` (metrics.json marks the
    run finished, so what the run writes comes before it)."""
    from tftrain import reports
    from tftrain.train import hparams_log

    metrics = record.to_dict()
    if hparams is not None:  # TensorBoard's HParams tab compares the runs of a folder
        hparams_log.write_session(Path(record.run_dir) / rundir_lib.LOG_DIR, Path(record.run_dir).name, hparams,
                                  hparams_log.final_figures(record),
                                  step=record.resumed_from_epoch + record.epochs_trained)
    reports.write_metrics(record.run_dir, metrics)
    reports.write_report(record.run_dir, metrics, title=reports.run_title(record.task, record.hparams))


def print_result(record: RunRecord, console, unit: str = "examples", input_hint: str = "",
                 tensorboard: Optional[str] = None) -> None:
    """Prints `record`'s result lines: test figures and speed, throughput, the input verdict (with
    `input_hint` when input-bound), then the run directory and the `tensorboard` command where given."""
    console.section("result")
    console.result(_result_line(record, unit))
    throughput = record.extras.get("throughput")
    if throughput and throughput.get("step_time_median_s") is not None:
        console.line(f"throughput: {throughput['examples_per_sec']:,.0f} {unit}/sec after warm-up; step time "
                     f"median {throughput['step_time_median_s'] * 1e3:.2f} ms, "
                     f"p90 {throughput['step_time_p90_s'] * 1e3:.2f} ms")
    if throughput and throughput.get("input"):
        console.line(f"input:      {throughput['input']['verdict']}")
        if input_hint and throughput["input"].get("input_bound"):
            console.line(f"            {input_hint}")
    if tensorboard is not None:
        console.line(f"run directory: {record.run_dir}")
        console.line(f"TensorBoard:   {tensorboard}")


def _result_line(record: RunRecord, unit: str = "examples") -> str:
    test = ", ".join(f"test {k} {v:.4f}" for k, v in (record.test or {}).items()) or (
        "test evaluation failed" if record.extras.get("evaluation") else "no test data")
    speed = (f"{record.examples_per_sec:,.0f} {unit}/sec over {record.epochs_trained} epoch(s)"
             if record.examples_per_sec else f"{record.epochs_trained} epoch(s)" if record.epochs_trained
             else "nothing left to train (" + ("the checkpoint held every epoch)" if record.resumed_from_epoch >=
                                               record.epochs else "early stopping had ended the run)"))
    return f"{test}; {speed}; wall time {record.wall_time_s:.1f} s"
