"""`TableTask`: CSV (streamed with `CsvDataset`) or Parquet (read into memory with `pyarrow`) tables, a file or a glob.
An example is `(features, label)`: a dict of float32 (numeric) or string (categorical) scalars, and a float32 label
(a vector for several label columns). Source: https://www.tensorflow.org/api_docs/python/tf/data/experimental/CsvDataset
"""

from __future__ import annotations

import csv
import glob
from pathlib import Path
from typing import Optional, Sequence, Union

from tftrain.errors import ConfigError
from tftrain.train.tasks.datasets import DatasetTask

SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}

UNEVEN_SHARES = 1.05
"""Input pipelines read their own files only when no pipeline's rows exceed another's by more than this factor
(else every pipeline keeps its share of the examples): a smaller share would be read more often in a run."""
"""File suffix -> format."""


def expand(files: Union[str, Sequence[str]], what: str = "files") -> list:
    """The sorted paths `files` (a path, glob or list) names; `ConfigError` on none, or mixed or unknown formats."""
    patterns = [files] if isinstance(files, (str, Path)) else list(files)
    paths = sorted({p for pattern in patterns for p in glob.glob(str(Path(pattern).expanduser()))})
    if not paths:
        raise ConfigError(f"TableTask {what}: nothing matches {', '.join(map(str, patterns))}.")
    kinds = {SUFFIXES.get(Path(p).suffix.lower()) for p in paths}
    if None in kinds or len(kinds) > 1:
        raise ConfigError(f"TableTask {what}: pass .csv files or .parquet files (one format); got "
                          f"{', '.join(sorted({Path(p).suffix or '(no suffix)' for p in paths}))}.")
    return paths


