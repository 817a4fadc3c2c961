"""`LaneBatch`: one aggregate per batch, its state the v2 record.

Each command checks its guard and raises `TransitionRefused` before any event is
triggered, so an illegal transition (integrating a pending child, releasing a
parked one) never enters the log. After each event the record must still pass
the v2 validator; if it does not, the command raises and the tick saves nothing.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any, Iterable

import msgspec

from . import events as ev
from .aggregate import ChainedAggregate, TransitionRefused
from .executor_runs import ExecutorRuns
from .remote_attempts import RemoteAttempts
from .record import (
    IN_FLIGHT, apply_event, child_of, consumed_slots, dependents_to_skip, is_terminal, prepared_record,
)
from .check_inputs import reuse_key
from .report import report_after
from .validator import LANE_CHILD_STATES as LANE_STATES, InvalidRecord, validate_record


class LaneBatch(ChainedAggregate):
    def __init__(self) -> None:
        # The state, `self.record`, arrives with BatchPrepared (see apply_fact); `self.report`
        # is the report the log has written so far, if any.
        self.record: dict[str, Any] = {}
        self.report: dict[str, Any] | None = None
        self._integration: str | None = None
        self.verify_workers: int | None = None
        self.flake_reruns = 0
        self.executor_runs = ExecutorRuns()  # lanes-es's own: the Executor attempts, not in the v2 record
        self.remote_attempts = RemoteAttempts()  # lanes-es's own: what was sent to a Ray cluster's nodes
        # lanes-es's own facts beyond the record, folded from the log: the passing verdicts a check on the
        # same inputs may reuse (reuse key -> (event version, event type, candidate or None for QA)), and
        # each child's latest failure (its Parked or QaFailureCounted event).
        self.passed_checks: dict[str, tuple[int, str, str | None]] = {}
        self.failures: dict[str, Any] = {}

    # ------------------------------------------------------------ creation

    @classmethod
    def prepare(cls, *, at: str, batch_id: str, initiative_slug: str, plan_digest: str, base_head: str,
                branch: str, confirmation_time: str, budget: ev.Budget, max_parallel: int,
                children: list[ev.PlanChild], final_verification: list[str] | None = None,
                revision_delegation: str | None = None, integration: str | None = None,
                verify_workers: int | None = None, flake_reruns: int | None = None) -> "LaneBatch":
        if not children:
            raise TransitionRefused("batch plan is empty")
        identities = {
            child.task_id: ev.IntentIdentity(intent_path=child.intent_path, intent_revision=child.intent_revision,
                                             intent_content_hash=child.intent_content_hash)
            for child in children
            if child.intent_path is not None and child.intent_revision is not None
            and child.intent_content_hash is not None
        }
        return cls._start(
            ev.BatchPrepared, batch_id, at=at, batch_id=batch_id, initiative_slug=initiative_slug,
            plan_digest=plan_digest, base_head=base_head, branch=branch, confirmation_time=confirmation_time,
            budget=budget, max_parallel=max_parallel, children=children,
            final_verification=final_verification or None, revision_delegation=revision_delegation,
            intent_identities=identities or None, integration=integration, verify_workers=verify_workers,
            flake_reruns=flake_reruns or None,
        )

    def apply_fact(self, event: Any) -> None:
        if isinstance(event, ev.BatchPrepared):
            self.record = prepared_record(event)
            self._integration, self.verify_workers = event.integration, event.verify_workers
            self.flake_reruns = event.flake_reruns or 0
        else:
            apply_event(self.record, event)
            self.report = report_after(self.report, self.record, event)
            self.executor_runs.fold(event)
            self.remote_attempts.fold(event)
            self._note_checks(event)
        super().apply_fact(event)

    def _note_checks(self, event: Any) -> None:
        """The verdicts and failures this event holds (most events hold none: two type tests)."""
        kind = type(event)
        if kind is ev.Settled:
            if event.qa_tree and event.qa_acceptance and event.qa_outputs and all(o.passed for o in event.qa_outputs):
                key = reuse_key(event.task_id, event.qa_acceptance, event.qa_tree)
                self.passed_checks.setdefault(key, (event.originator_version, "Settled", None))
        elif kind is ev.CandidateVerified or kind is ev.Integrated:
            for check in event.checks:
                # A covered check did not run on this tree: it is no verdict on these inputs to reuse.
                if check.passed and check.tree and check.acceptance and not check.cancelled and not check.covered_by:
                    key = reuse_key(check.task_id, check.acceptance, check.tree)
                    self.passed_checks.setdefault(key, (check.reused_from or event.originator_version,
                                                        kind.__name__, event.commit))
        elif kind is ev.Parked or kind is ev.QaFailureCounted:
            self.failures[event.task_id] = event

    def trigger_event(self, event_class: type[ev.Event], **fields: Any) -> None:  # type: ignore[override]
        """Apply the event, then require a valid record; if it is not, undo it and refuse, so that no
        event whose record breaks a v2 rule is ever pending, let alone saved."""
        saved = (copy.deepcopy(self.record), self.report, self.version, self.last_digest, len(self.pending_events),
                 {task: list(texts) for task, texts in self.executor_runs.undelivered.items()})
        super().trigger_event(event_class, **fields)
        try:
            validate_record(self.record, self.id)
        except InvalidRecord as error:
            self.record, self.report, self.version, self.last_digest = saved[:4]
            del self.pending_events[saved[4]:]
            self.executor_runs.undelivered = saved[5]  # only an intervention, which can change the record, adds here
            raise TransitionRefused(f"{event_class.__name__} refused: {error}") from None

    # ------------------------------------------------------------ reading

    @property
    def batch_state(self) -> str:
        return self.record["batch_state"]

    def child(self, task_id: str) -> dict[str, Any]:
        return child_of(self.record, task_id)

    def children_in(self, *states: str) -> list[dict[str, Any]]:
        return [child for child in self.record["children"] if child["state"] in states]

    # ------------------------------------------------------------ guards

    def _require_moving(self) -> None:
        if is_terminal(self.batch_state):
            raise TransitionRefused(f"batch {self.id} is {self.batch_state}; a terminal record does not move")

    def _require_child(self, task_id: str, *states: str) -> dict[str, Any]:
        self._require_moving()
        try:
            child = self.child(task_id)
        except KeyError as error:
            raise TransitionRefused(str(error)) from None
        if child["state"] not in states:
            raise TransitionRefused(
                f"child {task_id} is {child['state']}; expected {' or '.join(states)}")
        return child

    # ------------------------------------------------------------ transitions

    def start(self, at: str) -> None:
        if self.batch_state != "prepared":
            raise TransitionRefused(f"batch {self.id} is {self.batch_state}, not prepared")
        self.trigger_event(ev.BatchStarted, at=at)

    def admit_lane(self, at: str, task_id: str, lane: ev.LaneBinding) -> None:
        self._require_child(task_id, "pending")
        if consumed_slots(self.record) >= self.record["budget"]["max_children"]:
            raise TransitionRefused(f"max_children budget exhausted ({self.record['budget']['max_children']})")
        self.trigger_event(ev.LaneAdmitted, at=at, task_id=task_id, lane=lane)

    def enroll(self, at: str, task_id: str, run_id: str, reason: str | None = None) -> None:
        self._require_child(task_id, "lane_admitted")
        self.trigger_event(ev.Enrolled, at=at, task_id=task_id, run_id=run_id, reason=reason)

    def settle(self, at: str, task_id: str, *, qa_failures_reset: bool = False,
               qa_outputs: list[ev.CommandDigest] | None = None, qa_tree: str | None = None,
               qa_acceptance: str | None = None) -> None:
        self._require_child(task_id, "enrolled")
        self.trigger_event(ev.Settled, at=at, task_id=task_id, qa_failures_reset=qa_failures_reset,
                           qa_outputs=qa_outputs or [], qa_tree=qa_tree, qa_acceptance=qa_acceptance)

    def commit_lane(self, at: str, task_id: str, lane_commit: str) -> None:
        self._require_child(task_id, "settled")
        self.trigger_event(ev.LaneCommitted, at=at, task_id=task_id, lane_commit=lane_commit)

    def integrate(self, at: str, task_id: str, commit: str, *, adopted: bool = False,
                  checks: list[ev.CheckVerdict] | None = None) -> None:
        self._require_child(task_id, "lane_committed")
        if commit in self.record["commits"]:
            raise TransitionRefused(f"commit {commit} is already integrated for another child")
        self.trigger_event(ev.Integrated, at=at, task_id=task_id, commit=commit, adopted=adopted, checks=checks or [])

    def release(self, at: str, task_id: str) -> None:
        self._require_child(task_id, "integrated")
        self.trigger_event(ev.Released, at=at, task_id=task_id)

    def park(self, at: str, task_id: str, reason: str, *, qa_failures: int | None = None,
             candidate: str | None = None, candidate_ref: str | None = None,
             failed_checks: list[ev.CheckVerdict] | None = None) -> None:
        self._require_child(task_id, *IN_FLIGHT)
        skipped = dependents_to_skip(self.record, task_id)
        self.trigger_event(ev.Parked, at=at, task_id=task_id, reason=reason, skipped=skipped,
                           qa_failures=qa_failures, candidate=candidate, candidate_ref=candidate_ref,
                           failed_checks=failed_checks or [])

    def count_qa_failure(self, at: str, task_id: str, qa_failures: int, correction_due: str | None = None,
                         qa_outputs: list[ev.CommandDigest] | None = None) -> None:
        self._require_child(task_id, "enrolled")
        self.trigger_event(ev.QaFailureCounted, at=at, task_id=task_id, qa_failures=qa_failures,
                           correction_due=correction_due, qa_outputs=qa_outputs or [])

    def open_review(self, at: str, task_id: str, reason: str, qa_outputs: list[ev.CommandDigest] | None = None) -> None:
        self._require_child(task_id, "enrolled")
        self.trigger_event(ev.ReviewOpened, at=at, task_id=task_id, reason=reason, qa_outputs=qa_outputs or [])

    def record_intervention(self, at: str, task_id: str, kind: str, text: str) -> None:
        child = self._require_child(task_id, "enrolled")
        if kind == "correction" and not child.get("correction_due"):
            raise TransitionRefused(f"{task_id} has no correction due")
        digest = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
        self.trigger_event(ev.InterventionRecorded, at=at, task_id=task_id, kind=kind, text=text,
                           text_digest=digest)

    def apply_delegated_revision(self, at: str, task_id: str, from_revision: int, to_revision: int,
                                 intent_content_hash: str, confirmation_ref: str) -> None:
        self._require_child(task_id, "enrolled")
        self.trigger_event(ev.DelegatedRevisionApplied, at=at, task_id=task_id, from_revision=from_revision,
                           to_revision=to_revision, intent_content_hash=intent_content_hash,
                           confirmation_ref=confirmation_ref)

    def reseal(self, at: str, task_id: str, to_digest: str, intent_revision: int, intent_content_hash: str) -> None:
        self._require_child(task_id, "integrated")
        if task_id not in self.record.get("intent_identities", {}):
            raise TransitionRefused(f"{task_id} has no recorded intent identity")
        self.trigger_event(ev.Resealed, at=at, task_id=task_id, from_digest=self.record["plan_digest"],
                           to_digest=to_digest, intent_revision=intent_revision,
                           intent_content_hash=intent_content_hash)

    def change_grant(self, at: str, confirmation_time: str | None) -> None:
        self._require_moving()
        self.trigger_event(ev.DelegationGrantChanged, at=at, confirmation_time=confirmation_time)

    def close_tracker(self, at: str, task_id: str) -> None:
        child = self.child(task_id)
        if child["state"] not in ("integrated", "released") or child.get("tracker_closed"):
            raise TransitionRefused(f"child {task_id} is {child['state']}; its Issue closes once, after integration")
        self.trigger_event(ev.TrackerClosed, at=at, task_id=task_id)

    def adopt_head(self, at: str, from_head: str, to_head: str) -> None:
        self._require_moving()
        self.trigger_event(ev.HeadAdopted, at=at, from_head=from_head, to_head=to_head)

    def restore_leaks(self, at: str, backup: str, paths: list[ev.RestoredPath]) -> None:
        self._require_moving()
        self.trigger_event(ev.LeaksRestored, at=at, backup=backup, paths=paths)

    def resume_park(self, at: str, confirmation_time: str, children: list[ev.ResumedChild]) -> None:
        if self.batch_state != "needs_human":
            raise TransitionRefused(f"batch {self.id} is {self.batch_state}, not parked")
        if confirmation_time <= self.record["confirmation_time"]:
            raise TransitionRefused("the parked batch requires a fresh literal-user confirmation")
        for resumed in children:
            if self.child(resumed.task_id)["state"] != "needs_human":
                raise TransitionRefused(f"child {resumed.task_id} is not parked")
            if resumed.state not in ("enrolled", "settled", "lane_committed"):
                raise TransitionRefused(f"child {resumed.task_id} cannot resume as {resumed.state}")
        self.trigger_event(ev.ParkResumed, at=at, confirmation_time=confirmation_time, children=children)

    def settle_batch(self, at: str, batch_state: str, reason: str | None, next_action: str,
                     extras: ev.ReportExtras = ev.ReportExtras()) -> None:
        self._require_moving()
        if batch_state not in ("completed", "needs_human", "budget_stopped", "failed"):
            raise TransitionRefused(f"a batch does not settle as {batch_state}")
        if batch_state == "completed" and self.children_in(*(set(LANE_STATES) - {"integrated", "released"})):
            raise TransitionRefused(f"batch {self.id} cannot complete: a child is not integrated")
        if batch_state in ("budget_stopped", "failed") and self.children_in(*IN_FLIGHT):
            raise TransitionRefused(f"batch {self.id} cannot settle {batch_state}: a child is still mid-flight")
        if self.executor_runs.attempts:
            extras = msgspec.structs.replace(extras, executor_totals=self.executor_runs.totals())
        self.trigger_event(ev.BatchSettled, at=at, batch_state=batch_state, reason=reason,
                           next_action=next_action, extras=extras)

    def supersede(self, at: str, reason: str, next_action: str) -> None:
        self._require_moving()
        in_flight = self.children_in(*IN_FLIGHT)
        if in_flight:
            raise TransitionRefused(f"batch {self.id} is {self.batch_state} but a child is still mid-flight")
        self.trigger_event(ev.BatchSuperseded, at=at, reason=reason, next_action=next_action)

    # ------------------------------------------------------------ audit only

    def refuse_offers(self, at: str, refusals: Iterable[ev.LaneRefusal]) -> None:
        refusals = list(refusals)
        if refusals:
            self.trigger_event(ev.OffersRefused, at=at, refusals=refusals)

    def reject_tick(self, at: str, reason: str) -> None:
        self.trigger_event(ev.TickRejected, at=at, reason=reason)

    def note_drift(self, at: str, path: str) -> None:
        self.trigger_event(ev.ProjectionDriftRepaired, at=at, path=path)

    def note_candidate_built(self, at: str, mode: str, lanes: list[str], parent: str, commit: str | None,
                             reparented_from: str | None = None) -> None:
        self._require_moving()
        self.trigger_event(ev.CandidateBuilt, at=at, mode=mode, lanes=lanes, parent=parent, commit=commit,
                           reparented_from=reparented_from)

    def note_candidate_verified(self, at: str, mode: str, lanes: list[str], commit: str | None, passed: bool,
                                reason: str | None, checks: list[ev.CheckVerdict], bisection: bool = False,
                                unverified_intermediates: list[str] | None = None) -> None:
        self._require_moving()
        self.trigger_event(ev.CandidateVerified, at=at, mode=mode, lanes=lanes, commit=commit, passed=passed,
                           reason=reason, checks=checks, bisection=bisection,
                           unverified_intermediates=unverified_intermediates or [])

    def note_candidate_cancelled(self, at: str, mode: str, lanes: list[str], commit: str | None, because: list[str],
                                 checks: list[ev.CheckVerdict]) -> None:
        self._require_moving()
        self.trigger_event(ev.CandidateCancelled, at=at, mode=mode, lanes=lanes, commit=commit, because=because,
                           checks=checks)

    def note_check_reused(self, at: str, task_id: str, lanes: list[str], commit: str | None, tree: str,
                          acceptance: str, reused_from: int, reused_event: str, reused_commit: str | None) -> None:
        self._require_moving()
        self.trigger_event(ev.CheckVerdictReused, at=at, task_id=task_id, lanes=lanes, commit=commit, tree=tree,
                           acceptance=acceptance, reused_from=reused_from, reused_event=reused_event,
                           reused_commit=reused_commit)

    def note_mode_chosen(self, at: str, mode: str, window: int, lanes: list[str], considered: int, failed: int,
                         batches: list[str], reason: str) -> None:
        self._require_moving()
        self.trigger_event(ev.IntegrationModeChosen, at=at, mode=mode, window=window, lanes=lanes,
                           considered=considered, failed=failed, batches=batches, reason=reason)

    def reusable_verdict(self, key: str) -> tuple[int, str, str | None] | None:
        """A passing verdict of this batch on the very inputs `key` names (`check_inputs.reuse_key`), or None."""
        return self.passed_checks.get(key)

    def note_candidate_discarded(self, at: str, mode: str, lanes: list[str], commit: str | None, reason: str) -> None:
        self._require_moving()
        self.trigger_event(ev.CandidateDiscarded, at=at, mode=mode, lanes=lanes, commit=commit, reason=reason)

    def note_fall_back(self, at: str, lanes: list[str], verifications: int, cap: int) -> None:
        self._require_moving()
        self.trigger_event(ev.IntegrationFellBack, at=at, lanes=lanes, verifications=verifications, cap=cap)

    # ------------------------------------------------------------ attempts on a Ray cluster (audit only)

    def note_remote_dispatched(self, at: str, attempt_id: str, kind: str, task_id: str, node: str,
                               tree: str) -> None:
        self.trigger_event(ev.RemoteAttemptDispatched, at=at, attempt_id=attempt_id, kind=kind, task_id=task_id,
                           node=node, tree=tree)

    def note_remote_ended(self, at: str, attempt_id: str, node: str, outcome: str) -> None:
        self.trigger_event(ev.RemoteAttemptEnded, at=at, attempt_id=attempt_id, node=node, outcome=outcome)

    def note_remote_lost(self, at: str, attempt_id: str, node: str, detail: str) -> None:
        self.trigger_event(ev.RemoteAttemptLost, at=at, attempt_id=attempt_id, node=node, detail=detail)

    # ------------------------------------------------------------ the Executor attempts (audit only)

    def start_executor_run(self, at: str, task_id: str, attempt: int, adapter: str, argv: list[str],
                           obligation: str, prompt_sha256: str | None = None,
                           limits: ev.AttemptLimits | None = None) -> None:
        """An attempt is numbered after the task's last one, and starts only once that one has ended."""
        self._require_known_child(task_id)
        if self.executor_runs.open_attempt(task_id) is not None:
            raise TransitionRefused(f"{task_id} already has an Executor attempt that has not ended")
        expected = self.executor_runs.next_attempt(task_id)
        if attempt != expected:
            raise TransitionRefused(f"the next Executor attempt of {task_id} is number {expected}, not {attempt}")
        self.trigger_event(ev.ExecutorRunStarted, at=at, task_id=task_id, attempt=attempt, adapter=adapter, argv=argv,
                           obligation=obligation, prompt_sha256=prompt_sha256, limits=limits)

    def finish_executor_run(self, at: str, task_id: str, attempt: int, exit_code: int | None, duration_ms: int,
                            submitted: bool | None, usage: ev.ExecutorUsage) -> None:
        self._require_open_attempt(task_id, attempt)
        self.trigger_event(ev.ExecutorRunFinished, at=at, task_id=task_id, attempt=attempt, exit_code=exit_code,
                           duration_ms=duration_ms, submitted=submitted, usage=usage)

    def kill_executor_run(self, at: str, task_id: str, attempt: int, reason: str, detail: str,
                          duration_ms: int | None, usage: ev.ExecutorUsage) -> None:
        self._require_open_attempt(task_id, attempt)
        self.trigger_event(ev.ExecutorRunKilled, at=at, task_id=task_id, attempt=attempt, reason=reason,
                           detail=detail, duration_ms=duration_ms, usage=usage)

    def exhaust_executor_budget(self, at: str, task_id: str, scope: str, measure: str, limit: float, spent: float,
                                detail: str) -> None:
        """A task whose next attempt would start over a budget: recorded once, with no attempt under way."""
        self._require_known_child(task_id)
        if self.executor_runs.open_attempt(task_id) is not None:
            raise TransitionRefused(f"{task_id} has an Executor attempt under way")
        if task_id in self.executor_runs.exhausted:
            raise TransitionRefused(f"{task_id} was already stopped for its Executor budget")
        self.trigger_event(ev.ExecutorBudgetExhausted, at=at, task_id=task_id, scope=scope, measure=measure,
                           limit=limit, spent=spent, detail=detail)

    def _require_known_child(self, task_id: str) -> None:
        try:
            self.child(task_id)
        except KeyError as error:
            raise TransitionRefused(str(error)) from None

    def _require_open_attempt(self, task_id: str, attempt: int) -> None:
        found = self.executor_runs.open_attempt(task_id)
        if found is None or found.started.attempt != attempt:
            raise TransitionRefused(f"{task_id} has no Executor attempt {attempt} under way")

    @property
    def integration(self) -> str:
        """How lane commits integrate: recorded when the batch was prepared; serial for older logs."""
        return self._integration or "serial"
