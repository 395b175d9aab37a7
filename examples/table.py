"""A task on a CSV table it writes itself: house prices from two numeric columns and a city.

The table (``table-data/train.csv``, ``table-data/test.csv`` next to this file, written on
first import with a fixed seed: 4,000 and 1,000 rows) has the columns ``rooms``, ``area``,
``city`` and ``price``, where price = 50 * rooms + 2 * area + a per-city offset (0, 100, 250)
+ noise (standard deviation 10). The model reads each column by name: the numbers
normalised, the city through a ``StringLookup`` one-hot. Predicting the mean price gives an
MSE of about 14,000; the noise sets the floor at about 100.

    python -m tftrain.run examples/table.py:task --epochs 5
    python -m tftrain.run examples/table.py:task --strategy mirrored --cpu-replicas 2
"""

import csv
import os
from pathlib import Path

import numpy as np

import tftrain

CITIES = ("north", "south", "east")
OFFSETS = {"north": 0.0, "south": 100.0, "east": 250.0}
DATA = Path(__file__).resolve().parent / "table-data"


def write_table(path: Path, rows: int, seed: int) -> None:
    """Writes `rows` examples of the formula above to the CSV file `path`."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # processes importing this at once: one rename wins
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["rooms", "area", "city", "price"])
        for _ in range(rows):
            rooms, area, city = int(rng.integers(1, 7)), float(rng.uniform(30, 200)), str(rng.choice(CITIES))
            price = 50 * rooms + 2 * area + OFFSETS[city] + rng.normal(0, 10)
            out.writerow([rooms, f"{area:.2f}", city, f"{price:.2f}"])
    os.replace(tmp, path)


def build_model():
    """Inputs named after the columns: `rooms`, `area` (float32) and `city` (string)."""
    import keras

    rooms, area = keras.Input((), name="rooms"), keras.Input((), name="area")
    city = keras.Input((), name="city", dtype="string")
    numbers = keras.layers.Concatenate()([keras.layers.Reshape((1,))(rooms / 6.0),
                                          keras.layers.Reshape((1,))(area / 200.0)])
    one_hot = keras.layers.StringLookup(vocabulary=list(CITIES), output_mode="one_hot")(city)
    hidden = keras.layers.Dense(32, activation="relu")(keras.layers.Concatenate()([numbers, one_hot]))
    return keras.Model({"rooms": rooms, "area": area, "city": city}, keras.layers.Dense(1)(hidden))


for name, rows, seed in (("train.csv", 4000, 0), ("test.csv", 1000, 1)):
    if not (DATA / name).exists():
        write_table(DATA / name, rows, seed)

task = tftrain.TableTask(build_model, str(DATA / "train.csv"), label="price", categorical=["city"],
                         test_files=str(DATA / "test.csv"), loss="mse", learning_rate=1e-2, metrics=["mae"],
                         name="table", default_batch_size=64)
