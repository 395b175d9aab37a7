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


def _csv_logger_keys(logs) -> list:
    """`CSVLogger`'s columns after `epoch` for these logs (sorted, plus "NA" `val_` twins if none): appends line up."""
    keys = sorted(logs)
    return keys if any(k.startswith("val_") for k in keys) else keys + [f"val_{k}" for k in keys]


def mend(path) -> Optional[str]:
    """Drops the lines of `history.csv` that are not text (not UTF-8, or with NUL bytes: a crash's or another
    program's bytes) and a last row cut short, which Keras's `CSVLogger` cannot append after (its next row would
    join it); returns None, or a line saying what went."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    lines = data.splitlines(keepends=True)
    cut = bool(lines) and not lines[-1].endswith((b"\n", b"\r"))  # every row ends in a newline: a write cut short
    kept = []
    for line in lines[:-1] if cut else lines:
        try:
            kept.append(line.decode("utf-8")) if b"\0" not in line else None
        except UnicodeDecodeError:
            pass
    if len(kept) == len(lines):
        return None
    write_text_atomic(path, "".join(kept))
    return (f"{path} had {len(lines) - len(kept)} damaged line(s) (not text, or a row cut short); dropped, so the "
            "epoch log and metrics.json's history lack those epochs")


def tidy_history(path, attempt=None) -> Optional[str]:
    """Rewrites `history.csv` as one row per epoch (its last), in order; returns None, or a line if damage was mended.

    Rows of the wrong length (cut by a kill or full disk) are dropped and refilled from `attempt` (this attempt's
    `keras.callbacks.History`). A damaged header leaves only this attempt's epochs, in `CSVLogger`'s columns.
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
    epochs, logs = list(getattr(attempt, "epoch", None) or []), dict(getattr(attempt, "history", None) or {})
    header_damaged = "epoch" not in header or any(not name or _number(name) for name in header)
    if header_damaged:
        if not epochs:
            return None
        header, rows = ["epoch", *_csv_logger_keys(logs)], []
    last = max(epochs) if epochs else None  # no row can be of a later epoch than this attempt's last
    good = [row for row in rows if None not in row and None not in row.values()
            and str(row.get("epoch", "")).strip().isdigit() and (last is None or int(row["epoch"]) <= last)]
    by_epoch = {int(row["epoch"]): row for row in good}
    for i, epoch in enumerate(epochs):  # this attempt's epochs a damaged row took with it
        by_epoch.setdefault(epoch, {"epoch": epoch, **{k: logs[k][i] if k in logs else "NA" for k in header[1:]}})
    dropped = len(rows) - len(good)
    if not header_damaged and not dropped and [int(row["epoch"]) for row in good] == sorted(by_epoch):
        return None  # one row per epoch, in order: nothing to rewrite
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=header, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(by_epoch[e] for e in sorted(by_epoch))
    write_text_atomic(path, text.getvalue())
    if header_damaged:
        return f"{path} was damaged; it now holds the {len(by_epoch)} epoch(s) this attempt trained"
    missing = sorted(set(range(max(by_epoch, default=-1) + 1)) - set(by_epoch))
    lost = f"; no row for epoch(s) {', '.join(str(e + 1) for e in missing)}" if missing else ""
    return f"{path} had {dropped} damaged row(s); dropped, and this attempt's epochs kept{lost}" if dropped else None


def read_history(path) -> dict:
    """The run's per-epoch metrics from `history.csv`, across resumes.

    Returns:
        `{metric: [value per epoch]}`: NaN where a row lacks it, an epoch's last row kept, all-NaN columns
        left out; {} when the file is missing or empty.
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
    # CSVLogger's "NA" val_ columns (no validation data) are not metrics.
    return {name: values for name, values in history.items() if not all(math.isnan(v) for v in values)}


def logged_value(history_file, epoch: int, name: str) -> Optional[float]:
    """`name`'s value at `epoch` (0-based, as `CSVLogger` writes it) in `history_file`; None if the file, row or
    value is missing."""
    import csv

    try:
        with open(history_file, newline="", encoding="utf-8") as f:
            rows = [row for row in csv.DictReader(f) if row.get("epoch", "").strip() == str(epoch)]
        return float(rows[-1][name]) if rows else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
