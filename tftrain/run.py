"""`python -m tftrain.run FILE.py:NAME [flags]`: train any task from the command line.

    python -m tftrain.run examples/regression.py:task --epochs 5

NAME is a `tftrain.Task` in the file (or `package.module:NAME`), or a callable returning one. Every recipe flag
works, plus one per task hyperparameter (`--config FILE`: a recipe YAML's `task:` section). A task file that starts
TensorFlow on import is named with the fix (exit 2 for `--cpu-replicas`, a warning for threads). Exit codes: 0 done;
2 bad input; 1 the run failed (traceback in the run directory); 130 Ctrl-C; 143 (138) SIGTERM (SIGUSR1) after
saving a checkpoint the same command resumes from.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from tftrain import cli
from tftrain.checkpoint_files import checkpoints, read_position
from tftrain.errors import (AlreadyFinished, ConfigError, Preempted, RuntimeStartedError, RuntimeStartedWarning,
                            one_line)
from tftrain.rundir import BACKUP_DIR, FAILURE_LOG, METRICS_FILE, RUN_ID_ENV, pending_after_steps
from tftrain.train.user_code import import_where, line_of

PROG = "python -m tftrain.run"


def load_task(spec: str):
    """Loads the `tftrain.Task` (or a function or class returning one) named `FILE.py:NAME` or `MODULE:NAME`.

    Raises:
        ConfigError: a malformed spec, an import error (named with its line), a missing NAME, or no Task.
    """
    from tftrain.train.tasks import Task

    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ConfigError(f"Invalid task {spec!r}. Expected FILE.py:NAME or MODULE:NAME, e.g. examples/regression.py:task.")
    try:
        module = import_where(where)
    except ConfigError:
        raise
    except Exception as e:  # the user's file: say what and where, in one line
        raise ConfigError(f"Could not import {where!r}: {one_line(e)}{line_of(e, where)}.") from None
    if not hasattr(module, name):
        found = sorted(k for k, v in vars(module).items() if isinstance(v, Task))
        raise ConfigError(f"{where!r} has no {name!r}." + (f" Tasks in it: {', '.join(found)}." if found else ""))
    obj = getattr(module, name)
    if not isinstance(obj, Task) and callable(obj):
        obj = obj()
    if not isinstance(obj, Task):
        raise ConfigError(f"{spec} is a {type(obj).__name__}, not a tftrain.Task (or a function returning one).")
    return obj


def _split_task_spec(argv: List[str]) -> Tuple[Optional[str], List[str]]:
    """The task spec (the first non-flag `WHERE:NAME` argument) and the other arguments."""
    for i, arg in enumerate(argv):
        if not arg.startswith("-") and ":" in arg:
            return arg, argv[:i] + argv[i + 1:]
    return None, argv


def main(argv: Optional[Sequence[str]] = None, *, task=None, prog: str = PROG, description: str = "",
         default_config: Optional[str] = None) -> int:
    """Parses flags, trains the task, maps errors to exit codes (module docstring; 0 if a restart finds it done).

    Args:
        argv: arguments after the program name (None: `sys.argv[1:]`), with a `WHERE:NAME` task spec unless `task`.
        task: a `tftrain.Task` to run (recipes pass theirs). Defaults to None.
        default_config: a recipe file named in `--config`'s help. Defaults to None.
    """
    from tftrain.train.trainer import Interrupted, Trainer

    started = time.perf_counter()
    argv = list(sys.argv[1:] if argv is None else argv)
    command, trainer, started_by, threads = [*prog.split(), *argv], None, None, []
    task_file = task is None  # the user's task file, loaded below
    try:
        if task is None:
            task, argv, started_by = _task_from_argv(argv, prog)
        cfg = cli.parse_config(argv, task.default_config(), prog, description or _describe(task), default_config,
                               omit=task.unused_fields)
        threads = _unapplied_thread_flags(cfg.runtime) if started_by else []
        if threads and cfg.runtime.cpu_replicas == 1:  # with --cpu-replicas, a refusal's line names them too
            print(f"{prog}: warning: {_started_tensorflow(started_by, task, None, threads)}", file=sys.stderr)
        trainer = Trainer(task, cfg, command=command)
        _fit(trainer, started, quiet_threads=bool(threads))
        global _written_alone  # a recipe, no user code that may hold open files or exit hooks
        _written_alone = (trainer.cluster is None and not task_file and not trainer.config.sanity_check
                          and not trainer.callbacks and not trainer.config.train.callbacks)
        return 0
    except RuntimeStartedError as e:  # the task file started TensorFlow: name it and the fix
        refused = _refused_setting(e, trainer.config.runtime) if started_by and trainer else None
        print(f"{prog}: error: {_started_tensorflow(started_by, task, refused, threads) if refused else e}",
              file=sys.stderr)
        return 2
    except ConfigError as e:
        print(f"{prog}: error: {_with_data_error_hint(str(e), trainer, getattr(e, 'error', None))}", file=sys.stderr)
        return 2
    except AlreadyFinished as e:  # a scheduler restarted a job that had finished: nothing to do
        print(f"{prog}: {e}", flush=True)
        return 0
    except KeyboardInterrupt as e:  # Interrupted: during training; else before the run directory, or a second
        if _written(trainer):  # Ctrl-C while the Trainer handled the first; at the report, the run is on disk
            print(f"\n{prog}: interrupted after the run was written ({trainer.run_dir.path / METRICS_FILE}): it is "
                  "complete", file=sys.stderr)
            return 0
        if isinstance(e, Interrupted):
            print(f"\n{prog}: interrupted. {_resume_hint(e.run_dir, trainer)}", file=sys.stderr)
            return 130
        written = trainer is not None and getattr(trainer, "out_dir", None) is not None
        print(f"\n{prog}: interrupted" + (f". {_resume_hint(str(trainer.run_dir.path), trainer)}" if written
                                         else " before training started."), file=sys.stderr)
        return 130
    except Preempted as e:  # SIGTERM / SIGUSR1: the checkpoint of the current step is saved
        print(f"{prog}: {e}. {_resume_hint(e.run_dir, trainer)}", file=sys.stderr)
        return 128 + e.signum
    except Exception as e:  # one line; the traceback goes to the run directory
        advice = _disk_full(e, trainer) or _in_the_way(e, trainer)  # each says what to do next
        print(f"{prog}: run failed: {advice or _with_data_error_hint(one_line(e), trainer, e)}"
              f"{_failure_log(trainer, e, not advice)}", file=sys.stderr)
        return 1


def _with_data_error_hint(message: str, trainer, error) -> str:
    """`message`, and what in the task's data caused `error` (`Task.data_error_hint`) when it knows."""
    try:
        hint = trainer.task.data_error_hint(error) if error is not None and trainer is not None else ""
    except BaseException:  # noqa: BLE001 (a hint must not hide the failure it explains, nor Ctrl-C during it)
        hint = ""
    return f"{message.rstrip('.')}: {hint}" if hint else message


