"""The use case that records an Executor attempt's facts in its batch's log, under the batch lock like a tick.

Only the coordinator appends to a batch's log: the autopilot records each attempt it starts and
how each ended through this, never the attempt's own process. `change(batch, now)` is one of the
aggregate's audit-only commands (start_executor_run, finish_executor_run, kill_executor_run); the
lock is waited for up to `wait` seconds, then StoreConflict (BatchLockHeld) says the batch is
busy and nothing was written: the autopilot tries again on its next round. After the save the
signed checkpoint is brought up to the log (`after_save`), as after a tick.
"""

from __future__ import annotations

from typing import Any, Callable

from lanes_es.adapters.store import EventStore
from lanes_es.domain.batch import LaneBatch
from lanes_es.errors import Refusal

RECORD_WAIT = 10.0


class BatchNotFound(Refusal):
    """The batch to record in is not in the store."""


def record_executor_facts(store: EventStore, now: Callable[[], str], batch_id: str,
                          change: Callable[[LaneBatch, str], None], *, wait: float = RECORD_WAIT,
                          after_save: Callable[[LaneBatch], Any] | None = None) -> LaneBatch:
    with store.batch_lock(batch_id, wait=wait):
        batch = store.batch(batch_id)
        if batch is None:
            raise BatchNotFound(f"batch_not_found: no batch {batch_id} in the store {store.shown_url}")
        change(batch, now())
        store.save(batch)
    if after_save is not None:
        after_save(batch)
    return batch
