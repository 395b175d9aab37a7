"""Run directories: one per run, never silently overwritten, resumable.

Layout: config.yaml (the resolved config), logs/ (TensorBoard), backup/ (checkpoints; removed once model.keras
and metrics.json are written), model.keras, history.csv, metrics.json, report.md, failure.log, .tftrain.lock and
.tftrain.holder. A directory holding a run is reused only to resume that same unfinished run, else `RunDirError`.
In a multi-worker run only the chief writes it (`task_run_dir`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Mapping, Optional

import yaml

from tftrain.errors import RunDirError
from tftrain.files import write_text_atomic  # rundir's writes (and its callers')

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.json"
REPORT_FILE = "report.md"
MODEL_FILE = "model.keras"
WEIGHTS_FILE = "model.weights.h5"
"""The trained weights, written instead of `MODEL_FILE` for a model Keras cannot serialize."""
LOG_DIR = "logs"
BACKUP_DIR = "backup"
HISTORY_FILE = "history.csv"
"""One row per epoch and every logged metric, appended across resumes (Keras's `CSVLogger`)."""
FAILURE_LOG = "failure.log"
"""The traceback of a failed attempt (`tftrain.run`); a later attempt that finishes removes it."""
DIGEST_FILE = ".tftrain.config-sha256"
"""SHA-256 of the settings `config.yaml` was written with, so a damaged one is told from another run's."""
LOCK_FILE, HOLDER_FILE = ".tftrain.lock", ".tftrain.holder"
"""The writer's `filelock` (released by the OS even on SIGKILL), and the file naming it (pid, host, start)."""

_IGNORED_WHEN_RESUMING = (("train", "verbose"), ("train", "profile"), ("train", "backup_every_steps"),
                          ("train", "callbacks"), ("train", "mlflow"), ("runtime", "nvtx"),
                          ("runtime", "remember_execution"), ("run_dir",), ("resume",), ("sanity_check",))
"""Config fields that may differ between a run and its resumption."""


@dataclasses.dataclass(frozen=True)
class RunDir:
    """A prepared run directory.

    Attributes:
        resumed_epochs: epochs an interrupted run of the same config completed; 0 for a new run.
        resumed_steps: batches of the next epoch done (mid-epoch checkpoint; micro-batches if accumulating).
        finished_before: a scheduler's restart found this run finished with the same config.
        after_steps_pending: after-steps (`"export"`) a finished run has not done; a rerun does only these.
        config_repaired: its damaged `config.yaml` is rewritten (this run's settings match its digest).
        end_unwritten: what of a finished run's end is damaged, its checkpoint kept: this run writes it again.
    """

    path: Path
    resumed_epochs: int = 0
    resumed_steps: int = 0
    finished_before: bool = False
    after_steps_pending: tuple = ()
    config_repaired: bool = False
    end_unwritten: Optional[str] = None

    @property
    def resumed(self) -> bool:
        """Whether an interrupted run of this configuration left a checkpoint to resume from."""
        return bool(self.resumed_epochs or self.resumed_steps)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @property
    def log_dir(self) -> Path:
        """TensorBoard log directory (`logs/`)."""
        return self.path / LOG_DIR

    @property
    def backup_dir(self) -> Path:
        """BackupAndRestore checkpoint directory (`backup/`)."""
        return self.path / BACKUP_DIR


def default_run_dir(recipe: str, root: str = "runs", now: Optional[datetime.datetime] = None) -> Path:
    """A new directory name `runs/<recipe>-YYYYmmdd-HHMMSS` (suffixed `-2`, `-3`, ... if taken)."""
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{recipe}-{stamp}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def newest_unfinished(task: str, config: dict, root: str = "runs", restart_of: Optional[str] = None,
                      in_use_ok: bool = False) -> Optional[Path]:
    """The newest `root/<task>-*` this run may resume (`--resume`), or None: same config, unfinished (or finished
    by job `restart_of`: `check_run_dir`), not held by another process unless `in_use_ok` (its chief holds it);
    `RunDirError` naming the holder when the only such run is held. A run with a checkpoint comes before one
    without (killed before its first): that one has nothing to resume."""
    from tftrain.checkpoint_files import checkpoints

    candidates = [p for p in Path(root).glob(f"{task}-*") if (p / CONFIG_FILE).is_file()]
    newest = sorted(candidates, key=lambda p: (bool(checkpoints(p / BACKUP_DIR)), p.stat().st_mtime), reverse=True)
    in_use = None  # the newest run of these settings another process is training: not one to start beside
    for path in newest:
        try:
            check_run_dir(path, config, restart_of)
        except RunDirError:
            continue
        try:
            if not in_use_ok:
                check_not_in_use(path)
        except RunDirError as error:
            in_use = in_use or error
            continue
        return path
    if in_use is not None:
        raise in_use
    return None


RUN_ID_ENV = "TFTRAIN_RUN_ID"


def cluster_run_id(cluster_spec: dict, env: Optional[dict] = None) -> str:
    """A run id every task of a cluster derives alike (not a timestamp: tasks start apart), for `runs/<task>-<id>`.

    `job_id(env)` when set, else `cluster-` + 10 hex digits of the SHA-1 of `cluster_spec` (the same for every
    pod of a TFJob, so a restarted job resumes its directory). `env` defaults to `os.environ`.
    """
    job = job_id(env)
    if job is not None:
        return job
    digest = hashlib.sha1(json.dumps(cluster_spec, sort_keys=True).encode()).hexdigest()
    return f"cluster-{digest[:10]}"


def job_id(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The job's id, the same across its restarts: `TFTRAIN_RUN_ID` (set by `python -m tftrain.launch`),
    else `slurm<SLURM_JOB_ID>`, else None. `env` defaults to `os.environ`."""
    env = os.environ if env is None else env
    if env.get(RUN_ID_ENV, "").strip():
        return env[RUN_ID_ENV].strip().replace(os.sep, "-")
    if env.get("SLURM_JOB_ID", "").strip():
        return f"slurm{env['SLURM_JOB_ID'].strip()}"
    return None


def _strip(config: dict) -> dict:
    config = json.loads(json.dumps(config))  # deep copy of plain data
    for keys in _IGNORED_WHEN_RESUMING:
        node = config
        for key in keys[:-1]:
            node = node.get(key, {})
        node.pop(keys[-1], None)
    return config


def config_digest(config: dict) -> str:
    """SHA-256 of a config's settings that must match to resume (`_IGNORED_WHEN_RESUMING` left out)."""
    return hashlib.sha256(json.dumps(_strip(config), sort_keys=True, default=str).encode("utf-8")).hexdigest()


def _stored_config(p: Path, config: dict) -> tuple:
    """`(settings, repaired)` of `p/config.yaml`: None when unreadable or damaged (its digest differs), or
    `config` itself with `repaired` True when it is damaged but `config` has the digest it was written with."""
    try:
        stored = yaml.safe_load((p / CONFIG_FILE).read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError, OSError):
        stored = None
    digest = _digest(p)
    if isinstance(stored, dict) and (digest is None or config_digest(stored) == digest):
        return stored, False
    return (config, True) if digest == config_digest(config) else (None, False)


def _digest(p: Path) -> Optional[str]:
    """The SHA-256 `p/DIGEST_FILE` holds; None when it is missing or damaged (not 64 hex digits)."""
    try:
        digest = (p / DIGEST_FILE).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return digest if re.fullmatch(r"[0-9a-f]{64}", digest) else None


def _differences(old, new, prefix="") -> list:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            out += _differences(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    return [] if old == new else [f"{prefix[:-1]}: {old!r} -> {new!r}"]


def _check_writable(p: Path) -> None:
    """RunDirError unless a directory can be made in `p`'s nearest existing folder (`os.access` lies for root)."""
    parent = p
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise RunDirError(f"Run directory {str(p)!r} is inside {str(parent)!r}, which is a file. Pass another --run-dir.")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".tftrain-probe-", dir=parent))
    except OSError as e:
        fix = ("Make it writable (or copy it to a place you can write to and pass that --run-dir), then rerun the "
               "same command: it resumes from the run's checkpoint" if parent == p and (p / BACKUP_DIR).is_dir()
               else "Pass --run-dir with a folder you can write to")
        raise RunDirError(f"Run directory {str(p)!r} cannot be written ({str(parent)!r}: {e.strerror}). {fix}.") \
            from None


JOB_FILE = "job_id"
"""The job (`job_id`) of the run's latest attempt, in the run directory (`note_job`)."""

RESTART_COUNT_ENV = "TFTRAIN_RESTART_COUNT"
"""Set by `tftrain.launch` on the tasks it restarts under `--max-restarts`: the restart's number."""

RESTART_ENVS = ("SLURM_RESTART_COUNT", RESTART_COUNT_ENV)
"""Restart counters of this job: SLURM's on a requeue (sbatch's SLURM_RESTART_COUNT) and `tftrain.launch`'s."""


def restarted_job(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """`job_id(env)` when a `RESTART_ENVS` count is >= 1 (a restart), else None. `env` defaults to `os.environ`."""
    env = os.environ if env is None else env
    counts = [env.get(name, "").strip() for name in RESTART_ENVS]
    return job_id(env) if any(c.isdigit() and int(c) > 0 for c in counts) else None


def restarted_run_dir(task: str, config: dict, root: str = "runs", env: Optional[Mapping[str, str]] = None):
    """On a scheduler's restart of a job (`restarted_job`), the newest `root/<task>-*` an attempt of it made (its
    `JOB_FILE`) that may hold these settings (`check_run_dir`), finished or not; else None. A command without
    `--run-dir` then goes on where the job's attempt before stopped, not in a new directory."""
    job = restarted_job(env)
    if job is None:
        return None
    made = [p for p in Path(root).glob(f"{task}-*") if _job_file(p) == job]
    for path in sorted(made, key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            check_run_dir(path, config, job)
        except RunDirError:
            continue
        return path
    return None


def _job_file(p: Path) -> Optional[str]:
    try:
        return (p / JOB_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return None


def note_job(path: Path, env: Optional[Mapping[str, str]] = None) -> None:
    """Records this attempt's `job_id` in `path/JOB_FILE` (removed outside a job), so a restart that finds the
    run finished knows it did (`check_run_dir`'s `restart_of`)."""
    job = job_id(env)
    if job is None:
        (path / JOB_FILE).unlink(missing_ok=True)
    else:
        write_text_atomic(path / JOB_FILE, job + "\n")


def check_run_dir(path, config: dict, restart_of: Optional[str] = None) -> RunDir:
    """Checks that `path` may hold this run, leaving nothing behind.

    Args:
        config: the run's config as nested dicts (`RecipeConfig.to_dict()`).
        restart_of: this job's id if restarted (`restarted_job()`): its own finished run is not refused.

    Returns:
        A `RunDir`: `resumed_epochs` > 0 with a checkpoint to resume, `finished_before` if `restart_of` did.

    Raises:
        RunDirError: `path` is (in) a file, unwritable, or holds foreign files, a finished run or another config's.
    """
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise RunDirError(f"Run directory {str(p)!r} is a file. Pass --run-dir with a new directory.")
    _check_writable(p)
    entries = [x.name for x in p.iterdir()  # a failure.log alone: an attempt that failed as it started (full disk)
               if x.name not in (LOCK_FILE, HOLDER_FILE, DIGEST_FILE, FAILURE_LOG)] if p.exists() else []
    if not entries:
        return RunDir(p)
    if not (p / CONFIG_FILE).is_file() and _digest(p) is None:
        names = ", ".join(sorted(entries)[:3])
        raise RunDirError(
            f"Run directory {str(p)!r} already holds files tftrain did not write ({names}). "
            "Pass --run-dir with a new or empty directory."
        )
    finished = (p / METRICS_FILE).exists()
    unwritten = (finished and (p / BACKUP_DIR).is_dir() and _unwritten(p)) or None  # a damaged end beside its
    finished = finished and not unwritten  # checkpoint: the resume writes it again
    pending = pending_after_steps(p) if finished else ()
    if finished and not pending and not _finished_by(p, restart_of) and not (p / BACKUP_DIR).is_dir():
        raise _finished_error(p)  # a backup beside metrics.json: killed as it ended, which a rerun completes
    previous, repaired = _stored_config(p, config)
    if previous is None:
        kept = [name for name in (BACKUP_DIR, MODEL_FILE) if (p / name).exists()]
        raise RunDirError(
            f"Run directory {str(p)!r} holds a damaged or no {CONFIG_FILE} ({p / CONFIG_FILE}), the settings its run "
            + (f"started with; its {' and '.join(kept)} may be intact. Write {CONFIG_FILE} back as it was (a copy, or "
               "the YAML the same command prints at start without --run-dir) and rerun to resume, or pass a new "
               "--run-dir." if kept else "started with. Pass a new --run-dir."))
    if not finished and ((p / MODEL_FILE).exists() or (p / WEIGHTS_FILE).exists()) and not (p / BACKUP_DIR).exists():
        raise RunDirError(
            f"Run directory {str(p)!r} holds a trained model ({MODEL_FILE} or {WEIGHTS_FILE}) but no {METRICS_FILE} "
            "and no checkpoint to resume "
            f"from ({METRICS_FILE} was removed, or the run was killed as it finished): training again would "
            "overwrite the model. Move the model elsewhere, or pass a new --run-dir.")
    diffs = _differences(_strip(previous), _strip(config))
    if diffs and finished:
        raise _finished_error(p)
    if diffs:
        shown = "; ".join(diffs[:3]) + ("; ..." if len(diffs) > 3 else "")
        raise RunDirError(
            f"Run directory {str(p)!r} holds another run's "
            f"{'checkpoint' if (p / BACKUP_DIR).is_dir() else 'files'} (its config differs: {shown}). "
            "Pass a new --run-dir, or rerun with that run's settings "
            f"(--config {p / CONFIG_FILE} --run-dir {p}) to resume it."
        )
    if finished:
        return RunDir(p, finished_before=True, after_steps_pending=pending, config_repaired=repaired)
    return RunDir(p, resumed_epochs=completed_epochs(p / BACKUP_DIR), config_repaired=repaired,
                  resumed_steps=_backup_metadata(p / BACKUP_DIR, "steps_in_epoch"), end_unwritten=unwritten)


def _unwritten(p: Path) -> Optional[str]:
    """What of a finished run's end in `p` is damaged or missing, or None when it is whole."""
    import json

    try:
        whole = isinstance(json.loads((p / METRICS_FILE).read_text(encoding="utf-8")), dict)
    except (OSError, ValueError):
        whole = False
    if not whole:
        return f"its {METRICS_FILE} cannot be read as a record"
    return None if (p / MODEL_FILE).is_file() or (p / WEIGHTS_FILE).is_file() else f"its {MODEL_FILE} is missing"


AFTER_STEPS_KEY = "after_steps"
"""`metrics.json`'s record of the after-steps a run asked for: `{step: "pending" | "done" | "failed: <why>"}`."""


def pending_after_steps(p) -> tuple:
    """The after-steps (`"export"`) the finished run in `p` asked for and has not done (`AFTER_STEPS_KEY`)."""
    import json

    try:
        steps = json.loads((Path(p) / METRICS_FILE).read_text(encoding="utf-8")).get(AFTER_STEPS_KEY) or {}
    except (OSError, ValueError, AttributeError):
        return ()
    return tuple(step for step, status in sorted(steps.items()) if status != "done") if isinstance(steps, dict) else ()


def _finished_by(p: Path, job: Optional[str]) -> bool:
    """Whether an attempt of `job` finished the run in `p` and nothing failed after its `metrics.json`."""
    if job is None or _job_file(p) != job:
        return False
    failure = p / FAILURE_LOG
    return not failure.exists() or failure.stat().st_mtime < (p / METRICS_FILE).stat().st_mtime


def _finished_error(p: Path) -> RunDirError:
    return RunDirError(f"Run directory {str(p)!r} holds a finished run ({METRICS_FILE} exists). Pass --run-dir with a "
                       "new directory; tftrain never overwrites a finished run.")


def completed_epochs(backup_dir) -> int:
    """Epochs the newest checkpoint in `backup_dir` records (tftrain's or Keras's); 0 if none."""
    return _backup_metadata(backup_dir, "epoch")


def _backup_metadata(backup_dir, key: str) -> int:
    """The newest checkpoint's `epoch` or `steps_in_epoch` as an int; 0 when there is none."""
    from tftrain.checkpoint_files import read_position

    position = read_position(backup_dir)
    return 0 if position is None else int(getattr(position, key, 0) or 0)


def _holder(path: Path) -> str:
    """`pid 123 on host, since 2026-...` from the holder file, or `unknown` when unreadable."""
    try:
        pid, host, since = (path / HOLDER_FILE).read_text(encoding="utf-8").split()[:3]
    except (OSError, ValueError):
        return "unknown"
    return f"pid {pid} on {host}, since {since}"


def _in_use(path: Path) -> RunDirError:
    return RunDirError(f"Run directory {str(path)!r} is in use by another tftrain process ({_holder(path)}). "
                       "Wait for it to end (or stop it), or pass a new --run-dir.")


def check_not_in_use(path) -> None:
    """`RunDirError` naming the holder if another process holds `path`'s lock (`locked` takes it later)."""
    import filelock

    path = Path(path)
    if not (path / LOCK_FILE).exists():
        return
    try:
        with filelock.FileLock(path / LOCK_FILE, timeout=0):
            pass
    except filelock.Timeout:
        raise _in_use(path) from None


@contextlib.contextmanager
def locked(path) -> Iterator[None]:
    """Holds `path`'s lock for the block, named in the holder file; `RunDirError` if another process holds it."""
    import socket

    import filelock

    path = Path(path)
    lock = filelock.FileLock(path / LOCK_FILE, timeout=0)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise _in_use(path) from None
    try:
        since = datetime.datetime.now().isoformat(timespec="seconds")
        write_text_atomic(path / HOLDER_FILE, f"{os.getpid()} {socket.gethostname()} {since}\n")
        yield
    finally:
        (path / HOLDER_FILE).unlink(missing_ok=True)
        lock.release()


def create_run_dir(run_dir: RunDir, config_yaml: str) -> None:
    """Creates the directory and writes `config.yaml` and its digest (kept as they are when resuming)."""
    run_dir.path.mkdir(parents=True, exist_ok=True)
    target = run_dir.path / CONFIG_FILE
    written = not target.exists() or run_dir.config_repaired
    if written:
        write_text_atomic(target, config_yaml)
    if written or _digest(run_dir.path) is None:  # the digest of what config.yaml holds
        held = config_yaml if written else target.read_text(encoding="utf-8")
        write_text_atomic(run_dir.path / DIGEST_FILE, config_digest(yaml.safe_load(held) or {}) + "\n")


def _check_unchanged(run_dir: RunDir, config_yaml: str) -> None:
    """Under the lock: `RunDirError` if another process has since finished the run or written other settings."""
    p = run_dir.path
    if not run_dir.finished_before and not run_dir.end_unwritten and (p / METRICS_FILE).exists():
        raise _finished_error(p)
    if not (p / CONFIG_FILE).exists():
        return
    ours = yaml.safe_load(config_yaml) or {}
    written, _ = _stored_config(p, ours)
    if written is None or _differences(_strip(written), _strip(ours)):
        raise RunDirError(f"Run directory {str(p)!r} was taken by another run while this one started (its "
                          f"{CONFIG_FILE} differs). Pass a new --run-dir.")


def worker_scratch_dir(run_dir, task: str) -> Path:
    """A non-chief `task`'s temporary directory, the same each time so a relaunch removes a killed run's."""
    digest = hashlib.sha1(str(Path(run_dir).resolve()).encode("utf-8")).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"tftrain-{task.replace(':', '')}-{digest}"


@contextlib.contextmanager
def task_run_dir(run_dir: RunDir, config_yaml: str, is_chief: bool = True, task: str = "worker") -> Iterator[RunDir]:
    """The directory this task writes its logs, checkpoints and model to.

    The chief gets `run_dir`, created with `config.yaml`, and holds its lock for the block. Other workers run the
    same saving code (it may run collectives) in an emptied `worker_scratch_dir`, seeded with the chief's
    `backup/` and removed on exit.
    Source: https://www.tensorflow.org/tutorials/distribute/multi_worker_with_keras#model_saving_and_loading

    Args:
        is_chief: whether this task writes the real run directory. Defaults to True.
        task: this task's name (`worker:1`), for the temporary directory. Defaults to `"worker"`.
    """
    if is_chief:
        run_dir.path.mkdir(parents=True, exist_ok=True)
        with locked(run_dir.path):
            _check_unchanged(run_dir, config_yaml)
            create_run_dir(run_dir, config_yaml)
            yield run_dir
        return
    scratch = worker_scratch_dir(run_dir.path, task)
    shutil.rmtree(scratch, ignore_errors=True)  # left by a run of this task that was killed
    scratch.mkdir(parents=True)
    try:
        if run_dir.backup_dir.is_dir():
            shutil.copytree(run_dir.backup_dir, scratch / BACKUP_DIR)
        yield RunDir(scratch, resumed_epochs=run_dir.resumed_epochs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
