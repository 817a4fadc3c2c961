"""A batch's log as JSON Lines, so that another machine can verify it without the store.

One line per event, oldest first: an object with `topic` (the event class, as
eventsourcing names it), `originator_id`, `originator_version` and the event's own
fields, keys sorted, compact UTF-8. A line is the event's STORED form (the row's JSON
as written, `class_version` included past v1) plus its topic, so an export made after
a schema change still carries the bytes each old event was sealed with, and its chain
verifies on another machine (docs/adr/0001-event-schema-changes.md). For an event of
the current schema that is the same line `export_line` makes from the event itself.

Reading an export decodes each line back to its event Struct through the store's own
mapper (so upcasters apply), checks the chain on the lines as written, and refuses a
malformed file with the line number and what is wrong with it.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator

import msgspec
from eventsourcing.persistence import StoredEvent
from eventsourcing.utils import get_topic, resolve_topic

from lanes_es.adapters.files import MiB, size_text
from lanes_es.adapters.store import NullTranscoder, StructMapper, state_bytes
from lanes_es.errors import naming
from lanes_es.domain import events as ev
from lanes_es.projections.batch import fold_documents, materialize

from .chain import ChainBreak, stored_breaks

_ENCODER = msgspec.json.Encoder(order="sorted")
_KNOWN_EVENTS = frozenset(ev.ALL_EVENTS)
# Only topics inside this package are resolved: resolving imports a module, and an export is untrusted.
_TRUSTED_TOPIC_PREFIX = "lanes_es."


# The longest line read as one event: the largest (a BatchPrepared of 4,000 children) is about 1.6 MB.
MAX_LINE_BYTES = 16 * MiB


class ExportError(ValueError):
    """An export file that cannot be read as a batch's log; the message names the line."""


def export_line(event: Any) -> bytes:
    fields = msgspec.to_builtins(event)
    fields["topic"] = get_topic(type(event))
    class_version = getattr(type(event), "class_version", 1)
    if class_version > 1:  # as the store marks it, so a reader does not upcast a current event again
        fields["class_version"] = class_version
    return _ENCODER.encode(fields) + b"\n"


def export_lines(events: Iterable[Any]) -> Iterator[bytes]:
    for event in events:
        yield export_line(event)


def stored_line(row: StoredEvent) -> bytes:
    """The export line of a stored row: its JSON as written, plus its topic."""
    fields = msgspec.json.decode(state_bytes(row))
    fields["topic"] = row.topic
    return _ENCODER.encode(fields) + b"\n"


def stored_lines(rows: Iterable[StoredEvent]) -> Iterator[bytes]:
    for row in rows:
        yield stored_line(row)


def write_export(events: Iterable[Any], path: Path) -> int:
    """Write the export of `events` to `path` (replacing it); returns the number of events written."""
    return write_lines(export_lines(events), path)


def write_lines(lines: Iterable[bytes], path: Path) -> int:
    """Write export lines to `path` (replacing it); returns the number of lines written."""
    count = 0
    with naming(path), open(path, "wb") as handle:
        for line in lines:
            handle.write(line)
            count += 1
    return count


def read_export(path: str | Path) -> list[Any]:
    """The events of an export file, oldest first; `ExportError` on the first malformed line."""
    return read_export_log(path)[0]


def read_export_log(path: str | Path) -> tuple[list[Any], list[ChainBreak]]:
    """The events of an export file and the breaks of its rows and chain, on the lines as written."""
    _, events, breaks = read_export_rows(path)
    return events, breaks


def parse_export(data: bytes, name: str = "export") -> list[Any]:
    return parse_export_log(data, name)[0]


def parse_export_log(data: bytes, name: str = "export") -> tuple[list[Any], list[ChainBreak]]:
    _, events, breaks = parse_export_rows(data, name)
    return events, breaks


def read_export_rows(path: str | Path) -> tuple[list[StoredEvent], list[Any], list[ChainBreak]]:
    """The rows of an export file as written (for the Merkle leaves), its events and its breaks.

    Read a line at a time, each at most MAX_LINE_BYTES: a file that is no export (`/dev/zero`, a disk
    image) is refused at its first line, in bounded memory, instead of being read whole first."""
    try:
        with open(path, "rb") as handle:
            return _rows_of_lines(handle, str(path))
    except OSError as error:
        raise ExportError(f"cannot read the export {path}: {error.strerror or error}") from None


def parse_export_rows(data: bytes, name: str = "export") -> tuple[list[StoredEvent], list[Any], list[ChainBreak]]:
    return _rows_of_lines(io.BytesIO(data), name)


