"""Typed errors raised by tftrain.

Every error a user can fix by changing their input derives from `ConfigError`
(itself a `ValueError`), so a command-line driver can catch that one class, print
its one-line message and exit with code 2. Messages follow Keras's style: what was
wrong, what was expected, what was received, and how to fix it.
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
    """A device setting cannot apply because TensorFlow's runtime has already started in this
    process (logical CPU devices and visible devices are fixed when it starts).

    Attributes:
        setting: the `RuntimeConfig` field that could not apply (`"cpu_replicas"` or `"device"`).
    """

    def __init__(self, message: str, setting: str = ""):
        super().__init__(message)
        self.setting = setting


class RuntimeStartedWarning(RuntimeWarning):
    """Thread counts were not applied because TensorFlow's runtime had already started
    (`tftrain.runtime.set_threads`); the run goes on with the counts in effect."""


class DataError(ConfigError):
    """A dataset file or folder is missing, corrupt or holds the wrong shapes."""


class RunDirError(ConfigError):
    """A run directory holds files of another run that tftrain will not overwrite."""


class LaunchError(ConfigError):
    """`python -m tftrain.launch` was given bad input (task counts, timeout, command)."""


class ProfilerError(ConfigError):
    """A profile cannot be captured as asked (plugin missing, an invalid window, a window the run never
    reaches, a port): input the user can fix (exit code 2)."""


class ProfileNotWritten(TftrainError, RuntimeError):
    """The profiler ran but wrote no trace file: a run that failed (exit code 1), not bad input."""


class BatchSizeSearchError(ConfigError):
    """The batch-size search found no batch size that fits."""


class TuningError(ConfigError):
    """A hyperparameter search cannot run as configured (e.g. a multi-worker strategy): exit code 2."""


class TuningFailed(TftrainError, RuntimeError):
    """A hyperparameter search ran and finished no trial: a run that failed (exit code 1)."""


class TrainingDiverged(TftrainError, RuntimeError):
    """The training loss became NaN or infinite (`tftrain.callbacks.NanGuard`): a run that
    failed (exit code 1), not bad input. The message names the step and the dtype policy."""


class JobFailed(TftrainError, RuntimeError):
    """A worker or ps task of a parameter-server job learned that the job failed: the chief
    reported a failure, never appeared, or went away without saying how the job ended. A run
    that failed (exit code 1), not bad input."""


class XlaCompileError(TftrainError, RuntimeError):
    """XLA could not compile or run a step of the model (`--execution xla`, or an XLA choice
    that fails now): a run that failed (exit code 1). The message has XLA's own reason and
    the fix (`--execution graph`)."""


class PrecisionError(TftrainError, RuntimeError):
    """The model's training step failed on a dtype under the mixed policy that `--precision auto`
    took where nothing timed it first (a GPU, several replicas, `--deterministic`, an explicit
    `--execution eager` or `xla`): a run that failed (exit code 1).
    The message has the step's error and the fix (`--precision float32`)."""


class Preempted(TftrainError):
    """SIGTERM or SIGUSR1 (a scheduler's preemption or time-limit notice) stopped training after the
    current execution, and a checkpoint of that step was saved: the same command resumes there.
    Exit code 128 + the signal number (143 for SIGTERM, 138 for SIGUSR1).

    Attributes:
        signum: the signal received.
        run_dir: the run directory holding the checkpoint.
    """

    def __init__(self, message: str, signum: int, run_dir: str = ""):
        super().__init__(message)
        self.signum, self.run_dir = signum, run_dir


class AlreadyFinished(TftrainError):
    """A scheduler restarted a job whose run an earlier attempt of the same job had already finished
    (its `metrics.json` is written, with the same configuration): nothing is left to train. `python -m tftrain.run` and the recipes print
    the message and exit 0, so that a SLURM requeue or a `tftrain.launch --max-restarts` restart that
    came as training ended does not fail the job.

    Attributes:
        run_dir: the finished run's directory.
    """

    def __init__(self, message: str, run_dir: str = ""):
        super().__init__(message)
        self.run_dir = run_dir


class CheckpointSpaceError(TftrainError, OSError):
    """The disk holding the run directory has no room for the next checkpoint: a run that failed
    (exit code 1). Raised before anything is written, so the previous checkpoint stays whole; the
    message names the folder, the bytes needed and the bytes free."""


def check_int(value, name: str, *, minimum: int = 1, maximum=None, error: type = ValueError,
              none_ok: bool = False):
    """The one check of an integer argument: `value` itself when it is an `int` (not a `bool`) in
    `[minimum, maximum]` (or None with `none_ok`).

    Args:
        value: what the caller received.
        name: the argument's name in the message (e.g. `"batch_size"` or `"--workers"`).
        minimum: the smallest value allowed. Defaults to 1.
        maximum: the largest value allowed, or None for no bound. Defaults to None.
        error: the exception class raised: `ValueError` for a library argument, a
            `ConfigError` subclass for input the command line reports (exit 2).
            Defaults to `ValueError`.
        none_ok: whether None is allowed (and returned). Defaults to False.

    Returns:
        `value`.

    Raises:
        error: one line, e.g. `batch_size must be an integer >= 1. Received: batch_size=0.`

    Example:
        >>> steps = check_int(steps, "gradient_accumulation_steps", error=ConfigError)
    """
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or \
            (maximum is not None and value > maximum):
        bound = f"in {minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise error(f"{name} must be an integer {bound}{' or None' if none_ok else ''}. Received: {name}={value!r}.")
    return value
