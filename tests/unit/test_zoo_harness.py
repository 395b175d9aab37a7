"""The zoo's harness: its stopwatch leaves tftrain's automatic steps per execution alone, and a kept
run's oracle points join a references-only run."""

import json
import math

from benchmarks.zoo import harness
from tftrain.train.model_facts import batch_hooks


def test_only_an_oracle_point_stopwatch_has_a_per_batch_hook():
    # A per-batch hook on the contenders' stopwatch made tftrain's --steps-per-execution auto keep 1.
    assert batch_hooks([harness._stopwatch()]) == []
    assert batch_hooks([harness._stopwatch(stop_slower_than=10.0, batches=64)]) == ["EpochStopwatch.on_train_batch_end"]
    assert batch_hooks([harness._stopwatch(stop_slower_than=math.inf, batches=64)]) == []


def test_a_kept_run_gives_each_round_its_oracle_points_and_its_other_thread_settings(tmp_path):
    def point(model, round_, intra, inter, spe):
        return {"model": model, "round": round_, "intra_op": intra, "inter_op": inter, "execution": "graph",
                "steps_per_execution": spe, "examples_per_sec": 1.0}

    kept = [point("mlp", 0, 0, 0, 8), point("mlp", 1, 0, 0, 32), point("mlp", 0, 1, 1, 8)]
    path = tmp_path / "zoo.json"
    path.write_text(json.dumps({"data": {"points": kept}}))
    new = [{"intra_op": 0, "inter_op": 0, "round": r, "models": {"mlp": {"grid": [], "keras": {"r": r}}}}
           for r in (1, 0)]
    merged = harness.with_kept_oracle(new, path)
    assert [w["models"]["mlp"]["grid"] for w in merged[:2]] == [[kept[1]], [kept[0]]]
    assert merged[0]["models"]["mlp"]["keras"] == {"r": 1} and len(merged) == 3
    assert (merged[2]["intra_op"], merged[2]["round"], merged[2]["models"]["mlp"]["grid"]) == (1, 0, [kept[2]])


def test_an_oracle_timed_on_another_machine_or_unreadable_is_refused_in_one_line(tmp_path):
    import subprocess
    import sys

    from benchmarks import common
    from tests.conftest import REPO

    here = common.machine_info()
    elsewhere = tmp_path / "zoo.json"
    elsewhere.write_text(json.dumps({"machine": {"cpu": "Another CPU", "cores": here["cores"]}, "data": {"points": []}}))
    fewer_cores = tmp_path / "cores.json"
    fewer_cores.write_text(json.dumps({"machine": {"cpu": here["cpu"], "cores": here["cores"] + 1}}))
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    for path, said in ((elsewhere, "was timed on Another CPU"), (fewer_cores, f"({here['cores'] + 1} cores)"),
                       (broken, "cannot be read as a zoo result"), (listed, "cannot be read as a zoo result"),
                       (tmp_path / "missing.json", "cannot be read as a zoo result")):
        done = subprocess.run([sys.executable, "-m", "benchmarks.zoo", "--quick", "--oracle-from", str(path),
                               "--out", str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    from benchmarks.zoo import check_oracle_host

    check_oracle_host(elsewhere, {"machine": {"cpu": here["cpu"], "cores": here["cores"]}}, here)  # the same machine
