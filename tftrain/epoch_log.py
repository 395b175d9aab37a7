"""`history.csv`, the run's epoch log: read across resumes, and tidied to one row per epoch."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from tftrain.files import write_text_atomic


def _number(text: str) -> bool:
    """Whether `text` reads as a number (a value where a column name should be)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def tidy_history(path, attempt=None) -> Optional[str]:
    """Rewrites `history.csv` with one row per epoch, in order, each epoch's last row kept (an epoch redone
    after a kill is logged twice); returns None, or one line when the file was damaged and was rebuilt from
    `attempt`, this attempt's `keras.callbacks.History` (its `epoch` and `history`).

    A damaged file (a header without `epoch` or with a number for a name, a row of another length than the
    header) cannot be merged row by row; it then holds the epochs this attempt trained.
    """
    import csv
    import io

    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header, rows = list(reader.fieldnames or []), list(reader)
    except (OSError, ValueError, csv.Error):
        return None
    damaged = "epoch" not in header or any(not name or _number(name) for name in header) or any(
        None in row or None in row.values() or not str(row.get("epoch", "")).strip().isdigit() for row in rows)
    if damaged:
        epochs, logs = list(getattr(attempt, "epoch", None) or []), dict(getattr(attempt, "history", None) or {})
        if not epochs:
            return None
        header = ["epoch", *logs]
        rows = [{"epoch": e, **{k: logs[k][i] for k in logs}} for i, e in enumerate(epochs)]
    by_epoch = {int(row["epoch"]): row for row in rows}
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=header, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(by_epoch[e] for e in sorted(by_epoch))
    write_text_atomic(path, text.getvalue())
    return (f"{path} was damaged; it now holds the {len(by_epoch)} epoch(s) this attempt trained" if damaged
            else None)


def read_history(path) -> dict:
    """The run's per-epoch metrics from `history.csv`, across resumes.

    Returns:
        `{metric: [value per epoch]}`: NaN where a row lacks it, an epoch logged twice keeps its last row,
        all-NaN columns are left out; {} when the file is missing or empty.
    """
    import csv
    import math

    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = {int(row["epoch"]): row for row in csv.DictReader(f) if row.get("epoch", "").strip()}
    except (OSError, ValueError, KeyError):
        return {}
    names = list(dict.fromkeys(k for row in rows.values() for k in row if k != "epoch"))

    def value(text) -> float:
        try:
            return float(text)
        except (TypeError, ValueError):
            return math.nan

    history = {name: [value(rows[e].get(name)) for e in sorted(rows)] for name in names}
    # Keras's CSVLogger adds val_ columns holding "NA" to a run without validation data: not metrics.
    return {name: values for name, values in history.items() if not all(math.isnan(v) for v in values)}
