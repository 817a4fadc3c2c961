"""The reference kernel: the embedded default behind the `Kernel` port (docs/architecture.md).

Upstream drives immune-brain's Assurance Kernel; lanes-es ships this small one so the
engine works on a fresh machine. Each Lane keeps its own store at
`<lane>/.imm/state/kernel/` (ignored by git): `claim.json`, the Lane's one claim, and
`tasks/<task>.json`, the task record (`assurance_kernel/task_record/v4`), each written
atomically. The coordinator enrolls and advances; the Executor, inside the Lane, submits,
checks, records a review and stops (`lanes-es task ...`).

Lifecycle of a task record (`<lifecycle>:<artifact_state>` in its history):

    enroll   none          -> active:active   next_obligation submit_assurance
    submit   active:active -> active:frozen   next_obligation complete
    qa fail  active:frozen -> active:active   (advance: rework, operation qa)
    qa pass  routine: complete; material: a Review opens (review_ready) until a verdict
    complete active:frozen -> done:frozen     the audit pair is written, the claim released
    stop     active:*      -> stopped:frozen  (advance: stopped)
    revise   active:*      -> active:*        a delegated breaking revision (docs/upstream.md#delegated-intent-revisions): the
                                              intent snapshot and the staged sidecar change

A refusal raises KernelError and writes nothing; every check runs before the first write.
Store conditions read as "kernel store ..." so the tick reports them as upstream does.
"""

from __future__ import annotations

import hashlib
import os
import stat
import uuid
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable

import msgspec

from lanes_es.adapters.files import unwritable_directory, write_atomic
from lanes_es.adapters.git import git, git_ok
from lanes_es.adapters.delivery import worktree_delivery
from lanes_es.adapters.qa import Finding, Verdict, run_acceptance_on_worktree, run_qa_on_worktree
from lanes_es.domain.check_inputs import acceptance_digest
from lanes_es.domain.audit_pair import (
    AUDIT_DIR,
    PROOF_FILE,
    TASK_RECORD_CONTRACT,
    audit_paths,
    canonical_bytes,
    normalize_tombstone,
    task_record_bytes,
    terminal_event_id,
    tombstone,
    tombstone_problem,
)
from lanes_es.domain.authority import AuthorizationError
from lanes_es.domain.ids import format_timestamp, is_valid_id
from lanes_es.domain.intent import canonical_intent_hash, parse_task_intent
from lanes_es.domain.jstext import parse_json
from lanes_es.ports import AdvanceResult, KernelError, PortError, TaskProjection, Tombstone

if TYPE_CHECKING:  # the coordinator's git adapter: imported where used, so an Executor's `task submit` starts fast
    from lanes_es.adapters.batch_git import SettledEvidence

STORE_DIR = ".imm/state/kernel"
CLAIM_CONTRACT = "lanes_es/lane_claim/v1"
MAX_INTENT_BYTES = 64 * 1024
MAX_STORE_FILE_BYTES = 4 * 1024 * 1024
NO_STATE = "none"
DELEGATED_ACTOR_ID = "batch-coordinator"  # the actor of an approval the batch confirmation delegated


def system_clock() -> str:
    return format_timestamp(datetime.now(timezone.utc))


# ---------------------------------------------------------------- the stored values


