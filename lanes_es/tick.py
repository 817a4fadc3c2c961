"""One tick of a lane batch (upstream's `runLaneBatch`, 5.2.0), in the exact order of contracts §3.2.

The tick reads facts through the ports, decides with the domain, and records each
decision as an event on the `LaneBatch`, persisting after each step as upstream
persists after each step: a crash between two steps leaves a log from which the next
tick converges. Only kernel and git facts move a child; nothing is inferred from text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from lanes_es.domain import events as ev
from lanes_es.domain.admission import decide_lane_admission
from lanes_es.domain.authority import AuthorizationError, BatchCapability, BatchEnrollment, Binding
from lanes_es.domain.batch import LaneBatch
from lanes_es.domain.ids import LANE_EXECUTOR_HOSTS, batch_branch_name, lane_branch_name, parse_timestamp
from lanes_es.domain.intent import canonical_intent_hash, delegated_revision_refusal
from lanes_es.domain.plan import compute_batch_plan_digest
from lanes_es.domain.record import IN_FLIGHT, consumed_slots, expected_batch_head, is_terminal, prepared_record
from lanes_es.domain.report import (
    LANE_NEEDS_HUMAN_NEXT_ACTION, NEXT_FINAL_VERIFICATION_FAILED, NEXT_REJECTED_PARAMETERS, NEXT_REVIEW,
    RELEASE_SUFFIX, lane_report, review_reason, running_next_action,
)
from lanes_es.domain.scheduling import startable_children
from lanes_es.ports import IntegrationError, IntegrationRequest, IntegrationChild, Lineage, PortError
from lanes_es.tick_guards import (
    refuse_if_plan_moved_before_start, refuse_unknown_leaks, stop_if_head_moved, stop_if_world_moved,
)
from lanes_es.tick_input import Persist, TickInput, TickPorts

MAX_COORDINATOR_CORRECTIONS = 2
CORRECTION_LIMIT_REACHED = "batch_correction_limit_reached"
LANE_CONTRACT_MISMATCH = "batch_lane_contract_mismatch"
PARALLEL_MISMATCH = "batch_parallel_mismatch"
QA_LIMIT_REASON = "QA failure limit reached"
REVISION_FALLBACK = ("the Executor requests approve_breaking_intent_revision through its own native gate "
                     "for the user to answer")
_CONTRACT_ERROR = re.compile(r"contract must equal|unknown field|schema version .* incompatible|unknown contract",
                             re.IGNORECASE)


@dataclass
class TickOutcome:
    """The report the tick returns, and the batch as it now stands (None when nothing was created)."""

    report: dict[str, Any]
    batch: LaneBatch | None
    written: bool = True


class _Finished(Exception):
    """Raised inside the tick to end it with a report (a finalize or a lineage failure)."""

    def __init__(self, report: dict[str, Any]) -> None:
        self.report = report


def lane_unreadable_reason(error: str) -> str:
    """A Lane whose state this runtime refuses to read is a contract mismatch, not a lost Lane."""
    return f"{LANE_CONTRACT_MISMATCH}: {error}" if _CONTRACT_ERROR.search(error) else "batch_lane_lost"


def is_lineage_break(message: str) -> bool:
    return "batch_head_lineage_broken" in message


def refusal_report(tick: TickInput, batch: LaneBatch | None, code: str, detail: str) -> dict[str, Any]:
    """A refusal before any write: the recorded batch (or the plan as it would be prepared) reported as rejected."""
    record = batch.record if batch is not None else draft_record(tick)
    return lane_report(record, f"{code}: {detail}", NEXT_REJECTED_PARAMETERS, batch_state="rejected")


def draft_record(tick: TickInput) -> dict[str, Any]:
    """The record a new batch would start with; shown in a refusal, never stored."""
    prepared = ev.BatchPrepared(
        originator_id=tick.batch_id, originator_version=1, originator_topic="", timestamp=parse_timestamp(tick.now),
        at=tick.now, batch_id=tick.batch_id, initiative_slug=tick.initiative_slug,
        plan_digest=tick.authorization.plan_digest, base_head=tick.authorization.base_head,
        branch=batch_branch_name(tick.initiative_slug), confirmation_time=tick.confirmation_time,
        budget=tick.authorization.budget, max_parallel=tick.max_parallel or 1, children=tick.children)
    return prepared_record(prepared)


@dataclass
class LaneTick:
    tick: TickInput
    ports: TickPorts
    persist_port: Persist
    batch: LaneBatch | None
    capability: BatchCapability = field(init=False)
    limit: int = 1
    parked_message: str | None = None
    review_open: list[str] = field(default_factory=list)
    refusals: list[ev.LaneRefusal] = field(default_factory=list)
    instruction: ev.InstructionOutcome | None = None
    revision: ev.RevisionOutcome | None = None
    tracker: list[ev.TrackerObservation] = field(default_factory=list)
    lineage: Lineage | None = None
    resumed_park: bool = False
    view: Any = None  # the coordinator read at the start of the tick, reused while nothing moved it
    _scopes: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.capability = BatchCapability(self.tick.authorization, self.tick.initiative_slug)

    # ------------------------------------------------------------ small helpers

    @property
    def now(self) -> str:
        return self.tick.now

    @property
    def live(self) -> LaneBatch:
        """The batch once it exists (recorded, or prepared by this tick)."""
        assert self.batch is not None
        return self.batch

    @property
    def record(self) -> dict[str, Any]:
        return self.live.record

    def persist(self) -> None:
        self.persist_port(self.batch)

    def report(self, reason: str | None, next_action: str, handoffs: list[ev.Handoff] | None = None,
               final: ev.FinalVerificationReport | None = None) -> dict[str, Any]:
        return lane_report(self.record, reason, next_action, self.extras(handoffs, final))

    def extras(self, handoffs: list[ev.Handoff] | None = None,
               final: ev.FinalVerificationReport | None = None) -> ev.ReportExtras:
        return ev.ReportExtras(handoffs=handoffs or [], lane_refusals=list(self.refusals),
                               tracker_observations=list(self.tracker), final_verification=final,
                               lane_instruction=self.instruction, lane_revision=self.revision)

    def finalize(self, batch_state: str, reason: str | None, next_action: str = "",
                 handoffs: list[ev.Handoff] | None = None,
                 final: ev.FinalVerificationReport | None = None,
                 extras: ev.ReportExtras | None = None) -> dict[str, Any]:
        """Settle the batch (its report is then a projection of this event) and end the tick."""
        extras = extras if extras is not None else self.extras(handoffs, final)
        self.live.settle_batch(self.now, batch_state, reason, next_action, extras)
        self.persist()
        return lane_report(self.record, reason, next_action, extras)

    def intent_path_of(self, task_id: str) -> str | None:
        for child in self.tick.children:
            if child.task_id == task_id:
                return child.intent_path
        return None

    def scope_of(self, task_id: str) -> list[str]:
        """The child's scope from its published intent at the coordinator; ["**"] when unreadable."""
        if task_id not in self._scopes:
            try:
                read = self.ports.batch_git.read_intent(self.tick.root, task_id, self.intent_path_of(task_id))
                self._scopes[task_id] = list(read.intent["scope_hint"])
            except (PortError, KeyError, ValueError):
                self._scopes[task_id] = ["**"]
        return self._scopes[task_id]

    def startable(self) -> list[str]:
        view = [{"task_id": child["task_id"], "state": child["state"], "blocked_by": child["blocked_by"],
                 "scope_hint": self.scope_of(child["task_id"])} for child in self.record["children"]]
        return startable_children(view, self.limit)

    def binding(self, record: dict[str, Any] | None = None) -> Binding:
        """The binding a tick claims; a resealed plan digest is still covered by the capability it came from."""
        if record is None:
            return Binding(batch_id=self.tick.batch_id, plan_digest=self.tick.authorization.plan_digest,
                           base_head=self.tick.authorization.base_head,
                           initiative_slug=self.tick.initiative_slug, budget=self.tick.authorization.budget)
        digest = record["plan_digest"]
        if digest in {reseal["to_digest"] for reseal in record.get("reseals", [])}:
            digest = self.tick.authorization.plan_digest
        return Binding(batch_id=record["batch_id"], plan_digest=digest, base_head=record["base_head"],
                       initiative_slug=record["initiative_slug"], budget=ev.Budget(**record["budget"]))

    # ------------------------------------------------------------ entry

    def run(self) -> TickOutcome:
        tick = self.tick
        recorded = self.batch
        if recorded is not None and tick.max_parallel is not None and tick.max_parallel != recorded.record["max_parallel"]:
            return self.refuse(PARALLEL_MISMATCH, f"the recorded batch runs with max_parallel {recorded.record['max_parallel']}")
        self.limit = recorded.record["max_parallel"] if recorded is not None else (tick.max_parallel or 1)
        if not tick.children:
            return self.refuse("batch_plan_empty", "batch plan is empty")
        try:
            if recorded is not None:
                early = self.resume_recorded()
                if early is not None:
                    return early
            else:
                early = self.start_new()
                if early is not None:
                    return early
            return TickOutcome(self.advance(), self.batch)
        except _Finished as finished:
            return TickOutcome(finished.report, self.batch)

    def refuse(self, code: str, detail: str) -> TickOutcome:
        report = refusal_report(self.tick, self.batch, code, detail)
        if self.batch is not None:
            self.batch.reject_tick(self.now, report["reason"])
            self.persist()
        return TickOutcome(report, self.batch, written=False)

    def validate_new_authorization(self) -> str | None:
        """upstream's validateNewAuthorization: the capability covers this input, issued at its confirmation."""
        try:
            issued_at = self.capability.validate(self.binding())
            if issued_at != self.tick.confirmation_time:
                return "the parked batch requires a fresh literal-user confirmation"
            for child in self.tick.children:
                if child.intent_path is None or child.intent_revision is None or child.intent_content_hash is None:
                    return f"batch child {child.task_id} has no complete intent identity"
            if compute_batch_plan_digest(self.tick.children) != self.tick.authorization.plan_digest:
                return "batch run input does not match the authorized plan or base_head"
            return None
        except (AuthorizationError, ValueError) as error:
            return str(error)

    # ------------------------------------------------------------ §3.2 steps 4-5

    def start_new(self) -> TickOutcome | None:
        tick = self.tick
        invalid = self.validate_new_authorization()
        if invalid:
            return self.refuse("batch_authorization_invalid", invalid)
        if self.ports.runtime_contracts is not None:
            refusal = self.ports.runtime_contracts.refusal(tick.root, tick.executor_runtime)
            if refusal:
                code, _, detail = refusal.partition(": ")
                return self.refuse(code, detail)
        moved = refuse_if_plan_moved_before_start(self)
        if moved is not None:
            return moved
        # The branch may already sit at base_head: made by a preflight whose batch was never saved (a crash),
        # or left by the Initiative's settled batch. Checked out there, it is reused rather than refused.
        preflight = self.ports.batch_git.preflight(tick.root, tick.initiative_slug, tick.authorization.base_head,
                                                   reuse_head=tick.authorization.base_head)
        if not preflight.ok:
            return self.refuse(preflight.reason, preflight.message or "Correct the preflight condition and re-confirm.")
        self.batch = LaneBatch.prepare(
            at=self.now, batch_id=tick.batch_id, initiative_slug=tick.initiative_slug,
            plan_digest=tick.authorization.plan_digest, base_head=tick.authorization.base_head,
            branch=batch_branch_name(tick.initiative_slug), confirmation_time=tick.confirmation_time,
            budget=tick.authorization.budget, max_parallel=self.limit, children=tick.children,
            final_verification=tick.authorization.final_verification or None,
            revision_delegation=tick.confirmation_time if tick.revision_delegation else None,
        )
        return None

    def resume_recorded(self) -> TickOutcome | None:
        self.assert_plan_matches()
        state = self.live.batch_state
        if is_terminal(state):
            return self.replay_terminal(state)
        stopped = stop_if_world_moved(self)
        if stopped is not None:
            return stopped
        if state == "needs_human":
            return self.resume_park()
        return None

    def assert_plan_matches(self) -> None:
        """upstream's assertPlanMatches; it throws (the tick fails loudly, nothing is written)."""
        record = self.record
        plan = self.capability.children
        digests = {compute_batch_plan_digest(plan)} | {r["to_digest"] for r in record.get("reseals", [])}
        if (record["plan_digest"] not in digests or len(record["children"]) != len(plan)
                or any(child["task_id"] != planned.task_id or child["blocked_by"] != list(planned.blocked_by)
                       for child, planned in zip(record["children"], plan))):
            raise PlanMismatch("plan_digest mismatch: persisted children do not match the authorized plan")

    def replay_terminal(self, state: str) -> TickOutcome:
        if state == "completed":
            self.close_integrated_issues()
        handoffs = self.release_handoffs() if state == "completed" else []
        report = self.report(f"terminal state already reached: {state}", "", handoffs)
        return TickOutcome(report, self.batch)

    def resume_park(self) -> TickOutcome | None:
        record = self.record
        invalid = self.validate_new_authorization()
        if invalid or self.tick.confirmation_time <= record["confirmation_time"]:
            reason = invalid or "the parked batch requires a fresh literal-user confirmation"
            return TickOutcome(self.report(reason, LANE_NEEDS_HUMAN_NEXT_ACTION), self.batch, written=False)
        resumed: list[ev.ResumedChild] = []
        for child in record["children"]:
            if child["state"] != "needs_human":
                continue
            outcome = self.recover_parked(child)
            if isinstance(outcome, str) and outcome not in ("enrolled", "settled", "lane_committed"):
                return TickOutcome(self.report(outcome, LANE_NEEDS_HUMAN_NEXT_ACTION), self.batch, written=False)
            resumed.append(ev.ResumedChild(task_id=child["task_id"], state=outcome))
        # Applied now, persisted only after the lineage validation below (upstream's order).
        self.live.resume_park(self.now, self.tick.confirmation_time, resumed)
        self.resumed_park = True
        return None

    def recover_parked(self, child: dict[str, Any]) -> str:
        """The state a parked child resumes in, from its Lane's facts, or upstream's refusal text."""
        lane = child["lane"]
        if not lane or not lane.get("run_id"):
            return "parked Lane has no recorded run identity; inspect it without re-enrolling"
        facts = self.ports.lane_git.inspect_lane(self.tick.root, lane["path"])
        fresh = self.ports.kernel.project_task(lane["path"], child["task_id"])
        if (not facts.exists or not facts.same_repository or not facts.is_worktree_root
                or facts.branch != lane["branch"] or fresh.error is not None or fresh.run_id != lane["run_id"]
                or fresh.open_user_decision_count > 0 or fresh.replan_required_ids):
            return "parked Lane identity or decision is unresolved"
        if fresh.lifecycle == "done" and fresh.completion_ready:
            return "lane_committed" if lane["lane_commit"] else "settled"
        claim = self.ports.kernel.active_claim_task_id(lane["path"])
        if fresh.lifecycle == "active" and fresh.claim_task_id == child["task_id"] and claim in (None, child["task_id"]):
            return "enrolled"
        return "parked child has no recoverable owned run"

    # ------------------------------------------------------------ §3.2 steps 6-16 and 1-4

    def advance(self) -> dict[str, Any]:
        new_batch = self.live.batch_state == "prepared"
        self.replace_grant(new_batch)
        if not new_batch:
            self.restore_leaks()
        if self.live.batch_state == "prepared":
            self.live.start(self.now)
            self.persist()
        self.adopt_missed_integrations()
        self.record_releases()
        self.check_lineage()
        self.rehydrate_consumption()
        if self.resumed_park:
            self.persist()
        self.decide_instruction()
        self.decide_revision()
        self.observe_lanes()
        self.commit_settled()
        self.integrate_committed()
        self.close_integrated_issues()
        self.admit_offers()
        return self.settle_or_report()

    def replace_grant(self, new_batch: bool) -> None:
        """A fresh confirmation of a recorded batch replaces its delegation grant with that answer."""
        answer = self.tick.revision_delegation
        if new_batch or answer is None:
            return
        wanted = self.tick.confirmation_time if answer else None
        current = self.record.get("revision_delegation", {}).get("confirmation_time")
        if wanted == current:
            return
        self.live.change_grant(self.now, wanted)
        self.persist()  # durable at once: a withdrawn grant must never survive to a later tick

    def restore_leaks(self) -> None:
        """Lane writes leaked into the coordinator checkout, restored only when every path is provably a Lane's."""
        view = self.view = self.view or self.ports.lane_git.coordinator_view(self.tick.root)
        if self.ports.leaks is None or not view.entries:
            return
        restored = self.ports.leaks.restore(self.tick.root, self.record, view.entries, self.now)
        if restored is not None:
            backup, paths = restored
            self.live.restore_leaks(self.now, backup, paths)
            self.persist()
            self.view = None  # the checkout changed

    def adopt_missed_integrations(self) -> None:
        """An integration a previous tick completed but did not record is found on the branch and adopted."""
        for child in self.live.children_in("lane_committed"):
            lane = child["lane"]
            found = self.ports.lane_git.find_integrated(
                self.tick.root, child["task_id"], self.record["batch_id"], expected_batch_head(self.record),
                lane["base_head"], lane["lane_commit"])
            if found:
                self.live.integrate(self.now, child["task_id"], found, adopted=True)
                self.persist()
                self.view = None

    def record_releases(self) -> None:
        for child in self.live.children_in("integrated"):
            if not self.ports.lane_git.inspect_lane(self.tick.root, child["lane"]["path"]).exists:
                self.live.release(self.now, child["task_id"])
                self.persist()

    def check_lineage(self) -> None:
        record = self.record
        expected = expected_batch_head(record)
        lineage = self.ports.lane_git.classify_lineage(
            self.tick.root, record["branch"], expected, list(record["commits"]), record["batch_id"], self.view)
        if lineage.kind == "broken":
            raise _Finished(self.fail_lineage(lineage.message))
        if lineage.kind == "fast_forward":
            stopped = stop_if_head_moved(self, lineage.head)
            if stopped is not None:
                raise _Finished(stopped.report)
            self.live.adopt_head(self.now, expected, lineage.head)
            self.persist()
        self.lineage = Lineage(kind="equal", head=lineage.head)

    def rehydrate_consumption(self) -> None:
        """Slots held by integrated and in-flight children are re-consumed on this capability."""
        try:
            self.capability.validate(self.binding(self.record))
            for child in self.record["children"]:
                if child["state"] in ("pending", "skipped_blocked", "lane_admitted"):
                    continue
                if not self.capability.is_child_consumed(child["task_id"]):
                    self.capability.consume_child(child["task_id"])
        except (AuthorizationError, ValueError) as error:
            raise _Finished(self.fail_lineage(str(error))) from None

    def stop_on_drift(self, reason: str, next_action: str) -> TickOutcome:
        """What the confirmation covered moved: every child in flight parks (its Lane is kept), the batch
        settles needs_human, and nothing more is admitted, enrolled, committed or integrated."""
        for child in self.live.children_in(*IN_FLIGHT):
            self.live.park(self.now, child["task_id"], reason)
        self.parked_message = reason
        return TickOutcome(self.finalize("needs_human", reason, next_action), self.batch)

    def fail_lineage(self, message: str, extras: ev.ReportExtras | None = None) -> dict[str, Any]:
        """Every in-flight child parks with the message, its dependents are skipped, the batch fails.

        Upstream's enroll, commit and integrate paths set `failed` with siblings still in
        flight, a record its own validator refuses; here every path fails the same way.
        """
        for child in self.live.children_in(*IN_FLIGHT):
            self.live.park(self.now, child["task_id"], message)
        return self.finalize("failed", message, extras=extras or ev.ReportExtras())

    # ------------------------------------------------------------ per-tick inputs

    def decide_instruction(self) -> None:
        request = self.tick.lane_instruction
        if request is None:
            return
        refusal = decide_lane_instruction(self.record, request)
        if refusal:
            self.instruction = ev.InstructionOutcome(task_id=request.task_id, kind=request.kind, accepted=False,
                                                     reason=f"batch_lane_instruction_refused: {refusal}")
            return
        self.live.record_intervention(self.now, request.task_id, request.kind, request.text)
        self.persist()  # recorded before the Parent sends it
        self.instruction = ev.InstructionOutcome(task_id=request.task_id, kind=request.kind, accepted=True,
                                                 reason=None)

    def decide_revision(self) -> None:
        request = self.tick.lane_revision
        if request is None:
            return
        refusal = self.apply_revision_or_refuse(request)
        if refusal is not None:
            self.revision = ev.RevisionOutcome(task_id=request.task_id, accepted=False,
                                               reason=f"batch_delegation_refused: {refusal}", fallback=REVISION_FALLBACK)
            return
        self.revision = ev.RevisionOutcome(task_id=request.task_id, accepted=True, reason=None)

    def apply_revision_or_refuse(self, request: Any) -> str | None:
        """ADR 0018: apply an in-bounds breaking revision under the grant; otherwise the refusal text."""
        grant = self.record.get("revision_delegation")
        child = next((c for c in self.record["children"] if c["task_id"] == request.task_id), None)
        if not grant:
            return "this batch's confirmation did not delegate Intent revisions"
        if child is None or not child["lane"] or child["state"] != "enrolled":
            return f"{request.task_id} is not running in its Lane"
        if self.ports.revisions is None:
            return "this coordinator cannot apply Intent revisions in a Lane"
        try:
            authorized = self.ports.batch_git.read_intent(self.tick.root, request.task_id,
                                                          self.intent_path_of(request.task_id)).intent
            current = self.ports.revisions.current_intent(child["lane"]["path"], request.task_id)
            if current is None:
                return f"the Lane has no TaskRecord for {request.task_id}"
            if not self.revision_awaits_record(request.task_id, current, request.next_intent):
                out_of_bounds = delegated_revision_refusal(authorized, current, request.next_intent)
                if out_of_bounds:
                    return out_of_bounds
            confirmation_ref = f"delegated-batch:{self.record['batch_id']}@{grant['confirmation_time']}"
            from_revision, to_revision, content_hash = self.ports.revisions.apply_delegated_revision(
                child["lane"]["path"], request.task_id, request.next_intent, confirmation_ref, self.now)
        except (PortError, ValueError) as error:
            return str(error)
        self.live.apply_delegated_revision(self.now, request.task_id, from_revision, to_revision,
                                            content_hash, confirmation_ref)
        self.persist()
        return None

    def revision_awaits_record(self, task_id: str, current: dict[str, Any], next_intent: dict[str, Any]) -> bool:
        """The Lane already holds this revision, but the batch has no record of applying it (a crash
        fell between the two): applying it again adopts the Lane's approval instead of refusing it."""
        content_hash = canonical_intent_hash(next_intent)
        if canonical_intent_hash(current) != content_hash:
            return False
        return not any(r["task_id"] == task_id and r["intent_content_hash"] == content_hash
                       for r in self.record.get("delegated_revisions", []))

    # ------------------------------------------------------------ step 1: observe

    def park_child(self, task_id: str, reason: str, qa_failures: int | None = None) -> None:
        self.live.park(self.now, task_id, reason, qa_failures=qa_failures)
        if self.parked_message is None:
            self.parked_message = reason
        self.persist()

    def observe_lanes(self) -> None:
        for child in list(self.live.children_in("lane_admitted", "enrolled")):
            task_id = child["task_id"]
            current = self.live.child(task_id)
            if current["state"] not in ("lane_admitted", "enrolled"):
                continue  # a park earlier in this loop moved it
            self.observe_lane(current)

    def observe_lane(self, child: dict[str, Any]) -> None:
        task_id, lane = child["task_id"], child["lane"]
        fresh = self.ports.kernel.project_task(lane["path"], task_id)
        if fresh.error is not None:
            self.park_child(task_id, lane_unreadable_reason(fresh.error))
            return
        if lane.get("run_id") and fresh.run_id != lane["run_id"]:
            self.park_child(task_id, "batch_lane_run_mismatch")
            return
        holds_claim = fresh.claim_task_id == task_id
        if child["state"] == "lane_admitted":
            if holds_claim and fresh.run_id:
                # A crash between admission and enrollment: adopt the claim the kernel already made.
                self.live.enroll(self.now, task_id, fresh.run_id,
                                  reason="adopted existing lane claim after interruption")
                self.persist()
            else:
                self.enroll_in_lane(task_id)
            return
        if fresh.lifecycle == "done" and fresh.completion_ready:
            self.live.settle(self.now, task_id)
            self.persist()
            return
        if not holds_claim:
            self.park_child(task_id, "batch_lane_lost")
            return
        if not self.capability.is_child_consumed(task_id):
            self.park_child(task_id, "claim held by another batch")
            return
        if child.get("correction_due"):
            return  # waits for the coordinator's correction
        if fresh.next_obligation == "run_qa" or fresh.artifact_state != "frozen":
            return  # the Executor's move
        self.advance_child(child)

    def advance_child(self, child: dict[str, Any]) -> None:
        task_id = child["task_id"]
        result = self.ports.kernel.advance_task(child["lane"]["path"], task_id)
        if result.state == "completed":
            self.live.settle(self.now, task_id, qa_failures_reset=True)
            self.persist()
        elif result.state == "review_ready":
            reason = f"review reservation {result.operation_id} open"
            if child["reason"] != reason:  # upstream's write is a no-op while the same reservation stays open
                self.live.open_review(self.now, task_id, reason)
                self.persist()
            self.review_open.append(task_id)
        elif result.state == "rework" and result.operation == "qa":
            self.count_qa_failure(child)
        elif (result.state in ("rework", "review_preparation_failed") or result.environment_failure
              or result.recovery_category == "repair"):
            return  # ordinary own-claim repair stays with the Executor
        else:
            self.park_child(task_id, "Kernel reported the child stopped" if result.state == "stopped" else result.reason)

    def count_qa_failure(self, child: dict[str, Any]) -> None:
        task_id = child["task_id"]
        failures = child["qa_failures"] + 1
        if failures < self.record["budget"]["qa_failure_limit"]:
            self.live.count_qa_failure(self.now, task_id, failures)
            self.persist()
            return
        used = child.get("corrections", 0)
        if used < MAX_COORDINATOR_CORRECTIONS:
            # The design judgment goes to the coordinator: one correction, to a new Lane session.
            self.live.count_qa_failure(self.now, task_id, failures, QA_LIMIT_REASON)
            self.persist()
            return
        self.park_child(task_id, f"{CORRECTION_LIMIT_REACHED}: {QA_LIMIT_REASON} after {used} coordinator corrections",
                        qa_failures=failures)

    def enroll_in_lane(self, task_id: str) -> None:
        lane = self.live.child(task_id)["lane"]
        try:
            self.ports.kernel.enroll_task(lane["path"], task_id,
                                          BatchEnrollment(self.capability, self.record["batch_id"], lane["base_head"]))
            fresh = self.ports.kernel.project_task(lane["path"], task_id)
            if fresh.error is not None or not fresh.run_id or fresh.claim_task_id != task_id:
                raise PortError("enrolled Lane has no observable owned run")
        except (PortError, AuthorizationError) as error:
            message = str(error)
            self.park_child(task_id, message)
            if is_lineage_break(message):
                # A broken lineage cannot be trusted for any other child either.
                raise _Finished(self.fail_lineage(message, ev.ReportExtras(lane_refusals=list(self.refusals)))) from None
            return
        self.live.enroll(self.now, task_id, fresh.run_id)
        self.persist()

    # ------------------------------------------------------------ step 2: commit and integrate

    def commit_settled(self) -> None:
        for child in list(self.live.children_in("settled")):
            task_id, lane = child["task_id"], child["lane"]
            try:
                evidence = self.ports.kernel.settled_evidence(lane["path"], task_id)
                args = (lane["path"], task_id, self.record["batch_id"], lane["base_head"], lane["branch"], evidence)
                lane_commit = self.ports.batch_git.lookup_batch_commit(*args) or self.ports.batch_git.commit_child(*args)
            except PortError as error:
                message = str(error)
                self.park_child(task_id, message)
                if is_lineage_break(message):
                    raise _Finished(self.fail_lineage(message)) from None
                continue
            self.live.commit_lane(self.now, task_id, lane_commit)
            self.persist()

    def integrate_committed(self) -> None:
        for child in list(self.live.children_in("lane_committed")):
            task_id, lane = child["task_id"], child["lane"]
            siblings = [IntegrationChild(task_id=c["task_id"], intent_path=self.intent_path_of(c["task_id"]),
                                         commit=c["commit"])
                        for c in self.live.children_in("integrated") if c["task_id"] != task_id]
            request = IntegrationRequest(
                root=self.tick.root, branch=self.record["branch"], batch_head=expected_batch_head(self.record),
                lane_base=lane["base_head"], lane_commit=lane["lane_commit"],
                child=IntegrationChild(task_id=task_id, intent_path=self.intent_path_of(task_id)), siblings=siblings)
            try:
                commit = self.ports.lane_git.integrate(request)
            except PortError as error:
                self.park_failed_integration(task_id, error)
                continue
            self.live.integrate(self.now, task_id, commit)
            self.persist()
            self.lineage = Lineage(kind="equal", head=commit)  # our own fast-forward
            self._scopes.clear()
            self.reseal_delegated_revision(task_id)

    def park_failed_integration(self, task_id: str, error: PortError) -> None:
        message = str(error)
        code = error.reason if isinstance(error, IntegrationError) else "batch_integration_conflict"
        reason = message if is_lineage_break(message) or message.startswith(f"{code}:") else f"{code}: {message}"
        self.park_child(task_id, reason)
        if is_lineage_break(message):
            raise _Finished(self.fail_lineage(message))
        # The batch branch is unmoved; a disjoint sibling may still integrate.

    def reseal_delegated_revision(self, task_id: str) -> None:
        """ADR 0018 / #198: reseal plan_digest when the integrated intent is the delegated revision."""
        record = self.record
        identities = record.get("intent_identities") or {}
        recorded = identities.get(task_id)
        if not recorded:
            return
        try:
            read = self.ports.batch_git.read_intent(self.tick.root, task_id, recorded["intent_path"])
        except PortError:
            return
        revision, content_hash = read.intent["revision"], read.content_hash
        if revision == recorded["intent_revision"] and content_hash == recorded["intent_content_hash"]:
            return
        delegated = [r for r in record.get("delegated_revisions", []) if r["task_id"] == task_id]
        if not delegated or delegated[-1]["to_revision"] != revision or delegated[-1]["intent_content_hash"] != content_hash:
            return
        if any(child["task_id"] not in identities for child in record["children"]):
            return
        plan = []
        for child in record["children"]:
            identity = identities[child["task_id"]]
            if child["task_id"] == task_id:
                identity = {**identity, "intent_revision": revision, "intent_content_hash": content_hash}
            plan.append(ev.PlanChild(task_id=child["task_id"], slice_id=child["slice_id"],
                                     blocked_by=list(child["blocked_by"]), **identity))
        try:
            to_digest = compute_batch_plan_digest(plan)
        except ValueError:
            return
        self.live.reseal(self.now, task_id, to_digest, revision, content_hash)
        self.persist()

    def close_integrated_issues(self) -> None:
        """Close each integrated child's Issue once, after integration; failures retry on later ticks."""
        tracker = self.ports.tracker
        if tracker is None:
            return
        for child in self.live.children_in("integrated", "released"):
            if child.get("tracker_closed"):
                continue
            task_id = child["task_id"]
            try:
                tombstone = self.ports.kernel.read_tombstone(self.tick.root, task_id)
                if (tombstone is None or tombstone.lifecycle_status != "terminal"
                        or tombstone.terminal_lifecycle != "done"):
                    self.tracker.append(ev.TrackerObservation(
                        task_id=task_id, status="retryable_failure",
                        message="integrated child has no done terminal proof on the batch branch"))
                    continue
                result = tracker.mark_terminal(self.tick.root, task_id, "done", tombstone.terminal_event_id)
                status, message = result.status, result.message
            except Exception as error:  # noqa: BLE001 - a tracker failure never changes batch state
                status, message = "retryable_failure", str(error)
            self.tracker.append(ev.TrackerObservation(task_id=task_id, status=status, message=message))
            if status in ("updated", "already_current"):
                self.live.close_tracker(self.now, task_id)
                self.persist()

    # ------------------------------------------------------------ step 3: admission

    def admit_offers(self) -> None:
        if not self.tick.lane_offers:
            return
        coordinator = self.ports.lane_git.resolve_root(self.tick.root)
        for offer in self.tick.lane_offers:
            child = next((c for c in self.record["children"] if c["task_id"] == offer.task_id), None)
            if child is None or child["state"] != "pending" or offer.task_id not in self.startable():
                self.refusals.append(ev.LaneRefusal(task_id=offer.task_id, path=offer.path,
                                                    reason="batch_lane_unknown_child"))
                continue
            head = expected_batch_head(self.record)
            facts = self.ports.lane_git.inspect_lane(self.tick.root, offer.path)
            if facts.exists and facts.same_repository and facts.real_path:
                facts = _with_claim(facts, self.ports.kernel.active_claim_task_id(facts.real_path))
            bound = [c["lane"]["path"] for c in self.record["children"] if c["lane"] and c["state"] != "released"]
            reason = decide_lane_admission(facts, coordinator, lane_branch_name(self.record["initiative_slug"], offer.task_id),
                                           head, bound)
            if reason:
                self.refusals.append(ev.LaneRefusal(task_id=offer.task_id, path=offer.path, reason=reason))
                continue
            if consumed_slots(self.record) >= self.record["budget"]["max_children"]:
                break  # the child budget stops new admissions only; in-flight Lanes finish
            lane = ev.LaneBinding(path=facts.real_path, branch=lane_branch_name(self.record["initiative_slug"], offer.task_id),
                                  base_head=head)
            self.live.admit_lane(self.now, offer.task_id, lane)
            self.persist()
            self.enroll_in_lane(offer.task_id)
        if self.refusals:
            self.live.refuse_offers(self.now, self.refusals)
            self.persist()

    # ------------------------------------------------------------ step 4: settle or report

    def settle_or_report(self) -> dict[str, Any]:
        record = self.record
        if all(child["state"] in ("integrated", "released") for child in record["children"]):
            return self.complete()
        handoffs: list[ev.Handoff] = self.lane_handoffs()
        handoffs.extend(self.release_handoffs())
        in_flight = self.live.children_in(*IN_FLIGHT)
        startable = self.startable()
        over_budget = consumed_slots(record) >= record["budget"]["max_children"]
        if not in_flight and (not startable or over_budget):
            parked = bool(self.live.children_in("needs_human", "skipped_blocked"))
            state = "needs_human" if parked or not over_budget else "budget_stopped"
            reason = self.parked_message or (
                "a parked child needs a human decision" if parked
                else f"max_children budget exhausted ({record['budget']['max_children']})" if over_budget
                else "no child can start")
            return self.finalize(state, reason)
        if not over_budget:
            head = expected_batch_head(record)
            handoffs.extend(ev.ProvisionHandoff(task_id=task_id, lane_branch=lane_branch_name(record["initiative_slug"], task_id),
                                                base_head=head, executor_hosts=list(LANE_EXECUTOR_HOSTS))
                            for task_id in startable)
        if self.review_open:
            return self.report(review_reason(self.review_open), NEXT_REVIEW, handoffs)
        return self.report(None, running_next_action(handoffs), handoffs)

    def complete(self) -> dict[str, Any]:
        refused = refuse_unknown_leaks(self)
        if refused is not None:
            raise _Finished(refused.report)
        self.restore_leaks()  # a Lane's write that leaked during this tick
        final = None
        commands = self.record.get("final_verification")
        if commands:
            head, results = self.ports.verifier.run_final_verification(self.tick.root, list(commands))
            final = ev.FinalVerificationReport(passed=all(result.passed for result in results), head=head,
                                               results=list(results))
        handoffs = self.release_handoffs()
        if final is not None and not final.passed:
            failed = ", ".join(result.command for result in final.results if not result.passed)
            return self.finalize("completed", f"all enrollable children integrated; final verification did not pass: {failed}",
                                 NEXT_FINAL_VERIFICATION_FAILED, handoffs, final)
        return self.finalize("completed", "all enrollable children integrated", "", handoffs, final)

    def lane_handoffs(self) -> list[ev.Handoff]:
        handoffs: list[ev.Handoff] = []
        for child in self.live.children_in("enrolled"):
            lane = child["lane"]
            if child.get("correction_due"):
                used = child.get("corrections", 0)
                handoffs.append(ev.CoordinatorHandoff(task_id=child["task_id"], reason=child["correction_due"],
                                                      corrections_used=used,
                                                      corrections_left=MAX_COORDINATOR_CORRECTIONS - used,
                                                      lane_path=lane["path"]))
                continue
            fresh = self.ports.kernel.project_task(lane["path"], child["task_id"])
            if fresh.error is not None:
                continue
            handoffs.append(ev.ExecutorHandoff(task_id=child["task_id"], run_id=fresh.run_id,
                                               record_revision=fresh.record_revision,
                                               next_obligation=fresh.next_obligation,
                                               lane_branch=lane["branch"], lane_path=lane["path"]))
        return handoffs

    def release_handoffs(self) -> list[ev.Handoff]:
        """Integrated Lanes that are safe to remove: present, clean, unclaimed, audit pair on the batch branch."""
        integrated = self.live.children_in("integrated")
        if not integrated:
            return []
        lineage = self.lineage or self.ports.lane_git.classify_lineage(
            self.tick.root, self.record["branch"], expected_batch_head(self.record), list(self.record["commits"]),
            self.record["batch_id"])
        if lineage.kind == "broken":
            return []
        handoffs: list[ev.Handoff] = []
        for child in integrated:
            lane = child["lane"]
            facts = self.ports.lane_git.inspect_lane(self.tick.root, lane["path"])
            if (not facts.exists or not facts.same_repository or not facts.is_worktree_root or not facts.clean
                    or facts.branch != lane["branch"]
                    or self.ports.kernel.active_claim_task_id(facts.real_path or lane["path"]) is not None):
                continue
            if not self.ports.lane_git.audit_reachable(self.tick.root, lineage.head, child["task_id"]):
                continue
            handoffs.append(ev.ReleaseHandoff(task_id=child["task_id"], lane_branch=lane["branch"]))
        return handoffs


