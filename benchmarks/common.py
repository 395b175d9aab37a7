"""Shared machinery of the benchmarks: arguments, timing, machine facts, output files.

Every benchmark module `benchmarks/<name>.py` has a `run(args) -> Result` function
and a `main()`; `python -m benchmarks.<name>` runs one, `python -m benchmarks` runs
them all, each in its own process (clean TensorFlow state, thread settings that
take effect). A `Result` becomes three files in the output folder:

    <prefix><name>.json   figures, settings and machine facts (for programs)
    <prefix><name>.md     the Markdown table (also printed)
    <prefix><name>.png    the plot (matplotlib)

Contenders are timed back to back in one process, in interleaved rounds
(A B C, A B C, ...), and each keeps its best round: on a shared machine a
disturbance then hits one round, not one contender.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from tftrain.reports import jsonable  # no TensorFlow: the parent process of a benchmark stays light

RESULTS_DIR = Path(__file__).resolve().parent / "results"
"""Where full runs write (`benchmarks/results/`)."""

QUICK_DIR = RESULTS_DIR / "quick"
"""Where `--quick` runs write by default (ignored by git)."""


@dataclasses.dataclass
class Result:
    """One benchmark's outcome.

    Attributes:
        name: benchmark name (the file stem), e.g. `"roofline"`.
        title: heading of the table.
        headers: table column names.
        rows: table rows (lists of already formatted cells).
        data: figures for the JSON file (plain data: numbers, strings, lists, dicts).
        summary: headline figures (plain data), e.g. the ratio a target is about.
        notes: sentences printed under the table (conditions, caveats).
        plot: function `(matplotlib Figure) -> None` drawing the plot, or None.
    """

    name: str
    title: str
    headers: Sequence[str]
    rows: Sequence[Sequence]
    data: dict
    summary: dict
    notes: list = dataclasses.field(default_factory=list)
    plot: Optional[Callable] = None


def portable_argv(argv: Optional[list] = None) -> list:
    """The command-line arguments as recorded in results files: paths inside the
    repository relative to its root, and flags with an empty value left out, so
    committed results name no folder of the machine that produced them.

    Args:
        argv: arguments; None reads `sys.argv[1:]`. Defaults to None.

    Returns:
        A new list of strings.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    root = Path(__file__).resolve().parents[1]
    out = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--") and "=" not in arg and i + 1 < len(args) and args[i + 1] == "":
            i += 2  # e.g. --prefix "" (the CPU suite's empty prefix)
            continue
        flag, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        path = Path(value)
        if value and path.is_absolute():
            try:
                value = str(path.resolve().relative_to(root))
            except ValueError:
                pass
        out.append(f"{flag}{eq}{value}")
        i += 1
    return out


def parse_args(name: str, description: str, argv=None, extra: Optional[Callable] = None) -> argparse.Namespace:
    """The common flags of every benchmark: `--quick`, `--out`, `--device`, `--prefix`.

    Args:
        name: the benchmark's name (program name in help).
        description: help text.
        argv: arguments; None reads `sys.argv[1:]`. Defaults to None.
        extra: function `(parser) -> None` adding the benchmark's own flags.
            Defaults to None.

    Returns:
        The parsed namespace; `out` is a `Path` (`results/quick/` for `--quick`,
        else `results/`, unless given).
    """
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{name}", description=description)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the machinery in seconds")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: benchmarks/results/)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="cpu, or gpu (falls back to the CPU, saying so, when there is none)")
    parser.add_argument("--prefix", default="", help="prefix of the output file names (e.g. gpu-)")
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = QUICK_DIR if args.quick else RESULTS_DIR
    return args


def select_device(requested: str) -> dict:
    """Configures devices before TensorFlow starts; returns facts for the results.

    With `requested="gpu"` and no GPU visible, prints a clear notice and carries on
    on the CPU (`gpu_found` False in the returned dict).

    Returns:
        `{"requested", "kind", "devices", "gpu_found", "gpu_names"}`.
    """
    from tftrain.runtime.devices import configure_devices

    info = configure_devices("cpu" if requested == "cpu" else "auto")
    found = info.kind == "gpu"
    if requested == "gpu" and not found:
        print(
            "NO GPU FOUND: TensorFlow sees no GPU on this machine, so this GPU benchmark runs on "
            "the CPU instead; its figures are CPU figures (gpu_found: false in the results).",
            flush=True,
        )
    return {
        "requested": requested,
        "kind": info.kind,
        "devices": list(info.devices),
        "gpu_found": found,
        "gpu_names": list(info.gpu_names),
    }


def cpu_model() -> str:
    """The CPU's model name (`tftrain.host.cpu_model`: /proc/cpuinfo, else the platform's)."""
    from tftrain.host import cpu_model as doctor_cpu_model

    return doctor_cpu_model()