def _chain(error: BaseException) -> list:
    """`error` and the errors it was raised from or during (at most 8)."""
    chain, seen = [], error
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def _written(trainer) -> bool:
    """Whether the trainer's run is written whole: `metrics.json`, nothing pending after it."""
    run_dir = getattr(getattr(trainer, "run_dir", None), "path", None)
    return run_dir is not None and (Path(run_dir) / METRICS_FILE).is_file() and not pending_after_steps(run_dir)


def _in_the_way(error: BaseException, trainer=None) -> str:
    """For a folder where a file is written, or a file where a folder is (EISDIR, ENOTDIR): one line naming it and
    the fix; else ""."""
    import errno

    found = next((e for e in _chain(error) if getattr(e, "errno", None) in (errno.EISDIR, errno.ENOTDIR)
                  and getattr(e, "filename", None)), None)
    if found is None:
        return ""
    what = "a folder where a file is written" if found.errno == errno.EISDIR else "under a file, not a folder"
    path = getattr(found, "filename2", None) or found.filename  # a rename's target
    run_dir = getattr(getattr(trainer, "run_dir", None), "path", None)
    rerun = _rerun(str(run_dir), trainer) if run_dir is not None else "rerun the same command"
    return f"{type(found).__name__}: {path} is {what}: move it out of the way, then {rerun}"