class PlanMismatch(RuntimeError):
    """The recorded children do not match the authorized plan: the tick stops and writes nothing."""


def _with_claim(facts: Any, claim: str | None) -> Any:
    import msgspec

    return msgspec.structs.replace(facts, active_claim_task_id=claim)


def decide_lane_instruction(record: dict[str, Any], request: Any) -> str | None:
    """Whether the coordinator may send this text now; None means allowed (contracts §9.5)."""
    task_id = request.task_id
    child = next((c for c in record["children"] if c["task_id"] == task_id), None)
    if child is None or not child["lane"]:
        return f"{task_id} has no Lane in this batch"
    if child["state"] != "enrolled":
        return f"{task_id} is {child['state']}, not running in its Lane"
    if request.kind == "correction" and not child.get("correction_due"):
        return f"{task_id} has not exhausted its rework budget; send an ordinary instruction instead"
    if request.kind == "instruction" and child.get("correction_due"):
        return f"{task_id} waits for a design-level correction; send it with kind correction"
    if request.session_state == "blocked":
        return f"{task_id}'s session is blocked on a dialog only the user may answer; send nothing and tell the user"
    if request.session_state != "idle":
        return f"{task_id}'s session is {request.session_state}; text goes only to an idle session"
    return None


def lane_rejection_report(tick: LaneTick, reason: str, next_action: str) -> dict[str, Any]:
    """A store-condition rejection of a recorded batch: only safe release handoffs, no authority granted."""
    tick.lineage = None
    handoffs = tick.release_handoffs()
    suffix = RELEASE_SUFFIX if handoffs else ""
    return lane_report(tick.record, reason, f"{next_action}{suffix}", ev.ReportExtras(handoffs=handoffs),
                       batch_state="rejected")


def run_lane_batch(tick: TickInput, batch: LaneBatch | None, ports: TickPorts, persist: Persist) -> TickOutcome:
    """One tick. The caller holds the batch lock and passes the batch as the log has it (or None)."""
    return LaneTick(tick=tick, ports=ports, persist_port=persist, batch=batch).run()

