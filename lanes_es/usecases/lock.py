"""The batch lock (upstream's): one tick, retire or authorization of a batch at a time; held past the wait,
the busy outcome."""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Any, Iterator

from lanes_es.adapters.store import BatchLockHeld, EventStore, StoreConflict, describe_holder
from lanes_es.errors import ServiceError

# How long a tick waits for another tick of its batch to end before it reports busy.
DEFAULT_LOCK_WAIT = 5.0


class BatchBusy(ServiceError, StoreConflict):
    """Another tick holds the batch lock: an outcome, not an error. Nothing was read for writing and
    nothing was written; the caller ticks again shortly (or waits longer with `wait`).

    A ServiceError (the command line refuses with exit 2) and a StoreConflict (callers that retry
    on store contention keep doing so).
    """

    def __init__(self, batch_id: str, holder: dict[str, Any] | None, waited: float) -> None:
        self.batch_id = batch_id
        self.holder = holder
        self.waited = waited
        ServiceError.__init__(self, "batch_busy",
                              f"batch {batch_id} is busy: its lock is held by {describe_holder(holder)}; nothing was "
                              f"written (waited {waited:g} s); tick again shortly, or wait longer with --wait SECONDS")

    def report(self) -> dict[str, Any]:
        """The `--json` and MCP form of a busy refusal."""
        return {"outcome": "busy", "batch_id": self.batch_id, "holder": self.holder, "waited_seconds": self.waited,
                "reason": "batch_busy", "message": self.detail,
                "next_action": "tick again shortly; `lanes-es tick SLUG --wait SECONDS` waits for the lock"}


@contextmanager
def locked(store: EventStore, name: str, wait: float) -> Iterator[None]:
    """The lock `name` (a batch id, or an Initiative's lock name), its refusal turned into the busy outcome."""
    lock = ExitStack()
    try:
        lock.enter_context(store.batch_lock(name, wait=wait))
    except BatchLockHeld as held:
        raise BatchBusy(name, held.holder, wait) from None
    with lock:
        yield
