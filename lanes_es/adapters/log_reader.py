"""A batch's log read a page at a time, for rebuilds that must not hold a whole log in memory.

Rows are decoded with one msgspec Decoder per event class (the mapper's path, without its
per-row topic lookup); a class past schema version 1 goes through the mapper, which runs
its upcasters.
"""

from __future__ import annotations

from typing import Any, Iterator

import msgspec
from eventsourcing.utils import resolve_topic

PAGE = 2000


class EventDecoder:
    def __init__(self, mapper: Any) -> None:
        self.mapper = mapper
        self.decoders: dict[str, Any] = {}

    def __call__(self, row: Any) -> Any:
        decoder = self.decoders.get(row.topic)
        if decoder is None:
            cls = resolve_topic(row.topic)
            decoder = self.decoders[row.topic] = (
                msgspec.json.Decoder(cls).decode if getattr(cls, "class_version", 1) == 1 else None)
        if decoder is None:
            return self.mapper.to_domain_event(row)
        return decoder(row.state)


def stream_events(store: Any, aggregate_id: str, page: int = PAGE) -> Iterator[Any]:
    """Every event of one aggregate, oldest first, `page` rows in memory at a time."""
    decode = EventDecoder(store.app.mapper)
    for row in stream_rows(store, aggregate_id, page):
        yield decode(row)


def stream_rows(store: Any, aggregate_id: str, page: int = PAGE) -> Iterator[Any]:
    """Every stored row of one aggregate, as written, oldest first, `page` rows in memory at a time."""
    recorder = store.app.recorder
    after: int | None = None
    while True:
        rows = recorder.select_events(aggregate_id, gt=after, limit=page)
        yield from rows
        if len(rows) < page:
            return
        after = rows[-1].originator_version


def newest_version(store: Any, aggregate_id: str) -> int:
    """The version of an aggregate's newest stored row (0 for none): one row read."""
    rows = store.app.recorder.select_events(aggregate_id, desc=True, limit=1)
    return rows[0].originator_version if rows else 0
