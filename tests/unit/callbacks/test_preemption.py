"""PreemptionWatch: SIGTERM and SIGUSR1 become a request while open; the previous handlers come back."""

import os
import signal

from tftrain.callbacks import PreemptionWatch


def test_either_signal_is_a_request_while_open_and_the_handlers_come_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        with PreemptionWatch() as watch:
            assert watch.requested() is None
            os.kill(os.getpid(), signum)  # handled at once, in this (the main) thread
            assert watch.requested() == signum
        assert {s: signal.getsignal(s) for s in before} == before