class Claim(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The Lane's one claim: which task runs here, in which run, for which batch."""

    contract: str = CLAIM_CONTRACT
    task_id: str
    run_id: str
    batch_id: str
    claimed_at: str


class IntentRef(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    path: str
    revision: int
    content_hash: str


class Review(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A material task's Review: none, open (a reservation), approved or rejected."""

    state: str = NO_STATE
    operation_id: str | None = None
    verdict: str | None = None  # approve | reject
    text: str | None = None


class Authority(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Who approved a change on the user's behalf: a delegated approval names the batch confirmation."""

    authority_kind: str
    actor_id: str
    confirmation_ref: str


class HistoryEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    type: str
    at: str
    from_state: str
    to_state: str
    batch_id: str | msgspec.UnsetType = msgspec.UNSET
    decision: str | msgspec.UnsetType = msgspec.UNSET
    findings: list[Finding] | msgspec.UnsetType = msgspec.UNSET
    operation_id: str | msgspec.UnsetType = msgspec.UNSET
    verdict: str | msgspec.UnsetType = msgspec.UNSET
    text: str | msgspec.UnsetType = msgspec.UNSET
    reason: str | msgspec.UnsetType = msgspec.UNSET
    authority: Authority | msgspec.UnsetType = msgspec.UNSET
    from_revision: int | msgspec.UnsetType = msgspec.UNSET
    to_revision: int | msgspec.UnsetType = msgspec.UNSET
    diff_hash: str | msgspec.UnsetType = msgspec.UNSET  # a QA pass: the delivery identity it reviewed


class TaskRecord(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    contract: str
    task_id: str
    run_id: str
    record_revision: int
    lifecycle: str  # active | done | stopped
    artifact_state: str  # active | frozen
    next_obligation: str  # submit_assurance | complete | run_review | none
    risk: str
    intent_ref: IntentRef
    intent_snapshot: dict[str, Any]
    review: Review
    history: list[HistoryEntry]

    @property
    def state(self) -> str:
        return f"{self.lifecycle}:{self.artifact_state}"


class TaskStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What `lanes-es task status` shows the Executor."""

    task_id: str
    run_id: str
    record_revision: int
    lifecycle: str
    artifact_state: str
    next_obligation: str
    risk: str
    review: Review
    holds_claim: bool
    findings: list[Finding]
    next_step: str


# ---------------------------------------------------------------- the kernel


class ReferenceKernel:
    """The `Kernel` port over per-Lane stores. `clock` returns canonical timestamps."""

    def __init__(self, clock: Callable[[], str] = system_clock) -> None:
        self.clock = clock
        # Where a Lane's QA runs: on a copy of its files here, or (the ray runner) on a cluster's node.
        self.run_qa: Callable[[str, str, dict[str, Any]], Any] = run_qa_on_worktree

    # ------------------------------------------------------------ coordinator side

    def enroll_task(self, lane_path: str, task_id: str, enrollment: Any) -> None:
        """Enroll `task_id` in the Lane under the batch capability; KernelError with nothing written on refusal."""
        _check_task_id(task_id)
        store = LaneStore(lane_path)
        child = _plan_child(enrollment.capability, task_id)
        intent_path = (child.intent_path if child else None) or f"docs/plans/{task_id}.intent.json"
        head, intent_blob = _lane_head_and_blob(lane_path, intent_path)
        if head is None:
            raise KernelError("batch_head_lineage_broken: current HEAD is unreadable")
        if head != enrollment.expected_head:
            raise KernelError(f"batch_head_lineage_broken: current HEAD {head} does not match "
                              f"expected_head {enrollment.expected_head}")
        resumed = _interrupted_enrollment(store, task_id, enrollment.batch_id)
        if child is None:
            raise KernelError(f"batch_child_not_in_plan: {task_id}")
        intent, content_hash = _read_lane_intent(lane_path, task_id, intent_path, intent_blob)
        if content_hash != child.intent_content_hash:
            raise KernelError(f"batch_child_intent_changed: {task_id}")
        try:
            enrollment.capability.consume_child(task_id)
        except AuthorizationError as error:
            raise KernelError(str(error)) from None
        at = self.clock()
        record = resumed or _enrolled_record(task_id, f"run-{uuid.uuid4()}", enrollment.batch_id, at,
                                             IntentRef(path=intent_path, revision=intent["revision"],
                                                       content_hash=content_hash), intent)
        # The record first, then the claim: a crash between them is resumed by the next enrollment.
        store.write_record(record)
        store.write_claim(Claim(task_id=task_id, run_id=record.run_id, batch_id=enrollment.batch_id, claimed_at=at))

    def project_task(self, lane_path: str, task_id: str) -> TaskProjection:
        """The Lane's claim and the task's record as the tick reads them; errors in `error`, never raised."""
        try:
            _check_task_id(task_id)
            store = LaneStore(lane_path)
            claim = store.read_claim()
            record = store.read_record(task_id)
        except KernelError as error:
            return TaskProjection(error=str(error))
        if claim is not None and record is not None and claim.task_id == task_id and claim.run_id != record.run_id:
            return TaskProjection(error=f"kernel store claim run {claim.run_id} does not match task record run "
                                        f"{record.run_id} for {task_id}")
        if record is None:
            return TaskProjection(claim_task_id=claim.task_id if claim else None)
        return TaskProjection(claim_task_id=claim.task_id if claim else None, run_id=record.run_id,
                              record_revision=record.record_revision, lifecycle=record.lifecycle,
                              artifact_state=record.artifact_state, next_obligation=record.next_obligation,
                              completion_ready=record.lifecycle == "done")

    def active_claim_task_id(self, lane_path: str) -> str | None:
        """The task the Lane's claim names, None, or "unreadable"."""
        try:
            claim = LaneStore(lane_path).read_claim()
        except KernelError:
            return "unreadable"
        return claim.task_id if claim else None

    def advance_task(self, lane_path: str, task_id: str) -> AdvanceResult:
        """Drive a frozen task through QA and Review; KernelError on a store condition."""
        _check_task_id(task_id)
        store = LaneStore(lane_path)
        record = store.require_record(task_id)
        if record.lifecycle == "stopped":
            return AdvanceResult(state="stopped", reason=f"task {task_id} was stopped: {_stop_reason(record)}")
        if record.lifecycle == "done":
            write_audit_pair(lane_path, record)  # restores a pair an interrupted completion left unwritten
            return AdvanceResult(state="completed")
        if record.artifact_state != "frozen":
            return AdvanceResult(state="rework", operation="submit",
                                 reason="the artifact is not submitted; the Executor runs `lanes-es task submit`")
        if record.review.state == "open":
            return _review_ready(record)
        if record.review.state == "approved":
            return self._complete(store, lane_path, record, self.clock())
        if record.review.state == "rejected":
            return self._rework_after_review(store, record)
        return self._run_qa(store, lane_path, record)

    def settled_evidence(self, lane_path: str, task_id: str) -> SettledEvidence:
        """The settled run the lane commit carries; KernelError when the task is not done."""
        from lanes_es.adapters.batch_git import SettledEvidence

        _check_task_id(task_id)
        record = LaneStore(lane_path).read_record(task_id)
        if record is None:
            raise KernelError(f"cannot commit child {task_id}: task is not settled done (no settled run)")
        if record.lifecycle != "done":
            raise KernelError(f"cannot commit child {task_id}: task is not settled done (lifecycle is "
                              f"{record.lifecycle})")
        record_path, proof_path = audit_paths(task_id, record.run_id)
        return SettledEvidence(task_id=task_id, run_id=record.run_id, lifecycle=record.lifecycle,
                               goal=str(record.intent_snapshot.get("goal", "")),
                               scope_hint=list(record.intent_snapshot.get("scope_hint", [])),
                               record_path=record_path, proof_path=proof_path,
                               delivery_identity=_reviewed_delivery(record))

    def read_tombstone(self, root: str, task_id: str) -> Tombstone | None:
        """The task's terminal proof under `<root>/.imm/audit/<task>/` (one run dir, else flat); None when absent."""
        _check_task_id(task_id)
        proof_path = _tombstone_path(root, task_id)
        if proof_path is None:
            return None
        data = _read_regular(proof_path, MAX_STORE_FILE_BYTES)
        if data is None:
            return None
        try:
            proof = parse_json(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as error:
            raise KernelError(f"terminal proof {proof_path} is malformed: {error}") from None
        problem = tombstone_problem(task_id, proof)
        if problem is not None:
            raise KernelError(f"terminal proof {proof_path} is malformed: {problem}")
        proof = normalize_tombstone(proof)
        return Tombstone(task_id=proof["task_id"], lifecycle_status=proof["lifecycle_status"],
                         terminal_lifecycle=proof["terminal_lifecycle"], terminal_event_id=proof["terminal_event_id"])

    # ------------------------------------------------------------ delegated Intent revisions (docs/upstream.md#delegated-intent-revisions)

    def current_intent(self, lane_path: str, task_id: str) -> dict[str, Any] | None:
        """The intent the Lane's task record runs under (its intent_snapshot); None without a record."""
        _check_task_id(task_id)
        record = LaneStore(lane_path).read_record(task_id)
        return None if record is None else dict(record.intent_snapshot)

    def apply_delegated_revision(self, lane_path: str, task_id: str, next_intent: dict[str, Any],
                                 confirmation_ref: str, now: str) -> tuple[int, int, str]:
        """Approve a breaking revision in the Lane on the user's behalf (docs/upstream.md#delegated-intent-revisions).

        The coordinator has already checked the delegation bounds. Here the Lane must still
        hold an active run of the task. The revised sidecar is written over the prior one and
        staged, so the lane commit carries it to the batch branch, where the reseal finds it;
        then the record takes the new intent with an approval naming the batch confirmation.
        A failure before the record is written puts the prior sidecar bytes back.
        Returns (from_revision, to_revision, intent_content_hash).
        """
        _check_task_id(task_id)
        store = LaneStore(lane_path)
        record = _active_run(store, task_id)
        intent = _parsed_next_intent(task_id, next_intent)
        path = record.intent_ref.path
        content_hash = canonical_intent_hash(intent)
        applied = _applied_approval(record, content_hash, confirmation_ref)
        if applied is not None:
            return applied  # approved before a crash kept the batch from recording it
        sidecar, prior, mode = _prior_sidecar(lane_path, task_id, path)
        authority = Authority(authority_kind="user", actor_id=DELEGATED_ACTOR_ID, confirmation_ref=confirmation_ref)
        revised = _moved(record, now, "approve_breaking_intent_revision", authority=authority,
                         from_revision=record.intent_ref.revision, to_revision=intent["revision"])
        revised = msgspec.structs.replace(revised, intent_snapshot=intent, intent_ref=IntentRef(
            path=path, revision=intent["revision"], content_hash=content_hash))
        try:
            write_atomic(sidecar, canonical_bytes(intent), store.directory, mode=mode)
            git(lane_path, "add", "--", path)
            if store.require_record(task_id).record_revision != record.record_revision:
                raise KernelError(f"the task record of {task_id} changed while the revision was applied; "
                                  "nothing was approved")
            store.write_record(revised)
        except OSError as error:
            _put_back_sidecar(store, path, sidecar, prior, mode)
            raise KernelError(f"the delegated revision of {task_id} was not applied: {error.strerror or error}") from None
        except BaseException:
            _put_back_sidecar(store, path, sidecar, prior, mode)
            raise
        return record.intent_ref.revision, intent["revision"], content_hash

    # ------------------------------------------------------------ Executor side (inside the Lane)

    def status(self, lane_path: str, task_id: str | None = None) -> TaskStatus:
        store = LaneStore(lane_path)
        claim = store.read_claim()
        record = _executor_record(store, claim, task_id)
        return TaskStatus(task_id=record.task_id, run_id=record.run_id, record_revision=record.record_revision,
                          lifecycle=record.lifecycle, artifact_state=record.artifact_state,
                          next_obligation=record.next_obligation, risk=record.risk, review=record.review,
                          holds_claim=claim is not None and claim.task_id == record.task_id,
                          findings=_last_findings(record), next_step=_next_step(record))

    def submit(self, lane_path: str, task_id: str | None = None) -> TaskRecord:
        """Freeze the artifact: the work is ready for the coordinator's QA."""
        store = LaneStore(lane_path)
        record = _executor_record(store, store.read_claim(), task_id)
        _require_active(record, "submit")
        if record.artifact_state == "frozen":
            raise KernelError(f"task {record.task_id} is already submitted; the coordinator runs QA on its next tick")
        store.require_writable("submit")
        record = _moved(record, self.clock(), "submit", artifact_state="frozen", next_obligation="complete")
        store.write_record(record)
        return record

    def check(self, lane_path: str, task_id: str | None = None) -> Verdict:
        """Run the task's acceptance on a copy of the Lane's tree, changing nothing."""
        store = LaneStore(lane_path)
        record = _executor_record(store, store.read_claim(), task_id)
        return run_acceptance_on_worktree(lane_path, record.task_id, record.intent_snapshot)

    def review(self, lane_path: str, approve: bool, text: str = "", task_id: str | None = None) -> TaskRecord:
        """Record the verdict of the open Review; the coordinator applies it on its next advance."""
        store = LaneStore(lane_path)
        record = _executor_record(store, store.read_claim(), task_id)
        _require_active(record, "review")
        if record.review.state != "open":
            raise KernelError(f"task {record.task_id} has no open Review reservation; a Review opens after QA passes "
                              "on a material task")
        if not approve and not text.strip():
            raise KernelError("a rejection needs a text saying what to rework")
        store.require_writable("review")
        verdict = "approve" if approve else "reject"
        review = Review(state="approved" if approve else "rejected", operation_id=record.review.operation_id,
                        verdict=verdict, text=text or None)
        record = _moved(record, self.clock(), "review", review=review, verdict=verdict,
                        operation_id=record.review.operation_id or msgspec.UNSET, text=text or msgspec.UNSET)
        store.write_record(record)
        return record

    def stop(self, lane_path: str, reason: str, task_id: str | None = None) -> TaskRecord:
        """Stop the task for good: lifecycle stopped, artifact frozen; the claim stays so the Lane is not reused."""
        if not reason.strip():
            raise KernelError("a stop needs a reason")
        store = LaneStore(lane_path)
        record = _executor_record(store, store.read_claim(), task_id)
        _require_active(record, "stop")
        store.require_writable("stop")
        record = _moved(record, self.clock(), "stop", lifecycle="stopped", artifact_state="frozen",
                        next_obligation=NO_STATE, reason=reason)
        store.write_record(record)
        return record

    # ------------------------------------------------------------ advance steps

    def _run_qa(self, store: LaneStore, lane_path: str, record: TaskRecord) -> AdvanceResult:
        reviewed = worktree_delivery(lane_path, record.task_id, list(record.intent_snapshot.get("scope_hint", [])))  # what the verdict is about; the lane commit must still match it
        qa = self.run_qa(lane_path, record.task_id, record.intent_snapshot)
        verdict, outputs = qa.verdict, qa.outputs
        ran = {"qa_outputs": outputs, "qa_tree": qa.tree, "qa_acceptance": acceptance_digest(record.intent_snapshot)}
        at = self.clock()
        if not verdict.passed:
            record = _moved(record, at, "qa", artifact_state="active", next_obligation="submit_assurance",
                            decision="rework", findings=list(verdict.findings))
            store.write_record(record)
            return AdvanceResult(state="rework", operation="qa", reason=_findings_text(verdict.findings), **ran)
        record = _moved(record, at, "qa", decision="pass", diff_hash=reviewed)
        if record.risk == "routine":
            return msgspec.structs.replace(self._complete(store, lane_path, record, at), **ran)
        operation_id = f"review-{uuid.uuid4()}"
        record = _moved(record, at, "review_opened", next_obligation="run_review",
                        review=Review(state="open", operation_id=operation_id), operation_id=operation_id)
        store.write_record(record)
        return msgspec.structs.replace(_review_ready(record), **ran)

    def _rework_after_review(self, store: LaneStore, record: TaskRecord) -> AdvanceResult:
        text = record.review.text or "the Review was rejected"
        record = _moved(record, self.clock(), "rework", artifact_state="active", next_obligation="submit_assurance",
                        review=Review(), operation_id=record.review.operation_id or msgspec.UNSET, text=text)
        store.write_record(record)
        return AdvanceResult(state="rework", operation="review", reason=text)

    def _complete(self, store: LaneStore, lane_path: str, record: TaskRecord, at: str) -> AdvanceResult:
        """done:frozen; the audit pair first (a crash then only repeats QA), then the record, then the claim."""
        record = _moved(record, at, "complete", lifecycle="done", next_obligation=NO_STATE)
        write_audit_pair(lane_path, record)
        store.write_record(record)
        store.release_claim(record.task_id)
        return AdvanceResult(state="completed")


# ---------------------------------------------------------------- record transitions


def _enrolled_record(task_id: str, run_id: str, batch_id: str, at: str, intent_ref: IntentRef,
                     intent: dict[str, Any]) -> TaskRecord:
    return TaskRecord(
        contract=TASK_RECORD_CONTRACT, task_id=task_id, run_id=run_id, record_revision=1, lifecycle="active",
        artifact_state="active", next_obligation="submit_assurance", risk=intent["risk"], intent_ref=intent_ref,
        intent_snapshot=intent, review=Review(),
        history=[HistoryEntry(type="enroll", at=at, from_state=NO_STATE, to_state="active:active", batch_id=batch_id)])


def _moved(record: TaskRecord, at: str, kind: str, *, lifecycle: str | None = None,
           artifact_state: str | None = None, next_obligation: str | None = None, review: Review | None = None,
           **detail: Any) -> TaskRecord:
    """The record after one change: the revision bumped and the change appended to its history."""
    changed = msgspec.structs.replace(
        record, lifecycle=lifecycle or record.lifecycle, artifact_state=artifact_state or record.artifact_state,
        next_obligation=next_obligation or record.next_obligation, review=review or record.review)
    entry = HistoryEntry(type=kind, at=at, from_state=record.state, to_state=changed.state, **detail)
    return msgspec.structs.replace(changed, record_revision=record.record_revision + 1,
                                   history=[*record.history, entry])


def _reviewed_delivery(record: TaskRecord) -> str | None:
    """The delivery identity the last passing QA reviewed (None for a record from before it was kept)."""
    for entry in reversed(record.history):
        if entry.type == "qa" and entry.decision == "pass":
            return entry.diff_hash if isinstance(entry.diff_hash, str) else None
    return None


def _review_ready(record: TaskRecord) -> AdvanceResult:
    return AdvanceResult(state="review_ready", operation="review", operation_id=record.review.operation_id,
                         reason=f"review reservation {record.review.operation_id} open")


def _stop_reason(record: TaskRecord) -> str:
    stops = [entry for entry in record.history if entry.type == "stop"]
    return str(stops[-1].reason) if stops and stops[-1].reason is not msgspec.UNSET else "no reason recorded"


def _findings_text(findings: list[Finding]) -> str:
    return "; ".join(f"{finding.id}: {finding.reason}" for finding in findings)


def _last_findings(record: TaskRecord) -> list[Finding]:
    """The findings of the latest QA run, if it failed."""
    for entry in reversed(record.history):
        if entry.type == "qa":
            return list(entry.findings) if entry.findings is not msgspec.UNSET else []
    return []


def _next_step(record: TaskRecord) -> str:
    if record.lifecycle == "done":
        return "done: the coordinator commits this Lane and integrates it on its next tick"
    if record.lifecycle == "stopped":
        return "stopped: a human decides what becomes of this Lane"
    if record.artifact_state == "active":
        return "work in this Lane, run `lanes-es task check`, then `lanes-es task submit`"
    if record.review.state == "open":
        return (f"a Review is open ({record.review.operation_id}): record it with `lanes-es task review --approve` "
                "or `--reject TEXT`")
    if record.review.state in ("approved", "rejected"):
        return "the Review verdict is recorded; the coordinator applies it on its next tick"
    return "submitted: the coordinator runs QA on its next tick"


def _require_active(record: TaskRecord, action: str) -> None:
    if record.lifecycle != "active":
        raise KernelError(f"cannot {action} task {record.task_id}: its lifecycle is {record.lifecycle}")


def _executor_record(store: LaneStore, claim: Claim | None, task_id: str | None) -> TaskRecord:
    """The record an Executor command acts on: the named task's, else the claimed task's."""
    if task_id is None:
        if claim is None:
            raise KernelError(f"the Lane at {store.lane_path} holds no claim; name the task, or wait for the "
                              "coordinator to enroll one")
        task_id = claim.task_id
    _check_task_id(task_id)
    record = store.read_record(task_id)
    if record is None:
        raise KernelError(f"task {task_id} is not enrolled in the Lane at {store.lane_path}; the coordinator "
                          "enrolls it on its next tick")
    return record


# ---------------------------------------------------------------- delegated revision helpers


def _active_run(store: LaneStore, task_id: str) -> TaskRecord:
    """The task's record, when the Lane's claim names this task and this run and the run is active."""
    claim = store.read_claim()
    record = store.read_record(task_id)
    if (claim is None or record is None or claim.task_id != task_id or claim.run_id != record.run_id
            or record.lifecycle != "active"):
        raise KernelError(f"the Lane at {store.lane_path} holds no active run of {task_id}")
    return record


def _parsed_next_intent(task_id: str, next_intent: dict[str, Any]) -> dict[str, Any]:
    try:
        intent = parse_task_intent(next_intent)
    except ValueError as error:
        raise KernelError(f"invalid next intent: {error}") from None
    if intent["task_id"] != task_id:
        raise KernelError(f"invalid next intent: it names task {intent['task_id']}, not {task_id}")
    return intent


def _prior_sidecar(lane_path: str, task_id: str, path: str) -> tuple[str, bytes, int]:
    """The Lane's sidecar the record was enrolled from: its full path, bytes and permission bits."""
    if path not in (f"docs/plans/{task_id}.intent.json", f"docs/plans/archive/{task_id}.intent.json"):
        raise KernelError(f"intent path {path} of {task_id} is not a TaskIntent sidecar path")
    _no_symlink_parents(lane_path, os.path.dirname(path), "intent")
    sidecar = os.path.join(lane_path, path)
    prior = _read_regular(sidecar, MAX_INTENT_BYTES)
    if prior is None:
        raise KernelError(f"the Lane has no intent sidecar {path} for {task_id}")
    return sidecar, prior, stat.S_IMODE(os.stat(sidecar).st_mode)


def _put_back_sidecar(store: LaneStore, path: str, sidecar: str, prior: bytes, mode: int) -> None:
    """Best effort: the prior bytes in the worktree and the index, so the Lane is as it was."""
    try:
        write_atomic(sidecar, prior, store.directory, mode=mode)
        git_ok(store.lane_path, "add", "--", path)
    except (OSError, PortError):
        pass  # the original error is the one to report


# ---------------------------------------------------------------- enrollment checks


def _check_task_id(task_id: str) -> None:
    if not is_valid_id(task_id):
        raise KernelError(f"invalid task id {task_id!r}")


def _plan_child(capability: Any, task_id: str) -> Any:
    """The capability's plan entry for the task (a PlanChild), or None."""
    return next((child for child in capability.children if child.task_id == task_id), None)


def _lane_head_and_blob(lane_path: str, intent_path: str) -> tuple[str | None, str | None]:
    """One spawn: the Lane's HEAD and the blob id of the intent in HEAD (None for what cannot be read)."""
    result = git_ok(lane_path, "rev-parse", "HEAD", f"HEAD:{intent_path}")
    lines = result.text.splitlines()
    head = lines[0] if lines and _is_object_id(lines[0]) else None
    blob = lines[1] if result.exit_code == 0 and len(lines) > 1 and _is_object_id(lines[1]) else None
    return head, blob


def _is_object_id(text: str) -> bool:
    return len(text) in (40, 64) and all(char in "0123456789abcdef" for char in text)


def _interrupted_enrollment(store: LaneStore, task_id: str, batch_id: str) -> TaskRecord | None:
    """The record of this task's enrollment when a crash came before its claim; refusal if the Lane is taken."""
    claim = store.read_claim()
    if claim is not None:
        raise KernelError(f"batch_lane_occupied: the Lane already holds a claim for {claim.task_id} (run {claim.run_id})")
    record = store.read_record(task_id)
    if record is None:
        return None
    first = record.history[0] if record.history else None
    if (record.lifecycle == "active" and record.record_revision == 1 and first is not None
            and first.batch_id == batch_id):
        return record
    raise KernelError(f"batch_lane_occupied: the Lane already holds run {record.run_id} of {task_id} "
                      f"(lifecycle {record.lifecycle})")


def _read_lane_intent(lane_path: str, task_id: str, intent_path: str, blob: str | None) -> tuple[dict[str, Any], str]:
    """The intent as committed at the Lane's HEAD: tracked, regular, no symlink, <= 64 KiB, parsed."""
    unreadable = KernelError(f"batch_child_intent_changed: {task_id} intent sidecar is unreadable")
    if intent_path not in (f"docs/plans/{task_id}.intent.json", f"docs/plans/archive/{task_id}.intent.json"):
        raise unreadable
    try:
        _no_symlink_parents(lane_path, os.path.dirname(intent_path))
        data = _read_regular(os.path.join(lane_path, intent_path), MAX_INTENT_BYTES)
    except KernelError:
        raise unreadable from None
    if data is None or blob is None or _git_blob_id(data, len(blob)) != blob:
        raise unreadable  # absent, untracked, or not what HEAD holds
    try:
        intent = parse_task_intent(parse_json(data.decode("utf-8")))
    except ValueError:
        raise unreadable from None
    if intent["task_id"] != task_id:
        raise unreadable
    return intent, canonical_intent_hash(intent)


def _git_blob_id(data: bytes, length: int) -> str:
    """The object id git gives these bytes as a blob (sha1, or sha256 in a sha256 repository)."""
    digest = hashlib.sha1 if length == 40 else hashlib.sha256
    return digest(b"blob %d\0" % len(data) + data).hexdigest()


# ---------------------------------------------------------------- the Lane store


class LaneStore:
    """`<lane>/.imm/state/kernel/`: claim.json and tasks/<task>.json, 0600, written by temp file and rename."""

    def __init__(self, lane_path: str) -> None:
        self.lane_path = lane_path
        self.directory = os.path.join(lane_path, STORE_DIR)

    @property
    def claim_path(self) -> str:
        return os.path.join(self.directory, "claim.json")

    def record_path(self, task_id: str) -> str:
        return os.path.join(self.directory, "tasks", f"{task_id}.json")

    def read_claim(self) -> Claim | None:
        _no_symlink_parents(self.lane_path, STORE_DIR)
        data = _read_regular(self.claim_path, MAX_STORE_FILE_BYTES)
        return None if data is None else _decode(data, Claim, CLAIM_CONTRACT, self.claim_path)

    def read_record(self, task_id: str) -> TaskRecord | None:
        _no_symlink_parents(self.lane_path, f"{STORE_DIR}/tasks")
        path = self.record_path(task_id)
        data = _read_regular(path, MAX_STORE_FILE_BYTES)
        if data is None:
            return None
        record = _decode(data, TaskRecord, TASK_RECORD_CONTRACT, path)
        if record.task_id != task_id:
            raise KernelError(f"kernel store {path} holds task {record.task_id}, not {task_id}")
        return record

    def require_record(self, task_id: str) -> TaskRecord:
        record = self.read_record(task_id)
        if record is None:
            raise KernelError(f"kernel store at {self.directory} holds no task record for {task_id}")
        return record

    def write_record(self, record: TaskRecord) -> None:
        self._prepare()
        _ensure_dir(self.lane_path, f"{STORE_DIR}/tasks")
        write_atomic(self.record_path(record.task_id), task_record_bytes(msgspec.to_builtins(record)), self.directory)

    def require_writable(self, command: str) -> None:
        """An Executor's command (`task submit`, `review`, `stop`) refuses before it writes anything when the
        record could not be written: its temporary file is made in the store directory, renamed into tasks/."""
        for directory in (self.directory, os.path.join(self.directory, "tasks")):
            blocked = unwritable_directory(directory)
            if blocked is not None:
                cause = "cannot be written by this user" if os.path.isdir(blocked) else "is a file, not a directory"
                raise KernelError(f"lane_not_writable: {blocked} {cause}, so the task's record in this Lane "
                                  f"({STORE_DIR}/) cannot be written; nothing was recorded: fix its owner or mode "
                                  f"(chmod u+w {blocked}), or run as its owner, then run `lanes-es task {command}` "
                                  f"again")

    def write_claim(self, claim: Claim) -> None:
        self._prepare()
        write_atomic(self.claim_path, task_record_bytes(msgspec.to_builtins(claim)), self.directory)

    def release_claim(self, task_id: str) -> None:
        claim = self.read_claim()
        if claim is not None and claim.task_id == task_id:
            os.unlink(self.claim_path)

    def _prepare(self) -> None:
        """The store directory, ignoring itself so the Lane stays clean whatever the repository ignores."""
        _ensure_dir(self.lane_path, STORE_DIR)
        ignore = os.path.join(self.directory, ".gitignore")
        if not os.path.lexists(ignore):
            write_atomic(ignore, b"*\n", self.directory, mode=0o644)


def _decode(data: bytes, kind: type, contract: str, path: str) -> Any:
    """A stored document: JSON, the expected contract, exactly the known fields."""
    try:
        document = parse_json(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise KernelError(f"kernel store {path} is unreadable: {error}") from None
    found = document.get("contract") if isinstance(document, dict) else None
    if found != contract:
        raise KernelError(f"kernel store {path} has unknown contract {found!r}: contract must equal {contract}")
    try:
        return msgspec.convert(document, kind)
    except msgspec.ValidationError as error:  # "Object contains unknown field `x`", a wrong type, ...
        raise KernelError(f"kernel store {path} is unreadable: {error}") from None


# ---------------------------------------------------------------- the audit pair in a tree


def write_audit_pair(lane_path: str, record: TaskRecord) -> None:
    """`.imm/audit/<task>/<run>/{task-record,terminal-proof}.json` of a done record, byte-exact and idempotent."""
    record_bytes = task_record_bytes(msgspec.to_builtins(record))
    last = record.history[-1]
    proof = tombstone(record.task_id, record_bytes, terminal_event_id("complete", record.task_id, last.at), last.at)
    record_path, proof_path = audit_paths(record.task_id, record.run_id)
    _ensure_dir(lane_path, os.path.dirname(record_path), mode=0o755, what="audit")
    staging = os.path.join(lane_path, STORE_DIR)  # temp files never land in the tracked audit directory
    _ensure_dir(lane_path, STORE_DIR)
    for relative, data in ((record_path, record_bytes), (proof_path, task_record_bytes(proof))):
        target = os.path.join(lane_path, relative)
        if _read_regular(target, MAX_STORE_FILE_BYTES) != data:
            write_atomic(target, data, staging, mode=0o644)


def _tombstone_path(root: str, task_id: str) -> str | None:
    """The proof file to read: the single run directory's, else the flat legacy one; None without a task dir."""
    relative = f"{AUDIT_DIR}/{task_id}"
    _no_symlink_parents(root, relative, "audit")
    base = os.path.join(root, relative)
    if not os.path.isdir(base):
        return None
    runs = []
    with os.scandir(base) as entries:
        for entry in entries:
            if entry.is_symlink():
                raise KernelError(f"audit path {entry.path} is a symlink; refusing to follow it")
            if entry.is_dir():
                runs.append(entry.name)
    if len(runs) == 1:
        return os.path.join(base, runs[0], PROOF_FILE)
    return os.path.join(base, PROOF_FILE)


# ---------------------------------------------------------------- files, without following symlinks


def _no_symlink_parents(root: str, relative: str, what: str = "kernel store") -> None:
    """Each component of root/relative that exists is a real directory, never a symlink."""
    current = root
    for part in relative.split("/"):
        current = os.path.join(current, part)
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISLNK(mode):
            raise KernelError(f"{what} path {current} is a symlink; refusing to follow it")
        if not stat.S_ISDIR(mode):
            raise KernelError(f"{what} path {current} is not a directory")


def _ensure_dir(root: str, relative: str, mode: int = 0o700, what: str = "kernel store") -> None:
    _no_symlink_parents(root, relative, what)
    os.makedirs(os.path.join(root, relative), mode=mode, exist_ok=True)


def _read_regular(path: str, limit: int) -> bytes | None:
    """A regular file's bytes (None when absent); a symlink, another kind of file or an oversize one is an error."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise KernelError(f"kernel store file {path} cannot be read: {error.strerror}") from None
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise KernelError(f"kernel store file {path} is not a regular file")
        if info.st_size > limit:
            raise KernelError(f"kernel store file {path} is larger than {limit} bytes")
        return handle.read(limit + 1)


def _applied_approval(record: Any, content_hash: str, confirmation_ref: str) -> tuple[int, int, str] | None:
    """The approval already in the record for exactly this intent and confirmation, if any."""
    if record.intent_ref.content_hash != content_hash:
        return None
    for entry in reversed(record.history):
        if entry.type == "approve_breaking_intent_revision":
            authority = entry.authority
            if authority is not msgspec.UNSET and authority is not None \
                    and authority.confirmation_ref == confirmation_ref:
                return entry.from_revision, entry.to_revision, content_hash
            return None
    return None