def _rows_of_lines(handle: BinaryIO, name: str) -> tuple[list[StoredEvent], list[Any], list[ChainBreak]]:
    """Each line one event; a blank line is an error once an event follows it or the file ends, a last line
    without its newline is a truncated file, a file of blanks holds no events."""
    mapper = StructMapper(NullTranscoder())
    rows: list[StoredEvent] = []
    events: list[Any] = []
    first_blank: int | None = None
    ends_with_newline = True
    for number, line in enumerate(_lines(handle, name), start=1):
        ends_with_newline = line.endswith(b"\n")
        if not line.strip():
            first_blank = first_blank or number
            continue
        if not ends_with_newline:
            raise ExportError(f"{name} does not end with a newline: the file is truncated")
        if first_blank is not None:
            raise ExportError(f"{name} line {first_blank}: an empty line; each line must be one event")
        row, event = _event_of_line(mapper, line[:-1], f"{name} line {number}")
        if events and event.originator_id != events[0].originator_id:
            raise ExportError(f"{name} line {number}: an event of {event.originator_id} inside the export of "
                              f"{events[0].originator_id}; an export holds one batch's log")
        rows.append(row)
        events.append(event)
    if not rows:
        raise ExportError(f"{name} holds no events")
    if not ends_with_newline:
        raise ExportError(f"{name} does not end with a newline: the file is truncated")
    if first_blank is not None:
        raise ExportError(f"{name} line {first_blank}: an empty line; each line must be one event")
    return rows, events, stored_breaks(rows, events)


def _lines(handle: BinaryIO, name: str) -> Iterator[bytes]:
    """The file's lines (split at newlines only), each at most MAX_LINE_BYTES."""
    number = 0
    while True:
        line = handle.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_LINE_BYTES:
            raise ExportError(f"{name} line {number} is longer than {size_text(MAX_LINE_BYTES)}: no event is; "
                              f"this is not an export of lanes-es")
        yield line


def _event_of_line(mapper: Any, line: bytes, where: str) -> tuple[StoredEvent, Any]:
    if not line.strip():
        raise ExportError(f"{where}: an empty line; each line must be one event")
    try:
        fields = msgspec.json.decode(line)
    except msgspec.DecodeError as error:
        raise ExportError(f"{where}: not JSON ({error})") from None
    except RecursionError:
        raise ExportError(f"{where}: JSON nests too deeply; no event does") from None
    if not isinstance(fields, dict):
        raise ExportError(f"{where}: not a JSON object")
    topic = fields.pop("topic", None)
    if not isinstance(topic, str):
        raise ExportError(f"{where}: no topic naming the event class")
    event_class = _event_class(topic, where)
    originator_id = fields.get("originator_id")
    originator_version = fields.get("originator_version")
    if not isinstance(originator_id, str) or not isinstance(originator_version, int):
        raise ExportError(f"{where}: originator_id must be text and originator_version an integer")
    row = StoredEvent(originator_id=originator_id, originator_version=originator_version, topic=topic,
                      state=_ENCODER.encode(fields))
    try:
        event = mapper.decode(row)
    except (msgspec.ValidationError, msgspec.DecodeError) as error:
        raise ExportError(f"{where}: not a valid {event_class.__name__} ({error})") from None
    except (AttributeError, KeyError, TypeError, ValueError) as error:  # an upcaster meeting a bad shape
        raise ExportError(f"{where}: cannot upcast {event_class.__name__} ({error})") from None
    return row, event


def _event_class(topic: str, where: str) -> type:
    if not topic.startswith(_TRUSTED_TOPIC_PREFIX):
        raise ExportError(f"{where}: {topic!r} is not a lanes-es event")
    try:
        event_class = resolve_topic(topic)
    except Exception:  # resolve_topic raises several kinds for a name that does not exist
        raise ExportError(f"{where}: unknown event topic {topic!r}") from None
    if event_class not in _KNOWN_EVENTS:
        raise ExportError(f"{where}: {topic!r} is not a lanes-es event")
    return event_class


def rebuild_from_export(path: str | Path, root: str | Path) -> list[Path]:
    """Write the state file and report that the export's log folds to; returns the paths written.

    An export whose chain is broken is refused: projections are rebuilt only from a
    log that still says what it said when it was recorded.
    """
    events, breaks = read_export_log(path)
    if breaks:
        raise ExportError(f"{path}: the audit chain is broken at {breaks[0].describe()}; nothing was written")
    documents = fold_documents(events)
    if documents is None:
        raise ExportError(f"{path}: the export holds no BatchPrepared event, so there is no batch to rebuild")
    return materialize(root, documents)
