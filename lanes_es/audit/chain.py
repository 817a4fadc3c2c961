"""The audit chain of a batch's log: does every event still say what it said when it was sealed?

Each event carries `digest = sha256(previous digest + canonical bytes of the event
without its digest)`, the first chaining from "". `verify_chain` recomputes every link
from the decoded events; `verify_rows` checks what decoding alone cannot show: that
the stored rows are numbered 1, 2, 3, ... with no hole, and that each row holds the
event its key names. A break names the first bad version and the rule it broke.

The chain proves that no event in the middle was edited, removed or moved. Removing
the newest events leaves a shorter chain that still holds; compare the printed head
digest with one kept elsewhere to see that.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import msgspec
from eventsourcing.persistence import StoredEvent

from lanes_es.adapters.store import NullTranscoder, StructMapper
from lanes_es.domain.events import chain_digest

FIRST_VERSION = 1

# The rules, by the names `verify` prints.
FIRST_VERSION_RULE = "first_version"
VERSION_GAP = "version_gap"
VERSION_ORDER = "version_order"
FOREIGN_EVENT = "foreign_event"
DIGEST_MISMATCH = "digest_mismatch"
ROW_MISMATCH = "row_mismatch"
UNDECODABLE = "undecodable"
EMPTY_LOG = "empty_log"


class ChainBreak(msgspec.Struct, frozen=True, kw_only=True):
    """One place where the log no longer holds together."""

    version: int
    rule: str
    message: str

    def describe(self) -> str:
        return f"version {self.version}: {self.rule}: {self.message}"


def verify_chain(events: Sequence[Any]) -> list[ChainBreak]:
    """Every break in the versions and digests of one aggregate's events, oldest first.

    After a break the walk goes on from the stored digest, so one edited event is
    reported once and the events after it are still checked against each other.
    """
    if not events:
        return [ChainBreak(version=FIRST_VERSION, rule=EMPTY_LOG, message="the log holds no event")]
    breaks: list[ChainBreak] = []
    originator = events[0].originator_id
    previous_digest = ""
    previous_version = FIRST_VERSION - 1
    for event in events:
        version = event.originator_version
        link_checked = True
        if event.originator_id != originator:
            breaks.append(ChainBreak(version=version, rule=FOREIGN_EVENT,
                                     message=f"event of {event.originator_id} inside the log of {originator}"))
        if version <= previous_version:
            breaks.append(ChainBreak(version=version, rule=VERSION_ORDER,
                                     message=f"version {version} follows version {previous_version}"))
            link_checked = False
        elif version != previous_version + 1:
            breaks.append(_gap(previous_version, version))
            link_checked = False  # the missing event's digest is the link; the gap already says so
        if link_checked:
            expected = chain_digest(previous_digest, event)
            if expected != event.digest:
                breaks.append(ChainBreak(
                    version=version, rule=DIGEST_MISMATCH,
                    message=f"{event.name} does not match its digest (recomputed {expected[:12]}, "
                            f"stored {event.digest[:12] or 'nothing'}): it was changed after it was sealed"))
        previous_digest = event.digest
        previous_version = max(previous_version, version)
    return breaks


def _gap(previous_version: int, version: int) -> ChainBreak:
    missing = previous_version + 1
    if previous_version < FIRST_VERSION:
        return ChainBreak(version=missing, rule=FIRST_VERSION_RULE,
                          message=f"the log starts at version {version}, not {FIRST_VERSION}")
    span = f"version {missing}" if version == missing + 1 else f"versions {missing} to {version - 1}"
    return ChainBreak(version=missing, rule=VERSION_GAP,
                      message=f"{span} missing: the log jumps from {previous_version} to {version}")


def chain_head(events: Sequence[Any]) -> str:
    """The digest of the newest event: the whole log in one value."""
    return events[-1].digest if events else ""


# ---------------------------------------------------------------- the stored rows


def verify_rows(rows: Sequence[StoredEvent], events: Sequence[Any | None]) -> list[ChainBreak]:
    """Row numbering, and each row against the event decoded from it (`None` if it did not decode).

    A row whose key says version 5 but whose state is version 6 was swapped or
    copied; only the raw rows show that, since decoding reads the version from the state.
    """
    breaks: list[ChainBreak] = []
    previous_version = FIRST_VERSION - 1
    for row, event in zip(rows, events):
        version = row.originator_version
        if version <= previous_version:
            breaks.append(ChainBreak(version=version, rule=VERSION_ORDER,
                                     message=f"row {version} follows row {previous_version}"))
        elif version != previous_version + 1:
            breaks.append(_gap(previous_version, version))
        previous_version = max(previous_version, version)
        if event is not None and (event.originator_id != row.originator_id
                                  or event.originator_version != version):
            breaks.append(ChainBreak(
                version=version, rule=ROW_MISMATCH,
                message=f"the row of {row.originator_id} version {version} holds the event of "
                        f"{event.originator_id} version {event.originator_version}"))
    return breaks


def decode_rows(rows: Iterable[StoredEvent]) -> tuple[list[StoredEvent], list[Any | None], list[ChainBreak]]:
    """Decode each row with the store's own mapper; a row that does not decode is a break, not a crash."""
    mapper = StructMapper(NullTranscoder())
    kept = list(rows)
    events: list[Any | None] = []
    breaks: list[ChainBreak] = []
    for row in kept:
        try:
            events.append(mapper.to_domain_event(row))
        except Exception as error:  # a tampered row may fail anywhere in decoding; name it, go on
            events.append(None)
            breaks.append(ChainBreak(version=row.originator_version, rule=UNDECODABLE,
                                     message=f"the stored {row.topic.rpartition(':')[2]} does not decode: {error}"))
    return kept, events, breaks


def verify_stored(rows: Iterable[StoredEvent]) -> tuple[list[Any], list[ChainBreak]]:
    """The decoded events of a store's rows and every break found in rows and chain.

    A version named by the row checks is not named again by the chain check, so a
    deleted event is one finding, not two.
    """
    kept, decoded, breaks = decode_rows(rows)
    breaks.extend(verify_rows(kept, decoded))
    events = [event for event in decoded if event is not None]
    if not kept:
        return events, verify_chain(events)
    named = {found.version for found in breaks}
    breaks.extend(found for found in verify_chain(events) if found.version not in named)
    breaks.sort(key=lambda found: found.version)
    return events, breaks
