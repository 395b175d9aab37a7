"""Threads: training examples/sec over intra-op / inter-op thread counts.

TensorFlow reads its thread counts once, when its runtime starts, so every grid
point runs in a fresh subprocess (`--point INTRA,INTER`) that sets them first
(`tftrain.runtime.set_threads`) and then times both recipe models in graph mode
at the recipe's batch size. The grid is run in interleaved rounds (all points,
then all points again), each point keeping its best round. 0 means TensorFlow's
default (one thread per core for intra-op).

    python -m benchmarks.threads [--quick] [--batch-size N]
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import common

NAME = "threads"


def _extra(parser):
    parser.add_argument("--batch-size", type=int, default=None, help="global batch size (default: the recipe's)")
    parser.add_argument("--point", default=None,
                        help="(worker) time one grid point INTRA,INTER in this process and write --point-out")
    parser.add_argument("--point-out", type=Path, default=None, help="(worker) JSON file for the point's figures")
    parser.add_argument("--timeout", type=float, default=240, help="seconds allowed per grid point")
    parser.set_defaults(no_device_setup=True)  # the parent only starts subprocesses: keep TensorFlow out


def grid(cores: int, quick: bool) -> list:
    """(intra, inter) points: TensorFlow's default, then 1, cores/2, cores, 2 x cores by 1 and 2."""
    if quick:
        return [(0, 0), (1, 1)]
    intra = sorted({1, max(1, cores // 2), cores, 2 * cores})
    return [(0, 0)] + list(itertools.product(intra, (1, 2)))


def worker(args) -> None:
    """Times one grid point in this process; TensorFlow must not have started yet."""
    intra, inter = (int(x) for x in args.point.split(","))
    from tftrain.runtime import set_threads

    settings = set_threads(intra, inter)  # before any TensorFlow op
    from tftrain.runtime import time_training_steps
    from tftrain.runtime.devices import configure_devices

    configure_devices(args.device if args.device == "cpu" else "auto")
    defaults = common.recipe_defaults()
    batches = common.batch_sizes(args, quick_size=common.default_batch_size("mlp"))
    steps = {"mlp": 1, "cnn": 1} if args.quick else {"mlp": 40, "cnn": 8}
    data = common.mnist_arrays()
    out = {"intra_op": intra, "inter_op": inter, "applied": settings.applied, "models": {}}
    for model_name in common.MODELS:
        ds = common.train_batches(data, batches[model_name], examples=batches[model_name] * 16)
        model = common.compile_model(common.build_model(model_name), "graph", defaults.runtime.steps_per_execution)
        # Graph mode: XLA's CPU code runs on the same intra-op pool, and timing it too would double the
        # grid's run time.
        timing = time_training_steps(model, ds, steps=steps[model_name])
        if args.quick:
            break
        out["models"][model_name] = {"graph": timing.examples_per_sec}
    args.point_out.write_text(json.dumps(out))


def run_point(point, args, tmp: Path) -> dict:
    """Runs one grid point in a subprocess; returns its figures (or an `error`)."""
    intra, inter = point
    out = tmp / f"point-{intra}-{inter}.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "benchmarks.threads", "--point", f"{intra},{inter}", "--point-out", str(out),
           "--device", args.device]
    if args.quick:
        cmd.append("--quick")
    if args.batch_size:
        cmd += ["--batch-size", str(args.batch_size)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout,
                              cwd=Path(__file__).resolve().parents[1])
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout:.0f} s"}
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit code {proc.returncode}: {tail[0]}"}
    return json.loads(out.read_text())


def run(args, device) -> common.Result:
    """Runs the grid in subprocesses, in interleaved rounds."""
    cores = common.cpu_cores()
    points = grid(cores, args.quick)
    rounds = 1 if args.quick else 2
    batches = common.batch_sizes(args, quick_size=common.default_batch_size("mlp"))
    results = {p: [] for p in points}
    with tempfile.TemporaryDirectory(prefix="tftrain-threads-") as tmp:
        for r in range(rounds):
            for p in points:
                figures = run_point(p, args, Path(tmp))
                results[p].append(figures)
                print(f"round {r + 1}, intra {p[0]}, inter {p[1]}: "
                      + (figures.get("error") or json.dumps(figures["models"])), flush=True)

    rows, table_points, errors = [], [], []
    modes_seen = set()
    for (intra, inter), runs in results.items():
        good = [x for x in runs if "error" not in x]
        errors += [f"intra {intra}, inter {inter}: {x['error']}" for x in runs if "error" in x]
        if not good:
            continue
        best = {}
        for model_name in good[0]["models"]:  # quick: the MLP only
            for mode in good[0]["models"][model_name]:
                modes_seen.add(mode)
                best[(model_name, mode)] = max(x["models"][model_name][mode] for x in good)
        table_points.append({"intra_op": intra, "inter_op": inter,
                             "examples_per_sec": {f"{m}/{mode}": v for (m, mode), v in best.items()}})
        table_points[-1]["models"] = sorted({m for m, _ in best})
    modes = sorted(modes_seen)
    models = [m for m in common.MODELS if any(m in p["models"] for p in table_points)]
    for p in table_points:
        rows.append([p["intra_op"] or "default", p["inter_op"] or "default"]
                    + [common.fmt(p["examples_per_sec"].get(f"{m}/{mode}")) for m in models for mode in modes])
    best_point = {}
    for m in models:
        candidates = [(max(p["examples_per_sec"].get(f"{m}/{mode}", 0) for mode in modes), p)
                      for p in table_points]
        if candidates:
            value, p = max(candidates, key=lambda c: c[0])
            best_point[m] = {"intra_op": p["intra_op"], "inter_op": p["inter_op"], "examples_per_sec": value}
    default = next((p for p in table_points if p["intra_op"] == 0 and p["inter_op"] == 0), None)
    summary = {"cores": cores, "batch_sizes": batches, "best": best_point,
               "default_examples_per_sec": default["examples_per_sec"] if default else None,
               "failed_points": len(errors)}

    def plot(fig):
        axes = fig.subplots(1, max(1, len(models)), squeeze=False)[0]
        for ax, model_name in zip(axes, models):
            labels = [f"{p['intra_op'] or 'dflt'}/{p['inter_op'] or 'dflt'}" for p in table_points]
            width = 0.8 / max(1, len(modes))
            for i, mode in enumerate(modes):
                ys = [p["examples_per_sec"].get(f"{model_name}/{mode}", 0) for p in table_points]
                ax.bar([x + (i - (len(modes) - 1) / 2) * width for x in range(len(labels))], ys, width=width,
                       label=mode)
            ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=45)
            ax.set_xlabel("intra-op / inter-op threads", fontsize=8)
            ax.set_ylabel("examples/sec")
            ax.set_title(f"{model_name}, batch {batches[model_name]}", fontsize=9)
            ax.legend(fontsize=7)

    notes = [f"{cores} core(s) available; each point is a fresh process (thread counts are fixed at TensorFlow "
             f"start-up); best of {rounds} interleaved round(s)."]
    notes += [f"FAILED: {e}" for e in errors]
    return common.Result(
        name=NAME,
        title=f"Threads: examples/sec by intra-op / inter-op threads ({common.describe_batches(batches)})",
        headers=["intra-op", "inter-op"] + [f"{m} {mode} ex/s" for m in models for mode in modes],
        rows=rows,
        data={"points": table_points, "raw": {f"{k[0]},{k[1]}": v for k, v in results.items()}},
        summary=summary,
        notes=notes,
        plot=plot,
    )


def main(argv=None) -> int:
    """`python -m benchmarks.threads [--quick] [--batch-size N]`; `--point` is the worker mode."""
    return common.main_with_worker(NAME, __doc__.splitlines()[0], run, worker, "point", argv, extra=_extra)


if __name__ == "__main__":
    raise SystemExit(main())
