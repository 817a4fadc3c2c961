"""What both aggregates share: text ids, event times from the tick, and the audit chain.

eventsourcing's own `trigger_event` stamps the wall clock; here every event takes
its time from the `at` the caller passes (the tick's `now`), so a log replays to
the same projections on any machine, and each event is sealed with the digest
that links it to the one before.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from eventsourcing.domain import BaseAggregate

from .events import CreatedEvent, Event, chain_digest
from .ids import parse_timestamp

T = TypeVar("T", bound="ChainedAggregate")


class TransitionRefused(ValueError):
    """A command whose guard does not hold: no event was triggered."""


class ChainedAggregate(BaseAggregate[str]):
    # The digest of the newest event; class-level so the first event chains from "".
    last_digest = ""

    @classmethod
    def _start(cls: type[T], event_class: type[CreatedEvent], aggregate_id: str, **fields: Any) -> T:
        created = event_class(
            originator_id=aggregate_id, originator_version=cls.INITIAL_VERSION,
            originator_topic=_topic(cls), timestamp=parse_timestamp(fields["at"]), **fields,
        )
        created = msgspec.structs.replace(created, digest=chain_digest("", created))
        aggregate = created.mutate(None)
        aggregate.pending_events.append(created)
        return aggregate

    def trigger_event(self, event_class: type[Event], **fields: Any) -> None:  # type: ignore[override]
        event = event_class(
            originator_id=self.id, originator_version=self.version + 1,
            timestamp=parse_timestamp(fields["at"]), **fields,
        )
        event = msgspec.structs.replace(event, digest=chain_digest(self.last_digest, event))
        event.mutate(self)
        self.pending_events.append(event)

    def apply_fact(self, event: Any) -> None:
        """Every event ends here; subclasses fold it into their state, then call this."""
        self.last_digest = event.digest


def _topic(cls: type) -> str:
    from eventsourcing.utils import get_topic

    return get_topic(cls)
