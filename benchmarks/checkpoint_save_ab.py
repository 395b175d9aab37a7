"""One StepBackup save, timed: `python benchmarks/checkpoint_save_ab.py REPO LABEL` times 20 saves (after 5
warm-up saves) of the MNIST MLP with Adam (784-512-512-10, 669,706 parameters, an 8.1 MB file) with the
tftrain found in REPO, and prints the median. Run it on two checkouts, alternated, to compare writers
(benchmarks/results/checkpoint_save_ab.md)."""
import sys, time, tempfile, numpy as np
sys.path.insert(0, sys.argv[1])
import keras
from tftrain.callbacks import StepBackup
m = keras.Sequential([keras.Input((784,)), keras.layers.Dense(512, activation="relu"), keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])
m.compile(keras.optimizers.Adam(), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
x = np.random.rand(256, 784).astype("float32"); y = np.random.randint(0, 10, 256)
m.fit(x, y, epochs=1, verbose=0, batch_size=128)
d = tempfile.mkdtemp()
b = StepBackup(d); b.set_model(m); b.on_train_begin()
ts = []
for i in range(25):
    s = time.perf_counter(); b._save(0, i + 1); ts.append(time.perf_counter() - s)
print(sys.argv[2], "params", m.count_params(), "median ms", round(float(np.median(ts[5:])) * 1e3, 1))