def no_space_where(error: BaseException, default=None):
    """For a full-disk error (ENOSPC, also wrapped by HDF5 or TensorFlow, among the errors it was raised from):
    the path it names, else `default`; None for any other error."""
    import errno

    full = [e for e in _chain(error) if getattr(e, "errno", None) == errno.ENOSPC or "No space left on device" in str(e)]
    if not full:
        return None
    return next((getattr(e, "filename", None) for e in full if getattr(e, "filename", None)), None) or default


def _disk_full(error: BaseException, trainer) -> str:
    """For a full-disk error (`no_space_where`): one line with where and the fix; else ""."""
    run_dir = getattr(getattr(trainer, "run_dir", None), "path", None)
    where = no_space_where(error, run_dir or "the run directory")
    if where is None:
        return ""
    fix = f"free space on that disk, then {_rerun(str(run_dir), trainer) if run_dir else 'rerun the same command'}"
    if run_dir is None:
        state = f"{fix} (it resumes from a checkpoint, if one was written)"
    elif (Path(run_dir) / METRICS_FILE).is_file():
        state = f"the trained run is written (metrics.json): {fix} to finish it"
    elif checkpoints(Path(run_dir) / BACKUP_DIR):
        state = f"the last checkpoint in the run directory is kept: {fix} to resume"
    else:
        state = f"no checkpoint was written yet: {fix}"
    return f"{type(error).__name__}: no space left on the disk holding {where}; {state}"


def _resume_hint(run_dir: str, trainer=None) -> str:
    """`To resume, ` and `_rerun`."""
    return f"To resume, {_rerun(run_dir, trainer)}."


def _rerun(run_dir: Optional[str], trainer=None) -> str:
    """How to run the same run again: the same command where it names the run directory (`--run-dir`), else with
    `--run-dir` (a parameter-server job's server tasks do not know it; `--resume` may find a newer run); the path
    quoted for a shell."""
    import shlex

    launched = bool(os.environ.get(RUN_ID_ENV))  # a task of `python -m tftrain.launch`: the user's command is its
    command = "the same python -m tftrain.launch command" if launched else "the same command"
    if not run_dir:  # none written yet, or a server task's, which does not know the chief's
        alone = not os.environ.get("TF_CONFIG") and getattr(trainer, "cluster", None) is None
        return f"rerun {command}" + ("" if alone else " (the chief's line names the run directory)")
    if trainer is not None and getattr(getattr(trainer, "config", None), "run_dir", None) is not None:
        return f"rerun {command}"
    flags = f"--run-dir {shlex.quote(run_dir)} (--resume takes the newest unfinished run of these settings)"
    return f"rerun {command} with {flags}" + (" added to the training command after --" if launched else "")


def _fit(trainer, started: float, quiet_threads: bool) -> None:
    """`trainer.fit`; with `quiet_threads`, without the runtime's warning that thread counts were not applied."""
    global _ran, _succeeded
    _succeeded = False  # an earlier main() in this process
    with warnings.catch_warnings():
        if quiet_threads:
            warnings.simplefilter("ignore", RuntimeStartedWarning)
        try:
            trainer.fit(started=started)
            _succeeded = True
        finally:
            _ran = True


