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

`--oracle-from` keeps the oracle of a run on the same machine (CPU model and cores; another is
refused with exit code 2): a kept oracle from another host would compare two machines.
"""

import json
import sys

from benchmarks import common
from benchmarks.zoo import harness, report
from benchmarks.zoo.models import zoo_models


def check_oracle_host(path, kept: dict, machine: dict) -> None:
    """Refuses an `--oracle-from` file timed on another machine (CPU model or cores differ): its points,
    set against this machine's plain Keras and tftrain, would compare two machines, not two settings.

    Args:
        path: the file (for the message).
        kept: its parsed contents (a zoo result: `machine.cpu`, `machine.cores`).
        machine: this machine's `common.machine_info()`.

    Raises:
        SystemExit: (exit code 2) naming both machines and the fix.
    """
    theirs = kept.get("machine") or {}
    if (theirs.get("cpu"), theirs.get("cores")) != (machine["cpu"], machine["cores"]):
        print(f"benchmarks.zoo: error: --oracle-from {path} was timed on {theirs.get('cpu', 'an unnamed machine')} "
              f"({theirs.get('cores', '?')} cores), this machine is {machine['cpu']} ({machine['cores']} cores): "
              "its oracle would compare two machines. Drop --oracle-from to time the oracle here.",
              file=sys.stderr)
        raise SystemExit(2)


def _read_kept(path) -> dict:
    """The `--oracle-from` file's contents; a file that cannot be read as JSON exits 2 in one line."""
    try:
        kept = json.loads(path.read_text())
        if not isinstance(kept, dict) or not isinstance(kept.get("machine", {}), dict):
            raise ValueError("not a zoo result object")
        return kept
    except (OSError, ValueError) as e:
        print(f"benchmarks.zoo: error: --oracle-from {path} cannot be read as a zoo result ({e}). "
              "Pass a zoo.json that a zoo run wrote.", file=sys.stderr)
        raise SystemExit(2) from None


def run(args, device) -> common.Result:
    """Every round's workers (`harness.run_rounds`), then the report.

    Raises:
        SystemExit: (exit code 2) when `--oracle-from` was timed on another machine (`check_oracle_host`).
    """
    if args.oracle_from:
        check_oracle_host(args.oracle_from, _read_kept(args.oracle_from), common.machine_info())
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