class TableTask(DatasetTask):
    """A task over CSV or Parquet tables with a label column (or several).

    A multi-worker pipeline reads only its own files when there are enough, else its share of every file's examples.

    Args:
        build_model: its inputs are named after the feature columns (`dtype="string"` for a categorical one).
        files: the training table: a path, a glob or a list.
        label: the label column, or a list of them (stacked into a vector).
        numeric: Defaults to None (every column not a label or categorical).
        categorical: feature columns read as strings. Defaults to ().
        validation_files, test_files: tables of the same columns. Defaults to None.
        shuffle: Defaults to True.
        **task_args: `loss` (required), `optimizer`, ...: see `FunctionTask`. `name` defaults to `"table"`.

    Raises:
        ConfigError: no file matches, a column is missing, or Parquet without `pyarrow`.

    Example:
        >>> task = tftrain.TableTask(build_model, "data/train-*.csv", label="price", categorical=["city"],
        ...                          test_files="data/test.csv", loss="mse")
    """

    def __init__(self, build_model, files, *, label, numeric=None, categorical=(), validation_files=None,
                 test_files=None, shuffle=True, name="table", **task_args):
        self.files = expand(files)
        self.format = SUFFIXES[Path(self.files[0]).suffix.lower()]
        self.labels = [label] if isinstance(label, str) else list(label)
        self.categorical = list(categorical)
        self.numeric = self._numeric(numeric)
        more = {k: expand(v, k) if v is not None else None for k, v in
                (("validation_files", validation_files), ("test_files", test_files))}
        self.validation_files, self.test_files = more["validation_files"], more["test_files"]
        same_header([*self.files, *(self.validation_files or ()), *(self.test_files or ())], self.format)
        self.file_rows = [count_rows([path], self.format) for path in self.files]
        super().__init__(build_model, lambda: self.read(self.files),
                         validation=(lambda: self.read(self.validation_files)) if self.validation_files else None,
                         test=(lambda: self.read(self.test_files)) if self.test_files else None,
                         shuffle=shuffle, num_train_examples=sum(self.file_rows), name=name,
                         **task_args)

    def _numeric(self, numeric) -> list:
        header = columns_of(self.files[0], self.format)
        wanted = [*self.labels, *self.categorical, *(numeric or ())]
        missing = [c for c in wanted if c not in header]
        if missing:
            raise ConfigError(f"TableTask: {self.files[0]} has no column {', '.join(map(repr, missing))}; its "
                              f"columns: {', '.join(header)}.")
        if numeric is not None:
            return list(numeric)
        return [c for c in header if c not in self.labels and c not in self.categorical]

    def read(self, paths: Sequence[str]):
        """The unbatched `(features, label)` examples of `paths`, in file order."""
        import tensorflow as tf

        columns = [*self.numeric, *self.categorical, *self.labels]
        kinds = {c: tf.string if c in self.categorical else tf.float32 for c in columns}
        if self.format == "csv":
            ds = _read_csv(paths, columns, kinds)
        else:
            ds = _read_parquet(paths, columns, kinds)
        return ds.map(self._example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    def _example(self, row: dict):
        import tensorflow as tf

        labels = [row[c] for c in self.labels]
        label = labels[0] if len(labels) == 1 else tf.stack(labels)
        return {c: row[c] for c in (*self.numeric, *self.categorical)}, label

    @property
    def num_test_examples(self):
        if not self.test_files:
            return None
        if not hasattr(self, "_test_rows"):
            self._test_rows = count_rows(self.test_files, self.format)
        return self._test_rows

    def train_data(self, global_batch_size, input_context=None):
        if input_context is None or self._not_by_file(input_context.num_input_pipelines):
            return super().train_data(global_batch_size, input_context)
        mine = self.files[input_context.input_pipeline_id::input_context.num_input_pipelines]
        return self._finish(self.read(mine), global_batch_size, True, input_context, shard=False)

    def _not_by_file(self, num_input_pipelines: int) -> Optional[str]:
        """Why the pipelines do not each read their own files, or None when they do."""
        if num_input_pipelines <= 1:
            return "one input pipeline"
        if len(self.files) < num_input_pipelines:
            return f"{len(self.files)} file(s) for {num_input_pipelines} pipelines"
        if self._data.validation_split:
            return "--validation-split holds out the last examples"
        if self._data.train_examples is not None:
            return "--train-examples takes the first examples"
        shares = [sum(self.file_rows[i::num_input_pipelines]) for i in range(num_input_pipelines)]
        if max(shares) > UNEVEN_SHARES * min(shares):  # the smaller shares' rows would be read more often
            return f"files of uneven sizes: {min(shares):,} to {max(shares):,} rows a pipeline"
        return None

    def describe_sharding(self, num_input_pipelines: int) -> Optional[str]:
        why = self._not_by_file(num_input_pipelines)
        if why is None:
            return (f"sharding:  each of the {num_input_pipelines} input pipelines reads its own files "
                    f"({len(self.files)} files, one in {num_input_pipelines} each)")
        return f"sharding:  each of the {num_input_pipelines} input pipelines keeps its share of the examples ({why})"

    def describe_data(self) -> list:
        n = self.num_train_examples
        return [f"data:      {len(self.files)} {self.format} file(s), {n:,} training examples; label "
                f"{', '.join(self.labels)}; {len(self.numeric)} numeric and {len(self.categorical)} categorical "
                "feature column(s); several input pipelines read their own files when there are as many files as "
                "pipelines (and no --validation-split / --train-examples), else each keeps its share of the examples"]


def columns_of(path: str, kind: str) -> list:
    """The column names of a table file (a CSV header, a Parquet schema)."""
    if kind == "csv":
        with open(path, newline="", encoding="utf-8") as f:
            return next(csv.reader(f), [])
    return list(_pyarrow().parquet.read_schema(path).names)


def same_header(paths: Sequence[str], kind: str) -> None:
    """`ConfigError` when CSV files' headers differ: their columns are read by position, the first file's."""
    first = columns_of(paths[0], kind) if kind == "csv" else None
    for path in paths[1:] if first is not None else ():
        if columns_of(path, kind) != first:
            raise ConfigError(f"TableTask: {path}'s header ({', '.join(columns_of(path, kind))}) differs from "
                              f"{paths[0]}'s ({', '.join(first)}); CSV columns are read by position: write the files "
                              "with one header.")


def count_rows(paths: Sequence[str], kind: str) -> int:
    """Data rows of the tables (non-blank CSV lines after the header; Parquet metadata)."""
    if kind == "parquet":
        parquet = _pyarrow().parquet
        return sum(parquet.ParquetFile(p).metadata.num_rows for p in paths)
    total = 0
    for p in paths:
        with open(p, newline="", encoding="utf-8") as f:
            total += sum(1 for row in csv.reader(f) if row) - 1
    return total


def _read_csv(paths, columns, kinds):
    import tensorflow as tf

    header = columns_of(paths[0], "csv")
    select = sorted(header.index(c) for c in columns)
    ordered = [header[i] for i in select]
    defaults = [tf.constant([], dtype=kinds[c]) for c in ordered]  # a missing value is an error, not a zero

    def one(path):
        return tf.data.experimental.CsvDataset(path, defaults, header=True, select_cols=select)

    rows = tf.data.Dataset.from_tensor_slices(list(paths)).flat_map(one)
    return rows.map(lambda *values: dict(zip(ordered, values)))


def _read_parquet(paths, columns, kinds):
    import numpy as np
    import tensorflow as tf

    parquet = _pyarrow().parquet
    tables = [parquet.read_table(p, columns=columns) for p in paths]
    data = {}
    for c in columns:
        values = np.concatenate([t.column(c).to_numpy(zero_copy_only=False) for t in tables])
        data[c] = values.astype(str) if kinds[c] == tf.string else values.astype("float32")
    return tf.data.Dataset.from_tensor_slices(data)


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ConfigError("TableTask reads Parquet through pyarrow, which is not installed: "
                          "pip install \"tftrain[parquet]\" (or pass CSV files).") from None
    return pyarrow
