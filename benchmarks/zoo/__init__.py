"""Zoo: tftrain's automatic settings against plain Keras and an oracle of fixed settings, on eight models.

Eight Keras models of different shapes (`models.ZOO`: an MLP, a CNN, a ResNet, a
depthwise-separable CNN, a Transformer, an LSTM, a wide embedding model, a dense
autoencoder), each at one global batch size a user would pick, with Adam and the
same loss for every contender:

* plain Keras as a user writes it: `compile(optimizer="adam", ...)` and
  `fit(x, y, batch_size=B)` on NumPy arrays, every Keras default;
* the oracle: tftrain's own `Trainer` with one setting fixed, at execution mode
  (graph, XLA) x steps_per_execution (1, 8, 32, 64) x intra-op / inter-op threads
  (TensorFlow's defaults and two others), so a choice is judged apart from the
  machinery and its cost;
* tftrain: `Trainer(ArrayTask(...), execution="auto", steps_per_execution="auto",
  precision="float32")`, with an empty memory of choices (its first run probes) and
  a second run that should reuse the choice.

Interleaved rounds (`harness.ROUNDS`), medians with their spread (`report`). Goals,
per model: tftrain >= 95% of the oracle's best, >= plain Keras in examples/sec and
in a projected 10-epoch run, its first run's probe <= 3% of that run.

    python -m benchmarks.zoo [--quick] [--models mlp,wide] [--rounds 3]
    python -m benchmarks.zoo --oracle-from benchmarks/results/zoo-oracle-run.json  # plain Keras and tftrain only
"""

import json

from benchmarks import common
from benchmarks.zoo import harness, report
from benchmarks.zoo.models import zoo_models


def run(args, device) -> common.Result:
    """Every round's workers (`harness.run_rounds`), then the report."""
    result = report.result(zoo_models(args), harness.run_rounds(args), args.quick)
    if args.oracle_from:
        kept = json.loads(args.oracle_from.read_text())
        path, cpu = common.portable_argv([str(args.oracle_from)])[0], kept.get("machine", {}).get("cpu", "a machine")
        # A kept file that kept its own oracle names the run that timed it: the date carries forward.
        timed = kept.get("data", {}).get("oracle_date") or kept.get("date")
        result.data["oracle_date"] = timed
        result.notes.append(
            f"The oracle's points (every thread setting) come from the zoo run of {timed} (kept in {path}, on {cpu}); "
            "this run timed plain Keras and tftrain again, back to back in each round, in place of that run's rows.")
    return result


def main(argv=None) -> int:
    """`python -m benchmarks.zoo [--quick] [--models a,b] [--rounds N]`; `--threads` is the worker mode."""
    return common.main_with_worker(report.NAME, __doc__.splitlines()[0], run, harness.worker, "threads", argv,
                                   extra=harness.add_flags)
