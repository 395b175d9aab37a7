"""Typed errors raised by tftrain. Every error a user fixes by changing their input is a `ConfigError` (a
`ValueError`), so a command-line driver catches that one class, prints its one-line message and exits 2; and the
one-line forms of any error (`one_line`, `cause_line`)."""

import re


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
        setting: the `RuntimeConfig` field refused (`"cpu_replicas"`, `"device"` or `"strategy"`).
    """

    def __init__(self, message: str, setting: str = ""):
        super().__init__(message)
        self.setting = setting


class RuntimeStartedWarning(RuntimeWarning):
    """Thread counts were not applied (TensorFlow had started); the run goes on with those in effect."""


class DataError(ConfigError):
    """A dataset file or folder is missing, corrupt or holds the wrong shapes."""


class RunDirError(ConfigError):
    """A run directory holds files of another run that tftrain will not overwrite."""


class LaunchError(ConfigError):
    """`python -m tftrain.launch` was given bad input (task counts, timeout, command)."""


class ProfilerError(ConfigError):
    """A profile cannot be captured as asked (plugin missing, bad or unreached window, port): exit 2."""


class ProfileNotWritten(TftrainError, RuntimeError):
    """The profiler ran but wrote no trace file: a failed run (exit 1)."""


class BatchSizeSearchError(ConfigError):
    """The batch-size search found no batch size that fits."""


class TuningError(ConfigError):
    """A hyperparameter search cannot run as configured (e.g. a multi-worker strategy): exit 2."""


class TuningFailed(TftrainError, RuntimeError):
    """A hyperparameter search ran and finished no trial: a failed run (exit 1)."""


class TrainingDiverged(TftrainError, RuntimeError):
    """The loss became NaN or infinite (`callbacks.NanGuard`): exit 1; the message names step and dtype policy."""


class JobFailed(TftrainError, RuntimeError):
    """A worker or ps task's job failed (the chief said so, never appeared, or left without a word): exit 1."""


class XlaCompileError(TftrainError, RuntimeError):
    """XLA could not compile or run a model step: exit 1; the message has XLA's reason and `--execution graph`."""


class PrecisionError(TftrainError, RuntimeError):
    """A step failed on a dtype under `--precision auto`'s untimed mixed policy: exit 1; fix: `--precision float32`."""


class Preempted(TftrainError):
    """SIGTERM or SIGUSR1 (`signum`) stopped training after a checkpoint in `run_dir` (rerun resumes): exit 128 + N."""

    def __init__(self, message: str, signum: int, run_dir: str = ""):
        super().__init__(message)
        self.signum, self.run_dir = signum, run_dir


class AlreadyFinished(TftrainError):
    """A scheduler restarted a job whose run (`run_dir`) an earlier attempt finished with the same config:
    exit 0 with the message, so a restart as training ended does not fail the job."""

    def __init__(self, message: str, run_dir: str = ""):
        super().__init__(message)
        self.run_dir = run_dir


class CheckpointSpaceError(TftrainError, OSError):
    """No room on the run directory's disk for the next checkpoint (raised before writing): exit 1."""


def check_int(value, name: str, *, minimum: int = 1, maximum=None, error: type = ValueError,
              none_ok: bool = False):
    """Returns `value` if it is an `int` (not a `bool`) in `[minimum, maximum]`, or None with `none_ok`.

    Args:
        name: the argument's name in the message (`"batch_size"`, `"--workers"`).
        minimum, maximum: the bounds (`maximum` None: no bound). Default to 1 and None.
        error: the class raised: `ValueError` (default) for library arguments, a `ConfigError` for CLI input.
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


KERAS_WRAPPER_LINES = ("Exception encountered when calling", "Arguments received by", "•")
"""How the lines Keras wraps a layer's error in start (not its cause)."""


def _readable(error: BaseException) -> str:
    """`str(error)` without colour codes, and for a TensorFlow op's error its cause: past a graph's trace ("Graph
    execution error: Detected at node ... File ...") and without `{{function_node ...}}` and `[[{{node ...}}]]`
    names; a `tf.data` function's error names its transformation, not the iterator's chain."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    if text.startswith("Graph execution error"):
        lines = text.splitlines()
        trace = [i for i, line in enumerate(lines) if re.match(r'\s+File "', line)]
        after = lines[trace[-1] + 1 if trace else 1:]
        roots = [m.group(1) for line in after if (m := re.match(r"\s*\(\d+\) [A-Z_]+:\s+(.*)", line))]
        after = roots[:1] or [line for line in after if line.strip() and not line[0].isspace()]  # N root errors:
        text = "\n".join(after) or text  # the first (each replica's own)
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
    text = re.sub(r"^\s*\[\[\{\{node .*$", "", text, flags=re.M)
    return re.sub(r"Error in user-defined function passed to (\w+?)(:\d+)? transformation with iterator: "
                  r"Iterator::\S+?: ", r"the input pipeline's function (in \1) failed: ", text)


def one_line(error: BaseException) -> str:
    """`Type: first line` of an error (with the next line when the first ends in a colon), past the lines Keras
    wraps a layer's error in (`KERAS_WRAPPER_LINES`) and its colour codes (`_readable`)."""
    if isinstance(error, SyntaxError) and error.msg:  # its str() repeats the file and line `line_of` names
        return f"{type(error).__name__}: {error.msg}"
    text = _readable(error)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(KERAS_WRAPPER_LINES)] or lines
    if not lines:
        return type(error).__name__
    text = f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return f"{type(error).__name__}: {text.rstrip('.:')}"


def cause_line(error: BaseException) -> str:
    """`Type: cause` of `error` (at most 300 characters): the first line after Keras's "Exception encountered
    when calling" header, colour codes removed (`_readable`)."""
    text = _readable(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines and lines[0] == "in user code:":  # traced: the error's own line closes the trace
        raised = [line for line in lines if re.match(r"[A-Z]\w*(Error|Exception): ", line)]
        if raised:
            return words_within(raised[-1], 300)
    cause = [line for line in lines if not line.startswith(KERAS_WRAPPER_LINES)]
    return words_within(f"{type(error).__name__}: {(cause or lines or [''])[0]}", 300)


def words_within(text: str, most: int) -> str:
    """`text`, or its whole words within `most` characters followed by ` ...`."""
    return text if len(text) <= most else text[:most - 4].rsplit(" ", 1)[0] + " ..."


class Terminated(KeyboardInterrupt):
    """SIGTERM to a tool's command (`tftrain.export`, the doctor), raised where Ctrl-C would be
    (`sigterm_as_interrupt`): the same one line, exit 143."""


def sigterm_as_interrupt():
    """Makes SIGTERM raise `Terminated` in the main thread, so a command ends as on Ctrl-C, in its one line;
    returns the handler it replaced."""
    import signal

    def _raise(signum, frame):
        raise Terminated()

    return signal.signal(signal.SIGTERM, _raise)


def interrupted(error: KeyboardInterrupt) -> tuple:
    """`(words, exit code)` for a Ctrl-C or a `Terminated`: ("interrupted", 130) or ("stopped by SIGTERM", 143)."""
    return ("stopped by SIGTERM", 143) if isinstance(error, Terminated) else ("interrupted", 130)
