"""The zoo's harness: its stopwatch leaves tftrain's automatic steps per execution alone, and a kept
run's oracle points join a references-only run."""

import json
import math

from benchmarks.zoo import harness
from tftrain.train.automatic import batch_hooks


def test_only_an_oracle_point_stopwatch_has_a_per_batch_hook():
    # A per-batch hook on the contenders' stopwatch made tftrain's --steps-per-execution auto keep 1.
    assert batch_hooks([harness._stopwatch()]) == []
    assert batch_hooks([harness._stopwatch(stop_slower_than=10.0, batches=64)]) == ["EpochStopwatch.on_train_batch_end"]
    assert batch_hooks([harness._stopwatch(stop_slower_than=math.inf, batches=64)]) == []


def test_a_kept_run_gives_each_round_its_oracle_points_and_its_other_thread_settings(tmp_path):
    kept = [{"intra_op": 0, "inter_op": 0, "round": r, "models": {"mlp": {"grid": [{"round": r}]}}} for r in (0, 1)]
    kept.append({"intra_op": 1, "inter_op": 1, "round": 0, "models": {"mlp": {"grid": [{"threads": 1}]}}})
    path = tmp_path / "zoo.json"
    path.write_text(json.dumps({"data": {"workers": kept}}))
    new = [{"intra_op": 0, "inter_op": 0, "round": r, "models": {"mlp": {"grid": [], "keras": {"r": r}}}}
           for r in (1, 0)]
    merged = harness.with_kept_oracle(new, path)
    assert [w["models"]["mlp"]["grid"] for w in merged[:2]] == [[{"round": 1}], [{"round": 0}]]
    assert merged[0]["models"]["mlp"]["keras"] == {"r": 1} and merged[2]["intra_op"] == 1 and len(merged) == 3
