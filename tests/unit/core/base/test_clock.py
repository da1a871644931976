"""clock.Renewer: the one renewal loop of the engine's lease (clients/control.LeaseKeeper) and a generation's claim
(claim.Keeper)."""

import threading

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.clock import Renewer, wait_for


class Calls:
    def __init__(self, lose_after=None):
        self.count, self.lose_after = 0, lose_after
        self.seen = threading.Event()

    def __call__(self):
        self.count += 1
        self.seen.set()
        return self.lose_after is None or self.count < self.lose_after


def test_it_renews_again_and_again_until_stopped_and_then_never():
    calls = Calls()
    renewer = Renewer(0.01, calls, "test-renewer").start()
    wait_for(lambda: (calls.count >= 3, calls.count), 30, 0.005, what="three renewals")
    renewer.stop(last=lambda: setattr(calls, "last", calls.count))
    stopped_at = calls.count
    assert calls.last == stopped_at
    renewer._timer.join(5)  # a tick already past its wait finds the loop stopped
    assert calls.count == stopped_at


def test_a_renewal_that_reports_the_thing_lost_ends_the_loop():
    calls = Calls(lose_after=2)
    renewer = Renewer(0.01, calls, "test-renewer").start()
    wait_for(lambda: (calls.count >= 2, calls.count), 30, 0.005, what="the losing renewal")
    renewer._timer.join(5)
    assert calls.count == 2 and not renewer._timer.is_alive()


def test_paused_ticks_do_not_call_and_the_loop_goes_on():
    calls = Calls()
    renewer = Renewer(0.01, calls, "test-renewer")
    with renewer.lock:
        renewer.paused = True
    renewer.start()
    ticks = []
    original = renewer._schedule

    def counted():
        ticks.append(1)
        original()
    renewer._schedule = counted
    wait_for(lambda: (len(ticks) >= 3, len(ticks)), 30, 0.005, what="three paused ticks")
    assert calls.count == 0
    with renewer.lock:
        renewer.paused = False
    assert calls.seen.wait(30) and calls.count >= 1
    renewer.stop()