def _task_from_argv(argv: List[str], prog: str):
    """`(task, the other arguments, the task file when loading it started TensorFlow, else None)`."""
    spec, rest = _split_task_spec(argv)
    if spec is None:
        if any(a in ("-h", "--help") for a in argv):
            cli.build_parser(f"{prog} FILE.py:NAME", _empty_config(), __doc__.split("\n\n")[0]).print_help()
            raise SystemExit(0)
        file = next((a for a in rest if not a.startswith("-") and a.endswith(".py")), None)
        if file is not None:
            raise ConfigError(f"{file!r} names a file but not the task in it. Pass {file}:NAME, the task's name in "
                              f"the file, e.g. python -m tftrain.run {file}:task.")
        raise ConfigError("No task given. Usage: python -m tftrain.run FILE.py:NAME [flags], "
                          "e.g. python -m tftrain.run examples/regression.py:task --epochs 3.")
    started_before = _tensorflow_started()
    task = load_task(spec)
    started_by = spec.rpartition(":")[0] if not started_before and _tensorflow_started() else None
    return task, rest, started_by


def _tensorflow_started() -> bool:
    """Whether TensorFlow's runtime has started in this process (never starts it)."""
    if "tensorflow" not in sys.modules:  # not even imported, so not started (and not imported here)
        return False
    from tftrain.runtime import runtime_started

    return runtime_started()


def _unapplied_thread_flags(runtime_config) -> List[str]:
    """`["--intra-op-threads 2", ...]`: thread counts asked for that differ from those in effect."""
    from tftrain.runtime.threads import current_threads

    now = current_threads()
    asked = (("--intra-op-threads", runtime_config.intra_op_threads, now.intra_op),
             ("--inter-op-threads", runtime_config.inter_op_threads, now.inter_op))
    return [f"{flag} {n}" for flag, n, in_effect in asked if n and n != in_effect]


def _refused_setting(error: RuntimeStartedError, runtime_config) -> Optional[str]:
    """What the runtime refused, as flags (`--cpu-replicas 2 cannot split the CPU`), or None."""
    if error.setting == "cpu_replicas":
        return f"--cpu-replicas {runtime_config.cpu_replicas} cannot split the CPU"
    if error.setting == "device":
        return f"--device {runtime_config.device} cannot hide the GPUs"
    if error.setting == "strategy":
        return f"--strategy {runtime_config.strategy} cannot set up its cluster"
    return None


def _started_tensorflow(task_file: str, task, refused: Optional[str], threads: Sequence[str]) -> str:
    """One line: the task file started TensorFlow, so these settings cannot apply; and the fix."""
    unmet = ([refused] if refused else []) + ([f"{' and '.join(threads)} cannot apply"] if threads else [])
    return (f"{task_file} started TensorFlow when imported (a Keras metric, optimizer, layer or tensor built at module level), "
            f"so {' and '.join(unmet)}: {_started_tensorflow_fix(task)}")


def _started_tensorflow_fix(task) -> str:
    """How to keep a task file from starting TensorFlow: pass a metric's class, or build it later."""
    metric = next(_metric_instances(getattr(task, "metrics", None)), None)
    if metric is None:
        return "build Keras objects and tensors inside build_model or compile_args, not at module level."
    from tftrain.train.tasks import metric_class_name

    return f"build metrics inside compile_args, or pass the class (metrics=[{metric_class_name(type(metric))}])."


def _metric_instances(metrics):
    """The `keras.metrics.Metric` objects in a (nested) list or dict of metrics."""
    keras = sys.modules.get("keras")
    if keras is None or metrics is None:
        return
    if isinstance(metrics, keras.metrics.Metric):
        yield metrics
    elif isinstance(metrics, dict):
        for value in metrics.values():
            yield from _metric_instances(value)
    elif isinstance(metrics, (list, tuple)):
        for value in metrics:
            yield from _metric_instances(value)


def _empty_config():
    from tftrain.config import RecipeConfig

    return RecipeConfig()


def _describe(task) -> str:
    doc = (type(task).__doc__ or "").strip().split("\n\n")[0]
    return f"Train the task {task.name!r}" + (f": {doc}" if doc else ".")


