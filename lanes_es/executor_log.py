"""The use case that records an Executor attempt's facts in its batch's log, under the batch lock like a tick.

Only the coordinator appends to a batch's log: the autopilot records each attempt it starts and
how each ended through this, never the attempt's own process. `change(batch, now)` is one of the
aggregate's audit-only commands (start_executor_run, finish_executor_run, kill_executor_run); the
lock is waited for up to `wait` seconds, then StoreConflict (BatchLockHeld) says the batch is
busy and nothing was written: the autopilot tries again on its next round. The signed checkpoint
is brought up by the next tick (which anchors the whole log) or at the end of the run.
"""

from __future__ import annotations

from typing import Callable

from lanes_es.adapters.store import EventStore
from lanes_es.domain.batch import LaneBatch
from lanes_es.errors import Refusal

RECORD_WAIT = 10.0


class BatchNotFound(Refusal):
    """The batch to record in is not in the store."""


def record_executor_facts(store: EventStore, now: Callable[[], str], batch_id: str,
                          change: Callable[[LaneBatch, str], None], *, wait: float = RECORD_WAIT) -> LaneBatch:
    with store.batch_lock(batch_id, wait=wait):
        batch = store.batch(batch_id)
        if batch is None:
            raise BatchNotFound(f"batch_not_found: no batch {batch_id} in the store {store.shown_url}")
        change(batch, now())
        store.save(batch)
    return batch
