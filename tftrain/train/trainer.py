"""`Trainer(task, config).fit()`: the run as a list of labelled stages.

check (before TensorFlow starts), set-up (threads, devices, precision, strategy), sanity pass,
run directory, batch plan, build, precision and execution, callbacks, train, evaluate, save,
record, report. Each stage is a short method a subclass may replace; the decisions are owned by
planners (`precision_plan`, `execution_plan`, the frozen `BatchPlan` and `RunCallbacks`), what a
loop can do lives in `tftrain.train.loops`. Only `tftrain.run` turns errors into exit codes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

from tftrain import config as config_lib
from tftrain import epoch_log, files
from tftrain import rundir as rundir_lib
from tftrain.checkpoint_files import diverged_note
from tftrain.errors import AlreadyFinished, ConfigError, Preempted, TrainingDiverged
from tftrain.train.batch_plan import BatchStages
from tftrain.train.callback_stages import CallbackStages
from tftrain.train.after_steps import AfterStepFailed, ExportStages
from tftrain.train.console import Console, keras_progress
from tftrain.train.loops import loop_for
from tftrain.train.model_stages import ModelStages
from tftrain.train.precision_plan import PrecisionPlanner, global_policy_kept
from tftrain.train.execution_plan import ExecutionPlanner, RunFacts, probe_batches
from tftrain.train import hparams_log, reporting
from tftrain.train.record import RunRecord, check_hparam_names
from tftrain.train.tasks import Task

TASK_FILE = "task.json"
"""File in the run directory naming the task (name, class, hyperparameter class) whose run it holds."""

class Interrupted(KeyboardInterrupt):
    """Ctrl-C during training; `run_dir` holds the checkpoint the same command resumes from."""

    def __init__(self, run_dir: str):
        super().__init__(run_dir)
        self.run_dir = run_dir


class Trainer(BatchStages, ModelStages, CallbackStages, ExportStages):
    """Trains a `Task` with tftrain's whole machinery and writes its run directory.

    Args:
        task: the `tftrain.Task` (or an adapter: `ArrayTask`, `DatasetTask`, ...).
        config: a `RecipeConfig`, or the path of a recipe file (YAML) laid over
            `task.default_config()`. Defaults to `task.default_config()`.
        callbacks: Keras callbacks, added after tftrain's own. Defaults to ().
        command: the command line recorded in `metrics.json`. Defaults to `sys.argv`.
        **overrides: config fields by flat name (`epochs=3`, the task's hyperparameters by
            name), laid over `config`.

    Raises:
        ConfigError: when `task` is not a Task or an override is unknown or bad.

    Example:
        >>> record = tftrain.Trainer(task, epochs=3, strategy="mirrored", cpu_replicas=2).fit()
    """

    def __init__(self, task: Task, config: Optional[config_lib.RecipeConfig] = None, *, callbacks: Sequence = (),
                 command: Optional[Sequence[str]] = None, **overrides):
        if not isinstance(task, Task):
            raise ConfigError(f"Trainer needs a tftrain.Task (e.g. tftrain.ArrayTask(...)). Received: {task!r}.")
        if config is None:
            config = task.default_config()
        elif isinstance(config, (str, os.PathLike)):  # a recipe file over the task's defaults, overrides over it
            config, overrides = config_lib.from_yaml(config, base=task.default_config(), overrides=overrides), {}
        elif not isinstance(config, config_lib.RecipeConfig):
            raise ConfigError(f"config must be a RecipeConfig or a recipe file path. Received: {config!r}.")
        elif config.task is None and task.hparams is not None:
            config = dataclasses.replace(config, task=task.hparams)
        self.config = config_lib.deterministic_config(config.override(overrides) if overrides else config)
        self.resolved = None  # `config` with what the run decided, made once by `plan_batch`
        check_hparam_names(self.config.task)
        self.task = task
        self.callbacks = list(callbacks)
        self.command = list(command) if command is not None else None
        self.console = Console(self.config.train.verbose)
        self.loop = loop_for(self.config.runtime.strategy)
        self.cluster = self.runtime = self.run_dir = self.out_dir = None
        self.batch_plan = None  # the frozen BatchPlan (plan_fixed_batch): `batch` and `steps_per_epoch` read it
        self.precision = None  # the PrecisionPlanner: the dtype policy in force and what auto decided
        self.sanity = None  # the SanityResult (sanity_pass)
        self.execution = None  # the ExecutionPlanner: the mode and steps per execution, and how they were chosen
        self.made = None  # the RunCallbacks of fit (make_callbacks)
        self.preemption = None  # PreemptionWatch of a single process or a MultiWorkerMirrored task (make_callbacks)
        self._user_callbacks = []  # makers of --callbacks (check)
        self._made_user_callbacks = None  # what they made (user_callback_objects)
        self.compile_args: dict = {}
        self.extras: dict = {}

    # -- the run ---------------------------------------------------------------
    def fit(self, *, started: Optional[float] = None) -> Optional[RunRecord]:
        """Runs every stage; returns the `RunRecord` (None on a parameter-server worker or ps task).

        Args:
            started: `time.perf_counter()` at program start, for the wall time. Defaults to now.

        Raises:
            ConfigError: (and subclasses) on bad input found before or while setting up.
            Interrupted: on Ctrl-C once the run directory exists (the same command resumes).
            Preempted: on SIGTERM, SIGUSR1 or SIGHUP; during training once the step's checkpoint is saved.
            TrainingDiverged: when the training loss becomes NaN or infinite.
            JobFailed: on a parameter-server worker or ps task whose chief failed or vanished.
            AlreadyFinished: when a scheduler's restart finds the run finished (nothing trained; exit 0).
        """
        from tftrain.callbacks.preemption import PreemptionWatch

        started = time.perf_counter() if started is None else started
        self.check()
        if self.serves():
            return self.serve()
        with PreemptionWatch() as self.preemption, global_policy_kept():  # SIGTERM, SIGUSR1, SIGHUP: one line
            try:
                if self.run_dir.after_steps_pending and not self.config.sanity_check:  # trained before: its export
                    self.preemption.phase = "the pending export"
                    return self.redo_after_steps()
                if self.run_dir.finished_before:
                    self.end_finished_job()
                self.bind_task()  # before TensorFlow starts: a task's bad data folder is reported at once
                self.setup_runtime()
                self.preemption.install()  # a multi-worker strategy's coordination service took SIGTERM
                with self.loop.job(self.cluster):  # a parameter-server chief tells the servers how the run ended
                    return self.run_stages(started)
            except Exception as e:  # a signal's stop raised in TensorFlow's or Keras's code comes out as their error
                if self.preemption.requested() is None or isinstance(e, (Preempted, AlreadyFinished, AfterStepFailed)):
                    raise
                raise self.preemption.stop(str(self.run_dir.path) if self.out_dir is not None else "") from e

    def end_finished_job(self) -> None:
        """Ends a run an earlier attempt finished: removes a leftover backup, tells a parameter-server
        job's servers, then raises `AlreadyFinished`."""
        leftover = self.run_dir.backup_dir.exists() and rundir_lib.restarted_job() is None
        self.finish_run_dir()
        if self.cluster is not None and "ps" in self.cluster.cluster:
            self.setup_runtime()  # the chief connects to the servers to tell them
            with self.loop.job(self.cluster):
                pass
        if leftover:
            raise AlreadyFinished(f"the run in {str(self.run_dir.path)!r} finished before (metrics.json is written); "
                                  "removed the checkpoint its end left behind; nothing to train", str(self.run_dir.path))
        raise AlreadyFinished(f"the run in {str(self.run_dir.path)!r} finished before this restart (metrics.json "
                              "is written); nothing to train", str(self.run_dir.path))

    def run_stages(self, started: float) -> RunRecord:
        """The stages after set-up: batch plan, build, train, evaluate, save, report."""
        self.check_task()
        self.plan_fixed_batch()
        reporting.print_plan(self)
        self.settle_untimed_precision()  # before the sanity pass, the batch-size search and --tune build models
        self.preemption.phase = "the sanity pass (nothing written)"
        self.sanity_pass()  # before the run directory: what cannot work is refused with nothing written
        if self.config.sanity_check:
            self.task.release()
            self.console.line("sanity check passed; nothing trained, no run directory written")
            return None
        try:
            written = dataclasses.replace(self.config, run_dir=str(self.run_dir.path))
            with rundir_lib.task_run_dir(self.run_dir, config_lib.to_yaml(written), self.is_chief,
                                         self.task_name) as out:
                self.out_dir = out
                self.preemption.phase = "the start of the run (its directory is written)"
                if self.is_chief:  # the same task's identity (another task's was refused), or a damaged one's
                    rundir_lib.write_text_atomic(out / TASK_FILE, json.dumps(self._task_identity()))
                    rundir_lib.note_job(out.path)
                reporting.announce_run_dir(self)
                self.preemption.phase = "the batch plan, before training"
                self.plan_batch()
                self.preemption.phase = "building the model, before training"
                model = self.build_chosen_model()
                self.init_weights(model)
                self.note_custom_steps(model)
                self.preemption.phase = "choosing the execution, before training"
                self.choose_execution(model)
                self.made = self.make_callbacks()
                self.preemption.phase = "training"
                history, fit_time = self.train(model, self.made)
                self.console.warn(epoch_log.tidy_history(self.out_dir.path / rundir_lib.HISTORY_FILE, history))
                self.preemption.phase = "evaluation (training's checkpoint is kept)"
                test = self.evaluated(model)
                with self.preemption.holding(stop_after=False):  # a signal waits for these writes
                    self.preemption.phase = "saving the run (training's checkpoint is kept)"
                    self.save(model)
                    if self.config.train.export and self.is_chief:
                        self.extras[rundir_lib.AFTER_STEPS_KEY] = {"export": "pending"}
                    record = reporting.make_record(self, history, test, started, fit_time)
                    self.write_record(record)  # metrics.json beside model.keras: the trained run is safe from here
                    self.finish_run_dir()
                self._stop_before_after_steps()
                exports = self.config.train.export and self.is_chief  # else the run is complete: a signal waits
                with contextlib.nullcontext() if exports else self.preemption.holding(stop_after=False):
                    self.preemption.phase = "the export (the trained run is written; the export is pending)"
                    failure = self.run_after_steps(model)
                    with self.preemption.holding(stop_after=False):
                        self.preemption.phase = "the report (the run is written)"
                        record = reporting.make_record(self, history, test, started, fit_time)
        except KeyboardInterrupt:  # the checkpoint (and finished tuner trials) resume the same command
            self._end_mlflow("KILLED")
            raise Interrupted(str(self.run_dir.path)) from None
        except BaseException as e:  # a preempted run resumes like an interrupted one
            self._end_mlflow("KILLED" if isinstance(e, Preempted) else "FAILED")
            if isinstance(e, Preempted) and not e.run_dir and self.out_dir is not None:
                e.run_dir = str(self.run_dir.path)
            raise
        finally:
            self.task.release()
        with self.preemption.holding(stop_after=False):  # the run is complete: a stop signal waits for its lines
            self.report(record)
        if failure := "; also ".join(f for f in (self.evaluation_failure(), failure) if f):
            raise AfterStepFailed(failure) from self.evaluation_error  # failure.log: where the evaluation failed
        return record

    def _end_mlflow(self, status: str) -> None:
        """Marks the MLflow run (if one was opened) ended with `status`; a tracking error is only warned of."""
        if self.made is not None and self.made.mlflow is not None:
            self.made.mlflow.end(status)

    def finish_run_dir(self) -> None:
        """Removes the backup, a failed attempt's `failure.log` and a killed write's temporary files (chief only),
        once the run is on disk; writes `report.md` from `metrics.json` where a kill came between them."""
        if not self.is_chief:
            return
        shutil.rmtree(self.run_dir.backup_dir, ignore_errors=True)
        (self.run_dir.path / rundir_lib.FAILURE_LOG).unlink(missing_ok=True)
        files.remove_temporaries(self.run_dir.path)
        from tftrain import reports

        reports.write_missing_report(self.run_dir.path, self.config.task)

    # -- check, set-up ---------------------------------------------------------
    def _default_run_dir(self):
        """`runs/<task>-<time>` (a restarted job's attempt's own: `restarted_run_dir`); in a cluster
        `runs/<task>-<run id>`, the same for every task."""
        if self.cluster is None:
            return (rundir_lib.restarted_run_dir(self.task.name, self.config.to_dict())
                    or rundir_lib.default_run_dir(self.task.name))
        return Path("runs") / f"{self.task.name}-{rundir_lib.cluster_run_id(self.cluster.cluster)}"

    def check(self) -> None:
        """Loop support, cluster and run directory: the cheap checks, before TensorFlow starts."""
        from tftrain.runtime.cluster import drop_blank_tf_config, resolve_cluster

        self.loop.check(self.config)
        self.task.check_unused_fields(self.config)
        drop_blank_tf_config()
        self.cluster = resolve_cluster(self.config.runtime.strategy, ps_tasks=self.config.runtime.ps_tasks)
        if self.serves():
            return
        run_dir = self.config.run_dir or str(self._resumed() or self._default_run_dir())
        from tftrain.train import user_callbacks

        self._user_callbacks = user_callbacks.resolve(self.config.train.callbacks or "")  # bad names: now
        self._made_user_callbacks, self.made = None, None  # a second fit() of this Trainer makes its own
        if self.config.train.mlflow:  # MLflow not installed: now, not after training
            from tftrain.train import mlflow_log

            mlflow_log.check(self.config.train.mlflow)
        if self.config.train.export:  # a converter that is not installed: now, not after training
            from tftrain.train import export

            export.parse(self.config.train.export)
        self._check_same_task(Path(run_dir))  # first: another task's settings differ too
        self.run_dir = rundir_lib.check_run_dir(run_dir, self.config.to_dict(),
                                                restart_of=rundir_lib.restarted_job())
        if self.is_chief:  # another process training into it: refused now, not after TensorFlow starts
            rundir_lib.check_not_in_use(self.run_dir.path)
        if self.config.train.init_from is not None and not self.run_dir.resumed:  # a path without weights: now
            from tftrain.train import init_weights

            init_weights.resolve(self.config.train.init_from)

    def _resumed(self) -> Optional[Path]:
        """`--resume`: the newest unfinished run directory of this task and config (`runs/<task>-*`); in
        a cluster the job's own one where it exists. `RunDirError` when there is none."""
        if not self.config.resume:
            return None
        if self.cluster is not None and (self._default_run_dir() / rundir_lib.CONFIG_FILE).is_file():
            return None  # the same job again: its directory is fixed
        found = rundir_lib.newest_unfinished(self.task.name, self.config.to_dict(), restart_of=rundir_lib.restarted_job(),
                                             in_use_ok=not self.is_chief)
        if found is None:
            raise rundir_lib.RunDirError(
                f"--resume found no unfinished run of task {self.task.name!r} with these settings under runs/. "
                "Drop --resume to start a new run, or pass --run-dir DIR of the run to resume.")
        return found

    def _task_identity(self) -> dict:
        hparams = self.config.task
        return {"name": self.task.name, "class": type(self.task).__qualname__,
                "hparams": type(hparams).__qualname__ if hparams is not None else None}

    def _check_same_task(self, run_dir: Path) -> None:
        """Raises `RunDirError` when `run_dir` holds another task's run."""
        from tftrain.errors import RunDirError

        path = run_dir / TASK_FILE
        if not path.is_file():
            return
        try:
            theirs = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            theirs = None
        ours = self._task_identity()
        if not isinstance(theirs, dict):  # damaged: the settings' check still refuses another run; written anew
            return self.console.warn(f"{path} is damaged; this run writes it again")
        if theirs != ours:
            raise RunDirError(
                f"Run directory {str(run_dir)!r} holds a run of task {theirs.get('name')!r} "
                f"({theirs.get('class')}); this is task {ours['name']!r} ({ours['class']}). Pass a new --run-dir."
            )

    @property
    def is_chief(self) -> bool:
        """Whether this process writes the run directory (single process, or the chief)."""
        return self.cluster is None or self.cluster.is_chief

    @property
    def task_name(self) -> str:
        """This process's task in the cluster (`"chief"` for a single process)."""
        return self.cluster.task if self.cluster is not None else "chief"

    def serves(self) -> bool:
        """Whether this process only serves (a worker or ps task of a parameter-server job)."""
        return self.loop.serves(self.cluster)

    def serve(self) -> None:
        """Serves this task's `tf.distribute.Server` until the chief says how the job ended: raises
        `JobFailed` on the chief's failure or absence, `Preempted` on its reported stop."""
        from tftrain.runtime import configure_devices, serve

        previous = {}
        if threading.current_thread() is threading.main_thread():  # the chief saves, then says JOB_STOPPED
            task = self.cluster.task

            def noted(signum, frame):  # runs between the status queue's 1-second polls
                print(f"{task}: got {signal.Signals(signum).name}; serving on until the chief saves and says how the "
                      "job ended (the launcher's --grace or the scheduler's kill ends this task otherwise)", flush=True)

            previous = {signum: signal.signal(signum, noted) for signum in (signal.SIGTERM, signal.SIGUSR1)}
        try:
            rt = self.config.runtime
            configure_devices(rt.device)  # --device cpu hides the GPUs from the ops the chief places here
            serve(self.cluster, rt.intra_op_threads, rt.inter_op_threads)
        finally:  # a process that goes on (a test, a notebook) gets its handlers back
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return None

    def setup_runtime(self, settings=None) -> None:
        """Threads, devices, precision, strategy, seed, `--deterministic`; `settings`: a `RuntimeConfig` not the run's."""
        import keras

        from tftrain import runtime

        self.runtime = runtime.setup(settings or self.config.runtime, cluster=self.cluster)
        self.precision = PrecisionPlanner(self.config.runtime.precision, self.runtime.precision,
                                          self.runtime.devices.kind, self.console.line)
        self.execution = ExecutionPlanner(self.config.runtime, self.config.train.backup_every_steps, self.loop,
                                          self.runtime.num_replicas, self.runtime.devices.kind, self.console)
        if self.config.seed is not None:
            keras.utils.set_random_seed(self.config.seed)
        if self.config.deterministic:  # the seed and untimed settings: config_lib.deterministic_config
            import tensorflow as tf

            tf.config.experimental.enable_op_determinism()

    def bind_task(self) -> None:
        """Binds the task to the run's config; before `setup_runtime`, as `Task.bind` must not start TensorFlow."""
        self.task = self.task.bind(self.config)

    def check_task(self) -> None:
        """Raises `ConfigError` on flags the bound task cannot serve (e.g. `--tune` without validation data)."""
        from tftrain.train import data_checks

        validation = self.task.validation_data(32)  # raises now on a split the task refuses
        has_validation = validation is not None
        train = self.task.train_data(32)
        for dataset, what in ((train, "training data"), (validation, "validation data"),
                              (self.task.test_data(32), "test data")):
            data_checks.check_element_spec(dataset, what)
        data_checks.check_class_weight(train, self.task.class_weight)
        if self.config.runtime.strategy in ("mirrored", "multi_worker_mirrored"):
            data_checks.check_dense(train, self.config.runtime.strategy)
        if self.config.train.tune and not has_validation:
            raise ConfigError("--tune scores trials on validation data, never on the test set: pass "
                              "--validation-split F (e.g. 0.1) or give the task its own validation data.")
        if self.loop.needs_steps_per_epoch and self.task.num_train_examples is None:
            raise ConfigError(f"{self.loop.name} needs steps per epoch that every task agrees on: give the task "
                              "num_train_examples (the number of training examples per epoch).")
        if self.task.class_weight is not None and not self.loop.weighs_classes:
            raise ConfigError(f"class_weight is not supported by {self.loop.name}: weigh the examples in the task's "
                              "loss instead, or train with another strategy.")
        watched = self.early_stopping_monitor()
        if self.config.train.early_stopping is not None and watched.startswith("val_") and not has_validation:
            raise ConfigError(f"--early-stopping watches {watched}: pass --validation-split F (e.g. 0.1) or give the "
                              "task its own validation data.")
        self._check_backup_every()

    # -- callbacks, train, evaluate, save --------------------------------------
    def train(self, model, callbacks):
        """The loop's fit over `epochs` with `callbacks` (`RunCallbacks`); returns `(History, seconds)`."""
        gb = self.batch.global_batch_size
        validation = self._evenly_first(self.task.validation_data(gb))
        micro_steps = self.steps_per_epoch * self.accumulation_steps if self.steps_per_epoch else None
        verbose, progress = keras_progress(self.config.train.verbose)
        from tftrain.callbacks.keep_best import quiet_retracing  # --tune's trials traced the model's functions

        started = time.perf_counter()
        try:
            with self.preemption.polling(stop_after=False) if self.preemption else contextlib.nullcontext(), \
                    quiet_retracing() if self.config.train.tune else contextlib.nullcontext():
                history = self.loop.fit(
                    model, self._train_data, epochs=self.config.train.epochs, steps_per_epoch=micro_steps,
                    callbacks=[*callbacks.all, *progress], verbose=verbose, validation_data=validation,
                    runtime=self.runtime, say=self.console.line,
                    class_weight=self.task.class_weight,
                )
        except Preempted as e:  # the checkpoint of this step is saved: name where it is
            e.run_dir = str(self.run_dir.path)
            raise
        except TrainingDiverged as e:  # the guard names the step; the run directory knows the checkpoint
            raise TrainingDiverged(f"{e}; {diverged_note(self.run_dir.backup_dir)}") from e
        except Exception as e:  # noqa: BLE001 (an XLA step that does not compile: one line and the fix)
            self.execution.raise_if_xla_failed(e)
            self.precision.raise_if_first_step_failed(e, model)
            raise
        finally:
            if callbacks.agreed_stop is not None:  # its watcher threads, when fit ended early
                callbacks.agreed_stop.close()
        if self.execution.trial is not None:  # a run that ended before every candidate was timed
            self.execution.trial.finish()
        return history, time.perf_counter() - started

    def choose_execution(self, model) -> None:
        """The execution stage: `ExecutionPlanner.choose` on this run's facts."""
        self.execution.choose(model, self.run_facts())

    def run_facts(self) -> RunFacts:
        """What the execution choice needs of this run, as it stands (the batch plan may be to come)."""
        from tftrain.train.model_facts import batch_hooks

        wants_hooks = self.config.runtime.steps_per_execution == "auto" and self.loop.per_step_hooks
        gb = self.batch.global_batch_size if self.batch else 0
        return RunFacts(self.steps_per_epoch, self.accumulation_steps, self.config.train.epochs,
                        tuple(batch_hooks(self.user_callback_objects())) if wants_hooks else (), gb, self.task,
                        lambda: probe_batches(self.task, gb))

    def _train_data(self, input_context=None):
        """The task's training batches; under accumulation a finite epoch is cut to whole optimizer steps."""
        dataset = self.task.train_data(self.batch.global_batch_size, input_context)
        if self.accumulation_steps == 1 or not self.steps_per_epoch or input_context is not None:
            return dataset  # a multi-worker loop repeats it and runs steps_per_epoch micro-batches
        import tensorflow as tf

        if int(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY:
            return dataset
        return dataset.take(self.steps_per_epoch * self.accumulation_steps)

    def _evenly_first(self, dataset):
        """`dataset` whose first batch splits evenly over the replicas (of every worker): Keras reads its shapes
        by a cross-replica reduce, which fails on parts of different sizes."""
        import tensorflow as tf

        if dataset is None or self.runtime.num_replicas == 1 or \
                isinstance(self.runtime.strategy, tf.distribute.ParameterServerStrategy):  # the chief evaluates
            return dataset
        from tftrain.tuning.keras_tuner import evenly_first

        return evenly_first(dataset, self.batch.global_batch_size, self.runtime.num_replicas)

    # -- record, report ----------------------------------------------------------
    def write_record(self, record: RunRecord) -> None:
        """Writes the HParams session, then `metrics.json` and `report.md` (chief only)."""
        if self.is_chief:
            reporting.write_record(record, hparams_log.hparam_values(self.resolved, record))

    def report(self, record: RunRecord) -> None:
        """Writes `metrics.json` and `report.md` again (chief: the export's results), ends MLflow, prints the result."""
        if self.is_chief:
            reporting.write_record(record)
            if self.made.mlflow is not None:  # after metrics.json and report.md, which it uploads
                self.made.mlflow.finish(hparams_log.hparam_values(self.resolved, record),
                                        hparams_log.final_figures(record),
                                        step=record.resumed_from_epoch + record.epochs_trained)
        profile = "  (profile: Profile tab)" if self.made.profiler else ""
        tensorboard = f"tensorboard --logdir {self.run_dir.log_dir}{profile}" if self.is_chief else None
        reporting.print_result(record, self.console, self.task.example_unit, self.task.input_bound_hint(), tensorboard)
