"""Times TensorFlow's ring all-reduce between local workers on 127.0.0.1.

    python benchmarks/loopback_allreduce.py                 # 2 workers
    python benchmarks/loopback_allreduce.py --workers 4

Starts N tasks with `python -m tftrain.launch`; each builds a
`MultiWorkerMirroredStrategy` (`CommunicationImplementation.RING`, gRPC) and all-reduces
float32 tensors of several sizes, including the 2.68 MB of gradients of the MNIST
MLP (669,706 parameters). Worker 0 prints the median time per all-reduce; the driver
fits `t = a + b * bytes_sent` with bytes_sent = 2(N-1)/N x size, the per-worker
traffic of a ring (benchmarks/allreduce_model.py), and prints a (fixed cost per
all-reduce, s) and 1/b (effective bandwidth, bytes/s). On a shared machine, repeat and
compare.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

SIZES = (4_096, 262_144, 2_678_824, 16_777_216)
"""Bytes per all-reduce; 2,678,824 = the MNIST MLP's float32 gradients."""


def task(iterations: int) -> None:
    """One worker: time all-reduces of every size; worker 0 prints JSON lines."""
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    is_chief = json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0

    @tf.function
    def step(x):
        per_replica = strategy.run(lambda v: v * 1.0, args=(x,))
        return tf.reduce_sum(strategy.reduce("SUM", per_replica, axis=None)[:1])

    for size in SIZES:
        x = tf.ones([size // 4], tf.float32)
        for _ in range(3):  # warm-up: tracing, connection set-up
            step(x).numpy()
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            step(x).numpy()
            times.append(time.perf_counter() - start)
        if is_chief:
            print(json.dumps({"bytes": size, "median_s": statistics.median(times)}), flush=True)


def main(argv=None) -> None:
    """Drives the launcher and prints the table and the fit."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--task", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.task:
        task(args.iterations)
        return
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("SLURM_")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    result = subprocess.run(
        [sys.executable, "-m", "tftrain.launch", "--workers", str(args.workers), "--timeout", "600", "--",
         sys.executable, os.path.abspath(__file__), "--task", "--iterations", str(args.iterations)],
        env=env, capture_output=True, text=True, timeout=660,
    )
    if result.returncode != 0:
        raise SystemExit(f"launch failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    rows = [json.loads(m) for m in re.findall(r"^\[worker:0\] (\{.*\})$", result.stdout, re.M)]
    n = args.workers
    sent = [2 * (n - 1) / n * r["bytes"] for r in rows]
    times = [r["median_s"] for r in rows]
    mean_x, mean_t = statistics.fmean(sent), statistics.fmean(times)
    slope = sum((x - mean_x) * (t - mean_t) for x, t in zip(sent, times)) / sum((x - mean_x) ** 2 for x in sent)
    intercept = mean_t - slope * mean_x
    print(f"Ring all-reduce on 127.0.0.1, {n} workers, {os.cpu_count()} CPU cores (median of {args.iterations})\n")
    print("| tensor bytes | bytes sent per worker | ms per all-reduce | effective MB/s |")
    print("|---|---|---|---|")
    for r, x in zip(rows, sent):
        print(f"| {r['bytes']:,} | {x:,.0f} | {r['median_s'] * 1e3:.2f} | {x / r['median_s'] / 1e6:,.0f} |")
    print(f"\nfit: fixed cost a = {intercept * 1e3:.2f} ms per all-reduce, bandwidth 1/b = {1 / slope / 1e6:,.0f} MB/s")


if __name__ == "__main__":
    main()
