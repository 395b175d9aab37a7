"""Runs the benchmark suite: every benchmark in its own process, back to back.

    python -m benchmarks            # the CPU suite, full sizes (about 50 min on 2 quiet cores)
    python -m benchmarks --quick    # tiny sizes: checks the machinery (a few minutes)
    python -m benchmarks --gpu      # the GPU suite (about 10 min on one GPU machine)
    python -m benchmarks --only roofline,threads
    python -m benchmarks --quick --jobs 2   # two benchmarks at once (quick only)
    python -m benchmarks --summary-only     # rebuild the summary from the results files

Each benchmark writes `<out>/<name>.json`, `.md` and `.png` (the GPU suite
`gpu-<name>.*`); the runner adds `<out>/summary.md` and `summary.json`: every
table, and the headline figures against the targets. Exit code 1 when a benchmark
failed (its error is in the summary), else 0.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common

CPU_SUITE = ("recipe_defaults", "flagship", "time_to_accuracy", "roofline", "execution", "zoo", "input_pipeline", "image_folder_input",
             "threads", "precision")
"""Benchmarks of the CPU suite, in running order."""

GPU_SUITE = ("time_to_accuracy", "roofline", "execution", "input_pipeline", "precision", "mirrored")
"""Benchmarks of the GPU suite (thread counts do not bound GPU training: no `threads`)."""

EXPECTED_MINUTES = {
    # Full sizes on a quiet 2-core CPU, and on one GPU machine; --quick: seconds each.
    "cpu": {"recipe_defaults": 7, "flagship": 3, "time_to_accuracy": 9, "roofline": 2.5, "execution": 2.5, "zoo": 60, "input_pipeline": 3,
            "image_folder_input": 2, "threads": 3, "precision": 2.5},
    "gpu": {"time_to_accuracy": 4, "roofline": 1.5, "execution": 1.5, "input_pipeline": 1, "precision": 1,
            "mirrored": 0.5},
}
"""Expected minutes per benchmark (printed before a run; the timeouts are 3x these)."""


GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")
"""NVIDIA's driver, ROCm's and WSL2's GPU device nodes: on Linux, without one TensorFlow sees no GPU."""


