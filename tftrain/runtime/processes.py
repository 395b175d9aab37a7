"""Process plumbing of the local launcher (`tftrain.launch`): exit codes, parent-death signals,
prefixed output and process-group signals. No TensorFlow."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from typing import TextIO

def exit_code(returncode: int) -> int:
    """Popen's negative return code for signal N -> 128 + N (the shell's convention)."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    """E.g. `exited with code 1`, `was killed by SIGKILL (exit code 137)`."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name} (exit code {128 - returncode})"
    return f"exited with code {returncode}"


def parent_death_signal():
    """A `preexec_fn` that asks Linux to SIGKILL the child when the launcher dies."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    pr_set_pdeathsig = 1

    def preexec():  # runs in the child between fork and exec
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)

    return preexec


class TaskOutput:
    """Serialises prefixed lines from the tasks' reader threads onto the streams."""

    def __init__(self, out: TextIO, err: TextIO):
        self.out, self.err = out, err
        self.lock = threading.Lock()

    def write(self, stream: TextIO, text: str) -> None:
        with self.lock:
            stream.write(text)
            stream.flush()

    def say(self, message: str) -> None:
        """A launcher message, on stderr."""
        self.write(self.err, f"tftrain.launch: {message}\n")


def pump_lines(pipe, stream: TextIO, prefix: str, output: TaskOutput, task) -> None:
    """Copies `pipe`'s lines (bytes, UTF-8) to `stream` through `output`, each prefixed; sets
    `task.last_output` (monotonic seconds) at each line; closes `pipe` at its end."""
    for raw in iter(pipe.readline, b""):
        task.last_output = time.monotonic()
        line = raw.decode("utf-8", errors="replace")
        output.write(stream, prefix + (line if line.endswith("\n") else line + "\n"))
    pipe.close()


def group_alive(pgid: int) -> bool:
    """Whether any process of the process group `pgid` is alive (one we may not signal counts)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, signum: int) -> None:
    """Sends `signum` to the process group `pgid`; a group that is gone (or not ours) is skipped."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass
