"""Exit codes of the README's main job run many times: a run that succeeded exits 0 every time.

Runs `python -m tftrain.recipes.mnist --strategy mirrored` (the README's main job, each run in a new
run directory) `--runs` times one after another and counts the exit codes, and the runs whose
output has an abort at exit ("terminate called", "FATAL: exception not rethrown").
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common

NAME = "exit_codes"
ABORT_LINES = ("terminate called", "FATAL: exception not rethrown")


def run(args, device) -> common.Result:
    runs = 3 if args.quick else args.runs
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("SLURM_")}
    records = []
    with tempfile.TemporaryDirectory(prefix="exit-codes-") as tmp:
        for i in range(runs):
            command = [sys.executable, "-m", "tftrain.recipes.mnist", "--strategy", "mirrored",
                       "--run-dir", str(Path(tmp) / f"run-{i}"), *(["--epochs", "1"] if args.quick else [])]
            started = time.perf_counter()
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
            output = done.stdout + done.stderr
            records.append({"run": i, "exit_code": done.returncode, "seconds": round(time.perf_counter() - started, 1),
                            "aborted": any(line in output for line in ABORT_LINES),
                            "tail": output.strip().splitlines()[-1:] if done.returncode else []})
            print(records[-1], flush=True)
    codes = collections.Counter(r["exit_code"] for r in records)
    aborted = sum(r["aborted"] for r in records)
    rows = [[code, count] for code, count in sorted(codes.items())]
    return common.Result(
        name=NAME, title=f"Exit codes of {runs} main jobs: {codes.get(0, 0)} exited 0, {aborted} aborted at exit",
        headers=["exit code", "runs"], rows=rows, data={"records": records},
        summary={"runs": runs, "exit_0": codes.get(0, 0), "aborted": aborted},
        notes=["`python -m tftrain.recipes.mnist --strategy mirrored`, each in a new --run-dir, one after another"
               + (" (--quick: 1 epoch)" if args.quick else "") + "."])


def main(argv=None) -> int:
    """`python -m benchmarks.exit_codes [--quick] [--runs N]`."""
    def extra(parser):
        parser.add_argument("--runs", type=int, default=50, help="main jobs to run")
        parser.set_defaults(no_device_setup=True)

    return common.main_for(NAME, __doc__.splitlines()[0], run, argv, extra)


if __name__ == "__main__":
    sys.exit(main())