def gpu_count() -> int:
    """GPUs TensorFlow sees, asked in a subprocess (this process stays TensorFlow-free); 0 without
    asking on a Linux machine that has none of `GPU_DEVICE_NODES`."""
    if sys.platform.startswith("linux") and not any(os.path.exists(node) for node in GPU_DEVICE_NODES):
        return 0
    code = "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
        return int(out.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        return 0


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the machinery")
    parser.add_argument("--gpu", action="store_true",
                        help="the GPU suite (gpu-*.json); without a GPU it says so and runs --quick on the CPU")
    parser.add_argument("--only", default=None, help="comma-separated benchmark names")
    parser.add_argument("--jobs", type=int, default=1,
                        help="with --quick: run N benchmarks at once (their figures then contend for the cores, "
                             "which quick figures may; full-size runs are always one at a time)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: benchmarks/results/, --quick: benchmarks/results/quick/)")
    parser.add_argument("--summary-only", action="store_true",
                        help="run nothing: rebuild summary.md and summary.json from the results files in --out "
                             "(after a benchmark was run on its own, e.g. python -m benchmarks.zoo)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1. Received: --jobs {args.jobs}.")
    if args.jobs > 1 and not args.quick:
        parser.error("--jobs runs benchmarks at once, so their figures contend for the cores: it is for --quick "
                     "only. Drop --jobs for a full-size run.")
    return args


def headline(summaries: dict, quick: bool = False) -> list:
    """Rows `[figure, measured, target, met]` for the suite's targets; at `--quick`
    sizes the `met` column reads "n/a (quick)", since those figures mean nothing."""
    rows = _headline(summaries)
    if quick:
        rows = [row[:3] + ["n/a (quick)" if row[3] else ""] for row in rows]
    return rows


def _headline(summaries: dict) -> list:
    rows = []
    tta = summaries.get("time_to_accuracy", {}).get("models", {})
    for model_name, figures in tta.items():
        speedup = figures.get("speedup_of_mean_times")
        target = "≥ 4x" if model_name == "mlp" else "-"
        met = "" if speedup is None or model_name != "mlp" else ("yes" if speedup >= 4 else "no")
        rows.append([f"time to {figures['target']:.1%} ({model_name}): plain Keras / tftrain",
                     "not reached" if speedup is None else f"{speedup:.2f}x", target, met])
    roof = summaries.get("roofline", {})
    for model_name, best in roof.get("best", {}).items():
        fraction = best["fraction_of_peak"]
        target = "≥ 50%" if model_name == "mlp" else "-"
        met = ("yes" if fraction >= 0.5 else "no") if model_name == "mlp" else ""
        rows.append([f"{model_name} best fraction of matmul peak ({roof['peak_gflops']:.0f} GFLOP/s)",
                     f"{fraction:.0%} at batch {best['batch_size']} ({best['mode']})", target, met])
    waits = summaries.get("input_pipeline", {}).get("input_wait_fraction_recipe_defaults", {})
    for model_name, wait in waits.items():
        rows.append([f"input wait, recipe defaults ({model_name})", f"{wait:.1%}", "< 5%",
                     "yes" if wait < 0.05 else "no"])
    for model_name, figures in tta.items():
        ratio = figures.get("recipe_hparams_speedup_of_mean_times")
        if "recipe_hparams_speedup_of_mean_times" in figures:
            rows.append([f"time to {figures['target']:.1%} ({model_name}): plain Keras with the recipe's "
                         "hyperparameters / tftrain", "not reached" if ratio is None else f"{ratio:.2f}x", "-", ""])
    defaults = summaries.get("recipe_defaults", {})
    if "chosen" in defaults:
        chosen = defaults["chosen"]
        rows.append(["MLP defaults chosen on the validation split (seeds 0, 1)",
                     f"batch {chosen['batch_size']}, learning rate {chosen['learning_rate']:g}",
                     "the recipe's defaults", "yes" if defaults["recipe_default_is_chosen"] else "no"])
    flagship = summaries.get("flagship", {})
    if "speedup_median" in flagship:
        speedup, accuracy = flagship["speedup_median"], flagship["mean_test_accuracy"]
        rows.append(["flagship end to end: plain Keras / tftrain (median over seeds)", f"{speedup:.2f}x", "≥ 1.25x",
                     "yes" if speedup >= 1.25 else "no"])
        rows.append(["flagship mean test accuracy: tftrain vs plain Keras",
                     f"{accuracy['tftrain']:.2%} vs {accuracy['keras']:.2%}", "same or better",
                     "yes" if accuracy["tftrain"] >= accuracy["keras"] else "no"])
    zoo = summaries.get("zoo", {})
    goals = (("oracle", "tftrain ≥ 95% of the oracle's best examples/sec (medians)"),
             ("plain_keras", "tftrain ≥ plain Keras examples/sec (medians)"),
             ("plain_keras_measured", "tftrain's 10 timed epochs no slower than plain Keras's (measured end to end)"),
             ("plain_keras_10_epochs", "tftrain's 10-epoch run no slower than plain Keras's (projected)"),
             ("probe", "tftrain's choosing ≤ 3% of a 10-epoch run (projected)")) if "model_count" in zoo else ()
    for key, figure in goals:
        met, count = _zoo_met(zoo, key), zoo["model_count"]
        if met is None:  # a results file from before this figure
            continue
        rows.append([f"zoo: models where {figure}", f"{met} of {count}", "all", "yes" if met == count else "no"])
    return rows


def _zoo_met(zoo: dict, key: str):
    """How many zoo models meet goal `key`; the measured 10-epoch goal from each model's ratio when the
    results file predates its count; None when neither is there."""
    if f"models_meets_{key}" in zoo:
        return zoo[f"models_meets_{key}"]
    ratios = [m.get("keras_vs_tftrain_measured") for m in zoo.get("models", {}).values()]
    if key != "plain_keras_measured" or None in ratios:
        return None
    return sum(r >= 1.0 for r in ratios)


def _merge_previous(path: Path, suite_kind: str, quick: bool, statuses: dict, summaries: dict, total: float):
    """`--only`: the previous summary's runs with the rerun ones replaced, so rerunning one benchmark
    does not drop the others from `summary.md` (their results files are untouched). Returns
    `(statuses, summaries, total seconds)`."""
    try:
        previous = json.loads(path.read_text())
    except (OSError, ValueError):
        return statuses, summaries, total
    if previous.get("suite") != suite_kind or previous.get("quick") != quick:
        return statuses, summaries, total
    merged_status = {**previous.get("runs", {}), **statuses}
    merged_summaries = {**previous.get("summaries", {}), **summaries}
    return merged_status, merged_summaries, sum(s["seconds"] for s in merged_status.values())


def _write_summary(out: Path, prefix: str, suite_kind: str, quick: bool, notes: list, suite, statuses: dict,
                   summaries: dict, total: float) -> None:
    """Writes `<out>/<prefix>summary.md` (targets, runs, each benchmark's table) and `summary.json`."""
    lines = [f"# Benchmark summary ({suite_kind} suite{', quick' if quick else ''})", "",
             f"{datetime.datetime.now().isoformat(timespec='seconds')}; {common.cpu_model()}, "
             f"{common.cpu_cores()} core(s); "
             f"total {total / 60:.1f} min.", ""]
    lines += [f"- {n}" for n in notes]
    lines += ["## Targets", "", common.markdown_table(["figure", "measured", "target", "met"], headline(summaries, quick)),
              "", "## Runs", "",
              common.markdown_table(["benchmark", "status", "seconds"],
                                    [[n, s["status"], f"{s['seconds']:.0f}"] for n, s in statuses.items()]), ""]
    for name in suite:
        md = out / f"{prefix}{name}.md"
        if md.exists() and statuses[name]["status"] == "ok":
            lines += [md.read_text(encoding="utf-8").replace("## ", "### ", 1), ""]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{prefix}summary.md").write_text("\n".join(lines), encoding="utf-8")
    (out / f"{prefix}summary.json").write_text(json.dumps(
        {"suite": suite_kind, "quick": quick, "total_s": total, "runs": statuses, "summaries": summaries,
         "notes": notes}, indent=2) + "\n", encoding="utf-8")
    print("\n" + "\n".join(lines[:lines.index("## Runs")]), flush=True)
    print(f"wrote {out / (prefix + 'summary.md')}", flush=True)


def _run_one(name: str, args, out: Path, prefix: str, quick: bool, expected_minutes: float) -> tuple:
    """Runs `python -m benchmarks.<name>` in its own process; returns `(name, {"status", "seconds"},
    its results file's summary or None)`. Under `--jobs` > 1 its output is printed whole when it ends."""
    cmd = [sys.executable, "-m", f"benchmarks.{name}", "--out", str(out), "--prefix", prefix,
           "--device", "gpu" if args.gpu else "cpu"]
    if quick:
        cmd.append("--quick")
    timeout = 300 if quick else 3 * 60 * expected_minutes
    capture = args.jobs > 1
    if not capture:
        print(f"\n=== {name} ===", flush=True)
    t0 = time.perf_counter()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    output = ""
    try:
        proc = subprocess.run(cmd, timeout=timeout, env=env, cwd=Path(__file__).resolve().parents[1], text=True,
                              stdout=subprocess.PIPE if capture else None,
                              stderr=subprocess.STDOUT if capture else None)
        output = proc.stdout or ""
        status = "ok" if proc.returncode == 0 else f"failed (exit code {proc.returncode})"
    except subprocess.TimeoutExpired as e:
        output = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        status = f"failed (timed out after {timeout:.0f} s)"
    seconds = time.perf_counter() - t0
    result_file = out / f"{prefix}{name}.json"
    summary = None
    if status == "ok" and result_file.exists():
        summary = json.loads(result_file.read_text())["summary"]
    elif status == "ok":
        status = "failed (no results file)"
    if capture:
        print(f"\n=== {name} ===\n{output}", end="", flush=True)
    print(f"=== {name}: {status} in {seconds:.0f} s ===", flush=True)
    return name, {"status": status, "seconds": seconds}, summary


def rebuild_summary(out: Path, prefix: str, suite_kind: str, quick: bool) -> int:
    """`--summary-only`: the summary from the results files in `out` (each benchmark's latest run, its
    seconds from its own file), the runs and notes of the last summary; returns the exit code."""
    try:
        previous = json.loads((out / f"{prefix}summary.json").read_text())
    except (OSError, ValueError):
        print(f"python -m benchmarks: error: no {prefix}summary.json in {out} to rebuild.", file=sys.stderr)
        return 2
    statuses, summaries = dict(previous.get("runs", {})), {}
    for name in statuses:
        path = out / f"{prefix}{name}.json"
        if path.exists():
            result = json.loads(path.read_text())
            summaries[name] = result["summary"]
            statuses[name] = {**statuses[name], "seconds": result.get("wall_time_s", statuses[name]["seconds"])}
    total = sum(s["seconds"] for s in statuses.values())
    _write_summary(out, prefix, suite_kind, quick, previous.get("notes", []), tuple(statuses), statuses, summaries,
                   total)
    return 0


def main(argv=None) -> int:
    """Runs the suite; returns the exit code."""
    args = parse_args(argv)
    if args.summary_only:
        out = args.out or (common.QUICK_DIR if args.quick else common.RESULTS_DIR)
        return rebuild_summary(out, "gpu-" if args.gpu else "", "gpu" if args.gpu else "cpu", args.quick)
    suite_kind = "gpu" if args.gpu else "cpu"
    suite = GPU_SUITE if args.gpu else CPU_SUITE
    quick = args.quick
    notes = []
    if args.gpu:
        n = gpu_count()
        if n == 0:
            print("=" * 78 + "\nNO GPU FOUND: TensorFlow sees no GPU on this machine. The GPU suite runs on the "
                  "CPU at --quick\nsizes instead, only to check its code paths; every figure it writes is a CPU "
                  "figure\n(gpu_found: false in each results file).\n" + "=" * 78, flush=True)
            notes.append("NO GPU FOUND: the GPU suite ran on the CPU at --quick sizes; CPU figures only.")
            quick = True
        else:
            print(f"GPU suite on {n} GPU(s).", flush=True)
    if args.only:
        unknown = [n for n in args.only.split(",") if n not in suite]
        if unknown:
            print(f"python -m benchmarks: error: unknown benchmark(s) {', '.join(unknown)} for the {suite_kind} "
                  f"suite. Expected some of: {', '.join(suite)}.", file=sys.stderr)
            return 2
        suite = tuple(n for n in suite if n in args.only.split(","))
    out = args.out or (common.QUICK_DIR if quick else common.RESULTS_DIR)
    prefix = "gpu-" if args.gpu else ""
    expected = EXPECTED_MINUTES[suite_kind]
    if not quick:
        print(f"Running {len(suite)} benchmark(s): {', '.join(suite)}; expected about "
              f"{sum(expected[n] for n in suite):.0f} min on a quiet machine.", flush=True)

    started = time.perf_counter()
    statuses, summaries = {}, {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        runs = [pool.submit(_run_one, name, args, out, prefix, quick, expected[name]) for name in suite]
        for run in runs:
            name, status, summary = run.result()
            statuses[name] = status
            if summary is not None:
                summaries[name] = summary

    total = time.perf_counter() - started
    if args.only:  # keep the other benchmarks of the last full run in the summary
        statuses, summaries, total = _merge_previous(out / f"{prefix}summary.json", suite_kind, quick, statuses,
                                                     summaries, total)
        suite = tuple(statuses)
    _write_summary(out, prefix, suite_kind, quick, notes, suite, statuses, summaries, total)
    return 0 if all(s["status"] == "ok" for s in statuses.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
