"""What the steps of one tick share: its input, its ports, the batch as it stands, what it saw so far.

Each step of the pipeline (`lanes_es/tick/pipeline.py`) is a module of functions taking this
context; the context itself only reads, reports and records, it decides nothing of a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lanes_es.domain import events as ev
from lanes_es.domain.authority import BatchCapability, Binding
from lanes_es.domain.batch import LaneBatch
from lanes_es.domain.observation import lane_unreadable_reason  # noqa: F401 - re-exported
from lanes_es.domain.ids import batch_branch_name, parse_timestamp
from lanes_es.domain.record import IN_FLIGHT, prepared_record
from lanes_es.domain.remote_attempts import record_remote_notes
from lanes_es.domain.report import NEXT_REJECTED_PARAMETERS, lane_report
from lanes_es.domain.scheduling import startable_children
from lanes_es.ports import Lineage, PortError
from lanes_es.tick_input import Persist, TickInput, TickPorts



@dataclass
class TickOutcome:
    """The report the tick returns, and the batch as it now stands (None when nothing was created)."""

    report: dict[str, Any]
    batch: LaneBatch | None
    written: bool = True


class TickFinished(Exception):
    """Raised inside the tick to end it with a report (a finalize or a lineage failure)."""

    def __init__(self, report: dict[str, Any]) -> None:
        self.report = report


class PlanMismatch(RuntimeError):
    """The recorded children do not match the authorized plan: the tick stops and writes nothing."""


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
class TickContext:
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
    scopes: dict[str, list[str]] = field(default_factory=dict)
    lane_commits: dict[str, Any] = field(default_factory=dict)  # task -> the lane commit QA's worker made, or why not

    def __post_init__(self) -> None:
        self.capability = BatchCapability(self.tick.authorization, self.tick.initiative_slug)

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
        self.record_remote()
        self.persist_port(self.batch)

    def record_remote(self) -> bool:
        """Record, as events, what the Ray runner noted since the last time (each attempt it dispatched,
        ended or lost: its worker threads only note; this, the writing thread, records); whether any."""
        journal = self.ports.remote
        if journal is None or self.batch is None:
            return False
        notes = journal.drain()
        record_remote_notes(self.live, self.now, notes)
        return bool(notes)

    # ------------------------------------------------------------ reports

    def report(self, reason: str | None, next_action: str, handoffs: list[ev.Handoff] | None = None,
               final: ev.FinalVerificationReport | None = None) -> dict[str, Any]:
        return lane_report(self.record, reason, next_action, self.extras(handoffs, final))

    def extras(self, handoffs: list[ev.Handoff] | None = None,
               final: ev.FinalVerificationReport | None = None) -> ev.ReportExtras:
        return ev.ReportExtras(handoffs=handoffs or [], lane_refusals=list(self.refusals),
                               tracker_observations=list(self.tracker), final_verification=final,
                               lane_instruction=self.instruction, lane_revision=self.revision)

    def refuse(self, code: str, detail: str) -> TickOutcome:
        report = refusal_report(self.tick, self.batch, code, detail)
        if self.batch is not None:
            self.batch.reject_tick(self.now, report["reason"])
            self.persist()
        return TickOutcome(report, self.batch, written=False)

    def finalize(self, batch_state: str, reason: str | None, next_action: str = "",
                 handoffs: list[ev.Handoff] | None = None,
                 final: ev.FinalVerificationReport | None = None,
                 extras: ev.ReportExtras | None = None) -> dict[str, Any]:
        """Settle the batch (its report is then a projection of this event) and end the tick."""
        extras = extras if extras is not None else self.extras(handoffs, final)
        self.live.settle_batch(self.now, batch_state, reason, next_action, extras)
        self.persist()
        return lane_report(self.record, reason, next_action, extras)

    def fail_lineage(self, message: str, extras: ev.ReportExtras | None = None) -> dict[str, Any]:
        """Every in-flight child parks with the message, its dependents are skipped, the batch fails.

        Upstream's enroll, commit and integrate paths set `failed` with siblings still in
        flight, a record its own validator refuses; here every path fails the same way.
        """
        for child in self.live.children_in(*IN_FLIGHT):
            self.live.park(self.now, child["task_id"], message)
        return self.finalize("failed", message, extras=extras or ev.ReportExtras())

    def park_child(self, task_id: str, reason: str, qa_failures: int | None = None, candidate: str | None = None,
                   candidate_ref: str | None = None, failed_checks: list[ev.CheckVerdict] | None = None) -> None:
        self.live.park(self.now, task_id, reason, qa_failures=qa_failures, candidate=candidate,
                       candidate_ref=candidate_ref, failed_checks=failed_checks)
        if self.parked_message is None:
            self.parked_message = reason
        self.persist()

    # ------------------------------------------------------------ reads

    def intent_path_of(self, task_id: str) -> str | None:
        for child in self.tick.children:
            if child.task_id == task_id:
                return child.intent_path
        return None

    def scope_of(self, task_id: str) -> list[str]:
        """The child's scope from its published intent at the coordinator; ["**"] when unreadable."""
        if task_id not in self.scopes:
            try:
                read = self.ports.batch_git.read_intent(self.tick.root, task_id, self.intent_path_of(task_id))
                self.scopes[task_id] = list(read.intent["scope_hint"])
            except (PortError, KeyError, ValueError):
                self.scopes[task_id] = ["**"]
        return self.scopes[task_id]

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
