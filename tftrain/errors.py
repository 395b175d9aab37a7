"""Typed errors raised by tftrain.

Every error a user can fix by changing their input derives from `ConfigError` (a `ValueError`), so a
command-line driver catches that one class, prints its one-line message and exits 2.
"""


class TftrainError(Exception):
    """Base class of every error tftrain raises on purpose."""


class ConfigError(TftrainError, ValueError):
    """A configuration value is invalid (bad name, non-positive size, ...)."""


class ClusterConfigError(ConfigError):
    """TF_CONFIG or the SLURM environment does not describe a valid cluster."""


class DeviceError(ConfigError):
    """The requested devices do not exist or can no longer be configured."""


class RuntimeStartedError(DeviceError):
    """A device setting cannot apply: TensorFlow's runtime has already started in this process.

    Attributes:
        setting: the `RuntimeConfig` field refused (`"cpu_replicas"` or `"device"`).
    """

    def __init__(self, message: str, setting: str = ""):
        super().__init__(message)
        self.setting = setting


class RuntimeStartedWarning(RuntimeWarning):
    """Thread counts were not applied: TensorFlow's runtime had started; the run goes on with those in effect."""


class DataError(ConfigError):
    """A dataset file or folder is missing, corrupt or holds the wrong shapes."""


class RunDirError(ConfigError):
    """A run directory holds files of another run that tftrain will not overwrite."""


class LaunchError(ConfigError):
    """`python -m tftrain.launch` was given bad input (task counts, timeout, command)."""


class ProfilerError(ConfigError):
    """A profile cannot be captured as asked (plugin missing, a bad or unreached window, a port): exit 2."""


class ProfileNotWritten(TftrainError, RuntimeError):
    """The profiler ran but wrote no trace file: a failed run (exit 1)."""


class BatchSizeSearchError(ConfigError):
    """The batch-size search found no batch size that fits."""


class TuningError(ConfigError):
    """A hyperparameter search cannot run as configured (e.g. a multi-worker strategy): exit code 2."""


class TuningFailed(TftrainError, RuntimeError):
    """A hyperparameter search ran and finished no trial: a run that failed (exit code 1)."""


class TrainingDiverged(TftrainError, RuntimeError):
    """The training loss became NaN or infinite (`tftrain.callbacks.NanGuard`): a failed run (exit 1);
    the message names the step and the dtype policy."""


class JobFailed(TftrainError, RuntimeError):
    """A worker or ps task learned that its parameter-server job failed (the chief reported a failure,
    never appeared, or left without saying how the job ended): a failed run (exit 1)."""


class XlaCompileError(TftrainError, RuntimeError):
    """XLA could not compile or run a step of the model: a failed run (exit 1); the message has XLA's
    reason and the fix (`--execution graph`)."""


class PrecisionError(TftrainError, RuntimeError):
    """A step failed on a dtype under the mixed policy `--precision auto` chose without timing it: a failed
    run (exit 1); the message has the step's error and the fix (`--precision float32`)."""


class Preempted(TftrainError):
    """SIGTERM or SIGUSR1 (`signum`) stopped training after the current execution, whose checkpoint was
    saved in `run_dir`: the same command resumes there. Exit code 128 + the signal number."""

    def __init__(self, message: str, signum: int, run_dir: str = ""):
        super().__init__(message)
        self.signum, self.run_dir = signum, run_dir


class AlreadyFinished(TftrainError):
    """A scheduler restarted a job whose run (`run_dir`) an earlier attempt had finished with the same
    config: the commands print the message and exit 0, so that a restart that came as training ended does
    not fail the job."""

    def __init__(self, message: str, run_dir: str = ""):
        super().__init__(message)
        self.run_dir = run_dir


class CheckpointSpaceError(TftrainError, OSError):
    """No room on the run directory's disk for the next checkpoint: a failed run (exit 1), raised before
    anything is written; the message names the folder, the bytes needed and the bytes free."""


def check_int(value, name: str, *, minimum: int = 1, maximum=None, error: type = ValueError,
              none_ok: bool = False):
    """The one check of an integer argument: returns `value` when it is an `int` (not a `bool`) in
    `[minimum, maximum]`, or None with `none_ok`.

    Args:
        name: the argument's name in the message (`"batch_size"`, `"--workers"`).
        minimum, maximum: the bounds; `maximum` None for none. Default to 1 and None.
        error: the exception class raised: `ValueError` for a library argument, a `ConfigError` subclass
            for command-line input (exit 2). Defaults to `ValueError`.
        none_ok: whether None is allowed. Defaults to False.

    Raises:
        error: one line, e.g. `batch_size must be an integer >= 1. Received: batch_size=0.`
    """
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or \
            (maximum is not None and value > maximum):
        bound = f"in {minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise error(f"{name} must be an integer {bound}{' or None' if none_ok else ''}. Received: {name}={value!r}.")
    return value
