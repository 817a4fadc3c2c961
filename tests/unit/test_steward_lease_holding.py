"""This run's lease: taken, waited for, confirmed before each round of moves, lost when another took it."""

from __future__ import annotations

import pytest

from lanes_es.adapters.steward_lease import LeaseHolder, StewardLeases, new_holder
from lanes_es.steward.lease import LeaseLost, StewardBusy, StewardLease


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def other_machines(slug: str) -> LeaseHolder:
    mine = new_holder(f"steward:{slug}")
    return LeaseHolder(mine.scope, mine.token, 77, "elsewhere", mine.since, 0.0)


def test_a_held_lease_is_waited_for_then_refused_naming_its_holder():
    leases, clock, told = StewardLeases("memory:"), Clock(), []
    other = other_machines("waits")
    assert leases.take(other, 3600) is None
    lease = StewardLease(leases, "waits", clock=clock, sleep=clock.sleep)
    with pytest.raises(StewardBusy) as refused:
        lease.take(wait=2.0, on_wait=told.append)
    assert refused.value.code == "steward_busy" and refused.value.holder.token == other.token
    assert "after waiting 2s: pid 77 on host elsewhere" in str(refused.value)
    assert [holder.pid for holder in told] == [77]  # said once, not once per look
    assert clock.now == 2.0
    leases.give_back(other)


def test_a_lease_taken_over_is_lost_and_the_run_stops_before_its_next_move():
    leases = StewardLeases("memory:")
    lease = StewardLease(leases, "lost", seconds=3600, renew_every=3600)
    lease.take()
    lease.confirm()  # still this run's
    successor = other_machines("lost")
    leases.backend.leases["steward:lost"] = LeaseHolder(successor.scope, successor.token, 77, "elsewhere",
                                                        successor.since, 1e12)  # it expired; another took it
    with pytest.raises(LeaseLost):
        lease.confirm()
    with pytest.raises(LeaseLost):  # and stays lost
        lease.confirm()
    lease.give_back()
    assert leases.holder("steward:lost").token == successor.token  # a lost lease is not given back
    leases.give_back(successor)
