"""TensorFlow's ring all-reduce between local CPU-only processes on 127.0.0.1 (a CPU multi-worker job's path), timed.

`fit_ring` fits `t = a + b * bytes_sent`, bytes_sent = 2(N-1)/N x size (ring traffic: Patarasuk & Yuan 2009).

    python -m tftrain.doctor.allreduce --sizes 262144,2678824 --iterations 10   # one worker (under the launcher)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import statistics
import sys
import time
from typing import Optional, Sequence

MNIST_MLP_GRADIENT_BYTES = 2_678_824
"""Bytes of the MNIST MLP's float32 gradients (669,706 parameters)."""

SIZES = (4_096, 262_144, MNIST_MLP_GRADIENT_BYTES, 16_777_216)
"""Bytes per all-reduce in `benchmarks/loopback_allreduce.py`."""

_ROW = re.compile(r"^\[worker:0\] (\{.*\})$", re.M)


def worker(sizes: Sequence[int], iterations: int, warmup: int = 3) -> None:
    """One worker (under `tftrain.launch`): times all-reduces of each size (bytes) after `warmup` (default 3);
    worker 0 prints a JSON line per size: `{"bytes": size, "median_s": seconds}`."""
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

    for size in sizes:
        x = tf.ones([size // 4], tf.float32)
        for _ in range(warmup):
            step(x).numpy()
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            step(x).numpy()
            times.append(time.perf_counter() - start)
        if is_chief:
            print(json.dumps({"bytes": size, "median_s": statistics.median(times)}), flush=True)


def loopback_allreduce(workers: int = 2, sizes: Sequence[int] = SIZES, iterations: int = 30,
                       timeout_s: float = 600.0, warmup: int = 3) -> list:
    """Runs a ring all-reduce job of `workers` (>= 2) local processes; all are stopped before it returns.

    Args:
        sizes: bytes per all-reduce. Defaults to `SIZES`.
        iterations: timed all-reduces per size. Defaults to 30.
        timeout_s: seconds the whole job may run. Defaults to 600.

    Returns:
        `[{"bytes": int, "median_s": float}, ...]`, one per size, in order.

    Raises:
        RuntimeError: when the job fails or times out (with the workers' last stderr lines).
        KeyboardInterrupt: on Ctrl-C, after the workers are stopped; SIGTERM and SIGHUP are raised again in this
            process once they are.
    """
    from tftrain.launch import launch

    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("SLURM_")}
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"})
    out, err = io.StringIO(), io.StringIO()
    command = [sys.executable, "-m", "tftrain.doctor.allreduce", "--sizes", ",".join(map(str, sizes)),
               "--iterations", str(iterations), "--warmup", str(warmup)]
    code = launch(command, workers, timeout=timeout_s, grace_s=2.0, env=env, out=out, err=err)
    if code == 128 + signal.SIGINT:  # Ctrl-C: the launcher stopped the workers; stop the caller too
        raise KeyboardInterrupt
    if code in (128 + signal.SIGTERM, 128 + signal.SIGHUP):  # the launcher took the caller's stop signal: given back
        signal.raise_signal(code - 128)
    rows = [json.loads(m) for m in _ROW.findall(out.getvalue())]
    if code != 0 or len(rows) != len(sizes):
        tail = " | ".join(err.getvalue().strip().splitlines()[-3:])
        raise RuntimeError(f"the all-reduce job exited with code {code}: {tail}")
    return rows


def fit_ring(rows: Sequence[dict], workers: int) -> dict:
    """Fits `t = a + b * bytes_sent` to `loopback_allreduce` rows (least squares).

    Returns:
        `{"fixed_s": a, "bytes_per_s": 1/b, "rows": [...]}`, rows with `bytes_sent` and `bytes_per_s`. With one
        size or a non-positive slope, `fixed_s` is None and `bytes_per_s` the largest size's figure.
    """
    out = []
    for r in rows:
        sent = 2 * (workers - 1) / workers * r["bytes"]
        out.append({**r, "bytes_sent": sent, "bytes_per_s": sent / r["median_s"]})
    largest = max(out, key=lambda r: r["bytes"])
    if len({r["bytes"] for r in out}) < 2:  # one size: no line to fit
        return {"fixed_s": None, "bytes_per_s": largest["bytes_per_s"], "rows": out}
    xs, ts = [r["bytes_sent"] for r in out], [r["median_s"] for r in out]
    mean_x, mean_t = statistics.fmean(xs), statistics.fmean(ts)
    slope = sum((x - mean_x) * (t - mean_t) for x, t in zip(xs, ts)) / sum((x - mean_x) ** 2 for x in xs)
    if slope <= 0:
        return {"fixed_s": None, "bytes_per_s": largest["bytes_per_s"], "rows": out}
    return {"fixed_s": max(0.0, mean_t - slope * mean_x), "bytes_per_s": 1 / slope, "rows": out}


def main(argv: Optional[Sequence[str]] = None) -> None:
    """One worker of the job, from the command line."""
    parser = argparse.ArgumentParser(prog="python -m tftrain.doctor.allreduce", allow_abbrev=False,
                                     description="One worker of the loopback all-reduce job (run by tftrain.launch).")
    parser.add_argument("--sizes", required=True, help="bytes per all-reduce, comma-separated")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    worker([int(s) for s in args.sizes.split(",")], args.iterations, args.warmup)


if __name__ == "__main__":
    main()
