"""`verify`: everything an auditor checks about one batch, as a list of findings.

- the log: the stored rows, the digest chain and each replayed step (`replay`);
- the projections: the state file and report against their rebuild from the log;
- for a completed batch, upstream's completion verifier on the batch branch.

A batch verifies only when there is no finding at all. An export is checked on the
log alone, since the machine that reads it may have neither the store nor the checkout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import msgspec

from lanes_es.domain.validator import InvalidRecord
from lanes_es.projections.batch import drift, fold_documents

from .chain import ChainBreak
from .completion import verify_completion
from .replay import ILLEGAL_TRANSITION, INVALID_RECORD, UNFOLDABLE, Progress, replay

_STEP_RULES = frozenset({ILLEGAL_TRANSITION, INVALID_RECORD, UNFOLDABLE})


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    check: str  # "chain", "replay", "projection", "completion", "checkpoint", "attestation" or "branch"
    version: int | None
    code: str
    message: str

    def describe(self) -> str:
        where = f" version {self.version}" if self.version is not None else ""
        return f"{self.check}{where}: {self.code}: {self.message}"


class VerifyReport(msgspec.Struct, kw_only=True):
    batch_id: str
    events: int
    head: str
    batch_state: str | None
    findings: list[Finding]
    completion: dict[str, Any] | None = None  # upstream's observation, for a completed batch
    checkpoint: dict[str, Any] | None = None  # the signed checkpoint the log was checked against
    notes: list[str] = []  # what holds but is worth saying (a checkpoint behind the log, a check not run)

    @property
    def ok(self) -> bool:
        return not self.findings


def check_log(events: Sequence[Any], stored_breaks: Sequence[ChainBreak] | None = None,
              progress: Progress | None = None) -> tuple[list[Finding], Any]:
    """Findings of the rows, the chain and the replayed steps, and the replay itself.

    `stored_breaks` are the row and chain breaks found on the stored form of the log
    (`chain.verify_stored`, `export.read_export_log`); without them the chain is
    checked on the events themselves.
    """
    findings: list[Finding] = []
    result = replay(events, progress=progress, chain_breaks=stored_breaks, keep_steps=False)  # checked, not shown
    for failure in result.failures:
        is_step = failure.rule in _STEP_RULES
        findings.append(Finding(check="replay" if is_step else "chain", version=failure.version, code=failure.rule,
                                message=failure.message))
    findings.sort(key=lambda finding: finding.version or 0)
    return findings, result


def verify_batch(batch_id: str, events: Sequence[Any], root: str | Path,
                 stored_breaks: Sequence[ChainBreak] | None = None, progress: Progress | None = None) -> VerifyReport:
    findings, result = check_log(events, stored_breaks, progress)
    findings.extend(_projection_findings(root, events))
    state = result.record["batch_state"] if result.record else None
    completion = None
    notes: list[str] = []
    if state == "completed":
        observation = verify_completion(root, batch_id)
        completion = observation.as_json()
        notes.extend([observation.note] if observation.note else [])
        if not observation.complete:
            findings.append(Finding(check="completion", version=None, code=observation.code or "incomplete",
                                    message=observation.message))
    return VerifyReport(batch_id=batch_id, events=len(events), head=result.head, batch_state=state,
                        findings=findings, completion=completion, notes=notes)


def verify_export_events(events: Sequence[Any], progress: Progress | None = None,
                         stored_breaks: Sequence[ChainBreak] | None = None) -> VerifyReport:
    findings, result = check_log(events, stored_breaks, progress)
    return VerifyReport(batch_id=result.batch_id, events=len(events), head=result.head,
                        batch_state=result.record["batch_state"] if result.record else None, findings=findings)


def _projection_findings(root: str | Path, events: Sequence[Any]) -> list[Finding]:
    try:
        documents = fold_documents(events)
    except (KeyError, TypeError, ValueError) as error:  # a tampered log may not fold; replay names where
        return [Finding(check="projection", version=None, code="unfoldable",
                        message=f"the log does not fold into a record ({error})")]
    if documents is None:
        return [Finding(check="projection", version=None, code="no_record",
                        message="the log has no BatchPrepared, so there is no record to compare")]
    try:
        drifted = drift(root, documents)
    except InvalidRecord as error:
        return [Finding(check="projection", version=None, code="invalid_record", message=str(error))]
    return [Finding(check="projection", version=None, code=f"projection_{found.kind}", message=found.describe())
            for found in drifted]


def add_anchor_findings(report: VerifyReport, rows: Sequence[Any], events: Sequence[Any], evidence: Any) -> None:
    """The checkpoint, the attestations and the batch branch (lanes_es/audit/anchored.py) into the report."""
    from .anchored import check_anchor

    checked = check_anchor(report.batch_id, rows, events, evidence)
    report.findings.extend(Finding(check=check, version=version, code=code, message=message)
                           for check, version, code, message in checked.findings)
    report.notes.extend(checked.notes)
    if checked.checkpoint is not None:
        report.checkpoint = {"source": evidence.source, "size": checked.checkpoint.size,
                             "root": checked.checkpoint.root.hex()}