def load_average() -> Optional[list]:
    """1, 5 and 15-minute load averages (None where unsupported)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def cpu_cores() -> int:
    """Cores this process may run on (CPU affinity), without importing TensorFlow."""
    from tftrain.host import usable_cores

    return usable_cores()


def machine_info() -> dict:
    """Facts that qualify the figures: CPU, cores, load, versions (imports no TensorFlow)."""
    from tftrain.reports import versions

    return {
        "cpu": cpu_model(),
        "cores": cpu_cores(),
        "load_average_at_start": load_average(),
        "platform": platform.platform(),
        "versions": versions(),
    }


def best_of_rounds(contenders: Mapping[str, Callable[[], float]], rounds: int) -> dict:
    """Times contenders in interleaved rounds; returns name -> list of figures.

    Args:
        contenders: name -> function returning one measured time in seconds
            (smaller is better).
        rounds: rounds, >= 1; each runs every contender once, in order.

    Returns:
        name -> the per-round figures (take `min` for the best). A contender that
        raises (e.g. a dtype the hardware lacks) gets `math.inf` for that round,
        and the error is printed; it is not retried in later rounds.
    """
    out = {name: [] for name in contenders}
    failed = set()
    for _ in range(max(1, rounds)):
        for name, fn in contenders.items():
            if name in failed:
                out[name].append(math.inf)
                continue
            try:
                out[name].append(fn())
            except Exception as e:  # one failing contender must not sink the others
                failed.add(name)
                out[name].append(math.inf)
                print(f"FAILED: {name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
    return out


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(str(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value, spec: str = ",.0f", missing: str = "-") -> str:
    """Formats a number with `spec`; None becomes `missing`, NaN and infinities `failed`."""
    if value is None:
        return missing
    if isinstance(value, float) and not math.isfinite(value):
        return "failed"
    return format(value, spec)


def rate(examples: float, seconds: float) -> float:
    """`examples / seconds`, NaN for a failed (infinite) time."""
    return examples / seconds if math.isfinite(seconds) and seconds > 0 else math.nan


def ratio(a: float, b: float) -> float:
    """`a / b`, NaN when either is not a finite positive number."""
    ok = all(math.isfinite(x) and x > 0 for x in (a, b))
    return a / b if ok else math.nan


def write_result(result: Result, args: argparse.Namespace, started: float, machine: dict, device: dict) -> dict:
    """Writes `<prefix><name>.json`, `.md` and `.png` into `args.out`; prints the table.

    Returns:
        The JSON payload written.
    """
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{args.prefix}{result.name}"
    table = markdown_table(result.headers, result.rows)
    machine = {**machine, "load_average_at_end": load_average()}
    quick_note = ["Quick mode (--quick): tiny sizes that check the machinery; the figures mean nothing."] \
        if args.quick else []
    notes = quick_note + list(result.notes)
    if device.get("requested") == "gpu" and not device.get("gpu_found"):
        notes.insert(0, "NO GPU FOUND: this GPU benchmark ran on the CPU; the figures are CPU figures.")
    markdown = "\n".join(
        [f"## {result.title}", "", table, ""]
        + [f"- {n}" for n in notes]
        + ["", f"Machine: {machine['cpu']}, {machine['cores']} core(s), load average "
                f"{machine['load_average_at_start']} at start, {machine['load_average_at_end']} at end; "
                f"device: {device.get('kind')}. Command: `{' '.join(['python -m benchmarks.' + result.name] + portable_argv())}`", ""]
    )
    payload = {
        "benchmark": result.name,
        "title": result.title,
        "quick": bool(args.quick),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "wall_time_s": time.perf_counter() - started,
        "machine": machine,
        "device": device,
        "summary": result.summary,
        "table": {"headers": list(result.headers), "rows": [list(map(str, r)) for r in result.rows]},
        "data": result.data,
        "notes": notes,
        "argv": portable_argv(),
    }
    json_path = out / f"{stem}.json"
    md_path = out / f"{stem}.md"
    png_path = out / f"{stem}.png"
    replaced = [p.name for p in (json_path, md_path, png_path) if p.exists()]
    json_path.write_text(json.dumps(payload, indent=2, default=jsonable) + "\n", encoding="utf-8")
    md_path.write_text(markdown, encoding="utf-8")
    if result.plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=(8, 4.5), dpi=100)
        try:
            result.plot(fig)
            fig.suptitle(result.title + (" (quick)" if args.quick else ""), fontsize=10)
            fig.tight_layout()
            fig.savefig(png_path)
        finally:
            plt.close(fig)
    print(markdown, flush=True)
    written = ", ".join(str(p) for p in (json_path, md_path, png_path) if p.exists())
    print(f"wrote {written}" + (f" (replacing the previous {', '.join(replaced)})" if replaced else ""), flush=True)
    return payload


def main_for(name: str, description: str, run: Callable, argv=None, extra: Optional[Callable] = None) -> int:
    """Parses flags, sets the device up, runs `run(args, device)`, writes the files.

    Returns:
        The exit code (0).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = parse_args(name, description, argv, extra)
    started = time.perf_counter()
    machine = machine_info()
    # A parent that only starts subprocesses keeps TensorFlow out (its children set their devices up):
    # always (`no_device_setup`), or on the CPU (`parent_only`; on a GPU it still asks for the GPU's names).
    if getattr(args, "no_device_setup", False) or (getattr(args, "parent_only", False) and args.device == "cpu"):
        device = {"requested": args.device, "kind": "cpu", "devices": [], "gpu_found": False, "gpu_names": []}
    else:
        device = select_device(args.device)
    result = run(args, device)
    if result is not None:
        write_result(result, args, started, machine, device)
    return 0


