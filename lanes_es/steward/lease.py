"""One autopilot per Initiative: this run's steward lease, taken at start, renewed while it runs.

A second `lanes-es run` on an Initiative that has one is refused at start, naming the holder,
or waits for it with `--wait SECONDS`. The lease is renewed by a heartbeat every
RENEW_SECONDS (a long tick does not let it lapse) and confirmed before every round of the
steward's moves, so a run that lost it (it stalled past the expiry and another took over)
stops before it makes a Lane: two stewards never provision the same Lane.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable

from lanes_es.adapters.steward_lease import LeaseHolder, StewardLeases, new_holder
from lanes_es.errors import ServiceError

LEASE_SECONDS = 30.0
RENEW_SECONDS = 10.0
WAIT_POLL_SECONDS = 0.5


class StewardBusy(ServiceError):
    """Another autopilot holds the Initiative's lease."""

    def __init__(self, slug: str, holder: LeaseHolder, waited: float) -> None:
        waited_text = f" after waiting {waited:g}s" if waited else ""
        super().__init__("steward_busy", f"Initiative {slug} already has an autopilot{waited_text}: "
                                         f"{holder.describe()}; let it end (or stop it), or run again with "
                                         f"--wait SECONDS")
        self.holder = holder


class LeaseLost(ServiceError):
    """This run's lease expired and another autopilot took it: this one stops before its next move."""

    def __init__(self, slug: str) -> None:
        super().__init__("steward_lease_lost", f"the steward lease of Initiative {slug} was taken by another "
                                               f"autopilot (this one stalled past its expiry); it goes on from the "
                                               f"log, this one stops without another move")


class StewardLease:
    def __init__(self, leases: StewardLeases, slug: str, *, seconds: float = LEASE_SECONDS,
                 renew_every: float = RENEW_SECONDS, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.leases = leases
        self.slug = slug
        self.me = new_holder(f"steward:{slug}")
        self.seconds = seconds
        self.renew_every = renew_every
        self.clock = clock
        self.sleep = sleep
        self.lost = False
        self.stop = threading.Event()
        self.heartbeat: threading.Thread | None = None

    def take(self, wait: float = 0.0, on_wait: Callable[[LeaseHolder], None] | None = None) -> None:
        """Take the lease, waiting up to `wait` seconds for its holder; StewardBusy when it stays held."""
        started = self.clock()
        told = False
        while (holder := self.leases.take(self.me, self.seconds)) is not None:
            waited = self.clock() - started
            if waited >= wait:
                raise StewardBusy(self.slug, holder, round(waited, 1) if wait else 0.0)
            if not told and on_wait is not None:
                on_wait(holder)
                told = True
            self.sleep(min(WAIT_POLL_SECONDS, wait - waited))
        self.heartbeat = threading.Thread(target=self._beat, name="lanes-es-steward-lease", daemon=True)
        self.heartbeat.start()

    def confirm(self) -> None:
        """Before a round of moves: the lease is still this run's, renewed now; LeaseLost otherwise."""
        if self.lost or not self.leases.renew(self.me, self.seconds):
            self.lost = True
            raise LeaseLost(self.slug)

    def give_back(self) -> None:
        self.stop.set()
        if self.heartbeat is not None:
            self.heartbeat.join()
            self.heartbeat = None
            if not self.lost:
                try:
                    self.leases.give_back(self.me)
                except Exception as error:  # noqa: BLE001 - a full disk or a lost server must not hide why the run ended
                    print(f"lanes-es run: the steward lease of Initiative {self.slug} was not given back ({error}); "
                          f"it passes on by itself: at once on this host (this process is gone), else when it "
                          f"expires", file=sys.stderr)

    def _beat(self) -> None:
        while not self.stop.wait(self.renew_every):
            try:
                if not self.leases.renew(self.me, self.seconds):
                    self.lost = True
                    return
            except Exception:  # a database hiccup: the next beat tries again, well within the expiry
                continue
