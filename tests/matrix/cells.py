"""Runs the support matrix's in-process cells and writes their results as JSON.

    python -m tests.matrix.cells --out results.json                       # every column of one process
    python -m tests.matrix.cells --out results.json --cpu-replicas 2      # the mirrored column

Each cell trains one tiny run (`tftrain.Trainer(...).fit()`) and is `ok` (it trained, its test figure
is finite, and under a mixed policy its accuracy is the saved model's own, evaluated again in float32),
`refused: <line>` (a `ConfigError` before the run directory was made) or `failed: <line>`.
"""

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

from tests.matrix.shapes import MONITOR, SHAPES

BASE = {"epochs": 2, "verbose": 0, "seed": 0, "batch_size": 32, "precision": "float32", "execution": "graph"}
VALIDATES = {"validation_split": 0.25}
COLUMNS = {
    "precision auto": {"precision": "auto"},
    "mixed_bfloat16": {"precision": "mixed_bfloat16"},
    "mixed_float16": {"precision": "mixed_float16"},
    "execution auto": {"execution": "auto"},
    "--keep-best, per-output monitor": {"keep_best": 1, **VALIDATES},
    "early stopping": {"early_stopping": 1, "epochs": 3, **VALIDATES},
    "export": {"export": "saved_model,onnx,litert"},
    "--tune": {"tune": 2, "epochs": 1, **VALIDATES},
    "gradient accumulation": {"gradient_accumulation_steps": 2},
}
"""Column -> config overrides on `BASE` (`export` fills one column a format; `--init-from` and HParams read
the base run)."""


def _line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}"[:240]


def _fit(make_task, run_dir: Path, overrides: dict, cpu_replicas: int):
    import tftrain

    strategy = {"strategy": "mirrored", "cpu_replicas": cpu_replicas} if cpu_replicas > 1 else {}
    return tftrain.Trainer(make_task(), **{**BASE, **strategy, **overrides, "run_dir": str(run_dir)}).fit()


def _accuracies(record, make_task, run_dir: Path) -> dict:
    """`{test accuracy key: (the run's figure, the saved model's own in float32)}`."""
    import keras

    keras.mixed_precision.set_global_policy("float32")
    task = make_task()
    model = task.build_model()
    data = task.test_data(32)
    model(next(iter(data))[0])
    model.load_weights(run_dir / "model.keras")
    model.compile(**{**task.compile_args(None), "optimizer": "sgd"})
    again = model.evaluate(data, verbose=0, return_dict=True)
    return {k: (v, again[k]) for k, v in (record.test or {}).items() if "accuracy" in k and k in again}


def cell(make_task, column: str, overrides: dict, run_dir: Path, cpu_replicas: int = 1) -> str:
    """Trains one cell; returns its status (module docstring)."""
    from tftrain.errors import ConfigError

    try:
        record = _fit(make_task, run_dir, overrides, cpu_replicas)
    except ConfigError as e:
        return f"refused: {_line(e)}" if not run_dir.exists() else f"failed: refused after the run began: {_line(e)}"
    except Exception as e:  # noqa: BLE001 (the cell's result)
        return f"failed: {_line(e)}"
    if not record.test or not all(math.isfinite(v) for v in record.test.values()):
        return f"failed: test figures {record.test}"
    if record.runtime["precision"] != "float32":
        for key, (figure, own) in _accuracies(record, make_task, run_dir).items():
            if abs(figure - own) > 0.03:
                return f"failed: test {key} {figure:.3f}, the saved model's own {own:.3f}"
    return "ok"


def _exported(run_dir: Path) -> set:
    """The formats the run in `run_dir` exported and checked (`metrics.json` `export`)."""
    try:
        return set(json.loads((run_dir / "metrics.json").read_text()).get("export") or {})
    except (OSError, ValueError):
        return set()


def _export_cells(make_task, root: Path) -> dict:
    """One run exporting every format; a format the sanity pass refuses gets that line, and the run is tried
    again without it (a refusal names one format)."""
    formats, out, attempt = ["saved_model", "onnx", "litert"], {}, 0
    while formats:
        run_dir = root / f"export{attempt}"
        status = cell(make_task, "export", {"export": ",".join(formats)}, run_dir)
        refused = next((f for f in formats if status.startswith(f"refused: ConfigError: --export {f} ")), None)
        if refused is None:
            exported = _exported(run_dir)
            out.update({f: status if status != "ok" else ("ok" if f in exported else "failed: not written")
                        for f in formats})
            break
        out[refused] = status
        formats.remove(refused)
        attempt += 1
    return {f"export {f}": out[f] for f in ("saved_model", "onnx", "litert")}


def row(name: str, root: Path, cpu_replicas: int) -> dict:
    """Every cell of row `name` (one column, `mirrored on 2 logical CPUs`, with `cpu_replicas` > 1)."""
    make_task = SHAPES[name]
    if cpu_replicas > 1:
        return {"mirrored, 2 logical CPUs": cell(make_task, "mirrored", {}, root / "mirrored", cpu_replicas)}
    out = {"default strategy": cell(make_task, "base", {}, root / "base")}
    base_ok = out["default strategy"] == "ok"
    for column, overrides in COLUMNS.items():
        if column.startswith("--keep-best"):
            overrides = {**overrides, "monitor": MONITOR.get(name, "val_accuracy")}
        if column == "export":
            out.update(_export_cells(make_task, root))
        else:
            out[column] = cell(make_task, column, overrides, root / column.replace(" ", "_").replace(",", ""))
    out["--init-from"] = cell(make_task, "init", {"init_from": str(root / "base")}, root / "init") if base_ok \
        else "failed: no base run"
    out["HParams"] = ("ok" if any((root / "base" / "logs").glob("events.out.tfevents*")) else
                      "failed: no HParams session") if base_ok else "failed: no base run"
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cpu-replicas", type=int, default=1)
    parser.add_argument("--rows", default=None, help="row names separated by ';' (default: every row)")
    args = parser.parse_args(argv)
    rows = args.rows.split(";") if args.rows else list(SHAPES)
    results = {}
    with tempfile.TemporaryDirectory(prefix="tftrain-matrix-") as tmp:
        for i, name in enumerate(rows):
            results[name] = row(name, Path(tmp) / f"row{i}", args.cpu_replicas)
            print(name, results[name], flush=True)
    args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