def _failure_log(trainer, error: BaseException, resume_hint: bool = True) -> str:
    """Writes the traceback to `<run_dir>/failure.log` when the run directory exists; returns where (its logs
    where they exist, and with `resume_hint` how to resume where a checkpoint is kept)."""
    run_dir = getattr(getattr(trainer, "run_dir", None), "path", None)
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    if run_dir is not None and Path(run_dir).is_dir() and trainer.is_chief:  # other workers never write there
        log = Path(run_dir) / FAILURE_LOG
        try:
            log.write_text(text, encoding="utf-8")
            kept = (f". Its checkpoint is kept. {_resume_hint(str(run_dir), trainer)}"
                    if resume_hint and read_position(trainer.run_dir.backup_dir) is not None else "")
            logs = Path(run_dir) / "logs"
            return f". Traceback: {log}" + (f"; logs: {logs}" if logs.is_dir() else "") + kept
        except OSError as e:  # a full disk: the line alone, never a half-written log
            log.unlink(missing_ok=True)
            return f" (no {FAILURE_LOG} written: {e.strerror or e})"
    return f". Traceback:\n{text}" if os.environ.get("TFTRAIN_TRACEBACK") else \
        ". (Set TFTRAIN_TRACEBACK=1 to print the traceback.)"


def _exit_on_sigterm(signum, frame):
    """SIGTERM outside the Trainer's own watch: one line, then exit 143; after a run that succeeded, exit 0 (its
    results are written: there is nothing left to stop)."""
    if _succeeded:
        print(f"tftrain: {signal.Signals(signum).name} after the run succeeded; exiting", file=sys.stderr, flush=True)
        raise SystemExit(0)
    when = "after the run ended" if _ran else "before the run started (nothing written): rerun the same command"
    print(f"tftrain: stopped by {signal.Signals(signum).name} {when}", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


def _one_line_thread_error(args) -> None:
    """An error that ended a background thread, in one line (`threading.excepthook`); the run's own exit code and
    line say how it ended."""
    if args.exc_type is not SystemExit:
        name = getattr(args.thread, "name", "a thread")
        print(f"tftrain: warning: {name} ended: {one_line(args.exc_value)}", file=sys.stderr, flush=True)


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A Python warning as the command line prints its own: `warning: <message>`, without its source line."""
    return f"warning: {' '.join(str(message).split())}\n"


_ran = False
"""Set by `main` once the Trainer's `fit` returned or raised."""

_succeeded = False
"""Set by `main` once the Trainer's `fit` returned: the run is written."""

_written_alone = False
"""Set by `main` when one process ran only tftrain's code (a recipe, no callbacks) to the end: safe to exit fast."""


def run_module(main_fn: Callable[[], int] = main) -> None:
    """`if __name__ == "__main__"` helper: runs `main_fn()`, exits with its code (SIGTERM: 143 via normal shutdown,
    so a worker's temporary directory is removed). When `_written_alone`, skips the interpreter's slow teardown;
    user code and cluster processes shut down normally, so exit hooks run and open files are flushed."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    warnings.formatwarning = _one_line_warning
    if not os.environ.get("TFTRAIN_TRACEBACK"):  # e.g. TensorFlow's preemption watcher after the chief died
        threading.excepthook = _one_line_thread_error
    # tftrain's own line says it (`--execution xla: Keras compiles this model without XLA ...`).
    warnings.filterwarnings("ignore", message="Model doesn't support `jit_compile=True`")
    try:
        code = main_fn()
    except KeyboardInterrupt:  # a second Ctrl-C while the first was handled: the first one's exit code
        print(f"\n{PROG}: interrupted.", file=sys.stderr)
        code = 130
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the interpreter's teardown would kill it by SIGINT
    if code == 0:  # a stop signal during the interpreter's teardown would turn a finished run's exit code to 143
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if code == 0 and _written_alone:
        import logging

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    sys.exit(code)


if __name__ == "__main__":
    run_module()
