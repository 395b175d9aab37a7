"""`python -m benchmarks.fault_campaign --quick`: one real training process killed by SIGKILL at a random
moment after its first checkpoint, and one at each chosen moment (inside a save, after model.keras, after
metrics.json, two SIGTERMs, SIGHUP), each rerun until it finishes, and judged by the campaign's own checks (it
resumed at or after the newest checkpoint, every optimizer step ran once, nothing is left running, the exit code
is the documented one). The lines a resumed run prints are checked in tests/unit/train/test_checkpoints.py."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, SUBPROCESS_ENV

pytestmark = pytest.mark.integration


@pytest.mark.timeout(1500)
def test_quick_campaign_trials_lose_nothing_beyond_the_backup_interval(tmp_path):
    import os

    env = {**{k: v for k, v in os.environ.items() if k != "TF_CONFIG"}, **SUBPROCESS_ENV}
    done = subprocess.run([sys.executable, "-m", "benchmarks.fault_campaign", "--quick", "--out", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1400)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "fault_campaign.json").read_text())
    record, *moments = result["data"]["records"]
    assert record["kind"] == "single" and record["signal"] == "SIGKILL" and record["exit_code"] == -9
    assert record["reruns"] == 1 and record["resumed_at"] is not None, record
    assert record["checkpoint_seen"] <= record["resumed_at"] <= 256  # the newest checkpoint at the kill, or later
    assert record["checks"] == {"finished": True, "no_process_left": True, "every_step_once": True,
                                "lost_at_most_the_interval": True, "accuracy_within_1_point": True}, record
    assert [(m["signal"], m["moment"]) for m in moments] == [
        ("SIGKILL", "inside a save"), ("SIGKILL", "after model.keras"), ("SIGKILL", "after metrics.json"),
        ("SIGTERM x2", "in training"), ("SIGHUP", "in training")]
    for m in moments:
        assert not m["missed"] and m["passed"], (m["moment"], m["checks"], m["exit_code"], m["reruns"], m["tail"])
        assert m["checks"]["exit_code_told"] and m["checks"]["no_checkpoint_left"], m
    assert result["summary"] == {"trials": 6, "passed": 6}
    assert "| single | SIGKILL | inside a save |" in (tmp_path / "fault_campaign.md").read_text()
