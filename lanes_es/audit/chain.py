"""The audit chain of a batch's log: does every event still say what it said when it was sealed?

Each event carries `digest = sha256(previous digest + canonical bytes of the event
without its digest)`, the first chaining from "". A stored log is verified on its
STORED form (`verify_stored`): each link is recomputed from the JSON as written
(`sealed_bytes`), not from the event decoded from it. Decoding runs upcasters and
ignores keys the class does not know, so a link recomputed from a decoded event
would break on every old event an upcaster reshapes, and would not see a key
added to a row afterwards (see docs/adr/0001-event-schema-changes.md).
`verify_chain` recomputes the links of events that were never stored (a live
aggregate's pending events); `verify_rows` checks what the chain alone cannot
show: that the rows are numbered 1, 2, 3, ... with no hole, and that each row holds
the event its key names. A break names the first bad version and the rule it broke.

The chain proves that no event in the middle was edited, removed or moved. Removing
the newest events leaves a shorter chain that still holds; compare the printed head
digest with one kept elsewhere to see that.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, NamedTuple, Sequence

import msgspec
from eventsourcing.persistence import StoredEvent
from eventsourcing.utils import resolve_topic

from lanes_es.adapters.store import NullTranscoder, StructMapper, state_bytes
from lanes_es.domain.events import canonical_bytes

_CANONICAL = msgspec.json.Encoder(order="sorted")
# Keys of the stored form that are not part of the sealed event: the link itself, and the
# schema version the store adds for a class past v1 (events.canonical_bytes hashes neither).
_UNSEALED_KEYS = ("digest",)  # class_version is sealed: relabelling a row must break its link

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
LOG_CUT_SHORT = "log_cut_short"  # against the size anchored on this machine (`verify`'s checkpoint check says it too)
ANCHORED_DIGEST_MISMATCH = "anchored_digest_mismatch"


class ChainBreak(msgspec.Struct, frozen=True, kw_only=True):
    """One place where the log no longer holds together."""

    version: int
    rule: str
    message: str

    def describe(self) -> str:
        return f"version {self.version}: {self.rule}: {self.message}"


class Link(NamedTuple):
    """One event as the chain sees it: who and where, its sealed bytes, and the digest it carries."""

    originator_id: str
    version: int
    name: str
    sealed: bytes
    digest: str


def verify_chain(events: Sequence[Any]) -> list[ChainBreak]:
    """Every break in the versions and digests of one aggregate's events, oldest first.

    The links are recomputed from the events themselves, which is right for events
    that were never stored. A log read from a store or an export is checked on its
    stored form instead (`verify_stored`, `verify_stored_chain`).
    """
    return verify_links([Link(event.originator_id, event.originator_version, event.name, canonical_bytes(event),
                              event.digest) for event in events])


def verify_links(links: Sequence[Link]) -> list[ChainBreak]:
    """The walk both forms share (`_ChainWalk`), over links in memory."""
    walk = _ChainWalk()
    for link in links:
        walk.step(*link)
    return walk.finish()


class _ChainWalk:
    """The links one at a time, so a log read a page at a time is checked as it streams. After a break it
    goes on from the stored digest, so one edited event is reported once and the events after it are
    still checked against each other.
    """

    def __init__(self) -> None:
        self.breaks: list[ChainBreak] = []
        self.originator: str | None = None
        self.previous_digest = ""
        self.previous_version = FIRST_VERSION - 1
        self.links = 0

    def step(self, originator_id: str, version: int, name: str, sealed: bytes, digest: str) -> None:
        self.links += 1
        if self.originator is None:
            self.originator = originator_id
        link_checked = True
        if originator_id != self.originator:
            self.breaks.append(ChainBreak(version=version, rule=FOREIGN_EVENT,
                                          message=f"event of {originator_id} inside the log of {self.originator}"))
        previous_version = self.previous_version
        if version <= previous_version:
            self.breaks.append(ChainBreak(version=version, rule=VERSION_ORDER,
                                          message=f"version {version} follows version {previous_version}"))
            link_checked = False
        elif version != previous_version + 1:
            self.breaks.append(_gap(previous_version, version))
            link_checked = False  # the missing event's digest is the link; the gap already says so
        if link_checked:
            expected = hashlib.sha256(self.previous_digest.encode() + sealed).hexdigest()
            if expected != digest:
                self.breaks.append(ChainBreak(
                    version=version, rule=DIGEST_MISMATCH,
                    message=f"{name} does not match its digest (recomputed {expected[:12]}, "
                            f"stored {digest[:12] or 'nothing'}): it was changed after it was sealed"))
        self.previous_digest = digest
        self.previous_version = max(previous_version, version)

    def finish(self) -> list[ChainBreak]:
        if not self.links:
            return [ChainBreak(version=FIRST_VERSION, rule=EMPTY_LOG, message="the log holds no event")]
        return self.breaks


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
    check = StoredLogCheck()
    for row, event in zip(rows, events):
        check.check_row(row, event)
    return check.row_breaks


# ---------------------------------------------------------------- the stored form


def sealed_bytes(row: StoredEvent) -> bytes:
    """The bytes the event in `row` was sealed with, recomputed from the row as written.

    The store writes the whole event as sorted, compact JSON (plus `class_version` past
    v1); `events.canonical_bytes` is the same JSON, `class_version` included, without the
    digest and with the class name as `event`. Taking that from the stored JSON, not from the decoded event, keeps
    the link of an old event whole after an upcaster reshaped it on read, and makes any
    key added to or removed from a row a change the chain sees. `ValueError` when the
    row's state is not a JSON object.
    """
    return sealed_link(row)[0]


def sealed_link(row: StoredEvent) -> tuple[bytes, str]:
    """`sealed_bytes` and the digest the row carries ("" when none can be read), from one decode of the row."""
    try:
        fields = msgspec.json.decode(state_bytes(row))
    except msgspec.DecodeError as error:
        raise ValueError(f"not JSON ({error})") from None
    if not isinstance(fields, dict):
        raise ValueError("not a JSON object")
    digest = fields.pop("digest", None)  # _UNSEALED_KEYS
    fields["event"] = _class_name(row.topic)
    return _CANONICAL.encode(fields), digest if isinstance(digest, str) else ""


def stored_digest(row: StoredEvent) -> str:
    """The digest a row carries, or "" when it carries none that can be read."""
    try:
        return sealed_link(row)[1]
    except ValueError:
        return ""


_CLASS_NAMES: dict[str, str] = {}


def _class_name(topic: str) -> str:
    """`module:Outer.Name` -> `Name`, the `type(event).__name__` the event was sealed with."""
    name = _CLASS_NAMES.get(topic)
    if name is None:
        name = _CLASS_NAMES[topic] = topic.rpartition(":")[2].rpartition(".")[2]
    return name


class StoredLogCheck:
    """Every check of a batch's stored rows, a row at a time, so a log can be checked as it streams.

    `feed(row)` decodes the row (None when it does not decode: a break) and checks it: its
    numbering, the event it holds against its key, and its link in the digest chain on its stored
    form. `breaks()` gives every break found, oldest first, a version named by the row checks not
    named again by the chain. A row whose state is not a JSON object has no link to check, and the
    row after it has no previous digest to check against; both stay unchecked by the chain, since
    the row is already named as undecodable.
    """

    def __init__(self) -> None:
        self.undecodable: list[ChainBreak] = []
        self.row_breaks: list[ChainBreak] = []
        self._previous_version = FIRST_VERSION - 1
        self._walk = _ChainWalk()
        self._unreadable: set[int] = set()
        self._mapper = StructMapper(NullTranscoder())
        self._decoders: dict[str, Any] = {}

    def feed(self, row: StoredEvent) -> Any | None:
        event = self.decode(row)
        self.check_row(row, event)
        return event

    def decode(self, row: StoredEvent) -> Any | None:
        """The row's event with the store's own decoding; a row that does not decode is a break, not a crash."""
        try:
            if row.topic not in self._decoders:
                cls = resolve_topic(row.topic)
                # a class past v1 goes through the mapper (None here), which runs its upcasters
                self._decoders[row.topic] = (msgspec.json.Decoder(cls).decode
                                             if getattr(cls, "class_version", 1) == 1 else None)
            decoder = self._decoders[row.topic]
            return self._mapper.to_domain_event(row) if decoder is None else decoder(state_bytes(row))
        except Exception as error:  # a tampered row may fail anywhere in decoding; name it, go on
            cause = getattr(error, "cause", error)
            self.undecodable.append(ChainBreak(version=row.originator_version, rule=UNDECODABLE,
                                               message=f"the stored {_class_name(row.topic)} does not decode: {cause}"))
            return None

    def check_row(self, row: StoredEvent, event: Any | None) -> None:
        version = row.originator_version
        previous_version = self._previous_version
        if version <= previous_version:
            self.row_breaks.append(ChainBreak(version=version, rule=VERSION_ORDER,
                                              message=f"row {version} follows row {previous_version}"))
        elif version != previous_version + 1:
            self.row_breaks.append(_gap(previous_version, version))
        self._previous_version = max(previous_version, version)
        if event is not None and (event.originator_id != row.originator_id or event.originator_version != version):
            self.row_breaks.append(ChainBreak(
                version=version, rule=ROW_MISMATCH,
                message=f"the row of {row.originator_id} version {version} holds the event of "
                        f"{event.originator_id} version {event.originator_version}"))
        try:
            sealed, digest = sealed_link(row)
        except ValueError:
            self._unreadable.add(version)
            return
        self._walk.step(row.originator_id, version, _class_name(row.topic), sealed, digest)

    @property
    def broken(self) -> bool:
        """Whether a break was found so far (cheap: a reader stops folding at the first one)."""
        return bool(self.undecodable or self.row_breaks or self._walk.breaks)

    def chain_breaks(self) -> list[ChainBreak]:
        if not self._walk.links:
            return [] if self._unreadable else self._walk.finish()
        return [found for found in self._walk.finish() if found.version not in self._unreadable]

    def breaks(self) -> list[ChainBreak]:
        breaks = [*self.undecodable, *self.row_breaks]
        named = {found.version for found in breaks}
        breaks.extend(found for found in self.chain_breaks() if found.version not in named)
        breaks.sort(key=lambda found: found.version)
        return breaks


def verify_stored_chain(rows: Sequence[StoredEvent]) -> list[ChainBreak]:
    """The digest chain of stored rows, on their stored form (`StoredLogCheck`)."""
    check = StoredLogCheck()
    for row in rows:
        check.check_row(row, None)
    return check.chain_breaks()


def decode_rows(rows: Iterable[StoredEvent]) -> tuple[list[StoredEvent], list[Any | None], list[ChainBreak]]:
    """Decode each row with the store's own decoding; a row that does not decode is a break, not a crash."""
    check = StoredLogCheck()
    kept = list(rows)
    events = [check.decode(row) for row in kept]
    return kept, events, check.undecodable


