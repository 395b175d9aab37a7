"""Measures MNIST training throughput for 1 process and several local workers.

Runs the MNIST recipe once per configuration through `python -m tftrain.launch` on
127.0.0.1 and prints a markdown table (docs/scaling.md):

    python benchmarks/multi_worker_throughput.py                     # 1 process, 1/2/4 MWMS workers, PS
    python benchmarks/multi_worker_throughput.py --workers 1 2 --no-ps --train-examples 8192

Two figures per run, both in training examples/sec (all workers together):
`fit` is what the recipe reports (examples trained / `fit()` time, so it includes
tracing and the first epoch's warm-up); `last epoch` is the global batch divided by
the step time Keras prints for the last epoch (steady state). On a machine shared
with other jobs, run it more than once and compare the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEP_TIME = re.compile(r"^(?:\[(?:worker:0|chief:0)\] )?\d+/\d+ - [\d.]+m?s - ([\d.]+)(ms|s)/step", re.M)


def run(config: str, launch_args, recipe_args, root: Path, timeout_s: float) -> dict:
    """Runs one configuration; returns its row."""
    run_dir = root / config.replace(" ", "_").replace("+", "")
    cmd = [sys.executable, "-m", "tftrain.recipes.mnist", *recipe_args, "--run-dir", str(run_dir)]
    if launch_args:
        cmd = [sys.executable, "-m", "tftrain.launch", *launch_args, "--timeout", str(timeout_s), "--", *cmd]
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("SLURM_")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    started = time.perf_counter()
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s + 60)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{config} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    steps = STEP_TIME.findall(result.stdout)
    value, unit = steps[-1]
    step_s = float(value) / (1000 if unit == "ms" else 1)
    return {
        "config": config,
        "processes": metrics["workers"] + metrics["ps_tasks"] + (1 if metrics["strategy"] == "parameter_server" else 0),
        "replicas": metrics["replicas"],
        "fit": metrics["examples_per_sec"],
        "last_epoch": metrics["global_batch_size"] / step_s,
        "accuracy": metrics["test_accuracy"],
        "wall": wall,
    }


def main(argv=None) -> None:
    """Runs the configurations and prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4],
                        help="MultiWorkerMirrored worker counts (default: 1 2 4)")
    parser.add_argument("--ps", action=argparse.BooleanOptionalAction, default=True,
                        help="also run chief + 2 workers + 1 ps (default: on)")
    parser.add_argument("--train-examples", type=int, default=16384)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128, help="global batch size")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
    args = parser.parse_args(argv)
    common = ["--train-examples", str(args.train_examples), "--epochs", str(args.epochs), "--verbose", "2",
              "--seed", "0", "--batch-size", str(args.batch_size)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="tftrain-bench-") as tmp:
        root = Path(tmp)
        rows.append(run("1 process", None, common, root, args.timeout))
        for n in args.workers:
            rows.append(run(f"MWMS {n} worker(s)", ["--workers", str(n)],
                            ["--strategy", "multi_worker_mirrored", "--communication", "ring", *common],
                            root, args.timeout))
        if args.ps:
            rows.append(run("chief + 2 workers + 1 ps", ["--chief", "--workers", "2", "--ps", "1"],
                            ["--strategy", "parameter_server", *common], root, args.timeout))
    base = rows[0]["last_epoch"]
    print(f"MNIST MLP, {args.train_examples} examples x {args.epochs} epochs, global batch {args.batch_size}, "
          f"{os.cpu_count()} CPU cores\n")
    print("| configuration | processes | replicas | examples/sec (fit) | examples/sec (last epoch) | "
          "vs 1 process | test accuracy | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['processes']} | {r['replicas']} | {r['fit']:,.0f} | {r['last_epoch']:,.0f} | "
              f"{r['last_epoch'] / base:.2f}x | {r['accuracy']:.4f} | {r['wall']:.0f} |")


if __name__ == "__main__":
    main()
