"""Folds of a batch's log into its two documents, and their materialization.

- the v2 record: `lanes_es.domain.record.fold_record`, validated before it is written;
- the report: made when the batch settles (BatchSettled) or is retired (BatchSuperseded).
  A report whose state is not `needs_human` is terminal and never replaced (upstream rule),
  so the report is the first terminal one, else the newest parked one.

`materialize` writes both after every save; `drift` compares files with the log and
writes nothing. Both take the events, so they work on a store or on an export.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from lanes_es.domain import events as ev
from lanes_es.domain.record import apply_event, prepared_record
from lanes_es.domain.report import report_after
from lanes_es.domain.validator import validate_record

from .files import canonical_bytes, read_bytes, report_path, state_path, write_atomically


@dataclass
class BatchDocuments:
    batch_id: str
    record: dict[str, Any]
    report: dict[str, Any] | None

    def record_bytes(self) -> bytes:
        return canonical_bytes(self.record)

    def report_bytes(self) -> bytes | None:
        return None if self.report is None else canonical_bytes(self.report)


def fold_documents(events: Iterable[Any]) -> BatchDocuments | None:
    """The record and the report after `events`, each event applied once, in order."""
    record: dict[str, Any] | None = None
    report: dict[str, Any] | None = None
    # A rebuild folds every event of a long log here: the names are bound once, outside the loop.
    prepared, apply, after = ev.BatchPrepared, apply_event, report_after
    for event in events:
        if type(event) is prepared:  # no event class derives from another; a type test is the cheap one
            record = prepared_record(event)
        elif record is not None:
            apply(record, event)
            report = after(report, record, event)
    if record is None:
        return None
    return BatchDocuments(batch_id=record["batch_id"], record=record, report=report)


def documents_of(batch: Any) -> BatchDocuments:
    """The documents of a live LaneBatch, which folds the same functions as it goes."""
    return BatchDocuments(batch_id=batch.id, record=batch.record, report=batch.report)


@dataclass(frozen=True)
class Drift:
    path: Path
    kind: str  # "missing", "differs", "unexpected"

    def describe(self) -> str:
        return f"{self.path} {_DRIFT_TEXT[self.kind]}"


_DRIFT_TEXT = {"missing": "is missing", "differs": "differs from the log",
               "unexpected": "exists but the log has no report"}


def expected_files(root: str | Path, documents: BatchDocuments) -> dict[Path, bytes | None]:
    validate_record(documents.record, documents.batch_id)
    return {
        state_path(root, documents.batch_id): documents.record_bytes(),
        report_path(root, documents.batch_id): documents.report_bytes(),
    }


def drift(root: str | Path, documents: BatchDocuments) -> list[Drift]:
    """Every projection file that does not hold exactly what the log says. Writes nothing."""
    found: list[Drift] = []
    for path, expected in expected_files(root, documents).items():
        actual = read_bytes(path)
        if expected is None:
            if actual is not None:
                found.append(Drift(path, "unexpected"))
        elif actual is None:
            found.append(Drift(path, "missing"))
        elif actual != expected:
            found.append(Drift(path, "differs"))
    return found


def materialize(root: str | Path, documents: BatchDocuments) -> list[Path]:
    """Write each document that differs from the log; returns the paths written."""
    written: list[Path] = []
    for path, expected in expected_files(root, documents).items():
        if expected is not None and write_atomically(path, expected):
            written.append(path)
    return written