def verify_stored(rows: Iterable[StoredEvent]) -> tuple[list[Any], list[ChainBreak]]:
    """The decoded events of a store's rows and every break found in rows and chain.

    A version named by the row checks is not named again by the chain check, so a
    deleted event is one finding, not two.
    """
    check = StoredLogCheck()
    events = [event for event in map(check.feed, rows) if event is not None]
    return events, check.breaks()


def stored_breaks(rows: Sequence[StoredEvent], decoded: Sequence[Any | None],
                  found: Sequence[ChainBreak] = ()) -> list[ChainBreak]:
    """The breaks of stored rows (numbering, row against event, the chain on the stored form), oldest first.

    `found` are breaks already named (rows that did not decode); a version named once is not named again.
    """
    check = StoredLogCheck()
    check.undecodable.extend(found)
    for row, event in zip(rows, decoded):
        check.check_row(row, event)
    return check.breaks()


def anchored_breaks(count: int, at_size: Any, tip: tuple[int, str] | None) -> list[ChainBreak]:
    """A log of `count` events against what this machine anchored of it (`tip`: the size and the chain digest
    of the event at that size, `at_size` that event's row): as long at least, and the same event at that size."""
    if tip is None:
        return []
    size, digest = tip
    if count < size:
        return [ChainBreak(version=count + 1, rule=LOG_CUT_SHORT,
                           message=f"the log holds {count} events but {size} were anchored (signed in its "
                                   f"checkpoint): the newest {size - count} were removed")]
    if digest and at_size is not None and stored_digest(at_size) != digest:
        return [ChainBreak(version=size, rule=ANCHORED_DIGEST_MISMATCH,
                           message=f"the event at the anchored size {size} is not the one anchored (its chain digest "
                                   f"was {digest[:12]}): the log was rewritten after it was checkpointed")]
    return []