def main_with_worker(name: str, description: str, run: Callable, worker: Callable, worker_flag: str,
                     argv=None, extra: Optional[Callable] = None) -> int:
    """`main` of a benchmark whose contenders run in worker processes of its own.

    With the flag `worker_flag` set (the attribute name, e.g. `"contender"`), runs
    `worker(args)`, which writes its record to `--point-out`; otherwise runs the
    benchmark with `main_for`.

    Returns:
        The exit code (0).

    Raises:
        SystemExit: in worker mode without `--point-out`.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = parse_args(name, description, argv, extra)
    if getattr(args, worker_flag):
        if args.point_out is None:
            raise SystemExit(f"--{worker_flag.replace('_', '-')} needs --point-out FILE")
        worker(args)
        return 0
    return main_for(name, description, run, argv, extra=extra)


# --- Workloads shared by the benchmarks -------------------------------------------

MODELS = ("mlp", "cnn")
"""The MNIST recipe's models, benchmarked everywhere."""


def mnist_arrays():
    """The bundled real MNIST (`tftrain.data.load_mnist()`)."""
    from tftrain.data import load_mnist

    return load_mnist()


def build_model(name: str):
    """The MNIST recipe's model `name` (`"mlp"` or `"cnn"`), float32 outputs, uncompiled."""
    from tftrain.recipes import mnist
    from tftrain.runtime import ensure_float32_outputs

    return ensure_float32_outputs({"mlp": mnist.mlp, "cnn": mnist.cnn}[name]())


def compile_model(model, execution: str = "graph", steps_per_execution: int = 1, learning_rate: float = 1e-3):
    """Compiles like the recipe does (Adam, sparse cross-entropy, accuracy); returns the model."""
    import keras

    from tftrain.runtime import compile_options

    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        **compile_options(execution, steps_per_execution),
    )
    return model


def train_batches(data, batch_size: int, examples: Optional[int] = None, config=None, seed: int = 0,
                  preprocess=None):
    """The recipe's training pipeline over the first `examples` MNIST images.

    Batches hold raw uint8 pixels and int32 labels (the recipe's models scale their
    own inputs), unless `preprocess` replaces the recipe's batch map.
    """
    from tftrain.data import build_dataset, integer_labels

    n = len(data.x_train) if examples is None else min(examples, len(data.x_train))
    n = max(n, batch_size)
    return build_dataset(
        (data.x_train[:n], data.y_train[:n]), batch_size, training=True, config=config, seed=seed,
        preprocess=preprocess or integer_labels,
    )


def recipe_defaults():
    """The MNIST recipe's default `RecipeConfig`."""
    from tftrain.recipes.mnist import DEFAULTS

    return DEFAULTS


def default_batch_size(model: str) -> int:
    """The recipe's default global batch size for `model` (its `BATCH_SIZES` entry)."""
    from tftrain.recipes.mnist import BATCH_SIZES, DEFAULTS

    return DEFAULTS.data.batch_size or BATCH_SIZES[model]


def batch_sizes(args, quick_size: int) -> dict:
    """Model -> batch size: `--batch-size` if given, else `quick_size` for `--quick`, else the recipe's."""
    return {m: getattr(args, "batch_size", None) or (quick_size if args.quick else default_batch_size(m))
            for m in MODELS}


def describe_batches(batches: Mapping[str, int]) -> str:
    """`batch 512 (mlp), 128 (cnn)` or `batch 64` when all are equal."""
    if len(set(batches.values())) == 1:
        return f"batch {next(iter(batches.values()))}"
    return "batch " + ", ".join(f"{b} ({m})" for m, b in batches.items())
