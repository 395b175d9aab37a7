"""`python -m benchmarks.fault_campaign --quick`: one real training process killed by SIGKILL at a random
moment after its first checkpoint, rerun until it finishes, and judged (the campaign's own checks: it resumed at
or after the newest checkpoint, every optimizer step ran once, nothing is left running). This is the recipe's
SIGKILL-mid-epoch test; the lines a resumed run prints are checked in tests/unit/train/test_checkpoints.py."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, SUBPROCESS_ENV

pytestmark = pytest.mark.integration


@pytest.mark.timeout(600)
def test_quick_campaign_trial_loses_nothing_beyond_the_backup_interval(tmp_path):
    import os

    env = {**{k: v for k, v in os.environ.items() if k != "TF_CONFIG"}, **SUBPROCESS_ENV}
    done = subprocess.run([sys.executable, "-m", "benchmarks.fault_campaign", "--quick", "--out", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=560)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "fault_campaign.json").read_text())
    [record] = result["data"]["records"]
    assert record["kind"] == "single" and record["signal"] == "SIGKILL" and record["exit_code"] == -9
    assert record["reruns"] == 1 and record["resumed_at"] is not None, record
    assert record["checkpoint_seen"] <= record["resumed_at"] <= 256  # the newest checkpoint at the kill, or later
    assert record["checks"] == {"finished": True, "no_process_left": True, "every_step_once": True,
                                "lost_at_most_the_interval": True, "accuracy_within_1_point": True}, record
    assert result["summary"] == {"trials": 1, "passed": 1}
    assert "| single | SIGKILL |" in (tmp_path / "fault_campaign.md").read_text()
