"""When a parameter-server job's worker and ps tasks stop serving (tftrain/runtime/server.py).

The pure parts (`ChiefWatch`, `wait_for_status`, `telling_servers`' verdict) run here
with fakes; real processes are in tests/integration/test_parameter_server_exit.py.
"""

from __future__ import annotations

import io

import pytest

from tftrain.errors import JobFailed
from tftrain.runtime import server
from tftrain.runtime.cluster import validate_cluster

CHIEF = "10.0.0.1:2222"
CLUSTER = validate_cluster({"chief": [CHIEF], "worker": ["10.0.0.2:2222"], "ps": ["10.0.0.3:2222"]}, "chief", 0)


def test_chief_watch_gives_up_on_a_chief_that_never_appears():
    watch = server.ChiefWatch(CHIEF, started=100.0, wait_s=10, gone_s=3)
    assert watch.check(109.0, reachable=False) is None
    reason = watch.check(110.5, reachable=False)
    assert reason.startswith(f"the chief at {CHIEF} did not appear within 10 s")


def test_chief_watch_gives_up_on_a_chief_gone_for_gone_s():
    watch = server.ChiefWatch(CHIEF, started=0.0, wait_s=10, gone_s=3)
    assert watch.check(50.0, reachable=True) is None  # late, but it appeared: wait_s no longer applies
    assert watch.check(52.0, reachable=False) is None
    assert watch.check(53.0, reachable=True) is None  # back: the gone clock restarts
    assert watch.check(55.5, reachable=False) is None
    reason = watch.check(56.5, reachable=False)
    assert reason.startswith(f"the chief at {CHIEF} went away without saying how the job ended")


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1.0
        return self.now


def test_wait_for_status_returns_the_status_the_chief_sent():
    replies = iter([None, None, server.JOB_FINISHED])
    seen = []
    watch = server.ChiefWatch(CHIEF, started=0.0, wait_s=100, gone_s=100)
    status = server.wait_for_status(lambda timeout_s: next(replies), watch,
                                    is_reachable=lambda address: seen.append(address) or True, clock=_Clock())
    assert status == server.JOB_FINISHED and seen == [CHIEF, CHIEF]


def test_wait_for_status_raises_job_failed_when_the_watch_gives_up():
    watch = server.ChiefWatch(CHIEF, started=0.0, wait_s=2.5, gone_s=100)
    with pytest.raises(JobFailed, match="did not appear within 2.5 s"):
        server.wait_for_status(lambda timeout_s: None, watch, is_reachable=lambda address: False, clock=_Clock())


def test_a_status_that_arrives_as_the_chief_leaves_still_counts():
    replies = iter([None, server.JOB_FAILED])  # the last look, after the watch gave up
    watch = server.ChiefWatch(CHIEF, started=0.0, wait_s=0.5, gone_s=100)
    status = server.wait_for_status(lambda timeout_s: next(replies), watch, is_reachable=lambda address: False,
                                    clock=_Clock())
    assert status == server.JOB_FAILED


def test_chief_reachable_is_a_tcp_connect():
    import socket

    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        assert server.chief_reachable(address)
    assert not server.chief_reachable(address)


def _told(monkeypatch, missed=()):
    sent = []
    monkeypatch.setattr(server, "tell_servers", lambda cluster, status: sent.append(status) or list(missed))
    return sent


def test_telling_servers_sends_finished_after_a_run_that_ended_normally(monkeypatch):
    sent = _told(monkeypatch)
    with server.telling_servers(CLUSTER):
        assert sent == []  # not before the run's end
    assert sent == [server.JOB_FINISHED]


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_telling_servers_sends_failed_and_reraises(monkeypatch, error):
    sent = _told(monkeypatch)
    with pytest.raises(type(error)):
        with server.telling_servers(CLUSTER):
            raise error
    assert sent == [server.JOB_FAILED]


@pytest.mark.parametrize("signame, status", [("SIGTERM", 2), ("SIGUSR1", 3)])
def test_telling_servers_sends_stopped_by_the_chief_s_signal_and_reraises(monkeypatch, signame, status):
    """The servers learn which signal stopped the chief, so that they exit with its code (143 or 138)."""
    import signal

    from tftrain.errors import Preempted

    signum = getattr(signal, signame)
    sent = _told(monkeypatch, missed=["ps:0"])
    log = io.StringIO()
    with pytest.raises(Preempted):
        with server.telling_servers(CLUSTER, log=log):
            raise Preempted(f"stopped by {signame}: checkpoint saved", signum)
    assert sent == [status] and log.getvalue() == "chief:0: could not tell ps:0 that the job stopped\n"
    assert server.stopped_signal(status) == signum  # what a server raises Preempted with: exit 128 + signum
    assert server.stopped_signal(server.JOB_FINISHED) is None and server.stopped_signal(server.JOB_FAILED) is None


def test_telling_servers_names_the_tasks_it_could_not_reach(monkeypatch):
    _told(monkeypatch, missed=["worker:0"])
    log = io.StringIO()
    with server.telling_servers(CLUSTER, log=log):
        pass
    assert log.getvalue() == "chief:0: could not tell worker:0 that the job finished\n"


def test_telling_servers_tells_nobody_without_servers(monkeypatch):
    sent = _told(monkeypatch)
    with server.telling_servers(None):
        pass
    with server.telling_servers(validate_cluster({"worker": ["10.0.0.2:2222", "10.0.0.3:2222"]}, "worker", 0)):
        pass
    assert sent == []


def test_serve_refuses_a_cluster_without_a_chief():
    from tftrain.errors import ClusterConfigError

    cluster = validate_cluster({"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}, "worker", 0)
    with pytest.raises(ClusterConfigError, match="needs a chief task; the TF_CONFIG cluster has none"):
        server.serve(cluster)
