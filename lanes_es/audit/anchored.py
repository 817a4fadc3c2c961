"""`verify`'s checks of what lies outside the store (pure): the signed checkpoint, the
attestations, and the batch branch against them.

- The log against the checkpoint: the same size and root; or a longer log whose first
  `size` events have the checkpoint's root (the checkpoint is behind: a note, not a
  finding, until the next tick writes it); a shorter log, or another root, is a finding.
- Every checkpoint the ref's history holds: signed, of this batch, sizes never shrinking,
  and each consistent with the newest one the log holds (RFC 9162 consistency proofs).
- Each attestation: its signature, and the integration it names against the log's.
- The batch branch: its first-parent history from the base up to the last attested
  commit is exactly the attested commits with the attested trees (commits the batch
  adopted by fast-forward, `HeadAdopted`, excepted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from eventsourcing.persistence import StoredEvent

from lanes_es.domain import events as ev

from . import merkle
from .anchor import log_leaves
from .attestation import IntegrationFact, integration_facts, subject_digest
from .dsse import EnvelopeError, open_envelope
from .signed_note import Checkpoint, NoteError
from .signing import Verifier


@dataclass
class AnchorEvidence:
    """What lies outside the store, as the command line read it."""

    source: str  # where the checkpoint came from: the ref, or a file
    note: str | None
    verifier: Verifier | None
    attestations: dict[str, bytes] | None = None  # path -> envelope; None: no ref to read them from
    branch_history: list[tuple[str, str]] | None = None  # (commit, tree), oldest first; None: not read
    branch_problem: str | None = None  # why the branch could not be read
    history: list[tuple[str, str | None]] = field(default_factory=list)  # (commit, note) of the ref, oldest first
    anchored: int | None = None  # the size this machine's marker says it anchored (None: never anchored here)


@dataclass
class AnchorCheck:
    findings: list[tuple[str, int | None, str, str]]  # (check, version, code, message)
    notes: list[str]
    checkpoint: Checkpoint | None = None


def check_anchor(batch_id: str, rows: Sequence[StoredEvent], events: Sequence[Any],
                 evidence: AnchorEvidence) -> AnchorCheck:
    result = AnchorCheck(findings=[], notes=[])
    if evidence.note is None:
        if evidence.anchored:  # anchored here, and its ref is gone: deleted, not "never anchored"
            _finding(result, "checkpoint", None, "checkpoint_missing",
                     f"no checkpoint ({evidence.source}), although this machine anchored {evidence.anchored} events "
                     f"of this log there: the checkpoint ref was deleted; restore it (from a clone or a remote that "
                     f"fetched refs/lanes-es/*) to check the log against it")
            return result
        from lanes_es.audit.signing import audit_extra_missing

        missing = audit_extra_missing()
        result.notes.append(f"no checkpoint ({evidence.source}): the end of this log is not anchored outside it"
                            + (f"; {missing}" if missing else ""))
        return result
    checkpoint = _open_checkpoint(batch_id, evidence, result)
    if checkpoint is None:
        return result
    result.checkpoint = checkpoint
    tree = merkle.Tree(log_leaves(rows))
    _check_log(tree, checkpoint, result)
    _check_history(batch_id, tree, evidence, result)
    if evidence.attestations is None:
        result.notes.append("attestations and batch branch not checked: no repository holding the checkpoint ref")
        return result
    facts = {fact.version: fact for fact in integration_facts(events)}
    attested = _check_attestations(batch_id, facts, checkpoint.size, evidence, result)
    _check_branch(events, attested, evidence, result)
    return result


def _finding(result: AnchorCheck, check: str, version: int | None, code: str, message: str) -> None:
    result.findings.append((check, version, code, message))


def _open_checkpoint(batch_id: str, evidence: AnchorEvidence, result: AnchorCheck) -> Checkpoint | None:
    assert evidence.verifier is not None
    try:
        checkpoint = Checkpoint.open(evidence.note or "", evidence.verifier)
    except NoteError as error:
        _finding(result, "checkpoint", None, "checkpoint_signature", f"the checkpoint ({evidence.source}) does not "
                                                                      f"verify: {error}")
        return None
    if checkpoint.origin != batch_id:
        _finding(result, "checkpoint", None, "checkpoint_origin",
                 f"the checkpoint ({evidence.source}) is of {checkpoint.origin}, not of {batch_id}")
        return None
    return checkpoint


def _check_log(tree: merkle.Tree, checkpoint: Checkpoint, result: AnchorCheck) -> None:
    count, size = len(tree.leaves), checkpoint.size
    if count < size:
        _finding(result, "checkpoint", count + 1, "log_cut_short",
                 f"the log holds {count} events but the signed checkpoint covers {size}: the newest "
                 f"{size - count} events were removed")
        return
    if tree.root(0, size) != checkpoint.root:
        _finding(result, "checkpoint", None, "checkpoint_root_mismatch",
                 f"the first {size} events do not hash to the signed root {checkpoint.root.hex()[:16]}: the log was "
                 f"rewritten, reordered or edited since it was checkpointed")
        return
    if count > size:
        proof = tree.consistency_proof(size)
        if not merkle.verify_consistency(size, count, checkpoint.root, tree.root(), proof):
            _finding(result, "checkpoint", None, "inconsistent", "the log is not an extension of the checkpoint")
            return
        result.notes.append(f"checkpoint behind by {count - size} events (it covers {size} of {count}; "
                            f"the next tick writes it)")


def _check_history(batch_id: str, tree: merkle.Tree, evidence: AnchorEvidence, result: AnchorCheck) -> None:
    """Every checkpoint the ref's history holds: each signed by the key, of this batch, sizes never
    shrinking, and each older one consistent with the newest one the log itself holds (an RFC 9162
    consistency proof computed from the log, checked against both signed roots). A checkpoint the
    log does not reach or match is the log's finding (`_check_log`), not the history's."""
    opened: list[tuple[int, str, Checkpoint]] = []
    count = len(evidence.history)
    for index, (commit, note) in enumerate(evidence.history, 1):
        where = f"checkpoint commit {commit[:12]} ({index} of {count} on the ref)"
        try:
            checkpoint = Checkpoint.open(note or "", evidence.verifier)  # type: ignore[arg-type]
        except NoteError as error:
            _finding(result, "checkpoint", None, "checkpoint_history_signature", f"{where} does not verify: {error}")
            continue
        if checkpoint.origin != batch_id:
            _finding(result, "checkpoint", None, "checkpoint_history_origin",
                     f"{where} is of {checkpoint.origin}, not of {batch_id}")
            continue
        if opened and checkpoint.size < opened[-1][2].size:
            _finding(result, "checkpoint", None, "checkpoint_size_decreased",
                     f"{where} signs {checkpoint.size} events after commit {opened[-1][1][:12]} signed "
                     f"{opened[-1][2].size}: the ref's history was rewritten")
        opened.append((index, commit, checkpoint))
    held = [entry for entry in opened
            if entry[2].size <= len(tree.leaves) and tree.root(0, entry[2].size) == entry[2].root]
    if not held:
        return
    newest_index, newest_commit, newest = held[-1]
    for index, commit, checkpoint in opened:
        if index >= newest_index or checkpoint.size > newest.size:
            continue
        proof = tree.consistency_proof(checkpoint.size, newest.size)
        if not merkle.verify_consistency(checkpoint.size, newest.size, checkpoint.root, newest.root, proof):
            _finding(result, "checkpoint", None, "checkpoint_inconsistent",
                     f"checkpoint commit {commit[:12]} ({index} of {count} on the ref) signs {checkpoint.size} events "
                     f"with root {checkpoint.root.hex()[:16]}, which is not consistent with commit "
                     f"{newest_commit[:12]} ({newest.size} events): the RFC 9162 consistency proof from the log does "
                     f"not lead to its root; it was signed over another log, and the ref's history was rewritten")
    later = count - newest_index
    if later:
        result.notes.append(f"the log agrees with the ref's checkpoints up to commit {newest_commit[:12]} "
                            f"({newest.size} events), not with the {later} after it")


def _check_attestations(batch_id: str, facts: dict[int, IntegrationFact], size: int, evidence: AnchorEvidence,
                        result: AnchorCheck) -> list[tuple[int, str, str, str]]:
    """Verified attestations as (version, task, commit, tree), oldest first."""
    assert evidence.verifier is not None
    attested: dict[int, tuple[int, str, str, str]] = {}
    for path, data in sorted((evidence.attestations or {}).items()):
        try:
            statement = open_envelope(data, evidence.verifier)
        except EnvelopeError as error:
            _finding(result, "attestation", None, "attestation_signature", f"{path}: {error}")
            continue
        predicate = statement.get("predicate") or {}
        version, task = predicate.get("event_version"), predicate.get("task_id")
        commit, tree = subject_digest(statement, "gitCommit"), subject_digest(statement, "gitTree")
        fact = facts.get(version) if isinstance(version, int) else None
        if predicate.get("batch_id") != batch_id or fact is None:
            _finding(result, "attestation", version if isinstance(version, int) else None, "attestation_unknown",
                     f"{path} attests an integration ({task} at {commit}) that the log does not hold")
            continue
        if fact.task_id != task or fact.commit != commit:
            _finding(result, "attestation", version, "attestation_mismatch",
                     f"{path} attests {task} at {commit}; the log integrated {fact.task_id} at {fact.commit}")
            continue
        attested[version] = (version, task, commit, tree or "")
    for version, fact in sorted(facts.items()):
        if version <= size and version not in attested and not any(
                code == "attestation_signature" for _, _, code, _ in result.findings):
            _finding(result, "attestation", version, "attestation_missing",
                     f"the integration of {fact.task_id} at {fact.commit} has no attestation")
    return [attested[version] for version in sorted(attested)]


def _check_branch(events: Sequence[Any], attested: list[tuple[int, str, str, str]], evidence: AnchorEvidence,
                  result: AnchorCheck) -> None:
    if not attested:
        return
    if evidence.branch_history is None:
        result.notes.append(f"batch branch not checked: {evidence.branch_problem or 'no repository'}")
        return
    history = evidence.branch_history
    position = {commit: index for index, (commit, _) in enumerate(history)}
    for version, task, commit, _ in attested:
        if commit not in position:
            _finding(result, "branch", version, "branch_rewritten",
                     f"the batch branch does not contain {commit}, the attested integration of {task}: the branch "
                     f"was rewritten or its integrated commit replaced")
    present = [commit for _, _, commit, _ in attested if commit in position]
    if not present:
        return
    adopted = [(position.get(event.from_head, -1), position.get(event.to_head)) for event in events
               if isinstance(event, ev.HeadAdopted)]
    expected = {commit: (version, task, tree) for version, task, commit, tree in attested}
    for index, (commit, tree) in enumerate(history[:position[present[-1]] + 1]):
        if commit in expected:
            version, task, attested_tree = expected[commit]
            if tree != attested_tree:
                _finding(result, "branch", version, "tree_mismatch",
                         f"commit {commit} of {task} has tree {tree}, the attestation says {attested_tree}")
            continue
        if any(to is not None and start < index <= to for start, to in adopted):
            continue
        _finding(result, "branch", None, "unattested_commit",
                 f"commit {commit} on the batch branch, before its last attested integration, is not an attested "
                 f"integration")
